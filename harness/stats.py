"""Statistics of one measured cell, derived from its raw per-step seconds.

Pure functions, no I/O (the pytest-benchmark way: statistics in their own module,
computed from stored samples, never stored by hand).

Conventions
-----------
* **Input** is the wall time of every *timed* training step of one cell, in seconds.
  Warm-up steps never enter: the on-device runner reports them apart and excludes
  them from ``step_seconds`` (see `harness.records.Measurement`); nothing here
  drops leading samples.
* **Per image**: every statistic is of the per-image time ``step_seconds / batch``.
  Because that is a constant scale, location and spread statistics scale with it
  and the coefficient of variation is the same for per-step and per-image times.
* **Percentiles** (p5, median, p95, quartiles) use NumPy's ``method="linear"``
  (NumPy's default, R type 7, Hyndman & Fan definition 7): for sorted samples
  ``x[0..n-1]`` and quantile ``q`` the rank is ``h = (n - 1) q`` and the value is
  ``x[floor(h)] + (h - floor(h)) (x[floor(h) + 1] - x[floor(h)])``.
* **IQR** is ``p75 - p25`` with the same method.
* **Standard deviation** is the sample standard deviation (``ddof=1``, as
  `statistics.stdev` and pytest-benchmark); it is ``0.0`` for a single sample.
* **Coefficient of variation** is ``stdev / mean``.
* **Robust coefficient of variation** is ``1.4826 * MAD / median`` (MAD: the median absolute
  deviation from the median); for normal samples it estimates the same quantity as the CV.
  A cell is *noisy* when the lower end of that figure's 95 % interval (``robust_cv_low``)
  exceeds `NOISY_CV_THRESHOLD` (0.05): when the bulk of its steps is spread beyond 5 % with
  confidence, not only in a point estimate.
  **Decision:** noisy is judged on the robust figure, not on ``stdev / mean``. A cell is
  sampled until its median is precise (`harness.runner.sampling`), often hundreds of
  steps, and a handful of them stretched 10x by a preemption or a page fault lift the CV
  above 5 % while the median, the statistic every report and model uses, does not move.
  The flag is meant to say that the bulk of the steps is spread (contention, a CPU quota
  that is not averaged out), which the robust figure measures. ``cv`` stays in the table.
  **Decision:** the flag asks for the interval, not the point estimate. A MAD from few
  samples scatters widely (its efficiency is 37 % of the standard deviation's on normal
  samples): a device held to a CPU share times blocks of steps, 6 to 20 samples a cell, and
  the point estimate then lifts cells above 5 % whose medians repeat closely across
  campaigns, where the interval does not. The interval is distribution-free: the MAD is the median
  of the absolute deviations from the median, and its interval is that of their order
  statistics (`harness.runner.sampling.median_interval`, the interval the median gets). So few
  samples need a wide spread to be flagged (at 10 samples, 2 of which lie within the
  threshold's deviation), and a bimodal cell, whose deviations leave a gap around their
  median, is flagged only when most of them lie beyond it. Below
  `harness.runner.sampling.MIN_SAMPLES` samples there is no interval, and no flag: such a cell is
  imprecise instead.
* **Interval of the median**: the distribution-free 95 % interval of order statistics that
  the runner's stopping rule uses (`harness.runner.sampling.median_interval`, one implementation for
  both sides); ``precision`` is its half-width as a fraction of the median, ``None`` below
  `harness.runner.sampling.MIN_SAMPLES` samples.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from functools import cached_property
from typing import Final

import numpy as np

from harness.runner.sampling import CONFIDENCE, median_interval

#: Robust coefficient of variation above which a cell is flagged noisy (5 %).
NOISY_CV_THRESHOLD = 0.05

#: Scale that makes the MAD estimate the standard deviation of normal samples (1 / Phi^-1(3/4)).
MAD_TO_SD = 1.4826

#: Percentile interpolation used for every quantile here (see the module docstring).
PERCENTILE_METHOD: Final = "linear"

#: Seconds to microseconds.
_US = 1e6


def percentile(values: Iterable[float], q: float) -> float:
    """Return the ``q``-th percentile of ``values`` by linear interpolation.

    Parameters
    ----------
    values : iterable of float
        At least one finite value.
    q : float
        Percentile in [0, 100].

    Returns
    -------
    float
        ``numpy.percentile(values, q, method="linear")``.

    Raises
    ------
    ValueError
        If ``values`` is empty or ``q`` lies outside [0, 100].
    """
    array = np.asarray(list(values), dtype=np.float64)
    if array.size == 0:
        raise ValueError("percentile of no samples")
    if not 0.0 <= q <= 100.0:
        raise ValueError(f"percentile {q} is outside [0, 100]")
    return float(np.percentile(array, q, method=PERCENTILE_METHOD))


@dataclass(frozen=True)
class CellStats:
    """Statistics of one cell's per-image training latency, derived lazily from the samples.

    Construct with `summarize` (which validates); every statistic is a cached property.

    Attributes
    ----------
    step_seconds : tuple of float
        Wall time of every timed step in seconds (warm-up excluded by the runner).
    batch : int
        Images per step; per-image time is ``step_seconds / batch``.
    """

    step_seconds: tuple[float, ...]
    batch: int

    @cached_property
    def per_image_seconds(self) -> np.ndarray:
        """Per-image seconds of every step, in step order (a read-only float64 array)."""
        array = np.asarray(self.step_seconds, dtype=np.float64) / self.batch
        array.setflags(write=False)
        return array

    @property
    def n(self) -> int:
        """Number of timed steps."""
        return len(self.step_seconds)

    @cached_property
    def median_s(self) -> float:
        """Median per-image seconds."""
        return self._quantile(50.0)

    @cached_property
    def p5_s(self) -> float:
        """5th percentile of per-image seconds."""
        return self._quantile(5.0)

    @cached_property
    def p95_s(self) -> float:
        """95th percentile of per-image seconds."""
        return self._quantile(95.0)

    @cached_property
    def iqr_s(self) -> float:
        """Interquartile range (p75 - p25) of per-image seconds."""
        return self._quantile(75.0) - self._quantile(25.0)

    @cached_property
    def mean_s(self) -> float:
        """Mean per-image seconds."""
        return float(np.mean(self.per_image_seconds))

    @cached_property
    def stdev_s(self) -> float:
        """Sample standard deviation (ddof=1) of per-image seconds; 0.0 for one sample."""
        if self.n < 2:
            return 0.0
        return float(np.std(self.per_image_seconds, ddof=1))

    @cached_property
    def cv(self) -> float:
        """Coefficient of variation ``stdev / mean`` (0.0 when the spread is 0)."""
        if self.stdev_s == 0.0:
            return 0.0
        return self.stdev_s / self.mean_s if self.mean_s > 0 else math.inf

    @cached_property
    def _deviations(self) -> list[float]:
        """Absolute deviations of per-image seconds from their median, sorted."""
        return sorted(float(v) for v in np.abs(self.per_image_seconds - self.median_s))

    @cached_property
    def mad_s(self) -> float:
        """Median absolute deviation of per-image seconds from their median."""
        return float(np.median(self._deviations))

    @cached_property
    def robust_cv(self) -> float:
        """``MAD_TO_SD * MAD / median`` (0.0 when the MAD is 0)."""
        if self.mad_s == 0.0:
            return 0.0
        return MAD_TO_SD * self.mad_s / self.median_s if self.median_s > 0 else math.inf

    @cached_property
    def robust_cv_low(self) -> float | None:
        """Lower end of the 95 % interval of `robust_cv` (order statistics of the absolute deviations).

        None below `harness.runner.sampling.MIN_SAMPLES` samples (no interval).
        """
        if self.median_s <= 0:
            return None
        _, low, _, _ = median_interval(self._deviations, CONFIDENCE)
        return None if low is None else MAD_TO_SD * low / self.median_s

    @property
    def noisy(self) -> bool:
        """Whether the whole 95 % interval of the robust coefficient of variation lies above `NOISY_CV_THRESHOLD`."""
        low = self.robust_cv_low
        return low is not None and low > NOISY_CV_THRESHOLD

    @cached_property
    def _interval(self) -> tuple[float, float | None, float | None, float | None]:
        ordered = sorted(float(v) for v in self.per_image_seconds)
        median, low, high, half = median_interval(ordered, CONFIDENCE)
        return median, low, high, half

    @property
    def median_ci_s(self) -> tuple[float, float] | None:
        """The 95 % interval of the median per-image seconds (order statistics), None below 6 samples."""
        _, low, high, _ = self._interval
        return None if low is None or high is None else (low, high)

    @property
    def precision(self) -> float | None:
        """Half-width of `median_ci_s` as a fraction of the median, None below 6 samples."""
        return self._interval[3]

    @property
    def median_us(self) -> float:
        """Median per-image microseconds."""
        return self.median_s * _US

    @property
    def p5_us(self) -> float:
        """5th percentile of per-image microseconds."""
        return self.p5_s * _US

    @property
    def p95_us(self) -> float:
        """95th percentile of per-image microseconds."""
        return self.p95_s * _US

    @property
    def iqr_us(self) -> float:
        """Interquartile range of per-image microseconds."""
        return self.iqr_s * _US

    @property
    def mean_us(self) -> float:
        """Mean per-image microseconds."""
        return self.mean_s * _US

    @property
    def stdev_us(self) -> float:
        """Sample standard deviation of per-image microseconds."""
        return self.stdev_s * _US

    def as_dict(self) -> dict[str, float | int | bool]:
        """Return the statistics as a flat dict (microseconds), for table rows.

        Returns
        -------
        dict
            Keys ``n, median_us, p5_us, p95_us, iqr_us, mean_us, stdev_us, cv, robust_cv,
            robust_cv_low, noisy`` (``robust_cv_low`` NaN without an interval).
        """
        return {
            "n": self.n,
            "median_us": self.median_us,
            "p5_us": self.p5_us,
            "p95_us": self.p95_us,
            "iqr_us": self.iqr_us,
            "mean_us": self.mean_us,
            "stdev_us": self.stdev_us,
            "cv": self.cv,
            "robust_cv": self.robust_cv,
            "robust_cv_low": math.nan if self.robust_cv_low is None else self.robust_cv_low,
            "noisy": self.noisy,
        }

    def _quantile(self, q: float) -> float:
        return float(np.percentile(self.per_image_seconds, q, method=PERCENTILE_METHOD))


def summarize(step_seconds: Iterable[float], batch: int) -> CellStats:
    """Return the statistics of one cell from its timed per-step seconds.

    Parameters
    ----------
    step_seconds : iterable of float
        Wall time of every timed step in seconds, warm-up already excluded.
    batch : int
        Images per step (at least 1).

    Returns
    -------
    CellStats
        Per-image statistics, computed lazily on first access.

    Raises
    ------
    ValueError
        If there are no samples, a sample is negative or not finite, or ``batch < 1``.

    Examples
    --------
    >>> s = summarize([0.001, 0.002, 0.003, 0.004, 0.100], batch=4)
    >>> round(s.median_us, 6), s.robust_cv_low, s.noisy  # five samples: no interval, no flag
    (750.0, None, False)
    >>> summarize([0.008, 0.012] * 10, batch=1).noisy  # every step 20 % off the median
    True
    >>> summarize([0.010] * 9 + [0.100], batch=1).noisy  # one stretched step: the median holds
    False
    """
    samples = tuple(float(x) for x in step_seconds)
    if isinstance(batch, bool) or int(batch) != batch or batch < 1:
        raise ValueError(f"batch must be a positive integer, got {batch!r}")
    if not samples:
        raise ValueError("no timed steps to summarize")
    bad = [x for x in samples if not math.isfinite(x) or x < 0.0]
    if bad:
        raise ValueError(f"step times must be finite and non-negative seconds, got {bad[:3]}")
    return CellStats(step_seconds=samples, batch=int(batch))
