r"""`ADBTransport`: run commands on and copy files to an Android device through adb.

Everything goes through the real ``adb`` server (via adbutils), on the port given to
the constructor or in ``ANDROID_ADB_SERVER_PORT`` (default 5037). The server is never
started here: adbutils would otherwise run ``adb start-server`` on the default port
when it finds none, so a missing server is reported as `Unreachable` instead.

Exit status and output streams
------------------------------
Commands use the *legacy* ``shell:`` service, which works with every adbd (and with
the emulated phone of `devices.emulation.adb_endpoint`). That service returns neither the exit
status nor separate streams, so:

* the command line is ``quote_argv(argv) </dev/null; printf '\\n__fleetbench_rc=%d\\n' "$?"``
  and the exit status is parsed from that last marker line (which is removed, so
  stdout is byte-exact). A command whose shell dies before printing the marker
  (killed mid-way, device gone) raises `ConnectionLost`. Killed by a signal, the
  shell reports ``128 + signal`` -- that is the ``rc`` we return.
* stdout and stderr arrive merged, in ``RunResult.stdout``; ``stderr`` is always
  ``""``. (With the ``shell_v2`` feature adb would give both natively; we do not
  depend on it.)
* stdin is ``/dev/null``, so a command waiting for input ends instead of hanging.

Streamed processes
------------------
`ADBTransport.start` opens the ``exec:`` service (every adbd since Android 5; raw, never a
pty, binary-safe both ways) instead of ``shell:``. Like the legacy shell it merges stdout
and stderr and reports no exit status, so the command line is::

    exec 2>ERRFILE; sh -c 'echo TAG$$; exec ARGV'; printf '__fleetbench_rc_NONCE=%d\\n' "$?"

Both shells' stderr and the command's go to ``ERRFILE`` under ``/data/local/tmp`` (read
with ``tail`` for `ADBProcess.stderr_tail`, removed at close), so stdout carries the
process's lines only (a shell's "Killed" notice would otherwise land there too); the inner
shell prints its pid on a tagged first line (the pid ``ARGV`` keeps after ``exec``), and
the outer shell's marker line gives the exit status (``128 + signal`` when killed).
Closing the stream cannot signal the end of stdin (adb streams have no half-close), so
`ADBProcess.close` kills the pid through a second shell, closes the stream and waits
until ``kill -0`` no longer finds the process.

Talking to the server itself
----------------------------
`host_request` speaks the adb *host* protocol over the server's socket (``host:connect``,
``host:disconnect``, ``host:devices``, ``host:version``) instead of running the ``adb``
client: an ``adb`` client whose version differs from the server's kills that server and
starts its own, so running it against a server fleetbench did not start (a user's, from
another SDK, with phones attached) could stop it. The socket request never does.
"""

from __future__ import annotations

import os
import re
import socket
import time
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import adbutils
from adbutils.errors import AdbError, AdbTimeout

from devices.errors import CommandTimeout, ConnectionLost, OutOfSpace, TransportError, Unreachable, says_out_of_space
from devices.files import atomic_path
from devices.transport import READ_CHUNK, CappedOutput, RunResult, StreamingProcess, env_argv, quote_argv, too_large

if TYPE_CHECKING:
    from devices.fleet import Device

RC_MARKER = b"\n__fleetbench_rc="
#: Where a streamed process's stderr is kept on the device.
STREAM_ERR_DIR = "/data/local/tmp"
_RC_TAIL = re.compile(rb"(\d+)\n?\Z")
_NETWORK_SERIAL = re.compile(r"^[^:\s]+:\d+$")


def wrap_command(argv: Sequence[str]) -> str:
    """Return the legacy-shell command line that runs ``argv`` and reports its status.

    Parameters
    ----------
    argv : sequence of str

    Returns
    -------
    str
    """
    return quote_argv(argv) + " </dev/null; printf '\\n__fleetbench_rc=%d\\n' \"$?\""


