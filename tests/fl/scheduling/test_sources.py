"""Scheduling inputs: memory budgets from a fleet (fl/scheduling/sources.py)."""

from __future__ import annotations

from pathlib import Path

from devices.fleet import Device, Emulation, Fleet
from fl.scheduling.sources import memory_budgets_from_fleet


def test_memory_budgets_from_fleet_fill_presets() -> None:
    fleet = Fleet(
        Path("f.yaml"),
        (
            Device("pi", "ssh", emulate=Emulation(preset="pi4")),
            Device("small", "ssh", emulate=Emulation(memory_mb=512)),
            Device("real", "ssh"),
        ),
    )
    budgets = memory_budgets_from_fleet(fleet)
    assert budgets == {"pi": 2048 * 2**20, "small": 512 * 2**20}
