"""`fleetbench demo` end to end: the emulated fleet, and the local fallback."""

from __future__ import annotations

import json
import re
import sqlite3
from pathlib import Path

import pytest

from devices.emulation import emulate
from devices.emulation.sshd import free_port
from devices.fleetfile import load_fleet
from fleetbench.cli import main
from tests.devices.conftest import require_tool


def _check_tier_widths(out: Path, printed: str) -> None:
    """FjORD's capacities are the printed plan's: demo widths, full capacity where the deadline is met.

    The deadline is the median device's predicted round at full capacity (a FjORD client draws
    its widths, so that round is the mean over them), so the median device and every faster
    one meet it at full capacity and every slower one only at a narrower width (how much
    narrower follows its own curve: a device whose time is mostly fixed cost gains less from
    a narrower width, and may miss it at the smallest). Two tiers group the widths, and a
    device's capacity is its tier's.
    """
    from fleetbench.demo import DEMO_WIDTHS

    db = sqlite3.connect(out / "fleetbench.db")
    run_id = db.execute("SELECT MIN(id) FROM fl_runs WHERE strategy = 'fjord'").fetchone()[0]
    capacity = dict(db.execute("SELECT device, capacity FROM fl_clients WHERE run_id = ?", (run_id,)).fetchall())
    assert set(capacity.values()) <= set(DEMO_WIDTHS)
    # the FjORD plan's rows: "fast  planned  1  0  0.234  0.374  fits  -  -  meets the deadline"
    line = r"^\s+(\w+)\s+(?:planned|misses)\s+([\d.]+)\s+\d+\s+[\d.]+\s+([\d.]+)\s"
    planned = re.findall(line, printed, re.M)
    assert {d for d, _, _ in planned} == set(capacity), printed
    assert all(float(w) == capacity[d] for d, w, _ in planned), (planned, capacity)
    # the printed rounds are rounded to the ms and two devices can print the same one: the
    # deadline is checked on the stored plan's exact rounds, which the printed ones round
    stored = json.loads(
        db.execute("SELECT plan FROM fl_plans WHERE run_id = ? AND revision = 0", (run_id,)).fetchone()[0]
    )
    devices = {d["device"]: d for d in stored["devices"]}
    full = {d: p["full_round_s"] for d, p in devices.items()}
    assert all(abs(full[d] - float(f)) <= 0.0005 + 1e-9 for d, _, f in planned), (planned, full)
    deadline = stored["deadline_s"]

    def widest(plan: dict) -> float:  # the widest width the device meets: its capacity, or above its tier's
        merged = re.search(r"its tier's width \(it meets ([\d.]+)\)", " ".join(plan["notes"]))
        return float(merged.group(1)) if merged else plan["width"]

    meets = {d: widest(p) for d, p in devices.items()}
    for p in devices.values():  # planned within the deadline, or at the smallest width, which misses it
        assert (p["status"], p["round_s"] <= deadline) in (("planned", True), ("misses", False)), devices
        assert p["status"] == "planned" or p["width"] == min(DEMO_WIDTHS), devices
    assert all(capacity[d] <= meets[d] for d in capacity), (meets, capacity)
    at_full = [d for d in meets if meets[d] == 1.0]
    assert len(at_full) == len(devices) // 2 + 1, (meets, full, deadline)  # the median device and the faster
    assert all(full[d] > deadline for d in meets if meets[d] < 1.0), (meets, full, deadline)
    assert any(capacity[d] < 1.0 for d in capacity), (meets, capacity)  # the slower ones miss it
    trained = db.execute(
        "SELECT device, width FROM fl_client_rounds WHERE run_id = ? AND status = 'ok'", (run_id,)
    ).fetchall()
    assert trained and all(width <= capacity[device] + 1e-9 for device, width in trained)


def _check_outputs(out: Path, devices: set[str], rounds: int) -> None:
    db = sqlite3.connect(out / "fleetbench.db")
    cells = db.execute("SELECT device, status FROM cells").fetchall()
    assert {d for d, _ in cells} == devices and len(cells) == 4 * len(devices)
    failed = db.execute("SELECT device, width, status, message FROM cells WHERE status != 'ok'").fetchall()
    assert not failed, failed
    runs = db.execute("SELECT id, strategy, status FROM fl_runs ORDER BY id").fetchall()
    assert [(s, st) for _, s, st in runs] == [("fjord", "finished"), ("fluid", "finished")]
    for run_id, _, _ in runs:
        assert db.execute("SELECT COUNT(*) FROM fl_rounds WHERE run_id = ?", (run_id,)).fetchone()[0] == rounds
    placed = {d for (d,) in db.execute("SELECT DISTINCT device FROM fl_client_rounds")}
    assert placed == devices
    html = (out / "report" / "report.html").read_text()
    assert "FL run 1" in html and "FL run 2" in html and "Latency vs width" in html
    assert "fl_run1_plan" in html and "fl_run2_plan" in html  # each run's plan against what happened
    plans = db.execute("SELECT run_id, revision, from_round FROM fl_plans WHERE revision = 0").fetchall()
    assert plans == [(1, 0, 0), (2, 0, 0)]


#: A short demo: fixed-length cells in one pass each (the pass machinery and the precision target
#: are `tests/harness/test_device_run.py`'s and `tests/harness/test_runner.py`'s), two short rounds per run.
QUICK = ("--rounds", "2", "--examples", "1000", "--steps", "3", "--precision", "0", "--passes", "1")

#: The example fleet's devices (`devices/fleets/emulated.yaml`).
EMULATED = {"fast", "mid", "slow", "fresh", "phone"}


