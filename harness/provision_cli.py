"""The provisioning commands: ``fleetbench fleet provision`` and ``fleetbench fleet facts``, and their table.

`harness.provision` decides and installs; this module renders what it found for a person
(one row per device, then notes saying why each backend a device cannot run is unusable)
and turns a report into plain data for logs.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

from devices.fleet import Device
from devices.group import FleetResult
from devices.site import python_argv
from devices.transport import Transport
from harness.backends import PackageStatus, ProvisionReport, why_not
from harness.phone_runtime import MissingRuntime, runner_start
from harness.provision import BACKENDS, CHECK_SET, DEFAULT_PACKAGES, Package, choices_from, provision
from harness.wheels import wheel_distribution


def format_table(result: FleetResult[ProvisionReport], devices: Sequence[Device],
                 packages: Sequence[Package] = DEFAULT_PACKAGES) -> str:
    """Render the provisioning table (device | machine | python | runtime | packages... | can run | uses), then notes.

    ``runtime`` is ``python`` (the device's own) or ``bundle`` (a phone's runtime bundle).
    The notes say, per phone, the runtime chosen and what was pushed, and per device why
    each backend it cannot run is unusable, what was installed, and what failed.

    Parameters
    ----------
    result : FleetResult of ProvisionReport
    devices : sequence of Device
        Row order.
    packages : sequence of Package

    Returns
    -------
    str
    """
    header = ["device", "machine", "python", "runtime", *(p.name for p in packages), "can run", "uses"]
    rows = [header]
    notes: list[str] = []
    for device, choice in zip(devices, choices_from(result, devices), strict=True):
        if device.name in result.failures:
            failure = result.failures[device.name]
            rows.append([device.name, "-", "-", "-", *("-" for _ in packages), f"FAILED: {failure.kind}", "-"])
            notes.append(f"{device.name}: {failure.kind}: {failure.message}")
            continue
        report = result.successes[device.name]
        usable = [b for b in BACKENDS if report.can_run(b)]
        start = report.start
        rows.append([device.name, report.machine or "-", report.python or "missing",
                     start.runtime if start is not None else "python",
                     *(_cell(report.packages[p.name]) for p in packages),
                     ", ".join(usable) or "nothing", choice.backend or "-"])
        if device.kind == "adb" and report.runtime is not None:
            notes.append(report.runtime.describe(device.name))
        notes.extend(_notes(device.name, report))
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = [" | ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in rows]
    lines.insert(1, "-+-".join("-" * w for w in widths))
    return "\n".join(lines + notes)


def _cell(status: PackageStatus) -> str:
    if status.importable:
        return status.version or "yes"
    return "broken" if status.present else "missing"


def install_notes(name: str, report: ProvisionReport) -> list[str]:
    """Return the lines saying what provisioning fetched, installed and failed to install on one device.

    Parameters
    ----------
    name : str
        The device's name.
    report : ProvisionReport

    Returns
    -------
    list of str
    """
    notes = list(report.fetched)
    notes += [f"{name}: installed {', '.join(report.installed)} into {report.site}"] if report.installed else []
    return notes + ([f"{name}: install failed: {report.install_error}"] if report.install_error else [])


def _notes(name: str, report: ProvisionReport) -> list[str]:
    notes = install_notes(name, report)
    if report.stepped:
        model, width, batch, _ = CHECK_SET
        notes.append(f"{name}: the runner trained one step of {model} at width {width:g}, batch {batch}, on "
                     f"{', '.join(report.stepped)}")
    if report.python is None:
        return [*notes, f"{name}: {why_not(report, 'onnx')}: no backend can run"]
    notes.extend(f"{name}: no {backend}: {reason}" for backend in BACKENDS
                 if (reason := why_not(report, backend)) is not None)
    return notes


def cmd_provision(args: argparse.Namespace) -> int:
    """Run ``fleetbench fleet provision FILE [--install [--via host|device]] [--index-url URL] [--wheel W ...]``.

    Parameters
    ----------
    args : argparse.Namespace
        ``file`` (fleet YAML), ``wheel`` (list of wheel paths), ``install``, ``via`` and ``index_url``.

    Returns
    -------
    int
        0 when every device answered, 1 otherwise.

    Raises
    ------
    InputError
        A wheel file is missing or badly named.
    """
    from devices.fleetfile import load_fleet
    from exporters.userinput import InputError

    wheels = [Path(w) for w in args.wheel]
    for wheel in wheels:
        if not wheel.is_file():
            raise InputError(f"wheel {wheel} does not exist")
        try:
            wheel_distribution(wheel)
        except ValueError as exc:
            raise InputError(str(exc)) from None
    fleet = load_fleet(args.file)
    result = provision(fleet, wheels, install=args.install, index_url=args.index_url, via=args.via, train_step=True)
    print(format_table(result, fleet.devices))
    return 0 if result.ok else 1


def runner_python(transport: Transport, device: Device) -> list[str]:
    """Return the command that starts ``device``'s Python as its runner starts, pushing nothing.

    `harness.phone_runtime.runner_start` without provisioning: a phone without Python
    whose runtime bundle is not there yet is asked with its own (missing) Python.

    Parameters
    ----------
    transport : Transport
    device : Device

    Returns
    -------
    list of str
    """
    try:
        return list(runner_start(transport, device, provision=False, say=lambda line: None).argv)
    except MissingRuntime:
        return python_argv(device.python, device.workdir)


def cmd_facts(args: argparse.Namespace) -> int:
    """Run ``fleetbench fleet facts FILE``, each device's Python started as its runner starts (`runner_python`).

    Parameters
    ----------
    args : argparse.Namespace
        As for `devices.facts.cmd_facts`.

    Returns
    -------
    int
        As `devices.facts.cmd_facts`.
    """
    from devices.facts import cmd_facts as device_facts

    return device_facts(args, python=runner_python)

