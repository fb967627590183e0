"""The plan of an FL run from measured profiles: each device's width, tier, budget and predicted round.

One planner serves ``fleetbench plan``, ``fl run --plan`` and the demo. It reads the
store's latest cells and round-cost measurements, matches each device's profile to the
configuration it trains with (`fl.scheduling.configs`: model, batch, backend, optimizer,
threads; the nearest otherwise, with a warning naming the difference), fits the latency
models once, and builds the round-cost model from them (`harness.roundcost.round_cost`)::

    round(device, width) = fixed + steps * batch * latency(device, arch(width)) + transfers(width)

with ``steps = epochs * ceil(examples / batch)``. A FjORD client draws a width at or below
its capacity at every step, so its round is the mean of the rounds at those widths, its
payload its capacity's. Then, by strategy:

- FjORD, HeteroFL, FedRolex: each device's widest level whose predicted round meets the
  deadline and whose predicted peak memory fits its budget (`fl.scheduling.width_checks`),
  the devices clustered into tiers (`fl.scheduling.assign_tiers`); a device no level fits
  gets the smallest, and the plan says by how much it misses.
- FedDrop: the FLOPs budget ratio whose predicted round (dense transfers) meets the
  deadline (`fl.scheduling.budgets.round_budget_ratio`), and the uniform keep probability
  it gives.
- FLuID: the straggler(s) by predicted full-width round, the starting target (the slowest
  other device's full round) and each straggler's sub-model width, the one whose predicted
  round is nearest the target.

Deadline policies: ``auto`` (the median device's full-width round), a number of seconds,
``pNN`` (the NNth-percentile device's full-width round: that share of the devices meets full
width), or ``none`` (no deadline: an energy budget alone limits the widths). A FjORD device's
full-width round is its client round at full capacity, the mean over the widths it draws: the
round its capacity is checked against, so the device a policy names trains at full capacity.

An energy budget per client round (``energy_budget_j``, ``fleetbench plan --energy-budget J``)
is a second limit beside the deadline; both hold when both are given. A client round's
predicted energy is the device's energy per image at the width (`fl.scheduling.energy`:
the profiles' measured energy, interpolated in FLOPs between measured widths) times the
images it trains, ``epochs * examples`` (the round's ``steps * batch``); a FjORD client's is
the mean over the widths it draws, and since it draws one per step, the budget must hold that
mean plus two spreads of the round's draw (`fl.scheduling.energy.drawn_energy_bound`), so that
a round stays within it, not only the average round. FjORD / HeteroFL / FedRolex take the
widest level whose round meets the deadline, fits memory *and* whose predicted energy is within the budget;
FedDrop's budget ratio is the smaller of the deadline's and the energy budget's, each found
by the same FLOPs interpolation over uniform widths (`fl.scheduling.budgets`), and its keep
probability follows. **Decision:** a device whose smallest width exceeds the energy budget
trains at the smallest width (status ``misses``, one line saying by how many joules), as a
device that misses the deadline does, rather than leaving the run: the run still has its
data, and the log shows the overspend. A device without energy in its profile is named in a
warning and planned on the deadline and memory alone.

The fleet's predicted round is the slowest planned device's; FedAvg's is the slowest
full-width round.

A plan is revised from measured rounds (`revise`): each device's round cost is scaled by its
measured / predicted ratio, and the plan is made again.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from exporters.userinput import InputError
from fl.population import full_batch_steps
from fl.roundcost import Link, link_transfer, payload_bytes_of, profile_age_warning
from fl.scheduling.budgets import round_budget_ratio
from fl.scheduling.configs import ProfileConfig, match_profile, match_round_cost
from fl.scheduling.energy import (
    EnergyCurve,
    drawn_energy_bound,
    energy_cells,
    energy_curves,
    missing_energy,
    round_energy,
    round_images,
)
from fl.scheduling.rows import width_flops
from fl.scheduling.tiers import HETEROFL_LEVELS, DeviceChoice, WidthCheck, assign_tiers
from harness.latency import profile_rows
from harness.roundcost import RoundCost, RoundCostModel, round_cost

#: Strategies whose clients train a static width chosen per device, and their level sets.
TIERED = ("fjord", "heterofl", "fedrolex")
#: What a device without a profile of the model gets: refuse the plan, the smallest width, or no client.
UNPROFILED = ("refuse", "smallest", "exclude")
#: Default number of tiers of a tiered strategy.
DEFAULT_TIERS = 2
#: FedDrop's rounds are planned on the plain step model's profile, though its devices train the masked one.
MASKED_PROFILE_WARNING = (
    "FedDrop trains the masked step model (a SyncDrop mask input per layer), and profiles measure the plain "
    "one, whose steps are faster: its rounds are predicted short until two measured rounds calibrate them"
)
#: Notes of a planned device that are also warnings: a profile unlike the run, stale, without round cost or energy.
WARNED = ("differs", "profiled", "round cost", "no energy per image", "extrapolated beyond the measured widths")
#: A device's measured / predicted rounds beyond this relative drift revise the plan.
DRIFT_LIMIT = 0.15


@dataclass(frozen=True)
class DevicePlan:
    """One device's part of a `FleetPlan`.

    Attributes
    ----------
    device : str
    status : str
        ``planned``; ``misses`` (no width meets the deadline or memory: the smallest);
        ``unprofiled`` (no profile: the smallest width, nothing predicted); ``excluded``.
    width : float or None
        Its capacity: FjORD's capacity, HeteroFL / FedRolex's level, a FLuID straggler's
        sub-model width, else 1.0. None when excluded.
    tier : int or None
        0 is the widest tier.
    round_s : float or None
        Predicted round at ``width``.
    full_round_s : float or None
        Predicted round at full width.
    fits_memory : bool or None
        None when the device has no memory budget or measurement.
    peak_bytes : float or None
        Predicted peak memory at ``width``.
    budget : float or None
        FedDrop's FLOPs budget ratio.
    keep : float or None
        FedDrop's uniform keep probability for that budget.
    straggler : bool
        FLuID: planned as a straggler.
    examples : int
        Examples of the device's largest client shard the plan assumed.
    energy_j : float or None
        Predicted energy of its client round at ``width`` (FedDrop: at its budget ratio's
        FLOPs), None without energy in its profile.
    config : str
        The profile's configuration (``batch 20, backend ort, ...``).
    notes : tuple of str
        Why the device is degraded or left out, and every warning about its profile.
    """

    device: str
    status: str
    width: float | None
    tier: int | None = None
    round_s: float | None = None
    full_round_s: float | None = None
    fits_memory: bool | None = None
    peak_bytes: float | None = None
    budget: float | None = None
    keep: float | None = None
    straggler: bool = False
    examples: int = 0
    energy_j: float | None = None
    config: str = ""
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class FleetPlan:
    """The plan of one run on a fleet or population.

    Attributes
    ----------
    model, strategy, optimizer : str
    batch, epochs : int
    deadline : str
        The policy as given (``auto``, ``12.5``, ``p75``).
    deadline_s : float or None
        The deadline it gave (None when no device could be predicted).
    devices : tuple of DevicePlan
        In the order asked.
    fleet_round_s : float or None
        The slowest planned device's predicted round.
    fedavg_round_s : float or None
        The slowest full-width round of the same devices (FedAvg).
    target_s : float or None
        FLuID's starting target.
    revision : int
        0 for the plan a run starts with; each revision adds one.
    reason : str
        Why the plan was made ("" for the first), e.g. the drift that revised it.
    scale : dict of str to float
        Each device's measured / predicted factor the revision applied.
    energy_budget_j : float or None
        The energy budget per client round the plan holds to.
    """

    model: str
    strategy: str
    batch: int
    epochs: int
    optimizer: str
    deadline: str
    deadline_s: float | None
    devices: tuple[DevicePlan, ...]
    fleet_round_s: float | None = None
    fedavg_round_s: float | None = None
    target_s: float | None = None
    revision: int = 0
    reason: str = ""
    scale: Mapping[str, float] = field(default_factory=dict)
    energy_budget_j: float | None = None

    def device(self, name: str) -> DevicePlan:
        """Return ``name``'s `DevicePlan` (KeyError when it is not in the plan)."""
        for d in self.devices:
            if d.device == name:
                return d
        raise KeyError(name)

    def capacity(self, device: str) -> float:
        """Return the capacity of a client on ``device``: its width for a tiered strategy, else 1.0.

        Raises
        ------
        KeyError
            When the device is not in the plan.
        """
        width = self.device(device).width
        return float(width) if self.strategy in TIERED and width is not None else 1.0

    def to_json(self) -> dict[str, Any]:
        """Return the plan as a JSON-ready dict (`from_json` reads it back)."""
        out = dataclasses.asdict(self)
        out["scale"] = dict(self.scale)
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> FleetPlan:
        """Return the plan of a `to_json` dict."""
        fields = dict(data)
        fields["devices"] = tuple(
            DevicePlan(**{**d, "notes": tuple(d.get("notes", ()))}) for d in fields.get("devices", ())
        )
        fields["scale"] = dict(fields.get("scale") or {})
        return cls(**fields)