def test_demo_on_the_emulated_fleet(tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch) -> None:
    require_tool("sshd")
    require_tool("adb")
    monkeypatch.setenv("ANDROID_ADB_SERVER_PORT", str(free_port()))
    out = tmp_path / "demo"
    rc = main(["demo", "--out", str(out), *QUICK])
    captured = capsys.readouterr()
    printed = captured.out
    assert rc == 0, printed + captured.err
    assert f"report:  {out / 'report' / 'report.html'}" in printed and "[8/8]" in printed
    _check_outputs(out, EMULATED, rounds=2)
    _check_tier_widths(out, printed)
    # the fresh board (the distribution's python3, nothing installed) was provisioned before profiling
    fetched = next(line for line in printed.splitlines() if "fresh: fetched " in line)
    assert "numpy-" in fetched and "onnxruntime_training-1.19.2-" in fetched and "on x86_64" in fetched, fetched
    assert "fresh: installed numpy, onnxruntime, onnxruntime-training into " in printed, printed
    assert "backend of fresh: ort (best available)" in printed
    # each device's predicted and measured rounds after FjORD; FLuID's calibrated straggler against its target
    assert sum("predicted/measured round s" in line for line in printed.splitlines()) == len(EMULATED), printed
    db = sqlite3.connect(out / "fleetbench.db")
    # FLuID starts from its plan: the straggler is the device whose full-width round is predicted slowest
    (plan,) = db.execute("SELECT plan FROM fl_plans WHERE run_id = 2 AND revision = 0").fetchone()
    planned = json.loads(plan)["devices"]
    slowest = max(planned, key=lambda d: d["full_round_s"])
    assert slowest["straggler"] and [d["device"] for d in planned if d["straggler"]] == [slowest["device"]]
    assert f"round 1: straggler {slowest['device']} (" in printed and "x target" in printed, printed
    costs = {d for (d,) in db.execute("SELECT device FROM round_costs WHERE status = 'ok'")}
    assert costs == EMULATED
    predicted = db.execute("SELECT COUNT(*) FROM fl_client_rounds WHERE predicted_seconds > 0").fetchone()[0]
    assert predicted == 2 * 2 * len(EMULATED)  # every client round of both runs
    state = emulate.load_state(out / "fleet" / "state")
    assert all(state.get(name) is None for name in EMULATED)  # the fleet was stopped


#: The arguments of the local demo run (`tests/fleetbench/test_package.py` runs it from the installed wheel).
LOCAL_DEMO = (
    "demo", "--local", "--rounds", "1", "--examples", "300", "--steps", "2", "--precision", "0", "--passes", "1"
)


def check_local_demo(out: Path, printed: str) -> None:
    """Check what ``fleetbench demo --local`` (`LOCAL_DEMO`, output directory ``out``) wrote and printed."""
    _check_outputs(out, {"fast", "mid", "slow"}, rounds=1)
    assert "[8/8]" in printed and "[9/" not in printed
    for command in ("fleet up", "profile", "plan", "fl run", "report"):  # every step says how to do it yourself
        assert f"yourself: fleetbench {command} " in printed, command
    assert "--plan" in printed
    _check_tier_widths(out, printed)
    # each device uses its best backend (the demo's Python has onnxruntime-training: ort), recorded everywhere
    assert all(f"backend of {name}: ort (best available)" in printed for name in ("fast", "mid", "slow"))
    db = sqlite3.connect(out / "fleetbench.db")
    assert {b for (b,) in db.execute("SELECT DISTINCT backend FROM cells")} == {"ort"}
    assert {b for (b,) in db.execute("SELECT DISTINCT backend FROM fl_client_rounds")} == {"ort"}


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--rounds", "0"], "--rounds: 0 must be at least 1"),
        (["--examples", "-5"], "--examples: -5 must be at least 1"),
        (["--timeout", "0"], "--timeout: 0 must be a positive number"),
    ],
)
def test_refused_demo_creates_and_starts_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    out = tmp_path / "demo"
    rc = main(["demo", "--out", str(out), *argv])
    err = capsys.readouterr().err
    assert rc == 2 and message in err and err.count("\n") == 1
    assert not out.exists()


def test_a_killed_demo_stops_its_fleet_and_exits_143(tmp_path: Path) -> None:
    import os
    import signal
    import subprocess
    import sys

    from devices import processes

    require_tool("sshd")
    require_tool("adb")
    out = tmp_path / "demo"
    env = {**os.environ, "ANDROID_ADB_SERVER_PORT": str(free_port()), "PYTHONUNBUFFERED": "1"}
    env["PYTHONPATH"] = str(Path(emulate.__file__).resolve().parents[2])
    proc = subprocess.Popen(
        [sys.executable, "-m", "fleetbench", "demo", "--out", str(out)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip
    assert proc.stdout is not None
    try:
        seen = []
        for line in proc.stdout:  # the fleet is up once the demo lists its devices; it then provisions them
            seen.append(line)
            if line.lstrip().startswith("devices: "):
                break
        state = emulate.load_state(out / "fleet" / "state")
        started = [rec for dev in state.devices for rec in dev.processes]
        assert len(state.devices) == len(EMULATED) and started, "".join(seen)
        proc.send_signal(signal.SIGTERM)
        rest, err = proc.communicate(timeout=120)
        assert proc.returncode == 128 + signal.SIGTERM, err
        assert err.strip().splitlines()[-1] == "fleetbench: terminated (SIGTERM)" and "Traceback" not in err
        assert "stopping the emulated fleet" in rest
        assert not any(processes.running(rec) for rec in started)
        assert emulate.load_state(out / "fleet" / "state").devices == ()
    finally:  # a failure here leaves no fleet behind
        proc.kill()
        emulate.down(load_fleet(out / "fleet" / "fleet.yaml"), say=lambda line: None)
