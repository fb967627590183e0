"""`fleetbench demo` end to end: the emulated fleet, and the local fallback."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from devices import emulate
from devices.sshd import free_port
from harness.cli import main
from tests.devices.conftest import require_tool


def _check_outputs(out: Path, devices: set[str], rounds: int) -> None:
    db = sqlite3.connect(out / "fleetbench.db")
    cells = db.execute("SELECT device, status FROM cells").fetchall()
    assert {d for d, _ in cells} == devices and len(cells) == 4 * len(devices)
    assert all(status == "ok" for _, status in cells)
    runs = db.execute("SELECT id, strategy, status FROM fl_runs ORDER BY id").fetchall()
    assert [(s, st) for _, s, st in runs] == [("fjord", "finished"), ("fluid", "finished")]
    for run_id, _, _ in runs:
        assert db.execute("SELECT COUNT(*) FROM fl_rounds WHERE run_id = ?", (run_id,)).fetchone()[0] == rounds
    # FjORD clients train at most their tier's width (p_max), planned from the profiles
    tiers = db.execute("SELECT DISTINCT capacity FROM fl_clients WHERE run_id = ?", (runs[0][0],)).fetchall()
    assert all(0 < c <= 1 for (c,) in tiers)
    placed = {d for (d,) in db.execute("SELECT DISTINCT device FROM fl_client_rounds")}
    assert placed == devices
    html = (out / "report" / "report.html").read_text()
    assert "FL run 1" in html and "FL run 2" in html and "Latency vs width" in html


def test_demo_on_the_emulated_fleet(tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch) -> None:
    require_tool("sshd")
    require_tool("adb")
    monkeypatch.setenv("ANDROID_ADB_SERVER_PORT", str(free_port()))
    out = tmp_path / "demo"
    rc = main(["demo", "--out", str(out), "--rounds", "2", "--examples", "800", "--steps", "3"])
    printed = capsys.readouterr().out
    assert rc == 0, printed
    assert f"report:  {out / 'report' / 'report.html'}" in printed and "[7/7]" in printed
    _check_outputs(out, {"fast", "mid", "slow", "phone"}, rounds=2)
    state = emulate.load_state(out / "fleet" / "state")
    assert all(state.get(name) is None for name in ("fast", "mid", "slow", "phone"))  # the fleet was stopped


def test_demo_on_local_devices(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "demo"
    rc = main(["demo", "--local", "--out", str(out), "--rounds", "1", "--examples", "600", "--steps", "2"])
    printed = capsys.readouterr().out
    assert rc == 0, printed
    _check_outputs(out, {"fast", "mid", "slow"}, rounds=1)
    assert "[6/6]" in printed and "[7/" not in printed
