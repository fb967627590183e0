"""Choosing a device's backend from what it answered (pure: reports are built by hand)."""

from __future__ import annotations

import dataclasses

import pytest

from exporters.userinput import InputError
from harness.backends import (
    PREFERENCE,
    BackendChoice,
    PackageStatus,
    ProvisionReport,
    check_override,
    choose_backend,
    format_choices,
    usable_backends,
    usable_devices,
    why_not,
)

OK = PackageStatus(True, True, "1.0")
MISSING = PackageStatus(False, False)
BROKEN = PackageStatus(True, False, None, "ImportError: libgomp.so.1: cannot open shared object file")


def report(machine: str = "x86_64", python: str | None = "3.11.2", **packages: PackageStatus) -> ProvisionReport:
    names = ("numpy", "onnxruntime", "onnxruntime-training", "torch")
    statuses = {name: packages.get(name.replace("-", "_"), MISSING) for name in names}
    return ProvisionReport(python, statuses, "/w/site", machine=machine)


def test_preference_is_ort_then_onnx_then_torch() -> None:
    everything = report(numpy=OK, onnxruntime=OK, onnxruntime_training=OK, torch=OK)
    assert usable_backends(everything) == PREFERENCE == ("ort", "onnx", "torch")
    assert choose_backend("d", everything) == BackendChoice("d", "ort", "best available")


def test_an_aarch64_board_with_plain_onnxruntime_uses_onnx_and_says_why_not_ort() -> None:
    pi = report("aarch64", numpy=OK, onnxruntime=OK)
    assert why_not(pi, "ort") == "onnxruntime-training 1.19.2 has no wheel for aarch64"
    assert why_not(pi, "onnx") is None
    assert why_not(pi, "torch") == "torch is not installed"
    choice = choose_backend("pi", pi)
    assert (choice.backend, choice.reason) == (
        "onnx",
        "best available (ort: onnxruntime-training 1.19.2 has no wheel for aarch64)",
    )


def test_a_phone_on_a_runtime_bundle_uses_onnx_because_the_bundle_offers_nothing_else() -> None:
    from harness.contract import RunnerStart
    from harness.phone_runtime import BUNDLE_BACKENDS, RuntimeReport

    bundle = RunnerStart(("env", "/w/runtime/x/lib/ld-linux-x86-64.so.2"), "bundle", BUNDLE_BACKENDS, "bundle")
    # even with every package importable through the bundle's Python, only its backends count
    phone = dataclasses.replace(report(numpy=OK, onnxruntime=OK, onnxruntime_training=OK, torch=OK),
                                runtime=RuntimeReport(bundle))
    assert why_not(phone, "ort") == why_not(phone, "torch") == "the bundle runtime offers onnx only"
    assert usable_backends(phone) == ("onnx",)
    choice = choose_backend("phone", phone)
    assert (choice.backend, choice.reason) == ("onnx", "best available (ort: the bundle runtime offers onnx only)")
    assert choose_backend("phone", phone, "ort").backend == "ort"  # an explicit --backend is taken as given
    # a bundle whose onnxruntime does not import has no backend at all
    broken = dataclasses.replace(report(numpy=OK, onnxruntime=BROKEN), runtime=RuntimeReport(bundle))
    assert choose_backend("phone", broken).backend is None
    # a phone on its own Python (Termux) is judged by its packages, like any device
    termux = dataclasses.replace(report("aarch64", numpy=OK, onnxruntime=OK),
                                 runtime=RuntimeReport(RunnerStart(("python3",))))
    assert usable_backends(termux) == ("onnx",)
    assert why_not(termux, "ort") == "onnxruntime-training 1.19.2 has no wheel for aarch64"


def test_reasons_name_python_version_install_route_and_a_broken_import() -> None:
    assert why_not(report("x86_64", "3.12.3", numpy=OK), "ort") == (
        "onnxruntime-training 1.19.2 has no wheel for Python 3.12"
    )
    assert why_not(report("x86_64", "3.11.2", numpy=OK), "ort") == (
        "onnxruntime-training is not installed (fleet provision --install fetches it)"
    )
    assert why_not(report(numpy=OK), "onnx") == "onnxruntime is not installed (fleet provision --install installs it)"
    assert why_not(report(onnxruntime=OK), "onnx") == "numpy is not installed (fleet provision --install installs it)"
    broken = report("aarch64", numpy=OK, onnxruntime=BROKEN)
    assert why_not(broken, "onnx") == f"onnxruntime is installed but does not import: {BROKEN.error}"
    assert why_not(report(python=None), "torch") == "no Python on the device (the device's python cannot run)"


def test_torch_is_the_last_resort_and_a_device_with_nothing_is_skipped_with_every_reason() -> None:
    torch_only = choose_backend("t", report("aarch64", numpy=OK, torch=OK))
    assert torch_only.backend == "torch" and "onnx: onnxruntime is not installed" in torch_only.reason
    nothing = choose_backend("n", report("aarch64", numpy=OK))
    assert not nothing.usable and nothing.backend is None
    assert nothing.reason.startswith("no usable backend (ort: onnxruntime-training 1.19.2 has no wheel for aarch64; ")
    assert "onnx: onnxruntime is not installed" in nothing.reason and "torch: torch is not installed" in nothing.reason
    assert format_choices([torch_only, nothing]) == [f"t: torch ({torch_only.reason})", f"n: skipped: {nothing.reason}"]
    assert usable_devices([torch_only, nothing]) == {"t": "torch"}


def test_an_override_is_taken_as_given_and_an_unanswered_device_keeps_the_first_backend() -> None:
    nothing = report("aarch64")
    assert choose_backend("d", nothing, "ort") == BackendChoice("d", "ort", "--backend ort")
    assert choose_backend("d", nothing, "auto").backend is None
    gone = choose_backend("d", None, None, "unreachable: connection refused")
    assert gone == BackendChoice("d", "ort", "not checked (unreachable: connection refused); tried with ort")
    assert [check_override(v) for v in ("auto", " onnx")] == ["auto", "onnx"]
    with pytest.raises(InputError, match="unknown backend 'tflite'"):
        check_override("tflite")
