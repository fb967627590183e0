"""The statistics of one measurement: warm-up, the median's interval, disturbed samples (pure).

Standard library only: the runner samples with these functions on the device, and the
host (`harness.stats`, `harness.passes.merge_passes`, `harness.store`) computes the
same statistics of stored samples with them, so both sides use one implementation.

Sampling (bench):

* **Warm-up** runs single steps until the time per step has settled, by this rule: step
  ``i >= 2`` has settled when it is no more than `WARMUP_TOLERANCE` (5 %) faster than the
  fastest step before it (the first steps of an ORT session allocate and are slower; a
  step that no longer sets a new minimum is past that). Capped at ``--warmup`` steps and
  at `WARMUP_SHARE` of ``--max-seconds``; ``warmup_settled`` says whether the rule or a cap
  ended it. A slower step (a CPU quota's throttled period) counts as settled: the rule
  asks only that the steps stop getting faster.
* **Timed samples** are taken until the 95 % confidence interval of their median is within
  ``+-precision`` of the median (relative half-width ``max(m - lo, hi - m) / m``), with at
  least ``--steps`` samples, or until ``--max-seconds`` (warm-up included) have passed, or
  `MAX_SAMPLES` samples; the run then says which (``stop_reason``) and whether the target
  was missed (``imprecise``). ``--precision 0`` takes exactly ``--steps`` samples (no
  interval test, no cap). The interval is distribution-free, from order statistics: for
  ``n`` samples ``[x_(k), x_(n+1-k)]`` with the largest ``k`` such that
  ``2 P(B <= k - 1) <= 0.05``, ``B ~ Binomial(n, 1/2)`` (`median_ci_ranks`, exact integer
  arithmetic); it covers the median of any continuous distribution with probability at
  least 95 % for a fixed ``n``, and needs ``n >= 6`` (`MIN_SAMPLES`). The test is repeated
  as samples arrive (every sample up to 20, then every 5 % more), so the coverage at the
  sample where it stops is somewhat below the nominal 95 %
  (``tests/harness/runner/test_sampling.py`` measures it).
* **Disturbed samples** (one thread): a training step is the same work every time, so its
  CPU time per step varies only when something outside the process slows the cpu (a
  neighbour on a shared host's caches and memory, SMT siblings); a CPU quota's throttled
  periods stop the process but cost it no CPU time. A sample whose CPU time per step is
  more than `DISTURBANCE_LIMIT` (10 %) above the 10th percentile of the run's samples is
  ``disturbed`` (`disturbed_samples`, judged from `DISTURBANCE_MIN_SAMPLES` samples on);
  the median, its interval and the stopping rule use the other samples. With more than
  one thread the CPU time also counts the pool's spinning, so nothing is judged.

Decisions:

* ``--sample-seconds``: a device held to a CPU share by a CFS quota (an emulated
  device) runs at full speed until the period's quota is spent and then not at all,
  so single steps shorter than a period come out bimodal (fast, or fast plus the rest
  of the period) and their median can sit on either mode. Timing blocks of steps that
  span many periods averages the quota out; the campaign asks for it on emulated
  devices (`harness.device_run.sample_seconds_for`).
* CPU time: every sample also records the process's CPU time per step. On a shared
  host (a virtual machine, a board whose other cores are busy) the CPU time of the same
  step rises for stretches of a fraction of a second to seconds, throttled or not, when
  the hardware slows under the neighbours' load: those samples are the disturbed ones
  above. A device that did not get the cpu (another process, a quota) shows wall
  time above CPU time instead. The campaign says which in an imprecise cell's reason
  (`harness.passes.imprecision_reason`).
"""

from __future__ import annotations

import bisect
import functools

#: Two-sided confidence of the interval of the median that ends the timed sampling.
CONFIDENCE = 0.95

#: Fewest samples for which a distribution-free two-sided 95 % interval of the median exists:
#: the widest one, ``[min, max]``, misses the median with probability ``2 / 2**n``, at most
#: 0.05 from ``n = 6`` on.
MIN_SAMPLES = 6

#: Warm-up rule: a step has settled when it is at most this fraction faster than the fastest before it.
WARMUP_TOLERANCE = 0.05

#: Warm-up may use at most this share of ``--max-seconds``.
WARMUP_SHARE = 0.25

#: Most timed samples of one run (bounds the document: about 25 bytes per sample).
MAX_SAMPLES = 5000

#: The interval test runs after every sample up to this many, then after every 5 % more.
CHECK_EVERY_SAMPLE_UP_TO = 20

#: A sample is disturbed when its CPU time per step exceeds this multiple of the run's low
#: quantile (`DISTURBANCE_QUANTILE`) of CPU time per step.
DISTURBANCE_LIMIT = 1.1

#: The quantile of the run's CPU times per step that stands for an undisturbed step. The
#: median as the base keeps both levels of a cell whose passes the host ran at two speeds,
#: and the cell is then flagged noisy; the low quantile keeps the faster, undisturbed level.
DISTURBANCE_QUANTILE = 0.1

