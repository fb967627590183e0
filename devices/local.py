"""`LocalTransport`: run commands on this machine with subprocess (no shell).

A streamed process (`LocalTransport.start`) runs in its own session; `LocalProcess.close`
closes its stdin, gives it the grace period to exit, and then stops it (and anything it
started) through `devices.processes.stop`, which waits until it has gone.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from devices import processes
from devices.errors import CommandTimeout, TransportError
from devices.files import atomic_copy
from devices.transport import RunResult, StreamingProcess


class LocalTransport:
    """Transport for this machine.

    Parameters
    ----------
    workdir : str or pathlib.Path, optional
        Working directory of commands and base of relative paths in `put` / `get`
        (``~`` expanded); the current directory when ``None``.
    """

    def __init__(self, workdir: str | Path | None = None) -> None:
        self.workdir = Path(os.path.expanduser(str(workdir))) if workdir is not None else None

    def _path(self, path: str | Path) -> Path:
        p = Path(os.path.expanduser(str(path)))
        return self.workdir / p if self.workdir is not None and not p.is_absolute() else p

    def run(self, argv: Sequence[str], timeout: float) -> RunResult:
        """Run ``argv`` (no shell) and wait at most ``timeout`` seconds.

        Parameters
        ----------
        argv : sequence of str
            Program and arguments.
        timeout : float
            Seconds; on expiry the command's whole process group is killed.

        Returns
        -------
        RunResult

        Raises
        ------
        CommandTimeout
            If the command did not finish in time.
        TransportError
            If the program cannot be started (not found, not executable).
        """
        start = time.monotonic()
        proc = self._popen(argv, subprocess.DEVNULL, None)
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.communicate()
            raise CommandTimeout(f"local command {argv[0]!r} did not finish within {timeout:g} s (killed)") from None
        return RunResult(
            rc=proc.returncode,
            stdout=out.decode("utf-8", "replace"),
            stderr=err.decode("utf-8", "replace"),
            seconds=time.monotonic() - start,
        )

    def start(self, argv: Sequence[str], env: Mapping[str, str] | None = None) -> LocalProcess:
        """Start ``argv`` (no shell) as a streamed process in its own session.

        Parameters
        ----------
        argv : sequence of str
        env : mapping of str to str, optional
            Added to this process's environment.

        Returns
        -------
        LocalProcess

        Raises
        ------
        TransportError
            If the program cannot be started.
        """
        proc = self._popen(argv, subprocess.PIPE, env)
        return LocalProcess(proc, f"{argv[0]} (local pid {proc.pid})")

    def _popen(self, argv: Sequence[str], stdin: int, env: Mapping[str, str] | None) -> subprocess.Popen[bytes]:
        """Start ``argv`` in ``workdir``, in its own session, stdout and stderr piped."""
        if not argv:
            raise ValueError("empty argv")
        cwd = self.workdir
        if cwd is not None:
            cwd.mkdir(parents=True, exist_ok=True)
        try:
            return subprocess.Popen(
                list(argv),
                cwd=cwd,
                env={**os.environ, **env} if env else None,
                stdin=stdin,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,
            )
        except OSError as exc:
            raise TransportError(f"cannot start {argv[0]!r}: {exc}") from exc

    def put(self, local: Path, remote: str) -> None:
        """Copy ``local`` to ``remote`` atomically (relative to ``workdir``)."""
        atomic_copy(Path(local), self._path(remote))

    def get(self, remote: str, local: Path) -> None:
        """Copy ``remote`` (relative to ``workdir``) to ``local`` atomically."""
        atomic_copy(self._path(remote), Path(local))

    def close(self) -> None:
        """Do nothing: a local transport holds no connection."""


class LocalProcess(StreamingProcess):
    """A `devices.transport.Process` on this machine (see `LocalTransport.start`).

    Parameters
    ----------
    proc : subprocess.Popen
        Started with pipes for stdin, stdout and stderr, in its own session.
    description : str
    """

    def __init__(self, proc: subprocess.Popen[bytes], description: str) -> None:
        assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
        self.proc = proc
        self.record = processes.record("resident", proc.pid)
        self._killed = False
        stdin, out, err = proc.stdin, proc.stdout.fileno(), proc.stderr.fileno()

        def send(data: bytes) -> None:
            stdin.write(data)
            stdin.flush()

        super().__init__(description, send, lambda n: os.read(out, n), lambda n: os.read(err, n))

    @property
    def pid(self) -> int:
        """The process id."""
        return self.proc.pid

    def _alive(self) -> bool:
        return self.proc.poll() is None

    def _returncode(self) -> int | None:
        rc = self.proc.poll()
        return -signal.SIGKILL if rc == 0 and self._killed else rc

    def _wait_returncode(self) -> int | None:
        try:
            return self.proc.wait(timeout=1.0)
        except subprocess.TimeoutExpired:
            return None

    def _terminate(self, grace: float) -> None:
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.close()
        except OSError:
            pass
        try:
            self.proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            self._killed = True
            processes.stop([self.record], grace=0)
            self.proc.poll()

    def _release(self) -> None:
        for stream in (self.proc.stdout, self.proc.stderr):
            if stream is not None:
                stream.close()
