"""Statistics of a cell against values computed by hand (plain Python), plus properties."""

from __future__ import annotations

import math
import statistics

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.stats import NOISY_CV_THRESHOLD, CellStats, percentile, summarize


def linear_percentile(values: list[float], q: float) -> float:
    """Hyndman & Fan type 7, written out: rank h = (n - 1) q on the sorted values."""
    ordered = sorted(values)
    h = (len(ordered) - 1) * q / 100.0
    lo = math.floor(h)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (h - lo) * (ordered[hi] - ordered[lo])


def test_threshold_is_the_repeatability_target() -> None:
    assert NOISY_CV_THRESHOLD == 0.05


def test_hand_computed_cell() -> None:
    steps_ms = [1.0, 2.0, 3.0, 4.0, 100.0]
    s = summarize([ms / 1000 for ms in steps_ms], batch=4)
    per_image_ms = [ms / 4 for ms in steps_ms]  # 0.25, 0.5, 0.75, 1.0, 25.0
    assert s.n == 5
    assert s.median_s == pytest.approx(0.75e-3)
    assert s.median_us == pytest.approx(750.0)
    # p95: rank 0.95 * 4 = 3.8 -> 1.0 + 0.8 * (25.0 - 1.0) = 20.2 ms
    assert linear_percentile(per_image_ms, 95) == pytest.approx(20.2)
    assert s.p95_us == pytest.approx(20.2e3)
    # p5: rank 0.2 -> 0.25 + 0.2 * 0.25 = 0.3 ms
    assert s.p5_us == pytest.approx(linear_percentile(per_image_ms, 5) * 1e3)
    assert s.p5_us == pytest.approx(300.0)
    # IQR: p75 (rank 3) 1.0 - p25 (rank 1) 0.5 = 0.5 ms
    assert s.iqr_us == pytest.approx(500.0)
    mean_ms = sum(per_image_ms) / 5  # 27.5 / 5 = 5.5
    assert s.mean_us == pytest.approx(mean_ms * 1e3)
    stdev_ms = math.sqrt(sum((x - mean_ms) ** 2 for x in per_image_ms) / 4)
    assert stdev_ms == pytest.approx(statistics.stdev(per_image_ms))
    assert s.stdev_us == pytest.approx(stdev_ms * 1e3)
    assert s.cv == pytest.approx(stdev_ms / mean_ms)
    assert s.cv > 1.0
    assert s.robust_cv_low is None and s.noisy is False  # five samples: no interval, no flag


def test_constant_series_has_zero_spread_and_is_not_noisy() -> None:
    s = summarize([0.02] * 7, batch=20)
    assert s.median_us == pytest.approx(1000.0)
    assert s.p5_us == s.median_us == s.p95_us
    assert s.iqr_us == 0.0
    assert s.stdev_s == 0.0
    assert s.cv == 0.0
    assert s.noisy is False


def test_single_sample() -> None:
    s = summarize([0.5], batch=1)
    assert s.n == 1
    assert s.median_s == s.p95_s == s.p5_s == s.mean_s == 0.5
    assert s.stdev_s == 0.0 and s.cv == 0.0 and not s.noisy


def test_noisy_flag_is_the_lower_end_of_the_robust_cv_interval_strictly_above_threshold() -> None:
    # ten samples, half at 1 - a, half at 1 + a: median 1, every deviation a, so the MAD and
    # the lower end of its interval (the 2nd smallest deviation of 10) are both a
    def halves(a: float) -> CellStats:
        return summarize([1 - a] * 5 + [1 + a] * 5, batch=1)

    quiet, loud = halves(0.049 / 1.4826), halves(0.051 / 1.4826)
    assert quiet.robust_cv_low == pytest.approx(0.049) and not quiet.noisy
    assert loud.robust_cv_low == pytest.approx(0.051) and loud.noisy


def test_few_samples_need_most_of_them_spread_to_be_noisy() -> None:
    # two steps at the median and eight 10 % off it: the point estimate is 14.8 %, but with 10
    # samples the interval of the MAD reaches down to the 2nd smallest deviation, 0
    few = summarize([1.0] * 2 + [0.9] * 4 + [1.1] * 4, batch=1)
    assert few.robust_cv == pytest.approx(0.14826)
    assert few.robust_cv_low == pytest.approx(0.0, abs=1e-12) and not few.noisy
    # the same two at the median among 20: the lower end is the 6th smallest deviation, 10 %
    more = summarize([1.0] * 2 + [0.9] * 9 + [1.1] * 9, batch=1)
    assert more.robust_cv_low == pytest.approx(0.14826) and more.noisy
    # two samples: no interval, however far apart
    assert summarize([0.5, 1.5], batch=1).robust_cv_low is None and not summarize([0.5, 1.5], batch=1).noisy


def test_as_dict_keys_and_values() -> None:
    s = summarize([0.001, 0.002, 0.003], batch=2)
    row = s.as_dict()
    assert set(row) == {
        "n", "median_us", "p5_us", "p95_us", "iqr_us", "mean_us", "stdev_us", "cv", "robust_cv", "robust_cv_low",
        "noisy",
    }  # fmt: skip
    assert math.isnan(row["robust_cv_low"])  # three samples: no interval
    assert row["median_us"] == pytest.approx(1000.0)
    assert row["n"] == 3


