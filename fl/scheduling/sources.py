"""Scheduling inputs from the devices layer: memory budgets from a fleet.

The edge of the scheduling package: everything else in it works on rows and numbers, and
this is the only function that takes a `devices.fleet.Fleet`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from devices.fleet import Fleet


def memory_budgets_from_fleet(fleet: Fleet) -> dict[str, int]:
    """Return ``{device: bytes}`` from the fleet's emulation memory limits (preset values filled in).

    Real devices have no memory field in the fleet file; give their budgets explicitly.

    Parameters
    ----------
    fleet : devices.fleet.Fleet

    Returns
    -------
    dict of str to int
        Only devices with an emulation memory limit.
    """
    from devices.emulation.presets import resolve

    out = {}
    for d in fleet.devices:
        if d.emulate is not None:
            memory_mb = resolve(d.emulate).memory_mb
            if memory_mb is not None:
                out[d.name] = int(memory_mb) * 2**20
    return out
