"""Shared pytest configuration."""

from __future__ import annotations

import fcntl
import hashlib
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tests.devices.conftest import (  # noqa: F401 - fixtures offered to every test directory
    adb_path,
    adb_server,
    adb_transport,
    arm64_tree,
    bundle_arm64,
    bundle_x86_64,
    example_fleet_file,
    phone,
    sshd_path,
    sshd_server,
)

if TYPE_CHECKING:
    from exporters.arch import Arch
    from exporters.artifacts import ExportResult
    from exporters.zoo import ZooModel


@pytest.fixture(scope="session", autouse=True)
def _model_registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Register the users' models the tests resolve in the session's directory, not the home directory."""
    old = os.environ.get("FLEETBENCH_MODELS_DIR")
    os.environ["FLEETBENCH_MODELS_DIR"] = str(tmp_path_factory.mktemp("models"))
    yield
    if old is None:
        os.environ.pop("FLEETBENCH_MODELS_DIR", None)
    else:
        os.environ["FLEETBENCH_MODELS_DIR"] = old


class SharedArtifacts:
    """One artifact root for the whole test run, shared by every pytest-xdist worker.

    A (model, width, batch, optimizer) set is exported once per run: `export` holds a file
    lock per set, so a worker asking for a set another worker is exporting waits for it and
    then finds it in the cache (`exporters.artifacts.export_artifacts` keys the root by
    content). Tests that assert on a first export, a cache miss or the root's listing use
    their own ``tmp_path`` instead.
    """

    def __init__(self, base: Path) -> None:
        self.root = base / "sets"
        self.locks = base / "locks"
        self.root.mkdir(parents=True, exist_ok=True)
        self.locks.mkdir(parents=True, exist_ok=True)

    def export(self, model: ZooModel, arch: Arch, *, batch: int, optimizer: str) -> ExportResult:
        """Export (or find in the shared root) one set, one worker at a time per set."""
        from exporters.artifacts import export_artifacts

        label = f"{model.name}|{arch.key()}|{batch}|{optimizer}".encode()
        lock = self.locks / f"{hashlib.sha256(label).hexdigest()[:24]}.lock"
        with open(lock, "a") as held:
            fcntl.flock(held, fcntl.LOCK_EX)
            try:
                return export_artifacts(model, arch, batch=batch, optimizer=optimizer, out_dir=self.root)
            finally:
                fcntl.flock(held, fcntl.LOCK_UN)


@pytest.fixture(scope="session")
def shared_artifacts(tmp_path_factory: pytest.TempPathFactory) -> SharedArtifacts:
    """The run's shared artifact root: the run's base directory under pytest-xdist (the workers'
    common parent), else this session's own base directory."""
    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent
    return SharedArtifacts(base / "shared-artifacts")


@pytest.fixture
def one_torch_thread() -> Iterator[None]:
    """Run a test with one torch intra-op thread (small models on a busy machine), then restore the count."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


class SmallFileSystems:
    """Small tmpfs file systems mounted under a test's ``tmp_path`` (a full disk on demand)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.mounted: list[Path] = []

    def mount(self, name: str, size: str) -> Path:
        """Mount a tmpfs of ``size`` (``"64k"``, ``"4m"``) on ``root/name`` and return that directory."""
        where = self.root / name
        where.mkdir(parents=True, exist_ok=True)
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
                              capture_output=True, text=True, check=False)  # fmt: skip
        if done.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip() or done.returncode}")
        self.mounted.append(where)
        return where

    def resize(self, where: Path, size: str) -> None:
        """Give the tmpfs at ``where`` a new size, keeping its files."""
        subprocess.run(["mount", "-o", f"remount,size={size}", str(where)], check=True)

    def fill(self, where: Path) -> Path:
        """Write zeros into ``where/filler`` until its file system is full; return the file (unlink it to free)."""
        filler = where / "filler"
        with open(filler, "wb", buffering=0) as out:
            try:
                while out.write(b"\0" * 4096):
                    pass
            except OSError:
                pass
        return filler

    def unmount_all(self) -> None:
        """Unmount every file system mounted here (lazily, should a process still hold one)."""
        for where in reversed(self.mounted):
            subprocess.run(["umount", "-l", str(where)], capture_output=True, check=False)
        self.mounted.clear()


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[SmallFileSystems]:
    """Mount small tmpfs file systems under ``tmp_path``; all are unmounted at teardown (root only, else skip)."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    file_systems = SmallFileSystems(tmp_path / "fs")
    try:
        yield file_systems
    finally:
        file_systems.unmount_all()


#: Modules whose tests run for half a minute or more in all (whole demos, campaigns and FL runs on
#: emulated fleets, the qemu arm64 board, every zoo model's export), longest first, as
#: ``--durations`` and the junit report of a CI run show them.  Under pytest-xdist (``--dist
#: loadfile --no-loadscope-reorder``, tox.ini) a worker takes whole modules in this order and the
#: short modules fill in after them, so that the workers finish together: the longest first
#: is what keeps the slowest worker near a quarter of the total.
LONG_MODULES = (
    "tests/fleetbench/test_faults.py",
    "tests/fleetbench/test_real_device.py",
    "tests/exporters/test_step_model.py",
    "tests/fleetbench/test_demo.py",
    "tests/exporters/test_artifacts.py",
    "tests/harness/test_device_run.py",
    "tests/fleetbench/test_package.py",
    "tests/fl/test_cli.py",
    "tests/harness/test_phone_runtime.py",
    "tests/harness/test_profile_cli.py",
    "tests/harness/test_campaign.py",
    "tests/fl/executors/test_ray.py",
    "tests/exporters/test_user_model.py",
    "tests/harness/test_runner.py",
    "tests/harness/test_resident.py",
    "tests/fl/executors/test_devices.py",
    "tests/harness/test_deploy.py",
    "tests/fleetbench/test_local_fleet.py",
)


def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    """Run the long modules first, each module's tests together and in their own order."""
    rank = {module: i for i, module in enumerate(LONG_MODULES)}
    root = config.rootpath

    def key(item: pytest.Item) -> int:
        module = item.path.relative_to(root).as_posix() if item.path.is_relative_to(root) else ""
        return rank.get(module, len(LONG_MODULES))

    items.sort(key=key)  # stable: the other modules keep their order


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Say plainly when nothing was collected: CI treats exit status 5 as a failure."""
    if exitstatus == pytest.ExitCode.NO_TESTS_COLLECTED:
        print("\nfleetbench: no tests ran (pytest exit status 5); CI fails on this.")