@dataclass(frozen=True)
class PlanRequest:
    """What a plan is made for.

    Attributes
    ----------
    model, strategy, optimizer : str
    batch, epochs : int
    examples : mapping of str to int
        Each device's largest client shard (its keys are the devices planned, in order).
    configs : mapping of str to ProfileConfig
        The configuration each device trains with (a device left out: the run's batch and
        optimizer, any backend and threads).
    deadline : str
        ``auto``, seconds, or ``pNN``.
    tiers : int
        Tiers of a tiered strategy.
    unprofiled : str
        One of `UNPROFILED`.
    memory : mapping of str to int
        Memory budget per device in bytes.
    options : mapping
        The strategy's options (FjORD's ``k``, FLuID's ``widths``, ``num_stragglers`` and
        ``straggler_fraction``).
    links : mapping of str to (kbit/s, delay ms), optional
        Modelled links of a virtual population.
    energy_budget_j : float, optional
        Energy budget per client round in joules (None: no energy limit).
    """

    model: str
    strategy: str
    batch: int
    epochs: int
    optimizer: str
    examples: Mapping[str, int]
    configs: Mapping[str, ProfileConfig] = field(default_factory=dict)
    deadline: str = "auto"
    tiers: int = DEFAULT_TIERS
    unprofiled: str = "refuse"
    memory: Mapping[str, int] = field(default_factory=dict)
    options: Mapping[str, Any] = field(default_factory=dict)
    links: Mapping[str, Link] | None = None
    energy_budget_j: float | None = None

    def config_of(self, device: str) -> ProfileConfig:
        """Return the configuration ``device`` trains with."""
        return self.configs.get(device, ProfileConfig(batch=self.batch, optimizer=self.optimizer))