def test_noisy_is_judged_on_the_bulk_of_the_steps_not_on_a_few_stretched_ones() -> None:
    steady = [0.010 * (1 + 0.002 * (i % 5)) for i in range(100)]
    stretched = steady[:-3] + [0.1, 0.1, 0.1]  # three steps preempted 10x
    s = summarize(stretched, batch=1)
    assert s.cv > NOISY_CV_THRESHOLD  # the mean-based figure is dominated by three steps
    assert not s.noisy and s.robust_cv < 0.01
    # MAD by hand: deviations from the median, their median, scaled to a normal's stdev
    median = statistics.median(stretched)
    mad = statistics.median(abs(x - median) for x in stretched)
    assert s.robust_cv == pytest.approx(1.4826 * mad / median)
    spread = [0.010 * (1 + 0.1 * ((i % 7) - 3)) for i in range(100)]  # the bulk is spread by +-30 %
    assert summarize(spread, batch=1).noisy


def test_median_interval_of_a_cell_is_the_runners_order_statistics() -> None:
    samples = [0.001 * (1 + i / 100) for i in range(20)]  # sorted, 20 values
    s = summarize(samples, batch=2)
    # n = 20 at 95 %: ranks 6 and 15 (1-based), see tests/harness/runner/test_sampling.py
    low, high = s.median_ci_s  # type: ignore[misc]
    assert (low, high) == (pytest.approx(samples[5] / 2), pytest.approx(samples[14] / 2))
    median = statistics.median(samples) / 2
    assert s.precision == pytest.approx(max(median - low, high - median) / median)
    few = summarize([0.001] * 5, batch=1)
    assert few.median_ci_s is None and few.precision is None


def test_stats_are_frozen_and_lazy() -> None:
    s = summarize((0.1, 0.2), batch=1)
    assert isinstance(s, CellStats)
    with pytest.raises(AttributeError):
        s.batch = 2  # type: ignore[misc]
    assert "median_s" not in vars(s)
    _ = s.median_s
    assert "median_s" in vars(s)
    with pytest.raises(ValueError):
        s.per_image_seconds[0] = 1.0


@pytest.mark.parametrize(
    ("samples", "batch"),
    [([], 1), ([0.1], 0), ([0.1], -3), ([float("nan")], 1), ([float("inf")], 1), ([-0.1], 1), ([0.1], 1.5)],
)
def test_bad_input_is_refused(samples: list[float], batch: int) -> None:
    with pytest.raises(ValueError):
        summarize(samples, batch)


def test_percentile_helper_matches_hand_computation() -> None:
    values = [3.0, 1.0, 4.0, 1.0, 5.0, 9.0, 2.0, 6.0]
    for q in (0, 5, 25, 50, 75, 95, 100):
        assert percentile(values, q) == pytest.approx(linear_percentile(values, q))
    with pytest.raises(ValueError):
        percentile([], 50)
    with pytest.raises(ValueError):
        percentile([1.0], 101)


samples_st = st.lists(st.floats(min_value=1e-6, max_value=10.0, allow_nan=False), min_size=1, max_size=50)


@settings(max_examples=200, deadline=None)
@given(samples=samples_st, batch=st.integers(min_value=1, max_value=256))
def test_order_properties(samples: list[float], batch: int) -> None:
    s = summarize(samples, batch)
    lo, hi = min(samples) / batch, max(samples) / batch
    tol = 1e-12 * hi
    assert lo - tol <= s.p5_s <= s.median_s + tol
    assert s.median_s <= s.p95_s + tol
    assert s.p95_s <= hi + tol
    assert lo - tol <= s.mean_s <= hi + tol
    assert s.iqr_s >= -tol
    assert s.cv >= 0.0
    assert s.median_s == pytest.approx(linear_percentile([x / batch for x in samples], 50), rel=1e-12)
    assert s.p95_s == pytest.approx(linear_percentile([x / batch for x in samples], 95), rel=1e-12)


@settings(max_examples=200, deadline=None)
@given(samples=samples_st, batch=st.integers(min_value=1, max_value=64), scale=st.floats(min_value=1e-3, max_value=1e3))
def test_scaling_samples_scales_stats(samples: list[float], batch: int, scale: float) -> None:
    base = summarize(samples, batch)
    scaled = summarize([x * scale for x in samples], batch)
    for name in ("median_s", "p5_s", "p95_s", "mean_s"):
        assert getattr(scaled, name) == pytest.approx(getattr(base, name) * scale, rel=1e-9, abs=1e-300)
    # equal samples have a stdev of 0 up to rounding at the samples' own scale
    assert scaled.stdev_s == pytest.approx(base.stdev_s * scale, rel=1e-9, abs=1e-12 * scale * max(samples))
    assert scaled.iqr_s == pytest.approx(base.iqr_s * scale, rel=1e-9, abs=1e-12 * scale * max(samples))
    assert scaled.cv == pytest.approx(base.cv, rel=1e-6, abs=1e-9)


@settings(max_examples=100, deadline=None)
@given(samples=samples_st, batch=st.integers(min_value=1, max_value=64))
def test_batch_divides_location_and_leaves_cv(samples: list[float], batch: int) -> None:
    per_step = summarize(samples, 1)
    per_image = summarize(samples, batch)
    assert per_image.median_s == pytest.approx(per_step.median_s / batch, rel=1e-12)
    assert per_image.cv == pytest.approx(per_step.cv, rel=1e-9, abs=1e-12)
