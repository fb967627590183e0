"""Profiling campaigns end to end on an emulated fleet (real sshd, real runner, real store)."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from devices import emulate
from devices.fleet import Device, Emulation, Fleet
from devices.limits import parse_cpu_list
from exporters.errors import InputError
from exporters.flops import count
from exporters.manifest import EXPORT_FORMAT_VERSION
from exporters.zoo import get_model
from harness import campaign, contract, runner_archive
from harness.campaign import CellEvent, plan_cells
from harness.store import ProfileStore
from tests.devices.conftest import kill_device
from tests.harness.test_runner_onnx import plain_python  # noqa: F401, F811 - a fixture, used as an argument

MODEL, WIDTHS, BATCH, STEPS, WARMUP = "fjord-cnn", (0.25, 0.5, 0.75, 1.0), 4, 3, 1
TIMEOUT = 120.0


# --------------------------------------------------------------------------- pure parts


def test_plan_cells_is_device_major_and_uses_device_threads() -> None:
    devices = [Device(name="a", kind="local", threads=2), Device(name="b", kind="local")]
    specs = plan_cells(devices, MODEL, WIDTHS[:2], [4, 8], ["ort", "torch"], steps=3, warmup=1)
    assert len(specs) == 2 * 2 * 2 * 2
    assert [s.device for s in specs[:8]] == ["a"] * 8 and {s.threads for s in specs[:8]} == {2}
    assert len({s.cell_key() for s in specs}) == len(specs)
    assert specs[0].arch_widths != specs[4].arch_widths  # widths really change the arch
    with pytest.raises(InputError):
        plan_cells(devices, "no-such-model", WIDTHS, [4], ["ort"], 3, 1)
    with pytest.raises(InputError):
        plan_cells(devices, MODEL, WIDTHS, [4], ["tflite"], 3, 1)


def test_only_devices_a_cpu_quota_throttles_time_blocks_of_steps() -> None:
    from devices.limits import PERIOD_US

    def block(share: float, threads: int = 1) -> float:  # a throttled gap is at most 4 % of a block
        return PERIOD_US * 1e-6 * (1 - share / threads) / 0.04

    seconds = campaign.sample_seconds_for
    assert seconds(Device("a", "ssh", emulate=Emulation(cpu_share=0.3))) == pytest.approx(block(0.3))
    assert seconds(Device("b", "ssh", emulate=Emulation(preset="pi3"))) == pytest.approx(block(0.14))
    assert seconds(Device("t", "ssh", threads=2, emulate=Emulation(cpu_share=1.2))) == pytest.approx(block(1.2, 2))
    # a share of at least the runner's threads never throttles them: single steps
    assert seconds(Device("p", "adb", emulate=Emulation(preset="phone-midrange"))) == 0.0
    assert seconds(Device("c", "ssh", emulate=Emulation(memory_mb=512))) == 0.0
    assert seconds(Device("d", "local")) == 0.0


# --------------------------------------------------------------------------- isolation plan


def _fleet(text: str, tmp_path: Path) -> Fleet:
    from devices.fleetfile import parse_fleet

    return parse_fleet(text, tmp_path / "fleet.yaml", cwd=tmp_path)


PLANNED = """devices:
  - {name: fast, kind: ssh, host: 127.0.0.1, port: 2201, emulate: {cpu_share: 0.6, cpus: "0"}}
  - {name: mid, kind: ssh, host: 127.0.0.1, port: 2202, emulate: {preset: pi4, cpus: "0"}}
  - {name: slow, kind: ssh, host: 127.0.0.1, port: 2203, emulate: {preset: pi3, cpus: "1"}}
  - {name: phone, kind: adb, serial: "127.0.0.1:2204", emulate: {preset: phone-midrange, cpus: "0-1"}}
  - {name: here, kind: local}
  - {name: pi, kind: ssh, host: pi.lab}
  - {name: jetson, kind: ssh, host: 10.0.0.7}
  - {name: loop, kind: ssh, host: localhost}
