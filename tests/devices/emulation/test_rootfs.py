"""The arm64 userland: system needs in one line each, the atomic cached build, and the real tree."""

from __future__ import annotations

import fcntl
import functools
import json
import shutil
import subprocess
import threading
import time
from pathlib import Path

import pytest

from devices.emulation import qemu, rootfs
from devices.emulation.rootfs import System

#: The entry Debian's qemu-user-static registers, as binfmt_misc prints it once enabled.
ENTRY = (
    "enabled\ninterpreter /usr/libexec/qemu-binfmt/aarch64-binfmt-P\nflags: PF\noffset 0\n"
    "magic 7f454c460201010000000000000000000200b700\nmask ffffffffffffff00fffffffffffffffffeffffff\n"
)


def binfmt_dir(tmp_path: Path, entry: str | None) -> Path:
    directory = tmp_path / "binfmt_misc"
    directory.mkdir(exist_ok=True)
    if entry is not None:
        (directory / rootfs.BINFMT_ENTRY).write_text(entry)
    return directory


def bin_dir(tmp_path: Path, *tools: str) -> Path:
    """A PATH directory holding only ``tools`` (empty scripts)."""
    directory = tmp_path / "bin"
    directory.mkdir(exist_ok=True)
    for tool in tools:
        path = directory / tool
        path.write_text("#!/bin/sh\n")
        path.chmod(0o755)
    return directory


def system(tmp_path: Path, tools: tuple[str, ...], entry: str | None = ENTRY, euid: int = 0) -> System:
    which = functools.partial(shutil.which, path=str(bin_dir(tmp_path, *tools)))
    return System(which=which, euid=euid, binfmt_dir=binfmt_dir(tmp_path, entry))


ALL = ("qemu-aarch64-static", "update-binfmts", "debootstrap")

# ---------------------------------------------------------------------------- system needs


def test_binfmt_entry_parsing() -> None:
    assert rootfs.parse_binfmt_entry(ENTRY) == (True, "PF")
    assert rootfs.binfmt_problem(ENTRY) is None
    assert rootfs.binfmt_problem(None) == "no aarch64 binfmt entry is registered"
    assert rootfs.binfmt_problem(ENTRY.replace("enabled", "disabled")) == "the aarch64 binfmt entry is disabled"
    without_f = rootfs.binfmt_problem(ENTRY.replace("flags: PF", "flags: P"))
    assert without_f is not None and "lacks the F flag (flags P)" in without_f


def test_nothing_missing_gives_no_line(tmp_path: Path) -> None:
    assert rootfs.check_system(system(tmp_path, ALL)) == []


@pytest.mark.parametrize(
    ("tools", "entry", "euid", "expected"),
    [
        (
            ("update-binfmts", "debootstrap"),
            ENTRY,
            0,
            ["qemu-aarch64-static is missing (Debian package qemu-user-static)"],
        ),
        (
            ("qemu-aarch64-static", "debootstrap"),
            None,
            0,
            ["no aarch64 binfmt entry is registered (Debian package binfmt-support)"],
        ),
        (("qemu-aarch64-static", "update-binfmts"), ENTRY, 0, ["debootstrap is missing (Debian package debootstrap)"]),
        (ALL, ENTRY, 1000, ["needs root (debootstrap, chroot, mounts and sshd's ChrootDirectory)"]),
        (
            ALL,
            None,
            1000,
            [
                "no aarch64 binfmt entry is registered: run `update-binfmts --enable qemu-aarch64` as root "
                "(binfmt-support)",
                "needs root (debootstrap, chroot, mounts and sshd's ChrootDirectory)",
            ],
        ),
        (
            (),
            None,
            1000,
            [
                "qemu-aarch64-static is missing (Debian package qemu-user-static)",
                "no aarch64 binfmt entry is registered (Debian package binfmt-support)",
                "debootstrap is missing (Debian package debootstrap)",
                "needs root (debootstrap, chroot, mounts and sshd's ChrootDirectory)",
            ],
        ),
    ],
)
def test_each_missing_need_is_one_line_naming_the_package(
    tmp_path: Path, tools: tuple[str, ...], entry: str | None, euid: int, expected: list[str]
) -> None:
    assert rootfs.check_system(system(tmp_path, tools, entry, euid)) == expected


def test_root_with_binfmt_support_enables_the_entry_itself(tmp_path: Path) -> None:
    # binfmt-support installed, entry not active, root: ensure_binfmt does the boot service's step
    assert rootfs.check_system(system(tmp_path, ALL, entry=None, euid=0)) == []


