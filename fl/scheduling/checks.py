"""Argument checks shared by the scheduling modules (pure; each failure is one `InputError` line).

Widths are compared with a relative and absolute tolerance `WIDTH_TOL`: a width read back
from the store (a float that went through SQLite and pandas) must still match the width
it was measured at.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

from exporters.userinput import InputError

#: Relative (and absolute) tolerance when comparing widths and snapping them to levels.
WIDTH_TOL = 1e-9


def same_width(a: float, b: float) -> bool:
    """Return whether two widths are equal within `WIDTH_TOL`.

    Parameters
    ----------
    a, b : float

    Returns
    -------
    bool
    """
    return math.isclose(float(a), float(b), rel_tol=WIDTH_TOL, abs_tol=WIDTH_TOL)


def check_widths(widths: Iterable[float], name: str = "widths") -> tuple[float, ...]:
    """Return ``widths`` as floats after checking that there is one and each lies in (0, 1].

    Parameters
    ----------
    widths : iterable of float
    name : str
        What the widths are, for the error message.

    Returns
    -------
    tuple of float
        In the given order.

    Raises
    ------
    InputError
        If ``widths`` is empty or a width is outside (0, 1] or not finite.
    """
    values = tuple(float(w) for w in widths)
    if not values:
        raise InputError(f"{name} is empty")
    bad = [w for w in values if not (math.isfinite(w) and 0 < w <= 1)]
    if bad:
        raise InputError(f"{name} must lie in (0, 1]; got {bad}")
    return values


def check_width(width: float | str, name: str = "width") -> float:
    """Return ``width`` as a float after checking that it lies in (0, 1].

    Parameters
    ----------
    width : float or str
        A number, or its text (an option's value as given).
    name : str
        What the width is, for the error message.

    Returns
    -------
    float

    Raises
    ------
    InputError
        If ``width`` is outside (0, 1] or not finite.
    """
    try:
        value = float(width)
    except (TypeError, ValueError):
        raise InputError(f"{name} must be a number in (0, 1]; got {width!r}") from None
    if not (math.isfinite(value) and 0 < value <= 1):
        raise InputError(f"{name} must lie in (0, 1]; got {width!r}")
    return value


def positive(value: float, name: str) -> float:
    """Return ``value`` as a float after checking that it is finite and above 0.

    Parameters
    ----------
    value : float
    name : str
        The argument's name, for the error message.

    Returns
    -------
    float

    Raises
    ------
    InputError
        If ``value`` is not a finite number above 0.
    """
    if not (math.isfinite(float(value)) and float(value) > 0):
        raise InputError(f"{name} must be a finite number > 0; got {value!r}")
    return float(value)


def count(value: Any, name: str) -> int:
    """Return ``value`` as an int after checking that it is a whole number >= 1.

    Parameters
    ----------
    value : int or float
        ``2.0`` passes as 2; ``2.5`` does not.
    name : str
        The argument's name, for the error message.

    Returns
    -------
    int

    Raises
    ------
    InputError
        If ``value`` is not a whole number >= 1.
    """
    try:
        whole = int(value) == value and value >= 1
    except (TypeError, ValueError, OverflowError):
        whole = False
    if not whole:
        raise InputError(f"{name} must be an integer >= 1; got {value!r}")
    return int(value)


def overhead(overhead_s: float | Mapping[str, float], device: str) -> float:
    """Return ``device``'s fixed per-round cost from one value for all devices or a per-device mapping.

    Parameters
    ----------
    overhead_s : float or mapping of str to float
        Seconds; a device missing from the mapping has 0.
    device : str

    Returns
    -------
    float

    Raises
    ------
    InputError
        If the value is negative or not finite.
    """
    value = float(overhead_s.get(device, 0.0)) if isinstance(overhead_s, Mapping) else float(overhead_s)
    if not (math.isfinite(value) and value >= 0):
        raise InputError(f"round overhead of {device!r} must be a finite number >= 0; got {value!r}")
    return value
