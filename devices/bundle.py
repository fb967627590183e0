"""Runtime bundles: a self-contained Python for devices that have none (phones).

An Android phone has a shell and no Python. A *runtime bundle* is everything the
on-device runner's ``onnx`` backend needs, in one relocatable directory that runs
from anywhere the shell user may write (``/data/local/tmp``), with no root, no
chroot and nothing installed on the device::

    bin/python3                      the interpreter (Debian's python3.11)
    lib/ld-linux-<arch>.so.N         the glibc loader, started explicitly
    lib/lib*.so.*                    glibc and the libraries the rest needs (by soname)
    lib/python311.zip                the standard library, compiled, zipped
    lib/python3.11/lib-dynload/      the standard library's extension modules
    site/                            numpy and the plain onnxruntime (manylinux wheels)
    .fleetbench-bundle.json          ABI, recipe, versions
    .fleetbench-files.sha256         sha256 of every other file (``sha256sum -c`` format)

It runs as ``env PYTHONHOME=B PYTHONPATH=B/site B/lib/ld-linux-*.so.N --library-path
B/lib B/bin/python3 runner.pyz ...`` (`harness.contract.RunnerStart`): the loader is
started as a program, so the kernel never reads the interpreter path baked into
``python3`` (``/lib/ld-linux...``, absent on Android), and ``--library-path`` replaces
the system's library search. Android's bionic never sees any of it.

ABIs (`ABIS`): ``arm64-v8a`` (phones) and ``x86_64`` (the Android emulator's images,
and the emulated phone of `devices.emulation.adb_endpoint`). Any other is refused with one line
(`UnsupportedAbi`).

How a bundle is built (`ensure_bundle`), once per ABI and recipe, on the host:

1. **Debian packages of the device's architecture** (`DEBIAN_PACKAGES`: python3.11 and
   the libraries it and the wheels link against). For the host's own architecture
   ``apt-get download`` fetches the .debs and ``dpkg-deb -x`` unpacks them. For arm64 on
   an x86 host the cached arm64 Debian tree of the emulated aarch64 device
   (`devices.emulation.rootfs`) already holds exactly these packages: their files are copied
   from it, as its dpkg lists name them (no second download, no foreign architecture
   added to the host's apt). Where that tree is not built but dpkg knows the foreign
   architecture (``dpkg --add-architecture arm64 && apt-get update``), ``apt-get
   download pkg:arm64`` is used instead.
2. **Wheels for it**: ``pip download --only-binary=:all: --no-deps --platform
   manylinux_2_28_<m> --platform manylinux2014_<m>`` of `WHEELS` (numpy, onnxruntime
   1.19.2: its x86_64 and aarch64 wheels are tagged manylinux_2_28, numpy's
   manylinux2014), unpacked into ``site/``. ``--no-deps``: onnxruntime imports and runs
   sessions without its declared dependencies (coloredlogs, flatbuffers, protobuf,
   sympy serve its tools only); the build check below proves it.
3. **Assembly**: the libraries are chosen by reading ``DT_NEEDED`` from every ELF file
   kept (`elf_needed`), transitively, among the files of the recipe's packages; a
   standard-library extension module whose libraries are not in the recipe (``_sqlite3``,
   ``_curses``, ``readline``, ``_dbm``, ``_uuid``, ...) is left out rather than shipped
   broken. Parts of the standard library and of the wheels the runner never imports are
   left out (`STDLIB_DROP`, `SITE_DROP`: tests, tkinter, idlelib, onnxruntime's
   transformers / quantization / tools, ...), which keeps the bundle near 120 MB. All
   Python code is compiled on the host (the bundle's CPython minor version must match
   the host's, 3.11; checked): the standard library as sourceless ``.pyc`` in
   ``python311.zip`` (one file instead of ~700, on the default ``sys.path``), the wheels'
   ``.py`` files with ``unchecked-hash`` ``.pyc`` beside them. Nothing is compiled on the
   device (under qemu-user that took 10 s per start) and nothing is written into the
   bundle at run time (``PYTHONDONTWRITEBYTECODE``), so its files stay as verified.
4. **Check**: the bundle's python runs through its own loader (natively for the
   host's ABI, through qemu-user's binfmt entry for arm64 when one is active) and must
   import numpy and onnxruntime and run an ONNX graph; the versions go into the stamp.
   Where the ABI cannot run on the host the bundle is marked unchecked.
5. **Parts for pushing**: the tree is packed into a few uncompressed ustar archives
   (`PARTS`: system libraries and interpreter, standard library, numpy, onnxruntime),
   deterministic (sorted, owner 0, mtime 0), so a device's content-addressed cache
   (`harness.deploy`) pushes only missing parts and a push interrupted after some parts
   resumes with the rest. One archive per file would be the finer grain, but adb pays
   tens of milliseconds per synced file (three sync sessions each), which for ~1500
   files is minutes; a handful of archives cost nothing extra to push. Uncompressed,
   because the device (toybox ``tar``) unpacks them faster than it would inflate them,
   and USB 2 moves the difference in seconds.

The cache lives outside the repository: ``$FLEETBENCH_BUNDLE_DIR``, else
``$XDG_CACHE_HOME/fleetbench/bundles``, else ``~/.cache/fleetbench/bundles``; one
directory ``<abi>-<recipe key>`` per bundle holding ``tree/``, ``parts/`` and
``bundle.json`` (the stamp, written last). A build runs in a ``.tmp-*`` directory and
is renamed into place, under an ``flock``, so an interrupted build never looks complete
and two builds never race. Downloads (.debs, wheels) are kept in ``downloads/``.

What it needs on the host: ``apt-get`` and ``dpkg-deb`` (Debian's apt and dpkg), pip
(the running interpreter's), network access to a Debian mirror and the package index,
and for arm64 the arm64 tree (root, qemu-user-static, binfmt-support, debootstrap) or a
foreign architecture in dpkg. A missing one is one line naming it (`BundleError`).
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import json
import os
import py_compile
import shutil
import struct
import subprocess
import sys
import tarfile
import tempfile
import time
import zipfile
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from devices.cache import fleetbench_cache
from devices.files import atomic_write

Printer = Callable[[str], None]


class BundleError(RuntimeError):
    """A bundle cannot be built here (a missing tool, a failed download); one line."""


class UnsupportedAbi(ValueError):
    """A device whose ABI no bundle serves; the message is one line starting "unsupported ABI"."""


@dataclass(frozen=True)
class Abi:
    """A device ABI a bundle can be built for.

    Attributes
    ----------
    name : str
        Android's name (``ro.product.cpu.abi``): ``arm64-v8a`` or ``x86_64``.
    machine : str
        What ``uname -m`` says on such a device.
    debian_arch : str
        Debian's architecture name (``arm64``, ``amd64``).
    triplet : str
        Debian's multiarch library directory (``aarch64-linux-gnu``).
    loader : str
        The glibc loader's file name.
    wheel_platforms : tuple of str
        Platform tags given to ``pip download``.
    """

    name: str
    machine: str
    debian_arch: str
    triplet: str
    loader: str
    wheel_platforms: tuple[str, ...]


#: The ABIs bundles are built for, by Android ABI name.
ABIS: dict[str, Abi] = {
    "arm64-v8a": Abi("arm64-v8a", "aarch64", "arm64", "aarch64-linux-gnu", "ld-linux-aarch64.so.1",
                     ("manylinux_2_28_aarch64", "manylinux2014_aarch64")),
    "x86_64": Abi("x86_64", "x86_64", "amd64", "x86_64-linux-gnu", "ld-linux-x86-64.so.2",
                  ("manylinux_2_28_x86_64", "manylinux2014_x86_64")),
}  # fmt: skip

#: Other spellings of the same ABIs (``uname -m``, Debian) -> Android ABI name.
_ALIASES = {"aarch64": "arm64-v8a", "arm64": "arm64-v8a", "amd64": "x86_64", "x86-64": "x86_64"}

#: Debian packages (bookworm) whose files make the bundle's interpreter and libraries.
DEBIAN_PACKAGES: tuple[str, ...] = (
    "python3.11-minimal", "libpython3.11-minimal", "libpython3.11-stdlib", "libc6", "zlib1g", "libexpat1",
    "libffi8", "libssl3", "libbz2-1.0", "liblzma5", "libgcc-s1", "libstdc++6",
)  # fmt: skip
#: Wheels unpacked into ``site/`` (onnxruntime: the plain package, the ``onnx`` backend's).
WHEELS: tuple[str, ...] = ("numpy==1.26.4", "onnxruntime==1.19.2")
#: The bundle's CPython version (the host compiles its bytecode, so it must run the same minor version).
PYTHON_VERSION = "3.11"
#: Top-level standard-library names left out (the runner imports none of them).
STDLIB_DROP = frozenset({
    "idlelib", "tkinter", "turtledemo", "turtle.py", "lib2to3", "ensurepip", "pydoc_data", "distutils", "venv",
    "test", "sqlite3", "dbm", "curses", "xmlrpc", "wsgiref", "__phello__", "__hello__.py", "site-packages",
    "dist-packages", "__pycache__", "LICENSE.txt", "EXTERNALLY-MANAGED",
})  # fmt: skip
#: Directory names left out anywhere under ``site/`` (and onnxruntime's own tooling).
SITE_DROP = frozenset({"tests", "__pycache__"})
SITE_DROP_PATHS = (
    "onnxruntime/transformers", "onnxruntime/quantization", "onnxruntime/tools", "onnxruntime/datasets",
    "numpy/distutils", "numpy/f2py", "numpy/_pyinstaller", "numpy/typing/tests",
)  # fmt: skip
#: Archives the tree is pushed as: (name, path prefixes), first match wins; the last takes the rest.
PARTS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("stdlib", ("lib/python311.zip", "lib/python3.11/")),
    ("numpy", ("site/numpy/", "site/numpy.libs/", "site/numpy-")),
    ("onnxruntime", ("site/onnxruntime/", "site/onnxruntime.libs/", "site/onnxruntime-")),
    ("system", ("",)),
)
#: Inside the tree: the stamp and the file list the device verifies with ``sha256sum -c``.
STAMP = ".fleetbench-bundle.json"
FILE_LIST = ".fleetbench-files.sha256"
#: The recipe a cached bundle must match (part of its key).
RECIPE_VERSION = 1
#: Environment variable naming the bundle cache directory.
BUNDLE_ENV = "FLEETBENCH_BUNDLE_DIR"

#: Run by the bundle's python after the build: versions, and one ONNX graph through onnxruntime.
_CHECK = r"""
import json, platform, sys
import numpy, onnxruntime
from onnxruntime import InferenceSession
# a one-node Add graph, serialised by hand (ModelProto with opset 13), so the check needs no onnx package
import base64
m = base64.b64decode(MODEL)
s = InferenceSession(m, providers=["CPUExecutionProvider"])
x = numpy.arange(4, dtype=numpy.float32)
y = s.run(None, {"x": x, "y": x})[0]
assert y.tolist() == [0.0, 2.0, 4.0, 6.0], y
print(json.dumps({"machine": platform.machine(), "python": platform.python_version(),
                  "numpy": numpy.__version__, "onnxruntime": onnxruntime.__version__}))
