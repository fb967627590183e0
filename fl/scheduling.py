"""Scheduling FL clients from measured device profiles (pure functions over profile rows).

The profile store measures, per device, the per-image training latency and peak memory
of a model at several widths (`harness.store.ProfileStore.latest_cells`). This module
turns those rows into the three decisions the FL methods need:

Tier assignment (FjORD / HeteroFL / FedRolex), `assign_tiers`
    For every device the largest candidate width whose predicted round time meets the
    deadline and whose predicted peak memory fits the device's memory budget::

        round_seconds(w) = overhead_s + latency_us(flops(w)) * 1e-6 * examples * epochs

    where ``latency_us`` is the device's fitted line ``a + b * train_flops``
    (`harness.latency.fit`, reused, not refitted here) and the peak memory is the
    device's fitted memory model (`harness.latency.MemoryModel`). A width whose latest
    cell on the device failed with ``"out of memory"`` never fits. Devices with no width
    that fits are *excluded* with the reason. The chosen widths of the remaining devices
    are then grouped into ``k`` tiers by exact 1-D k-means (dynamic programming over the
    sorted distinct widths, weighted by how many devices chose each; deterministic, ties
    go to the earlier split). **Decision:** a tier's width is the *smallest* width chosen
    by its members, so that every member still meets the deadline and its memory budget
    at the tier's width (a centroid would overload the tier's slower members). Tier 0 is
    the widest. `capacities_for` snaps each tier's width *down* to a method's level set:
    `HETEROFL_LEVELS` (1, 1/2, 1/4, 1/8, 1/16; also FedRolex's) or `uniform_levels`
    ``(k)`` = {1/k, ..., 1} (FjORD's p_max).

Straggler sizing (FLuID), `straggler_width`
    The device's measured per-image latency at its measured widths, as a function of
    training FLOPs, interpolated piecewise linearly between measured widths (beyond the
    measured range: the nearest segment, extended; a single measured width: latency
    proportional to FLOPs). The straggler's measured end-to-end time sets the absolute
    level and the curve the ratio::

        predicted_seconds(w) = current_seconds * L(flops(w)) / L(flops(current_width))

    and the largest available width with ``predicted_seconds(w) <= target_seconds`` is
    chosen. Fitted models (`harness.latency.DeviceModels`) may be given instead of rows;
    their line ``a + b * FLOPs`` is then ``L``. A device with no usable profile falls
    back to FLuID's linear rule (paper, Appendix A.3: time is close to linear in size):
    the full-model time is re-estimated as ``current_seconds / current_width`` and ``r``
    is the available width closest to ``1 / speed-up = target_seconds * current_width /
    current_seconds`` (ties: the smaller width).

FLOPs-budget calibration (FedDrop), `flops_budget_ratio` / `budgets_for_fleet`
    The per-image time budget ``t = (round_time_budget_s - overhead_s) / (examples *
    epochs)`` solved on the device's fitted line ``a + b * F = t`` gives the affordable
    training FLOPs per example ``F``; the budget ratio is ``r = F / flops(dense)``,
    clamped to (0, 1]. The ratio assumes that fewer FLOPs take proportionally less time
    on the line, which holds for width-sliced sub-models. FedDrop's SyncDrop masks fed
    to a dense graph save no time without sparse kernels (see DESIGN.md): the ratio is
    then the *expected FLOPs* budget of eq. 5, not a measured time.

Rows
    Every function takes profiles as a pandas DataFrame (``latest_cells()``), an
    iterable of row mappings, or the strategies' ``Profiles`` mapping ``{device: rows}``
    (`profiles_from_store`). Rows need ``device, model, width, batch, backend,
    median_us`` (``status``, ``train_flops``, ``peak_memory_bytes``, ``params``,
    ``activation_elements`` when present); rows whose status is not ``"ok"`` are
    ignored for fitting. FLOPs (and memory features) at a width come from the rows that
    measured that width, otherwise from the zoo (`harness.latency.train_flops_per_example`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from exporters.errors import InputError
from harness.latency import (
    DeviceModels,
    finite_positive,
    fit,
    footprint_bytes,
    memory_features,
    train_flops_per_example,
    usable_rows,
)

if TYPE_CHECKING:
    from devices.fleet import Fleet
    from harness.store import ProfileStore

#: HeteroFL / FedRolex capacity levels 'a'..'e'.
HETEROFL_LEVELS: tuple[float, ...] = (1.0, 0.5, 0.25, 0.125, 0.0625)

#: Status of a cell that ran out of memory (`harness.records.Status`).
OUT_OF_MEMORY = "out of memory"

#: Relative tolerance when comparing widths and snapping to levels.
_WIDTH_TOL = 1e-9

Rows = Any  # pandas DataFrame, Iterable[Mapping[str, Any]] or Mapping[str, Sequence[Mapping[str, Any]]]
StragglerRule = Literal["curve", "linear"]


# ---------------------------------------------------------------------------- rows


def profile_rows(profiles: Rows) -> list[dict[str, Any]]:
    """Return profiles in any accepted form as a flat list of row dicts.

    Parameters
    ----------
    profiles : pandas.DataFrame, iterable of mapping, mapping of str to rows, or None
        A ``{device: rows}`` mapping fills a row's missing ``device`` with its key.
        ``None`` gives no rows.

    Returns
    -------
    list of dict
        pandas missing values (``pd.NA``) become ``None``.
    """
    if profiles is None:
        return []
    if hasattr(profiles, "to_dict") and hasattr(profiles, "columns"):
        records = [dict(r) for r in profiles.to_dict("records")]
    elif isinstance(profiles, Mapping):
        records = []
        for device, rows in profiles.items():
            for r in rows:
                row = dict(r)
                row.setdefault("device", device)
                records.append(row)
    else:
        records = [dict(r) for r in profiles]
    return [{k: _clean(v) for k, v in r.items()} for r in records]


def _clean(value: Any) -> Any:
    if value is None or isinstance(value, (str, bytes, bool, int, float)):
        return value
    import pandas as pd

    return None if value is pd.NA or value is pd.NaT else value


def _same_width(a: float, b: float) -> bool:
    return math.isclose(float(a), float(b), rel_tol=_WIDTH_TOL, abs_tol=_WIDTH_TOL)


def _select(
    rows: Iterable[Mapping[str, Any]],
    *,
    device: str | None = None,
    model: str | None = None,
    batch: int | None = None,
    backend: str | None = None,
) -> list[dict[str, Any]]:
    return [
        dict(r)
        for r in rows
        if (device is None or str(r.get("device")) == device)
        and (model is None or str(r.get("model")) == model)
        and (batch is None or int(r.get("batch", -1)) == int(batch))
        and (backend is None or str(r.get("backend")) == backend)
    ]


def _unique_config(rows: Sequence[Mapping[str, Any]], what: str) -> tuple[str, int, str]:
    configs = sorted({(str(r["model"]), int(r["batch"]), str(r["backend"])) for r in rows})
    if len(configs) != 1:
        raise InputError(
            f"{what}: profiles hold {len(configs)} configurations {configs}; give model, batch and backend"
        )
    return configs[0]


def _status_summary(rows: Sequence[Mapping[str, Any]]) -> str:
    counts: dict[str, int] = {}
    for r in rows:
        status = r.get("status")
        status = "no latency" if status in (None, "ok") or isinstance(status, float) else str(status)
        counts[status] = counts.get(status, 0) + 1
    return ", ".join(f"{n} x {s}" for s, n in sorted(counts.items()))


def width_flops(model: str, width: float, rows: Iterable[Mapping[str, Any]] = ()) -> float:
    """Return training FLOPs per example of ``model`` at ``width``: measured rows first, then the zoo.

    Parameters
    ----------
    model : str
        Model name.
    width : float
        Width rate in (0, 1].
    rows : iterable of mapping
        Profile rows; the median ``train_flops`` of the rows of ``model`` at ``width``
        is used when present.

    Returns
    -------
    float

    Raises
    ------
    InputError
        If no row gives the FLOPs and ``model`` is not a zoo model.
    """
    found = [
        float(r["train_flops"])
        for r in rows
        if str(r.get("model")) == model and _same_width(r["width"], width) and finite_positive(r.get("train_flops"))
    ]
    if found:
        return float(np.median(found))
    try:
        return float(train_flops_per_example(model, float(width)))
    except InputError as exc:
        raise InputError(f"width {width} of model {model!r}: no measured train_flops and {exc}") from None


def _memory_footprint(model: str, width: float, batch: int, bytes_per_param: float, rows: Sequence[Any]) -> float:
    for r in rows:
        if (
            str(r.get("model")) == model
            and _same_width(r["width"], width)
            and finite_positive(r.get("params"))
            and r.get("activation_elements") is not None
        ):
            return footprint_bytes(float(r["params"]), float(r["activation_elements"]), batch, bytes_per_param)
    params, activations = memory_features(model, float(width))
    return footprint_bytes(params, activations, batch, bytes_per_param)


def _check_widths(widths: Iterable[float], name: str = "widths") -> tuple[float, ...]:
    values = tuple(float(w) for w in widths)
    if not values:
        raise InputError(f"{name} is empty")
    bad = [w for w in values if not (math.isfinite(w) and 0 < w <= 1)]
    if bad:
        raise InputError(f"{name} must lie in (0, 1]; got {bad}")
    return values


def _positive(value: float, name: str) -> float:
    if not (math.isfinite(float(value)) and float(value) > 0):
        raise InputError(f"{name} must be a finite number > 0; got {value!r}")
    return float(value)


def _overhead(overhead_s: float | Mapping[str, float], device: str) -> float:
    value = float(overhead_s.get(device, 0.0)) if isinstance(overhead_s, Mapping) else float(overhead_s)
    if not (math.isfinite(value) and value >= 0):
        raise InputError(f"round overhead of {device!r} must be a finite number >= 0; got {value!r}")
    return value


# ---------------------------------------------------------------------------- tier assignment


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
    """

    width: float
    train_flops: float
    round_seconds: float
    peak_memory_bytes: float | None
    fits_deadline: bool
    fits_memory: bool
    note: str = ""

    @property
    def fits(self) -> bool:
        """Whether the width meets both the deadline and the memory budget."""
        return self.fits_deadline and self.fits_memory


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


