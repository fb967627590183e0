"""`LocalTransport`: run commands on this machine with subprocess (no shell).

A streamed process (`LocalTransport.start`) runs in its own session; `LocalProcess.close`
closes its stdin, gives it the grace period to exit, and then stops it (and anything it
started) through `devices.processes.stop`, which waits until it has gone.

A confined transport (``confine``: a local device with an ``emulate`` block, see
`devices.emulation.emulate.local_confinement`) starts every command, streamed or not, under the
device's limits, read afresh for each command:

- cgroups, RLIMIT_AS and cpu affinity are entered by the child between fork and exec
  (`devices.emulation.limits.preexec`), so nothing of the command runs outside them;
- a CPU share without a cgroup (``duty-cycle``) gets the command its own duty-cycle
  supervisor (`devices.emulation.limits.start_duty_cycle`), which follows the command's process
  tree and exits with it. The command is stopped (SIGSTOP) as soon as it is started
  and the supervisor's first period resumes it, so only the moment between its
  ``exec`` and that signal runs unthrottled;
- the confinement's environment (the device's marker, which ``fleet down`` finds) is
  added to the command's.
"""

from __future__ import annotations

import errno
import functools
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from devices import processes
from devices.emulation import limits
from devices.errors import CommandTimeout, OutOfSpace, TransportError
from devices.files import atomic_copy
from devices.transport import RunResult, StreamingProcess, read_capped, too_large

#: Seconds a command's duty-cycle supervisor gets to exit once the command has ended.
DUTY_EXIT_S = 5.0


@dataclass(frozen=True)
class Confinement:
    """The limits a command of a confined `LocalTransport` starts under.

    Attributes
    ----------
    plan : devices.emulation.limits.Plan
        Its cgroups, memory and cpu methods, as ``fleet up`` applied them.
    env : mapping of str to str
        Added to the command's environment.
    """

    plan: limits.Plan
    env: Mapping[str, str] = field(default_factory=dict)


