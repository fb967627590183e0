"""The transport contract shared by local, SSH and ADB devices.

A transport runs an argv list on its device and moves files to and from it::

    run(argv, timeout) -> RunResult(rc, stdout, stderr, seconds)
    put(local, remote) / get(remote, local) / close()
    start(argv, env) -> Process

Commands are argv lists, never strings: `quote_argv` is the one place where an argv
becomes a POSIX shell command line (for SSH and ADB, whose remote side runs a shell).
Failures to reach or talk to the device raise `devices.errors.TransportError`
subclasses; a command that ran and failed is a `RunResult` with a non-zero ``rc``.

Streaming processes
-------------------
``start`` runs a long-lived process (the resident runner) and returns a `Process`:
lines written to its stdin, lines read from its stdout with a timeout, the end of its
stderr kept apart, ``alive``, and ``close``, which returns once the process is gone.
Decisions:

* **Lines, UTF-8.** The process speaks one text line per message; ``read_line`` hands
  out complete lines without the newline and never a partial line. Bytes are read by
  one background thread per stream (so stdout and stderr are drained concurrently and a
  chatty stderr can never block the process), complete lines wait in a queue.
* **A timeout leaves the process running** (`CommandTimeout`): whether to wait longer or
  kill it is the caller's policy. End of output raises `ProcessEnded` with the exit status
  and the stderr tail, every time it is read again.
* **close** first lets the process end by itself (end of its stdin where the transport
  can signal one), then kills it and waits until it has gone. Each transport knows the
  process's pid on the device for that: local from ``Popen`` (stopped through
  `devices.processes`), SSH and ADB from a tagged line the remote shell prints before
  it ``exec``-s the command.
* `StreamingProcess` holds this machinery once; the transports only say how bytes move,
  how the process is killed and how its exit status is read.
"""

from __future__ import annotations

import queue
import shlex
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, runtime_checkable

from devices.errors import CommandTimeout, OutputTooLarge, ProcessEnded, TransportError

#: Bytes of a streamed process's stderr kept for `Process.stderr_tail`.
STDERR_KEEP = 64 * 1024
#: Most bytes of one streamed stdout line kept (16 MiB): a longer line is handed out cut to this
#: many bytes and one more (the rest up to its newline dropped), so a process that never ends a
#: line cannot fill the host's memory, and its reader sees that the line went over.
MAX_LINE_BYTES = 16 * 1024 * 1024
#: Bytes read per ``recv`` by the reader threads.
READ_CHUNK = 1 << 16
#: Most bytes of a one-shot command's stdout, and of its stderr, the host keeps (`Transport.run`):
#: a device that writes more has its command stopped, which then fails with `OutputTooLarge`.
MAX_OUTPUT_BYTES = MAX_LINE_BYTES
#: Seconds `Process.close` waits for the process to end by itself before killing it.
CLOSE_GRACE_S = 2.0
#: Seconds an ended process's stderr gets to be drained before the error quotes it.
STDERR_DRAIN_S = 2.0


class CappedOutput:
    """One output stream of a one-shot command, kept up to a cap (`MAX_OUTPUT_BYTES` by default).

    Parameters
    ----------
    cap : int, optional
        Most bytes kept; the module's `MAX_OUTPUT_BYTES` when None (read when made).
    """

    def __init__(self, cap: int | None = None) -> None:
        self.cap = MAX_OUTPUT_BYTES if cap is None else cap
        self.size = 0
        self._chunks: list[bytes] = []

    @property
    def over(self) -> bool:
        """Whether the stream went over the cap (what came after was not kept)."""
        return self.size > self.cap

    def add(self, data: bytes) -> bool:
        """Keep ``data`` unless the stream goes over the cap; return whether reading should go on."""
        self.size += len(data)
        if self.over:
            return False
        self._chunks.append(data)
        return True

    def data(self) -> bytes:
        """Return the bytes kept."""
        return b"".join(self._chunks)