def test_debootstrap_is_needed_only_while_no_tree_is_built(tmp_path: Path) -> None:
    sys_ = system(tmp_path, ("qemu-aarch64-static", "update-binfmts"))
    assert rootfs.check_system(sys_, need_debootstrap=False) == []
    assert rootfs.check_system(sys_, need_debootstrap=True) == ["debootstrap is missing (Debian package debootstrap)"]


# ---------------------------------------------------------------------------- cache location, stamp


def test_cache_dir_from_the_environment() -> None:
    assert rootfs.cache_dir({rootfs.ROOTFS_ENV: "/srv/trees"}) == Path("/srv/trees")
    assert rootfs.cache_dir({"XDG_CACHE_HOME": "/c"}) == Path("/c/fleetbench/rootfs")
    assert rootfs.cache_dir({}) == Path.home() / ".cache" / "fleetbench" / "rootfs"
    assert rootfs.tree_path(Path("/srv/trees")) == Path("/srv/trees/bookworm-arm64")


def write_stamp(tree: Path, spec: dict[str, object] | None = None) -> None:
    tree.mkdir(parents=True, exist_ok=True)
    (tree / rootfs.STAMP).write_text(json.dumps({"spec": spec or rootfs.SPEC, "versions": {}}))


def test_a_tree_counts_as_built_only_with_a_stamp_of_the_current_recipe(tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "usr").mkdir()
    assert rootfs.read_stamp(tree) is None  # a tree without a stamp: interrupted
    (tree / rootfs.STAMP).write_text("{not json")
    assert rootfs.read_stamp(tree) is None
    write_stamp(tree, {**rootfs.SPEC, "pip": ["numpy==1.0", "onnxruntime==1.0"]})
    assert rootfs.read_stamp(tree) is None  # another recipe: rebuilt
    write_stamp(tree)
    stamp = rootfs.read_stamp(tree)
    assert stamp is not None and stamp["spec"] == rootfs.SPEC


# ---------------------------------------------------------------------------- atomic build


