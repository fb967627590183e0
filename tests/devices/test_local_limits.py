"""Local devices with an ``emulate`` block: ``fleet up`` puts their limits in place, every command enters them.

Real processes throughout: the limits are this machine's cgroups where permitted (and
the duty-cycle supervisor, RLIMIT_AS and cpu affinity where ``detect`` is told that
nothing is), and the workloads are real CPU-bound and allocating Python programs.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from devices import processes
from devices.connect import connect
from devices.emulation import emulate, limits
from devices.errors import Unreachable
from devices.fleet import Fleet
from devices.fleetfile import load_fleet
from devices.local import LocalProcess, LocalTransport
from tests.devices.emulation.test_limits import WORKLOAD, check_share

#: Allocates 256 MiB and touches every page; prints ``survived`` when it could.
ALLOCATE = "b = bytearray(256 << 20)\nfor i in range(0, len(b), 4096): b[i] = 1\nprint('survived')"

#: Reads lines and answers each with the cgroups, affinity and RLIMIT_AS it runs under.
RESIDENT = (
    "import json, os, resource, sys\n"
    "for line in sys.stdin:\n"
    "    cgroups = [entry.split(':', 2)[2] for entry in open('/proc/self/cgroup').read().split()]\n"
    "    where = [cgroups, sorted(os.sched_getaffinity(0)), resource.getrlimit(resource.RLIMIT_AS)[0]]\n"
    "    print(json.dumps(where), flush=True)\n"
)


def _write(tmp_path: Path, devices: str) -> Path:
    path = tmp_path / "fleet.yaml"
    path.write_text("state_dir: state\ndevices:\n" + devices)
    return path


def _device(name: str, block: str) -> str:
    return f"  - name: {name}\n    kind: local\n    emulate: {block}\n"


def _unique() -> str:
    return uuid.uuid4().hex[:6]


@pytest.fixture(params=["cgroups", "fallback"])
def method(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Each test once with what this machine permits, once with no cgroup at all."""
    if request.param == "fallback":
        monkeypatch.setattr(limits, "detect", lambda *a, **k: limits.Support(reason="pretend no cgroups"))
    else:
        support = limits.detect()
        if not (support.cpu_version and support.memory_version):
            pytest.skip(f"cgroups not permitted here: {support.reason}")
    return str(request.param)


@pytest.fixture
def brought_down() -> Iterator[list[Fleet]]:
    """Fleets a test brought up; each is brought down after it, whatever the test left."""
    fleets: list[Fleet] = []
    yield fleets
    for fleet in fleets:
        emulate.down(fleet, say=lambda line: None)


def _up(path: Path, brought_down: list[Fleet]) -> Fleet:
    fleet = load_fleet(path)
    brought_down.append(fleet)
    result = emulate.up(fleet, say=lambda line: None)
    assert result.ok, result.failed
    return fleet


def _share(device_fleet: Fleet, name: str, seconds: float) -> float:
    device = device_fleet.device(name)
    result = connect(device).run([device.python, "-c", WORKLOAD, str(seconds)], timeout=120)
    assert result.ok, result.stderr
    return float(result.stdout)


def test_a_quarter_share_device_gets_a_quarter_of_a_core_and_a_whole_one_more(
    tmp_path: Path, method: str, brought_down: list[Fleet]
) -> None:
    quarter, whole = f"quarter-{_unique()}", f"whole-{_unique()}"
    path = _write(tmp_path, _device(quarter, "{cpu_share: 0.25}") + _device(whole, "{cpu_share: 1}"))
    fleet = _up(path, brought_down)
    state = emulate.load_state(fleet.state_dir)
    expected = "duty-cycle" if method == "fallback" else ("cgroup-v1", "cgroup-v2")
    assert all(dev.cpu in expected for dev in state.devices), state
    check_share(0.25, lambda seconds: _share(fleet, quarter, seconds), duty_cycle=method == "fallback")
    seen = []
    for _ in range(8):  # the machine is shared: the whole core may be busy for a moment
        pair = (_share(fleet, quarter, 1.0), _share(fleet, whole, 1.0))
        seen.append(pair)
        if pair[1] > 2 * pair[0]:
            break
    else:
        pytest.fail(f"(share 0.25, share 1) CPU per wall second: {seen}; expected share 1 well above")
    assert emulate.down(fleet, say=lambda line: None) == []


def test_its_memory_limit_refuses_a_large_allocation(tmp_path: Path, method: str, brought_down: list[Fleet]) -> None:
    name = f"small-{_unique()}"
    fleet = _up(_write(tmp_path, _device(name, "{memory_mb: 128}")), brought_down)
    device = fleet.device(name)
    big = connect(device).run([device.python, "-c", ALLOCATE], timeout=120)
    assert big.rc != 0 and "survived" not in big.stdout, big
    if method == "fallback":  # RLIMIT_AS: the allocation itself fails
        assert "MemoryError" in big.stderr, big.stderr
    small = connect(device).run([device.python, "-c", "b = bytearray(16 << 20); print('ok')"], timeout=120)
    assert small.ok and small.stdout.strip() == "ok", small
    assert emulate.down(fleet, say=lambda line: None) == []