"""


def test_isolation_plan_from_a_fleet_file(tmp_path: Path) -> None:
    fleet = _fleet(PLANNED, tmp_path)
    pins = {d.name: parse_cpu_list(d.emulate.cpus) for d in fleet.devices if d.emulate and d.emulate.cpus}
    plan = campaign.plan_isolation(fleet.devices, pins)
    after = {p.device: p.after for p in plan.placements}
    assert after == {
        "fast": (),
        "mid": ("fast",),  # both on cpu 0
        "slow": (),  # cpu 1 alone
        "phone": ("fast", "mid", "slow"),  # cpus 0-1 overlap all three
        "here": ("fast", "mid", "slow", "phone"),  # a local device has every cpu of this host
        "pi": (),  # other hosts run at the same time
        "jetson": (),
        "loop": ("fast", "mid", "slow", "phone", "here"),  # a loopback address is this host
    }
    assert plan.groups == [["fast", "slow", "pi", "jetson"], ["mid"], ["phone"], ["here"], ["loop"]]
    assert plan.conflict("fast", "mid") and not plan.conflict("fast", "slow") and not plan.conflict("pi", "here")
    lines = plan.describe()
    assert lines[0].startswith("isolation plan") and any("after fast (shares cpus)" in line for line in lines)
    assert plan.to_dict()["devices"]["phone"] == {"on_host": True, "cpus": "0-1", "after": ["fast", "mid", "slow"],
                                                   "group": 3}  # fmt: skip
    # the records a cell gets
    alone = plan.isolation("mid", [])
    assert alone == {"alone": True, "concurrent_with": [], "cpus": "cpus 0",
                     "reason": "measured alone: shares this host's cpus with fast, phone, here, loop"}  # fmt: skip
    beside = plan.isolation("fast", ["slow", "pi", "fast"])
    assert not beside["alone"] and beside["concurrent_with"] == ["pi", "slow"]
    assert beside["reason"] == "concurrent with pi (pi is another host), slow (disjoint cpus 0 | 1)"
    # without pins every device on this host waits for the one before it
    unpinned = campaign.plan_isolation(fleet.devices[:4], {})
    assert [p.group for p in unpinned.placements] == [1, 2, 3, 4]
    # FL rounds: every device on this host takes its turn whatever its pins; other hosts train beside
    rounds = campaign.round_isolation(fleet)
    assert rounds.groups == [["fast", "pi", "jetson"], ["mid"], ["slow"], ["phone"], ["here"], ["loop"]]
    assert rounds.conflict("fast", "slow") and not rounds.conflict("fast", "pi")


def test_devices_sharing_cpus_take_turns_pass_by_pass(tmp_path: Path) -> None:
    fleet = _fleet(PLANNED, tmp_path)
    pins = {d.name: parse_cpu_list(d.emulate.cpus) for d in fleet.devices if d.emulate and d.emulate.cpus}
    plan = campaign.plan_isolation(fleet.devices, pins)
    names = [d.name for d in fleet.devices]
    may = campaign.may_take_turn
    nothing = dict.fromkeys(names, 0.0)
    # turn 1: each waits for the earlier devices it shares cpus with, not for later ones
    assert [may(plan, nothing, n, 1) for n in names] == [True, False, True, False, False, True, True, False]
    assert may(plan, {**nothing, "fast": 1}, "mid", 1) and not may(plan, {**nothing, "fast": 1}, "fast", 2)
    # fast's second pass waits for the first pass of every later device on cpu 0 (mid, phone, here, loop)
    firsts = {**nothing, "fast": 1, "mid": 1, "phone": 1, "here": 1}
    assert not may(plan, firsts, "fast", 2) and may(plan, {**firsts, "loop": 1}, "fast", 2)
    assert not may(plan, {**firsts, "loop": 1}, "mid", 2)  # mid's pass 2 follows fast's
    # a device with no more work (inf, or absent) is not waited for
    assert may(plan, {**firsts, "loop": math.inf}, "fast", 2)
    assert may(plan, {n: 1.0 for n in names if n != "loop"}, "fast", 2)
    # played out on four devices that share every cpu: pass 1 of each, then pass 2 of each, ...
    shared = campaign.plan_isolation(fleet.devices[:4], {})
    done = dict.fromkeys(["fast", "mid", "slow", "phone"], 0.0)
    order = []
    while min(done.values()) < 3:
        ready = [n for n in done if done[n] < 3 and may(shared, done, n, int(done[n]) + 1)]
        assert len(ready) == 1, (done, ready)  # never two at once
        done[ready[0]] += 1
        order.append(f"{ready[0]}{int(done[ready[0]])}")
    assert order == ["fast1", "mid1", "slow1", "phone1", "fast2", "mid2", "slow2", "phone2",
                     "fast3", "mid3", "slow3", "phone3"]  # fmt: skip


def test_pins_count_only_as_fleet_up_applied_them(tmp_path: Path) -> None:
    from devices import emulate

    fleet = _fleet(PLANNED, tmp_path)
    assert set(campaign.pinned_cpus(fleet).values()) == {None}  # nothing is up
    state = emulate.FleetState(
        (
            emulate.DeviceState("fast", "ssh", "127.0.0.1:2201", cpuset="cgroup-v1", cpus="0"),
            emulate.DeviceState("slow", "ssh", "127.0.0.1:2203", cpuset="affinity", cpus="1"),
            emulate.DeviceState("mid", "ssh", "127.0.0.1:2202"),  # asked for, not applied
        )
    )
    emulate.save_state(fleet.state_dir, state)
    pins = campaign.pinned_cpus(fleet)
    assert (pins["fast"], pins["slow"], pins["mid"], pins["phone"]) == (frozenset({0}), frozenset({1}), None, None)


def test_imprecise_cells_say_why_and_stay_ok() -> None:
    spec = plan_cells([Device("d", "local")], MODEL, [0.5], [BATCH], ["ort"], 6, 20, max_seconds=3.0)[0]
    doc = {
        "status": "ok", "step_seconds": [0.01] * 40, "precision_achieved": 0.034, "imprecise": True,
        "stop_reason": "time cap", "samples": 40, "timed_seconds": 3.02,
        "loadavg": {"before": [1.0, 1.0, 1.0], "after": [3.9, 2.0, 1.0]}, "cpus_available": 2,
    }  # fmt: skip
    m = campaign.measurement_from_doc(
        spec, "ok", "", doc, facts={}, started_at=0.0, finished_at=1.0, versions={}, git_commit=None,
        isolation={"alone": True},
    )  # fmt: skip
    assert m.ok and m.imprecise and m.stop_reason == "time cap" and m.precision_achieved == 0.034
    assert m.message == (
        "imprecise: 95 % interval of the median +-3.4 % after 40 samples in 3.0 s (target +-2 %, time cap); "
        "device busy: load average 3.9 on 2 cpus"
    )
    quiet = {**doc, "loadavg": {"before": [0.5], "after": [1.5]}}
    assert "busy" not in campaign.imprecision_reason(spec, quiet)
    precise = campaign.measurement_from_doc(
        spec, "ok", "", {**doc, "imprecise": False}, facts={}, started_at=0, finished_at=1, versions={},
        git_commit=None,
    )  # fmt: skip
    assert not precise.imprecise and precise.message == ""
    failed = campaign.measurement_from_doc(
        spec, "timeout", "took too long", doc, facts={}, started_at=0, finished_at=1, versions={}, git_commit=None
    )
    assert not failed.imprecise and failed.message == "took too long" and failed.step_seconds == ()


def test_an_imprecise_cells_reason_says_what_its_cpu_time_shows() -> None:
    spec = plan_cells([Device("d", "local")], MODEL, [0.5], [BATCH], ["ort"], 6, 20, max_seconds=3.0)[0]
    wall = [0.010] * 40
    doc = {
        "status": "ok", "step_seconds": wall, "cpu_step_seconds": [0.006] * 40, "precision_achieved": 0.034,
        "imprecise": True, "stop_reason": "time cap", "samples": 40, "timed_seconds": 3.02,
        "loadavg": {"before": [0.2], "after": [0.3]}, "cpus_available": 2,
    }  # fmt: skip
    head = "imprecise: 95 % interval of the median +-3.4 % after 40 samples in 3.0 s (target +-2 %, time cap)"
    # 6 ms of CPU in 10 ms: kept from the cpu 40 % of the time, whatever the load average says
    busy = "device busy: the runner ran 60 % of the time (at most 100 %)"
    assert campaign.imprecision_reason(spec, doc) == f"{head}; {busy}"
    # an emulated device held to 0.6 of a core could not run more: not busy
    assert campaign.imprecision_reason(spec, doc, share=0.6) == head
    assert "busy" in campaign.imprecision_reason(spec, doc, share=0.8)
    # the steps' own CPU time in two modes, 4 and 6 ms: the work cost more at times
    varied = {**doc, "cpu_step_seconds": [0.004, 0.006] * 20}
    reason = campaign.imprecision_reason(spec, varied, share=0.6)
    assert reason.startswith(f"{head}; its steps' own CPU time varied +-") and "the work cost more at times" in reason
    steady = {**doc, "cpu_step_seconds": [0.0099, 0.0100] * 20}
    assert campaign.imprecision_reason(spec, steady) == head
    # without CPU times (a runner that does not report them) the load average decides, as before
    loaded = {**doc, "cpu_step_seconds": [], "loadavg": {"before": [3.9], "after": [1.0]}}
    assert campaign.imprecision_reason(spec, loaded) == f"{head}; device busy: load average 3.9 on 2 cpus"


def test_disturbed_samples_leave_the_cell_and_its_reason_counts_them() -> None:
    spec = plan_cells([Device("d", "local")], MODEL, [0.5], [BATCH], ["ort"], 6, 20, max_seconds=3.0)[0]
    wall = [0.010, 0.011, 0.016] * 10
    doc = {
        "status": "ok", "step_seconds": wall, "cpu_step_seconds": [0.010, 0.0105, 0.016] * 10,
        "disturbed": [0, 0, 1] * 10, "precision_achieved": 0.03, "imprecise": True, "stop_reason": "time cap",
        "samples": 30, "timed_seconds": 3.0,
    }  # fmt: skip
    m = campaign.measurement_from_doc(
        spec, "ok", "", doc, facts={}, started_at=0.0, finished_at=1.0, versions={}, git_commit=None
    )
    assert m.step_seconds == (0.010, 0.011) * 10 and m.runner["step_seconds"] == wall
    assert m.message.endswith(
        "; 10 of 30 samples disturbed: their CPU time per step rose over 10 %, "
        "the cpu was slowed from outside the runner"
    )
    pooled = campaign.imprecision_reason(spec, {**doc, "passes": 4})
    assert pooled.endswith("; 10 of 30 samples disturbed: their CPU time per step rose over 10 %, over the cell's "
                           "4 passes: a pass the host slowed, or the first pass still cold")  # fmt: skip
    # flags that do not match the samples one to one are not trusted: every sample counts
    assert campaign.counted_steps({**doc, "disturbed": [1]}) == wall
    assert campaign.counted_steps({"step_seconds": wall}) == wall


def _pass(wall: list[float], *, flags: bool = True, **extra: object) -> dict[str, object]:
    """A pass's runner document: CPU time equal to wall time, judged (one flag per sample, none set) when ``flags``."""
    doc = {
        "status": "ok", "step_seconds": wall, "cpu_step_seconds": wall, "steps_per_sample": [1] * len(wall),
        "loss": [2.0] * len(wall), "samples": len(wall), "timed_seconds": 0.5, "stop_reason": "precision",
        "disturbed": [0] * len(wall) if flags else [],
    }  # fmt: skip
    return {**doc, **extra}


