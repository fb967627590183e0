"""Provisioning: which backends each device can run and why not, and installing the missing ones.

``fleetbench fleet provision FILE [--install] [--index-url URL] [--wheel W ...]`` asks every
device (concurrently, one dead device never stops the others) for its machine
(``platform.machine()``), Python version and, per package, whether it is *present*
(installed metadata or a findable module) and *importable* (the import succeeds), with its
version. The packages are numpy, onnxruntime (any build: ``import onnxruntime``),
onnxruntime-training (``onnxruntime.training``, imported as the runner imports it, without
PyTorch) and torch. Which backend they allow, why a backend is not usable ("onnxruntime-training
1.19.2 has no wheel for aarch64") and which one a device uses are decided in
`harness.backends`; `fleet_backends` asks a fleet and chooses.

Where installed packages go
---------------------------
Provisioned packages live in ``<workdir>/site`` -- never in the device's own site-packages.
Every Python fleetbench starts on a device goes through `harness.phone_runtime.runner_start`
(`devices.site.python_argv`: ``<workdir>/site`` first on ``PYTHONPATH``), and so does the
check here: what it reports importable is what ``profile`` and ``fl run`` import.

Installing (``--install``): wheels fetched on the host
------------------------------------------------------
By default the host fetches the wheels the device needs for its Python and platform
(`harness.wheels`: numpy, and onnxruntime-training where that build has a wheel, else
the plain onnxruntime), from its wheel cache first and the package index second, pushes
them through the deployment cache and unpacks them into the site with the device's own
Python (a wheel is a zip archive of importable files: the device needs neither internet
nor pip). ``--via device`` keeps the older route for devices with internet: the
device's own pip fetches from the index (``--index-url``).

What stops a device (one line naming it and what to do; the other devices go on):
a Python older than the runner supports (`MIN_PYTHON`), a workdir it cannot write, no
wheel for its platform (`harness.wheels.NoWheel`), ``--via device`` without pip, and a
``--wheel`` built for another platform or Python.

Installing from the user's wheels (``--wheel``)
-----------------------------------------------
The host downloads nothing and neither does the device. A wheel is matched to a missing
package by the distribution name in its file name (``onnxruntime_training-1.19.2-...whl``
is ``onnxruntime-training``; names are compared PEP 503-normalised), and among a
package's wheels the first whose tags the device takes (`harness.wheels.wheel_fits`) is
pushed through the deployment cache (`harness.deploy`, ``<workdir>/wheels/<digest>/``)
and unpacked into the site (`install_wheels`).

Installing from the package index with the device's pip (``--install --via device``)
------------------------------------------------------------------------------------
What the ``onnx`` backend needs, numpy and the plain ``onnxruntime``, is installed by the
device's own pip from the package index (``--index-url`` names another one, e.g. a mirror
or a local ``file://`` index), as binary wheels only, after any ``--wheel`` and only for
what is still missing (`INDEX_REQUIREMENTS`). onnxruntime is installed only when no
onnxruntime imports at all (a working training build imports as ``onnxruntime`` too): a
plain build in ``<workdir>/site`` would shadow a working training build in the device's
site-packages and take ``ort`` away. The requirement is
``onnxruntime>=1.19``, not a pin: 1.19.2 is the last release with Python 3.8 wheels and
Python 3.13 devices (Raspberry Pi OS trixie) need a newer one; the runner's ``onnx``
backend trains the same parameters as ``ort`` on releases across that range.

Both routes install with ``--no-deps``: onnxruntime imports and runs with numpy alone, and
pulling its declared dependencies would put a second numpy into ``<workdir>/site`` in front
of the device's own (which its torch was built against). The report after installing tells
whether the imports now work.
"""

from __future__ import annotations

import dataclasses
import hashlib
import inspect
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from devices.cache import fleetbench_cache
from devices.connect import connect
from devices.errors import TransportError
from devices.fleet import Device, Fleet
from devices.group import FleetResult, run_on_fleet
from devices.site import python_argv, site_path
from devices.transport import RunResult, Transport
from harness.backends import BACKEND_PACKAGES, BackendChoice, PackageStatus, ProvisionReport, choose_backend, why_not
from harness.contract import RunnerStart
from harness.deploy import deploy_files, sha256_file
from harness.phone_runtime import RuntimeReport, device_runtime, runner_start
from harness.runner.runtimes import (
    import_onnxruntime,
    import_ort_training,
    import_runtime_module,
    ortmodule_check_skipped,
    torch_blocked,
)
from harness.wheels import Target, fetch_wheels, normalize, wanted_requirements, wheel_distribution, wheel_fits

