"""An emulated Android phone: a device-mode ADB endpoint on loopback.

The real ``adb`` server attaches to it with ``adb connect 127.0.0.1:PORT`` and then
talks the ADB wire protocol (AOSP ``system/core/adb/protocol.txt``) to it exactly as
to a phone on Wi-Fi: 24-byte little-endian message headers, a ``CNXN`` handshake
(no ``AUTH``), and streams opened with ``OPEN`` carrying a service name.

Services implemented:

``shell:CMD``
    The *legacy* shell service: ``/bin/sh -c CMD`` runs as a child of this process
    (so CPU and memory limits put on the endpoint's process tree or cgroup hold it
    too) with stdout and stderr merged into one stream and no exit status -- exactly
    what a phone without the ``shell_v2`` feature does. ``shell_v2`` is therefore
    NOT advertised, and the adb client falls back to this service.
``exec:CMD``
    What a real adbd (Android 5+) runs for ``adb exec-in`` / ``exec-out``: ``/bin/sh -c CMD``
    on a raw stream, never a pty, host ``WRTE`` data fed to stdin, stdout and stderr merged
    (adbd gives stderr its own stream only under the shell protocol). Here it is the same
    handler as ``shell:``, whose commands never get a pty either: the sandbox's shell
    (`Sandbox.shell`, with its toolbox ``PATH`` that has no ``python3``, and arm64 under
    qemu-user with ``--arch aarch64``). The transports use it for long-lived processes
    (`devices.adb.ADBTransport.start`), such as a resident runner started through a
    runtime bundle's loader.
``sync:``
    The file sync protocol (AOSP ``SYNC.TXT``): ``STAT``, ``LIST``, ``SEND``,
    ``RECV``, ``QUIT`` (version 1 messages only: ``stat_v2``/``ls_v2``/``sendrecv_v2``
    are not advertised).

Sandbox path mapping (one rule for shell commands and for sync)
---------------------------------------------------------------
* The Android storage roots ``/data``, ``/sdcard`` and ``/storage`` live inside the
  sandbox: ``/data/local/tmp/x`` is ``SANDBOX/data/local/tmp/x``. In a shell command
  the roots are rewritten textually where a word starts with them (after a blank,
  quote, ``=``, ``;``, ``|``, ``&``, ``(``, ``<`` or ``>``), so an *argument* that
  merely contains such a path at a word start is rewritten too -- a documented
  limitation of emulating a file-system namespace without privileges.
* Relative paths are relative to the sandbox (the shell's working directory).
* ``/proc`` and ``/sys`` are the host's own, read-only through sync (shell commands
  read them directly), so device-fact collection sees real numbers.
* Any other absolute path is refused by sync; shell commands see the host there.

``getprop`` is a small script in ``SANDBOX/bin`` answering ``ro.product.model``,
``ro.build.version.release``, ``ro.product.cpu.abi`` and a few more.

A shell without Python (the phone's toolbox)
--------------------------------------------
``SANDBOX/bin`` is the commands' whole ``PATH``: beside ``getprop`` it holds links to
the shell and the commands Android's toybox offers (`TOOLBOX`: ``cat``, ``sha256sum``,
``tar``, ``df``, ``uname``...), and nothing else, so ``python3`` is not found, as on a
phone. (A program named by its absolute host path still runs: that is how tests give
the phone a working Python, as Termux would.) Decided so rather than a chroot, which
would need root for every phone.

``--arch aarch64 --tree T``: the toolbox links point at the arm64 binaries of the Debian
tree ``T`` (`devices.emulation.rootfs`) and the commands run with ``QEMU_LD_PREFIX=T``, so the
kernel hands every one of them to qemu-user through binfmt_misc and qemu finds their
arm64 libraries in the tree, on the processor an emulated aarch64 board has
(``QEMU_CPU``, `devices.emulation.qemu.GUEST_CPU`): ``uname -m`` answers ``aarch64``
because qemu says so, and ``/proc`` stays the host's, so the facts probe sees the
emulation. The tree's own
``/usr/bin/python3`` is not on ``PATH``. No root is needed once the binfmt entry exists.

Run as ``python -m devices.emulation.adb_endpoint --port P --sandbox DIR [--pidfile F] [--arch
aarch64 --tree T]``, or in-process with `AdbEndpoint` (threaded server) in tests.
"""

from __future__ import annotations

import argparse
import logging
import os
import platform
import queue
import re
import shlex
import signal
import socket
import stat
import struct
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from devices.emulation.qemu import GUEST_CPU

log = logging.getLogger(__name__)

# --- wire protocol ---------------------------------------------------------------