def parse_output(data: bytes) -> tuple[int, bytes]:
    """Split shell output into ``(rc, output)`` using the trailing status marker.

    Raises
    ------
    ConnectionLost
        The marker is missing: the command was killed or the connection dropped.
    """
    index = data.rfind(RC_MARKER)
    match = _RC_TAIL.match(data, index + len(RC_MARKER)) if index >= 0 else None
    if match is None:
        raise ConnectionLost("the command ended without reporting an exit status "
                             "(killed on the device, or the adb connection dropped)")
    return int(match.group(1)), data[:index]


def host_request(port: int, request: str, timeout: float = 10.0) -> str:
    """Send one host request (e.g. ``host:devices``) to the adb server on 127.0.0.1:``port``; return its answer.

    Parameters
    ----------
    port : int
        The server's port.
    request : str
        ``host:version``, ``host:devices``, ``host:connect:HOST:PORT``, ``host:disconnect:HOST:PORT``...
    timeout : float
        Seconds for the whole exchange.

    Returns
    -------
    str
        The length-prefixed payload after ``OKAY``.

    Raises
    ------
    Unreachable
        No server answers on the port.
    TransportError
        The server answered ``FAIL`` (with its message) or something unexpected.
    """
    payload = request.encode()
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
            sock.settimeout(timeout)
            sock.sendall(b"%04x" % len(payload) + payload)
            status = _recv_exactly(sock, 4)
            length = int(_recv_exactly(sock, 4), 16) if status in (b"OKAY", b"FAIL") else 0
            answer = _recv_exactly(sock, length).decode("utf-8", "replace")
    except (ConnectionRefusedError, TimeoutError) as exc:
        raise Unreachable(f"no adb server answers on 127.0.0.1:{port}: {exc}") from None
    except (OSError, ValueError) as exc:
        raise TransportError(f"adb server on 127.0.0.1:{port}: {request}: {exc}") from None
    if status != b"OKAY":
        raise TransportError(f"adb server on 127.0.0.1:{port}: {request}: {answer or status!r}")
    return answer