#: Seconds for the package check (importing torch on a slow board takes a while).
CHECK_TIMEOUT_S = 180.0
#: Seconds for installing on a device (unpacking wheels, or ``pip install`` with ``--via device``).
INSTALL_TIMEOUT_S = 900.0
#: The oldest Python the runner runs on (`harness.runner`'s docstring).
MIN_PYTHON = (3, 8)


class CannotProvision(TransportError):
    """A device cannot be provisioned as asked; the message names it and what to do."""

    kind = "cannot provision"


@dataclass(frozen=True)
class Package:
    """A Python package a backend needs.

    Attributes
    ----------
    name : str
        Column name in reports (``numpy``, ``onnxruntime``, ``torch``).
    module : str
        Module whose import proves it works (``onnxruntime.training``).
    dist : str
        Distribution name, matched against wheel file names (``onnxruntime-training``).
    """

    name: str
    module: str
    dist: str


#: Packages checked by default, in report order.
DEFAULT_PACKAGES = (
    Package("numpy", "numpy", "numpy"),
    Package("onnxruntime", "onnxruntime", "onnxruntime"),
    Package("onnxruntime-training", "onnxruntime.training", "onnxruntime-training"),
    Package("torch", "torch", "torch"),
)
#: Backend to the package names it needs (`harness.backends.BACKEND_PACKAGES`).
BACKENDS = BACKEND_PACKAGES

#: Package name -> the requirement ``--install`` gives the device's pip (see the module docstring).
INDEX_REQUIREMENTS: dict[str, str] = {"numpy": "numpy", "onnxruntime": "onnxruntime>=1.19"}


_CHECK_TEMPLATE = r"""
from __future__ import annotations
import contextlib, importlib, importlib.util, json, os, platform, sys
A = json.loads(sys.argv[1])
site = os.path.expanduser(A["site"])
sys.path.insert(0, site)
try:
    import importlib.metadata as md
except ImportError:
    md = None
libc, libc_version = platform.libc_ver()
out = {"python": platform.python_version(), "machine": platform.machine(), "site": site, "packages": {},
       "glibc": libc_version if libc == "glibc" and libc_version else None,
       "pip": importlib.util.find_spec("pip") is not None, "unwritable": None}
import types
try:
    os.makedirs(site, exist_ok=True)
    probe = os.path.join(site, ".fleetbench-write-check")
    with open(probe, "w") as f:
        f.write("ok")
    os.remove(probe)
except OSError as e:
    out["unwritable"] = (type(e).__name__ + ": " + str(e)).splitlines()[0][:300]


def import_failure(name, exc):
    return exc


def _findable(module):
    top, _, rest = module.partition(".")
    spec = importlib.util.find_spec(top)
    if spec is None or not rest:
        return spec is not None
    for base in spec.submodule_search_locations or ():
        path = os.path.join(base, *rest.split("."))
        if os.path.isdir(path) or os.path.isfile(path + ".py"):
            return True
    return False


#ORT_IMPORT#
for name, module, dist in A["packages"]:
    r = {"present": False, "importable": False, "version": None, "error": None}
    try:
        r["version"] = md.version(dist)
        r["present"] = True
    except Exception:
        pass
    try:
        r["present"] = r["present"] or _findable(module)
    except Exception:
        pass
    try:
        if module == "onnxruntime.training":
            import_ort_training()
        elif module == "onnxruntime":
            import_onnxruntime()
        else:
            importlib.import_module(module)
        r["importable"] = True
        r["version"] = r["version"] or getattr(sys.modules[module.split(".")[0]], "__version__", None)
    except BaseException as e:
        r["error"] = (type(e).__name__ + ": " + str(e)).splitlines()[0][:300]
    out["packages"][name] = r
print(json.dumps(out))
"""


#: The device-side check. ``onnxruntime`` and ``onnxruntime.training`` are imported the
#: runner's way (`harness.runner.runtimes.import_onnxruntime` / `import_ort_training`, PyTorch
#: blocked), so a device without PyTorch is not reported as missing them.
_CHECK = _CHECK_TEMPLATE.replace(
    "#ORT_IMPORT#",
    "".join(
        inspect.getsource(f)
        for f in (torch_blocked, ortmodule_check_skipped, import_runtime_module, import_onnxruntime,
                  import_ort_training)
    ),
)


