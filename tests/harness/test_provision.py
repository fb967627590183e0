"""Provisioning on real transports: reporting backends and why not, installing from given wheels or an index."""

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
from devices.group import FleetResult
from devices.local import LocalTransport
from fleetbench.cli import main
from harness.backends import BackendChoice, why_not
from harness.phone_runtime import runner_start
from harness.provision import (
    DEFAULT_PACKAGES,
    CannotProvision,
    Package,
    check_device,
    fleet_backends,
    match_wheels,
    provision,
    provision_device,
    train_step_check,
    wheel_distribution,
)
from harness.provision_cli import format_table
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


def test_the_provision_check_trains_one_step_on_every_backend_it_reports(tmp_path: Path) -> None:
    device = Device("loc", "local", workdir=str(tmp_path / "device"), python=PY)
    report = provision_device(LocalTransport(), device, train_step=True, say=lambda line: None)
    assert report.stepped == ("ort", "onnx", "torch") and report.step_failures == {}
    runs = list((tmp_path / "device" / "sets").iterdir())
    assert sorted(p.name.endswith("+torch") for p in runs) == [False, True]  # the set, and its torch twin
    table = format_table(FleetResult({"loc": report}), [device])
    assert "loc: the runner trained one step of fjord-cnn at width 0.25, batch 2, on ort, onnx, torch" in table


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
    # The runner's own start (the one every mode takes) imports what was provisioned.
    start = runner_start(target.transport, target.device, say=lambda line: None)
    env_run = target.transport.run([*start.argv, "-c", "import fbfake_mod; print(fbfake_mod.__version__)"], timeout=30)
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
    assert "FAILED: unreachable" in table and "nopython | -       | missing | python" in table
    assert "nopython: no Python on the device (the device's python cannot run): no backend can run" in table


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
    wrapper.write_text(f"#!/bin/sh\nPYTHONPATH=${{PYTHONPATH:+$PYTHONPATH:}}{shadow.parent} exec {PY} \"$@\"\n")
    wrapper.chmod(0o755)
    device = Device("notorch", "local", workdir=str(tmp_path / "device"), python=str(wrapper))
    report = check_device(LocalTransport(), device)
    assert not report.packages["torch"].importable
    assert report.packages["onnxruntime-training"].importable, report.packages["onnxruntime-training"].error
    assert report.packages["onnxruntime"].importable, report.packages["onnxruntime"].error
    assert report.can_run("ort") and report.can_run("onnx") and not report.can_run("torch")


def python_without(tmp_path: Path, *modules: str) -> str:
    """A wrapper of this Python on which ``modules`` fail to import as missing ones do; pip sees no config."""
    shadow = tmp_path / "shadow"
    for module in modules:
        (shadow / module).mkdir(parents=True)
        (shadow / module / "__init__.py").write_text(f"raise ModuleNotFoundError(\"No module named '{module}'\")\n")
    wrapper = tmp_path / "python-without"
    wrapper.write_text(
        "#!/bin/sh\n"
        f"PYTHONPATH=${{PYTHONPATH:+$PYTHONPATH:}}{shadow} PIP_CONFIG_FILE=/dev/null "
        f"exec env -u PIP_FIND_LINKS -u PIP_EXTRA_INDEX_URL {PY} \"$@\"\n"
    )
    wrapper.chmod(0o755)
    return str(wrapper)


def simple_index(directory: Path, *wheels: Path) -> str:
    """A PEP 503 index on disk serving ``wheels``; return its ``file://`` URL."""
    for wheel in wheels:
        project = directory / wheel_distribution(wheel)
        project.mkdir(parents=True, exist_ok=True)
        (project / wheel.name).write_bytes(wheel.read_bytes())
        (project / "index.html").write_text(f'<html><body><a href="{wheel.name}">{wheel.name}</a></body></html>\n')
    return directory.as_uri() + "/"


