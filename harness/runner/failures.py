"""The runner's failures with a known status: bad arguments, missing runtime, out of memory.

Standard library only. Anything else a mode raises is a "runner error"
(`harness.runner.modes.guarded`).
"""

from __future__ import annotations

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


class RunnerFailure(Exception):
    """A failure with a known status (bad arguments, missing runtime, out of memory)."""

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