def test_every_command_and_the_resident_runner_start_inside_the_limits(
    tmp_path: Path, method: str, brought_down: list[Fleet]
) -> None:
    cpu = max(os.sched_getaffinity(0))
    name = f"pinned-{_unique()}"
    fleet = _up(_write(tmp_path, _device(name, f"{{preset: pi4, cpus: '{cpu}'}}")), brought_down)
    device = fleet.device(name)
    dev = emulate.load_state(fleet.state_dir).get(name)
    assert (
        dev is not None and dev.kind == "local" and (dev.cpu_share, dev.memory_mb, dev.cpus) == (0.29, 2048, str(cpu))
    )
    unit = limits.unit_name(name, fleet.state_dir)
    transport = connect(device)
    ran = transport.run([device.python, "-c", RESIDENT], timeout=60)  # no stdin: it answers nothing
    assert ran.ok and ran.stdout == ""
    twice = []
    for _ in range(2):
        process = transport.start([device.python, "-c", RESIDENT])
        try:
            process.write_line("where")
            twice.append(process.read_line(30))
        finally:
            assert process.close() == 0
    assert twice[0] == twice[1], twice  # the same limits, every time
    cgroups, affinity, rlimit = json.loads(twice[0])
    assert affinity == [cpu]
    ours = [path for path in cgroups if path.endswith(f"/{limits.GROUP}/{unit}")]
    if method == "fallback":
        assert not ours and rlimit == 2048 << 20
    else:  # cpu, memory and cpuset
        assert len(ours) == len({str(d) for d in dev.cgroups}) == 3 and rlimit == resource.RLIM_INFINITY
    marker = transport.run(["sh", "-c", f"echo ${emulate.MARKER}"], timeout=30)
    assert marker.stdout.strip() == unit  # `fleet down` finds what a command left behind
    assert emulate.down(fleet, say=lambda line: None) == []


def test_a_device_that_is_not_up_refuses_commands_and_down_leaves_nothing(
    tmp_path: Path, method: str, brought_down: list[Fleet], capsys: pytest.CaptureFixture[str]
) -> None:
    name = f"pi3-{_unique()}"
    path = _write(tmp_path, _device(name, "{preset: pi3}"))
    fleet = load_fleet(path)
    device = fleet.device(name)
    with pytest.raises(Unreachable, match=f"local device '{name}' is not up: .*fleetbench fleet up"):
        connect(device).run(["true"], timeout=30)
    brought_down.append(fleet)
    args = argparse.Namespace(file=str(path))
    assert emulate.cmd_up(args) == 0
    assert f"{name}: local device, its commands start under cpu 0.14 core" in capsys.readouterr().out
    assert emulate.cmd_status(args) == 0
    row = next(line for line in capsys.readouterr().out.splitlines() if line.startswith(name))
    assert " local " in row and " this machine " in row and " up " in row and " yes " in row, row
    again = emulate.up(fleet, say=lambda line: None)
    assert again.already_up == (name,) and not again.started

    state = emulate.load_state(fleet.state_dir)
    left = connect(device).start([device.python, "-c", "import time; time.sleep(600)"])  # a runner nobody closes
    assert isinstance(left, LocalProcess)
    detached = connect(device).run(["sh", "-c", "setsid sleep 600 >/dev/null 2>&1 & echo $!"], timeout=30)
    strays = [processes.record("left", left.pid), processes.record("detached", int(detached.stdout))]
    assert all(processes.running(rec) for rec in strays)
    assert emulate.cmd_down(args) == 0
    for rec in [*strays, *(rec for dev in state.devices for rec in dev.processes)]:
        assert not processes.running(rec), rec
    assert not any(Path(d).exists() for dev in state.devices for d in dev.cgroups)
    assert not (fleet.state_dir / emulate.STATE_FILE).exists()
    left.close()
    with pytest.raises(Unreachable, match="is not up"):
        connect(device).run(["true"], timeout=30)
    rows = emulate.status(fleet, timeout=3)
    assert [(r.up, r.answers) for r in rows] == [(False, False)]


def test_a_device_brought_up_with_other_limits_refuses_commands(tmp_path: Path, brought_down: list[Fleet]) -> None:
    name = f"edited-{_unique()}"
    path = _write(tmp_path, _device(name, "{cpu_share: 0.5}"))
    _up(path, brought_down)
    path.write_text(path.read_text().replace("0.5", "0.25"))
    edited = load_fleet(path).device(name)
    with pytest.raises(Unreachable, match=r"brought up with cpu share, memory, cpus \(0.5, None, None\)"):
        connect(edited).run(["true"], timeout=30)


def test_an_unconfined_transport_is_unchanged() -> None:
    result = LocalTransport().run([sys.executable, "-c", f"import os; print(os.environ.get('{emulate.MARKER}'))"], 30)
    assert result.stdout.strip() == "None"