A_SYNC = 0x434E5953
A_CNXN = 0x4E584E43
A_AUTH = 0x48545541
A_OPEN = 0x4E45504F
A_OKAY = 0x59414B4F
A_CLSE = 0x45534C43
A_WRTE = 0x45545257
A_STLS = 0x534C5453
KNOWN_COMMANDS = frozenset({A_SYNC, A_CNXN, A_AUTH, A_OPEN, A_OKAY, A_CLSE, A_WRTE, A_STLS})

# 0x01000000 is the original protocol, in which every payload carries a checksum
# (the byte sum). Since 0x01000001 (adb 1.0.39+, which 1.0.41 sends) both sides may
# send 0 there and the receiver must not check it. We answer with the newer version;
# the negotiated version is the minimum of both, and we verify checksums only when
# the peer speaks the old one.
A_VERSION_MIN = 0x01000000
A_VERSION_SKIP_CHECKSUM = 0x01000001
HEADER = struct.Struct("<6I")
MAX_PAYLOAD = 256 * 1024  # ours; adb 1.0.41 offers 1 MiB, we negotiate down to this
SYNC_DATA_MAX = 64 * 1024  # sync DATA chunks are at most 64 KiB (SYNC.TXT)

FEATURES = ("fixed_push_mkdir",)  # only what we implement: SEND creates parent dirs
DEFAULT_PROPS: Mapping[str, str] = {
    "ro.product.name": "fleetbench",
    "ro.product.model": "emulated",
    "ro.product.device": "emulated",
    "ro.product.manufacturer": "fleetbench",
    "ro.build.version.release": "13",
    "ro.build.version.sdk": "33",
}
_ABIS = {"x86_64": "x86_64", "amd64": "x86_64", "aarch64": "arm64-v8a", "arm64": "arm64-v8a",
         "armv7l": "armeabi-v7a", "i686": "x86", "i386": "x86"}
ANDROID_ROOTS = ("/data", "/sdcard", "/storage")
#: Commands of the phone's shell, linked into ``SANDBOX/bin`` where the root has them (toybox's, roughly).
TOOLBOX: tuple[str, ...] = (
    "sh", "awk", "base64", "basename", "cat", "chmod", "chown", "cmp", "comm", "cp", "cut", "date", "dd", "df",
    "diff", "dirname", "du", "echo", "egrep", "env", "expr", "false", "fgrep", "find", "free", "getconf", "grep",
    "gunzip", "gzip", "head", "hostname", "id", "kill", "ln", "ls", "md5sum", "mkdir", "mktemp", "mv", "nice",
    "nohup", "nproc", "od", "pgrep", "pidof", "pkill", "printf", "ps", "readlink", "realpath", "rm", "rmdir",
    "sed", "seq", "setsid", "sha1sum", "sha256sum", "sleep", "sort", "stat", "sync", "tail", "tar", "tee",
    "test", "timeout", "touch", "tr", "true", "uname", "uniq", "uptime", "wc", "which", "xargs", "yes", "zcat",
)  # fmt: skip
#: ``--arch`` values: the emulated CPU of the shell (None: this host's own).
ARCHES = ("aarch64",)
HOST_READ_ONLY_ROOTS = ("/proc", "/sys")
_SAFE_PATH = re.compile(r"[A-Za-z0-9_./+-]+")


class ProtocolError(Exception):
    """A malformed or unexpected ADB packet; the connection is dropped."""


@dataclass(frozen=True)
class Message:
    """One ADB packet.

    Attributes
    ----------
    command : int
        ``A_CNXN``, ``A_OPEN``, ... (four ASCII bytes read as a little-endian int).
    arg0, arg1 : int
        Command arguments (stream ids, version, maxdata).
    payload : bytes
        Data following the header.
    """

    command: int
    arg0: int
    arg1: int
    payload: bytes = b""


def checksum(data: bytes) -> int:
    """Return the ADB data checksum: the sum of the payload bytes modulo 2**32.

    Parameters
    ----------
    data : bytes

    Returns
    -------
    int
    """
    return sum(data) & 0xFFFFFFFF


def command_name(command: int) -> str:
    """Return the four-letter name of ``command`` (for logs)."""
    return struct.pack("<I", command).decode("ascii", "replace")


def encode_message(message: Message) -> bytes:
    """Encode ``message`` as header plus payload.

    The checksum is always filled in: a peer at version 0x01000001 ignores it and one
    at 0x01000000 requires it.

    Parameters
    ----------
    message : Message

    Returns
    -------
    bytes
    """
    header = HEADER.pack(message.command, message.arg0, message.arg1, len(message.payload),
                         checksum(message.payload), message.command ^ 0xFFFFFFFF)
    return header + message.payload