def kmeans_1d(values: Sequence[float], k: int) -> tuple[int, ...]:
    """Cluster 1-D values into at most ``k`` contiguous groups minimising the within-group SSE.

    Exact, by dynamic programming over the sorted distinct values weighted by their
    multiplicity (equal values always share a group): ``D[c][j]`` = least SSE of the
    first ``j`` distinct values in ``c`` groups, ``D[c][j] = min_i D[c-1][i] + SSE(i..j-1)``.
    Ties go to the smallest split index, so the result is deterministic.

    Parameters
    ----------
    values : sequence of float
        Values to cluster (any order).
    k : int
        Number of groups wanted (>= 1); ``min(k, distinct values)`` are formed.

    Returns
    -------
    tuple of int
        Group of each value in input order, 0 = the group of the largest values.

    Raises
    ------
    InputError
        If ``k < 1`` or a value is not finite.
    """
    if int(k) != k or k < 1:
        raise InputError(f"k must be an integer >= 1; got {k!r}")
    xs = [float(v) for v in values]
    if not xs:
        return ()
    if not all(math.isfinite(v) for v in xs):
        raise InputError(f"values to cluster must be finite; got {xs}")
    distinct = sorted(set(xs))
    m = len(distinct)
    weight = np.array([xs.count(v) for v in distinct], dtype=float)
    x = np.array(distinct)
    cw = np.concatenate([[0.0], np.cumsum(weight)])
    cx = np.concatenate([[0.0], np.cumsum(weight * x)])
    cxx = np.concatenate([[0.0], np.cumsum(weight * x * x)])

    def sse(i: int, j: int) -> float:  # distinct values i..j-1
        w, s, ss = cw[j] - cw[i], cx[j] - cx[i], cxx[j] - cxx[i]
        return max(0.0, float(ss - s * s / w))

    groups = min(int(k), m)
    cost = np.full((groups + 1, m + 1), np.inf)
    split = np.zeros((groups + 1, m + 1), dtype=int)
    cost[0][0] = 0.0
    for c in range(1, groups + 1):
        for j in range(c, m + 1):
            for i in range(c - 1, j):
                candidate = cost[c - 1][i] + sse(i, j)
                if candidate < cost[c][j] - 1e-15:
                    cost[c][j], split[c][j] = candidate, i
    # Walk the splits back: group index counted from the smallest values.
    label_of_distinct = [0] * m
    j = m
    for c in range(groups, 0, -1):
        i = int(split[c][j])
        for t in range(i, j):
            label_of_distinct[t] = groups - c  # the last group (largest values) gets 0
        j = i
    index = {v: label_of_distinct[t] for t, v in enumerate(distinct)}
    return tuple(index[v] for v in xs)


