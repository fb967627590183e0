"""One device's part of a campaign on an emulated fleet (`harness.device_run`): passes, turns, failures, round costs."""

from __future__ import annotations

import json
import os
import signal
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from devices.emulation import emulate
from devices.fleet import Device, Emulation, Fleet
from harness import contract, runner_archive
from harness.campaign import run_campaign
from harness.cells import export_sets, plan_cells
from harness.device_run import DeviceRun, sample_seconds_for
from harness.isolation import pinned_cpus, plan_isolation
from harness.passes import DEFAULT_PASSES
from harness.roundcost import step_counts_for
from harness.runner.metering import IDLE_WINDOW_S
from harness.store import ProfileStore
from tests.harness.campaigns import BATCH, MODEL, STEPS, TIMEOUT, WARMUP, WIDTHS, Counting, load, local_fleet_file


def test_only_devices_a_cpu_quota_throttles_time_blocks_of_steps() -> None:
    from devices.emulation.limits import PERIOD_US

    def block(share: float, threads: int = 1) -> float:  # a throttled gap is at most 4 % of a block
        return PERIOD_US * 1e-6 * (1 - share / threads) / 0.04

    seconds = sample_seconds_for
    assert seconds(Device("a", "ssh", emulate=Emulation(cpu_share=0.3))) == pytest.approx(block(0.3))
    assert seconds(Device("b", "ssh", emulate=Emulation(preset="pi3"))) == pytest.approx(block(0.14))
    assert seconds(Device("t", "ssh", threads=2, emulate=Emulation(cpu_share=1.2))) == pytest.approx(block(1.2, 2))
    # a share of at least the runner's threads never throttles them: single steps
    assert seconds(Device("p", "adb", emulate=Emulation(preset="phone-midrange"))) == 0.0
    assert seconds(Device("c", "ssh", emulate=Emulation(memory_mb=512))) == 0.0
    assert seconds(Device("d", "local")) == 0.0


def test_a_device_with_a_power_sensor_measures_each_pass_s_energy() -> None:
    from devices.fleet import EmulatedPower
    from harness.device_run import DeviceWork
    from harness.records import BenchSpec

    spec = BenchSpec("d", MODEL, 0.5, (8, 16), BATCH, "ort", 1, WARMUP, STEPS)

    def options(device: Device, facts: dict[str, Any] | None) -> dict[str, Any]:
        run = DeviceRun(DeviceWork(device, (spec,)), None)  # type: ignore[arg-type] - no campaign is reached
        run.facts = facts
        return run._pass_options(spec, 4)

    power = Emulation(power=EmulatedPower("rapl", 2.0, 1.0))
    emulated = options(Device("e", "local", emulate=power, power_root="/st/e/power"), {"power": []})
    assert (emulated["power_root"], "power_sensor" in emulated) == ("/st/e/power", False)
    board = options(Device("b", "ssh", host="b"), {"power": [{"kind": "ina3221-hwmon", "rails": ["VDD_IN"]}]})
    assert (board["power_root"], board["power_sensor"]) == ("/", "ina3221-hwmon")
    assert "power_root" not in options(Device("p", "ssh", host="p"), {"power": []})


@pytest.mark.parametrize(
    ("script", "status"),
    [
        ("print('not json')", "runner error"),
        ("import time; time.sleep(60)", "timeout"),
        (
            "import json, sys; print(json.dumps({'status': 'out of memory', 'error': 'MemoryError'})); sys.exit(4)",
            "out of memory",
        ),
        # what the kernel's OOM killer does to a runner over the device's memory limit
        ("import os, signal; os.kill(os.getpid(), signal.SIGKILL)", "out of memory"),
    ],
)
def test_runner_failures_become_statuses(
    fleet_file: Path, artifacts: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, script: str, status: str
) -> None:
    fleet = load(fleet_file)
    assert emulate.up(fleet, say=lambda line: None).ok
    stub = tmp_path / "runner.pyz"
    stub.write_text(script + "\n")
    monkeypatch.setattr(runner_archive, "archive_path", lambda: stub)
    specs = plan_cells(fleet.devices[:1], MODEL, WIDTHS[:1], [BATCH], ["ort"], STEPS, WARMUP, precision=0.0)
    store = ProfileStore(tmp_path / "fleetbench.db")
    result = run_campaign(fleet, specs, store, artifacts_dir=artifacts, timeout=5.0, progress=Counting())
    assert [m.status for m in result.measurements] == [status]
    assert result.measurements[0].message and not store.measured_keys()
    assert list(store.latest_cells()["status"]) == [status]