def decode_header(header: bytes) -> tuple[int, int, int, int, int]:
    """Decode and validate a 24-byte header.

    Parameters
    ----------
    header : bytes
        Exactly 24 bytes.

    Returns
    -------
    tuple of int
        ``(command, arg0, arg1, data_length, data_check)``.

    Raises
    ------
    ProtocolError
        Wrong size, a magic that is not ``command ^ 0xffffffff``, an unknown command
        or a payload larger than `MAX_PAYLOAD`.
    """
    if len(header) != HEADER.size:
        raise ProtocolError(f"short header ({len(header)} bytes)")
    command, arg0, arg1, length, check, magic = HEADER.unpack(header)
    if magic != command ^ 0xFFFFFFFF:
        raise ProtocolError(f"bad magic {magic:#010x} for command {command:#010x}")
    if command not in KNOWN_COMMANDS:
        raise ProtocolError(f"unknown command {command:#010x}")
    # adb may send a CNXN banner before maxdata is negotiated; 1 MiB is its own limit.
    if length > max(MAX_PAYLOAD, 1024 * 1024):
        raise ProtocolError(f"payload of {length} bytes is too large")
    return command, arg0, arg1, length, check


# --- sandbox -----------------------------------------------------------------------


def device_abi() -> str:
    """Return the Android ABI name of this host's CPU (``x86_64``, ``arm64-v8a``...)."""
    machine = platform.machine().lower()
    return _ABIS.get(machine, machine)


def write_toolbox(bin_dir: Path, root: Path = Path("/")) -> list[str]:
    """Link the `TOOLBOX` commands found under ``root`` into ``bin_dir``; return the names linked.

    Parameters
    ----------
    bin_dir : pathlib.Path
        The sandbox's ``bin`` (created); links left by an earlier start are replaced.
    root : pathlib.Path
        Where the commands come from: ``/`` (this host) or an arm64 tree.

    Returns
    -------
    list of str

    Raises
    ------
    FileNotFoundError
        ``root`` has no ``sh``.
    """
    bin_dir.mkdir(parents=True, exist_ok=True)
    linked = []
    for name in TOOLBOX:
        link = bin_dir / name
        if link.is_symlink():
            link.unlink()
        source = next((found for d in ("bin", "usr/bin") if (found := _inside(root, f"{d}/{name}")) is not None), None)
        if source is None:
            if name == "sh":
                raise FileNotFoundError(f"{root}: no bin/sh for the phone's shell")
            continue
        link.symlink_to(source)
        linked.append(name)
    return linked


def _inside(root: Path, rel: str, depth: int = 0) -> Path | None:
    """Return the regular file ``root/rel`` is, following links as if ``root`` were ``/``."""
    path = root / rel
    if depth > 16 or not (path.is_symlink() or path.exists()):
        return None
    if not path.is_symlink():
        return path if path.is_file() else None
    target = os.readlink(path)
    if target.startswith("/"):
        return _inside(root, target.lstrip("/"), depth + 1)
    return _inside(root, os.path.normpath(os.path.join(os.path.dirname(rel), target)), depth + 1)


def write_getprop(bin_dir: Path, props: Mapping[str, str]) -> Path:
    """Write the fake ``getprop`` script into ``bin_dir`` and return its path.

    ``getprop NAME`` prints the value (an empty line when unknown, as Android does);
    ``getprop`` alone lists ``[name]: [value]`` lines.
    """
    bin_dir.mkdir(parents=True, exist_ok=True)
    cases = "".join(f"  {shlex.quote(k)}) echo {shlex.quote(v)} ;;\n" for k, v in sorted(props.items()))
    listing = "".join(f"[{k}]: [{v}]\n" for k, v in sorted(props.items()))
    script = (
        "#!/bin/sh\n# fake getprop of the fleetbench emulated phone\n"
        f'if [ $# -eq 0 ]; then printf %s {shlex.quote(listing)}; exit 0; fi\n'
        f'case "$1" in\n{cases}  *) echo "${{2:-}}" ;;\nesac\n'
    )
    path = bin_dir / "getprop"
    path.write_text(script)
    path.chmod(0o755)
    return path