def assign_tiers(
    profiles: Rows,
    model: str,
    widths: Iterable[float],
    *,
    deadline_s: float,
    examples_per_round: Mapping[str, int],
    epochs: int,
    batch: int | None,
    memory_budget_bytes: Mapping[str, int] | None,
    k: int,
    backend: str = "ort",
    round_overhead_s: float | Mapping[str, float] = 0.0,
) -> TierPlan:
    """Choose each device's largest width that meets the deadline and memory budget; cluster into tiers.

    Parameters
    ----------
    profiles : DataFrame, rows or ``{device: rows}``
        Stored profile rows (see the module docstring); failed cells give the reason of
        an exclusion, and an ``"out of memory"`` cell rules its width out.
    model : str
        Model name.
    widths : iterable of float
        Candidate widths in (0, 1].
    deadline_s : float
        Round deadline in seconds.
    examples_per_round : mapping of str to int
        Training examples each device's client holds; its keys are the devices planned.
    epochs : int
        Local epochs per round.
    batch : int or None
        Training batch size of the profile to use; ``None`` when each device was
        measured at one batch size only.
    memory_budget_bytes : mapping of str to int, or None
        Memory budget per device; a device without an entry (or ``None``) is unconstrained.
    k : int
        Number of tiers.
    backend : str
        Profile backend (``"ort"`` or ``"torch"``).
    round_overhead_s : float or mapping of str to float
        Fixed per-round cost (transfer, set-up) added to every predicted round time,
        one value for all devices or per device (missing devices: 0).

    Returns
    -------
    TierPlan

    Raises
    ------
    InputError
        On a bad width, deadline, epoch count, example count or ``k``.
    """
    candidates = tuple(sorted(set(_check_widths(widths))))
    deadline = _positive(deadline_s, "deadline_s")
    if int(epochs) != epochs or epochs < 1:
        raise InputError(f"epochs must be an integer >= 1; got {epochs!r}")
    if int(k) != k or k < 1:
        raise InputError(f"k must be an integer >= 1; got {k!r}")
    rows = _select(profile_rows(profiles), model=model, backend=backend)
    models = fit(rows)
    picks: dict[str, tuple[WidthCheck, tuple[WidthCheck, ...]] | str] = {}
    for device in sorted(examples_per_round):
        examples = examples_per_round[device]
        if int(examples) != examples or examples < 1:
            raise InputError(f"examples_per_round[{device!r}] must be an integer >= 1; got {examples!r}")
        budget = None if memory_budget_bytes is None else memory_budget_bytes.get(device)
        picks[device] = _device_checks(
            rows,
            models,
            device,
            model,
            candidates,
            batch,
            backend,
            round_seconds_per_us=1e-6 * int(examples) * int(epochs),
            overhead_s=_overhead(round_overhead_s, device),
            deadline_s=deadline,
            budget=budget,
        )
    fitting = {d: p[0].width for d, p in picks.items() if not isinstance(p, str)}
    names = sorted(fitting)
    labels = dict(zip(names, kmeans_1d([fitting[d] for d in names], k), strict=True))
    n_tiers = len(set(labels.values()))
    tier_widths = tuple(min(fitting[d] for d in names if labels[d] == t) for t in range(n_tiers))
    choices = []
    for device, pick in picks.items():
        if isinstance(pick, str):
            choices.append(DeviceChoice(device, None, None, None, None, None, pick))
            continue
        best, checks = pick
        tier = labels[device]
        at_tier = next(c for c in checks if _same_width(c.width, tier_widths[tier]))
        choices.append(
            DeviceChoice(
                device,
                best.width,
                tier,
                tier_widths[tier],
                at_tier.round_seconds,
                at_tier.peak_memory_bytes,
                "",
                checks,
            )
        )
    return TierPlan(model, deadline, int(k), tier_widths, tuple(choices))


