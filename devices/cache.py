"""Where fleetbench keeps its caches on the host.

Every cache has a directory of its own under ``$XDG_CACHE_HOME/fleetbench`` (else
``~/.cache/fleetbench``), and an environment variable that names another directory:

- ``rootfs`` (``FLEETBENCH_ROOTFS_DIR``): the emulated aarch64 board's Debian tree;
- ``bundles`` (``FLEETBENCH_BUNDLE_DIR``): phones' runtime bundles;
- ``runner`` (``FLEETBENCH_RUNNER_DIR``): ``runner.pyz``, by content;
- ``wheels`` (``FLEETBENCH_WHEELS_DIR``): the wheels fetched for devices;
- ``check-sets`` (``FLEETBENCH_CHECK_SETS_DIR``): the artifact set of the provision check.

They live outside any checkout, so a clone, a wheel or a demo's output never carries them,
and one user's projects share them.
"""

from __future__ import annotations

import os
from pathlib import Path


def fleetbench_cache(variable: str, leaf: str, environ: dict[str, str] | None = None) -> Path:
    """Return one of fleetbench's cache directories (it is not created here).

    Parameters
    ----------
    variable : str
        Environment variable that names the directory when set.
    leaf : str
        Otherwise the directory is ``$XDG_CACHE_HOME/fleetbench/<leaf>``, else
        ``~/.cache/fleetbench/<leaf>``.
    environ : dict, optional
        Environment to read (default ``os.environ``).

    Returns
    -------
    pathlib.Path
        An absolute path.
    """
    env = os.environ if environ is None else environ
    if env.get(variable):
        return Path(os.path.abspath(os.path.expanduser(env[variable])))
    base = env.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(os.path.abspath(base)) / "fleetbench" / leaf
