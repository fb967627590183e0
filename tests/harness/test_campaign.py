"""Profiling campaigns end to end on an emulated fleet (real sshd, real runner, real store)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from devices import emulate
from devices.fleet import Device, Emulation, Fleet
from exporters.errors import InputError
from exporters.flops import count
from exporters.zoo import get_model
from harness import campaign, contract
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


def test_only_devices_held_to_a_cpu_share_time_blocks_of_steps() -> None:
    block = campaign.EMULATED_SAMPLE_S
    assert campaign.sample_seconds_for(Device("a", "ssh", emulate=Emulation(cpu_share=0.3))) == block
    assert campaign.sample_seconds_for(Device("b", "ssh", emulate=Emulation(preset="pi3"))) == block
    assert campaign.sample_seconds_for(Device("c", "ssh", emulate=Emulation(memory_mb=512))) == 0.0
    assert campaign.sample_seconds_for(Device("d", "local")) == 0.0


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
    specs = plan_cells(fleet, MODEL, WIDTHS, [BATCH], ["ort"], STEPS, WARMUP)
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
    argv += ["--timeout", str(TIMEOUT)]
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


def test_stop_event_keeps_finished_cells_and_resume_completes(
    fleet_file: Path, artifacts: Path, tmp_path: Path
) -> None:
    fleet = _load(fleet_file)
    assert emulate.up(fleet, say=lambda line: None).ok
    specs = plan_cells(fleet, MODEL, WIDTHS, [BATCH], ["ort"], STEPS, WARMUP)
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
    stub = tmp_path / "runner.py"
    stub.write_text(script + "\n")
    monkeypatch.setattr(contract, "RUNNER_PATH", stub)
    specs = plan_cells(fleet.devices[:1], MODEL, WIDTHS[:1], [BATCH], ["ort"], STEPS, WARMUP)
    store = _store(tmp_path / "fleetbench.db")
    result = campaign.run_campaign(fleet, specs, store, artifacts_dir=artifacts, timeout=5.0, progress=_Counting())
    assert [m.status for m in result.measurements] == [status]
    assert result.measurements[0].message and not store.measured_keys()
    assert list(store.latest_cells()["status"]) == [status]


def test_torch_backend_cell(fleet_file: Path, artifacts: Path, tmp_path: Path) -> None:
    fleet = _load(fleet_file)
    assert emulate.up(fleet, say=lambda line: None).ok
    specs = plan_cells(fleet.devices[:1], MODEL, WIDTHS[:1], [BATCH], ["ort", "torch"], STEPS, WARMUP)
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
    argv += ["--db", str(db), "--artifacts", str(artifacts), "--timeout", str(TIMEOUT)]
    env = {**os.environ, "PYTHONPATH": str(Path(campaign.__file__).resolve().parents[1])}
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    assert proc.stderr is not None
    first = proc.stderr.readline()
    while first.startswith("fleetbench: backend of"):  # each device's backend, chosen first
        first = proc.stderr.readline()  # then the first finished cell
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=TIMEOUT)
    assert "us/img" in first, first + err
    assert proc.returncode == 1, err
    assert "--resume" in err and "Traceback" not in err
    stored = _store(db).measured_keys()
    assert 1 <= len(stored) < 2 * len(fleet.devices)
    assert "not run" in out


def test_profile_measures_each_device_with_its_best_backend_and_skips_one_without(
    plain_python: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]  # noqa: F811 - the imported fixture
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