def parse_deadline(text: str) -> tuple[str, float | None]:
    """Parse a deadline policy: ``auto``, a number of seconds, ``pNN`` or ``none``.

    Parameters
    ----------
    text : str

    Returns
    -------
    (kind, value)
        ``("auto", None)``, ``("seconds", s)``, ``("percentile", NN)`` or ``("none", None)``.

    Raises
    ------
    InputError
        On anything else, a non-positive number or a percentile outside (0, 100].
    """
    value = str(text).strip().lower()
    if value in ("auto", "none"):
        return value, None
    number = value[1:] if value.startswith("p") else value
    try:
        parsed = float(number)
    except ValueError:
        raise InputError(f"--deadline {text!r}: expected auto, seconds (e.g. 12.5), pNN (e.g. p75) or none") from None
    if value.startswith("p"):
        if not 0 < parsed <= 100:
            raise InputError(f"--deadline {text!r}: a percentile is in (0, 100]")
        return "percentile", parsed
    if not (parsed > 0 and math.isfinite(parsed)):
        raise InputError(f"--deadline {text!r}: seconds must be positive")
    return "seconds", parsed


def deadline_seconds(policy: str, full_rounds: Sequence[float]) -> float:
    """Return the deadline of a policy over the devices' predicted rounds at full width.

    Parameters
    ----------
    policy : str
        See `parse_deadline`.
    full_rounds : sequence of float
        One per device with a prediction: its client round at full width (a FjORD client's
        at full capacity, the mean over the widths it draws).

    Returns
    -------
    float
        ``auto``: the median device's (the upper one of an even count); ``pNN``: the
        smallest round that NN % of the devices meet; seconds as given; ``none``:
        ``math.inf``. Rounding aside, the device it names meets it.

    Raises
    ------
    InputError
        When the policy needs rounds and there are none.
    """
    kind, value = parse_deadline(policy)
    if kind == "none":
        return math.inf
    if kind == "seconds":
        return float(value)  # type: ignore[arg-type]
    rounds = sorted(float(r) for r in full_rounds)
    if not rounds:
        raise InputError("no device has a predicted round; give --deadline SECONDS")
    index = len(rounds) // 2 if kind == "auto" else max(math.ceil(float(value) / 100 * len(rounds)) - 1, 0)  # type: ignore[arg-type]
    return rounds[index] * (1 + 1e-9)


def levels_of(strategy: str, options: Mapping[str, Any]) -> tuple[float, ...]:
    """Return the widths a strategy's clients may be given, smallest first (``(1.0,)``: untiered)."""
    if strategy == "fjord":
        from fl.strategies.fjord import FjORD, width_set

        return tuple(sorted(width_set(int(options.get("k", FjORD.defaults["k"])))))
    if strategy in ("heterofl", "fedrolex"):
        return tuple(sorted(HETEROFL_LEVELS))
    return (1.0,)


def check_store_has(cells: Any, model: str, where: str) -> None:
    """Refuse a store without a single profile row of ``model``.

    Raises
    ------
    InputError
        Naming the store and the models it does hold.
    """
    models = sorted({str(r.get("model")) for r in profile_rows(cells)})
    if model not in models:
        held = ", ".join(models) if models else "none"
        raise InputError(f"{where}: no profile of model {model!r} (profiled models: {held}); run fleetbench profile")


@dataclass(frozen=True)
class ProfileFit:
    """The profiles a plan is made on, matched to the run and fitted once.

    Attributes
    ----------
    request : PlanRequest
    rows : list of dict
        Every matched device's cells of the model in its chosen configuration.
    models : mapping of str to harness.latency.DeviceModels
        The rows' fitted models.
    matched : tuple of str
        The devices with a profile of the model (``profiled``: those with a usable one).
    profiled : tuple of str
    cost : RoundCost
        The round-cost model of the profiled devices.
    backends, batches : mapping of str to str or int
        Each device's profile backend and batch.
    described : mapping of str to str
        Each device's profile configuration, for the table.
    notes : mapping of str to tuple of str
        Each device's warnings about its profile.
    energy : mapping of str to EnergyCurve
        Each profiled device's energy per image of the model, where its cells have any.
    energy_missing : mapping of str to str
        Why each other profiled device has none.
    """

    request: PlanRequest
    rows: list[dict[str, Any]]
    models: Mapping[str, Any]
    matched: tuple[str, ...]
    profiled: tuple[str, ...]
    cost: RoundCost
    backends: Mapping[str, str | None]
    batches: Mapping[str, int | None]
    described: Mapping[str, str]
    notes: Mapping[str, tuple[str, ...]]
    energy: Mapping[str, EnergyCurve] = field(default_factory=dict)
    energy_missing: Mapping[str, str] = field(default_factory=dict)