"""


def abi_of(name: str) -> Abi:
    """Return the bundle ABI of a device from its Android ABI or ``uname -m``.

    Parameters
    ----------
    name : str
        ``arm64-v8a``, ``x86_64``, ``aarch64``, ...

    Returns
    -------
    Abi

    Raises
    ------
    UnsupportedAbi
        Any other ABI (``armeabi-v7a``, ``x86``, ``riscv64``...).
    """
    key = _ALIASES.get(name.strip(), name.strip())
    if key not in ABIS:
        raise UnsupportedAbi(f"unsupported ABI: {name.strip() or '(none reported)'} "
                             f"(runtime bundles exist for {' and '.join(ABIS)})")
    return ABIS[key]


# ---------------------------------------------------------------------------- ELF


def elf_needed(path: Path) -> list[str]:
    """Return the ``DT_NEEDED`` sonames of a 64-bit little-endian ELF file.

    Parameters
    ----------
    path : pathlib.Path

    Returns
    -------
    list of str
        In the file's order; empty for a static file or one that is not such an ELF.
    """
    data = Path(path).read_bytes()
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        return []
    phoff, = struct.unpack_from("<Q", data, 0x20)
    phentsize, phnum = struct.unpack_from("<HH", data, 0x36)
    loads: list[tuple[int, int, int]] = []  # (vaddr, offset, filesz)
    dynamic: tuple[int, int] | None = None
    for i in range(phnum):
        p_type, _, p_offset, p_vaddr, _, p_filesz = struct.unpack_from("<IIQQQQ", data, phoff + i * phentsize)
        if p_type == 1:
            loads.append((p_vaddr, p_offset, p_filesz))
        elif p_type == 2:
            dynamic = (p_offset, p_filesz)
    if dynamic is None:
        return []
    entries = [struct.unpack_from("<qQ", data, dynamic[0] + k) for k in range(0, dynamic[1], 16)]
    strtab = next((v for tag, v in entries if tag == 5), None)
    if strtab is None:
        return []
    base = next((off + strtab - vaddr for vaddr, off, size in loads if vaddr <= strtab < vaddr + size), None)
    if base is None:
        return []
    needed = []
    for tag, value in entries:
        if tag == 0:
            break
        if tag == 1:
            end = data.index(b"\0", base + value)
            needed.append(data[base + value:end].decode())
    return needed


def _is_elf(path: Path) -> bool:
    try:
        with open(path, "rb") as handle:
            return handle.read(4) == b"\x7fELF"
    except OSError:
        return False


# ---------------------------------------------------------------------------- records


@dataclass(frozen=True)
class Part:
    """One archive of a bundle, pushed as one file.

    Attributes
    ----------
    name : str
    path : pathlib.Path
        The ``.tar`` file in the cache.
    sha256 : str
    size : int
        Bytes.
    """

    name: str
    path: Path
    sha256: str
    size: int


@dataclass(frozen=True)
class Bundle:
    """A built runtime bundle in the host's cache.

    Attributes
    ----------
    abi : Abi
    directory : pathlib.Path
        Its cache directory.
    ident : str
        Digest of its file list: two bundles with the same ident hold the same files.
    tree : pathlib.Path
        The unpacked bundle (runs on the host for its own ABI).
    parts : tuple of Part
    size : int
        Bytes of the unpacked tree (what the device stores after unpacking).
    files : int
        Number of files in the tree.
    versions : dict
        ``python``, ``numpy``, ``onnxruntime`` and the Debian package versions.
    checked : bool
        Whether the build check ran (the ABI could run on the host).
    """

    abi: Abi
    directory: Path
    ident: str
    tree: Path
    parts: tuple[Part, ...]
    size: int
    files: int
    versions: dict[str, Any]
    checked: bool

    @property
    def push_bytes(self) -> int:
        """Bytes of all parts (what a first push sends)."""
        return sum(p.size for p in self.parts)

    def describe(self) -> str:
        """One line: ABI, versions, sizes, where."""
        return (f"runtime bundle {self.abi.name}: python {self.versions.get('python')}, numpy "
                f"{self.versions.get('numpy')}, onnxruntime {self.versions.get('onnxruntime')}; "
                f"{_mb(self.size)} in {self.files} files, {_mb(self.push_bytes)} to push in {len(self.parts)} "
                f"parts ({self.directory})")


def _mb(nbytes: int) -> str:
    return f"{nbytes / 1e6:.1f} MB"


# ---------------------------------------------------------------------------- cache


def cache_dir(environ: dict[str, str] | None = None) -> Path:
    """Return the directory holding built bundles.

    Parameters
    ----------
    environ : dict, optional
        Environment to read (default ``os.environ``): ``FLEETBENCH_BUNDLE_DIR``, else
        ``$XDG_CACHE_HOME/fleetbench/bundles``, else ``~/.cache/fleetbench/bundles``.

    Returns
    -------
    pathlib.Path
        An absolute path.
    """
    return fleetbench_cache(BUNDLE_ENV, "bundles", environ)


def recipe(abi: Abi) -> dict[str, Any]:
    """Return the recipe of ``abi``'s bundle (what its cache key is made of)."""
    return {
        "version": RECIPE_VERSION, "abi": abi.name, "debian": list(DEBIAN_PACKAGES), "wheels": list(WHEELS),
        "python": PYTHON_VERSION, "stdlib_drop": sorted(STDLIB_DROP), "site_drop": sorted(SITE_DROP),
        "site_drop_paths": list(SITE_DROP_PATHS), "parts": [list(p) for p in ((n, list(x)) for n, x in PARTS)],
    }  # fmt: skip