class Sandbox:
    """The emulated phone's file system: maps device paths to host paths.

    Parameters
    ----------
    root : pathlib.Path
        Sandbox directory (created); its absolute path may only contain
        ``[A-Za-z0-9_./+-]`` so that rewritten shell words need no quoting.
    props : mapping of str to str, optional
        System properties answered by ``getprop`` (merged over `DEFAULT_PROPS`).
    arch : str, optional
        ``aarch64``: the shell's commands are the arm64 ones of ``tree``, run through qemu-user.
    tree : pathlib.Path, optional
        The arm64 Debian tree (needed with ``arch``).
    """

    def __init__(self, root: Path, props: Mapping[str, str] | None = None, arch: str | None = None,
                 tree: Path | None = None) -> None:
        self.root = root.resolve()
        if not _SAFE_PATH.fullmatch(str(self.root)):
            raise ValueError(f"sandbox path {self.root} contains characters the shell would interpret")
        if arch is not None and (arch not in ARCHES or tree is None):
            raise ValueError(f"arch {arch!r}: expected one of {', '.join(ARCHES)}, with the tree that runs it")
        self.arch, self.tree = arch, tree
        (self.root / "data" / "local" / "tmp").mkdir(parents=True, exist_ok=True)
        (self.root / "sdcard").mkdir(exist_ok=True)
        (self.root / "storage").mkdir(exist_ok=True)
        abi = _ABIS[arch] if arch is not None else device_abi()
        self.props = {**DEFAULT_PROPS, "ro.product.cpu.abi": abi, **(props or {})}
        write_toolbox(self.root / "bin", tree if tree is not None else Path("/"))
        write_getprop(self.root / "bin", self.props)
        roots = "|".join(re.escape(r) for r in ANDROID_ROOTS)
        self._word_root = re.compile(rf"""(?:(?<=^)|(?<=[\s'"=;|&(<>]))({roots})(?=$|[/\s'";|&)<>])""")

    def host_path(self, device_path: str, *, write: bool = False) -> Path:
        """Return the host path of ``device_path`` (see the module's mapping rules).

        Raises
        ------
        PermissionError
            A path outside the mapped roots, an escape with ``..``, or a write to
            ``/proc`` / ``/sys``.
        """
        if not device_path.startswith("/"):
            candidate = (self.root / device_path).resolve()
            if candidate != self.root and self.root not in candidate.parents:
                raise PermissionError(f"{device_path}: outside the device storage")
            return candidate
        norm = os.path.normpath(device_path)
        for root in ANDROID_ROOTS:
            if norm == root or norm.startswith(root + "/"):
                return self.root / norm.lstrip("/")
        for root in HOST_READ_ONLY_ROOTS:
            if norm == root or norm.startswith(root + "/"):
                if write:
                    raise PermissionError(f"{device_path}: read-only file system")
                return Path(norm)
        raise PermissionError(f"{device_path}: outside the emulated device's storage")

    def shell_command(self, command: str) -> str:
        """Rewrite the Android storage roots at word starts of ``command`` into the sandbox."""
        return self._word_root.sub(lambda m: str(self.root) + m.group(1), command)

    def environment(self) -> dict[str, str]:
        """Return the environment of shell commands (the sandbox's ``bin`` is the whole PATH)."""
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV", "QEMU_"))}
        tmp = str(self.root / "data" / "local" / "tmp")
        env.update(PATH=str(self.root / "bin"), HOME=tmp, TMPDIR=tmp, ANDROID_DATA="/data",
                   EXTERNAL_STORAGE="/sdcard")
        if self.tree is not None:
            env.update(QEMU_LD_PREFIX=str(self.tree), QEMU_CPU=GUEST_CPU)
        return env

    @property
    def shell(self) -> str:
        """The phone's shell (the toolbox's ``sh``)."""
        return str(self.root / "bin" / "sh")


# --- streams and connections -----------------------------------------------------------


class Stream:
    """One ADB stream, seen from the device side.

    Incoming ``WRTE`` payloads queue up and are acknowledged with ``OKAY`` only when a
    service consumes them (flow control towards the host). `write` sends at most one
    ``WRTE`` in flight and waits for the host's ``OKAY`` before the next.
    """

    def __init__(self, conn: Connection, local_id: int, remote_id: int) -> None:
        self.conn, self.local_id, self.remote_id = conn, local_id, remote_id
        self.inbox: queue.Queue[bytes | None] = queue.Queue()
        self.ready = threading.Event()
        self.closed = threading.Event()
        self._buffer = b""

    def read_chunk(self) -> bytes | None:
        """Return the next payload from the host (``None`` once the stream is closed)."""
        if self._buffer:
            data, self._buffer = self._buffer, b""
            return data
        item = self.inbox.get()
        if item is None:
            self.inbox.put(None)  # stay closed for later readers
            return None
        self.conn.send(Message(A_OKAY, self.local_id, self.remote_id))
        return item

    def read_exact(self, n: int) -> bytes:
        """Read exactly ``n`` bytes (sync messages may be split across ``WRTE`` packets).

        Raises
        ------
        EOFError
            The stream closed first.
        """
        parts, have = [], 0
        while have < n:
            chunk = self.read_chunk()
            if chunk is None:
                raise EOFError("stream closed")
            take = chunk[: n - have]
            self._buffer = chunk[n - have:]
            parts.append(take)
            have += len(take)
        return b"".join(parts)

    def write(self, data: bytes) -> bool:
        """Send ``data`` in ``WRTE`` packets; return ``False`` if the stream closed."""
        view = memoryview(data)
        step = self.conn.maxdata
        for start in range(0, len(view), step):
            self.ready.clear()
            if self.closed.is_set():
                return False
            self.conn.send(Message(A_WRTE, self.local_id, self.remote_id, bytes(view[start:start + step])))
            while not self.ready.wait(0.5):
                if self.closed.is_set():
                    return False
        return not self.closed.is_set()

    def close(self) -> None:
        """Close from our side: send ``CLSE`` once and forget the stream."""
        if not self.closed.is_set():
            self.closed.set()
            self.conn.send(Message(A_CLSE, self.local_id, self.remote_id))
        self.conn.forget(self)

    def peer_closed(self) -> None:
        """Mark the stream closed by the host (or by a dropped connection)."""
        self.closed.set()
        self.ready.set()
        self.inbox.put(None)