class LocalTransport:
    """Transport for this machine.

    Parameters
    ----------
    workdir : str or pathlib.Path, optional
        Working directory of commands and base of relative paths in `put` / `get`
        (``~`` expanded); the current directory when ``None``.
    confine : callable, optional
        Called before each command; returns the `Confinement` it starts under, or raises
        `devices.errors.TransportError` when the limits are not in place (the command
        is then not started). None: commands run unconfined.
    """

    def __init__(self, workdir: str | Path | None = None, confine: Callable[[], Confinement] | None = None) -> None:
        self.workdir = Path(os.path.expanduser(str(workdir))) if workdir is not None else None
        self.confine = confine

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
        OutputTooLarge
            If it wrote more than `devices.transport.MAX_OUTPUT_BYTES` to stdout or stderr
            (its process group was killed).
        TransportError
            If the program cannot be started (not found, not executable), or, for a
            confined transport, the device's limits are not in place (what ``confine``
            raised, e.g. `devices.errors.Unreachable`).
        """
        start = time.monotonic()
        proc, duty = self._popen(argv, subprocess.DEVNULL, None)
        assert proc.stdout is not None and proc.stderr is not None
        try:
            reads = [functools.partial(os.read, stream.fileno()) for stream in (proc.stdout, proc.stderr)]
            (out, err), readers, ended = read_capped(reads, start + timeout)
            if ended:
                try:
                    proc.wait(max(0.0, start + timeout - time.monotonic()))
                except subprocess.TimeoutExpired:
                    ended = False
            if not ended:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                proc.wait()
                for reader in readers:
                    reader.join(1.0)
                if out.over or err.over:
                    raise too_large((out, err), ("stdout", "stderr"), "local", argv[0])
                raise CommandTimeout(f"local command {argv[0]!r} did not finish within {timeout:g} s (killed)")
        finally:
            proc.stdout.close()
            proc.stderr.close()
            _end_duty(duty)
        return RunResult(
            rc=proc.returncode,
            stdout=out.data().decode("utf-8", "replace"),
            stderr=err.data().decode("utf-8", "replace"),
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
            If the program cannot be started, or its limits are not in place (as in `run`).
        """
        proc, duty = self._popen(argv, subprocess.PIPE, env)
        return LocalProcess(proc, f"{argv[0]} (local pid {proc.pid})", duty)

    def _popen(
        self, argv: Sequence[str], stdin: int, env: Mapping[str, str] | None
    ) -> tuple[subprocess.Popen[bytes], subprocess.Popen[bytes] | None]:
        """Start ``argv`` in ``workdir``, in its own session, stdout and stderr piped, under the confinement.

        Returns the process and its duty-cycle supervisor (None unless the confinement
        holds the CPU share by duty cycle).
        """
        if not argv:
            raise ValueError("empty argv")
        confinement = self.confine() if self.confine is not None else None
        added = {**(confinement.env if confinement else {}), **(env or {})}
        cwd = self.workdir
        if cwd is not None:
            cwd.mkdir(parents=True, exist_ok=True)
        try:
            proc = subprocess.Popen(
                list(argv),
                cwd=cwd,
                env={**os.environ, **added} if added else None,
                stdin=stdin,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,
                preexec_fn=limits.preexec(confinement.plan) if confinement else None,
            )
        except OSError as exc:
            raise TransportError(f"cannot start {argv[0]!r}: {exc}") from exc
        except subprocess.SubprocessError as exc:  # the preexec hook failed: the limits are gone
            raise TransportError(f"cannot start {argv[0]!r} under the device's limits: {exc}") from exc
        if confinement is None or confinement.plan.cpu != "duty-cycle" or not confinement.plan.cpu_share:
            return proc, None
        os.kill(proc.pid, signal.SIGSTOP)  # the supervisor's first period resumes it
        try:
            duty = limits.start_duty_cycle(proc.pid, confinement.plan.cpu_share)
        except OSError as exc:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            raise TransportError(f"cannot start the duty-cycle supervisor of {argv[0]!r}: {exc}") from exc
        return proc, duty

    def put(self, local: Path, remote: str) -> None:
        """Copy ``local`` to ``remote`` atomically (relative to ``workdir``).

        Raises
        ------
        OutOfSpace
            If ``remote``'s file system is full (``ENOSPC``): one line with the path, the
            bytes to write and the bytes free; nothing is left at ``remote``.
        """
        target = self._path(remote)
        try:
            atomic_copy(Path(local), target)
        except OSError as exc:
            if exc.errno != errno.ENOSPC:
                raise
            raise OutOfSpace(
                f"put {local} to {target}: {exc.strerror} ({Path(local).stat().st_size} bytes to write, "
                f"{_free_bytes(target.parent)} free)"
            ) from None

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
    duty : subprocess.Popen, optional
        Its duty-cycle supervisor, ended with it.
    """

    def __init__(
        self, proc: subprocess.Popen[bytes], description: str, duty: subprocess.Popen[bytes] | None = None
    ) -> None:
        assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
        self.proc = proc
        self.duty = duty
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
        _end_duty(self.duty)
        for stream in (self.proc.stdout, self.proc.stderr):
            if stream is not None:
                stream.close()


def _free_bytes(directory: Path) -> str:
    """Return the free bytes of ``directory``'s file system, as words ("unknown" when it cannot be read)."""
    try:
        return f"{shutil.disk_usage(directory).free} bytes"
    except OSError:
        return "unknown bytes"


def _end_duty(duty: subprocess.Popen[bytes] | None) -> None:
    """Stop a command's duty-cycle supervisor (it resumes what is left of the tree) and reap it."""
    if duty is None:
        return
    if duty.poll() is None:
        duty.terminate()
    try:
        duty.wait(DUTY_EXIT_S)
    except subprocess.TimeoutExpired:
        duty.kill()
        duty.wait()