def read_capped(
    reads: Sequence[Callable[[int], bytes]], deadline: float, clock: Callable[[], float] = time.monotonic
) -> tuple[list[CappedOutput], list[threading.Thread], bool]:
    """Read a command's streams, each on a thread, until all end, one goes over its cap, or time is up.

    Parameters
    ----------
    reads : sequence of callables
        ``read(n)`` of each stream (stdout, stderr): at most ``n`` bytes, ``b""`` at its
        end. A read that raises ends its stream (the connection is gone).
    deadline : float
        When to stop waiting, on ``clock``'s scale.
    clock : callable
        Monotonic seconds.

    Returns
    -------
    outputs : list of CappedOutput
        One per stream; a stream that went over its cap says so (``over``) and its
        reader has stopped, so the caller stops the command.
    readers : list of threading.Thread
        The reader threads (daemons), for the caller to join once it has stopped the command.
    ended : bool
        True when every stream ended within its cap before the deadline.
    """
    outputs = [CappedOutput() for _ in reads]
    lock = threading.Lock()
    wake = threading.Event()
    finished = [0]

    def pump(read: Callable[[int], bytes], sink: CappedOutput) -> None:
        try:
            while (data := read(READ_CHUNK)) and sink.add(data):
                pass
        except Exception:  # noqa: BLE001 - a stream that cannot be read has ended
            pass
        finally:
            with lock:
                finished[0] += 1
            wake.set()

    pairs = zip(reads, outputs, strict=True)
    readers = [threading.Thread(target=pump, args=(read, sink), daemon=True) for read, sink in pairs]
    for reader in readers:
        reader.start()
    while True:
        wake.clear()  # before looking: a reader that ends after this wakes the wait below
        with lock:
            done = finished[0] == len(readers)
        remaining = deadline - clock()
        if done or remaining <= 0 or any(o.over for o in outputs):
            return outputs, readers, done and not any(o.over for o in outputs)
        wake.wait(remaining)


def too_large(outputs: Sequence[CappedOutput], names: Sequence[str], where: str, program: str) -> OutputTooLarge:
    """Return the `OutputTooLarge` of a command one of whose ``outputs`` went over its cap.

    Parameters
    ----------
    outputs : sequence of CappedOutput
    names : sequence of str
        The streams' names (``stdout``, ``stderr``), in the order of ``outputs``.
    where : str
        The device (its address or serial).
    program : str
        The command's program.

    Returns
    -------
    OutputTooLarge
    """
    name, cap = next((n, o.cap) for n, o in zip(names, outputs, strict=True) if o.over)
    return OutputTooLarge(f"{where}: {program!r} wrote over {cap} bytes to its {name} (stopped)")


@dataclass(frozen=True)
class RunResult:
    """What one command did on a device.

    Attributes
    ----------
    rc : int
        Exit status (negative: killed by that signal number).
    stdout, stderr : str
        Decoded output (UTF-8, undecodable bytes replaced).
    seconds : float
        Wall time from start to exit, measured on this machine.
    """

    rc: int
    stdout: str
    stderr: str
    seconds: float

    @property
    def ok(self) -> bool:
        """Whether the command exited with status 0."""
        return self.rc == 0


@runtime_checkable
class Transport(Protocol):
    """Run commands on, and copy files to and from, one device."""

    def run(self, argv: Sequence[str], timeout: float) -> RunResult:
        """Run ``argv`` on the device; raise `CommandTimeout` after ``timeout`` seconds."""
        ...

    def put(self, local: Path, remote: str) -> None:
        """Copy the local file ``local`` to the path ``remote`` on the device."""
        ...

    def get(self, remote: str, local: Path) -> None:
        """Copy the device's file ``remote`` to the local path ``local``."""
        ...

    def close(self) -> None:
        """Release the connection (idempotent)."""
        ...

    def start(self, argv: Sequence[str], env: Mapping[str, str] | None = None) -> Process:
        """Start ``argv`` on the device as a long-lived `Process` (stdin and stdout as lines)."""
        ...


@runtime_checkable
class Process(Protocol):
    """A long-lived process on a device, spoken to in lines (see the module notes)."""

    def write_line(self, line: str) -> None:
        """Write ``line`` and a newline to the process's stdin; raise `ProcessEnded` if it has gone."""
        ...

    def read_line(self, timeout: float) -> str:
        """Return the next stdout line; raise `CommandTimeout` after ``timeout`` s, `ProcessEnded` at its end."""
        ...

    def stderr_tail(self, limit: int = 4096) -> str:
        """Return the last ``limit`` characters of the process's stderr."""
        ...

    def alive(self) -> bool:
        """Whether the process still runs."""
        ...

    @property
    def returncode(self) -> int | None:
        """Exit status once the process has ended (``None`` while it runs or when unknown)."""
        ...

    def close(self, grace: float = CLOSE_GRACE_S) -> int | None:
        """End the process (gently for ``grace`` seconds, then killed) and return once it has gone."""
        ...


