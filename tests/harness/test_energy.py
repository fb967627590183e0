"""The host's reading of a runner document's energy: per image, flags, passes pooled, the power options."""

from __future__ import annotations

import math

import pytest

from harness.contract import bench_argv, bench_options, power_options, train_argv, train_request
from harness.document import DocumentError, parse_document
from harness.energy import EnergyError, EnergyReading, energy_reading, merge_energy
from harness.passes import merge_passes


def energy(**changes: object) -> dict:
    """A measured ``energy`` object: 2 J over 1 s for 40 images, 0.5 J idle."""
    base = {
        "sensor": "ina3221-hwmon", "rails": ["VDD_IN"], "emulated": True, "joules": 2.0, "idle_joules": 0.5,
        "uncertainty_j": 0.04, "seconds": 1.0, "images": 40, "external_power": False, "flag": None,
    }  # fmt: skip
    return {**base, **changes}


def test_a_measured_object_reads_per_image() -> None:
    assert energy_reading(energy()) == EnergyReading(
        sensor="ina3221-hwmon", rails=("VDD_IN",), emulated=True, joules_per_image=0.05,
        above_idle_per_image=0.0375, uncertainty_per_image=0.001, flag=None,
    )  # fmt: skip
    assert energy_reading(None) is None
    assert energy_reading(energy(idle_joules=None)).above_idle_per_image is None  # type: ignore[union-attr]


@pytest.mark.parametrize(
    "flag", ["external-power", "sensor-slower-than-cell", "power: /sys/x/in1_input: missing"]
)  # fmt: skip
def test_a_flagged_object_has_no_number_per_image(flag: str) -> None:
    reading = energy_reading(energy(flag=flag))
    assert reading is not None and not reading.measured and reading.flag == flag
    assert (reading.joules_per_image, reading.above_idle_per_image, reading.uncertainty_per_image) == (None,) * 3


def test_joules_without_images_are_flagged() -> None:
    reading = energy_reading(energy(images=0))
    assert reading is not None and reading.flag == "no images in the energy window"


@pytest.mark.parametrize(
    ("changes", "key"),
    [
        ({"joules": "2"}, "energy.joules"), ({"joules": -1.0}, "energy.joules"), ({"images": 1.5}, "energy.images"),
        ({"rails": "VDD_IN"}, "energy.rails"), ({"emulated": 1}, "energy.emulated"), ({"flag": 3}, "energy.flag"),
        ({"seconds": math.inf}, "energy.seconds"),
    ],
)  # fmt: skip
def test_a_malformed_object_is_refused_naming_its_key(changes: dict, key: str) -> None:
    with pytest.raises(EnergyError, match=key):
        energy_reading(energy(**changes))
    with pytest.raises(DocumentError, match=key):
        parse_document({"energy": energy(**changes)}, from_device=True)
    with pytest.raises(DocumentError, match="'energy'"):
        parse_document({"energy": [1]}, from_device=True)


def test_the_document_carries_its_energy() -> None:
    assert parse_document({"energy": energy()}, from_device=True).energy == energy_reading(energy())
    assert parse_document({}).energy is None


def test_passes_pool_by_sums() -> None:
    merged = merge_energy([energy(), energy(joules=4.0, idle_joules=1.0, uncertainty_j=0.03, seconds=2.0, images=80)])
    assert merged is not None
    assert (merged["joules"], merged["idle_joules"], merged["seconds"], merged["images"]) == (6.0, 1.5, 3.0, 120)
    assert merged["uncertainty_j"] == pytest.approx(0.05)
    assert merge_energy([None, None]) is None
    flagged = merge_energy([energy(), energy(flag="sensor-slower-than-cell")])
    assert flagged is not None and flagged["flag"] == "sensor-slower-than-cell"
    missing = merge_energy([energy(), None])
    assert missing is not None and missing["joules"] is None and missing["flag"].startswith("power: a pass")


def test_merged_passes_carry_the_pooled_energy() -> None:
    def doc(seconds: list[float], obj: dict) -> object:
        return parse_document({"status": "ok", "step_seconds": seconds, "energy": obj})

    merged = merge_passes([doc([0.1, 0.1], energy()), doc([0.1, 0.1], energy(joules=2.4))], precision=0.0)  # type: ignore[list-item]
    assert merged.energy is not None and merged.energy.joules_per_image == pytest.approx(4.4 / 80)


def test_power_options_follow_the_facts_or_an_emulated_sensor() -> None:
    facts = {"power": [{"kind": "rapl", "rails": ["package-0"]}]}
    assert power_options("/", facts, False) == {"power_root": "/", "power_sensor": "rapl"}
    assert power_options("/st/fast/power", {"power": []}, True) == {"power_root": "/st/fast/power"}
    assert power_options("/", {"power": []}, False) == {} and power_options("/", None, False) == {}


def test_the_runner_options_carry_the_power_root() -> None:
    options = bench_options("set", backend="ort", warmup=1, steps=2, threads=1, power_root="/p", power_sensor="rapl")
    assert (options["power_root"], options["power_sensor"]) == ("/p", "rapl")
    assert "power_root" not in bench_options("set", backend="ort", warmup=1, steps=2, threads=1)
    argv = bench_argv("python3", "r.pyz", "set", backend="ort", warmup=1, steps=2, threads=1, power_root="/p")
    assert argv[-2:] == ["--power-root", "/p"]
    common = {"backend": "ort", "params": "p.npy", "data": "d.npz", "out": "o.npy", "epochs": 1, "lr": 0.1,
              "threads": 1, "seed": 0}  # fmt: skip
    assert train_argv("python3", "r.pyz", "set", **common, power_root="/p", power_sensor="pmic-adc")[-4:] == [
        "--power-root", "/p", "--power-sensor", "pmic-adc"
    ]  # fmt: skip
    assert "--power-root" not in train_argv("python3", "r.pyz", "set", **common)
    assert train_request("set", **common, power_root="/p")["power_root"] == "/p"
    assert "power_root" not in train_request("set", **common)