def test_torch_backend_cell(fleet_file: Path, artifacts: Path, tmp_path: Path) -> None:
    fleet = load(fleet_file)
    assert emulate.up(fleet, say=lambda line: None).ok
    specs = plan_cells(fleet.devices[:1], MODEL, WIDTHS[:1], [BATCH], ["ort", "torch"], STEPS, WARMUP, precision=0.0)
    store = ProfileStore(tmp_path / "fleetbench.db")
    result = run_campaign(fleet, specs, store, artifacts_dir=artifacts, timeout=TIMEOUT, progress=Counting())
    assert [(m.spec.backend, m.status) for m in result.measurements] == [("ort", "ok"), ("torch", "ok")], [
        m.message for m in result.measurements
    ]
    assert {m.runner.backend for m in result.measurements} == {"ort", "torch"}
    assert (artifacts / Path(result.deploys[fleet.devices[0].name][-1].remote_dir).name.split("+")[0]).is_dir()


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

    monkeypatch.setattr(DeviceRun, "_first_pass", timed(DeviceRun._first_pass))
    monkeypatch.setattr(DeviceRun, "_later_pass", timed(DeviceRun._later_pass))
    fleet = load(fleet_file)
    assert emulate.up(fleet, say=lambda line: None).ok
    plan = plan_isolation(fleet.devices, pinned_cpus(fleet))
    specs = plan_cells(fleet, MODEL, WIDTHS[:2], [BATCH], ["ort"], 6, 20, precision=0.02, max_seconds=3.0)
    store = ProfileStore(tmp_path / "fleetbench.db")
    lines: list[str] = []
    result = run_campaign(
        fleet, specs, store, artifacts_dir=artifacts, timeout=TIMEOUT, progress=Counting(), announce=lines.append
    )
    # each cell: its first pass a process of its own, the other passes requests to the resident runner
    passes = DEFAULT_PASSES
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
        assert m.runner.passes == passes and len(m.runner.pass_medians) == passes
        assert m.runner.samples == len(m.runner.step_seconds) == len(m.runner.steps_per_sample)
        assert m.runner.samples >= passes * -(-6 // passes) and m.matmul_gflops is not None
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
    fleet = load(fleet_file)
    assert emulate.up(fleet, say=lambda line: None).ok
    two = fleet.devices[:2]
    assert plan_isolation(two, pinned_cpus(fleet)).conflict(two[0].name, two[1].name)
    specs = plan_cells(two, MODEL, WIDTHS[:1], [BATCH], ["ort"], 4, WARMUP, precision=0.02, max_seconds=0.6)
    lines: list[str] = []
    result = run_campaign(
        fleet, specs, ProfileStore(tmp_path / "fleetbench.db"), artifacts_dir=artifacts, timeout=TIMEOUT,
        progress=Counting(), announce=lines.append, passes=3, interleave=False,
    )  # fmt: skip
    assert result.complete and all(m.runner.passes == 3 for m in result.measurements)
    a, b = (d.name for d in two)
    told = [line.split(" done")[0] for line in lines if " done for " in line]
    assert told == [f"{a}: pass 1 of 3", f"{a}: pass 2 of 3", f"{b}: pass 1 of 3", f"{b}: pass 2 of 3"]


def test_a_pass_whose_runner_dies_keeps_the_cells_earlier_passes_and_the_device_goes_on(
    fleet_file: Path, artifacts: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from harness.resident import ResidentRunner

    fleet = load(fleet_file)
    assert emulate.up(fleet, say=lambda line: None).ok
    # one device, three cells: the serving runner is killed in the first cell's pass 3, the second
    # cell's pass 3 outlasts its time-out, the third cell takes all its passes
    specs = plan_cells(fleet.devices[:1], MODEL, WIDTHS[:3], [BATCH], ["ort"], 4, WARMUP, max_seconds=1.0)
    killed, timed_out = f"{specs[0].cell_key()}#3", f"{specs[1].cell_key()}#3"
    real_bench = ResidentRunner.bench

    def bench_with_faults(self: ResidentRunner, artifacts: str, **options: object) -> contract.RunnerOutput:
        if options["request_id"] == killed:  # the serving runner dies as this request reaches it
            assert self.pid is not None
            os.kill(self.pid, signal.SIGKILL)
        elif options["request_id"] == timed_out:  # the pass outlasts its time-out: the runner is killed from here
            options["timeout"] = 0.05
        return real_bench(self, artifacts, **options)  # type: ignore[arg-type]

    monkeypatch.setattr(ResidentRunner, "bench", bench_with_faults)
    store = ProfileStore(tmp_path / "fleetbench.db")
    result = run_campaign(fleet, specs, store, artifacts_dir=artifacts, timeout=TIMEOUT, progress=Counting(), passes=4)
    hit_killed, hit_timed_out, other = sorted(result.measurements, key=lambda m: m.spec.width)
    # each hit cell keeps the two passes it has, and says what became of the others
    for hit in (hit_killed, hit_timed_out):
        assert hit.ok and hit.runner.passes == 2 and "pass 3 of 4 failed: " in hit.message, hit.message
    assert "timeout" not in hit_killed.message and "timeout" in hit_timed_out.message, hit_timed_out.message
    assert other.ok and other.runner.passes == 4 and "failed" not in other.message, other.message
    assert result.resident_requests == 2 + 2 + 3 and result.runner_invocations == 3
    stored = store.latest_cells().set_index("width")
    assert "pass 3 of 4 failed" in stored.loc[0.25, "message"] and "pass 3 of 4 failed" in stored.loc[0.5, "message"]
    assert stored.loc[0.75, "status"] == "ok"


def test_round_cost_step_measures_each_device_through_its_transport(
    fleet_file: Path, artifacts: Path, tmp_path: Path
) -> None:
    import dataclasses

    fleet = load(fleet_file)
    assert emulate.up(fleet, say=lambda line: None).ok
    # an SSH device and the phone behind adb: both transports push and pull the transfer files
    fleet = dataclasses.replace(fleet, devices=tuple(d for d in fleet.devices if d.name in ("fast", "phone")))
    specs = plan_cells(fleet, MODEL, (0.25, 1.0), [BATCH], ["ort"], STEPS, WARMUP, "sgd", precision=0.0)
    store = ProfileStore(tmp_path / "fleetbench.db")
    lines: list[str] = []
    # one pass per cell: the round cost starts a resident runner of its own, whatever the cells' passes
    result = run_campaign(
        fleet, specs, store, artifacts_dir=artifacts, timeout=TIMEOUT, progress=Counting(), announce=lines.append,
        round_cost=True, passes=1,
    )  # fmt: skip
    assert result.complete, result.round_cost_failures
    costs = {c.device: c for c in store.round_costs()}
    assert set(costs) == {"fast", "phone"}
    sets = export_sets(specs, artifacts)  # found in the cache
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
        # the longer request is held to LONG_REQUEST_S of the widest cell's measured steps
        (widest,) = [m for m in result.measurements if m.spec.device == device.name and m.spec.width == 1.0]
        short, long = step_counts_for(statistics.median(widest.step_seconds))
        assert sorted(p["steps"] for p in train) == [short] * 3 + [long] * 3
        # on the resident runner, started once through the device's transport: a warm-up per shard
        # opened the session, the fitted requests reused it
        assert len(cost.samples["start"]) == 1
        assert [p["sessions_opened"] for p in cost.samples["warmup"]] == [1, 0]
        assert all(p["sessions_opened"] == 0 for p in train)
        # the intercept is the request's time outside its steps (request, parameter load, reset, result),
        # without a sensor far below the runner's start (Python, numpy and onnxruntime on a CPU share: seconds)
        outside = [p["seconds"] - p["step_seconds"] for p in train]
        assert 0.5 * min(outside) <= cost.fixed_s <= 1.5 * max(outside) + 0.02, (cost.fixed_s, outside)
        if device.emulate is not None and device.emulate.power is not None:
            # the rounds it predicts read the sensor over an idle window before their steps: so did its requests
            assert cost.fixed_s >= IDLE_WINDOW_S, (cost.fixed_s, outside)
        else:
            assert cost.fixed_s < 0.25 * cost.samples["start"][0]["seconds"], (cost.fixed_s, cost.samples["start"])
        # the transfers move the model's own payloads: the parameter files of widths 0.25 and 1
        assert {p["bytes"] for p in cost.samples["down"]} == payloads
        assert {p["bytes"] for p in cost.samples["up"]} == payloads
        assert all(p["seconds"] > 0 for p in cost.samples["up"])
    assert sum("round cost: fixed" in line for line in lines) == 2

    # resume measures no round cost that is stored already; without the step, none is measured
    again = run_campaign(
        fleet, specs, store, artifacts_dir=artifacts, timeout=TIMEOUT, resume=True, progress=Counting(),
        round_cost=True, passes=1,
    )  # fmt: skip
    assert again.round_costs == {} and again.runner_invocations == 0
    assert len(store.round_costs(latest=False)) == 2


def test_a_round_cost_after_later_passes_measures_on_the_runner_that_served_them(
    artifacts: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from harness.resident import ResidentRunner

    fleet = load(local_fleet_file(tmp_path))
    specs = plan_cells(fleet, MODEL, (0.25, 0.5), [BATCH], ["ort"], STEPS, WARMUP, "sgd", precision=0.02,
                       max_seconds=1.0)  # fmt: skip
    started: list[int] = []
    start = ResidentRunner.start
    monkeypatch.setattr(ResidentRunner, "start", lambda self: started.append(1) or start(self))
    store = ProfileStore(tmp_path / "fleetbench.db")
    result = run_campaign(
        fleet, specs, store, artifacts_dir=artifacts, timeout=TIMEOUT, progress=Counting(), round_cost=True, passes=2,
    )  # fmt: skip
    assert result.complete and result.resident_requests == 2, result.round_cost_failures
    (cost,) = store.round_costs()
    assert started == [1]  # one serving runner for pass 2 of both cells and the round cost's requests
    assert len(cost.samples["start"]) == 1 and len(cost.samples["train"]) == 6
    assert cost.fixed_s < 0.25 * cost.samples["start"][0]["seconds"], (cost.fixed_s, cost.samples["start"])


def test_a_failed_round_cost_is_stored_with_its_reason(artifacts: Path, tmp_path: Path) -> None:
    # a local device whose python cannot run the runner: cells and round cost fail, both recorded
    device = Device("broken", "local", workdir=str(tmp_path / "w"), python=str(tmp_path / "no-python"))
    fleet = Fleet(tmp_path / "fleet.yaml", (device,))
    specs = plan_cells(fleet, MODEL, (0.25,), [BATCH], ["ort"], STEPS, WARMUP, precision=0.0)
    store = ProfileStore(tmp_path / "fleetbench.db")
    result = run_campaign(
        fleet, specs, store, artifacts_dir=artifacts, timeout=TIMEOUT, progress=Counting(), announce=lambda _: None,
        round_cost=True,
    )  # fmt: skip
    assert not result.complete and result.round_cost_failures["broken"]
    [row] = store.round_cost_rows()
    assert row["device"] == "broken" and row["status"] != "ok" and row["message"] and row["fixed_s"] is None
    assert store.round_costs() == []


def test_the_round_costs_step_time_is_the_cells_this_run_else_the_stored_one(tmp_path: Path) -> None:
    # a resumed campaign measures the round cost of a cell an earlier campaign stored
    import threading
    from types import SimpleNamespace

    from harness.device_run import CampaignResult
    from tests.harness.test_store import measurement, spec

    widest, other = spec(width=1.0), spec(width=0.5)
    store = ProfileStore(tmp_path / "fleetbench.db")
    campaign_id = store.start_campaign(fleet="f.yaml", model="cnn")
    store.record(campaign_id, measurement(widest, steps=(0.4, 0.2, 0.3)))
    result = CampaignResult(campaign_id=campaign_id)
    campaign = SimpleNamespace(lock=threading.Lock(), result=result, store=store)
    run = DeviceRun(None, campaign)  # type: ignore[arg-type]
    assert run._step_seconds(widest) == 0.3  # stored by the earlier campaign
    assert run._step_seconds(other) is None  # never measured
    result.measurements.append(measurement(widest, steps=(0.1, 0.1, 0.2)))
    assert run._step_seconds(widest) == 0.1  # this campaign's own measurement