def recipe_key(abi: Abi) -> str:
    """Return the 12-hex-digit key of ``abi``'s recipe (the cache entry's suffix)."""
    return hashlib.sha256(json.dumps(recipe(abi), sort_keys=True).encode()).hexdigest()[:12]


def bundle_dir(abi: Abi, directory: Path | None = None) -> Path:
    """Return the cache directory of ``abi``'s bundle."""
    return (directory or cache_dir()) / f"{abi.name}-{recipe_key(abi)}"


def load_bundle(abi: Abi, directory: Path | None = None) -> Bundle | None:
    """Return the cached bundle of ``abi`` when it is built for the current recipe, else None."""
    where = bundle_dir(abi, directory)
    try:
        stamp = json.loads((where / "bundle.json").read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(stamp, dict) or stamp.get("recipe") != recipe(abi):
        return None
    parts = tuple(Part(p["name"], where / "parts" / f"{p['name']}.tar", p["sha256"], int(p["size"]))
                  for p in stamp["parts"])
    if not all(p.path.is_file() and p.path.stat().st_size == p.size for p in parts):
        return None
    return Bundle(abi, where, stamp["ident"], where / "tree", parts, int(stamp["size"]), int(stamp["files"]),
                  dict(stamp["versions"]), bool(stamp["checked"]))


@contextlib.contextmanager
def _locked(path: Path, say: Printer) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            say(f"bundle: another build holds {path}; waiting for it")
            fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def ensure_bundle(abi: Abi | str, directory: Path | None = None, say: Printer = print) -> Bundle:
    """Return ``abi``'s bundle, building it first when the cache lacks it.

    Parameters
    ----------
    abi : Abi or str
        An `Abi` or a name `abi_of` accepts.
    directory : pathlib.Path, optional
        Cache directory (default `cache_dir`).
    say : callable
        Receives progress lines (stage, seconds, sizes).

    Returns
    -------
    Bundle

    Raises
    ------
    UnsupportedAbi
        For an ABI without bundles.
    BundleError
        A tool, a package or the network is missing; nothing half-built is left.
    """
    target = abi if isinstance(abi, Abi) else abi_of(abi)
    found = load_bundle(target, directory)
    if found is not None:
        return found
    where = bundle_dir(target, directory)
    with _locked(where.parent / f".{where.name}.lock", say):
        found = load_bundle(target, directory)
        if found is not None:
            return found
        for stale in where.parent.glob(f".{where.name}.tmp-*"):
            shutil.rmtree(stale, ignore_errors=True)
        build = Path(tempfile.mkdtemp(prefix=f".{where.name}.tmp-", dir=where.parent))
        try:
            _build(target, build, where.parent / "downloads" / target.name, say)
            if where.exists():
                shutil.rmtree(where)
            os.rename(build, where)
        except BaseException:
            shutil.rmtree(build, ignore_errors=True)
            raise
    bundle = load_bundle(target, directory)
    if bundle is None:
        raise BundleError(f"bundle {target.name}: built, but {where} does not read back")
    say(bundle.describe())
    return bundle


# ---------------------------------------------------------------------------- build


def _run(argv: Sequence[str], what: str, cwd: Path | None = None, env: dict[str, str] | None = None) -> str:
    try:
        done = subprocess.run(list(argv), cwd=cwd, env=env, capture_output=True, text=True, stdin=subprocess.DEVNULL)
    except FileNotFoundError:
        raise BundleError(f"{what}: {argv[0]} is not installed") from None
    if done.returncode != 0:
        lines = [line for line in (done.stderr + "\n" + done.stdout).splitlines() if line.strip()]
        errors = [line for line in lines if line.startswith(("E:", "ERROR"))]
        raise BundleError(f"{what} failed (exit {done.returncode}): {(errors or lines or ['no output'])[-1].strip()}")
    return done.stdout


def host_debian_arch() -> str | None:
    """Return dpkg's architecture of this host (``amd64``), None without dpkg."""
    try:
        return subprocess.run(["dpkg", "--print-architecture"], capture_output=True, text=True,
                              check=True).stdout.strip() or None
    except (OSError, subprocess.CalledProcessError):
        return None


def foreign_arches() -> list[str]:
    """Return the foreign architectures dpkg knows (``dpkg --add-architecture``)."""
    try:
        out = subprocess.run(["dpkg", "--print-foreign-architectures"], capture_output=True, text=True,
                             check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return []
    return out.split()


def _build(abi: Abi, build: Path, downloads: Path, say: Printer) -> None:
    if f"{sys.version_info.major}.{sys.version_info.minor}" != PYTHON_VERSION:
        raise BundleError(f"bundle {abi.name}: the host compiles the bundle's bytecode, so it needs Python "
                          f"{PYTHON_VERSION} (this is {sys.version_info.major}.{sys.version_info.minor})")
    started = time.monotonic()
    say(f"bundle {abi.name}: building the runtime bundle once into {build.parent} (about a minute; "
        "cached for later uses)")
    staging, tree, parts = build / "staging", build / "tree", build / "parts"
    versions = _stage_debian(abi, staging, downloads, say)
    wheels = _download_wheels(abi, downloads / "wheels", say)
    say(f"bundle {abi.name}: [3/5] assembling interpreter, libraries, standard library and site packages")
    _assemble(abi, staging, wheels, tree)
    shutil.rmtree(staging)
    say(f"bundle {abi.name}: [4/5] checking that numpy and onnxruntime run from the bundle")
    found = run_check(abi, tree)
    if found is None:
        say(f"bundle {abi.name}: this host cannot run {abi.machine} code (no qemu binfmt entry): left unchecked")
    else:
        versions.update(found)
    ident = _write_listing(tree, abi, versions)
    say(f"bundle {abi.name}: [5/5] packing the parts to push")
    written = _pack(tree, parts)
    size, files = _tree_size(tree)
    stamp = {
        "recipe": recipe(abi), "ident": ident, "size": size, "files": files, "versions": versions,
        "checked": found is not None, "parts": [{"name": p.name, "sha256": p.sha256, "size": p.size} for p in written],
        "seconds": round(time.monotonic() - started, 1), "built_at": time.time(),
    }  # fmt: skip
    atomic_write(build / "bundle.json", json.dumps(stamp, indent=2))
    say(f"bundle {abi.name}: built in {time.monotonic() - started:.0f} s")


def _stage_debian(abi: Abi, staging: Path, downloads: Path, say: Printer) -> dict[str, Any]:
    """Put the recipe's Debian packages' files under ``staging``; return their versions."""
    staging.mkdir(parents=True)
    native = host_debian_arch()
    if abi.debian_arch != native:
        from devices.emulation import rootfs

        tree = rootfs.tree_path()
        if abi.debian_arch == rootfs.DEBIAN_ARCH and rootfs.read_stamp(tree) is not None:
            say(f"bundle {abi.name}: [1/5] taking {len(DEBIAN_PACKAGES)} Debian packages from the arm64 tree {tree}")
            return _copy_from_tree(tree, abi, staging)
        if abi.debian_arch not in foreign_arches():
            raise BundleError(
                f"bundle {abi.name}: needs {abi.debian_arch} Debian packages: build the arm64 userland first "
                f"(python -m devices.emulation.rootfs build, as root) or let apt fetch them (dpkg --add-architecture "
                f"{abi.debian_arch} && apt-get update)")
    if shutil.which("apt-get") is None or shutil.which("dpkg-deb") is None:
        raise BundleError(f"bundle {abi.name}: needs apt-get and dpkg-deb (Debian packages apt and dpkg)")
    debs = downloads / "debs"
    debs.mkdir(parents=True, exist_ok=True)
    names = [p if abi.debian_arch == native else f"{p}:{abi.debian_arch}" for p in DEBIAN_PACKAGES]
    say(f"bundle {abi.name}: [1/5] apt-get download {len(names)} {abi.debian_arch} packages into {debs}")
    for old in debs.glob("*.deb"):
        old.unlink()
    sandbox = ["-o", "APT::Sandbox::User=root"] if os.geteuid() == 0 else []
    try:
        _run(["apt-get", *sandbox, "download", *names], "apt-get download", cwd=debs)
    except BundleError as exc:
        raise BundleError(f"{exc} (is `apt-get update` done and a Debian mirror reachable?)") from None
    versions: dict[str, Any] = {"debian": {}}
    for deb in sorted(debs.glob("*.deb")):
        _run(["dpkg-deb", "-x", str(deb), str(staging)], f"dpkg-deb -x {deb.name}")
        package, version = _run(["dpkg-deb", "-f", str(deb), "Package", "Version"], "dpkg-deb -f").split("\n")[:2]
        versions["debian"][package.partition(":")[2].strip()] = version.partition(":")[2].strip()
    return versions


def _copy_from_tree(tree: Path, abi: Abi, staging: Path) -> dict[str, Any]:
    """Copy the files dpkg lists for the recipe's packages out of an installed tree."""
    info = tree / "var" / "lib" / "dpkg" / "info"
    status = (tree / "var" / "lib" / "dpkg" / "status").read_text()
    versions: dict[str, Any] = {"debian": {}}
    for package in DEBIAN_PACKAGES:
        listing = next((p for p in (info / f"{package}:{abi.debian_arch}.list", info / f"{package}.list")
                        if p.is_file()), None)
        if listing is None:
            raise BundleError(f"bundle {abi.name}: the arm64 tree {tree} lacks the Debian package {package}")
        for line in listing.read_text().splitlines():
            rel = line.strip().lstrip("/")
            src = tree / rel
            if not rel or (src.is_dir() and not src.is_symlink()):
                continue
            dst = staging / rel
            dst.parent.mkdir(parents=True, exist_ok=True)
            if src.is_symlink():
                if not dst.is_symlink():
                    dst.symlink_to(os.readlink(src))
            elif src.is_file():
                shutil.copy2(src, dst)
        block = next((b for b in status.split("\n\n") if f"Package: {package}\n" in b + "\n"), "")
        version = next((line.split(":", 1)[1].strip() for line in block.splitlines() if line.startswith("Version:")),
                       None)
        versions["debian"][package] = version
    return versions


def _download_wheels(abi: Abi, wheels: Path, say: Printer) -> list[Path]:
    wheels.mkdir(parents=True, exist_ok=True)
    say(f"bundle {abi.name}: [2/5] pip download {' '.join(WHEELS)} ({abi.wheel_platforms[0]} wheels)")
    platforms = [arg for tag in abi.wheel_platforms for arg in ("--platform", tag)]
    _run([sys.executable, "-m", "pip", "download", "--disable-pip-version-check", "--only-binary=:all:",
          "--no-deps", *platforms, "--python-version", PYTHON_VERSION, "--implementation", "cp",
          "--abi", f"cp{PYTHON_VERSION.replace('.', '')}", "-d", str(wheels), *WHEELS], "pip download")
    found = []
    for spec in WHEELS:
        name, _, version = spec.partition("==")
        match = sorted(w for w in wheels.glob(f"{name}-{version}-*.whl") if any(
            tag.split("_", 1)[-1] in w.name for tag in abi.wheel_platforms))
        if not match:
            raise BundleError(f"bundle {abi.name}: pip download left no {spec} wheel for {abi.machine} in {wheels}")
        found.append(match[-1])
    return found


def _lib_dirs(abi: Abi, root: Path) -> list[Path]:
    return [root / "lib" / abi.triplet, root / "usr" / "lib" / abi.triplet, root / "lib", root / "usr" / "lib"]


def _find_lib(soname: str, dirs: Sequence[Path]) -> Path | None:
    for directory in dirs:
        candidate = directory / soname
        if candidate.exists():
            return candidate
    return None


def _assemble(abi: Abi, staging: Path, wheels: Sequence[Path], tree: Path) -> None:
    """Lay out the bundle tree from the staged Debian files and the wheels."""
    lib, site = tree / "lib", tree / "site"
    for d in (tree / "bin", lib, site):
        d.mkdir(parents=True)
    python = staging / "usr" / "bin" / f"python{PYTHON_VERSION}"
    if not python.is_file():
        raise BundleError(f"bundle {abi.name}: no usr/bin/python{PYTHON_VERSION} in the staged packages")
    shutil.copy2(python, tree / "bin" / "python3")
    for wheel in wheels:
        with zipfile.ZipFile(wheel) as archive:
            archive.extractall(site)
    for rel in SITE_DROP_PATHS:
        shutil.rmtree(site / rel, ignore_errors=True)
    for dropped in sorted((p for p in site.rglob("*") if p.is_dir() and p.name in SITE_DROP), reverse=True):
        shutil.rmtree(dropped, ignore_errors=True)
    for path in site.rglob("*"):
        if path.is_file() and path.suffix == ".so" or path.is_file() and ".so." in path.name:
            path.chmod(0o755)

    dirs = _lib_dirs(abi, staging)
    stdlib = staging / "usr" / "lib" / f"python{PYTHON_VERSION}"
    dynload_src = stdlib / "lib-dynload"
    dynload = lib / f"python{PYTHON_VERSION}" / "lib-dynload"
    dynload.mkdir(parents=True)
    site_libs = {p.name for p in site.rglob("*.so*") if p.is_file()}
    for module in sorted(dynload_src.glob("*.so")):
        if _resolvable(module, dirs, site_libs):
            shutil.copy2(module, dynload / module.name)
    _zip_stdlib(stdlib, lib / f"python{PYTHON_VERSION.replace('.', '')}.zip")
    elves = [tree / "bin" / "python3", *dynload.glob("*.so"),
             *(p for p in site.rglob("*") if p.is_file() and _is_elf(p))]
    wanted: set[str] = set()
    todo = [n for e in elves for n in elf_needed(e)]
    while todo:
        soname = todo.pop()
        if soname in wanted or soname in site_libs or soname == abi.loader:
            continue
        found = _find_lib(soname, dirs)
        if found is None:
            raise BundleError(f"bundle {abi.name}: {soname} is needed but no recipe package holds it")
        wanted.add(soname)
        todo.extend(elf_needed(found.resolve()))
    for soname in sorted(wanted):
        source = _find_lib(soname, dirs)
        assert source is not None
        shutil.copyfile(source.resolve(), lib / soname)
        (lib / soname).chmod(0o755)
    loader = _find_lib(abi.loader, dirs)
    if loader is None:
        raise BundleError(f"bundle {abi.name}: no {abi.loader} in the staged libc6")
    shutil.copyfile(loader.resolve(), lib / abi.loader)
    (lib / abi.loader).chmod(0o755)
    _compile_site(site)


def _resolvable(module: Path, dirs: Sequence[Path], site_libs: set[str]) -> bool:
    """Whether every library ``module`` needs (transitively) is among the staged files."""
    seen: set[str] = set()
    todo = elf_needed(module)
    while todo:
        soname = todo.pop()
        if soname in seen or soname in site_libs:
            continue
        found = _find_lib(soname, dirs)
        if found is None:
            return False
        seen.add(soname)
        todo.extend(elf_needed(found.resolve()))
    return True


def _zip_stdlib(stdlib: Path, target: Path) -> None:
    """Compile the standard library's modules to sourceless bytecode inside one zip file."""
    with tempfile.TemporaryDirectory() as scratch, zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as archive:
        for source in sorted(stdlib.rglob("*.py")):
            rel = source.relative_to(stdlib)
            if rel.parts[0] in STDLIB_DROP or rel.parts[0] == "lib-dynload" or rel.parts[0].startswith("config-"):
                continue
            compiled = Path(scratch) / "m.pyc"
            py_compile.compile(str(source), cfile=str(compiled), dfile=str(rel), doraise=True,
                               invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH)
            info = zipfile.ZipInfo(str(rel.with_suffix(".pyc")), date_time=(1980, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_DEFLATED
            archive.writestr(info, compiled.read_bytes())


def _compile_site(site: Path) -> None:
    """Compile the wheels' modules beside their sources (``unchecked-hash``: never re-validated)."""
    import compileall

    if not compileall.compile_dir(str(site), quiet=2, ddir="site", workers=1,
                                  invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH):
        raise BundleError(f"compiling the site packages in {site} failed")


def _tree_files(tree: Path) -> list[Path]:
    return sorted((p for p in tree.rglob("*") if p.is_file() and not p.is_symlink()),
                  key=lambda p: p.relative_to(tree).as_posix())


def _tree_size(tree: Path) -> tuple[int, int]:
    files = _tree_files(tree)
    return sum(p.stat().st_size for p in files), len(files)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _write_listing(tree: Path, abi: Abi, versions: dict[str, Any]) -> str:
    """Write the stamp and the ``sha256sum -c`` list into the tree; return the bundle's ident."""
    (tree / STAMP).write_text(json.dumps({"abi": abi.name, "loader": abi.loader, "recipe_key": recipe_key(abi),
                                          "versions": versions}, sort_keys=True) + "\n")
    lines = [f"{_sha256(p)}  ./{p.relative_to(tree).as_posix()}\n" for p in _tree_files(tree) if p.name != FILE_LIST]
    text = "".join(lines)
    (tree / FILE_LIST).write_text(text)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def part_of(rel: str) -> str:
    """Return the name of the part (`PARTS`) a tree-relative path is packed into."""
    return next(name for name, prefixes in PARTS if any(rel.startswith(p) for p in prefixes))


def _pack(tree: Path, parts_dir: Path) -> list[Part]:
    """Pack the tree into deterministic ustar archives, one per part."""
    parts_dir.mkdir(parents=True)
    members: dict[str, list[Path]] = {name: [] for name, _ in PARTS}
    for path in _tree_files(tree):
        members[part_of(path.relative_to(tree).as_posix())].append(path)
    written = []
    for name, paths in members.items():
        target = parts_dir / f"{name}.tar"
        with tarfile.open(target, "w", format=tarfile.USTAR_FORMAT) as archive:
            for directory in sorted({p.parent for p in paths} | {a for p in paths for a in p.parents
                                                                  if tree in a.parents},
                                    key=lambda d: d.relative_to(tree).as_posix()):
                archive.addfile(_tarinfo(directory.relative_to(tree).as_posix(), tarfile.DIRTYPE, 0o755, 0))
            for path in paths:
                mode = 0o755 if os.access(path, os.X_OK) else 0o644
                info = _tarinfo(path.relative_to(tree).as_posix(), tarfile.REGTYPE, mode, path.stat().st_size)
                with open(path, "rb") as handle:
                    archive.addfile(info, handle)
        written.append(Part(name, target, _sha256(target), target.stat().st_size))
    return written


def _tarinfo(name: str, kind: bytes, mode: int, size: int) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.mode, info.size, info.mtime = kind, mode, size, 0
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info


# ---------------------------------------------------------------------------- running


def runner_env(root: str) -> list[str]:
    """Return the ``env`` assignments a bundle rooted at ``root`` runs with.

    Parameters
    ----------
    root : str
        The bundle directory (on the device, or on this host).

    Returns
    -------
    list of str
        ``PYTHONHOME``, ``PYTHONPATH`` (its ``site``), no user site, no bytecode writes.
    """
    return [f"PYTHONHOME={root}", f"PYTHONPATH={root}/site", "PYTHONNOUSERSITE=1", "PYTHONDONTWRITEBYTECODE=1"]


def python_argv(root: str, loader: str) -> list[str]:
    """Return the argv prefix that starts the bundle's python through its own loader.

    Parameters
    ----------
    root : str
        The bundle directory.
    loader : str
        The ABI's loader file name (`Abi.loader`).

    Returns
    -------
    list of str
        ``env <runner_env> ROOT/lib/LOADER --library-path ROOT/lib ROOT/bin/python3``.
    """
    return ["env", *runner_env(root), f"{root}/lib/{loader}", "--library-path", f"{root}/lib", f"{root}/bin/python3"]


def _add_model() -> str:
    """Return a base64 ONNX model ``z = x + y`` over float32 [4], written without the onnx package."""
    def varint(n: int) -> bytes:
        out = b""
        while True:
            byte, n = n & 0x7F, n >> 7
            out += bytes([byte | (0x80 if n else 0)])
            if not n:
                return out

    def field(number: int, payload: bytes) -> bytes:  # length-delimited field
        return varint(number << 3 | 2) + varint(len(payload)) + payload

    def num(number: int, value: int) -> bytes:  # varint field
        return varint(number << 3) + varint(value)

    dim = field(1, num(1, 4))                             # TensorShapeProto.dim { dim_value: 4 }
    tensor_type = num(1, 1) + field(2, dim)               # elem_type FLOAT, shape
    value = lambda name: field(1, name) + field(2, field(1, tensor_type))  # noqa: E731 - ValueInfoProto
    node = field(1, b"x") + field(1, b"y") + field(2, b"z") + field(4, b"Add")
    graph = field(1, node) + field(2, b"g") + field(11, value(b"x")) + field(11, value(b"y")) + field(12, value(b"z"))
    model = num(1, 7) + field(7, graph) + field(8, num(2, 13))  # ir_version 7, graph, opset_import {version 13}
    import base64

    return base64.b64encode(model).decode()


def run_check(abi: Abi, tree: Path) -> dict[str, Any] | None:
    """Run the bundle's python on this host and return what it reports (None when it cannot run here).

    Parameters
    ----------
    abi : Abi
    tree : pathlib.Path
        An assembled bundle.

    Returns
    -------
    dict or None
        ``machine``, ``python``, ``numpy``, ``onnxruntime``; None when this host runs
        neither ``abi.machine`` natively nor through an enabled qemu binfmt entry.

    Raises
    ------
    BundleError
        It ran and failed.
    """
    if not can_run_here(abi):
        return None
    script = f"MODEL = {_add_model()!r}\n" + _CHECK
    done = subprocess.run([*python_argv(str(tree), abi.loader), "-c", script], capture_output=True, text=True,
                          env={"PATH": "/usr/bin:/bin"}, stdin=subprocess.DEVNULL)
    try:
        found: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        tail = (done.stderr.strip() or done.stdout.strip() or "no output").splitlines()[-1]
        raise BundleError(f"bundle {abi.name}: the check run from the bundle failed: {tail}") from None
    if found.get("machine") != abi.machine:
        raise BundleError(f"bundle {abi.name}: its python reports machine {found.get('machine')!r}")
    return found


def can_run_here(abi: Abi) -> bool:
    """Whether this host can run ``abi``'s code: natively, or through an enabled qemu binfmt entry."""
    if os.uname().machine == abi.machine:
        return True
    try:
        entry = Path(f"/proc/sys/fs/binfmt_misc/qemu-{abi.machine}").read_text()
    except OSError:
        return False
    return "enabled" in entry.splitlines()


def iter_listing(text: str) -> Iterable[tuple[str, str]]:
    """Yield ``(sha256, relative path)`` from a ``sha256sum`` listing (``./`` stripped)."""
    for line in text.splitlines():
        digest, _, rel = line.partition("  ")
        if digest and rel:
            yield digest, rel.removeprefix("./")


# ---------------------------------------------------------------------------- CLI


def main(argv: list[str] | None = None) -> int:
    """``python -m devices.bundle [build ABI ...|path ABI]``: build bundles ahead, or say where they are."""
    parser = argparse.ArgumentParser(prog="python -m devices.bundle", description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=("build", "path"))
    parser.add_argument("abis", nargs="*", default=list(ABIS), help=f"ABIs (default: {' '.join(ABIS)})")
    args = parser.parse_args(argv)
    status = 0
    for name in args.abis:
        try:
            abi = abi_of(name)
            if args.command == "path":
                print(bundle_dir(abi))
                continue
            cached = load_bundle(abi)
            built = ensure_bundle(abi, say=lambda line: print(line, flush=True))
            if cached is not None:  # a fresh build has said so already
                print(built.describe(), flush=True)
        except (UnsupportedAbi, BundleError) as exc:
            print(f"bundle: {exc}", file=sys.stderr)
            status = 1
    return status


if __name__ == "__main__":
    raise SystemExit(main())