def _device_checks(
    rows: Sequence[dict[str, Any]],
    models: Mapping[str, DeviceModels],
    device: str,
    model: str,
    candidates: tuple[float, ...],
    batch: int | None,
    backend: str,
    *,
    round_seconds_per_us: float,
    overhead_s: float,
    deadline_s: float,
    budget: int | None,
) -> tuple[WidthCheck, tuple[WidthCheck, ...]] | str:
    """Return ``(best fitting check, all checks)`` of one device, or why it is excluded."""
    mine = _select(rows, device=device, batch=batch)
    if not mine:
        where = f"batch {batch}, backend {backend}" if batch is not None else f"backend {backend}"
        return f"no measured profile of {model} ({where})"
    if device not in models:
        return f"no successful measurement of {model}: latest cells {_status_summary(mine)}"
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
        seconds = overhead_s + latency.predict(flops) * round_seconds_per_us
        peak = (
            None
            if memory is None
            else memory.predict(_memory_footprint(model, w, key[1], memory.bytes_per_param, rows))
        )
        notes = []
        fits_deadline = seconds <= deadline_s
        if not fits_deadline:
            notes.append(f"predicted round {seconds:.3g} s > deadline {deadline_s:.3g} s")
        fits_memory = True
        if any(_same_width(w, o) for o in oom):
            fits_memory = False
            notes.append("measured out of memory")
        elif budget is not None and peak is not None and peak > budget:
            fits_memory = False
            notes.append(f"predicted peak memory {peak / 2**20:.1f} MiB > budget {budget / 2**20:.1f} MiB")
        checks.append(WidthCheck(w, flops, seconds, peak, fits_deadline, fits_memory, "; ".join(notes)))
    fitting = [c for c in checks if c.fits]
    if not fitting:
        return f"no width fits; smallest width {checks[0].width:g}: {checks[0].note}"
    return fitting[-1], tuple(checks)


