"""Share calibration: the pure loop, the stored target, changing a running device's share."""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pytest

from devices.emulation import emulate, limits
from devices.fleet import Fleet
from exporters.userinput import InputError
from harness import calibrate
from harness.calibrate import CalibrationResult, calibrate_share, curve_error, set_share, stored_curve

#: Per-image latency at share 1 of a CPU-bound device, per width.
K = {0.25: 300.0, 0.5: 700.0, 0.75: 1300.0, 1.0: 1900.0}


def _device(share_scale: float = 1.0) -> calibrate.Measure:
    """A synthetic CPU-bound device: latency = k / share."""

    def measure(share: float) -> dict[float, float]:
        return {w: k * share_scale / share for w, k in K.items()}

    return measure


def test_converges_on_an_ideal_cpu_bound_device() -> None:
    target = {w: k / 0.3 for w, k in K.items()}
    calls: list[float] = []

    def measure(share: float) -> dict[float, float]:
        calls.append(share)
        return dict(_device()(share))

    result = calibrate_share(target, measure, start_share=0.6)
    assert isinstance(result, CalibrationResult)
    assert result.converged and result.iterations <= 3
    assert result.share == pytest.approx(0.3, rel=0.10)
    assert result.errors[0] == pytest.approx(0.5)  # k/0.6 against k/0.3
    assert result.errors[-1] <= 0.10
    assert calls[0] == 0.6 and "converged" in result.message


def test_converges_with_a_fixed_overhead_and_noise() -> None:
    rng = np.random.default_rng(1)
    target = {w: 40.0 + k / 0.25 for w, k in K.items()}

    def measure(share: float) -> dict[float, float]:
        return {w: (40.0 + k / share) * (1 + 0.03 * rng.standard_normal()) for w, k in K.items()}

    result = calibrate_share(target, measure, start_share=1.0)
    assert result.converged and result.iterations <= 4
    assert result.share == pytest.approx(0.25, rel=0.15)


def test_erratic_device_reports_non_convergence() -> None:
    target = {w: k / 0.3 for w, k in K.items()}
    rng = np.random.default_rng(0)

    def erratic(share: float) -> dict[float, float]:
        factor = float(rng.choice([0.2, 5.0]))  # wildly off every time
        return {w: factor * k / 0.3 for w, k in K.items()}

    result = calibrate_share(target, erratic, start_share=0.5, max_iterations=5, max_share=100.0)
    assert not result.converged
    assert result.iterations == 5 and len(result.errors) == 5
    assert all(e > 0.10 for e in result.errors)
    assert result.share == result.steps[int(np.argmin(result.errors))].share
    assert "NOT converged" in result.message and "tolerance 10%" in result.message


def test_share_pinned_at_bound_stops_early() -> None:
    target = {w: k / 50.0 for w, k in K.items()}  # needs 50 cores
    result = calibrate_share(target, _device(), start_share=1.0, max_share=2.0)
    assert not result.converged and result.iterations == 2 and result.share == 2.0
    assert "pinned" in result.message


def test_curve_error_and_bad_input() -> None:
    err, ratio = curve_error({0.5: 110.0, 1.0: 180.0, 0.25: 50.0}, {0.5: 100.0, 1.0: 200.0, 0.25: 50.0})
    assert err == pytest.approx(0.1) and ratio == pytest.approx(1.0)
    with pytest.raises(ValueError, match="no common width"):
        curve_error({0.3: 1.0}, {0.5: 1.0})
    with pytest.raises(ValueError):
        calibrate_share({0.5: 1.0}, _device(), start_share=0.0)


def test_stored_curve_picks_the_fullest_configuration() -> None:
    rows = [
        {"device": "pi", "model": "m", "width": w, "batch": 20, "backend": "ort", "status": "ok", "median_us": 10 * w}
        for w in (0.25, 0.5, 1.0)
    ]
    rows += [{**rows[0], "backend": "torch"}]
    rows += [{**rows[1], "status": "failed", "median_us": 1e9}]
    rows += [{**rows[2], "median_us": 30.0}]  # a second measurement of width 1.0
    curve = stored_curve(rows, "pi")
    assert (curve.model, curve.batch, curve.backend) == ("m", 20, "ort")
    assert curve.curve == {0.25: 2.5, 0.5: 5.0, 1.0: 20.0}
    with pytest.raises(LookupError, match="stored devices"):
        stored_curve(rows, "jetson")


