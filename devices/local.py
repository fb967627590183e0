"""`LocalTransport`: run commands on this machine with subprocess (no shell)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from devices.errors import CommandTimeout, TransportError
from devices.transport import RunResult


def atomic_copy(source: Path, target: Path) -> None:
    """Copy ``source`` to ``target`` through a temporary file and `os.replace`.

    Parameters
    ----------
    source, target : pathlib.Path
        Target's parent directories are created; a reader never sees a half-written target.
    """
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.tmp-", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as out, open(source, "rb") as src:
            shutil.copyfileobj(src, out, 1 << 20)
        shutil.copymode(source, tmp)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


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
        if not argv:
            raise ValueError("empty argv")
        cwd = self.workdir
        if cwd is not None:
            cwd.mkdir(parents=True, exist_ok=True)
        start = time.monotonic()
        try:
            proc = subprocess.Popen(
                list(argv),
                cwd=cwd,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,
            )
        except OSError as exc:
            raise TransportError(f"cannot start {argv[0]!r}: {exc}") from exc
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

    def put(self, local: Path, remote: str) -> None:
        """Copy ``local`` to ``remote`` atomically (relative to ``workdir``)."""
        atomic_copy(Path(local), self._path(remote))

    def get(self, remote: str, local: Path) -> None:
        """Copy ``remote`` (relative to ``workdir``) to ``local`` atomically."""
        atomic_copy(self._path(remote), Path(local))

    def close(self) -> None:
        """Do nothing: a local transport holds no connection."""