def check_device(transport: Transport, device: Device,
                 packages: Sequence[Package] = DEFAULT_PACKAGES, start: RunnerStart | None = None) -> ProvisionReport:
    """Ask one device which packages are present and importable.

    Parameters
    ----------
    transport : Transport
    device : Device
        Supplies ``python`` and ``workdir``.
    packages : sequence of Package
    start : RunnerStart, optional
        How the runner starts (`harness.phone_runtime.runner_start`); default the device's
        own Python with its provisioned site (`devices.site.python_argv`).

    Returns
    -------
    ProvisionReport
        ``python`` is None (and nothing importable) when ``device.python`` cannot run.

    Raises
    ------
    TransportError
        The device could not be reached or answered nonsense.
    """
    args = {"site": site_path(device.workdir), "packages": [[p.name, p.module, p.dist] for p in packages]}
    try:
        python = list(start.argv) if start is not None else python_argv(device.python, device.workdir)
        result = transport.run([*python, "-c", _CHECK, json.dumps(args)], timeout=CHECK_TIMEOUT_S)
    except TransportError as exc:
        if type(exc) is not TransportError:  # only "cannot start the program" means no Python
            raise
        result = RunResult(127, "", str(exc), 0.0)
    if result.rc in (126, 127):
        absent = {p.name: PackageStatus(False, False, None, f"{device.python} cannot run") for p in packages}
        return ProvisionReport(None, absent, site_path(device.workdir))
    return _parse_report(result, device)


def _parse_report(result: RunResult, device: Device) -> ProvisionReport:
    try:
        data = json.loads(result.stdout.strip().splitlines()[-1])
        packages = {name: PackageStatus(**entry) for name, entry in data["packages"].items()}
    except (ValueError, IndexError, KeyError, TypeError):
        tail = (result.stderr.strip() or result.stdout.strip()).splitlines()
        raise TransportError(f"{device.name}: package check failed (exit {result.rc}): "
                             f"{tail[-1] if tail else 'no output'}") from None
    # Only a leading ``~`` takes the device's word (see harness.deploy on the emulated phone).
    site = data["site"] if device.workdir.startswith("~") else site_path(device.workdir)
    machine = data.get("machine")
    return ProvisionReport(str(data["python"]), packages, site, machine=str(machine) if machine else None,
                           glibc=data.get("glibc"), pip=bool(data.get("pip")), unwritable=data.get("unwritable"))


def match_wheels(missing: Sequence[Package], wheels: Sequence[Path]) -> dict[str, list[Path]]:
    """Return, per missing package name, the given wheels of its distribution.

    Parameters
    ----------
    missing : sequence of Package
    wheels : sequence of pathlib.Path

    Returns
    -------
    dict of str to list of pathlib.Path
        Only packages with at least one wheel appear.
    """
    by_dist: dict[str, list[Path]] = {}
    for wheel in wheels:
        by_dist.setdefault(wheel_distribution(wheel), []).append(Path(wheel))
    return {p.name: by_dist[normalize(p.dist)] for p in missing if normalize(p.dist) in by_dist}


#: Unpacks wheels into the site with the device's own Python (no pip): ``site wheel...``.
#: What an earlier version of the same distribution left there (its top-level entries and
#: its ``.dist-info``) is removed first; a wheel's ``<name>.data/purelib`` and ``platlib``
#: trees belong in the site root too.
_UNPACK = r"""
import os, shutil, sys, zipfile
site = os.path.expanduser(sys.argv[1])
os.makedirs(site, exist_ok=True)
for wheel in sys.argv[2:]:
    dist = os.path.basename(wheel).split("-")[0].lower()
    with zipfile.ZipFile(wheel) as archive:
        tops = {name.split("/")[0] for name in archive.namelist()}
        old = [e for e in os.listdir(site) if e.lower().startswith(dist + "-") and e.endswith(".dist-info")]
        for entry in tops | set(old):
            path = os.path.join(site, entry)
            if os.path.isdir(path):
                shutil.rmtree(path)
            elif os.path.exists(path):
                os.remove(path)
        archive.extractall(site)
for entry in os.listdir(site):
    if entry.endswith(".data"):
        for scheme in ("purelib", "platlib"):
            tree = os.path.join(site, entry, scheme)
            if os.path.isdir(tree):
                for name in os.listdir(tree):
                    shutil.move(os.path.join(tree, name), os.path.join(site, name))
        shutil.rmtree(os.path.join(site, entry))
print("unpacked")
"""


