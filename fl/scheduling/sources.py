"""Scheduling inputs from the other layers: profiles read from a store, memory budgets from a fleet.

The edge of the scheduling package: everything else in it works on rows and numbers, and
these functions are the only ones that take a `harness.store.ProfileStore` (which they
read) or a `devices.fleet.Fleet`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fl.scheduling.rows import profile_rows, select

if TYPE_CHECKING:
    from devices.fleet import Fleet
    from harness.store import ProfileStore


def profiles_from_store(
    store: ProfileStore, model: str, batch: int | None = None, backend: str | None = "ort"
) -> dict[str, list[dict[str, Any]]]:
    """Read the measured (status ``ok``) cells of ``model`` from a store, grouped by device.

    Parameters
    ----------
    store : harness.store.ProfileStore
    model : str
    batch : int, optional
        Only this batch size.
    backend : str or None
        Only this backend (``None``: any).

    Returns
    -------
    dict of str to list of dict
        ``{device: rows}`` (the strategies' ``Profiles``), devices and rows in store
        order; a device whose cells all failed is absent.
    """
    frame = store.latest_cells()
    out: dict[str, list[dict[str, Any]]] = {}
    for r in select(profile_rows(frame), model=model, batch=batch, backend=backend):
        if r.get("status") == "ok":
            out.setdefault(str(r["device"]), []).append(r)
    return out


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
    from devices.presets import resolve

    out = {}
    for d in fleet.devices:
        if d.emulate is not None:
            memory_mb = resolve(d.emulate).memory_mb
            if memory_mb is not None:
                out[d.name] = int(memory_mb) * 2**20
    return out
