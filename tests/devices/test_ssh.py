"""SSHTransport and devices.emulation.sshd against a real OpenSSH sshd on a loopback port."""

from __future__ import annotations

import hashlib
import os
import signal
import socket
import threading
import time
import uuid
from pathlib import Path

import pytest

from devices import processes
from devices.emulation import sshd
from devices.errors import (
    AuthenticationFailed,
    CommandTimeout,
    ConnectionLost,
    HostKeyRejected,
    TransportError,
    Unreachable,
)
from devices.ssh import LOGIN_ATTEMPTS, SSHTransport
from tests.devices.conftest import cmdline_running, wait_for
from tests.devices.sshd_server import LoginCutter, Server


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_run_returns_rc_stdout_stderr(sshd_server: Server) -> None:
    t = sshd_server.transport()
    r = t.run(["sh", "-c", "echo out; echo err >&2; exit 3"], timeout=10)
    assert (r.rc, r.stdout, r.stderr) == (3, "out\n", "err\n")
    assert t.run(["true"], timeout=10).ok


def test_put_get_10mb_round_trip(sshd_server: Server, tmp_path: Path) -> None:
    t = sshd_server.transport()
    src = tmp_path / "src.bin"
    src.write_bytes(os.urandom(10 * 1024 * 1024))
    remote = str(tmp_path / "remote" / "deep" / "dst.bin")
    t.put(src, remote)
    assert sha256(Path(remote)) == sha256(src)
    assert [p.name for p in Path(remote).parent.iterdir()] == ["dst.bin"]  # no temporary left
    back = tmp_path / "back" / "back.bin"
    t.get(remote, back)
    assert sha256(back) == sha256(src) and [p.name for p in back.parent.iterdir()] == ["back.bin"]
    with pytest.raises(FileNotFoundError):
        t.get(str(tmp_path / "absent"), tmp_path / "x")
    assert not list(tmp_path.glob("*x*"))  # neither the file nor a temporary beside it


def test_the_connection_sends_small_packets_at_once(sshd_server: Server) -> None:
    # Nagle's algorithm holds an SFTP request behind the server's delayed ACK (~40 ms)
    t = sshd_server.transport()
    t.connect()
    assert t._client is not None
    sock = t._client.get_transport().sock  # type: ignore[union-attr]
    assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0
    sshd_server.restart()
    t.run(["true"], timeout=10)  # reconnects
    sock = t._client.get_transport().sock  # type: ignore[union-attr]
    assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0


def test_tilde_is_remote_home(sshd_server: Server, tmp_path: Path) -> None:
    t = sshd_server.transport()
    name = f".fleetbench-test-{uuid.uuid4().hex[:8]}"
    src = tmp_path / "small.txt"
    src.write_text("hello")
    try:
        t.put(src, f"~/{name}/a.txt")
        assert (Path.home() / name / "a.txt").read_text() == "hello"
        t.get(f"~/{name}/a.txt", tmp_path / "b.txt")
        assert (tmp_path / "b.txt").read_text() == "hello"
    finally:
        t.run(["rm", "-rf", str(Path.home() / name)], timeout=10)


def test_large_stdout_and_stderr_do_not_deadlock(sshd_server: Server) -> None:
    n = 12 * 1024 * 1024
    code = f"import sys\nfor _ in range(12): sys.stdout.write('o'*{n // 12}); sys.stderr.write('e'*{n // 12})"
    r = sshd_server.transport().run(["python3", "-c", code], timeout=30)
    assert r.ok
    assert len(r.stdout) == n and len(r.stderr) == n
    assert set(r.stdout) == {"o"} and set(r.stderr) == {"e"}


def test_timeout_raises_within_limit_and_kills_remote_command(sshd_server: Server) -> None:
    t = sshd_server.transport()
    t.run(["true"], timeout=10)  # connect outside the timed part
    marker = f"{1000 + time.time() % 1000:.6f}"
    start = time.monotonic()
    with pytest.raises(CommandTimeout, match="within 1 s"):
        t.run(["sleep", f"{marker}9"], timeout=1.0)
    assert time.monotonic() - start < 10  # stopped at its timeout, not after the sleep (slack for a loaded host)
    wait_for(lambda: not cmdline_running(f"{marker}9"), 2.0)
    assert t.run(["echo", "again"], timeout=10).stdout == "again\n"  # the connection is still usable


def test_remote_command_killed_gives_nonzero_rc(sshd_server: Server) -> None:
    r = sshd_server.transport().run(["sh", "-c", "kill -9 $$"], timeout=10)
    assert not r.ok


def test_device_killed_mid_command_is_a_clear_error(sshd_server: Server) -> None:
    t = sshd_server.transport()
    t.run(["true"], timeout=10)
    before = set(processes.descendants(sshd_server.pid, processes.process_parents())[1:])
    outcome: list[BaseException] = []

    marker = f"{1000 + time.time() % 1000:.6f}8"

    def call() -> None:
        try:
            t.run(["sleep", marker], timeout=8)
        except BaseException as exc:
            outcome.append(exc)

    start = time.monotonic()
    worker = threading.Thread(target=call)
    worker.start()
    wait_for(lambda: cmdline_running(marker))  # the remote command has started
    # kill this connection's sshd processes (the "device" dies; the listener stays)
    for pid in before:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    worker.join(10)
    assert not worker.is_alive()
    assert time.monotonic() - start < 8
    assert len(outcome) == 1 and isinstance(outcome[0], ConnectionLost), outcome
    assert "connection dropped" in str(outcome[0])
    # the orphaned command is the test's to clean up (a dead device's processes die with it)
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if marker.encode() in (entry / "cmdline").read_bytes():
                    os.kill(int(entry.name), signal.SIGKILL)
            except OSError:
                continue


