"""The local fallback fleet (`devices.emulation.emulate.write_local_fleet`): fast, mid and slow differ as named.

The fleet ``fleetbench demo`` falls back to without sshd: three local devices with the
example emulated fleet's CPU shares, memory limits and cpu pins, brought up with
``fleet up`` and profiled with the real runner.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from devices import processes
from devices.emulation import emulate
from devices.emulation.presets import resolve
from devices.fleetfile import load_fleet
from fleetbench.cli import main

#: The devices of the local fleet, fastest first.
NAMES = ("fast", "mid", "slow")


def test_the_writer_gives_the_example_fleets_shares_memory_and_pins(tmp_path: Path) -> None:
    fleet = load_fleet(emulate.write_local_fleet(tmp_path / "fleet"))
    example = load_fleet(emulate.EXAMPLE_FLEET)
    assert [d.name for d in fleet.devices] == list(NAMES)
    assert fleet.state_dir == tmp_path / "fleet" / "state"
    available = os.sched_getaffinity(0)
    for device in fleet.devices:
        twin = example.device(device.name).emulate
        assert device.kind == "local" and device.emulate is not None and twin is not None
        assert resolve(device.emulate).cpu_share == resolve(twin).cpu_share
        assert resolve(device.emulate).memory_mb == resolve(twin).memory_mb
        assert device.emulate.cpus == (twin.cpus if twin.cpus and int(twin.cpus) in available else None)
        assert device.workdir == str(fleet.state_dir / device.name / "work")
    shares = [resolve(d.emulate).cpu_share for d in fleet.devices if d.emulate]
    assert shares == [0.6, 0.29, 0.14]


def test_pins_this_machine_lacks_are_left_out(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0})
    fleet = load_fleet(emulate.write_local_fleet(tmp_path / "fleet"))
    assert {d.name: d.emulate.cpus for d in fleet.devices if d.emulate} == {"fast": "0", "mid": "0", "slow": None}


def _medians(out: str) -> dict[str, float]:
    """Median µs per image by device, from the table ``fleetbench profile`` prints.

    The status follows the peak memory: at word 8, or 10 when the devices' emulated power sensors
    add the energy column (``1.23 (emulated)``) after the median.
    """
    medians = {}
    for line in out.splitlines():
        words = line.split()
        status = 10 if "(emulated)" in words else 8
        if words and words[0] in NAMES and len(words) > status and words[status].rstrip(",") == "ok":  # "ok, imprecise"
            medians[words[0]] = float(words[4])
    return medians


def test_profiled_fast_mid_slow_follow_their_cpu_shares(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = emulate.write_local_fleet(tmp_path / "fleet")
    fleet = load_fleet(path)
    argv = ["profile", "--fleet", str(path), "--model", "fjord-cnn", "--widths", "0.5", "--batch", "20"]
    argv += ["--optimizer", "sgd", "--no-round-cost", "--max-seconds", "6", "--passes", "2"]
    argv += ["--artifacts", str(tmp_path / "artifacts")]
    try:
        assert emulate.up(fleet, say=lambda line: None).ok
        state = emulate.load_state(fleet.state_dir)
        seen = []
        # A share is a ceiling, not a floor: when the machine's other work squeezes one device, its
        # attempt is taken again (the order and the ratios alike), up to three attempts.
        for attempt in range(3):
            assert main([*argv, "--db", str(tmp_path / f"profile{attempt}.db")]) == 0
            us = _medians(capsys.readouterr().out)
            seen.append(us)
            assert set(us) == set(NAMES), seen
            # shares 0.6 : 0.29 : 0.14, so mid takes 2.07x fast's time and slow 2.07x mid's
            if all(1.3 < ratio < 3.2 for ratio in (us["mid"] / us["fast"], us["slow"] / us["mid"])):
                break
        else:
            pytest.fail(f"µs per image by device {seen}: expected about 2x from fast to mid and from mid to slow")
    finally:
        assert emulate.down(fleet, say=lambda line: None) == []
    for dev in state.devices:
        assert not any(processes.running(rec) for rec in dev.processes)
        assert not any(Path(d).exists() for d in dev.cgroups)
