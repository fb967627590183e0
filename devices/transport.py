"""The transport contract shared by local, SSH and ADB devices.

A transport runs an argv list on its device and moves files to and from it::

    run(argv, timeout) -> RunResult(rc, stdout, stderr, seconds)
    put(local, remote) / get(remote, local) / close()

Commands are argv lists, never strings: `quote_argv` is the one place where an argv
becomes a POSIX shell command line (for SSH and ADB, whose remote side runs a shell).
Failures to reach or talk to the device raise `devices.errors.TransportError`
subclasses; a command that ran and failed is a `RunResult` with a non-zero ``rc``.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, runtime_checkable


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
