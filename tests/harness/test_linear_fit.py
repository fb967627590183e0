"""The prior-weighted non-negative linear fit under the latency and memory models (harness/linear_fit.py)."""

from __future__ import annotations

import numpy as np
import pytest

from harness.latency import FIXED_PRIOR_SD
from harness.linear_fit import PRIOR_SD, fit_linear, nonnegative_lstsq


def test_nonnegative_lstsq_meets_the_optimality_conditions() -> None:
    # Karush-Kuhn-Tucker: x >= 0, the gradient a^T (a x - b) is 0 where x > 0 and >= 0 where x = 0
    rng = np.random.default_rng(0)
    for _ in range(50):
        a = rng.standard_normal((8, 4))
        b = rng.standard_normal(8)
        x = nonnegative_lstsq(a, b)
        gradient = a.T @ (a @ x - b)
        assert np.all(x >= 0)
        assert np.all(np.abs(gradient[x > 0]) < 1e-9)
        assert np.all(gradient[x == 0] > -1e-9)


def test_nonnegative_lstsq_clips_a_column_whose_unconstrained_weight_is_negative() -> None:
    a = np.eye(2)
    b = np.array([1.5, -2.0])
    assert nonnegative_lstsq(a, b) == pytest.approx([1.5, 0.0])


def test_fit_linear_never_gives_a_negative_coefficient() -> None:
    # y falls with the second feature: least squares would give it a negative weight
    x = np.array([[1.0, 1.0], [1.0, 2.0], [1.0, 3.0]])
    y = np.array([3.0, 2.0, 1.0])
    result = fit_linear(("fixed", "f"), x, y, prior_sd=1e6)
    # residuals are relative: the best constant minimises sum(((c - y) / y) ** 2)
    assert result.coef[1] == 0.0 and result.coef[0] == pytest.approx(np.sum(1 / y) / np.sum(1 / y**2), rel=1e-6)


def test_fit_linear_puts_time_the_data_cannot_place_on_work_rather_than_on_the_fixed_cost() -> None:
    # "f" is the same in every row, so the data cannot tell it from the constant: the
    # tighter prior of the fixed share sends the time to f
    x = np.array([[1.0, 2.0], [1.0, 2.0], [1.0, 2.0]])
    y = np.array([1.0, 1.0, 1.0])
    result = fit_linear(("fixed", "f"), x, y, prior_sd=(FIXED_PRIOR_SD, PRIOR_SD))
    fixed_share, f_share = result.coef[0] * 1.0, result.coef[1] * 2.0
    assert fixed_share < 0.05 and f_share > 0.9
    even = fit_linear(("fixed", "f"), x, y)
    assert even.coef[0] * 1.0 == pytest.approx(even.coef[1] * 2.0, rel=1e-6)


def test_fit_linear_refuses_bad_input() -> None:
    with pytest.raises(ValueError):
        fit_linear(("a",), np.zeros((0, 1)), np.zeros(0))
    with pytest.raises(ValueError):
        fit_linear(("a",), np.ones((2, 1)), np.array([1.0, -1.0]))