class Connection:
    """One host connection: reads packets and dispatches them to streams."""

    def __init__(self, endpoint: AdbEndpoint, sock: socket.socket) -> None:
        self.endpoint, self.sock = endpoint, sock
        self.maxdata = 4096
        self.version = A_VERSION_SKIP_CHECKSUM
        self.connected = False
        self.streams: dict[int, Stream] = {}
        self._next_id = 1
        self._send_lock = threading.Lock()
        self._lock = threading.Lock()

    def send(self, message: Message) -> None:
        """Send one packet (thread-safe; errors drop the connection)."""
        data = encode_message(message)
        try:
            with self._send_lock:
                self.sock.sendall(data)
        except OSError:
            self.shutdown()

    def forget(self, stream: Stream) -> None:
        """Remove ``stream`` from the table."""
        with self._lock:
            self.streams.pop(stream.local_id, None)

    def _recv_exact(self, n: int) -> bytes:
        parts, have = [], 0
        while have < n:
            chunk = self.sock.recv(min(n - have, 1 << 20))
            if not chunk:
                raise EOFError
            parts.append(chunk)
            have += len(chunk)
        return b"".join(parts)

    def read_message(self) -> Message:
        """Read and validate one packet.

        Raises
        ------
        ProtocolError
            Malformed header or a checksum mismatch under protocol 0x01000000.
        EOFError
            The peer closed the connection.
        """
        command, arg0, arg1, length, check = decode_header(self._recv_exact(HEADER.size))
        payload = self._recv_exact(length) if length else b""
        if self.version < A_VERSION_SKIP_CHECKSUM and check != checksum(payload):
            raise ProtocolError(f"checksum mismatch on {command_name(command)}")
        return Message(command, arg0, arg1, payload)

    def serve(self) -> None:
        """Handle packets until the host disconnects or misbehaves."""
        try:
            while True:
                self.handle(self.read_message())
        except EOFError:
            log.debug("host disconnected")
        except ProtocolError as exc:
            log.warning("dropping ADB connection: %s", exc)
        except OSError as exc:
            log.debug("connection error: %s", exc)
        finally:
            self.shutdown()

    def handle(self, message: Message) -> None:
        """Dispatch one packet."""
        cmd = message.command
        if cmd == A_CNXN:
            # arg0 = version, arg1 = maxdata, payload = "host::features=...".
            self.version = min(message.arg0, A_VERSION_SKIP_CHECKSUM)
            if self.version < A_VERSION_MIN:
                raise ProtocolError(f"unsupported version {message.arg0:#x}")
            self.maxdata = max(4096, min(message.arg1, MAX_PAYLOAD))
            self.connected = True
            self.send(Message(A_CNXN, A_VERSION_SKIP_CHECKSUM, self.maxdata, self.endpoint.banner()))
            return
        if not self.connected:
            raise ProtocolError(f"{command_name(cmd)} before CNXN")
        if cmd == A_OPEN:
            self._open(message)
        elif cmd == A_OKAY:
            # OKAY(remote-id, local-id): the host is ready for our next WRTE.
            with self._lock:
                stream = self.streams.get(message.arg1)
            if stream is not None:
                stream.remote_id = message.arg0
                stream.ready.set()
        elif cmd == A_WRTE:
            with self._lock:
                stream = self.streams.get(message.arg1)
            if stream is None:
                self.send(Message(A_CLSE, 0, message.arg0))
            else:
                stream.inbox.put(message.payload)
        elif cmd == A_CLSE:
            # No CLSE goes back: the host has already forgotten the stream.
            with self._lock:
                stream = self.streams.pop(message.arg1, None)
            if stream is not None:
                stream.peer_closed()
        else:  # AUTH / STLS / SYNC: we never asked for them
            log.debug("ignoring %s", command_name(cmd))

    def _open(self, message: Message) -> None:
        service = message.payload.rstrip(b"\0").decode("utf-8", "replace")
        handler = self.endpoint.service_handler(service)
        if handler is None:
            log.info("refusing service %r", service)
            self.send(Message(A_CLSE, 0, message.arg0))  # CLSE(0, id): the OPEN failed
            return
        with self._lock:
            local_id = self._next_id
            self._next_id += 1
            stream = Stream(self, local_id, message.arg0)
            self.streams[local_id] = stream
        self.send(Message(A_OKAY, local_id, message.arg0))
        threading.Thread(target=self._run_service, args=(handler, stream), daemon=True,
                         name=f"adb-{service.split(':')[0]}-{local_id}").start()

    @staticmethod
    def _run_service(handler: ServiceHandler, stream: Stream) -> None:
        try:
            handler(stream)
        except Exception:
            log.exception("service failed")
        finally:
            stream.close()

    def shutdown(self) -> None:
        """Close the socket and every stream (their commands are killed)."""
        with self._lock:
            streams = list(self.streams.values())
            self.streams.clear()
        for stream in streams:
            stream.peer_closed()
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()


