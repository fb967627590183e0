"""ADBTransport against the real adb server and the emulated phone.

The adb server runs on its own free port (never the user's 5037) for this module and
is killed at teardown; the test checks that nothing listens there afterwards.
"""

from __future__ import annotations

import hashlib
import os
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest
from adbutils.errors import AdbError

from devices.adb import ADBTransport, parse_output, wrap_command
from devices.emulation.adb_endpoint import AdbEndpoint
from devices.emulation.sshd import free_port
from devices.errors import CommandTimeout, ConnectionLost, TransportError, Unreachable
from devices.fleet import Device
from tests.devices.conftest import listening


@pytest.fixture
def transport(adb_transport: ADBTransport) -> ADBTransport:
    return adb_transport


def adb(adb_server: tuple[str, int], *args: str, serial: str | None = None) -> str:
    path, port = adb_server
    argv = [path, "-P", str(port), *(["-s", serial] if serial else []), *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=30, check=True).stdout


def test_marker_parsing() -> None:
    assert parse_output(b"out\n__fleetbench_rc=3\n") == (3, b"out")
    assert parse_output(b"x\n__fleetbench_rc=1\n\n__fleetbench_rc=0\n") == (0, b"x\n__fleetbench_rc=1\n")
    with pytest.raises(ConnectionLost):
        parse_output(b"partial output")
    assert wrap_command(["a b"]).startswith("'a b' </dev/null; printf")


def test_adb_cli_sees_a_device(adb_server: tuple[str, int], phone: AdbEndpoint, tmp_path: Path) -> None:
    serial = f"127.0.0.1:{phone.port}"
    assert "connected to" in adb(adb_server, "connect", serial)
    deadline = time.monotonic() + 10
    while f"{serial}\tdevice" not in (listing := adb(adb_server, "devices")) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert f"{serial}\tdevice" in listing
    assert adb(adb_server, "shell", "echo", "hi", serial=serial) == "hi\n"
    assert adb(adb_server, "shell", "getprop", "ro.product.model", serial=serial) == "emulated\n"
    src = tmp_path / "small"
    src.write_bytes(b"abc" * 1000)
    adb(adb_server, "push", str(src), "/data/local/tmp/cli/small", serial=serial)
    adb(adb_server, "pull", "/data/local/tmp/cli/small", str(tmp_path / "back"), serial=serial)
    assert (tmp_path / "back").read_bytes() == src.read_bytes()
    assert "small" in adb(adb_server, "ls", "/data/local/tmp/cli", serial=serial)


def test_run_exit_status_and_output(transport: ADBTransport) -> None:
    assert transport.run(["true"], 10).rc == 0
    result = transport.run(["sh", "-c", "printf 'no newline'; exit 42"], 10)
    assert (result.rc, result.stdout, result.stderr) == (42, "no newline", "")
    merged = transport.run(["sh", "-c", "echo out; echo err >&2"], 10)
    assert merged.stdout == "out\nerr\n"  # the legacy shell merges the streams
    assert transport.run(["cat", "/proc/loadavg"], 10).stdout.count(" ") == 4  # the host's /proc


def test_put_get_round_trip_10mb(transport: ADBTransport, tmp_path: Path) -> None:
    src = tmp_path / "big.bin"
    src.write_bytes(os.urandom(10 * 1024 * 1024))
    transport.put(src, "/data/local/tmp/fb/big.bin")
    sha = transport.run(["sha256sum", "/data/local/tmp/fb/big.bin"], 30).stdout.split()[0]
    assert sha == hashlib.sha256(src.read_bytes()).hexdigest()
    assert transport.run(["mkdir", "-p", "/data/local/tmp/fb2"], 10).ok
    transport.put(src, "/data/local/tmp/fb2/")  # into a directory, keeping the name
    assert transport.run(["cmp", "/data/local/tmp/fb2/big.bin", "/data/local/tmp/fb/big.bin"], 30).ok
    back = tmp_path / "back.bin"
    transport.get("/data/local/tmp/fb/big.bin", back)
    assert hashlib.sha256(back.read_bytes()).hexdigest() == sha
    with pytest.raises(TransportError, match="no such file"):
        transport.get("/data/local/tmp/fb/missing", tmp_path / "missing")
    assert not list(tmp_path.glob("*missing*"))  # neither the file nor a temporary beside it


