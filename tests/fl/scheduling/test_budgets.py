"""FedDrop's FLOPs-budget ratio from predicted rounds (fl/scheduling/budgets.py), solved by hand.

A round of ``1 + 4 * w`` seconds at width ``w`` and FLOPs ``100 * w**2`` per example: a deadline
of 3 s is met exactly at ``w = 0.5`` (FLOPs 25 of the dense 100).
"""

from __future__ import annotations

import pytest

from exporters.userinput import InputError
from fl.scheduling.budgets import round_budget_ratio


def round_at(width: float) -> float:
    return 1.0 + 4.0 * width


def flops_at(width: float) -> float:
    return 100.0 * width**2


def test_the_ratio_is_the_flops_share_whose_round_meets_the_deadline() -> None:
    ratio, note = round_budget_ratio(round_at, flops_at, 3.0, top=8)  # 0.5 is a grid width (4 / 8)
    assert ratio == pytest.approx(0.25) and note == ""


def test_between_grid_widths_the_flops_are_interpolated() -> None:
    # deadline 2.5 s: w = 0.375 = 3 / 8 exactly; with top 4 it lies between 1/4 (2 s, 6.25) and 2/4 (3 s, 25)
    ratio, _ = round_budget_ratio(round_at, flops_at, 2.5, top=4)
    assert ratio == pytest.approx((6.25 + 0.5 * (25.0 - 6.25)) / 100.0)


def test_a_dense_round_within_the_deadline_is_ratio_1_and_none_fits_is_none() -> None:
    assert round_budget_ratio(round_at, flops_at, 5.0, top=8) == (1.0, "the dense model meets the deadline")
    ratio, note = round_budget_ratio(round_at, flops_at, 1.2, top=8)  # one neuron: 1.5 s
    assert ratio is None and "even one neuron per layer takes 1.5 s, over the deadline 1.2 s" in note
    with pytest.raises(InputError, match="deadline_s"):
        round_budget_ratio(round_at, flops_at, 0.0, top=8)
