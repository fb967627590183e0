"""Which runner backend each device can run, why not, and which one it uses (pure).

The runner (`harness.runner`) trains with one of three backends, each needing numpy
plus one runtime on the device:

=========  ==========================================================================
``ort``    ``onnxruntime-training`` (the ORT training artifacts). Its last release,
           1.19.2, has Linux wheels for x86_64 and CPython 3.8-3.11 only:
           no Raspberry Pi, no Jetson, no phone.
``onnx``   the plain ``onnxruntime`` package (inference build, or the training build,
           which contains it) running the set's portable ``step_model.onnx``. Wheels
           exist for x86_64 and aarch64 Linux.
``torch``  PyTorch (TorchScript model beside the set).
=========  ==========================================================================

Preference (`PREFERENCE`): ``ort`` > ``onnx`` > ``torch``. ``ort`` first because it is
the reference build the portable step model is checked against and the one every
existing profile was measured with, so a device that can run it stays comparable with
earlier campaigns; ``onnx`` next because it measures the same ONNX graphs (same maths,
checked to float32 tolerance) on any onnxruntime build; ``torch`` last because it does
not run the exported ONNX artifacts at all, only an eager twin of the model.

A device that answers and can run no backend is skipped (``backend=None``, with every
reason). A device that does not answer the check at all (unreachable, timed out) is *not*
skipped: it keeps `PREFERENCE`'s first backend, so a campaign records its cells with the
failure's kind and an FL run logs its clients as unreachable, as for a device that fails
later, and a device that comes back mid-run trains (the runner says "missing runtime" if
the guess was wrong).

A phone on a runtime bundle (`harness.phone_runtime`) can run ``onnx`` only: its report
carries the runtime, whose `harness.contract.RunnerStart.backends` rule the others out
here, before any package is looked at, so ``auto`` gives it ``onnx`` and the reason
for not ``ort`` is the bundle, not a missing wheel.

Everything here reads a `ProvisionReport` (what a device answered, the record this
module defines) and does no I/O, so the choice is testable without devices;
`harness.provision` asks the devices and fills the reports.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from harness.contract import RunnerStart
    from harness.phone_runtime import RuntimeReport

#: Backend -> the package names (`harness.provision.Package.name`) it needs importable.
BACKEND_PACKAGES: Mapping[str, tuple[str, ...]] = {
    "ort": ("numpy", "onnxruntime-training"),
    "onnx": ("numpy", "onnxruntime"),
    "torch": ("numpy", "torch"),
}

#: Backends in order of preference (see the module docstring for the reason).
PREFERENCE: tuple[str, ...] = ("ort", "onnx", "torch")

#: The last onnxruntime-training release, and the machines and Pythons it has Linux wheels for.
ORT_TRAINING_LAST = "1.19.2"
ORT_TRAINING_MACHINES = frozenset({"x86_64", "amd64"})
ORT_TRAINING_PYTHONS = frozenset({"3.8", "3.9", "3.10", "3.11"})

#: Value of ``--backend`` that lets each device use its best available backend.
AUTO = "auto"


@dataclass(frozen=True)
class BackendChoice:
    """The backend one device uses, or why it has none.

    Attributes
    ----------
    device : str
        Device name.
    backend : str or None
        ``"ort"``, ``"onnx"`` or ``"torch"``; None when the device can run none of them.
    reason : str
        One line: why this backend (``"best available"``, ``"--backend onnx"``), or why none.
    """

    device: str
    backend: str | None
    reason: str

    @property
    def usable(self) -> bool:
        """Whether the device has a backend."""
        return self.backend is not None


@dataclass(frozen=True)
class PackageStatus:
    """One package on one device.

    Attributes
    ----------
    present : bool
        Installed metadata or a findable top-level module.
    importable : bool
        ``import module`` succeeded.
    version : str or None
    error : str or None
        Why the import failed (one line).
    """

    present: bool
    importable: bool
    version: str | None = None
    error: str | None = None


@dataclass(frozen=True)
class ProvisionReport:
    """What one device answered.

    Attributes
    ----------
    python : str or None
        Python version on the device; None when ``device.python`` cannot run.
    packages : dict of str to PackageStatus
        Per package name, after any installation.
    site : str
        ``<workdir>/site`` (``~`` expanded): put it on ``PYTHONPATH``.
    installed : tuple of str
        Package names that became importable through the given wheels or the index.
    install_error : str or None
        Why installing failed (pip's last line), when it did.
    machine : str or None
        ``platform.machine()`` on the device (``x86_64``, ``aarch64``); None without Python.
    glibc : str or None
        The device's glibc version; None for another C library or without Python.
    pip : bool
        Whether the device's Python has pip.
    unwritable : str or None
        Why ``<workdir>/site`` cannot be written (None: it can).
    fetched : tuple of str
        What the host fetched for the device, one line (wheels and where from).
    step_failures : dict of str to str
        Per backend whose training step was tried (`train_step_check`) and failed, why;
        a backend that ran its step, or was not tried, is absent.
    stepped : tuple of str
        The backends that ran one training step of the check set.
    runtime : RuntimeReport or None
        The runtime the runner starts with (`harness.phone_runtime.device_runtime`): the
        device's own Python, or a phone's runtime bundle (which offers ``onnx`` only); the
        packages above are that runtime's. None when not asked (the device's own Python).
    """

    python: str | None
    packages: dict[str, PackageStatus]
    site: str
    installed: tuple[str, ...] = ()
    install_error: str | None = None
    machine: str | None = None
    glibc: str | None = None
    pip: bool = False
    unwritable: str | None = None
    fetched: tuple[str, ...] = ()
    step_failures: dict[str, str] = dataclasses.field(default_factory=dict)
    stepped: tuple[str, ...] = ()
    runtime: RuntimeReport | None = None

    @property
    def start(self) -> RunnerStart | None:
        """How the runner starts on the device (None: with ``device.python``, not asked)."""
        return None if self.runtime is None else self.runtime.start

    def can_run(self, backend: str) -> bool:
        """Whether every package ``backend`` needs is importable.

        Parameters
        ----------
        backend : {"ort", "onnx", "torch"}

        Returns
        -------
        bool
        """
        return why_not(self, backend) is None

    def missing(self) -> tuple[str, ...]:
        """Return the names of packages that are not importable."""
        return tuple(name for name, status in self.packages.items() if not status.importable)


def why_not(report: ProvisionReport, backend: str) -> str | None:
    """Return why ``backend`` cannot run on the device of ``report`` (None when it can).

    Parameters
    ----------
    report : ProvisionReport
    backend : {"ort", "onnx", "torch"}

    Returns
    -------
    str or None
        One line, e.g. ``"onnxruntime-training 1.19.2 has no wheel for aarch64"``.

    Raises
    ------
    KeyError
        For an unknown backend.
    """
    needed = BACKEND_PACKAGES[backend]
    start = report.start
    if start is not None and not start.offers(backend):
        return f"the {start.runtime} runtime offers {'/'.join(start.backends)} only"
    if report.python is None:
        return "no Python on the device (the device's python cannot run)"
    for name in needed:
        status = report.packages.get(name)
        if status is not None and status.importable:
            continue
        if status is not None and status.present:
            return f"{name} is installed but does not import: {status.error}"
        return _missing(report, name)
    failed = report.step_failures.get(backend)
    return f"one training step of the check set failed: {failed}" if failed else None


def _missing(report: ProvisionReport, name: str) -> str:
    if name == "onnxruntime-training":
        machine = (report.machine or "").lower()
        python = ".".join((report.python or "").split(".")[:2])
        if machine and machine not in ORT_TRAINING_MACHINES:
            return f"onnxruntime-training {ORT_TRAINING_LAST} has no wheel for {report.machine}"
        if python and python not in ORT_TRAINING_PYTHONS:
            return f"onnxruntime-training {ORT_TRAINING_LAST} has no wheel for Python {python}"
        return "onnxruntime-training is not installed (fleet provision --install fetches it)"
    if name in ("numpy", "onnxruntime"):
        return f"{name} is not installed (fleet provision --install installs it)"
    return f"{name} is not installed"


def usable_backends(report: ProvisionReport) -> tuple[str, ...]:
    """Return the backends the device of ``report`` can run, in `PREFERENCE` order.

    Parameters
    ----------
    report : ProvisionReport

    Returns
    -------
    tuple of str
    """
    return tuple(b for b in PREFERENCE if why_not(report, b) is None)


def choose_backend(name: str, report: ProvisionReport | None, override: str | None = None,
                   failure: str | None = None) -> BackendChoice:
    """Choose one device's backend: ``override`` if given, else its best usable one.

    Parameters
    ----------
    name : str
        Device name.
    report : ProvisionReport or None
        What the device answered; None when it could not be asked (see ``failure``): such a
        device keeps the first backend of `PREFERENCE` rather than being skipped.
    override : str, optional
        A backend the user named (``--backend``); it is taken as given, without a report:
        the runner then says "missing runtime" on a device that lacks it.
    failure : str, optional
        Why the device did not answer the provisioning check.

    Returns
    -------
    BackendChoice
    """
    if override is not None and override != AUTO:
        return BackendChoice(name, override, f"--backend {override}")
    if report is None:
        # Not skipped: the run's own failure handling records it (unreachable, timeout) and
        # a device that comes back later trains; see the module docstring.
        return BackendChoice(name, PREFERENCE[0], f"not checked ({failure or 'no answer'}); tried with {PREFERENCE[0]}")
    usable = usable_backends(report)
    if usable:
        better = "; ".join(f"{b}: {why_not(report, b)}" for b in PREFERENCE[: PREFERENCE.index(usable[0])])
        return BackendChoice(name, usable[0], f"best available ({better})" if better else "best available")
    reasons = "; ".join(f"{b}: {why_not(report, b)}" for b in PREFERENCE)
    return BackendChoice(name, None, f"no usable backend ({reasons})")


def check_override(text: str) -> str:
    """Return a valid ``--backend`` value or raise.

    Parameters
    ----------
    text : str
        ``auto``, ``ort``, ``onnx`` or ``torch``.

    Returns
    -------
    str

    Raises
    ------
    exporters.userinput.InputError
        For anything else.
    """
    from exporters.userinput import InputError

    value = text.strip()
    if value != AUTO and value not in BACKEND_PACKAGES:
        raise InputError(f"unknown backend {value!r} (expected {AUTO} or one of {', '.join(PREFERENCE)})")
    return value


def usable_devices(choices: Sequence[BackendChoice]) -> dict[str, str]:
    """Return ``{device: backend}`` of the devices that have a backend, in the given order.

    Parameters
    ----------
    choices : sequence of BackendChoice

    Returns
    -------
    dict of str to str
    """
    return {c.device: c.backend for c in choices if c.backend is not None}


def format_choices(choices: Sequence[BackendChoice]) -> list[str]:
    """Return one line per device: ``name: backend (reason)`` or ``name: skipped: reason``.

    Parameters
    ----------
    choices : sequence of BackendChoice

    Returns
    -------
    list of str
    """
    return [f"{c.device}: {c.backend} ({c.reason})" if c.usable else f"{c.device}: skipped: {c.reason}"
            for c in choices]
