"""The emulated phone's ADB wire protocol, spoken raw (no adb binary needed)."""

from __future__ import annotations

import os
import signal
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from devices.emulation.adb_endpoint import (
    A_CLSE,
    A_CNXN,
    A_OKAY,
    A_OPEN,
    A_VERSION_MIN,
    A_VERSION_SKIP_CHECKSUM,
    A_WRTE,
    HEADER,
    AdbEndpoint,
    Message,
    ProtocolError,
    Sandbox,
    checksum,
    decode_header,
    encode_message,
    iter_messages,
)
from devices.emulation.sshd import free_port
from tests.devices.conftest import listen_addresses

REPO = Path(__file__).resolve().parents[3]


class RawHost:
    """A minimal adb host speaking the wire protocol over one socket."""

    def __init__(self, port: int, version: int = A_VERSION_SKIP_CHECKSUM) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=5)
        self.version = version

    def send(self, command: int, arg0: int, arg1: int, payload: bytes = b"") -> None:
        self.sock.sendall(encode_message(Message(command, arg0, arg1, payload)))

    def recv(self) -> Message:
        header = self._exact(HEADER.size)
        command, arg0, arg1, length, check = decode_header(header)
        payload = self._exact(length)
        if self.version < A_VERSION_SKIP_CHECKSUM:
            assert check == checksum(payload)
        return Message(command, arg0, arg1, payload)

    def _exact(self, n: int) -> bytes:
        data = b""
        while len(data) < n:
            chunk = self.sock.recv(n - len(data))
            if not chunk:
                raise EOFError
            data += chunk
        return data

    def connect(self) -> Message:
        self.send(A_CNXN, self.version, 1024 * 1024, b"host::features=\0")
        return self.recv()

    def shell(self, command: str, local_id: int = 7) -> bytes:
        """Open ``shell:command``, acknowledge every WRTE, return the output."""
        self.send(A_OPEN, local_id, 0, f"shell:{command}\0".encode())
        okay = self.recv()
        assert (okay.command, okay.arg1) == (A_OKAY, local_id)
        out = b""
        while True:
            msg = self.recv()
            if msg.command == A_CLSE:
                return out
            assert msg.command == A_WRTE and msg.arg1 == local_id
            out += msg.payload
            self.send(A_OKAY, local_id, msg.arg0)

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def endpoint(tmp_path: Path) -> Iterator[AdbEndpoint]:
    ep = AdbEndpoint(0, tmp_path / "phone").start()
    yield ep
    ep.stop()
    assert ep.running() == []


def test_header_round_trip_and_checksum() -> None:
    msg = Message(A_WRTE, 3, 9, b"hello")
    data = encode_message(msg)
    assert len(data) == 24 + 5
    command, arg0, arg1, length, check, magic = struct.unpack("<6I", data[:24])
    assert data[:4] == b"WRTE" and (arg0, arg1, length) == (3, 9, 5)
    assert check == sum(b"hello") == checksum(b"hello")
    assert magic == command ^ 0xFFFFFFFF
    assert list(iter_messages(data + encode_message(Message(A_OKAY, 1, 2)))) == [msg, Message(A_OKAY, 1, 2)]
    assert checksum(b"\xff" * 2**24 + b"\x01") == (255 * 2**24 + 1) & 0xFFFFFFFF


@pytest.mark.parametrize(
    "header, why",
    [
        (struct.pack("<6I", A_OKAY, 0, 0, 0, 0, 0), "bad magic"),
        (struct.pack("<6I", 0x41414141, 0, 0, 0, 0, 0x41414141 ^ 0xFFFFFFFF), "unknown command"),
        (struct.pack("<6I", A_WRTE, 0, 0, 1 << 30, 0, A_WRTE ^ 0xFFFFFFFF), "too large"),
        (b"short", "short header"),
    ],
)
def test_decode_rejects_malformed(header: bytes, why: str) -> None:
    with pytest.raises(ProtocolError, match=why):
        decode_header(header)


def test_sandbox_mapping(tmp_path: Path) -> None:
    box = Sandbox(tmp_path / "s")
    assert box.host_path("/data/local/tmp/x") == box.root / "data/local/tmp/x"
    assert box.host_path("rel/f") == box.root / "rel/f"
    assert box.host_path("/proc/cpuinfo") == Path("/proc/cpuinfo")
    for bad in ("/etc/passwd", "/data/../etc/passwd", "../x"):
        with pytest.raises(PermissionError):
            box.host_path(bad)
    with pytest.raises(PermissionError):
        box.host_path("/proc/x", write=True)
    assert box.shell_command("cat /data/a '/sdcard/b' /database x=/data") == (
        f"cat {box.root}/data/a '{box.root}/sdcard/b' /database x={box.root}/data"
    )
    with pytest.raises(ValueError):
        Sandbox(tmp_path / "has space")


@pytest.mark.parametrize("version", [A_VERSION_MIN, A_VERSION_SKIP_CHECKSUM])
def test_handshake_and_shell(endpoint: AdbEndpoint, version: int) -> None:
    host = RawHost(endpoint.port, version)
    try:
        cnxn = host.connect()
        assert cnxn.command == A_CNXN and cnxn.arg0 == A_VERSION_SKIP_CHECKSUM
        assert cnxn.arg1 == 256 * 1024  # maxdata negotiated down from 1 MiB
        banner = cnxn.payload.decode()
        assert banner.startswith("device::") and "ro.product.model=emulated" in banner
        assert "shell_v2" not in banner  # not implemented, so never advertised
        assert host.shell("echo out; echo err >&2; pwd") == f"out\nerr\n{endpoint.sandbox.root}\n".encode()
        # Output larger than maxdata arrives in several WRTEs, each waiting for our OKAY.
        assert host.shell("head -c 600000 /dev/zero", local_id=8) == b"\0" * 600000
        assert host.shell("getprop ro.product.model; getprop ro.product.cpu.abi", 9).split(b"\n")[0] == b"emulated"
    finally:
        host.close()


