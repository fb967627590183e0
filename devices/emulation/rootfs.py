"""The arm64 Debian userland of emulated aarch64 devices: system needs, one cached build.

An ``emulate: {arch: aarch64}`` device runs a real arm64 Debian bookworm tree through
qemu-user: the kernel's binfmt_misc hands every aarch64 ELF file to
``qemu-aarch64-static``, so the tree's own ``/bin/sh`` and ``python3`` run unchanged.
This module checks what that needs from the system, builds the tree once and finds it
again.

The tree is a fresh board, as a freshly flashed Raspberry Pi OS Lite: Debian's python3
and python3-pip and nothing installed with pip, so numpy and onnxruntime are missing
until the device is provisioned (``fleetbench fleet provision FILE --install`` puts the
aarch64 wheels into the device's ``<workdir>/site``, `harness.provision`). Nothing of
theirs goes into the tree's system site-packages. The emulated phone's runtime bundle
takes only Debian packages from this tree and its wheels from pip (`devices.bundle`),
so it does not need them here either.

What the system must give (`check_system`; one line per missing need, naming the Debian
package):

* ``qemu-aarch64-static`` (qemu-user-static);
* an enabled ``qemu-aarch64`` binfmt entry with the ``F`` flag (binfmt-support): with
  ``F`` the kernel opens the interpreter when the entry is registered, so it still works
  inside a chroot, where the host's ``/usr/libexec/qemu-binfmt`` is not visible. Where
  binfmt-support is installed but the entry is not active (a container or a machine
  booted without its service), `ensure_binfmt` does what the package's boot service
  does, as root: mount ``binfmt_misc`` when it is not mounted and run
  ``update-binfmts --enable qemu-aarch64``. That is system configuration that outlives
  fleetbench, as after a boot, so it is reported and not undone;
* ``debootstrap`` (only while no tree is built);
* root: debootstrap, chroot, the mounts and sshd's ``ChrootDirectory`` need it.

The tree (`ensure_tree`) lives outside the repository in
``$FLEETBENCH_ROOTFS_DIR/bookworm-arm64`` (default ``$XDG_CACHE_HOME/fleetbench/rootfs``,
else ``~/.cache/fleetbench/rootfs``), is shared by every fleet and every aarch64 device,
and is never written after its build: each device writes into its own overlay layer
(`devices.emulation.qemu`). The build:

1. ``debootstrap --arch=arm64 --variant=minbase`` with python3 and python3-pip (and
   what they depend on; its second stage runs under qemu);
2. a check inside the tree: ``platform.machine()`` is ``aarch64``, pip runs, and numpy
   and onnxruntime do not import (a tree that has them is not fresh); the machine and
   the python and pip versions go into the stamp.

It is atomic: the tree is built in ``.bookworm-arm64.tmp-*`` beside its final place
and renamed into place only after the completion stamp (``.fleetbench-rootfs.json``,
written last, with the versions) is in it. A tree counts as built only when its stamp
exists and names the same recipe (`SPEC`), so an interrupted build never looks
complete and a changed recipe rebuilds. An ``flock`` on ``.bookworm-arm64.lock``
serialises builds (a second ``fleet up`` waits, then finds the tree built); leftover
``.tmp-*`` trees of interrupted builds are removed under that lock. Every command that
needs mounts (debootstrap's second stage mounts ``/proc`` and ``/sys``) runs in a private
mount namespace (``unshare --mount --propagation private``), so its mounts vanish with
it even when the build is killed: a build never leaves a mount behind. The first build
takes minutes, nearly all of it debootstrap's second stage under qemu (``python -m
devices.emulation.rootfs build`` prints its progress); later uses read the stamp only. `SPEC`
carries a ``version``, raised whenever the tree's contents change without its package
lists changing (version 2: the fresh tree; version 1 had numpy and onnxruntime
pip-installed), so every older tree is rebuilt. A changed recipe renames the old tree
aside and deletes it once the new one is in place, so stop the aarch64 devices before
upgrading fleetbench to a new recipe (their overlays read the old tree).
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from devices.cache import fleetbench_cache
from devices.emulation.qemu import TREE_ENV, enter_argv
from devices.files import atomic_write

#: Debian suite and architecture of the tree.
SUITE = "bookworm"
DEBIAN_ARCH = "arm64"
#: What ``uname -m`` says inside the tree.
MACHINE = "aarch64"
#: Debian packages added to the minimal base (as on Raspberry Pi OS Lite: no pip packages).
DEBIAN_PACKAGES: tuple[str, ...] = ("python3", "python3-pip")
#: Python modules a fresh tree must not import (the device gets them by provisioning).
NOT_INSTALLED: tuple[str, ...] = ("numpy", "onnxruntime")
#: The recipe a stamp must name for the tree to count as built.
SPEC: dict[str, Any] = {
    "version": 2,
    "suite": SUITE,
    "arch": DEBIAN_ARCH,
    "variant": "minbase",
    "debian": list(DEBIAN_PACKAGES),
    "pip": [],
}
#: Name of the tree inside the cache directory.
TREE_NAME = f"{SUITE}-{DEBIAN_ARCH}"
#: Completion stamp inside the tree.
STAMP = ".fleetbench-rootfs.json"
#: Environment variable naming the cache directory of trees.
ROOTFS_ENV = "FLEETBENCH_ROOTFS_DIR"
#: Environment variable naming the Debian mirror debootstrap uses.
MIRROR_ENV = "FLEETBENCH_DEBIAN_MIRROR"
DEFAULT_MIRROR = "http://deb.debian.org/debian"
#: binfmt_misc mount point and the entry qemu-user-static registers.
BINFMT_DIR = Path("/proc/sys/fs/binfmt_misc")
BINFMT_ENTRY = "qemu-aarch64"
#: Seconds between progress lines while a build stage runs.
HEARTBEAT_S = 30.0

Printer = Callable[[str], None]


class RootfsError(RuntimeError):
    """The system lacks something the tree needs, or building it failed (one line)."""


# ---------------------------------------------------------------------------- system needs


def parse_binfmt_entry(text: str) -> tuple[bool, str]:
    """Read a ``/proc/sys/fs/binfmt_misc/<entry>`` file.

    Parameters
    ----------
    text : str
        Its contents (``enabled``, ``interpreter ...``, ``flags: PF``, ...).

    Returns
    -------
    tuple of (bool, str)
        Whether the entry is enabled, and its flags (``""`` when none are printed).
    """
    lines = [line.strip() for line in text.splitlines()]
    flags = next((line.partition(":")[2].strip() for line in lines if line.startswith("flags:")), "")
    return "enabled" in lines, flags


def binfmt_problem(entry_text: str | None) -> str | None:
    """Say what is wrong with the aarch64 binfmt entry, or None when it serves a chroot.

    Parameters
    ----------
    entry_text : str or None
        Contents of the ``qemu-aarch64`` entry; None when there is no such entry.

    Returns
    -------
    str or None
        A reason (without the package hint), or None.
    """
    if entry_text is None:
        return "no aarch64 binfmt entry is registered"
    enabled, flags = parse_binfmt_entry(entry_text)
    if not enabled:
        return "the aarch64 binfmt entry is disabled"
    if "F" not in flags:
        return f"the aarch64 binfmt entry lacks the F flag (flags {flags or 'none'}), so it fails inside a chroot"
    return None


def _read_entry(binfmt_dir: Path) -> str | None:
    try:
        return (binfmt_dir / BINFMT_ENTRY).read_text()
    except OSError:
        return None


@dataclass(frozen=True)
class System:
    """How `check_system` looks at the machine (injectable for tests).

    Attributes
    ----------
    which : callable
        ``name -> path or None`` (`shutil.which` by default).
    euid : int
        Effective user id.
    binfmt_dir : pathlib.Path
        Where binfmt_misc is mounted.
    """

    which: Callable[[str], str | None] = shutil.which
    euid: int = -1
    binfmt_dir: Path = BINFMT_DIR

    def is_root(self) -> bool:
        """Whether we run as root (``euid`` -1 means: ask the OS)."""
        return (os.geteuid() if self.euid == -1 else self.euid) == 0


def _sbin_which(which: Callable[[str], str | None], name: str) -> str | None:
    # debootstrap and update-binfmts live in /usr/sbin, which a user's PATH may lack
    found = which(name)
    if found is None and which is shutil.which:
        found = shutil.which(name, path="/usr/sbin:/sbin")
    return found


def check_system(system: System | None = None, *, need_debootstrap: bool = True) -> list[str]:
    """Return one line per missing system need of an aarch64 device (empty when all are there).

    Parameters
    ----------
    system : System, optional
        How to look (default: this machine).
    need_debootstrap : bool
        Whether debootstrap is needed (only while the tree is not built).

    Returns
    -------
    list of str
        E.g. ``"qemu-aarch64-static is missing (Debian package qemu-user-static)"``.
    """
    sys_ = system or System()
    missing = []
    if sys_.which("qemu-aarch64-static") is None:
        missing.append("qemu-aarch64-static is missing (Debian package qemu-user-static)")
    problem = binfmt_problem(_read_entry(sys_.binfmt_dir))
    if problem is not None:
        if _sbin_which(sys_.which, "update-binfmts") is None:
            missing.append(f"{problem} (Debian package binfmt-support)")
        elif not sys_.is_root():
            missing.append(f"{problem}: run `update-binfmts --enable {BINFMT_ENTRY}` as root (binfmt-support)")
        # else: root with binfmt-support: ensure_binfmt enables it
    if need_debootstrap and _sbin_which(sys_.which, "debootstrap") is None:
        missing.append("debootstrap is missing (Debian package debootstrap)")
    if not sys_.is_root():
        missing.append("needs root (debootstrap, chroot, mounts and sshd's ChrootDirectory)")
    return missing


def ensure_binfmt(say: Printer = print, binfmt_dir: Path = BINFMT_DIR) -> None:
    """Make the aarch64 binfmt entry active as binfmt-support's boot service would (root only).

    Mounts ``binfmt_misc`` at ``binfmt_dir`` when it is not mounted and runs
    ``update-binfmts --enable qemu-aarch64``; does nothing when the entry already serves.

    Raises
    ------
    RootfsError
        If the entry still does not serve a chroot afterwards.
    """
    if binfmt_problem(_read_entry(binfmt_dir)) is None:
        return
    if not (binfmt_dir / "register").exists():
        done = subprocess.run(
            ["mount", "-t", "binfmt_misc", "binfmt_misc", str(binfmt_dir)], capture_output=True, text=True
        )
        if done.returncode != 0:
            raise RootfsError(f"cannot mount binfmt_misc at {binfmt_dir}: {done.stderr.strip()}")
        say(f"mounted binfmt_misc at {binfmt_dir} (as binfmt-support's boot service does)")
    tool = shutil.which("update-binfmts") or "/usr/sbin/update-binfmts"
    done = subprocess.run([tool, "--enable", BINFMT_ENTRY], capture_output=True, text=True)
    problem = binfmt_problem(_read_entry(binfmt_dir))
    if problem is not None:
        detail = (done.stderr or done.stdout).strip()
        raise RootfsError(
            f"{problem} after `update-binfmts --enable {BINFMT_ENTRY}`" + (f": {detail}" if detail else "")
        )
    say(f"enabled the {BINFMT_ENTRY} binfmt entry (update-binfmts --enable {BINFMT_ENTRY})")


# ---------------------------------------------------------------------------- the cached tree


def cache_dir(environ: dict[str, str] | None = None) -> Path:
    """Return the directory holding built trees.

    Parameters
    ----------
    environ : dict, optional
        Environment to read (default ``os.environ``): ``FLEETBENCH_ROOTFS_DIR``, else
        ``$XDG_CACHE_HOME/fleetbench/rootfs``, else ``~/.cache/fleetbench/rootfs``.

    Returns
    -------
    pathlib.Path
        An absolute path.
    """
    return fleetbench_cache(ROOTFS_ENV, "rootfs", environ)


def tree_path(directory: Path | None = None) -> Path:
    """Return where the arm64 tree lives (`cache_dir` / ``bookworm-arm64``)."""
    return (directory or cache_dir()) / TREE_NAME


def read_stamp(tree: Path) -> dict[str, Any] | None:
    """Return the completion stamp of ``tree`` when it names the current `SPEC`, else None."""
    try:
        stamp = json.loads((tree / STAMP).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(stamp, dict) or stamp.get("spec") != SPEC:
        return None
    return stamp


def _elapsed(seconds: float) -> str:
    minutes, secs = divmod(int(round(seconds)), 60)
    return f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


@contextlib.contextmanager
def _locked(path: Path, say: Printer) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            say(f"rootfs: another build holds {path}; waiting for it")
            fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _tree_env() -> dict[str, str]:
    env = dict(TREE_ENV)
    for key in ("http_proxy", "https_proxy", "no_proxy", "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY"):
        if key in os.environ:
            env[key] = os.environ[key]
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[2])  # for `python -m devices.emulation.qemu` only
    return env


def _stage(name: str, argv: list[str], log: Path, say: Printer, env: dict[str, str] | None = None) -> float:
    """Run one build stage, its output appended to ``log``; a heartbeat line every HEARTBEAT_S."""
    started = time.monotonic()
    say(f"rootfs: {name} ...")
    with open(log, "a") as out:
        out.write(f"\n$ {' '.join(argv)}\n")
        out.flush()
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env)
        done = threading.Event()

        def beat() -> None:
            while not done.wait(HEARTBEAT_S):
                say(f"rootfs: {name}: {_elapsed(time.monotonic() - started)} so far, last: {_last_line(log)}")

        ticker = threading.Thread(target=beat, daemon=True)
        ticker.start()
        try:
            rc = proc.wait()
        except BaseException:
            proc.kill()
            proc.wait()
            raise
        finally:
            done.set()
    seconds = time.monotonic() - started
    if rc != 0:
        raise RootfsError(f"{name} failed with status {rc} after {_elapsed(seconds)}: {_last_line(log)} (log: {log})")
    say(f"rootfs: {name}: done in {_elapsed(seconds)}")
    return seconds


def _last_line(log: Path) -> str:
    try:
        with open(log, "rb") as handle:
            handle.seek(max(0, handle.seek(0, os.SEEK_END) - 4096))
            lines = [x for x in handle.read().decode("utf-8", "replace").splitlines() if x.strip()]
    except OSError:
        return "(no log)"
    return lines[-1].strip()[:160] if lines else "(no output yet)"


#: Run inside the tree after debootstrap: machine, versions and which of NOT_INSTALLED import, as one JSON line.
_CHECK = (
    "import importlib.util, json, platform, pip; "
    "print(json.dumps({'machine': platform.machine(), 'python': platform.python_version(), "
    "'pip': pip.__version__, "
    f"'importable': [m for m in {list(NOT_INSTALLED)!r} if importlib.util.find_spec(m) is not None]}}))"
)


def check_tree(tree: Path) -> dict[str, Any]:
    """Run the tree's python3 under qemu and return its machine and versions.

    Parameters
    ----------
    tree : pathlib.Path
        A debootstrapped arm64 tree.

    Returns
    -------
    dict
        ``machine``, ``python``, ``pip``.

    Raises
    ------
    RootfsError
        If the check fails, the machine is not `MACHINE`, or one of `NOT_INSTALLED`
        imports (the tree is not fresh).
    """
    check = subprocess.run(
        enter_argv(tree, None, ["/usr/bin/python3", "-c", _CHECK], chroot=True),
        capture_output=True,
        text=True,
        env=_tree_env(),
        stdin=subprocess.DEVNULL,
    )
    try:
        found: dict[str, Any] = json.loads(check.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        raise RootfsError(f"the check inside the tree failed: {check.stderr.strip()[-300:]}") from None
    if found.get("machine") != MACHINE:
        raise RootfsError(f"the tree's python3 reports machine {found.get('machine')!r}, not {MACHINE}")
    importable = found.pop("importable", [])
    if importable:
        raise RootfsError(f"the tree's python3 imports {', '.join(importable)}: a fresh tree has python3 and pip only")
    return found


def _remove_tree(path: Path) -> None:
    # a tree holds no mount of ours (every mount lived in a private namespace)
    shutil.rmtree(path, ignore_errors=True)


def ensure_tree(directory: Path | None = None, say: Printer = print, mirror: str | None = None) -> Path:
    """Return the built arm64 tree, building it first when it is missing or stale.

    Parameters
    ----------
    directory : pathlib.Path, optional
        Cache directory (default `cache_dir`).
    say : callable
        Receives progress lines (stage, elapsed time).
    mirror : str, optional
        Debian mirror (default ``$FLEETBENCH_DEBIAN_MIRROR``, else deb.debian.org).

    Returns
    -------
    pathlib.Path
        The tree; its stamp names `SPEC`.

    Raises
    ------
    RootfsError
        If a system need is missing or a stage fails (the partial tree is removed).
    """
    tree = tree_path(directory)
    stamp = read_stamp(tree)
    if stamp is not None:
        return tree
    missing = check_system(need_debootstrap=True)
    if missing:
        raise RootfsError("; ".join(missing))
    ensure_binfmt(say)
    parent = tree.parent
    with _locked(parent / f".{TREE_NAME}.lock", say):
        if read_stamp(tree) is not None:  # built while we waited
            return tree
        for stale in parent.glob(f".{TREE_NAME}.tmp-*"):
            say(f"rootfs: removing {stale.name} (an interrupted build)")
            _remove_tree(stale)
        build = Path(tempfile.mkdtemp(prefix=f".{TREE_NAME}.tmp-", dir=parent))
        build.chmod(0o755)
        log = parent / f"{TREE_NAME}.build.log"
        log.write_text("")
        started = time.monotonic()
        say(
            f"rootfs: building the {SUITE} {DEBIAN_ARCH} userland in {tree} (first use only: 3 to 10 minutes; "
            f"log: {log})"
        )
        try:
            debootstrap = _sbin_which(shutil.which, "debootstrap") or "debootstrap"
            seconds = {
                "debootstrap": _stage(
                    f"[1/2] debootstrap --arch={DEBIAN_ARCH} {SUITE}",
                    [
                        "unshare",
                        "--mount",
                        "--propagation",
                        "private",
                        debootstrap,
                        f"--arch={DEBIAN_ARCH}",
                        "--variant=minbase",
                        "--include=" + ",".join(DEBIAN_PACKAGES),
                        SUITE,
                        str(build),
                        mirror or os.environ.get(MIRROR_ENV) or DEFAULT_MIRROR,
                    ],
                    log,
                    say,
                ),
            }
            say("rootfs: [2/2] checking python3 and pip inside the tree (and that it is fresh)")
            found = check_tree(build)
            for leftover in (build / "var" / "cache" / "apt" / "archives").glob("*.deb"):
                leftover.unlink()
            record = {
                "spec": SPEC,
                "versions": found,
                "seconds": {**seconds, "total": round(time.monotonic() - started, 1)},
                "built_at": time.time(),
            }
            atomic_write(build / STAMP, json.dumps(record, indent=2), mode=0o644)
            old = None
            if tree.exists():
                old = parent / f".{TREE_NAME}.old-{os.getpid()}"
                os.rename(tree, old)
            os.rename(build, tree)
            if old is not None:
                _remove_tree(old)
        except BaseException:
            _remove_tree(build)
            raise
    say(
        f"rootfs: ready in {_elapsed(time.monotonic() - started)}: python {found['python']}, pip {found['pip']}, "
        f"nothing else installed with pip ({tree})"
    )
    return tree


def chroot_problem(path: Path) -> str | None:
    """Say why sshd would refuse ``path`` as a ``ChrootDirectory``, or None.

    sshd wants every component of the path owned by root and writable by no one else.

    Parameters
    ----------
    path : pathlib.Path
        An absolute directory.

    Returns
    -------
    str or None
    """
    current = Path(path.anchor)
    for part in (Path(path.anchor), *[current := current / p for p in path.parts[1:]]):
        try:
            st = part.stat()
        except OSError as exc:
            return f"{part}: {exc.strerror}"
        if st.st_uid != 0 or st.st_mode & 0o022:
            return (
                f"{part} is owned by uid {st.st_uid} with mode {st.st_mode & 0o7777:o}; sshd's ChrootDirectory needs "
                f"every component of {path} owned by root and not group/world-writable (set {ROOTFS_ENV})"
            )
    return None


# ---------------------------------------------------------------------------- CLI


def main(argv: list[str] | None = None) -> int:
    """``python -m devices.emulation.rootfs [build|check|path]``: build the tree, or say what is missing."""
    parser = argparse.ArgumentParser(prog="python -m devices.emulation.rootfs", description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=("build", "check", "path"), nargs="?", default="build")
    args = parser.parse_args(argv)
    if args.command == "path":
        print(tree_path())
        return 0
    if args.command == "check":
        missing = check_system(need_debootstrap=read_stamp(tree_path()) is None)
        for line in missing:
            print(line, file=sys.stderr)
        print(f"{tree_path()}: {'built' if read_stamp(tree_path()) else 'not built'}")
        return 1 if missing else 0
    try:
        tree = ensure_tree(say=lambda line: print(line, flush=True))
    except RootfsError as exc:
        print(f"rootfs: {exc}", file=sys.stderr)
        return 1
    versions = (read_stamp(tree) or {}).get("versions", {})
    print(f"{tree}: built ({', '.join(f'{k} {versions.get(k)}' for k in ('python', 'pip'))})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