@dataclass(frozen=True)
class Capacities:
    """A `TierPlan`'s tier widths snapped down to a method's level set.

    Attributes
    ----------
    levels : tuple of float
        The level set, widest first.
    capacity : dict of str to float
        Per included device: the largest level <= its tier's width (FjORD's p_max,
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
    if int(k) != k or k < 1:
        raise InputError(f"k must be an integer >= 1; got {k!r}")
    return tuple(i / k for i in range(int(k), 0, -1))


def capacities_for(plan: TierPlan, levels: Iterable[float]) -> Capacities:
    """Snap every tier's width down to ``levels``: FjORD's p_max or HeteroFL / FedRolex's capacity.

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
    ordered = tuple(sorted(set(_check_widths(levels, "levels")), reverse=True))
    out = Capacities(ordered)
    for c in plan.choices:
        if c.excluded or c.tier_width is None or c.tier is None:
            out.left_out[c.device] = c.reason
            continue
        below = [lv for lv in ordered if lv <= c.tier_width * (1 + _WIDTH_TOL)]
        if not below:
            out.left_out[c.device] = f"tier width {c.tier_width:g} is below the smallest level {ordered[-1]:g}"
            continue
        out.capacity[c.device] = below[0]
        out.tier[c.device] = c.tier
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


# ---------------------------------------------------------------------------- FLuID straggler sizing


@dataclass(frozen=True)
class StragglerChoice:
    """The sub-model width chosen for a straggler.

    Attributes
    ----------
    device : str
    width : float
        Chosen available width.
    rule : {"curve", "linear"}
        ``"curve"``: from the device's measured latency-vs-FLOPs curve; ``"linear"``:
        FLuID's rule, time proportional to width (no profile).
    predicted_seconds : float
        Predicted round time at ``width`` under the rule used.
    speedup : float
        Required speed-up of the full model, ``(current_seconds / current_width) / target_seconds``.
    meets_target : bool
        Whether ``predicted_seconds <= target_seconds`` (False when even the smallest
        available width is too slow under the curve, or the closest width of the
        linear rule is above the needed size).
    """

    device: str
    width: float
    rule: StragglerRule
    predicted_seconds: float
    speedup: float
    meets_target: bool