def test_many_streams_at_once(endpoint: AdbEndpoint) -> None:
    host = RawHost(endpoint.port)
    try:
        host.connect()
        for sid in (1, 2, 3):
            host.send(A_OPEN, sid, 0, f"shell:sleep 0.2; echo s{sid}\0".encode())
        outputs: dict[int, bytes] = {1: b"", 2: b"", 3: b""}
        closed: set[int] = set()
        while closed != {1, 2, 3}:
            msg = host.recv()
            if msg.command == A_WRTE:
                outputs[msg.arg1] += msg.payload
                host.send(A_OKAY, msg.arg1, msg.arg0)
            elif msg.command == A_CLSE:
                closed.add(msg.arg1)
        assert outputs == {1: b"s1\n", 2: b"s2\n", 3: b"s3\n"}
    finally:
        host.close()


def test_bad_checksum_under_protocol_v1_drops_the_connection(endpoint: AdbEndpoint) -> None:
    host = RawHost(endpoint.port, A_VERSION_MIN)
    try:
        host.connect()
        payload = b"shell:echo hi\0"
        header = struct.pack("<6I", A_OPEN, 1, 0, len(payload), checksum(payload) + 1, A_OPEN ^ 0xFFFFFFFF)
        host.sock.sendall(header + payload)
        with pytest.raises((EOFError, ConnectionResetError)):
            host.recv()
    finally:
        host.close()


def test_unknown_service_is_refused(endpoint: AdbEndpoint) -> None:
    host = RawHost(endpoint.port)
    try:
        host.connect()
        host.send(A_OPEN, 5, 0, b"reboot:\0")
        msg = host.recv()
        assert (msg.command, msg.arg0, msg.arg1) == (A_CLSE, 0, 5)
    finally:
        host.close()


def test_malformed_packet_drops_only_that_connection(endpoint: AdbEndpoint) -> None:
    bad = RawHost(endpoint.port)
    bad.connect()
    bad.sock.sendall(b"\x00" * 24)  # magic does not match
    with pytest.raises((EOFError, ConnectionResetError)):
        bad.recv()
    bad.close()
    good = RawHost(endpoint.port)
    try:
        assert good.connect().command == A_CNXN
    finally:
        good.close()


def test_closing_the_stream_kills_the_command(endpoint: AdbEndpoint) -> None:
    host = RawHost(endpoint.port)
    try:
        host.connect()
        host.send(A_OPEN, 4, 0, b"shell:sleep 30\0")
        okay = host.recv()
        deadline = time.monotonic() + 5
        while not endpoint.running() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert endpoint.running()
        host.send(A_CLSE, 4, okay.arg0)
        while endpoint.running() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert endpoint.running() == []
    finally:
        host.close()


def test_command_line_entry_point(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    pidfile = tmp_path / "pid"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "devices.emulation.adb_endpoint",
            "--port",
            str(port),
            "--sandbox",
            str(tmp_path / "phone"),
            "--pidfile",
            str(pidfile),
        ],
        cwd=REPO,
    )
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                host = RawHost(port)
                break
            except OSError:
                assert time.monotonic() < deadline and proc.poll() is None
                time.sleep(0.05)
        try:
            host.connect()
            assert host.shell("echo $PPID") == f"{proc.pid}\n".encode()  # a child of the endpoint
        finally:
            host.close()
        assert pidfile.read_text().strip() == str(proc.pid)
        os.kill(proc.pid, signal.SIGTERM)
        assert proc.wait(timeout=10) == 0
        assert not pidfile.exists()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_the_endpoint_listens_on_loopback_only(endpoint: AdbEndpoint) -> None:
    assert listen_addresses(endpoint.port) == {"127.0.0.1"}


def test_the_endpoint_process_fleet_up_starts_listens_on_loopback_only(tmp_path: Path) -> None:
    port = free_port()
    log = tmp_path / "endpoint.log"
    with log.open("wb") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "devices.emulation.adb_endpoint", "--port", str(port), "--sandbox", str(tmp_path)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=err,
            start_new_session=True,
            cwd=REPO,
        )
    try:
        deadline = time.monotonic() + 20
        while not listen_addresses(port) and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert listen_addresses(port) == {"127.0.0.1"}, log.read_text()
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def test_an_aarch64_phones_commands_run_on_the_emulated_boards_processor(tmp_path: Path) -> None:
    from devices.emulation.adb_endpoint import Sandbox
    from devices.emulation.qemu import GUEST_CPU

    tree = tmp_path / "tree"
    (tree / "bin").mkdir(parents=True)
    (tree / "bin" / "sh").touch()
    env = Sandbox(tmp_path / "phone", arch="aarch64", tree=tree, props=None).environment()
    assert (env["QEMU_LD_PREFIX"], env["QEMU_CPU"]) == (str(tree), GUEST_CPU)
    assert "QEMU_CPU" not in Sandbox(tmp_path / "x86").environment()  # the host's own processor
