"""The host's disk: its free bytes, a check before a large write, and the one line of a full file system.

At the bottom of the layers, beside `exporters.userinput` (it imports nothing of
fleetbench): the artifact cache (`exporters.artifacts`, `exporters.torchscript`) and the
profile store (`harness.store`) write on the host, and a file system without room must
be one line that names the path, the bytes needed where they are known and the bytes
free -- never a traceback, never a half-written file that looks valid (the writers
write atomically, so a failed write leaves nothing behind but what was there).

`DiskFull` is an ``OSError`` with ``errno.ENOSPC``: the ``fleetbench`` command prints it as
one line and exits with status 1, as it does any failure of the environment
(`fleetbench.cli.ENVIRONMENT_ERRORS`).
"""

from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path

#: What a library says when a write found the file system full (C's ``strerror(ENOSPC)``, lower case).
NO_SPACE_MESSAGE = os.strerror(errno.ENOSPC).lower()

#: A file system with fewer free bytes than this is full for a writer that failed there:
#: numpy's short writes (``"N requested and M written"``) carry no errno.
LOW_SPACE_BYTES = 64 * 1024


class DiskFull(OSError):
    """A file system of the host has no room for a write; the message is one line naming the path.

    Parameters
    ----------
    message : str
        What was written where, the bytes needed (when known) and the bytes free.
    path : path
        The file or directory that could not be written.
    """

    def __init__(self, message: str, path: Path | str) -> None:
        super().__init__(message)
        self.errno = errno.ENOSPC
        self.path = Path(path)


def free_bytes(path: Path | str) -> int | None:
    """Return the bytes an unprivileged writer may still use on ``path``'s file system.

    Parameters
    ----------
    path : path
        A file or directory; a missing one is looked up through its nearest existing parent.

    Returns
    -------
    int or None
        ``shutil.disk_usage(...).free``; None when it cannot be read.
    """
    here = Path(path).absolute()
    while not here.exists() and here != here.parent:
        here = here.parent
    try:
        return shutil.disk_usage(here).free
    except OSError:
        return None


def check_room(path: Path | str, needed: int, what: str) -> int | None:
    """Refuse a write of about ``needed`` bytes into ``path`` that its file system cannot hold.

    Parameters
    ----------
    path : path
        Where the write goes.
    needed : int
        Bytes it needs at least (an estimate that does not exceed the real size).
    what : str
        What is written, for the message (``"the artifact set fjord-cnn-w0.5-..."``).

    Returns
    -------
    int or None
        The free bytes seen (`free_bytes`), for `disk_full` should the write fail all the same.

    Raises
    ------
    DiskFull
        When the free bytes are known and fewer than ``needed``.
    """
    free = free_bytes(path)
    if free is not None and free < needed:
        raise DiskFull(
            f"no room for {what} in {path}: it needs about {needed} bytes, {free} bytes are free on its file system",
            path,
        )
    return free


def is_disk_full(exc: BaseException, path: Path | str | None = None) -> bool:
    """Tell whether an exception of a write says that the file system is full.

    Parameters
    ----------
    exc : BaseException
    path : path, optional
        Where the write went.

    Returns
    -------
    bool
        True for an ``OSError`` with ``errno.ENOSPC`` or ``errno.EDQUOT`` (a full quota),
        for a library's message holding `NO_SPACE_MESSAGE`, and for any ``OSError`` when
        ``path``'s file system has fewer than `LOW_SPACE_BYTES` free (a short write).
    """
    if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return True
    if NO_SPACE_MESSAGE in str(exc).lower():
        return True
    if isinstance(exc, OSError) and path is not None:
        free = free_bytes(path)
        return free is not None and free < LOW_SPACE_BYTES
    return False


def disk_full(path: Path | str, what: str, exc: BaseException, free_before: int | None = None) -> DiskFull:
    """Return the `DiskFull` of a write into ``path`` that failed with ``exc`` (`is_disk_full`).

    Parameters
    ----------
    path : path
        Where the write went.
    what : str
        What was written, for the message.
    exc : BaseException
        What the write raised.
    free_before : int, optional
        The free bytes before the write (`check_room`); the message says them instead of
        the bytes free now (a writer that cleans up frees what it wrote).

    Returns
    -------
    DiskFull
        Its message names ``path``, says that the file system filled up and the free bytes seen.
    """
    if isinstance(exc, DiskFull):
        return exc
    if free_before is not None:
        seen = f"{free_before} bytes were free before writing"
    else:
        free = free_bytes(path)
        seen = f"{free} bytes are free" if free is not None else "its free space is unknown"
    return DiskFull(f"no room for {what} in {path}: the file system is full ({seen})", path)