def fit_profiles(cells: Any, stored_costs: Any, request: PlanRequest, *, now: float | None = None) -> ProfileFit:
    """Match each device's profile and round cost to the run's configuration and fit the models once.

    Parameters
    ----------
    cells : pandas.DataFrame or rows
        The store's latest cells.
    stored_costs : sequence of RoundCostModel
        The store's round-cost measurements.
    request : PlanRequest
    now : float, optional
        Unix time the profiles' ages are judged at (default: now).

    Returns
    -------
    ProfileFit

    Raises
    ------
    InputError
        A device without a profile under ``unprofiled="refuse"``; a bad deadline, tier count
        or ``unprofiled``.
    """
    if request.unprofiled not in UNPROFILED:
        raise InputError(f"--unprofiled {request.unprofiled!r}: one of {', '.join(UNPROFILED)}")
    if request.tiers < 1:
        raise InputError(f"--tiers {request.tiers}: at least 1")
    parse_deadline(request.deadline)
    if request.energy_budget_j is not None and not (
        math.isfinite(request.energy_budget_j) and request.energy_budget_j > 0
    ):
        raise InputError(f"--energy-budget {request.energy_budget_j}: joules must be positive")
    now = time.time() if now is None else now
    rows = profile_rows(cells)
    matched: dict[str, list[dict[str, Any]]] = {}
    notes: dict[str, list[str]] = {d: [] for d in request.examples}
    described: dict[str, str] = {}
    backends: dict[str, str | None] = {}
    batches: dict[str, int | None] = {}
    costs: dict[str, RoundCostModel] = {}
    for device in request.examples:
        try:
            match = match_profile(rows, device, request.model, request.config_of(device))
        except InputError:  # no cell of the model on the device at all
            continue
        ok = [r for r in match.rows if r.get("status") == "ok"]
        if not ok:
            continue
        matched[device] = list(match.rows)
        described[device] = ", ".join(f"{k} {v}" for k, v in match.config.items() if v is not None)
        backends[device] = match.config.get("backend")
        batches[device] = match.config.get("batch")
        if not match.exact:
            notes[device].append(f"profile differs from the run in {', '.join(match.differences)}")
        measured = [float(r["measured_at"]) for r in ok if r.get("measured_at") is not None]
        stale = profile_age_warning(device, max(measured) if measured else None, now)
        if stale:
            notes[device].append(stale)
        cost, differences = match_round_cost(stored_costs, device, request.model, request.config_of(device))
        if cost is not None:
            costs[device] = cost
            if differences:
                notes[device].append(f"round cost measured with {', '.join(differences)}")
        else:
            notes[device].append("no round-cost measurement: rounds predicted from per-image latency alone")
    missing = [d for d in request.examples if d not in matched]
    if missing and request.unprofiled == "refuse":
        raise InputError(
            f"device {missing[0]!r} has no profile of {request.model} (also without one: "
            f"{', '.join(missing[1:]) or 'none'}); run fleetbench profile on it, or plan with "
            "--unprofiled smallest|exclude"
        )
    from harness.latency import fit

    all_rows = [r for d in matched for r in matched[d]]
    models = fit(all_rows)
    profiled = tuple(d for d in matched if d in models)
    for device in matched:
        if device not in models:
            notes[device].append("no usable measurement of the model (every cell failed)")
    cost_fn = round_cost(
        all_rows, request.model, request.batch, costs={d: c for d, c in costs.items() if d in profiled},
        transfer=link_transfer(request.links), warn=None, models=models,
    )  # fmt: skip
    energy = energy_cells(all_rows)
    curves = energy_curves(energy, request.model, functools.partial(width_flops, request.model, rows=all_rows))
    return ProfileFit(
        request, all_rows, models, tuple(matched), profiled, cost_fn, backends, batches, described,
        {d: tuple(n) for d, n in notes.items()}, {d: c for d, c in curves.items() if d in profiled},
        {d: missing_energy(energy, d, request.model) for d in profiled if d not in curves},
    )  # fmt: skip


def make_plan(
    cells: Any,
    stored_costs: Any,
    request: PlanRequest,
    *,
    warn: Callable[[str], None] | None = None,
    now: float | None = None,
    scale: Mapping[str, float] | None = None,
) -> FleetPlan:
    """Plan a run from profile rows and round-cost measurements (see the module docstring).

    Parameters
    ----------
    cells : pandas.DataFrame or rows
        The store's latest cells.
    stored_costs : sequence of RoundCostModel
        The store's round-cost measurements.
    request : PlanRequest
    warn : callable, optional
        Receives every warning line (they are in the devices' notes as well).
    now : float, optional
        Unix time the profiles' ages are judged at (default: now).
    scale : mapping of str to float, optional
        Each device's measured / predicted factor (a revision).

    Returns
    -------
    FleetPlan

    Raises
    ------
    InputError
        A device without a profile under ``unprofiled="refuse"``; a bad deadline,
        tier count or ``unprofiled``.
    """
    return plan_on(fit_profiles(cells, stored_costs, request, now=now), warn=warn, scale=scale)