# --- services ------------------------------------------------------------------------

ServiceHandler = Callable[[Stream], None]


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def shell_service(endpoint: AdbEndpoint, command: str, stream: Stream) -> None:
    """Run ``command`` with ``/bin/sh -c`` in the sandbox (legacy ``shell:`` semantics).

    stdout and stderr are merged; host ``WRTE`` data is fed to stdin; when the host
    closes the stream the command's whole process group is killed.
    """
    sandbox = endpoint.sandbox
    argv = [sandbox.shell, "-c", sandbox.shell_command(command)] if command else [sandbox.shell]
    try:
        proc = subprocess.Popen(argv, cwd=sandbox.root, env=sandbox.environment(), stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    except OSError as exc:
        stream.write(f"/bin/sh: {exc}\n".encode())
        return
    endpoint.track(proc)
    assert proc.stdin is not None and proc.stdout is not None
    stdin = proc.stdin

    def feed_stdin() -> None:
        while (data := stream.read_chunk()) is not None:
            try:
                stdin.write(data)
                stdin.flush()
            except OSError:
                pass
        _kill_group(proc)  # the host hung up: nobody reads the output any more

    threading.Thread(target=feed_stdin, daemon=True).start()
    try:
        fd = proc.stdout.fileno()
        while data := os.read(fd, stream.conn.maxdata):
            if not stream.write(data):
                _kill_group(proc)
                break
        proc.wait()
    finally:
        proc.stdout.close()
        try:
            stdin.close()
        except OSError:
            pass
        endpoint.untrack(proc)


def _sync_fail(stream: Stream, message: str) -> None:
    data = message.encode()
    stream.write(b"FAIL" + struct.pack("<I", len(data)) + data)


def _stat_reply(path: Path) -> bytes:
    try:
        st = path.stat()
    except OSError:
        return b"STAT" + struct.pack("<III", 0, 0, 0)  # all zero: does not exist
    return b"STAT" + struct.pack("<III", st.st_mode & 0xFFFFFFFF, st.st_size & 0xFFFFFFFF,
                                 int(st.st_mtime) & 0xFFFFFFFF)


def _list(stream: Stream, path: Path) -> None:
    try:
        entries = sorted(os.scandir(path), key=lambda e: e.name)
    except OSError:
        entries = []
    for entry in entries:
        try:
            st = entry.stat(follow_symlinks=False)
        except OSError:
            continue
        name = entry.name.encode("utf-8", "surrogateescape")
        stream.write(b"DENT" + struct.pack("<IIII", st.st_mode & 0xFFFFFFFF, st.st_size & 0xFFFFFFFF,
                                           int(st.st_mtime) & 0xFFFFFFFF, len(name)) + name)
    stream.write(b"DONE" + struct.pack("<IIII", 0, 0, 0, 0))


def _receive_file(stream: Stream, sandbox: Sandbox, spec: str) -> None:
    """SEND: "path,mode", then DATA chunks, then DONE(mtime); answer OKAY or FAIL."""
    device_path, _, mode_text = spec.rpartition(",")
    if not device_path:  # no ",mode": very old clients
        device_path, mode_text = spec, "33188"
    error: str | None = None
    tmp: Path | None = None
    out = None
    try:
        mode = int(mode_text)
        target = sandbox.host_path(device_path, write=True)
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{target.name}.fleetbench-part")
        out = tmp.open("wb")
    except (OSError, ValueError) as exc:
        error = f"{device_path}: {exc}"
    # Even after an error the client keeps sending DATA until DONE; drain it first.
    while True:
        ident, length = struct.unpack("<4sI", stream.read_exact(8))
        if ident == b"DATA":
            if length > SYNC_DATA_MAX:
                raise ProtocolError(f"sync DATA chunk of {length} bytes")
            data = stream.read_exact(length)
            if out is not None and error is None:
                try:
                    out.write(data)
                except OSError as exc:
                    error = f"{device_path}: {exc}"
        elif ident == b"DONE":
            mtime = length  # DONE's length field carries the mtime
            break
        else:
            raise ProtocolError(f"unexpected {ident!r} in SEND")
    if out is not None:
        out.close()
    if error is None and tmp is not None:
        try:
            tmp.chmod(stat.S_IMODE(mode))
            os.utime(tmp, (mtime, mtime))
            tmp.replace(target)
        except OSError as exc:
            error = f"{device_path}: {exc}"
    if error is not None:
        if tmp is not None:
            tmp.unlink(missing_ok=True)
        _sync_fail(stream, error)
    else:
        stream.write(b"OKAY" + struct.pack("<I", 0))


def _send_file(stream: Stream, path: Path, device_path: str) -> None:
    """RECV: DATA chunks of at most 64 KiB, then DONE; FAIL if unreadable."""
    try:
        f = path.open("rb")
    except OSError as exc:
        _sync_fail(stream, f"{device_path}: {exc.strerror or exc}")
        return
    with f:
        while chunk := f.read(SYNC_DATA_MAX):
            if not stream.write(b"DATA" + struct.pack("<I", len(chunk)) + chunk):
                return
    stream.write(b"DONE" + struct.pack("<I", 0))


def sync_service(endpoint: AdbEndpoint, stream: Stream) -> None:
    """Serve sync requests ``ID(4) LENGTH(u32) PATH`` until ``QUIT`` or close."""
    sandbox = endpoint.sandbox
    try:
        while True:
            ident, length = struct.unpack("<4sI", stream.read_exact(8))
            if ident == b"QUIT":
                return
            if length > 1024:
                raise ProtocolError(f"sync path of {length} bytes")
            arg = stream.read_exact(length).decode("utf-8", "surrogateescape")
            if ident == b"SEND":
                _receive_file(stream, sandbox, arg)
                continue
            try:
                host = sandbox.host_path(arg)
            except PermissionError as exc:
                if ident == b"STAT":
                    stream.write(b"STAT" + struct.pack("<III", 0, 0, 0))
                elif ident == b"LIST":
                    stream.write(b"DONE" + struct.pack("<IIII", 0, 0, 0, 0))
                else:
                    _sync_fail(stream, str(exc))
                continue
            if ident == b"STAT":
                stream.write(_stat_reply(host))
            elif ident == b"LIST":
                _list(stream, host)
            elif ident == b"RECV":
                _send_file(stream, host, arg)
            else:
                _sync_fail(stream, f"unknown sync command {ident!r}")
                return
    except EOFError:
        return
    except ProtocolError as exc:
        log.warning("bad sync request: %s", exc)


# --- the endpoint ------------------------------------------------------------------------


class AdbEndpoint:
    """A threaded device-mode ADB endpoint (one emulated phone).

    Parameters
    ----------
    port : int
        TCP port on 127.0.0.1 (0: pick a free one; see `port` after `start`).
    sandbox : str or pathlib.Path
        Directory holding the phone's storage (created).
    props : mapping of str to str, optional
        Extra or overriding system properties for ``getprop`` and the banner.
    arch, tree : optional
        An emulated CPU for the shell (`Sandbox`).

    Examples
    --------
    >>> ep = AdbEndpoint(0, "/tmp/phone").start()  # doctest: +SKIP
    >>> # adb connect 127.0.0.1:{ep.port}
    >>> ep.stop()  # doctest: +SKIP
    """

    host = "127.0.0.1"  # loopback only, by design

    def __init__(self, port: int, sandbox: str | Path, props: Mapping[str, str] | None = None,
                 arch: str | None = None, tree: Path | None = None) -> None:
        self.port = port
        self.sandbox = Sandbox(Path(sandbox), props, arch, tree)
        self._listener: socket.socket | None = None
        self._thread: threading.Thread | None = None
        self._connections: set[Connection] = set()
        self._procs: set[subprocess.Popen[bytes]] = set()
        self._lock = threading.Lock()

    def banner(self) -> bytes:
        """Return the CNXN payload ``device::ro.product.name=...;features=...``."""
        props = self.sandbox.props
        fields = [f"{k}={props[k]}" for k in ("ro.product.name", "ro.product.model", "ro.product.device")]
        return ("device::" + ";".join(fields) + ";features=" + ",".join(FEATURES)).encode()

    def service_handler(self, service: str) -> ServiceHandler | None:
        """Return the handler of an ``OPEN`` service name, or ``None`` if unsupported."""
        for prefix in ("shell:", "exec:"):
            if service.startswith(prefix):
                command = service[len(prefix):]
                return lambda stream: shell_service(self, command, stream)
        if service == "sync:":
            return lambda stream: sync_service(self, stream)
        return None

    def track(self, proc: subprocess.Popen[bytes]) -> None:
        """Remember a running command (killed by `stop`)."""
        with self._lock:
            self._procs.add(proc)

    def untrack(self, proc: subprocess.Popen[bytes]) -> None:
        """Forget a finished command."""
        with self._lock:
            self._procs.discard(proc)

    def running(self) -> list[int]:
        """Return the process ids of the shell commands now running (each leads its own group)."""
        with self._lock:
            return [proc.pid for proc in self._procs if proc.poll() is None]

    def start(self) -> AdbEndpoint:
        """Listen on 127.0.0.1 and serve connections in a background thread.

        Returns
        -------
        AdbEndpoint
            ``self``, with `port` set to the bound port.
        """
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((self.host, self.port))
        listener.listen(8)
        self.port = listener.getsockname()[1]
        self._listener = listener
        self._thread = threading.Thread(target=self._accept_loop, daemon=True, name=f"adb-endpoint-{self.port}")
        self._thread.start()
        log.info("emulated phone listening on %s:%d (sandbox %s)", self.host, self.port, self.sandbox.root)
        return self

    def _accept_loop(self) -> None:
        listener = self._listener  # stop() clears the attribute while this thread may be between accepts
        assert listener is not None
        while True:
            try:
                sock, _ = listener.accept()
            except OSError:
                return  # listener closed by stop()
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            conn = Connection(self, sock)
            with self._lock:
                self._connections.add(conn)
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: Connection) -> None:
        conn.serve()
        with self._lock:
            self._connections.discard(conn)

    def stop(self) -> None:
        """Stop listening, drop every connection and kill every running command."""
        if self._listener is not None:
            try:
                self._listener.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            self._listener.close()
            self._listener = None
        with self._lock:
            conns, procs = list(self._connections), list(self._procs)
        for conn in conns:
            conn.shutdown()
        for proc in procs:
            _kill_group(proc)
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                log.warning("command %d did not die", proc.pid)
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def serve_forever(self, stop: threading.Event) -> None:
        """Serve until ``stop`` is set (the command-line entry point)."""
        self.start()
        stop.wait()
        self.stop()

    def __enter__(self) -> AdbEndpoint:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def iter_messages(data: bytes) -> Iterator[Message]:
    """Decode consecutive packets from ``data`` (for tests and debugging).

    Raises
    ------
    ProtocolError
        On a malformed header or truncated payload.
    """
    offset = 0
    while offset < len(data):
        command, arg0, arg1, length, _ = decode_header(data[offset:offset + HEADER.size])
        offset += HEADER.size
        payload = data[offset:offset + length]
        if len(payload) != length:
            raise ProtocolError("truncated payload")
        offset += length
        yield Message(command, arg0, arg1, payload)


