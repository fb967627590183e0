"""Planning a campaign's cells (`harness.cells`)."""

from __future__ import annotations

import pytest

from devices.fleet import Device
from exporters.userinput import InputError
from harness.cells import plan_cells
from tests.harness.campaigns import MODEL, WIDTHS


def test_plan_cells_is_device_major_and_uses_device_threads() -> None:
    devices = [Device(name="a", kind="local", threads=2), Device(name="b", kind="local")]
    specs = plan_cells(devices, MODEL, WIDTHS[:2], [4, 8], ["ort", "torch"], steps=3, warmup=1)
    assert len(specs) == 2 * 2 * 2 * 2
    assert [s.device for s in specs[:8]] == ["a"] * 8 and {s.threads for s in specs[:8]} == {2}
    assert len({s.cell_key() for s in specs}) == len(specs)
    assert specs[0].arch_sizes != specs[4].arch_sizes  # widths really change the arch
    with pytest.raises(InputError):
        plan_cells(devices, "no-such-model", WIDTHS, [4], ["ort"], 3, 1)
    with pytest.raises(InputError):
        plan_cells(devices, MODEL, WIDTHS, [4], ["tflite"], 3, 1)