def quote_argv(argv: Sequence[str]) -> str:
    """Return a POSIX shell command line that runs exactly ``argv``.

    The single place where argv lists become shell text: every argument is quoted
    so that spaces, quotes, ``;``, ``$(...)``, backticks and newlines reach the
    program as data and are never interpreted by the remote shell.

    Parameters
    ----------
    argv : sequence of str
        Program and arguments; must not be empty.

    Returns
    -------
    str

    Raises
    ------
    ValueError
        If ``argv`` is empty or an argument contains a NUL byte (no shell can pass it).
    """
    if not argv:
        raise ValueError("empty argv")
    for arg in argv:
        if "\x00" in arg:
            raise ValueError("an argument contains a NUL byte")
    return " ".join(shlex.quote(arg) for arg in argv)


def env_argv(argv: Sequence[str], env: Mapping[str, str] | None) -> list[str]:
    """Return ``argv`` run through ``env NAME=VALUE ...`` when ``env`` is given (for remote shells).

    Parameters
    ----------
    argv : sequence of str
    env : mapping of str to str, optional

    Returns
    -------
    list of str

    Raises
    ------
    ValueError
        If a variable name is empty or holds ``=``.
    """
    if not env:
        return list(argv)
    for name in env:
        if not name or "=" in name:
            raise ValueError(f"bad environment variable name {name!r}")
    return ["env", *(f"{k}={v}" for k, v in env.items()), *argv]


