"""The wheels a device needs, fetched on the host for the device's Python and platform.

Many boards in labs have no internet. ``fleetbench fleet provision --install`` therefore
fetches on the host, with the host's own pip, the wheels that match the *device*:
its Python version (``cp311``), its machine (``x86_64``, ``aarch64``) and its C
library (``manylinux_2_X`` up to the device's glibc). The device only receives files
(`harness.deploy`'s content-addressed cache) and unpacks them into its site.

What is fetched (`wanted_requirements`): numpy when it does not import, and the
runtime when the backends need it -- ``onnxruntime-training`` (which also serves the
``onnx`` backend) where that build has a wheel (x86_64 Linux, Python 3.8-3.11), else
the plain ``onnxruntime``. Everything is fetched with ``--no-deps``: onnxruntime runs
with numpy alone.

The wheels are kept in a cache on the host (`cache_dir`, ``$FLEETBENCH_WHEELS_DIR``
overrides it). A fetch first looks there without the index (``--no-index
--find-links``), so a host that fetched once provisions further boards offline; only
what the cache lacks is asked of the index. A device with no wheel at all (32-bit ARM,
musl) gets one line naming it, its platform and its Python (`NoWheel`).
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from devices.cache import fleetbench_cache
from devices.errors import TransportError
from harness.backends import ORT_TRAINING_LAST, ORT_TRAINING_MACHINES, ORT_TRAINING_PYTHONS

#: The last onnxruntime-training release (the training packages stopped after it).
TRAINING_REQUIREMENT = f"onnxruntime-training=={ORT_TRAINING_LAST}"
#: The plain runtime's requirement: 1.19 is the oldest the runner's ``onnx`` backend was checked with.
ONNXRUNTIME_REQUIREMENT = "onnxruntime>=1.19"
#: Oldest glibc minor version of the manylinux platform tags offered (manylinux2014).
OLDEST_GLIBC_MINOR = 17
#: Seconds one ``pip download`` may take.
FETCH_TIMEOUT_S = 900.0


class NoWheel(TransportError):
    """No wheel of a needed package exists for the device's Python and platform."""

    kind = "no wheel"


@dataclass(frozen=True)
class Target:
    """What a wheel must match on a device.

    Attributes
    ----------
    python : str
        The device's Python version (``3.11.2``).
    machine : str
        ``platform.machine()`` (``x86_64``, ``aarch64``, ``armv7l``).
    glibc : str or None
        The device's glibc version (``2.36``); None for another C library (musl, bionic).
    """

    python: str
    machine: str
    glibc: str | None

    @property
    def python_tag(self) -> str:
        """``cp311`` for Python 3.11."""
        major, minor = self.python.split(".")[:2]
        return f"cp{major}{minor}"

    @property
    def describe(self) -> str:
        """One phrase naming the target (``Python 3.11 on x86_64, glibc 2.36``)."""
        libc = f"glibc {self.glibc}" if self.glibc else "no glibc"
        return f"Python {'.'.join(self.python.split('.')[:2])} on {self.machine}, {libc}"


def platform_tags(target: Target) -> list[str]:
    """Return the wheel platform tags a device accepts, newest first (pure).

    Parameters
    ----------
    target : Target

    Returns
    -------
    list of str
        ``manylinux_2_X_<machine>`` from the device's glibc down to 2.17, and the legacy
        ``manylinux2014_<machine>`` alias; empty without glibc (no manylinux wheel runs).
    """
    if target.glibc is None:
        return []
    major, minor = (int(part) for part in target.glibc.split(".")[:2])
    if major != 2 or minor < OLDEST_GLIBC_MINOR:
        return []
    tags = [f"manylinux_2_{m}_{target.machine}" for m in range(minor, OLDEST_GLIBC_MINOR - 1, -1)]
    return [*tags, f"manylinux2014_{target.machine}"]