def plan_on(
    fitted: ProfileFit, *, warn: Callable[[str], None] | None = None, scale: Mapping[str, float] | None = None
) -> FleetPlan:
    """Plan a run on fitted profiles (`make_plan` without the fitting).

    Parameters
    ----------
    fitted : ProfileFit
    warn : callable, optional
        Receives every warning line.
    scale : mapping of str to float, optional
        Each device's measured / predicted factor (a revision).

    Returns
    -------
    FleetPlan
    """
    request, all_rows, models, profiled = fitted.request, fitted.rows, fitted.models, list(fitted.profiled)
    batches, backends, described = fitted.batches, fitted.backends, fitted.described
    matched = set(fitted.matched)
    notes = {d: list(n) for d, n in fitted.notes.items()}
    say = warn or (lambda line: None)
    levels = levels_of(request.strategy, request.options)
    cost_fn = _scaled(fitted.cost, scale or {})
    from exporters.zoo import get_model  # torch: only once a plan is made, not when a parser is built

    zoo = get_model(request.model)
    steps = {d: full_batch_steps(request.examples[d], request.batch, request.epochs) for d in request.examples}

    def round_at(device: str, width: float, payload: float | None = None) -> float:
        arch = zoo.arch(width)
        nbytes = payload_bytes_of(arch if payload is None else zoo.arch(payload))
        return float(cost_fn(device, arch, steps[device], nbytes, nbytes))

    def trained(width: float) -> list[float]:
        """Return the widths a client at ``width`` trains: FjORD draws one <= its capacity per step."""
        return [w for w in levels if w <= width + 1e-9] if request.strategy == "fjord" else [width]

    def client_round(device: str, width: float) -> float:
        drawn = trained(width)  # the payload is the capacity's, whichever width a step trains
        return sum(round_at(device, w, width) for w in drawn) / len(drawn)

    flops_at = functools.partial(width_flops, request.model, rows=all_rows)
    budget_j = request.energy_budget_j

    def images(device: str) -> int:
        return round_images(request.examples[device], request.epochs)

    def energy_of(device: str, width: float) -> tuple[float, bool] | None:
        curve = fitted.energy.get(device)
        return None if curve is None else round_energy(curve, trained(width), images(device), flops_at)

    def client_energy(device: str, width: float) -> float | None:
        """Return the energy a budget is checked against: for FjORD, whose round draws its widths, the bound."""
        curve = fitted.energy.get(device)
        if curve is None:
            return None
        if request.strategy != "fjord":
            return round_energy(curve, [width], images(device), flops_at)[0]
        return drawn_energy_bound(curve, trained(width), images(device), int(steps[device]), flops_at)

    def energy_at_flops(device: str, flops: float) -> float | None:
        curve = fitted.energy.get(device)
        return None if curve is None else curve.at_flops(flops).joules_per_image * images(device)

    if budget_j is not None:
        for device, why in fitted.energy_missing.items():
            notes[device].append(f"{why}: planned without the energy budget")
    full = {d: round_at(d, 1.0) for d in profiled}
    # a FjORD client at full capacity trains the widths it draws, not the full width alone: the
    # deadline is set on the rounds the tiers are checked against, so the device it names meets it
    at_full = [client_round(d, 1.0) for d in profiled]
    deadline = deadline_seconds(request.deadline, at_full) if full else None
    checks: dict[str, tuple[WidthCheck, ...]] = {}
    tiers: dict[str, DeviceChoice] = {}
    if deadline is not None:
        tier_plan = assign_tiers(
            all_rows, request.model, levels, deadline_s=deadline, round_seconds=client_round, devices=profiled,
            batch={d: batches[d] for d in profiled}, memory_budget_bytes=request.memory,
            k=request.tiers, backend={d: backends[d] for d in profiled}, models=models, energy=client_energy,
            energy_budget_j=budget_j,
        )  # fmt: skip
        for choice in tier_plan.choices:
            if choice.checks:
                checks[choice.device], tiers[choice.device] = choice.checks, choice
            else:
                notes[choice.device].append(choice.reason)
    plans, target = _strategy_plans(
        request, zoo, checks, tiers, full, deadline, round_at, client_round, client_energy, energy_at_flops
    )
    out = []
    for device in request.examples:
        if device in plans:
            plan = plans[device]
            energy = None if plan.width is None or request.strategy == "feddrop" else energy_of(device, plan.width)
            if energy is not None:
                plan = dataclasses.replace(plan, energy_j=energy[0])
                if energy[1]:
                    measured = ", ".join(f"{w:g}" for w in sorted(fitted.energy[device].widths))
                    note = f"energy at width {plan.width:g} extrapolated beyond the measured widths ({measured})"
                    plan = dataclasses.replace(plan, notes=(*plan.notes, note))
        elif request.unprofiled == "exclude" or (device in matched and device not in checks):
            reason = "no profile of the model" if device not in matched else "no usable profile"
            plan = DevicePlan(device, "excluded", None, notes=(reason,))
        else:
            plan = DevicePlan(device, "unprofiled", min(levels), notes=("no profile: the smallest width",))
        plan = dataclasses.replace(
            plan, examples=int(request.examples[device]), config=described.get(device, ""),
            notes=tuple(plan.notes) + tuple(n for n in notes[device] if n not in plan.notes),
        )  # fmt: skip
        out.append(plan)
    for plan in out:
        for note in plan.notes:
            if plan.status != "planned" or any(k in note for k in WARNED):
                say(f"{plan.device}: {note}")
    if request.strategy == "feddrop" and profiled:
        say(MASKED_PROFILE_WARNING)
    predicted = [d for d in out if d.round_s is not None]
    return FleetPlan(
        model=request.model, strategy=request.strategy, batch=request.batch, epochs=request.epochs,
        optimizer=request.optimizer, deadline=str(request.deadline),
        deadline_s=None if deadline is None or math.isinf(deadline) else deadline, devices=tuple(out),
        fleet_round_s=max((d.round_s for d in predicted), default=None),  # type: ignore[type-var]
        fedavg_round_s=max((d.full_round_s for d in predicted), default=None),  # type: ignore[type-var]
        target_s=target, scale=dict(scale or {}), energy_budget_j=budget_j,
    )  # fmt: skip


