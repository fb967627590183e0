"""The statistics of one measurement (`harness.runner.sampling`), on fake clocks: pure, no runner process."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

from harness.runner import sampling


class FakeClock:
    """A clock that a fake step advances by the next of the given step times."""

    def __init__(self, times: list[float]) -> None:
        self.now = 0.0
        self.times = iter(times)
        self.steps = 0

    def __call__(self) -> float:
        return self.now

    def step(self) -> float:
        self.steps += 1
        self.now += next(self.times)
        return 0.5  # a "loss"


def test_median_ci_ranks_are_the_binomial_ones() -> None:
    from scipy.stats import binom

    assert sampling.median_ci_ranks(5) is None
    assert sampling.median_ci_ranks(6) == (1, 6)
    assert sampling.median_ci_ranks(20) == (6, 15)  # the classic table value
    for n in range(1, 400):
        ranks = sampling.median_ci_ranks(n)
        feasible = [k for k in range(1, (n + 1) // 2 + 1) if 2 * binom.cdf(k - 1, n, 0.5) <= 0.05 + 1e-12]
        assert ranks == ((max(feasible), n + 1 - max(feasible)) if feasible else None), n
    assert sampling.median_ci_ranks(2000, 0.99)[0] < sampling.median_ci_ranks(2000, 0.95)[0]


@pytest.mark.parametrize(
    ("name", "draw", "median"),
    [
        ("exponential", lambda rng, n: rng.exponential(1.0, n), math.log(2.0)),
        ("lognormal", lambda rng, n: rng.lognormal(0.0, 1.0, n), 1.0),
        ("uniform", lambda rng, n: rng.uniform(2.0, 3.0, n), 2.5),
        # a CPU quota's bimodal steps: 60 % fast, 40 % throttled
        ("bimodal", lambda rng, n: np.where(rng.random(n) < 0.6, 1.0, 3.0) + 0.01 * rng.random(n), None),
    ],
)
def test_median_interval_covers_the_median_of_known_distributions(name: str, draw: Any, median: float | None) -> None:
    rng = np.random.default_rng(7)
    if median is None:  # the bimodal median: the 50 % quantile lies in the fast mode, at 1 + 0.01 * 5/6
        median = 1.0 + 0.01 * (0.5 / 0.6)
    for n in (6, 11, 25, 60):
        trials = 3000
        covered = 0
        for _ in range(trials):
            _, low, high, _ = sampling.median_interval(sorted(draw(rng, n).tolist()))
            covered += low <= median <= high
        # at least 95 % by construction (binomial ranks); 3 standard errors of slack for the simulation
        assert covered / trials >= 0.95 - 3 * math.sqrt(0.95 * 0.05 / trials), (name, n, covered / trials)


def test_warm_up_lasts_until_steps_stop_getting_faster() -> None:
    clock = FakeClock([8.0, 4.5, 4.25, 4.125, 4.0, 4.0])  # sums stay exact in binary
    times, settled = sampling.warm_up(clock.step, clock, max_steps=20, max_seconds=100.0)
    # 4.5 < 0.95 * 8 and 4.25 < 0.95 * 4.5 are still getting faster; 4.125 >= 0.95 * 4.25 has settled
    assert times == [8.0, 4.5, 4.25, 4.125] and settled
    clock = FakeClock([1.0, 2.5, 1.0])  # a slower second step (a throttled period) has settled too
    assert sampling.warm_up(clock.step, clock, 20, 100.0) == ([1.0, 2.5], True)
    clock = FakeClock([8.0, 4.0, 2.0, 1.0, 0.5])
    assert sampling.warm_up(clock.step, clock, 3, 100.0) == ([8.0, 4.0, 2.0], False)  # step cap
    clock = FakeClock([8.0, 4.0, 2.0, 1.0, 0.5])
    assert sampling.warm_up(clock.step, clock, 20, 11.0) == ([8.0, 4.0], False)  # time cap
    assert sampling.warm_up(clock.step, clock, 0, 11.0) == ([], False)


def test_sampling_stops_at_the_first_check_that_is_precise() -> None:
    rng = np.random.default_rng(3)
    times = (1.0 + 0.03 * rng.standard_normal(10_000)).tolist()
    clock = FakeClock(times)
    out = sampling.sample_steps(clock.step, clock, min_samples=6, precision=0.02, max_seconds=1e9)
    n = len(out["seconds"])
    assert out["stop_reason"] == "precision" and out["half_width"] <= 0.02
    assert out["seconds"] == pytest.approx(times[:n]) and out["steps_per_sample"] == [1] * n
    assert out["loss"] == [0.5] * n
    assert n <= sampling.CHECK_EVERY_SAMPLE_UP_TO + 1  # precise within the checks after every sample
    for m in range(sampling.MIN_SAMPLES, n):  # and no earlier check was
        half = sampling.median_interval(sorted(out["seconds"][:m]))[3]
        assert half is None or half > 0.02, m


def test_sampling_hits_the_cap_when_steps_are_too_noisy() -> None:
    times = [1.0 if i % 2 else 1.5 for i in range(10_000)]  # bimodal: the median never settles to 2 %
    clock = FakeClock(times)
    out = sampling.sample_steps(clock.step, clock, min_samples=6, precision=0.02, max_seconds=100.0)
    assert out["stop_reason"] == "time cap" and out["half_width"] > 0.02
    assert 100.0 <= out["elapsed"] < 101.5 and sum(out["seconds"]) == pytest.approx(out["elapsed"])
    clock = FakeClock(times)
    out = sampling.sample_steps(clock.step, clock, min_samples=6, precision=0.02, max_seconds=1e9, max_samples=50)
    assert out["stop_reason"] == "sample cap" and len(out["seconds"]) == 50


def test_fixed_count_and_blocks_of_steps() -> None:
    clock = FakeClock([1.0] * 100)
    out = sampling.sample_steps(clock.step, clock, min_samples=4, precision=0.0, max_seconds=0.5)
    assert out["stop_reason"] == "steps" and len(out["seconds"]) == 4  # no cap without a precision target
    clock = FakeClock([0.3] * 100)
    out = sampling.sample_steps(clock.step, clock, min_samples=3, precision=0.0, max_seconds=1e9, sample_seconds=1.0)
    # each sample runs whole steps until a second has passed: 4 steps of 0.3 s, recorded per step
    assert out["steps_per_sample"] == [4, 4, 4] and out["seconds"] == pytest.approx([0.3] * 3)


def test_each_sample_records_the_cpu_time_per_step_beside_the_wall_time() -> None:
    clock = FakeClock([0.3] * 100)
    cpu = FakeClock([0.1, 0.2] * 50)  # CPU seconds consumed by each step: a third, then two thirds of its 0.3 s
    out = sampling.sample_steps(
        lambda: (cpu.step(), clock.step())[1], clock, min_samples=3, precision=0.0, max_seconds=1e9,
        sample_seconds=1.0, cpu_clock=cpu,
    )  # fmt: skip
    # 4 steps per sample: CPU 0.1 + 0.2 + 0.1 + 0.2 = 0.6 s, 0.15 s per step
    assert out["cpu_seconds"] == pytest.approx([0.15] * 3) and out["seconds"] == pytest.approx([0.3] * 3)
    without = sampling.sample_steps(clock.step, clock, min_samples=2, precision=0.0, max_seconds=1)
    assert without["cpu_seconds"] == []


def test_samples_whose_cpu_time_per_step_rose_are_disturbed_from_the_tenth_on() -> None:
    cpu = [1.0] * 9 + [1.09, 1.11, 1.5]
    assert sampling.disturbed_samples(cpu[:9] + [1.5]) == [False] * 9 + [True]
    assert sampling.disturbed_samples(cpu[:8] + [1.5]) == [False] * 9  # too few to judge
    assert sampling.disturbed_samples(cpu) == [False] * 10 + [True, True]
    # the base is the low quantile, not the minimum: one lucky fast sample does not condemn the rest
    assert sampling.disturbed_samples([0.5] + [1.0] * 19) == [False] * 20


def test_disturbed_samples_count_neither_in_the_median_nor_in_the_stopping_rule() -> None:
    # every third sample ran on a cpu slowed from outside: 1.6x the wall time and 1.6x the CPU time
    slowed = [i % 3 == 2 for i in range(3000)]
    clock = FakeClock([1.6 if s else 1.0 + 0.001 * (i % 7) for i, s in enumerate(slowed)])
    cpu = FakeClock([1.6 if s else 1.0 for s in slowed])
    out = sampling.sample_steps(
        lambda: (cpu.step(), clock.step())[1], clock, min_samples=6, precision=0.02, max_seconds=1e9,
        cpu_clock=cpu, judge_disturbed=True,
    )  # fmt: skip
    n = len(out["seconds"])
    assert out["disturbed"] == slowed[:n] and out["stop_reason"] == "precision"
    assert 1.0 <= out["median"] <= 1.006 and out["high"] < 1.6
    clock, cpu = FakeClock([1.6 if s else 1.0 for s in slowed]), FakeClock([1.6 if s else 1.0 for s in slowed])
    judged_not = sampling.sample_steps(
        lambda: (cpu.step(), clock.step())[1], clock, min_samples=30, precision=0.0, max_seconds=1e9,
        cpu_clock=cpu,
    )  # fmt: skip
    assert judged_not["disturbed"] == [] and judged_not["median"] == 1.0 and judged_not["high"] == pytest.approx(1.6)


def test_coverage_at_the_stopping_sample_stays_close_to_nominal() -> None:
    # The interval is tested after every sample, so stopping picks a lucky narrow moment now and
    # then: measure how often the interval at the stop still holds the true median.
    rng = np.random.default_rng(11)
    trials, covered = 600, 0
    for _ in range(trials):
        times = rng.lognormal(0.0, 0.04, 5000).tolist()  # median 1.0
        clock = FakeClock(times)
        out = sampling.sample_steps(clock.step, clock, min_samples=6, precision=0.02, max_seconds=1e9)
        covered += out["low"] <= 1.0 <= out["high"]
    assert covered / trials >= 0.88, covered / trials


def test_the_samples_that_count_are_the_undisturbed_ones_in_order() -> None:
    assert sampling.counted_samples([3.0, 2.0, 1.0], [False, True, False]) == [3.0, 1.0]
    assert sampling.counted_samples([1.0, 2.0], [0, 0]) == [1.0, 2.0]  # documents carry 0/1 flags