def has_training_wheel(target: Target) -> bool:
    """Whether onnxruntime-training has a wheel for the device (`harness.backends.ORT_TRAINING_PYTHONS` on x86_64).

    Parameters
    ----------
    target : Target

    Returns
    -------
    bool
    """
    python = ".".join(target.python.split(".")[:2])
    return target.machine in ORT_TRAINING_MACHINES and target.glibc is not None and python in ORT_TRAINING_PYTHONS


def wanted_requirements(target: Target, importable: Callable[[str], bool]) -> list[str]:
    """Return what a device must get for its best backend (pure).

    Parameters
    ----------
    target : Target
    importable : callable
        Package name (``numpy``, ``onnxruntime``, ``onnxruntime-training``) -> whether it
        imports on the device now.

    Returns
    -------
    list of str
        Requirements for ``pip download``: numpy when missing; onnxruntime-training when
        it has a wheel for the device and does not import; else the plain onnxruntime
        when no onnxruntime imports.
    """
    wanted = [] if importable("numpy") else ["numpy"]
    if has_training_wheel(target):
        if not importable("onnxruntime-training"):
            wanted.append(TRAINING_REQUIREMENT)
    elif not importable("onnxruntime"):
        wanted.append(ONNXRUNTIME_REQUIREMENT)
    return wanted


#: Environment variable naming the host's wheel cache (`devices.cache`).
WHEELS_ENV = "FLEETBENCH_WHEELS_DIR"


def cache_dir() -> Path:
    """Return the host's wheel cache (`WHEELS_ENV`, else ``wheels`` in `devices.cache`'s place)."""
    return fleetbench_cache(WHEELS_ENV, "wheels")


def download_argv(target: Target, requirements: Sequence[str], dest: Path, *, offline: bool,
                  index_url: str | None = None) -> list[str]:
    """Return the host's ``pip download`` command for the device's wheels (pure).

    Parameters
    ----------
    target : Target
    requirements : sequence of str
    dest : pathlib.Path
        The cache directory (also searched with ``--find-links``).
    offline : bool
        Look in ``dest`` only (``--no-index``).
    index_url : str, optional
        The package index (default: the host pip's configuration).

    Returns
    -------
    list of str
    """
    major, minor = target.python.split(".")[:2]
    platforms = [arg for tag in platform_tags(target) for arg in ("--platform", tag)]
    index = ["--no-index"] if offline else (["--index-url", index_url] if index_url else [])
    return [sys.executable, "-m", "pip", "download", "--disable-pip-version-check", "--no-deps",
            "--only-binary=:all:", "--python-version", f"{major}.{minor}", "--implementation", "cp",
            "--abi", target.python_tag, *platforms, *index, "--find-links", str(dest), "--dest", str(dest),
            *requirements]


def normalize(name: str) -> str:
    """Return the PEP 503 normalised form of a distribution name.

    Parameters
    ----------
    name : str

    Returns
    -------
    str
    """
    return re.sub(r"[-_.]+", "-", name).lower()


def _wheel_parts(wheel: Path) -> list[str]:
    parts = Path(wheel).name.removesuffix(".whl").split("-")
    if not Path(wheel).name.endswith(".whl") or len(parts) not in (5, 6):
        raise ValueError(f"{wheel}: not a wheel file name (dist-version-python-abi-platform.whl)")
    return parts


def wheel_distribution(wheel: Path) -> str:
    """Return the normalised distribution name of a wheel file from its name.

    Parameters
    ----------
    wheel : pathlib.Path
        ``{distribution}-{version}(-{build})?-{python}-{abi}-{platform}.whl``.

    Returns
    -------
    str

    Raises
    ------
    ValueError
        If the file name is not a wheel name.
    """
    return normalize(_wheel_parts(wheel)[0])