def latency_curve(
    profiles: Rows, device: str, model: str | None = None, batch: int | None = None, backend: str | None = None
) -> Callable[[float], float] | None:
    """Return the device's measured per-image latency as a function of training FLOPs, or None.

    From rows: piecewise linear between the measured widths (median over repeated
    cells of a width), extended along the nearest segment outside them (floored at
    1 % of the nearest measured latency, so that a noisy falling end segment never
    predicts zero); with one measured width, latency is proportional to FLOPs. From
    fitted models (`harness.latency.DeviceModels`): the fitted line ``a + b * FLOPs``.

    Parameters
    ----------
    profiles : DataFrame, rows, ``{device: rows}``, DeviceModels or ``{device: DeviceModels}``
    device : str
    model, batch, backend : optional
        Select the configuration; the device's usable rows must then hold exactly one.

    Returns
    -------
    callable or None
        ``None`` when the device has no usable row (or no fitted model).

    Raises
    ------
    InputError
        If the device's rows or models hold several configurations matching the selection.
    """
    found = _curve(profiles, device, model, batch, backend)
    return None if found is None else found[0]


def _is_models(profiles: Any) -> bool:
    return isinstance(profiles, DeviceModels) or (
        isinstance(profiles, Mapping) and bool(profiles) and all(isinstance(v, DeviceModels) for v in profiles.values())
    )


def _curve(
    profiles: Any, device: str, model: str | None, batch: int | None, backend: str | None
) -> tuple[Callable[[float], float], str, list[dict[str, Any]]] | None:
    """Return ``(latency_us of FLOPs, model name, rows for FLOPs look-ups)`` or None."""
    if _is_models(profiles):
        dm = profiles if isinstance(profiles, DeviceModels) else profiles.get(device)
        if dm is None or dm.device != device:
            return None
        keys = [
            key
            for key in dm.latency
            if (model is None or key[0] == model)
            and (batch is None or key[1] == batch)
            and (backend is None or key[2] == backend)
        ]
        if not keys:
            return None
        if len(keys) > 1:
            raise InputError(
                f"device {device!r}: fitted models hold {len(keys)} configurations {sorted(keys)}; "
                "give model, batch and backend"
            )
        return dm.latency[keys[0]].predict, keys[0][0], []
    rows = _select(usable_rows(profile_rows(profiles)), device=device, model=model, batch=batch, backend=backend)
    if not rows:
        return None
    name, _, _ = _unique_config(rows, f"device {device!r}")
    by_width: dict[float, list[float]] = {}
    for r in rows:
        by_width.setdefault(float(r["width"]), []).append(float(r["median_us"]))
    points = sorted((width_flops(name, w, rows), float(np.median(v))) for w, v in by_width.items())
    fx = np.array([p[0] for p in points])
    fy = np.array([p[1] for p in points])

    def curve(flops: float) -> float:
        f = float(flops)
        if fx.size == 1:
            return float(fy[0] * f / fx[0])
        if fx[0] <= f <= fx[-1]:
            return float(np.interp(f, fx, fy))
        i = 0 if f < fx[0] else fx.size - 2
        slope = (fy[i + 1] - fy[i]) / (fx[i + 1] - fx[i])
        anchor = i if f < fx[0] else i + 1
        return float(max(fy[anchor] + slope * (f - fx[anchor]), 0.01 * fy[anchor]))

    return curve, name, rows