def install_wheels(transport: Transport, device: Device, report: ProvisionReport, wheels: Sequence[Path]) -> str | None:
    """Push wheels through the deployment cache and unpack them into the site with the device's Python.

    A wheel is a zip archive of importable files, so the device needs no pip: its own
    Python unpacks them (what an older version of the same distribution left in the site
    goes first). The wheels were checked against the device's Python and platform on the
    host (`harness.wheels.wheel_fits`).

    Parameters
    ----------
    transport : Transport
    device : Device
    report : ProvisionReport
        The device's state before installing (its ``site`` is the target).
    wheels : sequence of pathlib.Path
        One wheel per distribution to install.

    Returns
    -------
    str or None
        The unpacking's last line when it failed, else None.
    """
    digest = sha256_file_list(wheels)
    deployed = deploy_files(transport, device, wheels, device.python, into=f"wheels/{digest}")
    remote = [deployed.remote_paths[Path(w).name] for w in wheels]
    result = transport.run([device.python, "-c", _UNPACK, report.site, *remote], timeout=INSTALL_TIMEOUT_S)
    return None if "unpacked" in result.stdout else _last_line(result)


def _last_line(result: RunResult) -> str:
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    lines = lines or [line for line in result.stdout.splitlines() if line.strip()]
    return lines[-1].strip() if lines else f"exit status {result.rc}"


def install_from_index(transport: Transport, device: Device, report: ProvisionReport,
                       packages: Sequence[Package], index_url: str | None = None) -> str | None:
    """Install missing packages with the device's pip from a package index (binary wheels only).

    Parameters
    ----------
    transport : Transport
    device : Device
    report : ProvisionReport
        The device's state before installing (its ``site`` is the pip ``--target``).
    packages : sequence of Package
        The missing packages; each is asked for by its `INDEX_REQUIREMENTS` entry, else
        by its distribution name.
    index_url : str, optional
        Passed as ``--index-url`` (default: the device pip's own configuration).

    Returns
    -------
    str or None
        pip's last line when it failed, else None.
    """
    options = ["--only-binary=:all:"] + (["--index-url", index_url] if index_url else [])
    return _pip_install(transport, device, report, options,
                        [INDEX_REQUIREMENTS.get(p.name, p.dist) for p in packages])


def _pip_install(transport: Transport, device: Device, report: ProvisionReport,
                 options: Sequence[str], requirements: Sequence[str]) -> str | None:
    argv = [device.python, "-m", "pip", "install", "--no-deps", "--upgrade", "--disable-pip-version-check",
            "--no-warn-script-location", "--no-compile", "--target", report.site, *options, *requirements]
    result = transport.run(argv, timeout=INSTALL_TIMEOUT_S)
    # pip says why on stderr; stdout only carries progress ("Looking in indexes: ...").
    return None if result.ok else _last_line(result)


def sha256_file_list(files: Sequence[Path]) -> str:
    """Return a short digest naming a set of files by content (order-independent).

    Parameters
    ----------
    files : sequence of pathlib.Path

    Returns
    -------
    str
        16 hex digits.
    """
    joined = "\n".join(sorted(f"{sha256_file(Path(f))} {Path(f).name}" for f in files))
    return hashlib.sha256(joined.encode()).hexdigest()[:16]


def index_candidates(report: ProvisionReport, packages: Sequence[Package]) -> list[Package]:
    """Return the packages ``--install`` takes from the index for a device (pure).

    Parameters
    ----------
    report : ProvisionReport
        The device's state (after any wheels).
    packages : sequence of Package
        The checked packages.

    Returns
    -------
    list of Package
        Those in `INDEX_REQUIREMENTS` that are not importable. An importable training
        build makes ``onnxruntime`` importable too, so a plain build never shadows a
        working training build (see the module docstring).
    """
    return [p for p in packages if p.name in INDEX_REQUIREMENTS and p.name in report.packages
            and not report.packages[p.name].importable]


