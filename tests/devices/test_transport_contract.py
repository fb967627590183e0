"""The transport contract, run identically against every transport.

Local (subprocess), SSH (a real sshd on loopback) and ADB (the real adb server and the
emulated phone) must all: report exit status and output exactly, pass hostile
arguments and file names through byte-exact without running anything, move a 10 MB
file both ways intact, and stop a command at its timeout. Streamed processes
(``start``) must: exchange lines in order and byte-exact (also a 1 MB line), keep stderr
out of stdout, pass the environment, leave the process running on a read timeout, end
it at ``close`` (gone from the device afterwards), and report a process killed mid-way
with its exit status and stderr (also stderr that arrives after stdout ended).
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from devices.adb import ADBTransport
from devices.emulation.adb_endpoint import AdbEndpoint
from devices.errors import CommandTimeout, OutputTooLarge, ProcessEnded
from devices.local import LocalTransport
from devices.transport import Process, StreamingProcess, Transport

HOSTILE = [
    "two words",
    "it's",
    'say "hi"',
    "a; touch PWNED",
    "$(touch PWNED)",
    "`touch PWNED`",
    "line1\nline2; touch PWNED",
    "*",
    "$HOME ${PATH} \\ | & > PWNED < /dev/null",
    "",
    "-n",
    "ünïcødé ✓",
]
NASTY_NAME = "a b 'c' \"d\" ;e $(touch PWNED) `touch PWNED` \nf *g"
# By absolute path: the emulated phone's shell has no python3 on PATH (like a phone).
ECHO_ARGV = [sys.executable, "-c", "import sys, json; print(json.dumps(sys.argv[1:]))"]


@dataclass
class Device:
    """A transport plus a directory on its device and where that directory lies on this host."""

    transport: Transport
    remote_dir: str
    host_dir: Path
    watched: tuple[Path, ...]


@pytest.fixture(params=["local", "ssh", "adb"])
def device(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Device]:
    host_dir = tmp_path / "device"
    host_dir.mkdir()
    if request.param == "local":
        yield Device(LocalTransport(workdir=host_dir), str(host_dir), host_dir, (host_dir,))
    elif request.param == "ssh":
        transport = request.getfixturevalue("sshd_server").transport()
        yield Device(transport, str(host_dir), host_dir, (host_dir,))
    else:
        phone: AdbEndpoint = request.getfixturevalue("phone")
        name = tmp_path.name
        remote_dir = f"/data/local/tmp/{name}"
        sandbox_dir = phone.sandbox.root / "data" / "local" / "tmp" / name
        sandbox_dir.mkdir(parents=True)
        yield Device(request.getfixturevalue("adb_transport"), remote_dir, sandbox_dir, (phone.sandbox.root,))


def assert_nothing_ran(device: Device) -> None:
    for place in (*device.watched, Path.home(), Path.cwd()):
        assert not (place / "PWNED").exists(), place
    for place in device.watched:
        assert not list(place.rglob("PWNED")), place


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_is_a_transport(device: Device) -> None:
    assert isinstance(device.transport, Transport)


def test_exit_status_and_stdout_are_exact(device: Device) -> None:
    assert device.transport.run(["true"], timeout=10).rc == 0
    result = device.transport.run(["sh", "-c", "printf 'no newline'; exit 42"], timeout=10)
    assert (result.rc, result.stdout) == (42, "no newline")
    assert not result.ok


def test_hostile_arguments_arrive_byte_exact_and_nothing_runs(device: Device) -> None:
    result = device.transport.run([*ECHO_ARGV, *HOSTILE, NASTY_NAME], timeout=20)
    assert result.ok, result.stderr
    assert json.loads(result.stdout) == [*HOSTILE, NASTY_NAME]
    assert_nothing_ran(device)


def test_hostile_file_name_round_trip(device: Device, tmp_path: Path) -> None:
    src = tmp_path / "src.txt"
    src.write_bytes(b"payload\n")
    remote = f"{device.remote_dir}/{NASTY_NAME}"
    device.transport.put(src, remote)
    assert os.listdir(device.host_dir) == [NASTY_NAME]
    assert device.transport.run(["cat", "--", remote], timeout=20).stdout == "payload\n"
    device.transport.get(remote, tmp_path / "back" / NASTY_NAME)
    assert (tmp_path / "back" / NASTY_NAME).read_bytes() == b"payload\n"
    assert_nothing_ran(device)


def test_10mb_file_round_trip_checksums_match(device: Device, tmp_path: Path) -> None:
    src = tmp_path / "big.bin"
    src.write_bytes(os.urandom(10 * 1024 * 1024))
    remote = f"{device.remote_dir}/big.bin"
    device.transport.put(src, remote)
    on_device = device.transport.run(["sha256sum", remote], timeout=30).stdout.split()[0]
    assert on_device == sha256(src)
    back = tmp_path / "back.bin"
    device.transport.get(remote, back)
    assert sha256(back) == sha256(src)


def test_a_command_killed_by_a_signal_says_which(device: Device) -> None:
    rc = device.transport.run(["sh", "-c", "kill -9 $$"], timeout=10).rc
    assert rc in (-9, 128 + 9)  # a local wait gives -9; a device's shell 128 + 9


def test_timeout_stops_the_command_and_the_transport_stays_usable(device: Device) -> None:
    device.transport.run(["true"], timeout=10)  # connect outside the timed part
    start = time.monotonic()
    with pytest.raises(CommandTimeout):
        device.transport.run(["sleep", "30"], timeout=1.0)
    assert time.monotonic() - start < 10  # stopped at its timeout, not after its 30 s (slack for a loaded host)
    assert device.transport.run(["echo", "again"], timeout=10).stdout == "again\n"


@pytest.mark.parametrize("stream", ["stdout", "stderr"])
def test_a_command_that_floods_its_output_is_stopped_at_the_cap_and_the_transport_stays_usable(
    device: Device, stream: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("devices.transport.MAX_OUTPUT_BYTES", 100_000)
    redirect = "" if stream == "stdout" else " >&2"
    # a line of 100 bytes forever: a host that kept it all would never return before the timeout
    flood = f"line=$(printf '%099d' 0); while :; do echo \"$line\"{redirect}; done"
    start = time.monotonic()
    with pytest.raises(OutputTooLarge) as refused:
        device.transport.run(["sh", "-c", flood], timeout=30)
    assert time.monotonic() - start < 20
    message = str(refused.value)
    assert "'sh' wrote over 100000 bytes to its " in message and message.endswith("(stopped)") and "\n" not in message
    if not isinstance(device.transport, ADBTransport):  # adb merges the two streams into one
        assert f"to its {stream} (stopped)" in message
    assert device.transport.run(["echo", "again"], timeout=10).stdout == "again\n"
    listed = device.transport.run(["sh", "-c", "ps -eo args 2>/dev/null || ps"], timeout=10).stdout
    assert "while :; do echo" not in listed  # the flooding command was stopped


# ---------------------------------------------------------------------------- streamed processes

#: Echoes each stdin line upper-cased on stdout, says "seen" on stderr, and says its pid and $GREETING first.
ECHO_SERVER = [
    sys.executable,  # by absolute path, as ECHO_ARGV
    "-u",
    "-c",
    "import os, sys\n"
    "print(os.getpid(), os.environ.get('GREETING'))\n"
    "for line in sys.stdin:\n"
    "    print(line.rstrip('\\n').upper())\n"
    "    print('seen', len(line), file=sys.stderr)\n",
]


def running_on(device: Device, pid: str) -> bool:
    return device.transport.run(["kill", "-0", pid], timeout=10).ok


def test_streamed_process_exchanges_lines_and_keeps_stderr_apart(device: Device) -> None:
    proc = device.transport.start(ECHO_SERVER, {"GREETING": "hi there $(touch PWNED)"})
    try:
        assert isinstance(proc, Process)
        pid, greeting = proc.read_line(20).split(" ", 1)
        assert greeting == "hi there $(touch PWNED)"
        lines = ["first", "ünïcødé ✓ 'q' \"dq\" $HOME", "x" * 1_000_000]
        for line in lines:
            proc.write_line(line)
        assert [proc.read_line(20) for _ in lines] == [line.upper() for line in lines]
        assert proc.alive()
        deadline = time.monotonic() + 10
        while "seen 1000001" not in proc.stderr_tail() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert proc.stderr_tail().splitlines()[-1] == "seen 1000001"
        with pytest.raises(ValueError):
            proc.write_line("two\nlines")
    finally:
        proc.close()
    assert not proc.alive()
    assert not running_on(device, pid)
    assert_nothing_ran(device)


def test_read_timeout_leaves_the_process_running_and_close_ends_it(device: Device) -> None:
    proc = device.transport.start(ECHO_SERVER)
    pid = proc.read_line(20).split()[0]
    start = time.monotonic()
    with pytest.raises(CommandTimeout):
        proc.read_line(0.5)
    assert 0.5 <= time.monotonic() - start < 10  # it waited for its timeout, and returned (slack for a loaded host)
    assert proc.alive() and running_on(device, pid)
    proc.write_line("still there")
    assert proc.read_line(20) == "STILL THERE"
    proc.close(grace=0.5)
    assert not running_on(device, pid)
    with pytest.raises(ProcessEnded):
        proc.read_line(1)


def test_a_process_killed_midway_is_ended_with_its_status_and_stderr(device: Device) -> None:
    script = (
        "import os, signal, sys; print('about to die', flush=True); print('last words', file=sys.stderr, flush=True); "
        "sys.stdout.write('partial'); sys.stdout.flush(); os.kill(os.getpid(), signal.SIGKILL)"
    )
    proc = device.transport.start([sys.executable, "-c", script])
    try:
        assert proc.read_line(20) == "about to die"
        with pytest.raises(ProcessEnded) as ended:
            proc.read_line(20)  # the unterminated "partial" is never handed out as a line
        assert ended.value.returncode not in (None, 0)
        assert "last words" in ended.value.stderr and "last words" in str(ended.value)
        with pytest.raises(ProcessEnded):
            proc.read_line(1)  # stays ended
        with pytest.raises(ProcessEnded):
            proc.write_line("anyone?")
        assert not proc.alive()
    finally:
        proc.close()


class _LateStderrProcess(StreamingProcess):
    """Stdout ends at once; stderr's last words arrive a moment later (as over an SSH channel)."""

    def __init__(self, stderr_delay: float) -> None:
        out = iter([b"hello\n", b""])
        err = iter([b"last words", b""])

        def recv_err(_size: int) -> bytes:
            time.sleep(stderr_delay)
            return next(err)

        super().__init__("late-stderr", lambda _data: None, lambda _size: next(out), recv_err)

    def _alive(self) -> bool:
        return False

    def _returncode(self) -> int | None:
        return -9

    def _terminate(self, grace: float) -> None:
        pass


