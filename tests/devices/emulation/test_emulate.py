"""The emulated fleet: up / status / down against the real sshd, adb endpoint and adb server."""

from __future__ import annotations

import argparse
import os
import re
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from devices import processes
from devices.emulation import emulate, limits
from devices.emulation.sshd import free_port
from devices.fleet import Device, Emulation, Fleet
from tests.devices.conftest import sigkills, signals_sent
from tests.devices.emulation.test_limits import WORKLOAD, check_share

#: Whether ``up`` can keep idle cpus polling for a throttled device (`devices.emulation.limits.start_latency_hold`).
HOLDS_LATENCY = os.geteuid() == 0 and limits.CPU_LATENCY_QOS.exists()


def _write_fleet(tmp_path: Path, with_adb: bool, extra: str = "") -> Path:
    tag = f"{os.getpid()}{tmp_path.name[-4:]}".replace("_", "")
    text = (
        "state_dir: state\n"
        "devices:\n"
        f"  - name: pi-{tag}\n"
        "    kind: ssh\n"
        "    host: 127.0.0.1\n"
        f"    port: {free_port()}\n"
        "    emulate: {cpu_share: 0.5, memory_mb: 512}\n"
    )
    if with_adb:
        text += (
            f"  - name: phone-{tag}\n"
            "    kind: adb\n"
            f"    serial: 127.0.0.1:{free_port()}\n"
            "    emulate: {preset: phone-midrange, memory_mb: 1024}\n"
        )
    path = tmp_path / "fleet.yaml"
    path.write_text(text + extra)
    return path


def _load(path: Path) -> Fleet:
    from devices.fleetfile import load_fleet

    return load_fleet(path)


def _assert_nothing_left(fleet: Fleet, state: emulate.FleetState) -> None:
    assert state.devices, "up recorded nothing"
    for dev in state.devices:
        for rec in dev.processes:
            assert not processes.running(rec), f"{dev.name}: {rec} still runs"
        for directory in dev.cgroups:
            assert not Path(directory).exists(), directory
        if dev.netns:
            assert not limits.netns_exists(dev.netns)
    if state.adb_server is not None:
        assert not processes.running(state.adb_server)
    assert not (fleet.state_dir / emulate.STATE_FILE).exists()
    names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout if os.geteuid() == 0 else ""
    for device in fleet.devices:
        assert limits.netns_name(limits.unit_name(device.name, fleet.state_dir)) not in names


@pytest.fixture
def adb_server_port(monkeypatch: pytest.MonkeyPatch) -> int:
    """A private adb server port, so a user's adb server is never touched."""
    port = free_port()
    monkeypatch.setenv("ANDROID_ADB_SERVER_PORT", str(port))
    return port


@pytest.fixture
def fleet_file(tmp_path: Path, sshd_path: str, adb_path: str, adb_server_port: int) -> Iterator[Path]:
    path = _write_fleet(tmp_path, with_adb=True)
    yield path
    emulate.down(_load(path), say=lambda line: None)  # whatever a failing test left