def wheel_fits(wheel: Path, target: Target) -> str | None:
    """Say why a wheel cannot be installed on a device, from its file name's tags (pure).

    Parameters
    ----------
    wheel : pathlib.Path
    target : Target

    Returns
    -------
    str or None
        None when one of its platform tags is ``any``, a manylinux tag the device
        accepts (`platform_tags`) or ``linux_<machine>``, and one of its Python tags is
        the device's (``cp311``, ``py3``, or a stable-ABI ``abi3`` build for an older
        CPython); else one line naming the wheel's tags and the device's.

    Raises
    ------
    ValueError
        If the file name is not a wheel name.
    """
    python_tags, abi_tags, platforms = (part.split(".") for part in _wheel_parts(wheel)[-3:])
    accepted = {"any", f"linux_{target.machine}", *platform_tags(target)}
    minor = int(target.python.split(".")[1])
    major = target.python.split(".")[0]
    python_ok = any(
        tag in (target.python_tag, f"py{major}", f"py{major}{minor}")
        or ("abi3" in abi_tags and tag.startswith(f"cp{major}") and tag[3:].isdigit() and int(tag[3:]) <= minor)
        for tag in python_tags
    )
    if python_ok and accepted.intersection(platforms):
        return None
    return (f"{Path(wheel).name} is built for {'.'.join(python_tags)} on {'.'.join(platforms)}, "
            f"the device has {target.describe}")


def downloaded(stdout: str, dest: Path) -> list[Path]:
    """Return the wheels ``pip download`` names in its output, saved or found already there (pure).

    Parameters
    ----------
    stdout : str
        pip's output (``Saved <path>`` and ``File was already downloaded <path>`` lines).
    dest : pathlib.Path
        The download directory (a relative path in pip's output is taken there).

    Returns
    -------
    list of pathlib.Path
    """
    out = []
    for line in stdout.splitlines():
        line = line.strip()
        for prefix in ("Saved ", "File was already downloaded "):
            if line.startswith(prefix) and line.endswith(".whl"):
                out.append(dest / Path(line.removeprefix(prefix)).name)
    return out


def fetch_wheels(device: str, target: Target, requirements: Sequence[str], dest: Path | None = None,
                 index_url: str | None = None, say: Callable[[str], None] = print) -> list[Path]:
    """Fetch on the host the wheels of ``requirements`` for the device, from the cache first.

    Parameters
    ----------
    device : str
        The device's name (for messages).
    target : Target
    requirements : sequence of str
    dest : pathlib.Path, optional
        The cache (default `cache_dir`).
    index_url : str, optional
        The package index for what the cache lacks.
    say : callable
        Receives one line saying what was fetched and from where.

    Returns
    -------
    list of pathlib.Path
        One wheel per requirement.

    Raises
    ------
    NoWheel
        The device has no platform that manylinux wheels serve, or the index (and the
        cache) has no wheel for it: one line naming the device, its platform and Python.
    """
    if not requirements:
        return []
    dest = dest or cache_dir()
    if not platform_tags(target):
        raise NoWheel(f"{device}: no wheels of {', '.join(requirements)} exist for {target.describe} "
                      f"(manylinux wheels need glibc 2.17 or newer); install them on the device by hand")
    dest.mkdir(parents=True, exist_ok=True)
    run = subprocess.run(download_argv(target, requirements, dest, offline=True),
                            capture_output=True, text=True, timeout=FETCH_TIMEOUT_S, check=False)
    source = f"the host's wheel cache {dest}"
    if run.returncode != 0:
        run = subprocess.run(download_argv(target, requirements, dest, offline=False, index_url=index_url),
                             capture_output=True, text=True, timeout=FETCH_TIMEOUT_S, check=False)
        if run.returncode != 0:
            lines = [line.strip() for line in run.stderr.splitlines() if line.strip()]
            why = next((line for line in lines if "No matching distribution" in line), lines[-1] if lines else "")
            raise NoWheel(f"{device}: no wheel of {', '.join(requirements)} for {target.describe} "
                          f"in the package index or {dest} ({why.removeprefix('ERROR: ')})")
        source = f"the package index (kept in {dest})"
    wheels = downloaded(run.stdout, dest)
    say(f"{device}: fetched {', '.join(w.name for w in wheels)} for {target.describe} from {source}")
    return wheels
