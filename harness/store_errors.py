"""The profile store's errors: a store that cannot be used as given, and one SQLite cannot use just now.

`StoreError` is the user's (a file that is not a store, a newer schema): one line, exit
status 2. `StoreUnavailable` is the environment's (a lock held too long, a read-only or full
file system, an I/O error): one line naming the file, exit status 1. `environmental` tells the
two apart by SQLite's result code, and `unavailable` words the second.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

from exporters.host_disk import free_bytes
from exporters.userinput import InputError


class StoreError(InputError):
    """A profile store that cannot be used as given (not a store, newer schema, missing).

    An `InputError`, so the CLI prints it as one line and exits with status 2.
    """


class StoreUnavailable(RuntimeError):
    """A usable profile store that SQLite could not read or write just now.

    Locked by another writer beyond `harness.store.BUSY_TIMEOUT_S`, a read-only file or directory, a
    full disk, an I/O error. A failure of the environment (the CLI exits with status 1);
    the message names the file.
    """


#: SQLite primary result codes that say the environment failed, not the file or the SQL:
#: PERM, BUSY, LOCKED, READONLY, IOERR, FULL, CANTOPEN, PROTOCOL.
_ENVIRONMENT_CODES = frozenset({3, 5, 6, 8, 10, 13, 14, 15})

#: SQLite's primary result code of a write that found the file system full (SQLITE_FULL).
_FULL_CODE = 13


def unavailable(path: Path, exc: sqlite3.Error, doing: str = "") -> StoreUnavailable:
    """Return the `StoreUnavailable` of an environmental SQLite error on the store at ``path``.

    Parameters
    ----------
    path : pathlib.Path
        The store file.
    exc : sqlite3.Error
        An error `environmental` says is the environment's.
    doing : str
        What was being done, leading the message (``"cannot use "``), or nothing.

    Returns
    -------
    StoreUnavailable
        One line naming the file; for a full file system (SQLITE_FULL) it says so and the
        bytes free there.
    """
    code = getattr(exc, "sqlite_errorcode", None)
    if code is not None and int(code) & 0xFF == _FULL_CODE:
        free = free_bytes(path)
        seen = f"{free} bytes free" if free is not None else "free space unknown"
        return StoreUnavailable(f"{doing}profile store {path}: its file system is full ({seen}): {exc}")
    return StoreUnavailable(f"{doing}profile store {path}: {exc}")


def environmental(exc: sqlite3.Error) -> bool:
    """Whether an SQLite error is a failure of the environment (lock, permission, disk).

    Parameters
    ----------
    exc : sqlite3.Error

    Returns
    -------
    bool
        True for the result codes in `_ENVIRONMENT_CODES` (the primary code, the low
        byte of an extended one); also True on a Python without ``sqlite_errorcode``
        (3.10), where every operational error counts.
    """
    code = getattr(exc, "sqlite_errorcode", None)
    if code is None:
        return isinstance(exc, sqlite3.OperationalError)
    return (int(code) & 0xFF) in _ENVIRONMENT_CODES