def _fake_state(tmp_path: Path, cpu: str = "cgroup-v1") -> tuple[Fleet, Path]:
    group = tmp_path / "cg" / "fleetbench" / "dev"
    group.mkdir(parents=True)
    (group / "cpu.cfs_quota_us").write_text(str(limits.PERIOD_US // 2))
    (group / "cpu.cfs_period_us").write_text(str(limits.PERIOD_US))
    fleet = Fleet(path=tmp_path / "fleet.yaml", state_dir=tmp_path / "state")
    dev = emulate.DeviceState("dev", "ssh", "127.0.0.1:1", cgroups=(str(group),), cpu=cpu, cpu_share=0.5)
    emulate.save_state(fleet.state_dir, emulate.FleetState((dev,)))
    return fleet, group


def test_set_share_rewrites_the_quota_and_the_state(tmp_path: Path) -> None:
    fleet, group = _fake_state(tmp_path)
    updated = set_share(fleet, "dev", 0.25)
    assert (group / "cpu.cfs_quota_us").read_text() == str(limits.PERIOD_US // 4)
    assert updated.cpu_share == 0.25
    state = emulate.load_state(fleet.state_dir).get("dev")
    assert state is not None and state.cpu_share == 0.25
    with pytest.raises(LookupError):
        set_share(fleet, "absent", 0.5)


def test_cmd_up_match_with_fakes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    fleet_file = tmp_path / "fleet.yaml"
    fleet_file.write_text(
        "state_dir: state\ndevices:\n"
        "  - {name: emu, kind: ssh, host: 127.0.0.1, port: 2299, emulate: {preset: pi4}}\n"
        "  - {name: real, kind: ssh, host: 10.0.0.9}\n"
    )
    db = tmp_path / "fleetbench.db"
    db.write_text("")
    target_rows = [
        {"device": "pi", "model": "m", "width": w, "batch": 20, "backend": "ort", "status": "ok", "median_us": k / 0.2}
        for w, k in K.items()
    ]
    import harness.store

    class FakeStore:
        def __init__(self, path: str, *, create: bool = True) -> None:
            assert not create, "--match only reads the store"
            self.path = path

        def __enter__(self) -> FakeStore:
            return self

        def __exit__(self, *exc: object) -> None:
            return None

        def latest_cells(self) -> list[dict[str, object]]:
            return target_rows

    monkeypatch.setattr(harness.store, "ProfileStore", FakeStore)
    monkeypatch.setattr(emulate, "up", lambda fleet, say=print: emulate.UpResult(started=("emu",)))
    shares: list[tuple[str, float]] = []
    monkeypatch.setattr(calibrate, "set_share", lambda fleet, name, share: shares.append((name, share)))
    args = argparse.Namespace(file=str(fleet_file), match="pi", db=str(db))
    rc = calibrate.cmd_up_match(args, measure_factory=lambda fleet, name, target, db: _device())
    out = capsys.readouterr().out
    assert rc == 0, out
    assert [n for n, _ in shares] == ["emu"] and shares[0][1] == pytest.approx(0.2, rel=0.1)
    assert "converged" in out and "cpu_share: 0.2" in out

    # the default measure on a device that is not really up: a clear message and exit 1
    monkeypatch.setattr(calibrate, "set_share", set_share)
    assert calibrate.cmd_up_match(args) == 1
    assert "emu: not calibrated" in capsys.readouterr().out
    args.match = "nobody"
    with pytest.raises(InputError, match="no successful measurement of device 'nobody'"):
        calibrate.cmd_up_match(args)


def test_real_device_follows_a_new_share(tmp_path: Path) -> None:
    """A CPU-bound loop over SSH gets half a core, then a quarter after the share goes 0.5 -> 0.25."""
    from devices.fleetfile import load_fleet
    from devices.ssh import SSHTransport
    from tests.devices.conftest import require_tool
    from tests.devices.emulation.test_emulate import _write_fleet
    from tests.devices.emulation.test_limits import WORKLOAD, check_share

    require_tool("sshd")
    fleet = load_fleet(_write_fleet(tmp_path, with_adb=False))
    try:
        assert emulate.up(fleet, say=lambda line: None).ok
        device = fleet.devices[0]
        dev = emulate.load_state(fleet.state_dir).get(device.name)
        assert dev is not None and dev.cpu in ("cgroup-v1", "cgroup-v2", "duty-cycle")
        with SSHTransport(device, connect_timeout=10) as transport:

            def remote_share(seconds: float) -> float:
                remote = transport.run([device.python, "-c", WORKLOAD, str(seconds)], timeout=60)
                assert remote.ok, remote
                return float(remote.stdout)

            set_share(fleet, device.name, 0.5)
            check_share(0.5, remote_share, duty_cycle=dev.cpu == "duty-cycle")
            set_share(fleet, device.name, 0.25)
            check_share(0.25, remote_share, duty_cycle=dev.cpu == "duty-cycle")
        state = emulate.load_state(fleet.state_dir).get(device.name)
        assert state is not None and state.cpu_share == 0.25
        if state.cpu == "cgroup-v1":
            directory = calibrate.cpu_cgroup_dir(state)
            assert directory is not None and (directory / "cpu.cfs_quota_us").read_text().strip() == str(
                limits.cpu_knobs(1, 0.25)["cpu.cfs_quota_us"]
            )
    finally:
        assert emulate.down(fleet, say=lambda line: None) == []


def test_window_steps_and_mean_per_image() -> None:
    # 400 us/image x 20 images = 8 ms a step: 1 s of timed steps is 125 steps
    assert calibrate.window_steps(400.0, 20, 1.0, 5, 2000) == 125
    assert calibrate.window_steps(1e6, 20, 1.0, 5, 2000) == 5
    assert calibrate.window_steps(0.0, 20, 1.0, 5, 2000) == 2000
    # a quota stall in one step shows in the mean, not in the median
    steps = [0.008] * 9 + [0.068]
    assert calibrate.mean_per_image_us(steps, 20) == pytest.approx((9 * 0.008 + 0.068) / 200 * 1e6)
    with pytest.raises(ValueError):
        calibrate.mean_per_image_us([], 20)