class StreamingProcess:
    """The machinery every `Process` shares: reader threads, the line queue and the stderr tail.

    Subclasses pass how bytes move (``send``, ``recv_out``, ``recv_err``) and implement
    `_alive`, `_returncode`, `_terminate` and, where the remote shell adds lines of its
    own, `_filter_line`.

    Parameters
    ----------
    description : str
        Names the process in messages (``"python3 on user@host:22"``).
    send : callable
        Writes bytes to the process's stdin (all of them, or raises ``OSError``).
    recv_out : callable
        ``recv_out(n)`` returns up to ``n`` bytes of stdout, ``b""`` at its end.
    recv_err : callable, optional
        The same for stderr, when the transport keeps it apart.
    """

    def __init__(
        self,
        description: str,
        send: Callable[[bytes], None],
        recv_out: Callable[[int], bytes],
        recv_err: Callable[[int], bytes] | None = None,
    ) -> None:
        self.description = description
        self._send = send
        self._lines: queue.Queue[bytes | None] = queue.Queue()
        self._err = bytearray()
        self._err_lock = threading.Lock()
        self._write_lock = threading.Lock()
        self._closed = False
        self._out_ended = threading.Event()
        self._readers = [threading.Thread(target=self._pump_out, args=(recv_out,), daemon=True)]
        if recv_err is not None:
            self._readers.append(threading.Thread(target=self._pump_err, args=(recv_err,), daemon=True))
        for reader in self._readers:
            reader.start()

    # -- reader threads -------------------------------------------------------------------

    def _pump_out(self, recv: Callable[[int], bytes]) -> None:
        pending = b""
        try:
            while data := _recv(recv):
                pending += data
                *complete, pending = pending.split(b"\n")
                for line in complete:
                    kept = self._filter_line(line[: MAX_LINE_BYTES + 1])
                    if kept is not None:
                        self._lines.put(kept)
                pending = pending[: MAX_LINE_BYTES + 1]
            if pending:
                kept = self._filter_line(pending, last=True)
                if kept is not None:
                    self._lines.put(kept)
        finally:
            self._out_ended.set()
            self._lines.put(None)

    def _pump_err(self, recv: Callable[[int], bytes]) -> None:
        while data := _recv(recv):
            data = self._filter_err(data)
            with self._err_lock:
                self._err += data
                del self._err[:-STDERR_KEEP]

    def _filter_line(self, line: bytes, last: bool = False) -> bytes | None:
        """Return the stdout line to hand out, or ``None`` for a line of the transport's own.

        ``last`` marks an unterminated line at the end of the output (the process died
        mid-line); it is dropped unless a subclass says otherwise.
        """
        return None if last else line

    def _filter_err(self, data: bytes) -> bytes:
        """Return the stderr bytes to keep (a subclass strips lines of its own)."""
        return data

    # -- Process ----------------------------------------------------------------------------

    def write_line(self, line: str) -> None:
        """Write ``line`` and a newline to the process's stdin.

        Parameters
        ----------
        line : str
            Must not contain a newline.

        Raises
        ------
        ValueError
            If ``line`` holds a newline.
        ProcessEnded
            If the process (or the stream to it) has gone; also once its output has ended
            (a write into a closed stream is not always refused at once).
        """
        if "\n" in line:
            raise ValueError("a line must not contain a newline")
        if self._out_ended.is_set():
            raise self._ended("its output had ended")
        try:
            with self._write_lock:
                self._send(line.encode("utf-8") + b"\n")
        except (OSError, EOFError, ValueError) as exc:
            raise self._ended(f"writing failed ({type(exc).__name__}: {exc})") from None

    def read_line(self, timeout: float) -> str:
        """Return the next complete stdout line, without its newline.

        Parameters
        ----------
        timeout : float
            Seconds to wait for it.

        Returns
        -------
        str
            Decoded as UTF-8 (undecodable bytes replaced).

        Raises
        ------
        CommandTimeout
            No complete line within ``timeout`` seconds (the process keeps running).
        ProcessEnded
            Its output ended (exited, killed, or the stream to it closed).
        """
        try:
            line = self._lines.get(timeout=max(0.0, timeout))
        except queue.Empty:
            raise CommandTimeout(f"{self.description}: no reply line within {timeout:g} s") from None
        if line is None:
            self._lines.put(None)  # stay ended for later readers
            raise self._ended("its output ended")
        return line.decode("utf-8", "replace")

    def stderr_tail(self, limit: int = 4096) -> str:
        """Return the last ``limit`` characters of the process's stderr (decoded, stripped).

        Parameters
        ----------
        limit : int

        Returns
        -------
        str
        """
        with self._err_lock:
            data = bytes(self._err[-limit:])
        return data.decode("utf-8", "replace").strip()

    def alive(self) -> bool:
        """Whether the process still runs."""
        return self._alive()

    @property
    def returncode(self) -> int | None:
        """Exit status once the process has ended, else ``None``."""
        return self._returncode()

    def close(self, grace: float = CLOSE_GRACE_S) -> int | None:
        """End the process and return once it has gone (idempotent).

        Parameters
        ----------
        grace : float
            Seconds the process gets to end by itself (where the transport can close its
            stdin) before it is killed.

        Returns
        -------
        int or None
            Its exit status when known.
        """
        if not self._closed:
            self._closed = True
            self._terminate(grace)
            for reader in self._readers:
                reader.join(timeout=5.0)
            self._release()
        return self.returncode

    def _ended(self, what: str) -> TransportError:
        rc = self._wait_returncode()
        for reader in self._readers[1:]:
            # stdout and stderr arrive apart: the last words may still be on their way
            reader.join(timeout=STDERR_DRAIN_S)
        tail = self.stderr_tail(1000)
        status = "exit status unknown" if rc is None else f"exit status {rc}"
        message = f"{self.description}: {what}; the process ended ({status})" + (f"; stderr: {tail}" if tail else "")
        return ProcessEnded(message, rc, tail)

    # -- transport-specific ---------------------------------------------------------------

    def _wait_returncode(self) -> int | None:
        """Return the exit status after the output ended (waiting briefly for it to be known)."""
        return self._returncode()

    def _alive(self) -> bool:
        raise NotImplementedError

    def _returncode(self) -> int | None:
        raise NotImplementedError

    def _terminate(self, grace: float) -> None:
        raise NotImplementedError

    def _release(self) -> None:
        """Free what the streams held, once the reader threads are done (a subclass hook)."""


def _recv(recv: Callable[[int], bytes]) -> bytes:
    """Call ``recv(READ_CHUNK)``; a closed or broken stream reads as its end."""
    try:
        return recv(READ_CHUNK)
    except (OSError, EOFError, ValueError):
        return b""
