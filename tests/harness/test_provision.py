"""Provisioning on real transports: reporting backends, installing only from given wheels."""

from __future__ import annotations

import base64
import hashlib
import importlib.util
import platform
import sys
import zipfile
from pathlib import Path

import numpy
import onnxruntime
import pytest
import torch

from devices.fleet import Device
from devices.local import LocalTransport
from fleetbench.cli import main
from harness.provision import (
    DEFAULT_PACKAGES,
    Package,
    check_device,
    format_table,
    match_wheels,
    provision,
    provision_device,
    runner_env,
    wheel_distribution,
)
from tests.harness.test_deploy import PY, Target, make_target

NUMPY = DEFAULT_PACKAGES[0]
FAKE = Package("fbfake", "fbfake_mod", "fb-fake")  # absent everywhere until provisioned


def make_wheel(directory: Path, dist: str = "fb_fake", module: str = "fbfake_mod", version: str = "0.1") -> Path:
    """Write a minimal pure-Python wheel by hand (what ``pip wheel`` would build)."""
    info = f"{dist}-{version}.dist-info"
    files = {
        f"{module}/__init__.py": f"__version__ = {version!r}\n".encode(),
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n".encode(),
        f"{info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: fleetbench-test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = (
        "".join(
            f"{name},sha256={base64.urlsafe_b64encode(hashlib.sha256(data).digest()).decode().rstrip('=')},{len(data)}\n"
            for name, data in files.items()
        )
        + f"{info}/RECORD,,\n"
    )
    path = directory / f"{dist}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as zf:
        for name, data in files.items():
            zf.writestr(name, data)
        zf.writestr(f"{info}/RECORD", record)
    return path


@pytest.fixture(params=["local", "ssh", "adb"])
def target(request: pytest.FixtureRequest, tmp_path: Path) -> Target:
    return make_target(request, request.param, tmp_path)


def test_local_device_reports_backends_with_versions(tmp_path: Path) -> None:
    device = Device("loc", "local", workdir=str(tmp_path / "device"), python=PY)
    result = provision([device])
    assert result.ok
    report = result.successes["loc"]
    assert report.python == ".".join(map(str, sys.version_info[:3]))
    assert report.packages["numpy"].version == numpy.__version__
    assert report.packages["onnxruntime"].version == onnxruntime.__version__
    assert report.packages["onnxruntime-training"].version == onnxruntime.__version__
    assert report.packages["torch"].version == torch.__version__
    assert all(s.present and s.importable for s in report.packages.values())
    assert report.can_run("ort") and report.can_run("onnx") and report.can_run("torch")
    assert report.machine == platform.machine()
    assert report.site == f"{tmp_path}/device/site"


def test_missing_package_installs_only_from_the_given_wheel(target: Target, tmp_path: Path) -> None:
    wheel = make_wheel(tmp_path)
    unneeded = make_wheel(tmp_path, dist="numpy", module="numpy_fake", version="9.9")  # numpy is present
    packages = (NUMPY, FAKE)
    before = provision_device(target.transport, target.device, (), packages)
    assert before.missing() == ("fbfake",) and not before.packages["fbfake"].present

    after = provision_device(target.transport, target.device, [wheel, unneeded], packages)
    assert (after.installed, after.install_error) == (("fbfake",), None)
    assert after.packages["fbfake"] == after.packages["fbfake"].__class__(True, True, "0.1", None)
    assert after.site == f"{target.device.workdir}/site"
    assert (target.host_dir / "site" / "fbfake_mod" / "__init__.py").is_file()
    pushed = [p.name for p in (target.host_dir / "wheels").rglob("*.whl")]
    assert pushed == [wheel.name]  # the numpy wheel was not needed, so not pushed
    assert importlib.util.find_spec("fbfake_mod") is None  # the host's site-packages are untouched

    again = provision_device(target.transport, target.device, [wheel], packages)
    assert again.installed == () and not again.missing()
    env_run = target.transport.run(
        [*runner_env(target.device.workdir), PY, "-c", "import fbfake_mod; print(fbfake_mod.__version__)"], timeout=30
    )
    assert (env_run.rc, env_run.stdout.strip()) == (0, "0.1")


