"""run_on_fleet: per-device results, failures kept apart, fleet order."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from devices.connect import connect
from devices.emulation import sshd
from devices.errors import Unreachable
from devices.fleet import Device
from devices.group import DeviceFailure, FleetResult, run_on_fleet
from devices.local import LocalTransport
from devices.ssh import SSHTransport
from tests.devices.sshd_server import Server


def test_failures_do_not_stop_others_and_order_is_kept() -> None:
    devices = [Device(name=n, kind="local") for n in ("c", "a", "b", "d")]

    def action(device: Device) -> str:
        if device.name == "a":
            raise Unreachable("a: no route")
        if device.name == "d":
            raise KeyError("boom")
        time.sleep(0.05 if device.name == "c" else 0)
        return device.name.upper()

    result = run_on_fleet(devices, action, max_workers=4)
    assert list(result.successes) == ["c", "b"] and result.successes["b"] == "B"
    assert list(result.failures) == ["a", "d"]
    assert result.failures["a"] == DeviceFailure("unreachable", "a: no route")
    assert result.failures["d"].kind == "runner error"
    assert not result.ok


def test_fleet_timeout_marks_slow_devices() -> None:
    release = threading.Event()
    devices = [Device(name="fast", kind="local"), Device(name="slow", kind="local")]

    def action(device: Device) -> int:
        if device.name == "slow":
            release.wait(5)
        return 1

    result = run_on_fleet(devices, action, timeout=0.3)
    release.set()
    assert result.successes == {"fast": 1}
    assert result.failures["slow"].kind == "timeout"


def test_connect_picks_transport(tmp_path: Path) -> None:
    assert isinstance(connect(Device(name="l", kind="local")), LocalTransport)
    ssh = connect(Device(name="s", kind="ssh", host="127.0.0.1", port=2222, known_hosts=tmp_path / "kh"))
    assert isinstance(ssh, SSHTransport) and ssh.port == 2222


def test_dead_and_good_ssh_devices(sshd_server: Server) -> None:
    good = Device(
        name="good",
        kind="ssh",
        host="127.0.0.1",
        port=sshd_server.instance.port,
        key_file=sshd_server.instance.user_key,
        known_hosts=sshd_server.known_hosts,
    )
    dead = Device(name="dead", kind="ssh", host="127.0.0.1", port=sshd.free_port(), known_hosts=sshd_server.known_hosts)

    def uname(device: Device) -> str:
        transport = connect(device, connect_timeout=3)
        try:
            return transport.run(["echo", device.name], timeout=10).stdout.strip()
        finally:
            transport.close()

    result: FleetResult[str] = run_on_fleet([dead, good], uname)
    assert result.successes == {"good": "good"}
    assert list(result.failures) == ["dead"] and result.failures["dead"].kind == "unreachable"