def test_passes_pool_their_samples_and_a_pass_the_host_slowed_as_a_whole_is_left_out() -> None:
    first = _pass([0.010] * 4, peak_memory_bytes=80_000_000, matmul_gflops=12.0, warmup_steps=7,
                  loadavg={"before": [0.1], "after": [0.2]})  # fmt: skip
    second = _pass([0.0104] * 4, peak_memory_bytes=95_000_000, warmup_steps=2,
                   loadavg={"before": [0.3], "after": [0.4]})  # fmt: skip
    slowed = _pass([0.015] * 4, throttled=True, stop_reason="time cap", loadavg={"before": [0.5], "after": [0.9]})
    merged = campaign.merge_passes([first, second, slowed], precision=0.02)
    # 12 samples pooled; the low quantile is 0.010 and 0.015 > 1.1 x 0.010: the third pass is disturbed,
    # which it could not see alone (its 4 samples agree)
    assert merged["step_seconds"] == [0.010] * 4 + [0.0104] * 4 + [0.015] * 4 and merged["samples"] == 12
    assert merged["disturbed"] == [0] * 8 + [1] * 4
    assert campaign.counted_steps(merged) == [0.010] * 4 + [0.0104] * 4
    # the median of the 8 that count is (0.010 + 0.0104) / 2; pooling without judging would give 0.0104
    low, high = merged["median_ci_seconds"]
    assert low == 0.010 and high == 0.0104 and merged["precision_achieved"] == pytest.approx(0.0002 / 0.0102)
    assert merged["imprecise"] is False and merged["stop_reason"] == "precision"
    # each pass's median is of its own samples: the slowed pass keeps its level there
    assert merged["passes"] == 3 and merged["pass_medians"] == [0.010, 0.0104, 0.015]
    assert merged["timed_seconds"] == pytest.approx(1.5) and merged["steps_per_sample"] == [1] * 12
    # the first pass ran in a process of its own: its memory, warm-up and matmul rate are the cell's
    assert (merged["peak_memory_bytes"], merged["matmul_gflops"], merged["warmup_steps"]) == (80_000_000, 12.0, 7)
    assert merged["throttled"] is True and merged["loadavg"] == {"before": [0.1], "after": [0.9]}


def test_a_pool_of_few_long_samples_is_judged_from_six_on() -> None:
    # a device held to a small CPU share: 2 samples per pass; a single run is judged from 10 samples
    steady, slowed = _pass([0.010, 0.0101]), _pass([0.014, 0.014])
    merged = campaign.merge_passes([steady, steady, slowed], precision=0.02)
    assert merged["disturbed"] == [0, 0, 0, 0, 1, 1] and campaign.counted_steps(merged) == [0.010, 0.0101] * 2
    too_few = campaign.merge_passes([steady, slowed], precision=0.02)
    assert too_few["disturbed"] == [0, 0, 0, 0] and len(campaign.counted_steps(too_few)) == 4


def test_passes_that_disagree_leave_the_cell_imprecise_and_say_so() -> None:
    # multi-thread runs are not judged (no flags): every sample counts
    low, high = _pass([0.010] * 6, flags=False), _pass([0.013] * 6, flags=False)
    merged = campaign.merge_passes([low, high], precision=0.02)
    assert merged["disturbed"] == [] and campaign.counted_steps(merged) == [0.010] * 6 + [0.013] * 6
    # the 95 % interval of 12 samples spans both passes: median 0.0115, +-0.0015
    assert merged["precision_achieved"] == pytest.approx(0.0015 / 0.0115) and merged["imprecise"] is True
    assert merged["stop_reason"] == "passes differ"
    capped = campaign.merge_passes([low, {**high, "stop_reason": "time cap"}], precision=0.02)
    assert capped["stop_reason"] == "time cap"
    counted = campaign.merge_passes([low, high], precision=0.0)
    assert counted["imprecise"] is False and counted["stop_reason"] == "steps"
    with pytest.raises(ValueError, match="at least one pass"):
        campaign.merge_passes([], precision=0.02)