def _recv_exactly(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise ConnectionError(f"connection closed after {len(data)} of {n} bytes")
        data += chunk
    return data


def attached(port: int, timeout: float = 10.0) -> dict[str, str]:
    """Return serial -> state of every device the adb server on ``port`` lists (``host:devices``).

    Raises
    ------
    Unreachable, TransportError
        As `host_request`.
    """
    rows = (line.split("\t") for line in host_request(port, "host:devices", timeout).splitlines())
    return {row[0]: row[1] for row in rows if len(row) == 2}


class _ExistingServerConnection(adbutils.AdbConnection):
    """A connection to an adb server that is already running.

    adbutils runs ``adb start-server`` when a connection fails: a daemon that outlives
    fleetbench, on whatever port ``ANDROID_ADB_SERVER_PORT`` names at that moment (a
    user's 5037, or a test's). A server gone mid-campaign must be an error instead.
    """

    def _safe_connect(self) -> socket.socket:
        return self._create_socket()  # raises AdbConnectionError / AdbTimeout


class _NoDelayClient(adbutils.AdbClient):
    """An adbutils client that never starts a server and whose small packets leave at once.

    A sync request is several small writes (``host:transport:...``, ``sync:``, then the
    request) before the first read; with Nagle's algorithm on, each write after the first
    waits for the server's delayed ACK (about 40 ms on Linux).
    """

    def __init__(self, host: str, port: int, socket_timeout: float | None = None) -> None:
        super().__init__(host=host, port=port, socket_timeout=socket_timeout)
        self.socket_timeout = socket_timeout

    def make_connection(self, timeout: float | None = None) -> adbutils.AdbConnection:
        """Connect to the running adb server with ``TCP_NODELAY`` set (see the class).

        Raises
        ------
        adbutils.AdbError
            No server accepts (``AdbConnectionError``) or in time (``AdbTimeout``).
        """
        connection = _ExistingServerConnection(self.host, self.port)
        timeout = timeout or self.socket_timeout
        if timeout:
            connection.conn.settimeout(timeout)
        connection.conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return connection


class ADBTransport:
    """The `devices.transport.Transport` of one adb device.

    Parameters
    ----------
    serial : str
        adb serial; a network serial ``host:port`` is ``adb connect``-ed first.
    server_port : int, optional
        adb server port (default: ``ANDROID_ADB_SERVER_PORT``, else 5037).
    connect_timeout : float
        Seconds allowed to reach the adb server and the device.
    transfer_timeout : float
        Seconds allowed without progress during a push or pull.
    """

    def __init__(self, serial: str, *, server_port: int | None = None, connect_timeout: float = 10.0,
                 transfer_timeout: float = 120.0) -> None:
        self.serial = serial
        self.server_port = server_port or int(os.environ.get("ANDROID_ADB_SERVER_PORT", "5037"))
        self.connect_timeout = connect_timeout
        self.transfer_timeout = transfer_timeout
        self._device: adbutils.AdbDevice | None = None

    @classmethod
    def from_device(cls, device: Device, server_port: int | None = None) -> ADBTransport:
        """Build the transport of a fleet `~devices.fleet.Device` of kind ``adb``.

        Raises
        ------
        ValueError
            The device is not an adb device or has no serial.
        """
        if device.kind != "adb" or not device.serial:
            raise ValueError(f"{device.name}: not an adb device with a serial")
        return cls(device.serial, server_port=server_port)

    # -- connection ---------------------------------------------------------------

    def _client(self) -> adbutils.AdbClient:
        # Probe the server ourselves: adbutils would start one on failure.
        try:
            socket.create_connection(("127.0.0.1", self.server_port), timeout=self.connect_timeout).close()
        except OSError as exc:
            raise Unreachable(f"no adb server on 127.0.0.1:{self.server_port}: {exc}") from None
        return _NoDelayClient(host="127.0.0.1", port=self.server_port, socket_timeout=self.transfer_timeout)

    def _state(self, device: adbutils.AdbDevice) -> str:
        try:
            return device.get_state()
        except AdbError as exc:
            return str(exc) or "unknown"

    def device(self) -> adbutils.AdbDevice:
        """Return the adbutils device, connecting (or reconnecting) it when needed.

        Raises
        ------
        Unreachable
            No adb server, ``adb connect`` failed, or the device is not in state ``device``.
        """
        client = self._client()
        device = self._device or client.device(self.serial)
        state = self._state(device)
        if state != "device" and _NETWORK_SERIAL.match(self.serial):
            try:
                answer = client.connect(self.serial, timeout=self.connect_timeout)
            except AdbError as exc:
                raise Unreachable(f"adb connect {self.serial}: {exc}") from None
            if "connected to" not in answer:
                raise Unreachable(f"adb connect {self.serial}: {answer.strip()}")
            deadline = time.monotonic() + self.connect_timeout
            while (state := self._state(device)) != "device" and time.monotonic() < deadline:
                time.sleep(0.1)
        if state != "device":
            self._device = None
            raise Unreachable(f"adb device {self.serial}: {state}")
        self._device = device
        return device

    # -- Transport ------------------------------------------------------------------

    def run(self, argv: Sequence[str], timeout: float) -> RunResult:
        """Run ``argv`` on the device (see the module notes on rc and merged output).

        Parameters
        ----------
        argv : sequence of str
        timeout : float
            Seconds; the stream is closed (which kills the command) when it runs out.

        Returns
        -------
        RunResult

        Raises
        ------
        CommandTimeout, Unreachable, ConnectionLost, TransportError
        OutputTooLarge
            Its output went over `devices.transport.MAX_OUTPUT_BYTES` (the stream was closed,
            which kills the command).
        """
        command = wrap_command(argv)
        start = time.monotonic()
        deadline = start + timeout
        device = self.device()
        try:
            conn = device.shell(command, stream=True)
        except AdbTimeout as exc:
            raise CommandTimeout(f"adb shell on {self.serial}: {exc}") from None
        except AdbError as exc:
            raise Unreachable(f"adb shell on {self.serial}: {exc}") from None
        output = CappedOutput()  # stdout, stderr and the exit-status line arrive merged: one cap for them
        try:
            sock = conn.conn
            while True:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError
                sock.settimeout(remaining)
                data = sock.recv(READ_CHUNK)
                if not data:
                    break
                if not output.add(data):
                    raise too_large([output], ["output"], self.serial, argv[0])
        except TimeoutError:
            raise CommandTimeout(f"{argv[0]} on {self.serial}: no exit within {timeout:g} s "
                                 "(the adb stream was closed, which kills the command)") from None
        except OSError as exc:
            raise ConnectionLost(f"adb shell on {self.serial}: {exc}") from None
        finally:
            conn.close()  # closing the stream makes adbd kill the command
        rc, out = parse_output(output.data())
        return RunResult(rc=rc, stdout=out.decode("utf-8", "replace"), stderr="",
                         seconds=time.monotonic() - start)

    def start(self, argv: Sequence[str], env: Mapping[str, str] | None = None) -> ADBProcess:
        """Start ``argv`` through the ``exec:`` service as a streamed process (see the module notes).

        Parameters
        ----------
        argv : sequence of str
        env : mapping of str to str, optional
            Set for the command (through ``env NAME=VALUE``).

        Returns
        -------
        ADBProcess

        Raises
        ------
        Unreachable, CommandTimeout
        """
        nonce = uuid.uuid4().hex[:12]
        errfile = f"{STREAM_ERR_DIR}/.fleetbench-{nonce}.err"
        inner = f"echo __fleetbench_pid_{nonce}=$$; exec {quote_argv(env_argv(argv, env))}"
        command = (f"exec 2>{quote_argv([errfile])}; {quote_argv(['sh', '-c', inner])}; "
                   f"printf '__fleetbench_rc_{nonce}=%d\\n' \"$?\"")
        device = self.device()
        try:
            conn = device.open_transport(timeout=self.connect_timeout)
            conn.send_command("exec:" + command)
            conn.check_okay()
        except AdbTimeout as exc:
            raise CommandTimeout(f"adb exec on {self.serial}: {exc}") from None
        except (AdbError, OSError) as exc:
            raise Unreachable(f"adb exec on {self.serial}: {exc}") from None
        sock = conn.conn
        sock.settimeout(None)
        return ADBProcess(self, conn, nonce, errfile, f"{argv[0]} on adb {self.serial}")

    def put(self, local: Path, remote: str) -> None:
        """Push ``local`` to ``remote`` (sync SEND, keeping permission bits) and check the size.

        Raises
        ------
        CommandTimeout, Unreachable, TransportError
            `devices.errors.OutOfSpace` when the device says its storage is full.
        """
        size = local.stat().st_size
        device = self.device()
        try:
            if device.sync.stat(remote).mode & 0o170000 == 0o040000:  # a directory: keep the name
                remote = remote.rstrip("/") + "/" + local.name
            device.sync.push(local, remote, mode=local.stat().st_mode & 0o777)
            got = device.sync.stat(remote).size
        except (TimeoutError, AdbTimeout) as exc:
            raise CommandTimeout(f"push {local} to {self.serial}:{remote}: {exc}") from None
        except (AdbError, OSError) as exc:
            failure = OutOfSpace if says_out_of_space(str(exc)) else TransportError
            raise failure(f"push {local} to {self.serial}:{remote}: {exc}") from None
        if got != size & 0xFFFFFFFF:  # sync v1 STAT sizes are 32-bit
            raise TransportError(f"push {local} to {self.serial}:{remote}: {got} of {size} bytes arrived")

    def get(self, remote: str, local: Path) -> None:
        """Pull ``remote`` into ``local`` (written whole or not at all) and check the size.

        Missing parent directories of ``local`` are created, as the other transports do.

        Raises
        ------
        CommandTimeout, Unreachable, TransportError
        """
        device = self.device()
        try:
            with atomic_path(local) as part:
                info = device.sync.stat(remote)
                if info.mtime is None:  # STAT answers all zeros for a missing file
                    raise TransportError(f"pull {self.serial}:{remote}: no such file")
                got = device.sync.pull_file(remote, part)
                if got & 0xFFFFFFFF != info.size:
                    raise TransportError(f"pull {self.serial}:{remote}: {got} of {info.size} bytes arrived")
        except (TimeoutError, AdbTimeout) as exc:
            raise CommandTimeout(f"pull {self.serial}:{remote}: {exc}") from None
        except (AdbError, OSError) as exc:
            raise TransportError(f"pull {self.serial}:{remote}: {exc}") from None

    def close(self) -> None:
        """Forget the device handle (adb keeps no per-transport state here; idempotent)."""
        self._device = None


class ADBProcess(StreamingProcess):
    """A `devices.transport.Process` on an adb device (see `ADBTransport.start`).

    Parameters
    ----------
    transport : ADBTransport
        Runs the helper commands (``kill``, ``tail``, ``rm``).
    conn : adbutils.AdbConnection
        The open ``exec:`` stream.
    nonce : str
        Tags the pid and exit-status lines.
    errfile : str
        The device file holding the process's stderr.
    description : str
    """

    def __init__(self, transport: ADBTransport, conn: adbutils.AdbConnection, nonce: str, errfile: str,
                 description: str) -> None:
        self.transport = transport
        self.conn = conn
        self.errfile = errfile
        self.pid: int | None = None
        self._pid_prefix = f"__fleetbench_pid_{nonce}=".encode()
        self._rc_marker = re.compile(rb"__fleetbench_rc_" + nonce.encode() + rb"=(\d+)\Z")
        self._rc: int | None = None
        self._ended_event = False
        sock = conn.conn
        super().__init__(description, sock.sendall, sock.recv)

    def _filter_line(self, line: bytes, last: bool = False) -> bytes | None:
        if self.pid is None and line.startswith(self._pid_prefix):
            value = line[len(self._pid_prefix):].strip()
            self.pid = int(value) if value.isdigit() else None
            return None
        match = self._rc_marker.search(line)
        if match is not None:  # the outer shell's status line, after a partial line of a killed process
            self._rc = int(match.group(1))
            self._ended_event = True
            return None
        return None if last else line

    def stderr_tail(self, limit: int = 4096) -> str:
        """Return the last ``limit`` bytes of the process's stderr file on the device ("" if unreadable)."""
        try:
            result = self.transport.run(["tail", "-c", str(int(limit)), self.errfile], timeout=10.0)
        except (TransportError, OSError):
            return ""
        return result.stdout.strip() if result.ok else ""

    def _alive(self) -> bool:
        return not self._ended_event and not self._lines_ended()

    def _lines_ended(self) -> bool:
        return not any(reader.is_alive() for reader in self._readers)

    def _returncode(self) -> int | None:
        return self._rc

    def _wait_returncode(self) -> int | None:
        for reader in self._readers:
            reader.join(1.0)
        return self._rc

    def _running_on_device(self) -> bool:
        if self.pid is None:
            return False
        try:
            return self.transport.run(["kill", "-0", str(self.pid)], timeout=10.0).ok
        except (TransportError, OSError):
            return False

    def _terminate(self, grace: float) -> None:
        if self.pid is not None and self._alive():
            try:
                self.transport.run(["kill", "-9", str(self.pid)], timeout=10.0)
            except (TransportError, OSError):
                pass
        self.conn.close()
        deadline = time.monotonic() + max(grace, 5.0)
        while self._running_on_device() and time.monotonic() < deadline:
            time.sleep(0.05)
        try:
            self.transport.run(["rm", "-f", self.errfile], timeout=10.0)
        except (TransportError, OSError):
            pass