def provision_device(transport: Transport, device: Device, wheels: Sequence[Path] = (),
                     packages: Sequence[Package] = DEFAULT_PACKAGES, *, install: bool = False,
                     index_url: str | None = None, via: str = "host", verify_runtime: bool = True,
                     train_step: bool = False, say: Callable[[str], None] = print) -> ProvisionReport:
    """Choose the device's runtime, then report its packages, installing missing ones from ``wheels``, then ``via``.

    The runtime comes first (`harness.phone_runtime.device_runtime`): a phone without
    Python gets its runtime bundle pushed, and the packages are checked with the bundle's
    Python. Nothing is installed into a bundle (it brings numpy and onnxruntime). Every
    check runs the device's Python exactly as the runner starts.

    Parameters
    ----------
    transport : Transport
    device : Device
    wheels : sequence of pathlib.Path
        Wheel files the user named; only those of missing packages are pushed.
    packages : sequence of Package
    install : bool
        Also install what the device's best backend still misses (`via`).
    index_url : str, optional
        The package index ``install`` fetches from (default: the fetching pip's configuration).
    via : {"host", "device"}
        ``host``: the host fetches wheels for the device (`harness.wheels`) and pushes
        them; ``device``: the device's own pip fetches from the index.
    verify_runtime : bool
        Hash a phone's unpacked runtime bundle against its file list (`provision_phone`).
    train_step : bool
        Then run one training step of the check set on every backend whose imports work
        (`train_step_check`): "can run" means the runner, started as ``profile`` and
        ``fl run`` start it, trained.
    say : callable
        Receives progress lines (a bundle built on the host, wheels fetched).

    Returns
    -------
    ProvisionReport
        The state after installing, with ``installed``, ``install_error``, ``fetched`` and ``runtime``.

    Raises
    ------
    CannotProvision
        The device's Python is older than `MIN_PYTHON`, its workdir cannot be written,
        ``via="device"`` without pip, or a given wheel was built for another platform.
    harness.wheels.NoWheel
        No wheel exists for the device's platform and Python.
    TransportError
        The device failed (a phone: also `devices.errors.OutOfSpace`, unsupported ABI).
    """
    runtime = device_runtime(transport, device, verify=verify_runtime, say=say)
    before = dataclasses.replace(check_device(transport, device, packages, runtime.start), runtime=runtime)
    if before.python is None or runtime.start.runtime == "bundle":
        return train_step_check(transport, device, before) if train_step and before.python else before
    version = tuple(int(part) for part in before.python.split(".")[:2])
    if version < MIN_PYTHON:
        raise CannotProvision(f"{device.name}: Python {before.python} at {device.python} is older than the runner "
                              f"supports ({'.'.join(map(str, MIN_PYTHON))} or newer); set `python:` in the fleet "
                              f"file to a newer interpreter on the device")
    missing = [p for p in packages if not before.packages[p.name].importable]
    matched = match_wheels(missing, wheels)
    target = Target(before.python, before.machine or "unknown", before.glibc)
    wanted = wanted_requirements(target, _importable(before)) if install and via == "host" else []
    needs_device_index = install and via == "device" and bool(index_candidates(before, packages))
    if not (matched or wanted or needs_device_index):
        return train_step_check(transport, device, before) if train_step else before
    if before.unwritable:
        raise CannotProvision(f"{device.name}: cannot write {before.site} ({before.unwritable}); set `workdir:` in "
                              f"the fleet file to a directory the device's user can write")
    for name, given in list(matched.items()):
        fitting = [w for w in given if wheel_fits(w, target) is None]
        if not fitting:
            raise CannotProvision(f"{device.name}: --wheel {wheel_fits(given[0], target)}; give a wheel built for "
                                  f"the device")
        matched[name] = fitting[:1]
    state, errors, fetched = before, list[str](), list[str]()
    if matched:
        error = install_wheels(transport, device, state, [w for given in matched.values() for w in given])
        errors += [error] if error else []
        state = _recheck(transport, device, packages, runtime)
        wanted = wanted_requirements(target, _importable(state)) if wanted else []
    if wanted:
        host_wheels = fetch_wheels(device.name, target, wanted, index_url=index_url, say=fetched.append)
        error = install_wheels(transport, device, state, host_wheels)
        errors += [error] if error else []
        state = _recheck(transport, device, packages, runtime)
    if needs_device_index:
        if not state.pip:
            raise CannotProvision(f"{device.name}: {device.python} has no pip, so it cannot install from an index; "
                                  f"provision with --via host (the host fetches the wheels)")
        from_index = index_candidates(state, packages)
        error = install_from_index(transport, device, state, from_index, index_url) if from_index else None
        errors += [error] if error else []
        state = _recheck(transport, device, packages, runtime)
    installed = tuple(p.name for p in packages
                      if not before.packages[p.name].importable and state.packages[p.name].importable)
    state = dataclasses.replace(state, installed=installed, install_error="; ".join(errors) or None,
                                fetched=tuple(fetched))
    return train_step_check(transport, device, state) if train_step else state