#: Samples are judged disturbed only from this many on (a low quantile needs a few).
DISTURBANCE_MIN_SAMPLES = 10


@functools.lru_cache(maxsize=4096)
def median_ci_ranks(n: int, confidence: float = CONFIDENCE) -> tuple | None:
    """Return the ranks of the order statistics that bound the median with ``confidence``.

    For ``n`` independent samples of a continuous distribution with median ``m``, the
    number ``B`` of samples below ``m`` is Binomial(n, 1/2), so
    ``P(x_(k) <= m <= x_(n+1-k)) = 1 - 2 P(B <= k - 1)`` whatever the distribution.

    Parameters
    ----------
    n : int
        Number of samples.
    confidence : float
        Two-sided confidence in (0, 1).

    Returns
    -------
    tuple of int or None
        1-based ranks ``(k, n + 1 - k)`` with the largest ``k`` whose coverage
        ``1 - 2 P(B <= k - 1)`` is at least ``confidence`` (exact integer arithmetic);
        None when even ``[x_(1), x_(n)]`` covers less (``n < 6`` at 95 %).
    """
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence {confidence!r} is outside (0, 1)")
    if n < 1:
        return None
    from fractions import Fraction

    alpha = Fraction(1.0 - confidence).limit_denominator(10**9)
    total = 1 << n  # 2**n
    best = 0
    below = 0  # sum of C(n, i) for i < k
    term = 1  # C(n, k - 1)
    for k in range(1, (n + 1) // 2 + 1):
        below += term
        if 2 * below * alpha.denominator > alpha.numerator * total:
            break
        best = k
        term = term * (n - k + 1) // k
    return (best, n + 1 - best) if best else None


def median_of_sorted(values: list) -> float:
    """Return the median of sorted values (the mean of the two middle ones for even counts).

    Parameters
    ----------
    values : list of float
        Sorted, at least one.

    Returns
    -------
    float
        Equal to ``numpy.percentile(values, 50)`` (linear interpolation).
    """
    n = len(values)
    return 0.5 * (values[(n - 1) // 2] + values[n // 2])


def median_interval(values: list, confidence: float = CONFIDENCE) -> tuple:
    """Return the median of sorted samples, its distribution-free interval and their relative width.

    Parameters
    ----------
    values : list of float
        Sorted samples, at least one.
    confidence : float

    Returns
    -------
    median : float
    low, high : float or None
        The order statistics of `median_ci_ranks` (None when ``n`` is too small).
    half_width : float or None
        ``max(median - low, high - median) / median`` (None without an interval or for a
        median of 0).
    """
    median = median_of_sorted(values)
    ranks = median_ci_ranks(len(values), confidence)
    if ranks is None:
        return median, None, None, None
    low, high = values[ranks[0] - 1], values[ranks[1] - 1]
    half = max(median - low, high - median) / median if median > 0 else None
    return median, low, high, half


def has_settled(times: list, tolerance: float = WARMUP_TOLERANCE) -> bool:
    """Apply the warm-up rule to the step times so far.

    Parameters
    ----------
    times : list of float
        Warm-up step times, in order.
    tolerance : float

    Returns
    -------
    bool
        True from the second step on when the last step is at most ``tolerance`` faster
        than the fastest step before it: ``t[-1] >= (1 - tolerance) * min(t[:-1])``.
    """
    return len(times) >= 2 and times[-1] >= (1.0 - tolerance) * min(times[:-1])


def warm_up(step, clock, max_steps: int, max_seconds: float, tolerance: float = WARMUP_TOLERANCE) -> tuple:
    """Run warm-up steps until the time per step settles (`has_settled`) or a cap is reached.

    Parameters
    ----------
    step : callable
        Runs one training step.
    clock : callable
        Seconds (``time.perf_counter``; injected in tests).
    max_steps : int
        Most steps (0: no warm-up).
    max_seconds : float
        Most seconds; checked after each step.
    tolerance : float

    Returns
    -------
    times : list of float
        Every warm-up step's seconds.
    settled : bool
        Whether the rule ended the warm-up (False when a cap did).
    """
    times: list = []
    start = clock()
    while len(times) < max_steps:
        begin = clock()
        step()
        times.append(clock() - begin)
        if has_settled(times, tolerance):
            return times, True
        if clock() - start >= max_seconds:
            break
    return times, False


def disturbed_samples(
    cpu_seconds: list, limit: float = DISTURBANCE_LIMIT, min_samples: int = DISTURBANCE_MIN_SAMPLES
) -> list:
    """Say which samples ran on a cpu slowed from outside: CPU time per step above ``limit`` x the low quantile.

    Parameters
    ----------
    cpu_seconds : list of float
        CPU time per step of each sample, in order.
    limit : float
        Allowed multiple of the `DISTURBANCE_QUANTILE` quantile (lower order statistic).
    min_samples : int
        With fewer samples, none is judged disturbed.

    Returns
    -------
    list of bool
        One flag per sample.
    """
    if len(cpu_seconds) < min_samples:
        return [False] * len(cpu_seconds)
    ordered = sorted(cpu_seconds)
    low = ordered[int(DISTURBANCE_QUANTILE * (len(ordered) - 1))]
    return [value > limit * low for value in cpu_seconds]


def counted_samples(values: list, flags: list) -> list:
    """Return the samples that count: those whose disturbance flag is not set.

    Parameters
    ----------
    values : list of float
        One value per sample (its wall or its CPU seconds per step).
    flags : list of bool
        One flag per sample (`disturbed_samples`).

    Returns
    -------
    list of float
        The values of the undisturbed samples, in order.
    """
    return [value for value, flag in zip(values, flags) if not flag]  # noqa: B905 - zip(strict=) needs Python 3.10


def sample_steps(
    step,
    clock,
    *,
    min_samples: int,
    precision: float,
    max_seconds: float,
    sample_seconds: float = 0.0,
    loss_of=float,
    confidence: float = CONFIDENCE,
    max_samples: int = MAX_SAMPLES,
    cpu_clock=None,
    judge_disturbed: bool = False,
) -> dict:
    """Take timed samples until the median's interval is within ``precision`` or a cap is reached.

    Each sample times consecutive steps until at least ``sample_seconds`` have passed (one
    step when 0) and records the time per step. After a sample (every one up to
    `CHECK_EVERY_SAMPLE_UP_TO`, then every 5 % more), with at least ``min_samples``
    samples, the run stops when `median_interval` is within ``precision``; it also stops
    when ``max_seconds`` have passed since the call or ``max_samples`` were taken.
    ``precision == 0`` takes exactly ``min_samples`` samples (no test, no cap).

    Parameters
    ----------
    step : callable
        Runs one training step and returns its output.
    clock : callable
        Seconds.
    min_samples : int
        Fewest samples (at least 1).
    precision : float
        Target relative half-width of the interval (0: fixed count).
    max_seconds : float
        Cap on this call's wall time.
    sample_seconds : float
        Minimum seconds per sample.
    loss_of : callable
        Turns a step's output into a float (called outside the timed region).
    confidence : float
    max_samples : int
    cpu_clock : callable, optional
        CPU seconds of the process (`time.process_time`); when given, each sample's CPU
        time per step is recorded too.
    judge_disturbed : bool
        Leave `disturbed_samples` out of the median and the stopping rule (needs ``cpu_clock``).

    Returns
    -------
    dict
        ``seconds`` (time per step of each sample), ``cpu_seconds`` (CPU time per step of
        each sample; empty without ``cpu_clock``), ``disturbed`` (a flag per sample; empty
        unless judged), ``steps_per_sample``, ``loss``, ``stop_reason``, ``median``,
        ``low``, ``high``, ``half_width`` (of the final undisturbed samples; None where
        undefined), ``elapsed``.
    """
    judge = judge_disturbed and cpu_clock is not None

    def counted() -> tuple:
        """Return the disturbance flags (empty unless judged) and the sorted samples that count."""
        if not judge:
            return [], ordered
        flags = disturbed_samples(cpu_seconds)
        return flags, sorted(counted_samples(seconds, flags))

    seconds: list = []
    cpu_seconds: list = []
    ordered: list = []
    counts: list = []
    losses: list = []
    start = clock()
    next_check = min_samples
    reason = "steps"
    while True:
        cpu_begin = cpu_clock() if cpu_clock is not None else 0.0
        count, begin = 0, clock()
        while True:
            out = step()
            count += 1
            elapsed = clock() - begin
            if elapsed >= sample_seconds:
                break
        if cpu_clock is not None:
            cpu_seconds.append((cpu_clock() - cpu_begin) / count)
        value = elapsed / count
        seconds.append(value)
        bisect.insort(ordered, value)
        counts.append(count)
        losses.append(loss_of(out))
        n = len(seconds)
        if precision <= 0:
            if n >= min_samples:
                break
            continue
        if n >= next_check:
            half = median_interval(counted()[1], confidence)[3]
            if half is not None and half <= precision:
                reason = "precision"
                break
            next_check = n + 1 if n < CHECK_EVERY_SAMPLE_UP_TO else n + max(1, n // 20)
        if clock() - start >= max_seconds:
            reason = "time cap"
            break
        if n >= max_samples:
            reason = "sample cap"
            break
    flags, values = counted()
    median, low, high, half = median_interval(values, confidence)
    return {
        "seconds": seconds,
        "cpu_seconds": cpu_seconds,
        "disturbed": flags,
        "steps_per_sample": counts,
        "loss": losses,
        "stop_reason": reason,
        "median": median,
        "low": low,
        "high": high,
        "half_width": half,
        "elapsed": clock() - start,
    }
