"""Argument checks of the scheduling modules (fl/scheduling/checks.py)."""

from __future__ import annotations

import math

import pytest

from exporters.userinput import InputError
from fl.scheduling.checks import WIDTH_TOL, check_widths, count, overhead, positive, same_width


def test_same_width_within_the_tolerance_only() -> None:
    assert same_width(0.5, 0.5 * (1 + WIDTH_TOL / 2))
    assert not same_width(0.5, 0.5 + 1e-6)


def test_check_widths() -> None:
    assert check_widths([1, 0.5]) == (1.0, 0.5)
    with pytest.raises(InputError, match="levels is empty"):
        check_widths([], "levels")
    for bad in (0.0, 1.5, math.nan, -0.5):
        with pytest.raises(InputError, match="widths must lie in"):
            check_widths([0.5, bad])


def test_positive_and_count() -> None:
    assert positive(2, "x") == 2.0
    for bad in (0.0, -1.0, math.inf, math.nan):
        with pytest.raises(InputError, match="deadline_s"):
            positive(bad, "deadline_s")
    assert count(3, "k") == 3 and count(2.0, "k") == 2
    for bad in (0, 2.5, -1, math.nan, math.inf, "3", None):
        with pytest.raises(InputError, match="epochs must be an integer"):
            count(bad, "epochs")


def test_overhead_one_value_or_per_device() -> None:
    assert overhead(0.25, "A") == 0.25
    assert overhead({"A": 0.5}, "A") == 0.5 and overhead({"A": 0.5}, "B") == 0.0
    with pytest.raises(InputError, match="'B'"):
        overhead({"B": -1.0}, "B")
