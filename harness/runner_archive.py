"""The on-device runner as one file: the `harness.runner` package built into a zip application.

A device runs ``python3 runner.pyz bench|train|serve ...``: Python puts the archive first
on ``sys.path`` and runs its top-level ``__main__.py``, which starts the package's entry
point (`harness.runner.__main__`). Inside the archive the package is the top-level
package `PACKAGE`; its modules import one another relatively, so the same files are
``harness.runner`` on the host.

The archive's bytes depend only on the package's sources: members in name order, a
fixed timestamp and mode, stored uncompressed. Its sha256 is therefore stable, and the
content-addressed directory a device keeps it in (`harness.deploy.deploy_runner`) changes
only when the runner does. The host keeps it the same way (`archive_path`): in
``<cache>/<first 16 hex digits of its sha256>/runner.pyz`` (the ``runner`` cache of
`devices.cache`, moved by `RUNNER_DIR_ENV`), written once by
whichever process needs it first and read by every later one, so a process that is killed
leaves nothing behind. Where that cache cannot be written, a process builds the archive into a
temporary directory of its own, removed when the process ends.
"""

from __future__ import annotations

import atexit
import functools
import hashlib
import io
import os
import shutil
import tempfile
import threading
import zipfile
from collections.abc import Iterable
from pathlib import Path

from devices.cache import fleetbench_cache
from devices.files import atomic_path

#: The package's directory on the host.
SOURCE_DIR = Path(__file__).resolve().parent / "runner"

#: The package's name inside the archive.
PACKAGE = "runner"

#: The archive's file name on the host and on devices.
ARCHIVE_NAME = "runner.pyz"

#: Environment variable naming the host's archive cache (`devices.cache`).
RUNNER_DIR_ENV = "FLEETBENCH_RUNNER_DIR"

#: The archive's entry point: the package's ``main`` (relative imports need it imported as a package).
LAUNCHER = f"import sys\nfrom {PACKAGE}.__main__ import main\nsys.exit(main())\n"

#: Held while the process's archive is built, so devices deployed concurrently share one build.
_BUILDING = threading.Lock()

#: Timestamp of every member (the earliest a zip file can hold), so the bytes do not depend on when it was built.
_EPOCH = (1980, 1, 1, 0, 0, 0)


def source_files(directory: Path = SOURCE_DIR) -> list[Path]:
    """Return the package's source files, in name order.

    Parameters
    ----------
    directory : pathlib.Path
        The package directory.

    Returns
    -------
    list of pathlib.Path
        Its ``*.py`` files (no sub-packages, no bytecode).
    """
    return sorted(directory.glob("*.py"), key=lambda path: path.name)


def archive_bytes(files: Iterable[Path], package: str = PACKAGE) -> bytes:
    """Return the zip application of ``files`` as package ``package`` (pure: the same files give the same bytes).

    Parameters
    ----------
    files : iterable of pathlib.Path
        The package's source files.
    package : str
        The package's name inside the archive.

    Returns
    -------
    bytes
        A zip archive with ``__main__.py`` (`LAUNCHER`) and ``<package>/<file name>`` per
        file, in name order, stored, every member dated `_EPOCH` with mode 0644.
    """
    members = [("__main__.py", LAUNCHER.encode())]
    members += sorted((f"{package}/{path.name}", path.read_bytes()) for path in files)
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_STORED) as archive:
        for name, data in members:
            info = zipfile.ZipInfo(name, date_time=_EPOCH)
            info.external_attr = 0o100644 << 16
            info.create_system = 3  # Unix, whatever the host
            archive.writestr(info, data)
    return buffer.getvalue()


def build_archive(directory: Path, files: Iterable[Path] | None = None) -> Path:
    """Write the runner's archive into ``directory``.

    Parameters
    ----------
    directory : pathlib.Path
        Where `ARCHIVE_NAME` is written (created when missing).
    files : iterable of pathlib.Path, optional
        The package's sources (default `source_files`).

    Returns
    -------
    pathlib.Path
        The archive, written atomically.
    """
    return _write(directory, archive_bytes(source_files() if files is None else files))


def _write(directory: Path, data: bytes) -> Path:
    target = directory / ARCHIVE_NAME
    with atomic_path(target) as tmp:
        tmp.write_bytes(data)
    return target


def archive_path() -> Path:
    """Return the runner's archive, the one file pushed to devices, found or built once per process.

    Returns
    -------
    pathlib.Path
        ``<cache>/<sha256 prefix>/runner.pyz`` (see the module docstring), else, where the
        cache cannot be written, ``<temporary directory>/runner.pyz``, the directory removed
        when the process that built it ends.
    """
    with _BUILDING:
        return _built()


@functools.cache
def _built() -> Path:
    data = archive_bytes(source_files())
    directory = fleetbench_cache(RUNNER_DIR_ENV, "runner") / hashlib.sha256(data).hexdigest()[:16]
    cached = directory / ARCHIVE_NAME
    try:
        if cached.is_file() and cached.read_bytes() == data:
            return cached
        return _write(directory, data)
    except OSError:
        return _private(data)


def _private(data: bytes) -> Path:
    directory = Path(tempfile.mkdtemp(prefix="fleetbench-runner-"))
    owner = os.getpid()

    def remove() -> None:
        if os.getpid() == owner:  # a forked child leaves its parent's archive alone
            shutil.rmtree(directory, ignore_errors=True)

    atexit.register(remove)
    return _write(directory, data)