def test_width_requests() -> None:
    assert campaign.parse_width_request("0.25,0.5") == (0.25, 0.5)
    assert campaign.parse_width_request("auto:4") == 4
    for bad in ("auto:0", "auto:x", "auto:99", "0.25,2"):
        with pytest.raises(InputError):
            campaign.parse_width_request(bad)


# --------------------------------------------------------------------------- emulated fleet


def _load(path: Path) -> Fleet:
    from devices.fleetfile import load_fleet

    return load_fleet(path)


@pytest.fixture(scope="module")
def fleet_file(example_fleet_file: Path) -> Path:
    return example_fleet_file


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("artifacts")


class _Counting:
    """Progress callback that counts cells and runs a hook (e.g. kill a device)."""

    def __init__(self, hook: Callable[[CellEvent], None] | None = None) -> None:
        self.events: list[CellEvent] = []
        self.hook = hook
        self.lock = threading.Lock()

    def __call__(self, event: CellEvent) -> None:
        with self.lock:
            self.events.append(event)
        if self.hook is not None:
            self.hook(event)


def _store(path: Path) -> ProfileStore:
    return ProfileStore(path)


def test_campaign_device_dies_then_resume_then_warm_cache(fleet_file: Path, artifacts: Path, tmp_path: Path) -> None:
    fleet = _load(fleet_file)
    alpha, beta = (d.name for d in fleet.devices[:2])
    n = len(fleet.devices) * len(WIDTHS)
    specs = plan_cells(fleet, MODEL, WIDTHS, [BATCH], ["ort"], STEPS, WARMUP, precision=0.0)
    store = _store(tmp_path / "fleetbench.db")

    def kill_beta_after_first(event: CellEvent) -> None:
        if event.device == beta and event.done == 1:
            kill_device(fleet, beta)

    progress = _Counting(kill_beta_after_first)
    result = campaign.run_campaign(fleet, specs, store, artifacts_dir=artifacts, timeout=TIMEOUT, progress=progress)
    assert len(result.measurements) == len(specs) == n and not result.interrupted
    by_key = {m.spec.cell_key(): m for m in result.measurements}
    for spec in specs:
        m = by_key[spec.cell_key()]
        if spec.device == beta and spec.width != WIDTHS[0]:
            assert m.status in ("unreachable", "connection lost"), m
            assert m.message
        else:
            assert m.ok, (m.status, m.message)
            assert len(m.step_seconds) == STEPS and m.peak_memory_bytes and m.facts
    assert [e.done for e in progress.events if e.device == alpha] == [1, 2, 3, 4]
    assert {e.total for e in progress.events} == {len(WIDTHS)}

    # every cell is a stored row with derived statistics
    cells = store.latest_cells()
    assert len(cells) == n
    ok = cells[cells["status"] == "ok"]
    dead = len(WIDTHS) - 1
    assert len(ok) == n - dead and (ok["median_us"] > 0).all() and (ok["p95_us"] >= ok["median_us"]).all()
    model = get_model("fjord-cnn")
    expected_flops = {w: count(model, model.arch(w)).train_flops for w in WIDTHS}
    assert all(row.train_flops == expected_flops[row.width] for row in ok.itertuples())
    # the artifacts' export format is recorded with every cell (an FL run names a profile of another one)
    assert {json.loads(v)["export_format"] for v in cells["versions"]} == {str(EXPORT_FORMAT_VERSION)}
    assert set(cells["export_format"]) == {str(EXPORT_FORMAT_VERSION)}
    failed_keys = [s.cell_key() for s in specs if s.device == beta and s.width != WIDTHS[0]]
    assert store.measured_keys() == {s.cell_key() for s in specs} - set(failed_keys)

    # bring beta back: resume measures only the failed cells
    assert emulate.up(fleet, say=lambda line: None).ok
    resumed = campaign.run_campaign(
        fleet, specs, store, artifacts_dir=artifacts, timeout=TIMEOUT, resume=True, progress=_Counting()
    )
    assert resumed.runner_invocations == dead and len(resumed.skipped) == n - dead
    assert [m.spec.cell_key() for m in resumed.measurements] == failed_keys
    assert all(m.ok for m in resumed.measurements)
    assert store.measured_keys() == {s.cell_key() for s in specs}

    # a second full campaign over the same artifacts pushes nothing
    again = campaign.run_campaign(fleet, specs, store, artifacts_dir=artifacts, timeout=TIMEOUT, progress=_Counting())
    assert again.runner_invocations == n and all(m.ok for m in again.measurements)
    deploys = [d for per_device in again.deploys.values() for d in per_device]
    assert len(deploys) == n and sum(d.pushed_bytes for d in deploys) == 0


