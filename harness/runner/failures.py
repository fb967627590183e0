"""The runner's failures with a known status: bad arguments, missing runtime, out of memory, out of space.

Standard library only. Anything else a mode raises is a "runner error"
(`harness.runner.modes.guarded`).
"""

from __future__ import annotations

import errno
import os

#: Substrings (lower case) of ORT / PyTorch / loader messages that mean an allocation failed.
OOM_MESSAGES = (
    "out of memory",
    "bad_alloc",
    "failed to allocate",
    "can't allocate memory",
    "cannot allocate memory",
    "not enough memory",
    "unable to allocate",
    "memoryerror",
)


#: What a library says when a write found the file system full (C's ``strerror(ENOSPC)``, lower case).
NO_SPACE_MESSAGE = os.strerror(errno.ENOSPC).lower()


class RunnerFailure(Exception):
    """A failure with a known status (bad arguments, missing runtime, out of memory, out of space)."""

    def __init__(self, status: str, message: str, missing: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.missing = missing


def bad(message: str) -> RunnerFailure:
    """Return a "bad arguments" failure.

    Parameters
    ----------
    message : str

    Returns
    -------
    RunnerFailure
    """
    return RunnerFailure("bad arguments", message)


def import_failure(name: str, exc: BaseException) -> RunnerFailure:
    """Return the failure of an import: "out of memory" for an allocation failure, else "missing runtime".

    Parameters
    ----------
    name : str
        The module that could not be imported.
    exc : BaseException

    Returns
    -------
    RunnerFailure
    """
    if is_oom(exc):
        return RunnerFailure("out of memory", f"importing {name}: {exc}")
    return RunnerFailure("missing runtime", f"{name} is not importable: {exc}", missing=name)


def is_oom(exc: BaseException) -> bool:
    """Tell whether an exception is an allocation failure.

    Parameters
    ----------
    exc : BaseException

    Returns
    -------
    bool
        True for ``MemoryError`` and for messages in `OOM_MESSAGES`.
    """
    if isinstance(exc, MemoryError):
        return True
    text = (f"{type(exc).__name__} {exc}").lower()
    return any(m in text for m in OOM_MESSAGES)


def is_out_of_space(exc: BaseException) -> bool:
    """Tell whether an exception says that the device's file system is full.

    Parameters
    ----------
    exc : BaseException

    Returns
    -------
    bool
        True for an ``OSError`` with ``errno.ENOSPC`` (or ``EDQUOT``, a full quota) and
        for a native library's message holding `NO_SPACE_MESSAGE`.
    """
    if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return True
    return NO_SPACE_MESSAGE in str(exc).lower()


def out_of_space(path: str, exc: BaseException) -> RunnerFailure:
    """Return the "out of space" failure of writing ``path``.

    Parameters
    ----------
    path : str
        The file the runner was writing.
    exc : BaseException
        What the write raised.

    Returns
    -------
    RunnerFailure
    """
    reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
    return RunnerFailure("out of space", f"writing {path}: {reason}")
