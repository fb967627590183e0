"""Scheduling FL clients from measured device profiles.

The profile store measures, per device, the per-image training latency and peak memory of a
model at several widths (`harness.store.ProfileStore.latest_cells`). This package turns those
rows into the decisions the FL methods need, one module per responsibility:

`fl.scheduling.rows`
    Profile rows in any accepted form as row dicts; FLOPs and memory footprint at a width.
`fl.scheduling.kmeans`
    Exact 1-D k-means.
`fl.scheduling.tiers`
    Tiers under a round deadline and memory budgets (FjORD / HeteroFL / FedRolex), and
    capacities snapped to a method's levels.
`fl.scheduling.budgets`
    FedDrop's FLOPs-budget ratio per device.
`fl.scheduling.energy`
    Energy per image per width from the profiles, and a client round's predicted energy.
`fl.scheduling.sources`
    The edge: memory budgets from a fleet.
`fl.scheduling.checks`
    Argument checks the modules share.

Straggler sizing (FLuID) is `fl.maths.fluid.straggler_width`, the project's only one.

**Decision:** the package re-exports the public names of its modules, so that a caller
composing a run (`fl.plan`, the benchmarks) imports them from one place; each name is
defined once, in its module, and the tests import from the module they test.
"""

from fl.scheduling.budgets import round_budget_ratio
from fl.scheduling.energy import EnergyCell, EnergyCurve, energy_cells, energy_curves, round_energy
from fl.scheduling.kmeans import kmeans_1d
from fl.scheduling.rows import width_flops
from fl.scheduling.sources import memory_budgets_from_fleet
from fl.scheduling.tiers import (
    HETEROFL_LEVELS,
    Capacities,
    DeviceChoice,
    TierPlan,
    WidthCheck,
    assign_tiers,
    capacities_for,
    uniform_levels,
)
from harness.latency import profile_rows

__all__ = [
    "HETEROFL_LEVELS",
    "Capacities",
    "DeviceChoice",
    "EnergyCell",
    "EnergyCurve",
    "TierPlan",
    "WidthCheck",
    "assign_tiers",
    "capacities_for",
    "energy_cells",
    "energy_curves",
    "kmeans_1d",
    "memory_budgets_from_fleet",
    "profile_rows",
    "round_budget_ratio",
    "round_energy",
    "uniform_levels",
    "width_flops",
]
