"""What every layer checks a user's input with: the error it raises and the argparse types.

At the bottom of the layers (every layer that reads a user's input may import it; it imports
nothing of fleetbench). `InputError` is the error of a request that cannot be satisfied as
given, whichever layer finds it; the argparse types each parse one value or say, in one line,
why not.
"""

from __future__ import annotations

import argparse


class InputError(ValueError):
    """A request that cannot be satisfied as given (unknown model, bad width, ...).

    The CLI prints its message as one line on stderr and exits with status 2.
    """


def _int_at_least(text: str, minimum: int, bound: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < minimum:
        raise argparse.ArgumentTypeError(f"{value} must be {bound}")
    return value


def positive_int(text: str) -> int:
    """Parse a strictly positive integer (argparse type).

    Parameters
    ----------
    text : str

    Returns
    -------
    int

    Raises
    ------
    argparse.ArgumentTypeError
        If ``text`` is not an integer of at least 1.
    """
    return _int_at_least(text, 1, "at least 1")


def non_negative_int(text: str) -> int:
    """Parse an integer of 0 or more (argparse type).

    Parameters
    ----------
    text : str

    Returns
    -------
    int

    Raises
    ------
    argparse.ArgumentTypeError
        If ``text`` is not an integer of at least 0.
    """
    return _int_at_least(text, 0, "0 or more")


def positive_float(text: str) -> float:
    """Parse a finite number greater than 0 (argparse type).

    Parameters
    ----------
    text : str

    Returns
    -------
    float

    Raises
    ------
    argparse.ArgumentTypeError
        If ``text`` is not a finite positive number.
    """
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0.0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"{text} must be a positive number")
    return value


def input_shape(text: str) -> tuple[int, ...]:
    """Parse an example's shape such as ``3,32,32`` (argparse type).

    Parameters
    ----------
    text : str

    Returns
    -------
    tuple of int

    Raises
    ------
    argparse.ArgumentTypeError
        If an item is not a positive integer.
    """
    return tuple(positive_int(item.strip()) for item in text.replace("x", ",").split(","))


def number(text: str) -> float:
    """Parse any number (argparse type).

    Parameters
    ----------
    text : str

    Returns
    -------
    float

    Raises
    ------
    argparse.ArgumentTypeError
        If ``text`` is not a number.
    """
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