#: The check set (`check_set`): the smallest zoo model at its narrowest width, batch 2, SGD.
CHECK_SET = ("fjord-cnn", 0.25, 2, "sgd")
#: Environment variable naming the directory the check's set is exported into (`devices.cache`).
CHECK_SETS_ENV = "FLEETBENCH_CHECK_SETS_DIR"


def check_set_cache() -> Path:
    """Return the directory the check set is exported into (`devices.cache`: ``check-sets``)."""
    return fleetbench_cache(CHECK_SETS_ENV, "check-sets")


def check_set(cache: Path | None = None, torch: bool = False) -> Path:
    """Export (or find in the cache) the tiny artifact set `train_step_check` trains one step of.

    Parameters
    ----------
    cache : pathlib.Path, optional
        The artifact cache (default `check_set_cache`).
    torch : bool
        Also write its TorchScript twin (``model.pt``) for the ``torch`` backend.

    Returns
    -------
    pathlib.Path
        The set's directory.
    """
    from exporters.artifacts import export_artifacts
    from exporters.zoo import get_model

    name, width, batch, optimizer = CHECK_SET
    model = get_model(name)
    out = cache or check_set_cache()
    directory = export_artifacts(model, model.arch(width), batch=batch, optimizer=optimizer, out_dir=out).directory
    if torch and not (directory / "model.pt").exists():
        from exporters.torchscript import export_torchscript

        export_torchscript(model, model.arch(width), directory)
    return directory


def train_step_check(transport: Transport, device: Device, report: ProvisionReport,
                     cache: Path | None = None) -> ProvisionReport:
    """Run one training step of the check set on every backend whose imports work, as the runner runs a cell.

    The runner and the set are deployed as a campaign deploys them and started through
    the report's runtime (`harness.phone_runtime.runner_start`'s choice): ``runner.pyz
    bench`` with one warm-up and one timed step on one thread.

    Parameters
    ----------
    transport : Transport
    device : Device
    report : ProvisionReport
        The device's state; its runtime says how the runner starts.
    cache : pathlib.Path, optional
        Where the check set is exported (`check_set`).

    Returns
    -------
    ProvisionReport
        ``report`` with ``stepped`` (backends that trained) and ``step_failures``.
    """
    from harness import contract, runner_archive
    from harness.deploy import deploy_runner, deploy_set_for

    backends = [b for b in BACKENDS if why_not(report, b) is None]
    if not backends:
        return report
    start = report.start or runner_start(transport, device, provision=False, say=lambda line: None)
    set_dir = check_set(cache, torch="torch" in backends)
    runner = str(deploy_runner(transport, device, runner_archive.archive_path()))
    failures: dict[str, str] = {}
    for backend in backends:
        remote = deploy_set_for(transport, device, set_dir, backend).remote_dir
        argv = contract.bench_argv(start, runner, remote, backend=backend, warmup=1, steps=1, threads=1,
                                   precision=0.0, matmul_seconds=0.0)
        result = transport.run(argv, timeout=CHECK_TIMEOUT_S)
        output = contract.parse_output(result.rc, result.stdout, result.stderr)
        if not output.ok:
            failures[backend] = f"{output.status}: {output.message}"
    stepped = tuple(b for b in backends if b not in failures)
    return dataclasses.replace(report, stepped=stepped, step_failures=failures)


def _importable(report: ProvisionReport) -> Callable[[str], bool]:
    return lambda name: name in report.packages and report.packages[name].importable


def _recheck(transport: Transport, device: Device, packages: Sequence[Package],
             runtime: RuntimeReport) -> ProvisionReport:
    return dataclasses.replace(check_device(transport, device, packages, runtime.start), runtime=runtime)