def _scaled(cost: RoundCost, scale: Mapping[str, float]) -> RoundCost:
    if not scale:
        return cost

    def scaled(device: str, arch: Any, steps: float, down: int, up: int) -> float:
        return float(scale.get(device, 1.0)) * cost(device, arch, steps, down, up)

    return scaled


def _strategy_plans(
    request: PlanRequest,
    zoo: Any,
    checks: Mapping[str, tuple[WidthCheck, ...]],
    tiers: Mapping[str, DeviceChoice],
    full: Mapping[str, float],
    deadline: float | None,
    round_at: Callable[..., float],
    client_round: Callable[[str, float], float],
    client_energy: Callable[[str, float], float | None],
    energy_at_flops: Callable[[str, float], float | None],
) -> tuple[dict[str, DevicePlan], float | None]:
    """Return the `DevicePlan` of every checked device for the request's strategy, and FLuID's target."""
    budget_j = request.energy_budget_j
    out: dict[str, DevicePlan] = {}

    def base(device: str, width: float, status: str = "planned", **extra: Any) -> DevicePlan:
        check = next((c for c in checks[device] if abs(c.width - width) < 1e-9), None)
        return DevicePlan(
            device, status, width, round_s=client_round(device, width),
            full_round_s=full[device], fits_memory=None if check is None else check.fits_memory,
            peak_bytes=None if check is None else check.peak_memory_bytes, **extra,
        )  # fmt: skip

    if request.strategy in TIERED:
        n = 1 + max((c.tier for c in tiers.values() if c.tier is not None), default=-1)
        for device, choice in tiers.items():
            if choice.tier_width is not None and choice.width is not None:
                why = (
                    _limits_met(deadline, budget_j, client_energy(device, choice.tier_width))
                    if choice.tier_width >= choice.width
                    else f"its tier's width (it meets {choice.width:g})"
                )
                out[device] = base(device, choice.tier_width, tier=choice.tier, notes=(why,))
                continue
            smallest = checks[device][0]
            at = f"at its smallest width {smallest.width:g}"
            reasons = []
            if not smallest.fits_deadline:
                reasons.append(f"misses the deadline by {smallest.round_seconds - (deadline or 0.0):.3g} s {at}")
            if not smallest.fits_memory:
                reasons.append(f"does not fit in memory {at}: {smallest.note}")
            if not smallest.fits_energy and smallest.energy_j is not None and budget_j is not None:
                reasons.append(f"exceeds the energy budget by {smallest.energy_j - budget_j:.3g} J {at}")
            reasons = reasons or [f"no width fits {at}: {smallest.note}"]
            out[device] = base(device, smallest.width, "misses", tier=n, notes=tuple(reasons))
        return out, None
    if request.strategy == "feddrop":
        top = max(zoo.arch(1.0).sizes)
        flops_at = functools.partial(width_flops, request.model)
        for device in checks:
            ratio: float | None = 1.0
            notes = []
            if deadline is not None and math.isfinite(deadline):
                ratio, note = round_budget_ratio(
                    functools.partial(_at_payload, round_at, device), flops_at, deadline, top
                )
                notes.append(note)
            if budget_j is not None and client_energy(device, 1.0) is not None:
                energy_ratio, energy_note = round_budget_ratio(
                    functools.partial(_energy_or_zero, client_energy, device), flops_at, budget_j, top,
                    limit="energy budget", unit="J",
                )  # fmt: skip
                notes.append(energy_note)
                ratio = None if ratio is None or energy_ratio is None else min(ratio, energy_ratio)
            keep = None if ratio is None else _keep_probability(zoo, ratio, request.options)
            status = "planned" if ratio is not None else "misses"
            energy = None if ratio is None else energy_at_flops(device, ratio * flops_at(1.0))
            out[device] = base(
                device, 1.0, status, budget=ratio, keep=keep, notes=tuple(n for n in notes if n), energy_j=energy
            )
        return out, None
    if request.strategy == "fluid":
        from fl.maths import fluid

        widths = request.options.get("widths", fluid.PAPER_WIDTHS)
        widths = tuple(float(w) for w in (json.loads(widths) if isinstance(widths, str) else widths))
        count = fluid.straggler_count(
            len(full),
            int(request.options.get("num_stragglers", 1)),
            _float_or_none(request.options.get("straggler_fraction")),
        )
        stragglers, target = fluid.find_stragglers(dict(full), count)
        for device in checks:
            if device in stragglers and not math.isnan(target):
                width = fluid.curve_width(full[device], target, widths, functools.partial(round_at, device))
                why = f"straggler: width {width:g} brings its round nearest the target {target:.3g} s"
                out[device] = base(device, width, straggler=True, notes=(why,))
            else:
                out[device] = base(device, 1.0)
        return out, None if math.isnan(target) else float(target)
    for device in checks:
        out[device] = base(device, 1.0)
    return out, None