def test_an_ended_process_quotes_stderr_that_arrives_after_its_output_ended() -> None:
    proc = _LateStderrProcess(stderr_delay=0.3)
    assert proc.read_line(5) == "hello"
    with pytest.raises(ProcessEnded) as ended:
        proc.read_line(5)
    assert ended.value.stderr == "last words" and "stderr: last words" in str(ended.value)
    proc.close()


class _ChattyProcess(StreamingProcess):
    """Stdout: ``chunks`` kB of a line that does not end (an overlong line), then a newline and a short line."""

    def __init__(self, chunks: int) -> None:
        out = itertools.chain(itertools.repeat(b"x" * 1000, chunks), [b"\nshort\n", b""])

        def recv_out(_size: int) -> bytes:
            return next(out)

        super().__init__("chatty", lambda _data: None, recv_out, None)

    def _alive(self) -> bool:
        return False

    def _returncode(self) -> int | None:
        return 0

    def _terminate(self, grace: float) -> None:
        pass


def test_an_overlong_line_is_cut_just_over_the_cap_and_the_next_line_arrives(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("devices.transport.MAX_LINE_BYTES", 5000)
    # 200 MB before the newline: kept are 5001 bytes (a reader that kept them all would not be done in time)
    proc = _ChattyProcess(chunks=200_000)
    assert proc.read_line(20) == "x" * 5001
    assert proc.read_line(5) == "short"
    proc.close()
