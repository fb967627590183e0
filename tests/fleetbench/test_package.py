"""The package a user installs: `python -m build`'s sdist and wheel, and the wheel at work.

The wheel is installed (not editable) into a fresh virtual environment and runs
`fleetbench demo --local` from a directory outside the checkout, so nothing can be
imported from the source tree. The environment gets the wheel only; the dependencies
(torch, onnxruntime-training, ...) come from the test environment's site-packages,
named in a ``.pth`` file, which Python adds as a plain path (the test environment's
own ``.pth`` files, its editable install of fleetbench among them, are not run).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import sysconfig
import tarfile
import zipfile
from pathlib import Path

import pytest

from tests.fleetbench.test_demo import LOCAL_DEMO, check_local_demo

ROOT = Path(__file__).resolve().parents[2]

#: The project's packages: everything the wheel may hold besides its metadata.
PACKAGES = {"fleetbench", "reports", "fl", "harness", "devices", "exporters"}

#: What a checkout holds that is not the project's source (the demo's output among them).
NOT_SOURCE = (".git", ".venv", ".tox", "*.egg-info", "build", "dist", "__pycache__", ".mypy_cache", ".ruff_cache",
              ".pytest_cache", ".hypothesis", "site")  # fmt: skip


@pytest.fixture(scope="module")
def dists(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """Build the sdist and the wheel from a copy of the checkout after a demo has run in it."""
    base = tmp_path_factory.mktemp("package")
    source = base / "source"
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(*NOT_SOURCE))
    leftover = source / "fleetbench-demo" / "fleet"  # what `fleetbench demo` leaves in the working directory
    leftover.mkdir(parents=True, exist_ok=True)  # the checkout may hold a real demo's output already
    (leftover / "runner.py").write_text("print('a copy of the runner')\n")
    out = base / "dist"
    done = subprocess.run(
        [sys.executable, "-m", "build", "--no-isolation", "--sdist", "--wheel", "--outdir", str(out), str(source)],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (wheel,) = out.glob("fleetbench-*.whl")
    (sdist,) = out.glob("fleetbench-*.tar.gz")
    return sdist, wheel


def test_the_wheel_holds_the_project_s_packages_and_their_data_only(dists: tuple[Path, Path]) -> None:
    _, wheel = dists
    names = zipfile.ZipFile(wheel).namelist()
    tops = {name.split("/", 1)[0] for name in names}
    assert tops - {d for d in tops if d.endswith(".dist-info")} == PACKAGES, sorted(tops)
    assert "devices/fleets/emulated.yaml" in names and "fleetbench/cli.py" in names
    assert not [name for name in names if "fleetbench-demo" in name or name.startswith("tests/")]


def test_the_sdist_holds_the_source_without_the_demo_s_output(dists: tuple[Path, Path]) -> None:
    sdist, _ = dists
    with tarfile.open(sdist) as archive:
        names = [name.split("/", 1)[1] for name in archive.getnames() if "/" in name]
    assert "pyproject.toml" in names and "README.md" in names and "harness/__init__.py" in names
    assert not [name for name in names if name.startswith(("fleetbench-demo", ".venv", ".tox"))]


def test_the_installed_wheel_runs_the_local_demo_from_another_directory(
    dists: tuple[Path, Path], tmp_path: Path
) -> None:
    _, wheel = dists
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    python = venv / "bin" / "python"
    done = subprocess.run(
        [str(python), "-m", "pip", "install", "-q", "--no-deps", "--no-index", str(wheel)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    deps = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    (Path(purelib) / "fleetbench-test-deps.pth").write_text("".join(f"{p}\n" for p in sorted(deps)))

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    where = subprocess.run(
        [str(python), "-c", "import fleetbench, harness; print(fleetbench.__file__); print(harness.__file__)"],
        capture_output=True, text=True, cwd=elsewhere, check=True,
    ).stdout.split()  # fmt: skip
    assert all(Path(p).is_relative_to(venv) for p in where), where  # the wheel's files, not the checkout's

    fleetbench = venv / "bin" / "fleetbench"
    argv = [str(fleetbench), *LOCAL_DEMO, "--out", "out"]
    env = {"PATH": f"{venv / 'bin'}:/usr/bin:/bin", "HOME": str(tmp_path), "OMP_NUM_THREADS": "1"}
    ran = subprocess.run(argv, capture_output=True, text=True, cwd=elsewhere, env=env, timeout=900)
    assert ran.returncode == 0, ran.stdout[-3000:] + ran.stderr[-3000:]
    check_local_demo(elsewhere / "out", ran.stdout)  # the demo's whole local run, from the installed wheel
