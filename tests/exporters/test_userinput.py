"""The argparse types every command uses: each value parsed, or one line saying why not."""

from __future__ import annotations

import argparse
import math

import pytest

from exporters.userinput import InputError, input_shape, non_negative_int, number, positive_float, positive_int


@pytest.mark.parametrize(
    ("parse", "text", "value"),
    [
        (positive_int, "3", 3),
        (non_negative_int, "0", 0),
        (positive_float, "0.25", 0.25),
        (number, "-1.5", -1.5),
        (input_shape, "3,32,32", (3, 32, 32)),
        (input_shape, "1x28x28", (1, 28, 28)),
    ],
)
def test_a_good_value_is_parsed(parse, text: str, value: object) -> None:
    assert parse(text) == value


@pytest.mark.parametrize(
    ("parse", "text", "message"),
    [
        (positive_int, "0", "0 must be at least 1"),
        (positive_int, "2.5", "'2.5' is not an integer"),
        (non_negative_int, "-1", "-1 must be 0 or more"),
        (positive_float, "0", "0 must be a positive number"),
        (positive_float, "inf", "inf must be a positive number"),
        (positive_float, "nan", "nan must be a positive number"),
        (number, "x", "'x' is not a number"),
        (input_shape, "3,0,32", "0 must be at least 1"),
    ],
)
def test_a_bad_value_is_refused_with_one_line(parse, text: str, message: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError) as caught:
        parse(text)
    assert str(caught.value) == message and "\n" not in str(caught.value)


def test_number_takes_what_float_takes() -> None:
    assert math.isinf(number("inf"))


def test_the_input_error_is_a_value_error_every_layer_can_raise() -> None:
    assert issubclass(InputError, ValueError)
    assert InputError.__module__ == "exporters.userinput"