def test_install_takes_onnxruntime_from_the_index_and_the_device_can_then_run_onnx(tmp_path: Path) -> None:
    # A stand-in onnxruntime wheel (pure Python) on a local index: the route is the same as from PyPI.
    wheel = make_wheel(tmp_path, dist="onnxruntime", module="onnxruntime", version="1.19.2")
    index = simple_index(tmp_path / "index", wheel)
    device = Device("bare", "local", workdir=str(tmp_path / "device"), python=python_without(tmp_path, "onnxruntime"))
    packages = DEFAULT_PACKAGES[:3]
    before = provision_device(LocalTransport(), device, (), packages)
    assert not before.can_run("onnx") and before.installed == ()
    assert "onnxruntime is not installed" in (why_not(before, "onnx") or "") or before.packages["onnxruntime"].present

    after = provision_device(LocalTransport(), device, (), packages, install=True, index_url=index, via="device")
    assert (after.installed, after.install_error) == (("onnxruntime",), None)
    assert after.packages["onnxruntime"].version == "1.19.2" and after.can_run("onnx")
    assert not after.can_run("ort")  # a plain build has no training API
    site = tmp_path / "device" / "site"
    assert (site / "onnxruntime" / "__init__.py").is_file() and not (site / "numpy").exists()  # numpy was there

    again = provision_device(LocalTransport(), device, (), packages, install=True, index_url=index, via="device")
    assert again.installed == () and again.can_run("onnx")  # nothing left to install
    # the stand-in imports, but the runner cannot train with it: "can run" is a training step
    stepped = train_step_check(LocalTransport(), device, again, cache=tmp_path / "check-sets")
    assert not stepped.can_run("onnx") and stepped.stepped == ()
    assert (why_not(stepped, "onnx") or "").startswith("one training step of the check set failed: ")


def test_install_reports_pips_last_line_when_the_index_has_nothing(tmp_path: Path) -> None:
    device = Device("bare", "local", workdir=str(tmp_path / "device"), python=python_without(tmp_path, "onnxruntime"))
    empty = (tmp_path / "empty").as_uri() + "/"
    (tmp_path / "empty").mkdir()
    report = provision_device(
        LocalTransport(), device, (), DEFAULT_PACKAGES[:3], install=True, index_url=empty, via="device"
    )
    assert report.installed == () and not report.can_run("onnx")
    assert report.install_error is not None and "onnxruntime" in report.install_error


def test_a_device_without_onnxruntime_falls_back_to_torch_and_one_without_python_is_skipped(tmp_path: Path) -> None:
    devices = [
        Device("full", "local", workdir=str(tmp_path / "full"), python=PY),
        Device("torchonly", "local", workdir=str(tmp_path / "t"), python=python_without(tmp_path, "onnxruntime")),
        Device("nopython", "local", workdir=str(tmp_path / "n"), python="/nonexistent/python3"),
    ]
    choices = {c.device: c for c in fleet_backends(devices)}
    assert choices["full"] == BackendChoice("full", "ort", "best available")
    assert choices["torchonly"].backend == "torch"
    assert choices["torchonly"].reason == (
        "best available (ort: onnxruntime-training is installed but does not import: ModuleNotFoundError: "
        "No module named 'onnxruntime'; onnx: onnxruntime is installed but does not import: "
        "ModuleNotFoundError: No module named 'onnxruntime')"
    )
    assert choices["nopython"].backend is None and "no Python on the device" in choices["nopython"].reason
    assert [c.backend for c in fleet_backends(devices, "onnx")] == ["onnx"] * 3  # an override asks nothing


def python_with(tmp_path: Path, name: str, sitecustomize: str) -> str:
    """A wrapper of this Python that runs ``sitecustomize`` first (a stand-in for another interpreter)."""
    custom = tmp_path / f"custom-{name}"
    custom.mkdir()
    (custom / "sitecustomize.py").write_text(sitecustomize)
    wrapper = tmp_path / f"python-{name}"
    wrapper.write_text(f"#!/bin/sh\nPYTHONPATH=${{PYTHONPATH:+$PYTHONPATH:}}{custom} exec {PY} \"$@\"\n")
    wrapper.chmod(0o755)
    return str(wrapper)


