"""The provisioning table and the ``fleet provision`` command that prints it."""

from __future__ import annotations

from pathlib import Path

import pytest

from devices.fleet import Device
from devices.group import DeviceFailure, FleetResult
from fleetbench.cli import main
from harness.backends import PackageStatus, ProvisionReport
from harness.provision_cli import format_table, install_notes
from tests.harness.test_deploy import PY

ALL_PRESENT = {
    "numpy": PackageStatus(True, True, "2.1.0"),
    "onnxruntime": PackageStatus(True, True, "1.19.2"),
    "onnxruntime-training": PackageStatus(True, True, "1.19.2"),
    "torch": PackageStatus(True, True, "2.13.0"),
}


def _rows(table: str) -> dict[str, list[str]]:
    lines = table.splitlines()
    return {row[0]: row for row in ([c.strip() for c in line.split(" | ")] for line in lines if " | " in line)}


def test_each_device_is_one_row_with_its_versions_what_it_can_run_and_what_it_uses() -> None:
    devices = [Device("x86", "local", workdir="/w"), Device("pi", "local", workdir="/p"),
               Device("gone", "ssh", host="127.0.0.1", port=1)]
    pi_packages = {**ALL_PRESENT, "onnxruntime-training": PackageStatus(False, False),
                   "torch": PackageStatus(True, False, None, "ImportError: libfoo.so")}
    result = FleetResult(
        {"x86": ProvisionReport("3.11.2", dict(ALL_PRESENT), "/w/site", machine="x86_64"),
         "pi": ProvisionReport("3.11.2", pi_packages, "/p/site", machine="aarch64")},
        {"gone": DeviceFailure("unreachable", "gone: connection refused")},
    )
    table = format_table(result, devices)
    rows = _rows(table)
    assert rows["device"] == ["device", "machine", "python", "runtime", "numpy", "onnxruntime",
                              "onnxruntime-training", "torch", "can run", "uses"]
    assert rows["x86"] == ["x86", "x86_64", "3.11.2", "python", "2.1.0", "1.19.2", "1.19.2", "2.13.0",
                           "ort, onnx, torch", "ort"]
    assert rows["pi"][4:] == ["2.1.0", "1.19.2", "missing", "broken", "onnx", "onnx"]
    assert rows["gone"][-2:] == ["FAILED: unreachable", "-"]
    notes = table.splitlines()[5:]
    assert "gone: unreachable: gone: connection refused" in notes
    assert "pi: no ort: onnxruntime-training 1.19.2 has no wheel for aarch64" in notes
    assert "pi: no torch: torch is installed but does not import: ImportError: libfoo.so" in notes
    assert not any(line.startswith("x86: no ") for line in notes)


def test_install_notes_say_what_was_fetched_installed_and_what_failed() -> None:
    report = ProvisionReport("3.11.2", dict(ALL_PRESENT), "/w/site", installed=("numpy", "onnxruntime"),
                             install_error="ERROR: No matching distribution", fetched=("b: fetched numpy.whl",))
    assert install_notes("b", report) == [
        "b: fetched numpy.whl",
        "b: installed numpy, onnxruntime into /w/site",
        "b: install failed: ERROR: No matching distribution",
    ]
    assert install_notes("b", ProvisionReport("3.11.2", dict(ALL_PRESENT), "/w/site")) == []


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
        "device", "machine", "python", "runtime", "numpy", "onnxruntime", "onnxruntime-training", "torch", "can run",
        "uses",
    ]
    here = next(line for line in out.splitlines() if line.startswith("here "))
    assert [cell.strip() for cell in here.split(" | ")][-2:] == ["ort, onnx, torch", "ort"]
    assert "FAILED: unreachable" in out

