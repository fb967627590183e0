"""What produced a measurement: this host's tool versions and fleetbench's git commit.

Read from installed distribution metadata and ``git``, never by importing the tools, and
stored with every campaign and cell (`harness.store`).
"""

from __future__ import annotations

import functools
import os
import platform
import subprocess
from collections.abc import Mapping
from pathlib import Path

#: Distributions reported by `host_versions` (key -> candidate distribution names).
_DISTRIBUTIONS: Mapping[str, tuple[str, ...]] = {
    "fleetbench": ("fleetbench",),
    "torch": ("torch",),
    "onnx": ("onnx",),
    "onnxruntime": ("onnxruntime-training", "onnxruntime", "onnxruntime-gpu"),
    "numpy": ("numpy",),
}


@functools.lru_cache(maxsize=1)
def _host_versions_cached() -> tuple[tuple[str, str], ...]:
    from importlib import metadata

    found = [("python", platform.python_version())]
    for key, names in _DISTRIBUTIONS.items():
        for name in names:
            try:
                found.append((key, metadata.version(name)))
                break
            except metadata.PackageNotFoundError:
                continue
    return tuple(found)


def host_versions() -> dict[str, str]:
    """Return the versions of Python and of the tools on this host, without importing them.

    Reads installed distribution metadata (`importlib.metadata`), so torch or
    onnxruntime are never imported just to ask their version.

    Returns
    -------
    dict of str to str
        ``python`` and, when installed, ``fleetbench``, ``torch``, ``onnx``,
        ``onnxruntime`` (from ``onnxruntime-training``, else ``onnxruntime``) and ``numpy``.
    """
    return dict(_host_versions_cached())


def git_commit(root: str | os.PathLike[str] | None = None) -> str | None:
    """Return fleetbench's git commit when it runs from a checkout.

    Parameters
    ----------
    root : path, optional
        Repository root; default: the directory above the ``harness`` package.

    Returns
    -------
    str or None
        ``git rev-parse HEAD`` (40 hex digits), or None when there is no checkout,
        no ``git`` executable, or git fails.
    """
    top = Path(root) if root is not None else Path(__file__).resolve().parent.parent
    if not (top / ".git").exists():
        return None
    try:
        result = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=top, capture_output=True, text=True, timeout=10, check=False
        )
    except (OSError, subprocess.SubprocessError):
        return None
    commit = result.stdout.strip()
    if result.returncode != 0 or not commit:
        return None
    return commit