def _at_payload(round_at: Callable[..., float], device: str, width: float) -> float:
    return round_at(device, width, 1.0)


def _energy_or_zero(client_energy: Callable[[str, float], float | None], device: str, width: float) -> float:
    return client_energy(device, width) or 0.0


def _limits_met(deadline: float | None, budget_j: float | None, joules: float | None) -> str:
    """Return the note of a device planned at its widest fitting width: the limits it meets."""
    limits = [] if deadline is None or math.isinf(deadline) else ["the deadline"]
    if budget_j is not None and joules is not None:
        limits.append("the energy budget")
    return f"meets {' and '.join(limits)}" if limits else "fits"


def _float_or_none(value: Any) -> float | None:
    return None if value in (None, "", "none", "None") else float(value)


def _keep_probability(zoo: Any, ratio: float, options: Mapping[str, Any]) -> float:
    """Return FedDrop's uniform keep probability for a FLOPs budget ratio (its strategy's own rule)."""
    from fl.maths.feddrop import uniform_keep
    from fl.strategies.fedavg import parse_bool
    from fl.strategies.feddrop import cached_flops_model, dense_sites

    flops = cached_flops_model(zoo, str(options.get("convention", "paper")))
    sites = dense_sites(zoo, parse_bool(options.get("drop_dense", True), "drop_dense"))
    return float(uniform_keep(flops, ratio, [bool(s) for s in sites]))


def revise(
    plan: FleetPlan,
    measured: Mapping[str, float],
    make: Callable[[Mapping[str, float]], FleetPlan],
    limit: float = DRIFT_LIMIT,
) -> FleetPlan | None:
    """Return the plan made again on the measured rounds, or None while they hold to it.

    Parameters
    ----------
    plan : FleetPlan
        The plan in force.
    measured : mapping of str to float
        Each device's measured / profile-predicted round ratio so far.
    make : callable
        ``scale -> FleetPlan``: the planner on the same inputs with each device's cost scaled.
    limit : float
        A device whose ratio differs from the plan's own scale by more than this share
        revises the plan.

    Returns
    -------
    FleetPlan or None
        The revision (``revision + 1``, its reason naming the drifted devices).
    """
    drifted = {d: f for d, f in measured.items() if math.isfinite(f) and abs(f / plan.scale.get(d, 1.0) - 1.0) > limit}
    if not drifted:
        return None
    scale = {**plan.scale, **{d: float(f) for d, f in measured.items() if math.isfinite(f)}}
    new = make(scale)
    reason = ", ".join(f"{d} at {f:.2f} x its prediction" for d, f in sorted(drifted.items()))
    return dataclasses.replace(new, revision=plan.revision + 1, reason=f"rounds drifted: {reason}")


class RunPlan:
    """The plan a run trains with, and its revisions from the measured rounds.

    Parameters
    ----------
    current : FleetPlan
        The plan in force.
    make : callable
        ``scale -> FleetPlan``: the planner on the run's inputs with each device's round
        cost scaled by its factor (`make_plan` with ``scale``).
    limit : float
        Relative drift of a device's factor that revises the plan (`revise`).
    cost : RoundCost, optional
        The round-cost model the plan was made on.
    """

    def __init__(
        self,
        current: FleetPlan,
        make: Callable[[Mapping[str, float]], FleetPlan],
        limit: float = DRIFT_LIMIT,
        cost: RoundCost | None = None,
    ) -> None:
        self.current, self.make, self.limit, self.cost = current, make, limit, cost

    def revise(self, factors: Mapping[str, float]) -> FleetPlan | None:
        """Revise the plan when a device's factor drifted beyond the limit; return the revision or None."""
        new = revise(self.current, factors, self.make, self.limit)
        if new is not None:
            self.current = new
        return new

    def restore(self, data: Mapping[str, Any]) -> None:
        """Put a stored plan (`FleetPlan.to_json`) in force: a resumed run's latest revision."""
        self.current = FleetPlan.from_json(data)

    def capacity(self, device: str | None, default: float = 1.0) -> float:
        """Return a client's capacity on ``device`` under the plan in force (``default`` off the plan)."""
        if device is None:
            return default
        try:
            return self.current.capacity(device)
        except KeyError:
            return default