def test_a_dead_device_fails_while_the_others_answer(tmp_path: Path) -> None:
    devices = [
        Device("alive", "local", workdir=str(tmp_path / "alive"), python=PY),
        Device("dead", "ssh", host="127.0.0.1", port=1, known_hosts=tmp_path / "known_hosts"),
        Device("nopython", "local", workdir=str(tmp_path / "nopy"), python="/nonexistent/python3"),
    ]
    result = provision(devices, packages=(NUMPY,))
    assert list(result.successes) == ["alive", "nopython"]
    assert result.failures["dead"].kind == "unreachable"
    assert result.successes["alive"].packages["numpy"].importable
    assert result.successes["nopython"].python is None and not result.successes["nopython"].can_run("ort")
    table = format_table(result, devices, (NUMPY,))
    assert "FAILED: unreachable" in table and "nopython | -       | missing" in table
    assert "nopython: no Python on the device (the device's python cannot run): no backend can run" in table


def test_cmd_provision_prints_a_table_and_exits_1_when_a_device_failed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(
        "devices:\n"
        f"  - {{name: here, kind: local, workdir: {tmp_path}/here, python: {PY}}}\n"
        f"  - {{name: gone, kind: ssh, host: 127.0.0.1, port: 1, known_hosts: {tmp_path}/kh}}\n"
    )
    assert main(["fleet", "provision", str(fleet)]) == 1
    out = capsys.readouterr().out
    header = [cell.strip() for cell in out.splitlines()[0].split(" | ")]
    assert header == [
        "device", "machine", "python", "numpy", "onnxruntime", "onnxruntime-training", "torch", "can run", "uses"
    ]
    here = next(line for line in out.splitlines() if line.startswith("here "))
    assert [cell.strip() for cell in here.split(" | ")][-2:] == ["ort, onnx, torch", "ort"]
    assert "FAILED: unreachable" in out


def test_wheel_names_are_matched_by_distribution(tmp_path: Path) -> None:
    ort = tmp_path / "onnxruntime_training-1.19.2-cp311-cp311-manylinux_2_17_x86_64.whl"
    assert wheel_distribution(ort) == "onnxruntime-training"
    assert wheel_distribution(Path("torch-2.5.1+cpu-1-cp311-cp311-linux_x86_64.whl")) == "torch"
    assert match_wheels(DEFAULT_PACKAGES, [ort]) == {"onnxruntime-training": [ort]}
    with pytest.raises(ValueError):
        wheel_distribution(Path("numpy.tar.gz"))
    assert main(["fleet", "provision", str(tmp_path / "fleet.yaml"), "--wheel", str(tmp_path / "nope.whl")]) == 2


def test_onnxruntime_counts_as_importable_on_a_device_without_torch(tmp_path: Path) -> None:
    # A device whose Python cannot import torch: a shadowing package that fails like a missing one.
    shadow = tmp_path / "shadow" / "torch"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ModuleNotFoundError(\"No module named 'torch'\")\n")
    wrapper = tmp_path / "python-without-torch"
    wrapper.write_text(f"#!/bin/sh\nPYTHONPATH={shadow.parent} exec {PY} \"$@\"\n")
    wrapper.chmod(0o755)
    device = Device("notorch", "local", workdir=str(tmp_path / "device"), python=str(wrapper))
    report = check_device(LocalTransport(), device)
    assert not report.packages["torch"].importable
    assert report.packages["onnxruntime-training"].importable, report.packages["onnxruntime-training"].error
    assert report.packages["onnxruntime"].importable, report.packages["onnxruntime"].error
    assert report.can_run("ort") and report.can_run("onnx") and not report.can_run("torch")
