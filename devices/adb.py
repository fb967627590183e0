r"""`ADBTransport`: run commands on and copy files to an Android device through adb.

Everything goes through the real ``adb`` server (via adbutils), on the port given to
the constructor or in ``ANDROID_ADB_SERVER_PORT`` (default 5037). The server is never
started here: adbutils would otherwise run ``adb start-server`` on the default port
when it finds none, so a missing server is reported as `Unreachable` instead.

Exit status and output streams
------------------------------
Commands use the *legacy* ``shell:`` service, which works with every adbd (and with
the emulated phone of `devices.adb_endpoint`). That service returns neither the exit
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
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import adbutils
from adbutils.errors import AdbError, AdbTimeout

from devices.errors import CommandTimeout, ConnectionLost, TransportError, Unreachable
from devices.transport import RunResult, quote_argv

if TYPE_CHECKING:
    from devices.fleet import Device

RC_MARKER = b"\n__fleetbench_rc="
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
        return adbutils.AdbClient(host="127.0.0.1", port=self.server_port, socket_timeout=self.transfer_timeout)

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
        chunks: list[bytes] = []
        try:
            sock = conn.conn
            while True:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError
                sock.settimeout(remaining)
                data = sock.recv(65536)
                if not data:
                    break
                chunks.append(data)
        except TimeoutError:
            raise CommandTimeout(f"{argv[0]} on {self.serial}: no exit within {timeout:g} s "
                                 "(the adb stream was closed, which kills the command)") from None
        except OSError as exc:
            raise ConnectionLost(f"adb shell on {self.serial}: {exc}") from None
        finally:
            conn.close()  # closing the stream makes adbd kill the command
        rc, out = parse_output(b"".join(chunks))
        return RunResult(rc=rc, stdout=out.decode("utf-8", "replace"), stderr="",
                         seconds=time.monotonic() - start)

    def put(self, local: Path, remote: str) -> None:
        """Push ``local`` to ``remote`` (sync SEND, keeping permission bits) and check the size.

        Raises
        ------
        CommandTimeout, Unreachable, TransportError
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
            raise TransportError(f"push {local} to {self.serial}:{remote}: {exc}") from None
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
        local = Path(local)
        local.parent.mkdir(parents=True, exist_ok=True)
        part = local.with_name(local.name + ".part")
        try:
            info = device.sync.stat(remote)
            if info.mtime is None:  # STAT answers all zeros for a missing file
                raise TransportError(f"pull {self.serial}:{remote}: no such file")
            got = device.sync.pull_file(remote, part)
        except (TimeoutError, AdbTimeout) as exc:
            part.unlink(missing_ok=True)
            raise CommandTimeout(f"pull {self.serial}:{remote}: {exc}") from None
        except (AdbError, OSError) as exc:
            part.unlink(missing_ok=True)
            raise TransportError(f"pull {self.serial}:{remote}: {exc}") from None
        if got & 0xFFFFFFFF != info.size:
            part.unlink(missing_ok=True)
            raise TransportError(f"pull {self.serial}:{remote}: {got} of {info.size} bytes arrived")
        part.replace(local)

    def close(self) -> None:
        """Forget the device handle (adb keeps no per-transport state here; idempotent)."""
        self._device = None