def test_cli_profile_prints_table(
    fleet_file: Path, artifacts: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from fleetbench.cli import main

    fleet = _load(fleet_file)
    assert emulate.up(fleet, say=lambda line: None).ok  # whatever the previous test left
    db = tmp_path / "cli.db"
    argv = ["profile", "--fleet", str(fleet_file), "--model", MODEL, "--widths", "0.25,0.5", "--batch", str(BATCH)]
    argv += ["--steps", str(STEPS), "--warmup", str(WARMUP), "--db", str(db), "--artifacts", str(artifacts)]
    argv += ["--timeout", str(TIMEOUT), "--precision", "0", "--no-round-cost"]
    assert main(argv) == 0
    captured = capsys.readouterr()
    names = {d.name for d in fleet.devices}
    lines = [line for line in captured.out.splitlines() if line.split() and line.split()[0] in names]
    assert len(lines) == 2 * len(fleet.devices) and all(line.rstrip().endswith("ok") for line in lines), captured.out
    assert "us/img" in captured.err  # progress lines

    assert main([*argv, "--resume"]) == 0  # nothing left to measure
    assert "already measured" in capsys.readouterr().out

    assert main(["profile", "--fleet", str(fleet_file), "--model", "nope", "--db", str(db)]) == 2
    assert main(["profile", "--fleet", str(fleet_file), "--backend", "tflite", "--db", str(db)]) == 2
    assert main(["profile", "--fleet", str(fleet_file), "--precision", "2", "--db", str(db)]) == 2
    assert main(["profile", "--fleet", str(fleet_file), "--max-seconds", "60", "--timeout", "30", "--db", str(db)]) == 2
    assert main(["profile", "--fleet", str(fleet_file), "--widths", "auto:0", "--db", str(db)]) == 2
    err = capsys.readouterr().err
    assert "--precision 2" in err and "must exceed --max-seconds" in err and "auto:N" in err


def test_stop_event_keeps_finished_cells_and_resume_completes(
    fleet_file: Path, artifacts: Path, tmp_path: Path
) -> None:
    fleet = _load(fleet_file)
    assert emulate.up(fleet, say=lambda line: None).ok
    specs = plan_cells(fleet, MODEL, WIDTHS, [BATCH], ["ort"], STEPS, WARMUP, precision=0.0)
    store = _store(tmp_path / "fleetbench.db")
    stop = threading.Event()
    result = campaign.run_campaign(
        fleet, specs, store, artifacts_dir=artifacts, timeout=TIMEOUT, progress=lambda e: stop.set(), stop=stop
    )
    assert result.interrupted and not result.complete
    stored = store.measured_keys()
    n = len(specs)
    assert 1 <= len(stored) < n and stored == {m.spec.cell_key() for m in result.measurements if m.ok}
    resumed = campaign.run_campaign(
        fleet, specs, store, artifacts_dir=artifacts, timeout=TIMEOUT, resume=True, progress=_Counting()
    )
    assert resumed.complete, [(m.status, m.message) for m in resumed.measurements]
    assert resumed.runner_invocations == n - len(stored)
    assert store.measured_keys() == {s.cell_key() for s in specs}


@pytest.mark.parametrize(
    ("script", "status"),
    [
        ("print('not json')", "runner error"),
        ("import time; time.sleep(60)", "timeout"),
        (
            "import json, sys; print(json.dumps({'status': 'out of memory', 'error': 'MemoryError'})); sys.exit(4)",
            "out of memory",
        ),
    ],
)
def test_runner_failures_become_statuses(
    fleet_file: Path, artifacts: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, script: str, status: str
) -> None:
    fleet = _load(fleet_file)
    assert emulate.up(fleet, say=lambda line: None).ok
    stub = tmp_path / "runner.pyz"
    stub.write_text(script + "\n")
    monkeypatch.setattr(runner_archive, "archive_path", lambda: stub)
    specs = plan_cells(fleet.devices[:1], MODEL, WIDTHS[:1], [BATCH], ["ort"], STEPS, WARMUP, precision=0.0)
    store = _store(tmp_path / "fleetbench.db")
    result = campaign.run_campaign(fleet, specs, store, artifacts_dir=artifacts, timeout=5.0, progress=_Counting())
    assert [m.status for m in result.measurements] == [status]
    assert result.measurements[0].message and not store.measured_keys()
    assert list(store.latest_cells()["status"]) == [status]


def test_torch_backend_cell(fleet_file: Path, artifacts: Path, tmp_path: Path) -> None:
    fleet = _load(fleet_file)
    assert emulate.up(fleet, say=lambda line: None).ok
    specs = plan_cells(fleet.devices[:1], MODEL, WIDTHS[:1], [BATCH], ["ort", "torch"], STEPS, WARMUP, precision=0.0)
    store = _store(tmp_path / "fleetbench.db")
    result = campaign.run_campaign(fleet, specs, store, artifacts_dir=artifacts, timeout=TIMEOUT, progress=_Counting())
    assert [(m.spec.backend, m.status) for m in result.measurements] == [("ort", "ok"), ("torch", "ok")], [
        m.message for m in result.measurements
    ]
    assert {m.runner.get("backend") for m in result.measurements} == {"ort", "torch"}
    assert (artifacts / Path(result.deploys[fleet.devices[0].name][-1].remote_dir).name.split("+")[0]).is_dir()


def test_ctrl_c_stops_cleanly_and_prints_resume(fleet_file: Path, artifacts: Path, tmp_path: Path) -> None:
    fleet = _load(fleet_file)
    assert emulate.up(fleet, say=lambda line: None).ok
    db = tmp_path / "int.db"
    argv = [sys.executable, "-m", "fleetbench", "profile", "--fleet", str(fleet_file), "--model", MODEL]
    argv += ["--widths", "0.25,0.5", "--batch", str(BATCH), "--steps", str(STEPS), "--warmup", str(WARMUP)]
    argv += ["--db", str(db), "--artifacts", str(artifacts), "--timeout", str(TIMEOUT), "--precision", "0"]
    env = {**os.environ, "PYTHONPATH": str(Path(campaign.__file__).resolve().parents[1])}
    # A shell starting the tests in the background (``cmd &`` without job control) leaves
    # SIGINT ignored, and a Python started with it ignored never raises KeyboardInterrupt.
    proc = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )  # fmt: skip
    assert proc.stderr is not None
    first = proc.stderr.readline()
    while first.startswith(("isolation plan", "  ", "fleetbench: backend of")):  # backends and the plan first
        first = proc.stderr.readline()
    # the first finished cell
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=TIMEOUT)
    assert "us/img" in first, first + err
    assert proc.returncode == 1, err
    assert "--resume" in err and "Traceback" not in err
    stored = _store(db).measured_keys()
    assert 1 <= len(stored) < 2 * len(fleet.devices)
    assert "not run" in out


