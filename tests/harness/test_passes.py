"""Runner documents to measurements: passes pooled, samples judged, imprecision explained (`harness.passes`)."""

from __future__ import annotations

import pytest

from devices.fleet import Device
from harness.cells import plan_cells
from harness.document import BeforeAfter, RunnerDocument, parse_document
from harness.passes import counted_steps, imprecision_reason, measurement_from_doc, merge_passes
from tests.harness.campaigns import BATCH, MODEL


def test_imprecise_cells_say_why_and_stay_ok() -> None:
    spec = plan_cells([Device("d", "local")], MODEL, [0.5], [BATCH], ["ort"], 6, 20, max_seconds=3.0)[0]
    raw = {
        "status": "ok", "step_seconds": [0.01] * 40, "precision_achieved": 0.034, "imprecise": True,
        "stop_reason": "time cap", "samples": 40, "timed_seconds": 3.02,
        "loadavg": {"before": [1.0, 1.0, 1.0], "after": [3.9, 2.0, 1.0]}, "cpus_available": 2,
    }  # fmt: skip
    doc = parse_document(raw)
    m = measurement_from_doc(
        spec, "ok", "", doc, facts={}, started_at=0.0, finished_at=1.0, versions={}, git_commit=None,
        isolation={"alone": True},
    )  # fmt: skip
    assert m.ok and m.imprecise and m.stop_reason == "time cap" and m.precision_achieved == 0.034
    assert m.message == (
        "imprecise: 95 % interval of the median +-3.4 % after 40 samples in 3.0 s (target +-2 %, time cap); "
        "device busy: load average 3.9 on 2 cpus"
    )
    quiet = parse_document({**raw, "loadavg": {"before": [0.5], "after": [1.5]}})
    assert "busy" not in imprecision_reason(spec, quiet)
    precise = measurement_from_doc(
        spec, "ok", "", parse_document({**raw, "imprecise": False}), facts={}, started_at=0, finished_at=1, versions={},
        git_commit=None,
    )  # fmt: skip
    assert not precise.imprecise and precise.message == ""
    failed = measurement_from_doc(
        spec, "timeout", "took too long", doc, facts={}, started_at=0, finished_at=1, versions={}, git_commit=None
    )
    assert not failed.imprecise and failed.message == "took too long" and failed.step_seconds == ()


def test_an_imprecise_cells_reason_says_what_its_cpu_time_shows() -> None:
    spec = plan_cells([Device("d", "local")], MODEL, [0.5], [BATCH], ["ort"], 6, 20, max_seconds=3.0)[0]
    wall = [0.010] * 40
    raw = {
        "status": "ok", "step_seconds": wall, "cpu_step_seconds": [0.006] * 40, "precision_achieved": 0.034,
        "imprecise": True, "stop_reason": "time cap", "samples": 40, "timed_seconds": 3.02,
        "loadavg": {"before": [0.2], "after": [0.3]}, "cpus_available": 2,
    }  # fmt: skip
    doc = parse_document(raw)
    head = "imprecise: 95 % interval of the median +-3.4 % after 40 samples in 3.0 s (target +-2 %, time cap)"
    # 6 ms of CPU in 10 ms: kept from the cpu 40 % of the time, whatever the load average says
    busy = "device busy: the runner ran 60 % of the time (at most 100 %)"
    assert imprecision_reason(spec, doc) == f"{head}; {busy}"
    # an emulated device held to 0.6 of a core could not run more: not busy
    assert imprecision_reason(spec, doc, share=0.6) == head
    assert "busy" in imprecision_reason(spec, doc, share=0.8)
    # the steps' own CPU time in two modes, 4 and 6 ms: the work cost more at times
    varied = parse_document({**raw, "cpu_step_seconds": [0.004, 0.006] * 20})
    reason = imprecision_reason(spec, varied, share=0.6)
    assert reason.startswith(f"{head}; its steps' own CPU time varied +-") and "the work cost more at times" in reason
    steady = parse_document({**raw, "cpu_step_seconds": [0.0099, 0.0100] * 20})
    assert imprecision_reason(spec, steady) == head
    # without CPU times (a runner that does not report them) the load average decides, as before
    loaded = parse_document({**raw, "cpu_step_seconds": [], "loadavg": {"before": [3.9], "after": [1.0]}})
    assert imprecision_reason(spec, loaded) == f"{head}; device busy: load average 3.9 on 2 cpus"


def test_disturbed_samples_leave_the_cell_and_its_reason_counts_them() -> None:
    spec = plan_cells([Device("d", "local")], MODEL, [0.5], [BATCH], ["ort"], 6, 20, max_seconds=3.0)[0]
    wall = [0.010, 0.011, 0.016] * 10
    raw = {
        "status": "ok", "step_seconds": wall, "cpu_step_seconds": [0.010, 0.0105, 0.016] * 10,
        "disturbed": [0, 0, 1] * 10, "precision_achieved": 0.03, "imprecise": True, "stop_reason": "time cap",
        "samples": 30, "timed_seconds": 3.0,
    }  # fmt: skip
    doc = parse_document(raw)
    m = measurement_from_doc(
        spec, "ok", "", doc, facts={}, started_at=0.0, finished_at=1.0, versions={}, git_commit=None
    )
    assert m.step_seconds == (0.010, 0.011) * 10 and m.runner.step_seconds == tuple(wall)
    assert m.message.endswith(
        "; 10 of 30 samples disturbed: their CPU time per step rose over 10 %, "
        "the cpu was slowed from outside the runner"
    )
    pooled = imprecision_reason(spec, parse_document({**raw, "passes": 4}))
    assert pooled.endswith("; 10 of 30 samples disturbed: their CPU time per step rose over 10 %, over the cell's "
                           "4 passes: a pass the host slowed, or the first pass still cold")  # fmt: skip
    # flags that do not match the samples one to one are not trusted: every sample counts
    assert counted_steps(parse_document({**raw, "disturbed": [1]})) == wall
    assert counted_steps(parse_document({"step_seconds": wall})) == wall