def test_bad_devices_get_one_line_each_and_the_others_are_provisioned(tmp_path: Path) -> None:
    wheel = make_wheel(tmp_path)
    (tmp_path / "a-file").write_text("not a directory\n")
    old = python_with(tmp_path, "old", "import platform\nplatform.python_version = lambda: '3.7.3'\n")
    devices = [
        Device("good", "local", workdir=str(tmp_path / "good"), python=PY),
        Device("old", "local", workdir=str(tmp_path / "old"), python=old),
        Device("readonly", "local", workdir=str(tmp_path / "a-file" / "work"), python=PY),
    ]
    result = provision(devices, [wheel], (NUMPY, FAKE), say=lambda line: None)
    assert list(result.successes) == ["good"] and result.successes["good"].installed == ("fbfake",)
    assert result.failures["old"].kind == "cannot provision"
    assert result.failures["old"].message == (
        f"old: Python 3.7.3 at {old} is older than the runner supports (3.8 or newer); set `python:` in the fleet "
        "file to a newer interpreter on the device"
    )
    readonly = result.failures["readonly"].message
    assert readonly.startswith(f"readonly: cannot write {tmp_path}/a-file/work/site (NotADirectoryError: ")
    assert readonly.endswith("set `workdir:` in the fleet file to a directory the device's user can write")
    table = format_table(result, devices, (NUMPY, FAKE))
    assert "FAILED: cannot provision" in table and "old: cannot provision: old: Python 3.7.3 at " in table


def test_a_wheel_for_another_platform_is_refused_before_anything_is_pushed(tmp_path: Path) -> None:
    arm = tmp_path / "fb_fake-0.1-cp311-cp311-manylinux_2_17_aarch64.whl"
    arm.write_bytes(make_wheel(tmp_path).read_bytes())
    device = Device("x86", "local", workdir=str(tmp_path / "device"), python=PY)
    result = provision([device], [arm], (NUMPY, FAKE), say=lambda line: None)
    message = result.failures["x86"].message
    assert message.startswith(f"x86: --wheel {arm.name} is built for cp311 on manylinux_2_17_aarch64, the device has "
                              f"Python {sys.version_info.major}.{sys.version_info.minor} on {platform.machine()}")
    assert message.endswith("give a wheel built for the device") and "\n" not in message
    assert not (tmp_path / "device" / "wheels").exists()  # nothing was pushed


def test_a_device_without_pip_unpacks_given_wheels_and_cannot_use_its_own_index(tmp_path: Path) -> None:
    nopip = python_with(tmp_path, "nopip", "import sys\nsys.modules['pip'] = None\n")
    device = Device("nopip", "local", workdir=str(tmp_path / "device"), python=nopip)
    before = check_device(LocalTransport(), device, (NUMPY, FAKE))
    assert not before.pip and before.packages["fbfake"].importable is False
    after = provision_device(LocalTransport(), device, [make_wheel(tmp_path)], (NUMPY, FAKE), say=lambda line: None)
    assert (after.installed, after.install_error) == (("fbfake",), None)
    site = tmp_path / "device" / "site"
    assert (site / "fbfake_mod" / "__init__.py").is_file() and (site / "fb_fake-0.1.dist-info" / "METADATA").is_file()
    assert after.packages["fbfake"].version == "0.1"  # its metadata is found, as pip's would be
    bare = Device("bare", "local", workdir=str(tmp_path / "bare"),
                  python=python_with(tmp_path, "bare", "import sys\nsys.modules['pip'] = None\n"
                                     "sys.modules['onnxruntime'] = None\n"))
    with pytest.raises(CannotProvision) as caught:
        provision_device(LocalTransport(), bare, (), DEFAULT_PACKAGES[:3], install=True, via="device")
    assert str(caught.value) == (f"bare: {bare.python} has no pip, so it cannot install from an index; "
                                 "provision with --via host (the host fetches the wheels)")
