"""Atomic file writes: a reader sees the old file or the whole new one, never half of it.

Every file fleetbench writes for others to read (fleet state, ``known_hosts``, bundle
stamps, bench data, reports, exports, files fetched from devices over SSH, ADB or a local
copy) goes through `atomic_path`: the content is written
to a temporary file in the target's directory (same file system, so the rename is
atomic), then `os.replace` puts it in place; on any failure the temporary file is
removed and the target is untouched. The exporters and the on-device runner keep their
own (their packages may not import this one).
"""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


#: Permission bits a new file gets from `open` in this process (read once, at import).
DEFAULT_MODE = 0o666 & ~_umask()


@contextmanager
def atomic_path(target: Path | str, *, mode: int | None = None) -> Iterator[Path]:
    """Yield a temporary path beside ``target``; rename it over ``target`` when the block succeeds.

    Parameters
    ----------
    target : path
        The file to write; its parent directories are created.
    mode : int, optional
        Permission bits to give the file (default `DEFAULT_MODE`, what `open` would give;
        the temporary file itself is private until it is renamed).

    Yields
    ------
    pathlib.Path
        An empty file in ``target``'s directory, for a writer that wants a path.
    """
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(prefix=f".{target.name}.tmp-", dir=target.parent)
    os.close(fd)
    tmp = Path(name)
    try:
        yield tmp
        os.chmod(tmp, DEFAULT_MODE if mode is None else mode)
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)


@contextmanager
def atomic_open(target: Path | str, binary: bool = False, *, mode: int | None = None) -> Iterator[IO[Any]]:
    """Open a temporary file beside ``target`` for writing; rename it over ``target`` when the block succeeds.

    Parameters
    ----------
    target : path
    binary : bool
        Write bytes instead of text (UTF-8).
    mode : int, optional
        Permission bits (`atomic_path`).

    Yields
    ------
    file object
    """
    with atomic_path(target, mode=mode) as tmp:
        with open(tmp, "wb") if binary else open(tmp, "w", encoding="utf-8") as out:
            yield out


def atomic_write(target: Path | str, data: bytes | str, *, mode: int | None = None) -> None:
    """Write ``data`` (bytes, or text as UTF-8) to ``target`` atomically (`atomic_path`)."""
    with atomic_open(target, isinstance(data, bytes), mode=mode) as out:
        out.write(data)


def atomic_copy(source: Path | str, target: Path | str) -> None:
    """Copy ``source`` to ``target`` atomically, with ``source``'s permission bits.

    Parameters
    ----------
    source, target : path
        Target's parent directories are created; a reader never sees a half-written target.
    """
    with atomic_path(target, mode=stat.S_IMODE(os.stat(source).st_mode)) as tmp:
        with open(source, "rb") as src, open(tmp, "wb") as out:
            shutil.copyfileobj(src, out, 1 << 20)