def _pass(wall: list[float], *, flags: bool = True, **extra: object) -> RunnerDocument:
    """A pass's runner document: CPU time equal to wall time, judged (one flag per sample, none set) when ``flags``."""
    doc = {
        "status": "ok", "step_seconds": wall, "cpu_step_seconds": wall, "steps_per_sample": [1] * len(wall),
        "loss": [2.0] * len(wall), "samples": len(wall), "timed_seconds": 0.5, "stop_reason": "precision",
        "disturbed": [0] * len(wall) if flags else [],
    }  # fmt: skip
    return parse_document({**doc, **extra})


def test_passes_pool_their_samples_and_a_pass_the_host_slowed_as_a_whole_is_left_out() -> None:
    first = _pass([0.010] * 4, peak_memory_bytes=80_000_000, matmul_gflops=12.0, warmup_steps=7,
                  loadavg={"before": [0.1], "after": [0.2]})  # fmt: skip
    second = _pass([0.0104] * 4, peak_memory_bytes=95_000_000, warmup_steps=2,
                   loadavg={"before": [0.3], "after": [0.4]})  # fmt: skip
    slowed = _pass([0.015] * 4, throttled=True, stop_reason="time cap", loadavg={"before": [0.5], "after": [0.9]})
    merged = merge_passes([first, second, slowed], precision=0.02)
    # 12 samples pooled; the low quantile is 0.010 and 0.015 > 1.1 x 0.010: the third pass is disturbed,
    # which it could not see alone (its 4 samples agree)
    assert merged.step_seconds == (0.010,) * 4 + (0.0104,) * 4 + (0.015,) * 4 and merged.samples == 12
    assert merged.disturbed == (0,) * 8 + (1,) * 4
    assert counted_steps(merged) == [0.010] * 4 + [0.0104] * 4
    # the median of the 8 that count is (0.010 + 0.0104) / 2; pooling without judging would give 0.0104
    assert merged.median_ci_seconds is not None
    low, high = merged.median_ci_seconds
    assert low == 0.010 and high == 0.0104 and merged.precision_achieved == pytest.approx(0.0002 / 0.0102)
    assert merged.imprecise is False and merged.stop_reason == "precision"
    # each pass's median is of its own samples: the slowed pass keeps its level there
    assert merged.passes == 3 and merged.pass_medians == (0.010, 0.0104, 0.015)
    assert merged.timed_seconds == pytest.approx(1.5) and merged.steps_per_sample == (1,) * 12
    # the first pass ran in a process of its own: its memory, warm-up and matmul rate are the cell's
    assert (merged.peak_memory_bytes, merged.matmul_gflops, merged.warmup_steps) == (80_000_000, 12.0, 7)
    assert merged.throttled is True and merged.loadavg == BeforeAfter((0.1,), (0.9,))
    assert merged.raw["loadavg"] == {"before": [0.1], "after": [0.9]}


def test_a_pool_of_few_long_samples_is_judged_from_six_on() -> None:
    # a device held to a small CPU share: 2 samples per pass; a single run is judged from 10 samples
    steady, slowed = _pass([0.010, 0.0101]), _pass([0.014, 0.014])
    merged = merge_passes([steady, steady, slowed], precision=0.02)
    assert merged.disturbed == (0, 0, 0, 0, 1, 1) and counted_steps(merged) == [0.010, 0.0101] * 2
    too_few = merge_passes([steady, slowed], precision=0.02)
    assert too_few.disturbed == (0, 0, 0, 0) and len(counted_steps(too_few)) == 4


def test_passes_that_disagree_leave_the_cell_imprecise_and_say_so() -> None:
    # multi-thread runs are not judged (no flags): every sample counts
    low, high = _pass([0.010] * 6, flags=False), _pass([0.013] * 6, flags=False)
    merged = merge_passes([low, high], precision=0.02)
    assert merged.disturbed == () and counted_steps(merged) == [0.010] * 6 + [0.013] * 6
    # the 95 % interval of 12 samples spans both passes: median 0.0115, +-0.0015
    assert merged.precision_achieved == pytest.approx(0.0015 / 0.0115) and merged.imprecise is True
    assert merged.stop_reason == "passes differ"
    capped = merge_passes([low, _pass([0.013] * 6, flags=False, stop_reason="time cap")], precision=0.02)
    assert capped.stop_reason == "time cap"
    counted = merge_passes([low, high], precision=0.0)
    assert counted.imprecise is False and counted.stop_reason == "steps"
    with pytest.raises(ValueError, match="at least one pass"):
        merge_passes([], precision=0.02)