def main(argv: list[str] | None = None) -> int:
    """Command line of the emulated phone's endpoint.

    ``python -m devices.emulation.adb_endpoint --port P --sandbox DIR [--pidfile F] [--arch A --tree T]``.

    Returns
    -------
    int
        The exit status.
    """
    parser = argparse.ArgumentParser(
        prog="python -m devices.emulation.adb_endpoint", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--port", type=int, required=True, help="TCP port on 127.0.0.1")
    parser.add_argument("--sandbox", type=Path, required=True, help="directory holding the phone's storage")
    parser.add_argument("--pidfile", type=Path, help="write this process's id here while running")
    parser.add_argument("--arch", choices=ARCHES, help="emulated CPU of the phone's shell (qemu-user)")
    parser.add_argument("--tree", type=Path, help="the Debian tree of --arch")
    parser.add_argument("-v", "--verbose", action="store_true")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(asctime)s adb-endpoint %(levelname)s %(message)s")
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    endpoint = AdbEndpoint(args.port, args.sandbox, arch=args.arch, tree=args.tree)
    if args.pidfile:
        args.pidfile.write_text(f"{os.getpid()}\n")
    try:
        endpoint.serve_forever(stop)
    finally:
        if args.pidfile:
            args.pidfile.unlink(missing_ok=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
