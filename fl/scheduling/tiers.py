"""Tiers under a round deadline and memory budgets, and capacities from tiers (pure functions).

Tier assignment (FjORD / HeteroFL / FedRolex), `assign_tiers`
    For every device the largest candidate width whose predicted round time meets the
    deadline and whose predicted peak memory fits the device's memory budget::

        round_seconds(device, w) = fixed + steps * batch * latency(w) + transfers(w)

    the round-cost model's prediction (`fl.plan`), so that the deadline is met by the whole
    round, not its training steps alone; ``latency(w)`` is the device's latency model's
    prediction of seconds per image at width ``w``, measured or not
    (`harness.latency.LatencyModel.predict`: per-layer features of the width's architecture,
    fitted once per plan) and the peak memory is the
    device's fitted memory model (`harness.latency.MemoryModel`). A check says how
    uncertain the prediction is and whether it was extrapolated beyond the measured widths
    (a missed deadline's note then says so). A width whose latest
    cell on the device failed with ``"out of memory"`` never fits. Given an energy budget per
    client round, a width must also keep the round's predicted energy within it (``energy``,
    `fl.scheduling.energy.round_energy`); a width without a prediction is not held to it. Devices with no width
    that fits are *excluded* with the reason. The chosen widths of the remaining devices
    are then grouped into ``k`` tiers by exact 1-D k-means (`fl.scheduling.kmeans`,
    weighted by how many devices chose each width; ties go to the earlier split).
    **Decision:** a tier's width is the *smallest* width chosen by its members, so that
    every member still meets the deadline and its memory budget at the tier's width (a
    centroid would overload the tier's slower members). Tier 0 is the widest.

Capacities, `capacities_for`
    Snaps each tier's width *down* to a method's level set: `HETEROFL_LEVELS` (1, 1/2,
    1/4, 1/8, 1/16; also FedRolex's, the levels of `fl.capacity`) or `uniform_levels`
    ``(k)`` = {1/k, ..., 1} (FjORD's capacities). Snapping down keeps every device within its
    deadline and memory budget.

Profiles are rows in any form `fl.scheduling.rows.profile_rows` accepts.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from fl.capacity import LEVELS
from fl.scheduling.checks import WIDTH_TOL, check_widths, count, positive, same_width
from fl.scheduling.kmeans import kmeans_1d
from fl.scheduling.rows import OUT_OF_MEMORY, predicted_latency, predicted_peak, select, status_summary, width_flops
from harness.latency import DeviceModels, ProfileRows, fit, profile_rows

#: HeteroFL / FedRolex capacity levels 'a'..'e', widest first.
HETEROFL_LEVELS: tuple[float, ...] = tuple(LEVELS)


@dataclass(frozen=True)
class WidthCheck:
    """How one candidate width fares on one device.

    Attributes
    ----------
    width : float
    train_flops : float
        Training FLOPs per example at ``width``.
    round_seconds : float
        Predicted round time (overhead included).
    peak_memory_bytes : float or None
        Predicted peak memory; ``None`` when the device has no memory measurement.
    fits_deadline : bool
    fits_memory : bool
        True also when the memory could not be checked (no budget or no measurement).
    note : str
        Why the width does not fit ("" when it fits).
    relative_std : float
        The latency prediction's standard deviation as a fraction of it.
    extrapolated : bool
        The width lies outside the device's measured widths.
    energy_j : float or None
        Predicted energy of the client round at ``width`` (None: no energy prediction).
    fits_energy : bool
        True also when there is no energy budget or prediction.
    """

    width: float
    train_flops: float
    round_seconds: float
    peak_memory_bytes: float | None
    fits_deadline: bool
    fits_memory: bool
    note: str = ""
    relative_std: float = 0.0
    extrapolated: bool = False
    energy_j: float | None = None
    fits_energy: bool = True

    @property
    def fits(self) -> bool:
        """Whether the width meets the deadline, the memory budget and the energy budget."""
        return self.fits_deadline and self.fits_memory and self.fits_energy


@dataclass(frozen=True)
class DeviceChoice:
    """One device's outcome in a `TierPlan`.

    Attributes
    ----------
    device : str
    width : float or None
        The largest candidate width that fits; ``None`` when excluded.
    tier : int or None
        Tier index, 0 = widest; ``None`` when excluded.
    tier_width : float or None
        The width of the device's tier (<= ``width``).
    round_seconds : float or None
        Predicted round time at ``tier_width``.
    peak_memory_bytes : float or None
        Predicted peak memory at ``tier_width`` (``None`` if not measured).
    reason : str
        Why the device is excluded ("" when included).
    checks : tuple of WidthCheck
        Every candidate width, smallest first (empty when there was no profile to check).
    """

    device: str
    width: float | None
    tier: int | None
    tier_width: float | None
    round_seconds: float | None
    peak_memory_bytes: float | None
    reason: str = ""
    checks: tuple[WidthCheck, ...] = ()

    @property
    def excluded(self) -> bool:
        """Whether no candidate width fits the device."""
        return self.width is None


@dataclass(frozen=True)
class TierPlan:
    """Devices assigned to capacity tiers for one model and deadline.

    Attributes
    ----------
    model : str
    deadline_s : float
    k : int
        Tiers requested; fewer exist when fewer distinct widths were chosen.
    tier_widths : tuple of float
        Width of each tier, widest first (index = tier).
    choices : tuple of DeviceChoice
        One per device of ``examples_per_round``, sorted by device name.
    """

    model: str
    deadline_s: float
    k: int
    tier_widths: tuple[float, ...]
    choices: tuple[DeviceChoice, ...]

    def choice(self, device: str) -> DeviceChoice:
        """Return the `DeviceChoice` of ``device`` (KeyError if it is not in the plan)."""
        for c in self.choices:
            if c.device == device:
                return c
        raise KeyError(device)

    @property
    def included(self) -> tuple[str, ...]:
        """Names of the devices with a tier."""
        return tuple(c.device for c in self.choices if not c.excluded)

    @property
    def excluded(self) -> dict[str, str]:
        """``{device: reason}`` of the excluded devices."""
        return {c.device: c.reason for c in self.choices if c.excluded}

    @property
    def tiers(self) -> tuple[tuple[str, ...], ...]:
        """Device names of each tier, widest tier first."""
        return tuple(tuple(c.device for c in self.choices if c.tier == t) for t in range(len(self.tier_widths)))


def assign_tiers(
    profiles: ProfileRows,
    model: str,
    widths: Iterable[float],
    *,
    deadline_s: float,
    round_seconds: Callable[[str, float], float],
    devices: Iterable[str],
    batch: int | Mapping[str, int | None] | None,
    memory_budget_bytes: Mapping[str, int] | None,
    k: int,
    backend: str | Mapping[str, str | None] | None = "ort",
    models: Mapping[str, DeviceModels] | None = None,
    energy: Callable[[str, float], float | None] | None = None,
    energy_budget_j: float | None = None,
) -> TierPlan:
    """Choose each device's largest width that meets the deadline and memory budget; cluster into tiers.

    Parameters
    ----------
    profiles : DataFrame, rows or ``{device: rows}``
        Stored profile rows (`fl.scheduling.rows`); failed cells give the reason of
        an exclusion, and an ``"out of memory"`` cell rules its width out.
    model : str
        Model name.
    widths : iterable of float
        Candidate widths in (0, 1].
    deadline_s : float
        Round deadline in seconds (``math.inf``: none).
    round_seconds : callable
        ``(device, width) -> seconds``: the round-cost model's predicted round (fixed cost,
        local steps at the width's architecture, transfers; `fl.plan`).
    devices : iterable of str
        The devices planned.
    batch : int, mapping of str to int, or None
        Training batch of the profile to use, one for all devices or one per device;
        ``None`` when each device was measured at one batch size only.
    memory_budget_bytes : mapping of str to int, or None
        Memory budget per device; a device without an entry (or ``None``) is unconstrained.
    k : int
        Number of tiers.
    backend : str, mapping of str to str, or None
        Profile backend (``"ort"``, ``"onnx"`` or ``"torch"``): one for all devices, or one
        per device (a phone on a runtime bundle trains with ``"onnx"``); None, and a device
        the mapping leaves out, take the device's one measured backend (devices profiled
        with their own best backend).
    models : mapping of str to DeviceModels, optional
        The rows' fitted models, when the caller fitted them already (a plan fits once).
    energy : callable, optional
        ``(device, width) -> joules``: the predicted energy of the device's client round at
        the width, None where it cannot be predicted.
    energy_budget_j : float, optional
        Energy budget per client round in joules (None: no energy limit).

    Returns
    -------
    TierPlan
        An excluded device keeps its checks when it had a profile to check.

    Raises
    ------
    InputError
        On a bad width, deadline or ``k``.
    """
    candidates = tuple(sorted(set(check_widths(widths))))
    deadline = math.inf if deadline_s == math.inf else positive(deadline_s, "deadline_s")
    budget_j = None if energy_budget_j is None else positive(energy_budget_j, "energy_budget_j")
    k = count(k, "k")

    def backend_of(device: str) -> str | None:
        return backend if backend is None or isinstance(backend, str) else backend.get(device)

    def batch_of(device: str) -> int | None:
        return batch if batch is None or isinstance(batch, int) else batch.get(device)

    rows = select(profile_rows(profiles), model=model)
    rows = [r for r in rows if backend_of(str(r.get("device"))) in (None, str(r.get("backend")))]
    models = fit(rows) if models is None else models
    picks: dict[str, tuple[WidthCheck | None, tuple[WidthCheck, ...], str]] = {}
    for device in sorted(devices):
        budget = None if memory_budget_bytes is None else memory_budget_bytes.get(device)
        checks = width_checks(
            rows, models, device, model, candidates, batch_of(device), backend_of(device), deadline, budget,
            functools.partial(round_seconds, device),
            energy=None if energy is None else functools.partial(energy, device), energy_budget_j=budget_j,
        )  # fmt: skip
        if isinstance(checks, str):
            picks[device] = (None, (), checks)
            continue
        fitting = [c for c in checks if c.fits]
        reason = "" if fitting else f"no width fits; smallest width {checks[0].width:g}: {checks[0].note}"
        picks[device] = (fitting[-1] if fitting else None, checks, reason)
    fitting_width = {d: p[0].width for d, p in picks.items() if p[0] is not None}
    names = sorted(fitting_width)
    labels = dict(zip(names, kmeans_1d([fitting_width[d] for d in names], k), strict=True))
    n_tiers = len(set(labels.values()))
    tier_widths = tuple(min(fitting_width[d] for d in names if labels[d] == t) for t in range(n_tiers))
    choices = []
    for device, (best, checks, reason) in picks.items():
        if best is None:
            choices.append(DeviceChoice(device, None, None, None, None, None, reason, checks))
            continue
        tier = labels[device]
        at_tier = next(c for c in checks if same_width(c.width, tier_widths[tier]))
        choices.append(
            DeviceChoice(
                device, best.width, tier, tier_widths[tier], at_tier.round_seconds, at_tier.peak_memory_bytes, "",
                checks,
            )  # fmt: skip
        )
    return TierPlan(model, deadline, k, tier_widths, tuple(choices))


def width_checks(
    rows: Sequence[dict[str, Any]],
    models: Mapping[str, DeviceModels],
    device: str,
    model: str,
    candidates: Sequence[float],
    batch: int | None,
    backend: str | None,
    deadline_s: float,
    budget: int | None,
    round_seconds: Callable[[float], float],
    *,
    energy: Callable[[float], float | None] | None = None,
    energy_budget_j: float | None = None,
) -> tuple[WidthCheck, ...] | str:
    """Return how every candidate width fares on one device (smallest first), or why it cannot be checked.

    Parameters
    ----------
    rows : sequence of dict
        Profile rows (`fl.scheduling.rows.profile_rows`).
    models : mapping of str to DeviceModels
        The rows' fitted models.
    device, model : str
    candidates : sequence of float
        Widths, smallest first.
    batch : int or None
    backend : str or None
    deadline_s : float
    budget : int or None
        The device's memory budget in bytes (None: unconstrained).
    round_seconds : callable
        ``width -> predicted round seconds`` of this device.
    energy : callable, optional
        ``width -> predicted joules`` of this device's client round (None: not predicted).
    energy_budget_j : float, optional
        Energy budget per client round in joules.

    Returns
    -------
    tuple of WidthCheck or str
        The reason when the device has no usable profile of ``model``.
    """
    mine = select(rows, device=device, batch=batch)
    if not mine:
        where = f"batch {batch}, backend {backend or 'any'}" if batch is not None else f"backend {backend or 'any'}"
        return f"no measured profile of {model} ({where})"
    if device not in models:
        return f"no successful measurement of {model}: latest cells {status_summary(mine)}"
    dm = models[device]
    try:
        key = dm.key(model, batch, backend)
    except KeyError as exc:
        return str(exc.args[0])
    latency = dm.latency[key]
    memory = dm.memory.get(key)
    oom = {float(r["width"]) for r in mine if r.get("status") == OUT_OF_MEMORY}
    checks = []
    for w in candidates:
        flops = width_flops(model, w, rows)
        estimate = predicted_latency(latency, model, w, rows)
        seconds = float(round_seconds(w))
        peak = None if memory is None else predicted_peak(memory, model, w, rows).value
        notes = []
        fits_deadline = seconds <= deadline_s
        if not fits_deadline:
            notes.append(f"predicted round {seconds:.3g} s > deadline {deadline_s:.3g} s")
            if estimate.extrapolated:
                notes.append(estimate.note)
        fits_memory = True
        if any(same_width(w, o) for o in oom):
            fits_memory = False
            notes.append("measured out of memory")
        elif budget is not None and peak is not None and peak > budget:
            fits_memory = False
            notes.append(f"predicted peak memory {peak / 2**20:.1f} MiB > budget {budget / 2**20:.1f} MiB")
        joules = None if energy is None else energy(w)
        fits_energy = energy_budget_j is None or joules is None or joules <= energy_budget_j
        if not fits_energy:
            notes.append(f"predicted energy {joules:.3g} J > budget {energy_budget_j:.3g} J")
        checks.append(
            WidthCheck(
                w, flops, seconds, peak, fits_deadline, fits_memory, "; ".join(notes), estimate.relative,
                estimate.extrapolated, joules, fits_energy,
            )  # fmt: skip
        )
    return tuple(checks)


@dataclass(frozen=True)
class Capacities:
    """A `TierPlan`'s tier widths snapped down to a method's level set.

    Attributes
    ----------
    levels : tuple of float
        The level set, widest first.
    capacity : dict of str to float
        Per included device: the largest level <= its tier's width (FjORD's capacity,
        HeteroFL / FedRolex's capacity).
    tier : dict of str to int
        Per device in ``capacity``: its tier index in the plan.
    left_out : dict of str to str
        Devices of the plan with no capacity, and why (excluded by the plan, or tier
        width below every level).
    """

    levels: tuple[float, ...]
    capacity: dict[str, float] = field(default_factory=dict)
    tier: dict[str, int] = field(default_factory=dict)
    left_out: dict[str, str] = field(default_factory=dict)


def uniform_levels(k: int) -> tuple[float, ...]:
    """Return FjORD's uniform-k width set ``{1/k, 2/k, ..., 1}``, widest first.

    Parameters
    ----------
    k : int
        Number of widths (>= 1; the FjORD paper uses 5).

    Returns
    -------
    tuple of float
    """
    k = count(k, "k")
    return tuple(i / k for i in range(k, 0, -1))


def capacities_for(plan: TierPlan, levels: Iterable[float]) -> Capacities:
    """Snap every tier's width down to ``levels``: FjORD's or HeteroFL / FedRolex's capacity.

    Parameters
    ----------
    plan : TierPlan
    levels : iterable of float
        The method's level set in (0, 1], e.g. `HETEROFL_LEVELS` or ``uniform_levels(5)``.

    Returns
    -------
    Capacities
        Snapping down keeps each device within its deadline and memory budget.
    """
    ordered = tuple(sorted(set(check_widths(levels, "levels")), reverse=True))
    out = Capacities(ordered)
    for c in plan.choices:
        if c.excluded or c.tier_width is None or c.tier is None:
            out.left_out[c.device] = c.reason
            continue
        below = [lv for lv in ordered if lv <= c.tier_width * (1 + WIDTH_TOL)]
        if not below:
            out.left_out[c.device] = f"tier width {c.tier_width:g} is below the smallest level {ordered[-1]:g}"
            continue
        out.capacity[c.device] = below[0]
        out.tier[c.device] = c.tier
    return out