def test_up_status_ssh_down(fleet_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from devices.ssh import SSHTransport

    fleet = _load(fleet_file)
    args = argparse.Namespace(file=str(fleet_file))
    assert emulate.cmd_up(args) == 0
    out = capsys.readouterr().out
    assert "started" in out
    state = emulate.load_state(fleet.state_dir)
    assert {d.name for d in state.devices} == {d.name for d in fleet.devices}

    assert emulate.cmd_status(args) == 0
    table = capsys.readouterr().out
    for device in fleet.devices:
        row = next(line for line in table.splitlines() if line.startswith(device.name))
        assert " up " in row and " yes " in row, table

    ssh_device = next(d for d in fleet.devices if d.kind == "ssh")
    assert ssh_device.known_hosts == fleet.state_dir / "known_hosts" and not ssh_device.trust_on_first_use
    with SSHTransport(ssh_device, connect_timeout=10) as transport:  # host key verified, not trusted on first use
        result = transport.run(["sh", "-c", "echo $0; cat /proc/self/cgroup", "hello world"], timeout=30)
    assert result.ok and result.stdout.startswith("hello world\n")
    dev_state = state.get(ssh_device.name)
    assert dev_state is not None
    if dev_state.cpu == "cgroup-v1":  # the session runs inside the device's cgroup
        assert f"/{limits.GROUP}/{limits.unit_name(ssh_device.name, fleet.state_dir)}" in result.stdout
    holders = [rec for rec in dev_state.processes if rec.role == "latency-hold"]  # its 0.5 core stops it
    if HOLDS_LATENCY:
        assert len(holders) == 1 and processes.running(holders[0])
        assert f"idle cpus poll while it is up (pid {holders[0].pid})" in out
    else:
        assert not holders and "idle cpus may halt between its throttled periods" in out

    # the device's CPU share (0.5) holds for a CPU-bound loop run over SSH
    with SSHTransport(ssh_device, connect_timeout=10) as transport:

        def remote_share(seconds: float) -> float:
            remote = transport.run([ssh_device.python, "-c", WORKLOAD, str(seconds)], timeout=60)
            assert remote.ok, remote
            return float(remote.stdout)

        check_share(0.5, remote_share, duty_cycle=dev_state.cpu == "duty-cycle")

    phone = next((d for d in fleet.devices if d.kind == "adb"), None)
    if phone is not None:  # attached to our private adb server by `up`
        shell = subprocess.run(
            ["adb", "-s", phone.serial or "", "shell", "echo", "from-phone"],
            capture_output=True,
            text=True,
            timeout=30,
            env=dict(os.environ),
        )
        assert "from-phone" in shell.stdout, shell

    # up twice is harmless: nothing restarts
    again = emulate.up(fleet, say=lambda line: None)
    assert again.ok and set(again.already_up) == {d.name for d in fleet.devices} and not again.started
    assert emulate.load_state(fleet.state_dir) == state

    assert emulate.cmd_down(args) == 0
    _assert_nothing_left(fleet, state)
    rows = emulate.status(fleet, timeout=3)
    assert rows and not any(r.up or r.answers for r in rows)


def test_stale_entry_is_cleaned_and_restarted(fleet_file: Path) -> None:
    fleet = _load(fleet_file)
    assert emulate.up(fleet, say=lambda line: None).ok
    first = emulate.load_state(fleet.state_dir)
    victim = first.devices[0]
    os.kill(victim.processes[0].pid, signal.SIGKILL)
    deadline = time.monotonic() + 5
    while processes.running(victim.processes[0]) and time.monotonic() < deadline:
        time.sleep(0.02)
    lines: list[str] = []
    result = emulate.up(fleet, say=lines.append)
    assert result.ok and result.started == (victim.name,), lines
    assert any("stale" in line for line in lines)
    second = emulate.load_state(fleet.state_dir)
    new = second.get(victim.name)
    assert new is not None and new.processes[0].pid != victim.processes[0].pid
    statuses = emulate.status(fleet, timeout=10)
    assert all(r.answers for r in statuses), statuses
    assert emulate.down(fleet, say=lambda line: None) == []
    _assert_nothing_left(fleet, second)


def test_a_running_device_too_busy_to_answer_is_kept_not_restarted(
    fleet_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fleet = _load(fleet_file)
    assert emulate.up(fleet, say=lambda line: None).ok
    first = emulate.load_state(fleet.state_dir)
    monkeypatch.setattr(emulate, "_answers", lambda device, timeout=10.0: (False, "timed out"))
    lines: list[str] = []
    result = emulate.up(fleet, say=lines.append)
    assert result.ok and result.started == () and set(result.already_up) == {d.name for d in first.devices}
    assert not any("stale" in line for line in lines), lines
    kept = [line for line in lines if "already up" in line]
    assert len(kept) == len(first.devices) and all("busy: no answer within 5 s: timed out" in x for x in kept), lines
    second = emulate.load_state(fleet.state_dir)
    assert [d.processes for d in second.devices] == [d.processes for d in first.devices]
    assert all(processes.running(r) for d in second.devices for r in d.processes)
    monkeypatch.undo()
    assert emulate.down(fleet, say=lambda line: None) == []
    _assert_nothing_left(fleet, second)


def test_fallback_duty_cycle_and_rlimit(tmp_path: Path, sshd_path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from devices.ssh import SSHTransport

    monkeypatch.setattr(limits, "detect", lambda *a, **k: limits.Support(reason="pretend no cgroups"))
    path = _write_fleet(tmp_path, with_adb=False)
    fleet = _load(path)
    try:
        assert emulate.up(fleet, say=lambda line: None).ok
        state = emulate.load_state(fleet.state_dir)
        dev = state.devices[0]
        assert (dev.cpu, dev.memory, dev.cgroups) == ("duty-cycle", "rlimit", ())
        # the duty cycle stops the device too, so idle cpus are kept polling as under a quota
        assert [r.role for r in dev.processes] == ["sshd", "duty-cycle"] + ["latency-hold"] * HOLDS_LATENCY
        with SSHTransport(fleet.devices[0], connect_timeout=10) as transport:
            result = transport.run(["sh", "-c", "ulimit -v"], timeout=30)
        assert result.ok and int(result.stdout) == 512 * 1024  # KiB: RLIMIT_AS reached the session
    finally:
        assert emulate.down(fleet, say=lambda line: None) == []
    _assert_nothing_left(fleet, state)


@pytest.mark.parametrize("cgroups", [True, False])
def test_pinned_device_sessions_run_on_its_cpus(
    tmp_path: Path, sshd_path: str, monkeypatch: pytest.MonkeyPatch, cgroups: bool
) -> None:
    from devices.ssh import SSHTransport

    if not cgroups:  # nothing permitted: the pin is the processes' affinity
        monkeypatch.setattr(limits, "detect", lambda *a, **k: limits.Support(reason="pretend no cgroups"))
    cpu = max(os.sched_getaffinity(0))
    path = _write_fleet(tmp_path, with_adb=False)
    # no CPU share: without cgroups it would be a duty cycle, whose SIGSTOPs can cut an SSH login short
    path.write_text(path.read_text().replace("{cpu_share: 0.5, memory_mb: 512}", f"{{memory_mb: 512, cpus: '{cpu}'}}"))
    fleet = _load(path)
    try:
        assert emulate.up(fleet, say=lambda line: None).ok
        dev = emulate.load_state(fleet.state_dir).devices[0]
        assert dev.cpus == str(cpu)
        assert dev.cpuset in (("cgroup-v1", "cgroup-v2", "affinity") if cgroups else ("affinity",))
        affinity = "import os; print(sorted(os.sched_getaffinity(0)))"
        with SSHTransport(fleet.devices[0], connect_timeout=10) as transport:
            result = transport.run([fleet.devices[0].python, "-c", affinity], timeout=30)
        assert result.ok and result.stdout.strip() == f"[{cpu}]", result
    finally:
        assert emulate.down(fleet, say=lambda line: None) == []


def test_a_pin_to_a_cpu_this_machine_lacks_is_one_line_and_the_example_drops_it(
    tmp_path: Path, sshd_path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0})
    path = _write_fleet(tmp_path, with_adb=False)
    path.write_text(path.read_text().replace("memory_mb: 512}", "memory_mb: 512, cpus: '1'}"))
    fleet = _load(path)
    result = emulate.up(fleet, say=lambda line: None)
    assert list(result.failed) == [fleet.devices[0].name]
    assert "cpus 1: this machine offers cpus 0" in result.failed[fleet.devices[0].name]
    assert emulate.load_state(fleet.state_dir).devices == ()
    example = emulate.write_example_fleet(tmp_path / "example", free_port).read_text()
    assert example.count('cpus: "0"') == 3 and 'cpus: "1"' not in example  # slow's and fresh's pins left out


def test_the_example_fleet_gives_each_device_its_own_port_when_the_kernel_repeats_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A port handed out twice, or the adb server's, is drawn again; a source stuck on one port is an error."""
    monkeypatch.setenv("ANDROID_ADB_SERVER_PORT", "40000")
    draws = iter([41000, 41000, 40000, 41001, 41001, 41002, 41003, 41004])
    path = emulate.write_example_fleet(tmp_path / "example", lambda: next(draws))
    ports = [int(p) for p in re.findall(r"(?:port: |serial: 127\.0\.0\.1:)(\d+)", path.read_text())]
    assert sorted(ports) == [41000, 41001, 41002, 41003, 41004]
    assert [d.name for d in _load(path).devices] == ["fast", "mid", "slow", "fresh", "phone"]
    with pytest.raises(emulate.EmulationError, match="no port for the example fleet"):
        emulate.write_example_fleet(tmp_path / "stuck", lambda: 41000)


@pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces need root")
def test_network_delay_in_namespace(tmp_path: Path, sshd_path: str) -> None:
    path = _write_fleet(tmp_path, with_adb=False)
    path.write_text(path.read_text().replace("{cpu_share: 0.5, memory_mb: 512}", "{delay_ms: 60, rate_kbit: 8000}"))
    fleet = _load(path)
    device = fleet.devices[0]
    try:
        assert emulate.up(fleet, say=lambda line: None).ok
        state = emulate.load_state(fleet.state_dir)
        dev = state.get(device.name)
        assert dev is not None and dev.netns and limits.netns_exists(dev.netns)
        start = time.monotonic()
        with socket.create_connection((device.host or "", device.port or 22), timeout=10) as sock:
            banner = sock.recv(64)
        elapsed = time.monotonic() - start
        assert banner.startswith(b"SSH-") and elapsed >= 0.055, elapsed  # at least one delayed crossing
        assert all(r.answers for r in emulate.status(fleet, timeout=15))
    finally:
        assert emulate.down(fleet, say=lambda line: None) == []
    _assert_nothing_left(fleet, state)


def test_cmd_up_says_sshd_is_missing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from devices.emulation import sshd

    def missing() -> str:
        raise sshd.SshdError("sshd is not installed")

    monkeypatch.setattr(sshd, "sshd_binary", missing)
    path = _write_fleet(tmp_path, with_adb=False)
    assert emulate.cmd_up(argparse.Namespace(file=str(path))) == 1
    assert "sshd is not installed" in capsys.readouterr().err
    assert not (_load(path).state_dir / emulate.STATE_FILE).exists()


def test_state_json_round_trip_and_table() -> None:
    rec = emulate.ProcessRecord("sshd", 123, 456)
    dev = emulate.DeviceState(
        "pi",
        "ssh",
        "127.0.0.1:2222",
        (rec,),
        ("/sys/fs/cgroup/cpu/fleetbench/pi-1",),
        "fb-pi-1",
        "fbh1",
        "cgroup-v1",
        "rlimit",
        0.29,
        2048,
        "netns fb-pi-1",
        cpuset="cgroup-v1",
        cpus="1",
    )
    state = emulate.FleetState((dev,), emulate.ProcessRecord("adb-server", 9, 10), 5038)
    assert emulate.state_from_json(emulate.state_to_json(state)) == state
    assert state.with_device(None, drop="pi").devices == ()
    table = emulate.format_status([emulate.DeviceStatus("pi", "ssh", "127.0.0.1:2222", True, False, "refused")])
    assert table.splitlines()[1].split()[:5] == ["pi", "ssh", "127.0.0.1:2222", "up", "no"]


def test_address_and_netns_decision() -> None:
    phone = Device(name="p", kind="adb", serial="127.0.0.1:5555")
    pi = Device(name="q", kind="ssh", host="127.0.0.1", port=2200)
    assert emulate.address_of(phone) == ("127.0.0.1", 5555)
    assert emulate.address_of(pi) == ("127.0.0.1", 2200)
    shaped = Emulation(delay_ms=10)
    assert emulate.wants_netns(shaped, pi, is_root=True)
    assert not emulate.wants_netns(shaped, pi, is_root=False)
    assert not emulate.wants_netns(shaped, phone, is_root=True)
    assert not emulate.wants_netns(Emulation(cpu_share=0.5), pi, is_root=True)


def test_only_a_share_that_stops_the_device_keeps_idle_cpus_polling() -> None:
    def plan(cpu: limits.CpuMethod, cpus: frozenset[int] | None) -> limits.Plan:
        return limits.Plan(cpu, "none", 0.5, None, cpus=cpus)

    one, every = frozenset({0}), None
    assert emulate.throttled_by_share(Emulation(cpu_share=0.14), plan("cgroup-v1", one))
    assert emulate.throttled_by_share(Emulation(cpu_share=0.5), plan("duty-cycle", one))
    assert not emulate.throttled_by_share(Emulation(cpu_share=1.2), plan("cgroup-v2", one))  # never stopped on 1 cpu
    assert not emulate.throttled_by_share(Emulation(cpu_share=0.14), plan("none", one))  # no limit was applied
    assert not emulate.throttled_by_share(Emulation(), plan("cgroup-v1", one))
    cores = len(os.sched_getaffinity(0))
    assert emulate.throttled_by_share(Emulation(cpu_share=cores - 0.5), plan("cgroup-v1", every))
    assert not emulate.throttled_by_share(Emulation(cpu_share=cores), plan("cgroup-v1", every))


def test_adb_handshake_refused_port() -> None:
    ok, why = emulate.adb_handshake("127.0.0.1", free_port(), timeout=2)
    assert not ok and why


def test_port_taken_by_a_stranger_is_refused(tmp_path: Path, sshd_path: str) -> None:
    path = _write_fleet(tmp_path, with_adb=False)
    fleet = _load(path)
    device = fleet.devices[0]
    with socket.create_server((device.host or "", device.port or 22)):
        result = emulate.up(fleet, say=lambda line: None)
    assert not result.ok and "already in use" in result.failed[device.name]
    assert emulate.load_state(fleet.state_dir).devices == ()
    assert emulate.down(fleet, say=lambda line: None) == []


# ---------------------------------------------------------------------------- processes and the adb server


def _recorded(state: emulate.FleetState) -> list[processes.ProcessRecord]:
    recs = [rec for dev in state.devices for rec in dev.processes]
    return recs + ([state.adb_server] if state.adb_server is not None else [])


def test_down_stops_what_a_session_left_behind_and_up_follows_at_once(
    tmp_path: Path, sshd_path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without cgroups, a command that detached itself on the device and ignores SIGTERM still goes with it."""
    from devices.ssh import SSHTransport
    from tests.devices.conftest import cmdline_running, wait_for

    monkeypatch.setattr(limits, "detect", lambda *a, **k: limits.Support(reason="pretend no cgroups"))
    fleet = _load(_write_fleet(tmp_path, with_adb=False))
    tag = f"1000.{uuid.uuid4().int % 10**6}"
    try:
        assert emulate.up(fleet, say=lambda line: None).ok
        state = emulate.load_state(fleet.state_dir)
        with SSHTransport(fleet.devices[0], connect_timeout=10) as transport:
            detach = f'trap "" TERM; setsid sleep {tag} </dev/null >/dev/null 2>&1 &'
            assert transport.run(["sh", "-c", detach], timeout=30).ok
        wait_for(lambda: cmdline_running(tag))  # the detached sleep starts a moment after its shell returns
        assert emulate.down(fleet, say=lambda line: None) == []
        assert not cmdline_running(tag)  # gone (a zombie has an empty command line)
        assert not any(processes.running(rec) for rec in _recorded(state))
        # the same ports, right away
        again = emulate.up(fleet, say=lambda line: None)
        assert again.ok and again.started == (fleet.devices[0].name,), again
        # under the duty cycle, sshd's first pre-auth exchange sometimes ends early (seen 2 in ~10 runs
        # on a loaded machine, "transport shut down or saw EOF"); a device that is up answers within three tries
        rows = []
        for _ in range(3):
            rows = emulate.status(fleet, timeout=10)
            if all(row.answers for row in rows):
                break
        assert all(row.answers for row in rows), rows
    finally:
        assert emulate.down(fleet, say=lambda line: None) == []
    _assert_nothing_left(fleet, state)


_IN_CHILD = "import sys; from devices.emulation import emulate; from devices.fleetfile import load_fleet\n"


def _in_child(call: str, fleet_file: Path) -> None:
    """Run ``emulate.<call>`` in a process of its own, as the command line does (its children outlive it)."""
    code = _IN_CHILD + f"fleet = load_fleet(sys.argv[1]); result = emulate.{call}(fleet, say=lambda line: None)\n"
    code += "sys.exit(0 if (result.ok if hasattr(result, 'ok') else result == []) else 1)\n"
    proc = subprocess.run([sys.executable, "-c", code, str(fleet_file)], cwd=emulate.PACKAGE_ROOT, timeout=120)
    assert proc.returncode == 0, f"{call} failed"


def test_down_in_its_own_process_and_up_at_once_on_the_same_ports(tmp_path: Path, sshd_path: str) -> None:
    """`fleet down` from another process than `fleet up` (sshd is init's child by then), then `up` right away."""
    path = _write_fleet(tmp_path, with_adb=False)
    fleet = _load(path)
    try:
        _in_child("up", path)
        recs = _recorded(emulate.load_state(fleet.state_dir))
        assert recs and all(processes.running(rec) for rec in recs)
        _in_child("down", path)
        for rec in recs:  # gone, or a zombie that init has still to reap: nothing of it runs
            stat = processes.read_stat(rec.pid)
            assert stat is None or stat.start_time != rec.start_time or stat.state == "Z", (rec, stat)
        _in_child("up", path)
        assert all(row.answers for row in emulate.status(fleet, timeout=10))
    finally:
        emulate.down(fleet, say=lambda line: None)
    assert not (fleet.state_dir / emulate.STATE_FILE).exists()


def _adb_devices(adb_server: tuple[str, int]) -> str:
    adb, port = adb_server
    out = subprocess.run([adb, "-P", str(port), "devices"], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0 and out.stdout.startswith("List of devices attached"), out
    return out.stdout


def _recording_adb(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, adb_path: str) -> Path:
    """Put an ``adb`` first on PATH that logs every invocation and then runs the real one."""
    shim, log = tmp_path / "shim", tmp_path / "adb-calls.log"
    shim.mkdir()
    (shim / "adb").write_text(f'#!/bin/sh\necho "$@" >> {log}\nexec {adb_path} "$@"\n')
    (shim / "adb").chmod(0o755)
    monkeypatch.setenv("PATH", f"{shim}{os.pathsep}{os.environ['PATH']}")
    return log


@pytest.fixture
def users_adb_server(adb_path: str, adb_server_port: int) -> Iterator[processes.ProcessRecord]:
    """An adb server started as a user starts one (``adb start-server``: a daemon), on a test port."""
    env = {**os.environ, "ANDROID_ADB_SERVER_PORT": str(adb_server_port)}
    start = [adb_path, "-P", str(adb_server_port), "start-server"]
    subprocess.run(start, env=env, check=True, capture_output=True, timeout=30)
    listen = f"tcp:{adb_server_port}".encode()
    pid = next(
        int(entry.name)
        for entry in Path("/proc").iterdir()
        if entry.name.isdigit()
        and b"fork-server" in (argv := _cmdline(entry))
        and any(arg.endswith(listen) for arg in argv)
    )
    server = processes.record("user's adb server", pid)
    yield server
    assert processes.stop([server]) == []


def _cmdline(entry: Path) -> list[bytes]:
    try:
        return (entry / "cmdline").read_bytes().split(b"\0")
    except OSError:
        return []


def test_an_adb_server_fleetbench_did_not_start_is_reused_and_left_running(
    tmp_path: Path,
    sshd_path: str,
    adb_path: str,
    adb_server_port: int,
    users_adb_server: processes.ProcessRecord,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A user's adb server (here on a test port) survives up + down of the example fleet, untouched."""
    from tests.devices.conftest import copy_example_fleet

    calls = _recording_adb(tmp_path, monkeypatch, adb_path)
    fleet = _load(copy_example_fleet(tmp_path / "fleet"))
    phone = next(d for d in fleet.devices if d.kind == "adb")
    try:
        assert emulate.up(fleet, say=lambda line: None).ok
        state = emulate.load_state(fleet.state_dir)
        assert state.adb_server is None and state.adb_server_port == adb_server_port  # attached to, not owned
        assert f"{phone.serial}\tdevice" in _adb_devices((adb_path, adb_server_port))
    finally:
        assert emulate.down(fleet, say=lambda line: None) == []
    assert processes.running(users_adb_server)
    assert phone.serial not in _adb_devices((adb_path, adb_server_port))  # only what fleetbench did is undone
    # the adb client (whose version check restarts a server of another version) was never run
    assert not calls.exists(), calls.read_text()


def _phone_fleet(tmp_path: Path) -> Fleet:
    path = tmp_path / "fleet.yaml"
    path.write_text(
        "state_dir: state\ndevices:\n"
        f"  - name: phone-{os.getpid()}\n    kind: adb\n    serial: 127.0.0.1:{free_port()}\n"
        "    emulate: {memory_mb: 1024}\n"
    )
    return _load(path)


def test_an_adb_server_fleetbench_started_is_stopped_and_waited_for(
    tmp_path: Path, adb_path: str, adb_server_port: int
) -> None:
    fleet = _phone_fleet(tmp_path)
    try:
        assert emulate.up(fleet, say=lambda line: None).ok
        state = emulate.load_state(fleet.state_dir)
        assert state.adb_server is not None and state.adb_server_port == adb_server_port
        assert processes.running(state.adb_server)
        assert f"{fleet.devices[0].serial}\tdevice" in _adb_devices((adb_path, adb_server_port))
    finally:
        lines: list[str] = []
        with signals_sent() as sent:
            assert emulate.down(fleet, say=lines.append) == []
    assert sigkills(sent) == [], sent  # everything ended on SIGTERM: nothing waited for SIGKILL
    assert not processes.running(state.adb_server)
    assert processes.read_stat(state.adb_server.pid) is None  # our child, reaped
    # the phone's endpoint removes its pid file only when it ends through its SIGTERM handler
    assert not (fleet.state_dir / fleet.devices[0].name / "endpoint.pid").exists()
    assert not emulate._listening(adb_server_port)
    assert f"adb server on port {adb_server_port}: stopped" in lines


def test_an_adb_server_fleetbench_started_is_left_running_when_others_use_it(
    tmp_path: Path, adb_path: str, adb_server_port: int
) -> None:
    """Someone attached a phone of their own to the server `up` started: `down` leaves the server to them."""
    from devices.emulation.adb_endpoint import AdbEndpoint

    fleet = _phone_fleet(tmp_path)
    users_phone = AdbEndpoint(0, tmp_path / "users-phone").start()
    server = None
    try:
        assert emulate.up(fleet, say=lambda line: None).ok
        server = emulate.load_state(fleet.state_dir).adb_server
        assert server is not None
        serial = f"127.0.0.1:{users_phone.port}"
        connect = [adb_path, "-P", str(adb_server_port), "connect", serial]
        assert "connected" in subprocess.run(connect, capture_output=True, text=True, timeout=30).stdout
        lines: list[str] = []
        assert emulate.down(fleet, say=lines.append) == []
        assert processes.running(server)
        listing = _adb_devices((adb_path, adb_server_port))
        assert f"{serial}\tdevice" in listing and fleet.devices[0].serial not in listing
        assert any("left running" in line and serial in line for line in lines), lines
    finally:
        if server is not None:
            assert processes.stop([server]) == []
        users_phone.stop()