def straggler_width(
    profiles: Rows,
    device: str,
    target_seconds: float,
    current_seconds: float,
    current_width: float,
    available_widths: Iterable[float],
    *,
    model: str | None = None,
    batch: int | None = None,
    backend: str | None = None,
) -> StragglerChoice:
    """Size a FLuID straggler's sub-model from the device's measured latency curve.

    Parameters
    ----------
    profiles : DataFrame, rows, ``{device: rows}``, DeviceModels, ``{device: DeviceModels}`` or None
        Profile rows (their measured curve is interpolated) or fitted models (their
        line is used); ``None``, or nothing for ``device``, selects the linear rule.
    device : str
        The straggler's device.
    target_seconds : float
        FLuID's target time (the next-slowest client's end-to-end time).
    current_seconds : float
        The straggler's measured end-to-end time at ``current_width``.
    current_width : float
        The width it trained at when measured (1.0 for the full model).
    available_widths : iterable of float
        Sub-model sizes to choose from, in (0, 1].
    model, batch, backend : optional
        Select the profile configuration when the rows hold several.

    Returns
    -------
    StragglerChoice
        Curve rule: the largest available width with ``current_seconds * L(w) /
        L(current_width) <= target_seconds`` (the smallest available width, with
        ``meets_target=False``, when none meets it). Linear rule: the available width
        closest to ``target_seconds * current_width / current_seconds`` (ties: the
        smaller).

    Raises
    ------
    InputError
        On non-positive times or widths outside (0, 1].
    """
    target = _positive(target_seconds, "target_seconds")
    current = _positive(current_seconds, "current_seconds")
    (cur_w,) = _check_widths([current_width], "current_width")
    available = tuple(sorted(set(_check_widths(available_widths, "available_widths"))))
    speedup = current / cur_w / target
    found = _curve(profiles, device, model, batch, backend)
    if found is None:
        wanted = target * cur_w / current
        width = min(available, key=lambda w: (abs(w - wanted), w))
        predicted = current * width / cur_w
        return StragglerChoice(device, width, "linear", predicted, speedup, predicted <= target * (1 + _WIDTH_TOL))
    curve, name, rows = found
    base = curve(width_flops(name, cur_w, rows))
    seconds = {w: current * curve(width_flops(name, w, rows)) / base for w in available}
    meeting = [w for w in available if seconds[w] <= target * (1 + _WIDTH_TOL)]
    width = meeting[-1] if meeting else available[0]
    return StragglerChoice(device, width, "curve", seconds[width], speedup, bool(meeting))


# ---------------------------------------------------------------------------- FedDrop FLOPs budget


@dataclass(frozen=True)
class BudgetRatio:
    """The FLOPs budget ratio a device affords in a round time budget.

    Attributes
    ----------
    device : str
    ratio : float or None
        ``r`` in (0, 1]: affordable over dense training FLOPs per example; ``None`` when
        nothing fits (the fitted intercept alone exceeds the per-image budget) or the
        device has no usable profile.
    affordable_flops : float or None
        Solution ``F`` of ``a + b * F = per_image_budget_us`` (may exceed the dense FLOPs).
    dense_flops : float
        Training FLOPs per example of the full-width model.
    per_image_budget_us : float
        ``1e6 * (round_time_budget_s - overhead_s) / (examples * epochs)``.
    smallest_measured_fits : bool
        Whether the smallest measured width fits in the budget; when False, a positive
        ``ratio`` is an extrapolation below every measured width.
    note : str
        Human-readable explanation when ``ratio`` is None, clamped or extrapolated.
    """

    device: str
    ratio: float | None
    affordable_flops: float | None
    dense_flops: float
    per_image_budget_us: float
    smallest_measured_fits: bool
    note: str = ""