def test_connections_to_the_adb_server_send_small_packets_at_once(transport: ADBTransport) -> None:
    # a sync request is several small writes before a read: Nagle would hold each behind a delayed ACK
    connection = transport._client().make_connection()
    try:
        assert connection.conn.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0
    finally:
        connection.close()


def test_timeout_stops_the_command(transport: ADBTransport, phone: AdbEndpoint) -> None:
    start = time.monotonic()
    with pytest.raises(CommandTimeout):
        transport.run(["sleep", "30"], timeout=1.0)
    assert time.monotonic() - start < 10  # stopped at its timeout, not after its 30 s (slack for a loaded host)
    deadline = time.monotonic() + 5
    while phone.running() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert phone.running() == []


def test_command_killed_midway_is_a_clear_error(transport: ADBTransport, phone: AdbEndpoint) -> None:
    errors: list[BaseException] = []

    def target() -> None:
        try:
            transport.run(["sleep", "30"], timeout=20)
        except BaseException as exc:  # noqa: BLE001 - handed to the test thread
            errors.append(exc)

    thread = threading.Thread(target=target)
    thread.start()
    deadline = time.monotonic() + 5
    while not phone.running() and time.monotonic() < deadline:
        time.sleep(0.05)
    (pid,) = phone.running()
    os.killpg(pid, signal.SIGKILL)
    thread.join(timeout=5)
    assert not thread.is_alive()
    assert len(errors) == 1 and isinstance(errors[0], ConnectionLost)
    assert "without reporting an exit status" in str(errors[0])


def test_stopped_endpoint_is_unreachable(adb_server: tuple[str, int], tmp_path: Path) -> None:
    endpoint = AdbEndpoint(0, tmp_path / "gone").start()
    device = Device(name="phone", kind="adb", serial=f"127.0.0.1:{endpoint.port}")
    t = ADBTransport.from_device(device, server_port=adb_server[1])
    t.connect_timeout = 3.0
    try:
        assert t.run(["echo", "up"], 10).stdout == "up\n"
    finally:
        endpoint.stop()
    start = time.monotonic()
    with pytest.raises(Unreachable):
        t.run(["echo", "up"], 10)
    assert time.monotonic() - start < 5


def test_no_adb_server_is_unreachable_and_none_is_started() -> None:
    port = free_port()
    with pytest.raises(Unreachable, match="no adb server"):
        ADBTransport("127.0.0.1:1", server_port=port).run(["true"], 5)
    assert not listening(port)


def test_a_server_gone_after_connecting_is_an_error_and_none_is_started(
    adb_path: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """adbutils runs ``adb start-server`` when a connection fails; the transport's connections never do."""
    from devices import processes
    from devices.emulation import emulate

    port = free_port()
    calls = tmp_path / "adb-calls.log"
    shim = tmp_path / "adb"
    shim.write_text(f'#!/bin/sh\necho "$@" >> {calls}\nexec {adb_path} "$@"\n')
    shim.chmod(0o755)
    monkeypatch.setenv("ADBUTILS_ADB_PATH", str(shim))  # the adb adbutils would run
    monkeypatch.setenv("ANDROID_ADB_SERVER_PORT", str(port))  # and the port it would start it on
    server = emulate.start_adb_server(port, tmp_path / "adb-server.log")
    endpoint = AdbEndpoint(0, tmp_path / "phone").start()
    try:
        t = ADBTransport(f"127.0.0.1:{endpoint.port}", server_port=port)
        assert t.run(["echo", "up"], 10).stdout == "up\n"
        device = t.device()
        assert processes.stop([server]) == []
        # refused, or reset when the connection races the server's exit: an error either way
        with pytest.raises((AdbError, OSError)):
            device.get_state()
        with pytest.raises(Unreachable, match="no adb server"):
            t.run(["echo", "up"], 10)
    finally:
        processes.stop([server])
        endpoint.stop()
    assert not calls.exists()
    assert not listening(port)