def test_reconnects_once_after_sshd_restart(sshd_server: Server) -> None:
    t = sshd_server.transport()
    assert t.run(["echo", "1"], timeout=10).stdout == "1\n"
    sshd_server.restart()  # kills every session of the old listener
    assert t.run(["echo", "2"], timeout=10).stdout == "2\n"


def test_dropped_connection_and_server_gone_is_connection_lost(sshd_path: str, tmp_path: Path) -> None:
    srv = Server.launch(tmp_path, "gone")
    t = srv.transport()
    t.run(["true"], timeout=10)
    srv.stop()  # the listener and this connection's session go away
    with pytest.raises(ConnectionLost, match="reconnect failed"):
        t.run(["true"], timeout=10)


def test_unknown_host_key_refused_without_tofu(sshd_server: Server, tmp_path: Path) -> None:
    empty = tmp_path / "known_hosts"
    with pytest.raises(HostKeyRejected) as info:
        sshd_server.transport(known_hosts=empty).run(["true"], timeout=10)
    assert f"[127.0.0.1]:{sshd_server.instance.port}" in str(info.value)
    assert str(empty) in str(info.value)
    assert not empty.exists()


def test_unknown_host_key_accepted_and_recorded_with_tofu(sshd_server: Server, tmp_path: Path) -> None:
    known = tmp_path / "kh" / "known_hosts"
    assert sshd_server.transport(known_hosts=known, trust_on_first_use=True).run(["true"], timeout=10).ok
    assert known.read_text().strip() == sshd.known_hosts_line(sshd_server.instance)
    assert sshd_server.transport(known_hosts=known).run(["true"], timeout=10).ok  # now known, no TOFU needed


def test_changed_host_key_refused_even_with_tofu(sshd_path: str, tmp_path: Path) -> None:
    srv = Server.launch(tmp_path, "changed")
    try:
        assert srv.transport().run(["true"], timeout=10).ok
        srv.stop()
        sshd.generate_key(srv.instance.host_key, overwrite=True)
        srv.listener = sshd.start(srv.instance)
        for tofu in (False, True):
            with pytest.raises(HostKeyRejected, match="CHANGED"):
                srv.transport(trust_on_first_use=tofu).run(["true"], timeout=10)
        assert sshd.known_hosts_line(srv.instance) not in srv.known_hosts.read_text()
    finally:
        srv.shutdown()


def test_wrong_user_key_is_authentication_failed(sshd_server: Server, tmp_path: Path) -> None:
    other = sshd.generate_key(tmp_path / "other_key")
    with pytest.raises(AuthenticationFailed):
        sshd_server.transport(key_file=other).run(["true"], timeout=10)
    with pytest.raises(AuthenticationFailed, match="does not exist"):
        sshd_server.transport(key_file=tmp_path / "missing").run(["true"], timeout=10)


def test_a_login_closed_during_authentication_is_tried_again(sshd_server: Server, tmp_path: Path) -> None:
    cutter = LoginCutter(sshd_server, cuts=LOGIN_ATTEMPTS - 1, state_dir=tmp_path)
    try:
        result = cutter.transport().run(["echo", "in"], timeout=10)
        assert (result.rc, result.stdout) == (0, "in\n")
        assert cutter.connections == LOGIN_ATTEMPTS  # the cut logins, then the one relayed to sshd
    finally:
        cutter.close()


def test_a_login_closed_every_time_is_authentication_failed_after_the_attempts(
    sshd_server: Server, tmp_path: Path
) -> None:
    cutter = LoginCutter(sshd_server, cuts=LOGIN_ATTEMPTS + 1, state_dir=tmp_path)
    try:
        with pytest.raises(AuthenticationFailed, match=f"saw EOF \\(after {LOGIN_ATTEMPTS} attempts\\)"):
            cutter.transport().run(["true"], timeout=10)
        assert cutter.connections == LOGIN_ATTEMPTS
    finally:
        cutter.close()


def test_closed_port_is_unreachable(tmp_path: Path) -> None:
    t = SSHTransport(host="127.0.0.1", port=sshd.free_port(), key_file=None, known_hosts=tmp_path / "kh")
    start = time.monotonic()
    with pytest.raises(Unreachable) as info:
        t.run(["true"], timeout=5)
    assert time.monotonic() - start < 5
    assert info.value.kind == "unreachable"
    assert isinstance(info.value, TransportError)


def test_known_hosts_file_replaces_entries_of_same_host(tmp_path: Path) -> None:
    path = tmp_path / "known_hosts"
    path.write_text("# comment\n[127.0.0.1]:2222 ssh-rsa OLD\nother.host ssh-ed25519 KEEP\n")
    sshd.write_known_hosts(path, ["[127.0.0.1]:2222 ssh-ed25519 NEW"])
    assert path.read_text() == "# comment\nother.host ssh-ed25519 KEEP\n[127.0.0.1]:2222 ssh-ed25519 NEW\n"


def test_prepare_rejects_invalid_config(sshd_path: str, tmp_path: Path) -> None:
    with pytest.raises(sshd.SshdError, match="sshd rejected"):
        sshd.prepare(tmp_path, "bad", 99999)