def provision(fleet: Fleet | Sequence[Device], wheels: Sequence[Path] = (),
              packages: Sequence[Package] = DEFAULT_PACKAGES,
              opener: Callable[[Device], Transport] = connect, *, install: bool = False,
              index_url: str | None = None, via: str = "host", verify_runtime: bool = True,
              train_step: bool = False, say: Callable[[str], None] = print) -> FleetResult[ProvisionReport]:
    """Provision every device of a fleet concurrently.

    Parameters
    ----------
    fleet : Fleet or sequence of Device
    wheels : sequence of pathlib.Path
        Wheel files to install missing packages from (nothing is downloaded).
    packages : sequence of Package
        Packages to check (default: `DEFAULT_PACKAGES`).
    opener : callable
        Device to an open transport (default `devices.connect.connect`).
    install : bool
        Install missing numpy / onnxruntime from the package index (`provision_device`).
    index_url : str, optional
        The index for ``install``.
    via : {"host", "device"}
        Who fetches what ``install`` installs (`provision_device`).
    verify_runtime, train_step, say
        As for `provision_device`.

    Returns
    -------
    FleetResult of ProvisionReport
        Devices that answered, and devices that failed with the failure's kind
        (``unreachable``, ``timeout``, a phone's ``out of space`` or ``unsupported ABI``, ...).
    """
    devices = fleet.devices if isinstance(fleet, Fleet) else tuple(fleet)
    for wheel in wheels:
        wheel_distribution(wheel)  # a bad name fails before any device is touched

    def action(device: Device) -> ProvisionReport:
        transport = opener(device)
        try:
            return provision_device(transport, device, wheels, packages, install=install, index_url=index_url, via=via,
                                    verify_runtime=verify_runtime, train_step=train_step, say=say)
        finally:
            transport.close()

    return run_on_fleet(devices, action)


def choices_from(result: FleetResult[ProvisionReport], devices: Sequence[Device],
                 override: str | None = None) -> list[BackendChoice]:
    """Choose each device's backend from a provisioning result (pure; `harness.backends.choose_backend`).

    Parameters
    ----------
    result : FleetResult of ProvisionReport
    devices : sequence of Device
        Order of the choices.
    override : str, optional
        ``--backend`` (``None`` or ``"auto"``: each device's best available one).

    Returns
    -------
    list of BackendChoice
    """
    out = []
    for device in devices:
        failure = result.failures.get(device.name)
        report = result.successes.get(device.name)
        message = f"{failure.kind}: {failure.message}" if failure is not None else None
        out.append(choose_backend(device.name, report, override, message))
    return out


def fleet_backends(fleet: Fleet | Sequence[Device], override: str | None = None,
                   opener: Callable[[Device], Transport] = connect,
                   say: Callable[[str], None] = print) -> list[BackendChoice]:
    """Ask every device what it can run and choose its backend; ``--backend X`` asks nothing.

    Each device is asked through the runtime its runner will start with: a phone without
    Python first gets its runtime bundle (pushed when missing, not re-hashed when there),
    so ``auto`` gives it ``onnx`` (`harness.backends.why_not`).

    The check imports torch only on devices that can run neither ``ort`` nor ``onnx``:
    importing it is most of the check's time (4 s against 17 s on the emulated fleet), and
    a device with ``ort`` or ``onnx`` never uses it (`harness.backends.PREFERENCE`).

    Parameters
    ----------
    fleet : Fleet or sequence of Device
    override : str, optional
        A backend for every device (taken as given), or ``None`` / ``"auto"``.
    opener : callable
        Device to an open transport.
    say : callable
        Receives progress lines (a runtime bundle built or pushed).

    Returns
    -------
    list of BackendChoice
        One per device in fleet order; a device that did not answer, or can run no backend,
        has ``backend=None`` and the reason.
    """
    devices = fleet.devices if isinstance(fleet, Fleet) else tuple(fleet)
    if override is not None and override != "auto":
        return [choose_backend(d.name, None, override) for d in devices]
    onnx_packages = [p for p in DEFAULT_PACKAGES if p.name != "torch"]
    first = provision(devices, packages=onnx_packages, opener=opener, verify_runtime=False, say=say)
    for device in devices:
        runtime = first.successes[device.name].runtime if device.name in first.successes else None
        if runtime is not None and (runtime.pushed_parts or runtime.unpack_seconds):
            say(runtime.describe(device.name))
    rest = [d for d in devices if d.name in first.successes and first.successes[d.name].python is not None
            and not any(first.successes[d.name].can_run(b) for b in ("ort", "onnx"))]
    if not rest:
        return choices_from(first, devices)
    second = provision(rest, opener=opener, verify_runtime=False, say=say)
    merged = FleetResult({**first.successes, **second.successes}, {**first.failures, **second.failures})
    return choices_from(merged, devices)