@pytest.fixture
def fake_build(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every system need present; stages write a marker file instead of running (their names are recorded)."""
    stages: list[str] = []
    monkeypatch.setattr(rootfs, "check_system", lambda *a, **k: [])
    monkeypatch.setattr(rootfs, "ensure_binfmt", lambda *a, **k: None)

    def stage(name: str, argv: list[str], log: Path, say: object, env: object = None) -> float:
        stages.append(name)
        build = Path(argv[argv.index("enter") + 1] if "enter" in argv else argv[-2])
        (build / f"stage{len(stages)}").write_text(name)
        return 1.0

    monkeypatch.setattr(rootfs, "_stage", stage)
    monkeypatch.setattr(rootfs, "check_tree", lambda build: {"machine": "aarch64", "python": "3.11.2", "pip": "23.0.1"})
    return stages


def leftovers(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if ".tmp-" in p.name or ".old-" in p.name)


def test_a_build_writes_the_stamp_then_renames_into_place(tmp_path: Path, fake_build: list[str]) -> None:
    stale = tmp_path / f".{rootfs.TREE_NAME}.tmp-interrupted"
    stale.mkdir()
    old = rootfs.tree_path(tmp_path)
    old.mkdir()
    (old / "half-built").write_text("")  # an older tree without a stamp
    lines: list[str] = []
    tree = rootfs.ensure_tree(tmp_path, say=lines.append)
    assert tree == old
    assert len(fake_build) == 1 and fake_build[0].startswith("[1/2] debootstrap")
    assert (tree / "stage1").exists() and not (tree / "half-built").exists()
    stamp = rootfs.read_stamp(tree)
    assert stamp is not None and stamp["versions"]["machine"] == "aarch64"
    assert leftovers(tmp_path) == []  # the interrupted build and the old tree are gone
    assert any("removing .bookworm-arm64.tmp-interrupted" in line for line in lines)
    assert any(line.startswith("rootfs: ready in") and "pip 23.0.1" in line for line in lines)
    # built: the next call does nothing
    fake_build.clear()
    assert rootfs.ensure_tree(tmp_path, say=lines.append) == tree and fake_build == []


@pytest.mark.parametrize("error", [rootfs.RootfsError("check failed"), KeyboardInterrupt()])
def test_an_interrupted_build_never_leaves_a_tree_that_looks_complete(
    tmp_path: Path, fake_build: list[str], monkeypatch: pytest.MonkeyPatch, error: BaseException
) -> None:
    def broken(build: Path) -> dict[str, str]:
        raise error

    monkeypatch.setattr(rootfs, "check_tree", broken)
    with pytest.raises(type(error)):
        rootfs.ensure_tree(tmp_path, say=lambda line: None)
    assert not rootfs.tree_path(tmp_path).exists()
    assert leftovers(tmp_path) == []


def test_a_second_builder_waits_for_the_lock_and_finds_the_tree_built(tmp_path: Path, fake_build: list[str]) -> None:
    lock = tmp_path / f".{rootfs.TREE_NAME}.lock"
    lines: list[str] = []
    result: list[Path] = []
    with open(lock, "a+") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        waiter = threading.Thread(target=lambda: result.append(rootfs.ensure_tree(tmp_path, say=lines.append)))
        waiter.start()
        deadline = time.monotonic() + 10
        while not any("waiting" in line for line in lines) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert any("another build holds" in line for line in lines)
        write_stamp(rootfs.tree_path(tmp_path))  # the first builder finishes
        fcntl.flock(held, fcntl.LOCK_UN)
        waiter.join(10)
    assert result == [rootfs.tree_path(tmp_path)]
    assert fake_build == []  # it built nothing itself


def test_chroot_directory_must_be_root_owned_in_every_component(tmp_path: Path) -> None:
    problem = rootfs.chroot_problem(tmp_path)
    assert problem is not None and "/tmp is owned by uid 0 with mode 1777" in problem
    assert rootfs.ROOTFS_ENV in problem and "\n" not in problem
    missing = rootfs.chroot_problem(tmp_path / "absent")
    assert missing is not None and "absent" in missing


# ---------------------------------------------------------------------------- the real tree


def test_the_built_tree_is_a_fresh_arm64_userland_with_python3_and_pip_only(arm64_tree: Path) -> None:
    stamp = rootfs.read_stamp(arm64_tree)
    assert stamp is not None and stamp["spec"]["version"] == 2 and stamp["spec"]["pip"] == []
    versions = stamp["versions"]
    assert versions["machine"] == "aarch64" and versions["python"].startswith("3.11.") and versions["pip"]
    assert "numpy" not in versions and "onnxruntime" not in versions
    # nothing was pip-installed into the system site-packages: only Debian's own packages are there
    site = arm64_tree / "usr" / "lib" / "python3" / "dist-packages"
    assert (site / "pip").is_dir()
    assert not [p.name for p in site.iterdir() if p.name.lower().startswith(("numpy", "onnxruntime"))]
    assert not (arm64_tree / "usr" / "local" / "lib" / "python3.11" / "dist-packages" / "numpy").exists()
    # real aarch64 binaries: the ELF header's e_machine is 183 (EM_AARCH64)
    python = (arm64_tree / "usr" / "bin").resolve() / Path(str((arm64_tree / "usr/bin/python3").readlink())).name
    header = python.read_bytes()[:20]
    assert header[:4] == b"\x7fELF" and int.from_bytes(header[18:20], "little") == 183
    assert rootfs.chroot_problem(arm64_tree) is None
    assert qemu.host_mounts_under(arm64_tree) == []  # the build mounted only in private namespaces


def test_a_built_tree_is_found_again_in_seconds(arm64_tree: Path) -> None:
    started = time.monotonic()
    assert rootfs.ensure_tree(say=lambda line: pytest.fail(f"rebuilt: {line}")) == arm64_tree
    assert time.monotonic() - started < 5.0  # a rebuild takes minutes (slack for a loaded host)


def test_check_tree_runs_the_trees_python_under_qemu(arm64_tree: Path) -> None:
    found = rootfs.check_tree(arm64_tree)
    assert found["machine"] == "aarch64" and found["python"].startswith("3.11.") and found["pip"]
    assert set(found) == {"machine", "python", "pip"}
    assert qemu.host_mounts_under(arm64_tree) == []


def test_check_tree_refuses_a_tree_that_is_not_fresh(monkeypatch: pytest.MonkeyPatch) -> None:
    answer = json.dumps({"machine": "aarch64", "python": "3.11.2", "pip": "23.0.1", "importable": ["numpy"]})
    done = subprocess.CompletedProcess([], 0, stdout=answer + "\n", stderr="")
    monkeypatch.setattr(rootfs.subprocess, "run", lambda *a, **k: done)
    with pytest.raises(rootfs.RootfsError, match="imports numpy: a fresh tree has python3 and pip only"):
        rootfs.check_tree(Path("/nonexistent"))
    clean = json.dumps({"machine": "aarch64", "python": "3.11.2", "pip": "23.0.1", "importable": []})
    monkeypatch.setattr(rootfs.subprocess, "run", lambda *a, **k: subprocess.CompletedProcess([], 0, clean, ""))
    assert rootfs.check_tree(Path("/nonexistent")) == {"machine": "aarch64", "python": "3.11.2", "pip": "23.0.1"}