def test_devices_sharing_cpus_never_overlap_and_cells_record_precision_and_isolation(
    fleet_file: Path, artifacts: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import time

    windows: dict[str, list[tuple[float, float]]] = {}  # every pass of every cell, per device

    def timed(method: Callable[..., Any]) -> Callable[..., Any]:
        def run(self: Any, *args: Any) -> Any:
            started = time.monotonic()
            try:
                return method(self, *args)
            finally:
                windows.setdefault(self.device.name, []).append((started, time.monotonic()))

        return run

    monkeypatch.setattr(campaign._DeviceRun, "_first_pass", timed(campaign._DeviceRun._first_pass))
    monkeypatch.setattr(campaign._DeviceRun, "_later_pass", timed(campaign._DeviceRun._later_pass))
    fleet = _load(fleet_file)
    assert emulate.up(fleet, say=lambda line: None).ok
    plan = campaign.plan_isolation(fleet.devices, campaign.pinned_cpus(fleet))
    specs = plan_cells(fleet, MODEL, WIDTHS[:2], [BATCH], ["ort"], 6, 20, precision=0.02, max_seconds=3.0)
    store = _store(tmp_path / "fleetbench.db")
    lines: list[str] = []
    result = campaign.run_campaign(
        fleet, specs, store, artifacts_dir=artifacts, timeout=TIMEOUT, progress=_Counting(), announce=lines.append
    )
    # each cell: its first pass a process of its own, the other passes requests to the resident runner
    passes = campaign.DEFAULT_PASSES
    described = plan.describe()
    assert result.complete and result.plan == plan and lines[: len(described)] == described
    # between the stored cells, each device says when a pass of its cells is done
    told = lines[len(described) :]
    assert sorted(told) == sorted(
        f"{device.name}: pass {number} of {passes} done for 2 cell(s); each is stored after its last pass"
        for device in fleet.devices for number in range(1, passes)
    )  # fmt: skip
    # devices that share cpus take turns pass by pass: a's pass k, b's pass k, a's pass k + 1
    at = {(line.split(":")[0], int(line.split()[2])): i for i, line in enumerate(told)}
    names = [d.name for d in fleet.devices]
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            if plan.conflict(a, b):
                for number in range(1, passes - 1):
                    assert at[a, number] < at[b, number] < at[a, number + 1], (a, b, told)
    assert result.runner_invocations == len(specs) and result.resident_requests == (passes - 1) * len(specs)
    for m in result.measurements:
        assert m.runner["passes"] == passes and len(m.runner["pass_medians"]) == passes
        assert m.runner["samples"] == len(m.runner["step_seconds"]) == len(m.runner["steps_per_sample"])
        assert m.runner["samples"] >= passes * -(-6 // passes) and m.matmul_gflops is not None
        assert m.stop_reason in ("precision", "time cap", "passes differ")
        assert m.imprecise == (m.precision_achieved is None or m.precision_achieved > 0.02)
        assert m.message.startswith("imprecise: ") if m.imprecise else m.message == ""
        assert set(m.isolation) == {"alone", "concurrent_with", "cpus", "reason"}
        assert not any(plan.conflict(m.spec.device, other) for other in m.isolation["concurrent_with"]), m.isolation
    # the schedule itself: no pass of a device ran while a pass of one sharing its cpus did
    assert sum(len(w) for w in windows.values()) == passes * len(specs)
    for a in windows:
        for b in windows:
            if plan.conflict(a, b):
                for a_start, a_end in windows[a]:
                    assert all(a_end <= b_start or b_end <= a_start for b_start, b_end in windows[b]), (a, b)
    cells = store.latest_cells()
    assert cells["precision"].eq(0.02).all() and cells["max_seconds"].eq(3.0).all()
    assert cells["precision_achieved"].notna().any() and cells["isolation_reason"].str.len().gt(0).all()
    stored_plan = store.campaigns()["plan"].iloc[-1]
    assert json.loads(stored_plan) == plan.to_dict()


def test_without_interleaving_each_device_takes_all_its_passes_in_one_turn(
    fleet_file: Path, artifacts: Path, tmp_path: Path
) -> None:
    fleet = _load(fleet_file)
    assert emulate.up(fleet, say=lambda line: None).ok
    two = fleet.devices[:2]
    assert campaign.plan_isolation(two, campaign.pinned_cpus(fleet)).conflict(two[0].name, two[1].name)
    specs = plan_cells(two, MODEL, WIDTHS[:1], [BATCH], ["ort"], 4, WARMUP, precision=0.02, max_seconds=0.6)
    lines: list[str] = []
    result = campaign.run_campaign(
        fleet, specs, _store(tmp_path / "fleetbench.db"), artifacts_dir=artifacts, timeout=TIMEOUT,
        progress=_Counting(), announce=lines.append, passes=3, interleave=False,
    )  # fmt: skip
    assert result.complete and all(m.runner["passes"] == 3 for m in result.measurements)
    a, b = (d.name for d in two)
    told = [line.split(" done")[0] for line in lines if " done for " in line]
    assert told == [f"{a}: pass 1 of 3", f"{a}: pass 2 of 3", f"{b}: pass 1 of 3", f"{b}: pass 2 of 3"]


@pytest.mark.parametrize("fault", ["killed", "timed out"])
def test_a_pass_whose_runner_dies_keeps_the_cells_earlier_passes_and_the_device_goes_on(
    fleet_file: Path, artifacts: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fault: str
) -> None:
    from harness.resident import ResidentRunner

    fleet = _load(fleet_file)
    assert emulate.up(fleet, say=lambda line: None).ok
    specs = plan_cells(fleet.devices[:1], MODEL, WIDTHS[:2], [BATCH], ["ort"], 4, WARMUP, max_seconds=1.0)
    fatal = f"{specs[0].cell_key()}#3"
    real_bench = ResidentRunner.bench

    def bench_after_a_kill(self: ResidentRunner, artifacts: str, **options: object) -> contract.RunnerOutput:
        if options["request_id"] == fatal and fault == "killed":  # the serving runner dies as this request reaches it
            assert self.pid is not None
            os.kill(self.pid, signal.SIGKILL)
        elif options["request_id"] == fatal:  # the pass outlasts its time-out: the runner is killed from here
            options["timeout"] = 0.05
        return real_bench(self, artifacts, **options)  # type: ignore[arg-type]

    monkeypatch.setattr(ResidentRunner, "bench", bench_after_a_kill)
    store = _store(tmp_path / "fleetbench.db")
    result = campaign.run_campaign(
        fleet, specs, store, artifacts_dir=artifacts, timeout=TIMEOUT, progress=_Counting(), passes=4
    )
    hit, other = sorted(result.measurements, key=lambda m: m.spec.width)
    # the cell keeps the two passes it has, and says what became of the others
    assert hit.ok and hit.runner["passes"] == 2 and "pass 3 of 4 failed: " in hit.message, hit.message
    assert ("timeout" in hit.message) == (fault == "timed out"), hit.message
    assert other.ok and other.runner["passes"] == 4 and "failed" not in other.message, other.message
    assert result.resident_requests == 2 + 3 and result.runner_invocations == 2
    stored = store.latest_cells().set_index("width")
    assert "pass 3 of 4 failed" in stored.loc[0.25, "message"] and stored.loc[0.5, "status"] == "ok"


def test_widths_chosen_by_the_model(fleet_file: Path, artifacts: Path, tmp_path: Path) -> None:
    fleet = _load(fleet_file)
    assert emulate.up(fleet, say=lambda line: None).ok
    one = fleet.devices[:1]
    store = _store(tmp_path / "fleetbench.db")
    said: list[str] = []
    choice = campaign.choose_widths(
        fleet, store, 3,
        cells=lambda widths: plan_cells(one, MODEL, widths, [BATCH], ["ort"], 6, 5, precision=0.0),
        say=said.append, artifacts_dir=artifacts, timeout=TIMEOUT, progress=_Counting(), announce=lambda line: None,
    )  # fmt: skip
    assert choice.complete and len(choice.widths) == 3 and len(choice.results) == 2
    assert choice.widths[:2] == [1.0, campaign.AUTO_CANDIDATES[0]]
    # the third is the candidate the fit on the first two was least sure of
    from harness.latency import choose_next_width, fit_device

    first_two = store.latest_cells()
    first_two = first_two[first_two["width"].isin(choice.widths[:2])]
    lat = fit_device(first_two).latency_model(MODEL)
    assert choice.widths[2] == choose_next_width([lat], campaign.AUTO_CANDIDATES, choice.widths[:2])[0]  # type: ignore[index]
    assert sorted(store.latest_cells()["width"]) == sorted(choice.widths)
    assert {r.campaign_id for r in choice.results} == {choice.results[0].campaign_id}  # one stored campaign
    assert any("most uncertain" in line for line in said)


def _local_fleet_file(tmp_path: Path) -> Path:
    """A fleet file of one local device, ``here``, working in ``tmp_path/work``."""
    fleet_file = tmp_path / "fleet.yaml"
    fleet_file.write_text(f"devices:\n  - name: here\n    kind: local\n    workdir: {tmp_path / 'work'}\n")
    return fleet_file


def test_cli_profile_auto_widths_on_a_local_device(
    artifacts: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from fleetbench.cli import main

    fleet_file = _local_fleet_file(tmp_path)
    db = tmp_path / "auto.db"
    argv = ["profile", "--fleet", str(fleet_file), "--model", MODEL, "--widths", "auto:3", "--batch", str(BATCH)]
    argv += ["--steps", "3", "--warmup", "1", "--precision", "0", "--db", str(db), "--artifacts", str(artifacts)]
    assert main(argv) == 0
    captured = capsys.readouterr()
    with ProfileStore(db) as store:
        widths = sorted(store.latest_cells()["width"])
    assert len(widths) == 3 and widths[0] == campaign.AUTO_CANDIDATES[0] and widths[-1] == 1.0
    assert f"widths chosen: {', '.join(f'{w:g}' for w in widths)}" in captured.err
    assert "most uncertain" in captured.err and "isolation plan" in captured.err
    assert len([line for line in captured.out.splitlines() if line.startswith("here")]) == 3


def test_profile_measures_each_device_with_its_best_backend_and_skips_one_without(
    plain_python: str,  # noqa: F811 - the imported fixture
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from fleetbench.cli import main

    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(
        "devices:\n"
        f"  - {{name: full, kind: local, python: {sys.executable}, workdir: {tmp_path / 'full'}}}\n"
        f"  - {{name: plain, kind: local, python: {plain_python}, workdir: {tmp_path / 'plain'}}}\n"
        f"  - {{name: nopy, kind: local, python: /nonexistent/python3, workdir: {tmp_path / 'nopy'}}}\n"
    )
    db = tmp_path / "p.db"
    argv = ["profile", "--fleet", str(fleet), "--model", MODEL, "--widths", "0.25", "--batch", str(BATCH)]
    argv += ["--steps", "2", "--warmup", "1", "--db", str(db), "--artifacts", str(tmp_path / "artifacts")]
    assert main(argv) == 0
    captured = capsys.readouterr()
    assert "backend of full: ort (best available)" in captured.err
    assert "backend of plain: onnx (best available (ort: onnxruntime-training is not installed" in captured.err
    assert "backend of nopy: skipped: no usable backend" in captured.err
    with ProfileStore(db) as store:
        cells = store.latest_cells()
    assert sorted(zip(cells.device, cells.backend, cells.status, strict=True)) == [
        ("full", "ort", "ok"),
        ("plain", "onnx", "ok"),
    ]
    # an explicit backend is measured on every device, unasked
    assert main([*argv, "--backend", "onnx"]) == 1  # nopy cannot run it: recorded as failed
    with ProfileStore(db) as store:
        cells = store.latest_cells()
    onnx = cells[cells.backend == "onnx"].set_index("device").status.to_dict()
    assert onnx["full"] == "ok" and onnx["plain"] == "ok" and onnx["nopy"] != "ok"
    assert main([*argv, "--backend", "auto,ort"]) == 2


def test_round_cost_step_measures_each_device_through_its_transport(
    fleet_file: Path, artifacts: Path, tmp_path: Path
) -> None:
    import dataclasses

    fleet = _load(fleet_file)
    assert emulate.up(fleet, say=lambda line: None).ok
    # an SSH device and the phone behind adb: both transports push and pull the transfer files
    fleet = dataclasses.replace(fleet, devices=tuple(d for d in fleet.devices if d.name in ("fast", "phone")))
    specs = plan_cells(fleet, MODEL, (0.25, 1.0), [BATCH], ["ort"], STEPS, WARMUP, "sgd", precision=0.0)
    store = _store(tmp_path / "fleetbench.db")
    lines: list[str] = []
    result = campaign.run_campaign(
        fleet, specs, store, artifacts_dir=artifacts, timeout=TIMEOUT, progress=_Counting(), announce=lines.append,
        round_cost=True,
    )  # fmt: skip
    assert result.complete, result.round_cost_failures
    costs = {c.device: c for c in store.round_costs()}
    assert set(costs) == {"fast", "phone"}
    sets = campaign.export_sets(specs, artifacts)  # found in the cache
    payloads = {(d / "initial_parameters.npy").stat().st_size for d in sets.values()}
    assert len(payloads) == 2
    for device in fleet.devices:
        cost = costs[device.name]
        # measured in the configuration of the cells, at their widest width, with provenance
        assert (cost.model, cost.width, cost.batch, cost.backend, cost.optimizer, cost.threads) == (
            MODEL,
            1.0,
            BATCH,
            "ort",
            "sgd",
            device.threads,
        )
        assert cost.campaign_id == result.campaign_id and cost.measured_at > 0
        train = cost.samples["train"]
        assert sorted(p["steps"] for p in train) == [2, 2, 2, 26, 26, 26]
        # on the resident runner, started once through the device's transport: a warm-up per shard
        # opened the session, the fitted requests reused it
        assert len(cost.samples["start"]) == 1
        assert [p["sessions_opened"] for p in cost.samples["warmup"]] == [1, 0]
        assert all(p["sessions_opened"] == 0 for p in train)
        # the intercept is the request's time outside its steps (request, parameter load, reset, result),
        # far below the runner's start (Python, numpy and onnxruntime on a CPU share: seconds)
        outside = [p["seconds"] - p["step_seconds"] for p in train]
        assert 0.5 * min(outside) <= cost.fixed_s <= 1.5 * max(outside) + 0.02, (cost.fixed_s, outside)
        assert cost.fixed_s < 0.25 * cost.samples["start"][0]["seconds"], (cost.fixed_s, cost.samples["start"])
        # the transfers move the model's own payloads: the parameter files of widths 0.25 and 1
        assert {p["bytes"] for p in cost.samples["down"]} == payloads
        assert {p["bytes"] for p in cost.samples["up"]} == payloads
        assert all(p["seconds"] > 0 for p in cost.samples["up"])
    assert sum("round cost: fixed" in line for line in lines) == 2

    # resume measures no round cost that is stored already; without the step, none is measured
    again = campaign.run_campaign(
        fleet, specs, store, artifacts_dir=artifacts, timeout=TIMEOUT, resume=True, progress=_Counting(),
        round_cost=True,
    )  # fmt: skip
    assert again.round_costs == {} and again.runner_invocations == 0
    assert len(store.round_costs(latest=False)) == 2


def test_a_failed_round_cost_is_stored_with_its_reason(artifacts: Path, tmp_path: Path) -> None:
    # a local device whose python cannot run the runner: cells and round cost fail, both recorded
    device = Device("broken", "local", workdir=str(tmp_path / "w"), python=str(tmp_path / "no-python"))
    fleet = Fleet(tmp_path / "fleet.yaml", (device,))
    specs = plan_cells(fleet, MODEL, (0.25,), [BATCH], ["ort"], STEPS, WARMUP, precision=0.0)
    store = _store(tmp_path / "fleetbench.db")
    result = campaign.run_campaign(
        fleet, specs, store, artifacts_dir=artifacts, timeout=TIMEOUT, progress=_Counting(), announce=lambda _: None,
        round_cost=True,
    )  # fmt: skip
    assert not result.complete and result.round_cost_failures["broken"]
    [row] = store.round_cost_rows()
    assert row["device"] == "broken" and row["status"] != "ok" and row["message"] and row["fixed_s"] is None
    assert store.round_costs() == []


def test_cells_and_round_costs_train_on_the_bench_data_they_name(
    artifacts: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import sqlite3

    import numpy as np

    from fleetbench.cli import main

    fleet_file = _local_fleet_file(tmp_path)
    data = tmp_path / "mnist.npz"
    assert main(["fl", "data", "--out", str(data), "--model", MODEL, "--examples", "40"]) == 0
    with np.load(data) as shard:
        assert shard["x"].shape == (40, 1, 28, 28) and len(set(shard["y"][:BATCH].tolist())) > 1  # classes mixed
    db = tmp_path / "data.db"
    argv = ["profile", "--fleet", str(fleet_file), "--model", MODEL, "--widths", "0.25", "--batch", str(BATCH)]
    argv += ["--steps", "3", "--warmup", "1", "--precision", "0", "--db", str(db), "--artifacts", str(artifacts)]
    assert main([*argv, "--data", str(data)]) == 0
    label = campaign.bench_data_label(data)
    assert label.startswith("mnist.npz@")
    with ProfileStore(db) as store:
        cells = store.latest_cells()
        assert list(cells["data"]) == [label] and cells["cell_key"].iloc[0].endswith(f"|d{label}")
        assert len(store.round_costs()) == 1  # measured on the data too
    with sqlite3.connect(db) as conn:
        (doc,) = conn.execute("SELECT runner FROM cells").fetchone()
    assert json.loads(doc)["bench_data"] == "shard"

    # the same cells on random inputs are other cells: --resume measures them
    assert main([*argv, "--resume", "--no-round-cost"]) == 0
    with ProfileStore(db) as store:
        cells = store.latest_cells()
        assert sorted(cells["data"].fillna("random")) == sorted([label, "random"])
        campaigns = len(store.campaigns())
    capsys.readouterr()

    # bad data is refused before a campaign is stored, naming the file and what does not fit
    wrong = tmp_path / "wrong.npz"
    np.savez(wrong, x=np.zeros((8, 3, 32, 32), np.float32), y=np.zeros(8, np.int64))
    few = tmp_path / "few.npz"
    np.savez(few, x=np.zeros((2, 1, 28, 28), np.float32), y=np.zeros(2, np.int64))
    assert main([*argv, "--data", str(wrong)]) == 2
    assert main([*argv, "--data", str(few)]) == 2
    assert main([*argv, "--data", str(tmp_path / "absent.npz")]) == 2
    err = capsys.readouterr().err
    assert f"--data {wrong}: examples of shape (3, 32, 32), {MODEL} takes (1, 28, 28)" in err
    assert f"--data {few}: 2 examples, fewer than one batch of {BATCH}" in err
    assert "absent.npz" in err
    with ProfileStore(db) as store:
        assert len(store.campaigns()) == campaigns


def test_cells_planned_with_bench_data_need_that_file(tmp_path: Path) -> None:
    import numpy as np

    fleet = [Device("here", "local", workdir="/tmp/x")]
    specs = plan_cells(fleet, MODEL, [0.5], [BATCH], ["ort"], STEPS, WARMUP, data="a.npz@0123456789ab")
    assert all(s.data == "a.npz@0123456789ab" and s.cell_key().endswith("|da.npz@0123456789ab") for s in specs)
    with pytest.raises(InputError, match="give its file"):
        campaign._bench_data_for(specs, None)
    other = tmp_path / "a.npz"
    np.savez(other, x=np.zeros((4, 1, 28, 28), np.float32), y=np.zeros(4, np.int64))
    with pytest.raises(InputError, match=r"is a\.npz@\w{12}; the cells were planned with a\.npz@0123456789ab"):
        campaign._bench_data_for(specs, other)
    (tmp_path / "junk.npz").write_bytes(b"not a zip")
    with pytest.raises(InputError, match="junk.npz: not a readable .npz"):
        campaign.bench_data_label(tmp_path / "junk.npz")
    np.savez(tmp_path / "no-y.npz", x=np.zeros((4, 1, 28, 28), np.float32))
    for read in (campaign.bench_data_label, lambda path: campaign.check_bench_data(path, [])):
        with pytest.raises(InputError, match=r"no-y\.npz: needs arrays x and y, has \['x'\]$"):
            read(tmp_path / "no-y.npz")
    assert campaign._bench_data_for(plan_cells(fleet, MODEL, [0.5], [BATCH], ["ort"], STEPS, WARMUP), None) is None