def flops_budget_ratio(
    profiles: Rows,
    device: str,
    model: str,
    round_time_budget_s: float,
    examples: int,
    epochs: int,
    *,
    batch: int | None = None,
    backend: str = "ort",
    round_overhead_s: float = 0.0,
) -> BudgetRatio:
    """Return the fraction of dense training FLOPs ``device`` can afford in the round time budget.

    Parameters
    ----------
    profiles : DataFrame, rows or ``{device: rows}``
    device : str
    model : str
    round_time_budget_s : float
        Seconds a round may take on the device.
    examples : int
        Local training examples.
    epochs : int
        Local epochs.
    batch : int, optional
        Profile batch size (needed when the device was measured at several).
    backend : str
    round_overhead_s : float
        Fixed per-round cost subtracted from the budget before solving.

    Returns
    -------
    BudgetRatio
        See the module docstring for the equation; ``ratio = min(1, F / dense)``.

    Raises
    ------
    InputError
        On a non-positive budget, examples or epochs.
    """
    budget = _positive(round_time_budget_s, "round_time_budget_s")
    if int(examples) != examples or examples < 1:
        raise InputError(f"examples must be an integer >= 1; got {examples!r}")
    if int(epochs) != epochs or epochs < 1:
        raise InputError(f"epochs must be an integer >= 1; got {epochs!r}")
    overhead = _overhead(round_overhead_s, device)
    rows = _select(profile_rows(profiles), model=model, backend=backend)
    dense = width_flops(model, 1.0, rows)
    per_image_us = 1e6 * (budget - overhead) / (int(examples) * int(epochs))
    mine = _select(usable_rows(rows), device=device, batch=batch)
    if not mine:
        return BudgetRatio(device, None, None, dense, per_image_us, False, f"no usable profile of {model} on {device}")
    try:
        dm = fit(mine)[device]
        latency = dm.latency[dm.key(model, batch, backend)]
    except KeyError as exc:
        raise InputError(str(exc.args[0])) from None
    a, b = latency.intercept_us, latency.slope_us_per_flop
    smallest = min(width_flops(model, float(r["width"]), rows) for r in mine)
    smallest_fits = latency.predict(smallest) <= per_image_us
    if b <= 0:  # a flat (or falling) fit: time does not depend on FLOPs
        fits = a <= per_image_us
        note = "fitted latency does not grow with FLOPs" + ("" if fits else f"; intercept {a:.4g} us > budget")
        return BudgetRatio(device, 1.0 if fits else None, math.inf if fits else None, dense, per_image_us, fits, note)
    affordable = (per_image_us - a) / b
    if affordable <= 0:
        note = f"fixed per-image cost {a:.4g} us alone exceeds the per-image budget {per_image_us:.4g} us"
        return BudgetRatio(device, None, affordable, dense, per_image_us, False, note)
    ratio = min(1.0, affordable / dense)
    note = ""
    if ratio == 1.0 and affordable > dense:
        note = f"dense model fits ({affordable / dense:.3g}x the dense FLOPs affordable); clamped to 1"
    elif not smallest_fits:
        note = (
            f"even the smallest measured width ({smallest:.4g} FLOPs) does not fit; "
            f"ratio {ratio:.3g} is extrapolated below the measured range"
        )
    return BudgetRatio(device, ratio, affordable, dense, per_image_us, smallest_fits, note)


def budgets_for_fleet(
    profiles: Rows,
    model: str,
    round_time_budget_s: float,
    examples_per_round: Mapping[str, int],
    epochs: int,
    *,
    batch: int | None = None,
    backend: str = "ort",
    round_overhead_s: float | Mapping[str, float] = 0.0,
) -> dict[str, BudgetRatio]:
    """Return `flops_budget_ratio` for every device of ``examples_per_round``.

    Parameters
    ----------
    profiles : DataFrame, rows or ``{device: rows}``
    model : str
    round_time_budget_s : float
    examples_per_round : mapping of str to int
        Local examples per device; its keys are the devices returned.
    epochs : int
    batch : int, optional
    backend : str
    round_overhead_s : float or mapping of str to float
        One fixed cost for all devices or one per device (missing: 0).

    Returns
    -------
    dict of str to BudgetRatio
        Sorted by device name.
    """
    rows = profile_rows(profiles)
    return {
        device: flops_budget_ratio(
            rows,
            device,
            model,
            round_time_budget_s,
            examples_per_round[device],
            epochs,
            batch=batch,
            backend=backend,
            round_overhead_s=_overhead(round_overhead_s, device),
        )
        for device in sorted(examples_per_round)
    }


# ---------------------------------------------------------------------------- loading


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
    for r in _select(profile_rows(frame), model=model, batch=batch, backend=backend):
        if r.get("status") == "ok":
            out.setdefault(str(r["device"]), []).append(r)
    return out


__all__ = [
    "HETEROFL_LEVELS",
    "BudgetRatio",
    "Capacities",
    "DeviceChoice",
    "StragglerChoice",
    "TierPlan",
    "WidthCheck",
    "assign_tiers",
    "budgets_for_fleet",
    "capacities_for",
    "flops_budget_ratio",
    "kmeans_1d",
    "latency_curve",
    "memory_budgets_from_fleet",
    "profile_rows",
    "profiles_from_store",
    "straggler_width",
    "uniform_levels",
    "width_flops",
]