def strategy_options(plan: FleetPlan, placement: Mapping[str, str]) -> dict[str, Any]:
    """Return the strategy options a plan sets: FedDrop's per-client budgets, FLuID's starting plan.

    Parameters
    ----------
    plan : FleetPlan
    placement : mapping of str to str
        Client id -> device.

    Returns
    -------
    dict
        ``{"budgets": {cid: ratio}}`` for FedDrop; ``{"planned": {"target": s,
        "stragglers": {cid: width}}}`` for FLuID; else empty.
    """
    by_device = {d.device: d for d in plan.devices}
    if plan.strategy == "feddrop":
        budgets = {cid: by_device[d].budget for cid, d in placement.items() if d in by_device and by_device[d].budget}
        return {"budgets": budgets} if budgets else {}
    if plan.strategy == "fluid" and plan.target_s is not None:
        widths = {
            cid: by_device[d].width
            for cid, d in placement.items()
            if d in by_device and by_device[d].straggler and by_device[d].width is not None
        }
        return {"planned": {"target": plan.target_s, "stragglers": widths}}
    return {}


def format_plan(plan: FleetPlan) -> list[str]:
    """Return the plan as table lines: one per device, then the fleet's deadline, energy budget and rounds.

    The ``energy J`` column is each device's predicted energy per client round (``-``
    without energy in its profile).
    """
    width_name = {"fjord": "capacity", "heterofl": "level", "fedrolex": "level"}.get(plan.strategy, "width")
    lines = [
        f"{'device':<12} {'status':<10} {width_name:>8} {'tier':>4} {'round s':>8} {'full s':>8} {'memory':>7} "
        f"{'budget':>6} {'keep':>5} {'energy J':>9}  notes"
    ]

    def num(value: float | None, spec: str) -> str:
        return "-" if value is None else format(value, spec)

    for d in plan.devices:
        memory = "-" if d.fits_memory is None else ("fits" if d.fits_memory else "over")
        lines.append(
            f"{d.device:<12} {d.status:<10} {num(d.width, 'g'):>8} {num(d.tier, 'd'):>4} {num(d.round_s, '.3f'):>8} "
            f"{num(d.full_round_s, '.3f'):>8} {memory:>7} {num(d.budget, '.3f'):>6} {num(d.keep, '.3f'):>5} "
            f"{num(d.energy_j, '.4g'):>9}  " + "; ".join(d.notes)
        )
    if plan.deadline_s is not None:
        lines.append(f"deadline {plan.deadline_s:.3f} s ({plan.deadline})")
    elif plan.deadline == "none":
        lines.append("no deadline")
    if plan.energy_budget_j is not None:
        lines.append(f"energy budget {plan.energy_budget_j:.4g} J per client round")
    if plan.fleet_round_s is not None and plan.fedavg_round_s is not None:
        lines.append(
            f"predicted fleet round {plan.fleet_round_s:.3f} s against FedAvg at full width {plan.fedavg_round_s:.3f} s"
            f" ({plan.fleet_round_s / plan.fedavg_round_s:.2f} x)"
        )
    if plan.target_s is not None:
        lines.append(f"FLuID's starting target {plan.target_s:.3f} s")
    return lines


def device_examples(placement: Mapping[str, str], shard_sizes: Mapping[str, int]) -> dict[str, int]:
    """Return each device's largest client shard (the client whose round a plan must fit).

    Parameters
    ----------
    placement : mapping of str to str
        Client id -> device, in client order.
    shard_sizes : mapping of str to int
        Client id -> training examples.

    Returns
    -------
    dict of str to int
        Devices in order of first placement.
    """
    out: dict[str, int] = {}
    for cid, device in placement.items():
        out[device] = max(out.get(device, 0), int(shard_sizes[cid]))
    return out


def run_plan(store: Any, request: PlanRequest, warn: Callable[[str], None] | None = None) -> RunPlan:
    """Read a profile store once, fit its profiles once, and plan on them; revisions reuse the fit.

    Parameters
    ----------
    store : harness.store.ProfileStore
    request : PlanRequest
    warn : callable, optional

    Returns
    -------
    RunPlan
        Its ``cost`` is the round-cost model the plan was made on (the run predicts its
        client rounds with it).

    Raises
    ------
    InputError
        When the store holds no profile of the model, or `fit_profiles` refuses.
    """
    cells = store.latest_cells()
    check_store_has(cells, request.model, str(store.path))
    fitted = fit_profiles(cells, store.round_costs(), request)

    def again(scale: Mapping[str, float]) -> FleetPlan:
        return plan_on(fitted, scale=scale)

    return RunPlan(plan_on(fitted, warn=warn), again, cost=fitted.cost)
