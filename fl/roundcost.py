"""Round-cost functions built from a profile store: the edge between the harness's round-cost model and FL.

`round_cost_from_rows` returns the ``(device, arch, steps, bytes_down, bytes_up) ->
seconds`` function `fl.population.VirtualClock` and the server's predictions need; it is
`harness.roundcost.round_cost` (the one round-cost model)::

    seconds = fixed + steps * batch * latency(device, arch) + transfer_down(bytes_down) + transfer_up(bytes_up)

``latency`` is the device's per-image training latency predicted for ``arch`` by its fitted
model (`harness.latency`: any width or mixed architecture), ``fixed`` and the transfer lines
the device's measured `harness.roundcost.RoundCostModel` (a device without one is costed
from latency alone, with a warning). A ``--link`` of a virtual population replaces the
measured transfer time by ``bytes * 8 / rate + delay`` (`modelled_transfer_seconds`).

`round_cost_from_store` does the same from a store, each device's profile and round cost
chosen to match the configuration it trains with in the run (`fl.scheduling.configs`:
the nearest one with a warning naming the difference, an `InputError` when there is none).

`ClientRoundPredictor` turns a round cost into the prediction of one client's round at an
architecture (its local steps from its examples, the payload from the architecture's
parameters in the runner's wire format): the server logs it beside every measured round
(``fl_client_rounds.predicted_seconds``) and hands it to the strategies that plan on it
(FLuID's target and straggler width).

Backends: a device measured with several backends is costed with the first of
`harness.roundcost.BACKEND_PREFERENCE` it has (the one the devices executor trains with), unless one is named.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from exporters.arch import Arch
from exporters.userinput import InputError
from fl.population import full_batch_steps, split_item
from fl.records import ClientSpec
from fl.scheduling.configs import ProfileConfig, match_profile, match_round_cost
from fl.scheduling.rows import select
from harness.latency import arch_counts, profile_rows, usable_rows
from harness.roundcost import RoundCost, RoundCostModel, round_cost

#: A device's link: rate in kbit/s and one-way delay in milliseconds.
Link = tuple[float, float]

#: Bytes of the ``.npy`` header in front of a flat float32 parameter vector (the runner's wire format).
NPY_HEADER_BYTES = 128


def measured_models(rows: Any) -> dict[str, set[str]]:
    """Return, for every device of the rows, the models it has a usable measurement of (maybe none).

    Parameters
    ----------
    rows : pandas.DataFrame, rows or ``{device: rows}``
        Profile rows (`fl.scheduling.rows.profile_rows` forms).

    Returns
    -------
    dict of str to set of str
    """
    records = profile_rows(rows)
    out: dict[str, set[str]] = {str(r["device"]): set() for r in records}
    for r in usable_rows(records):
        out[str(r["device"])].add(str(r["model"]))
    return out


def parse_links(spec: str | None, devices: Iterable[str]) -> dict[str, Link]:
    """Parse ``--link``: ``KBIT[:DELAY_MS]`` for every device, or ``device=KBIT[:DELAY_MS],...``.

    Parameters
    ----------
    spec : str or None
    devices : iterable of str
        The population's devices.

    Returns
    -------
    dict of str to (float, float)
        ``{device: (kbit/s, delay ms)}``; devices without a link are absent.

    Raises
    ------
    InputError
        On a malformed item, a rate that is not positive, a negative delay or an unknown device.
    """
    names = list(devices)
    if spec is None or not spec.strip():
        return {}
    if "=" not in spec:
        link = _link(spec.strip(), spec)
        return dict.fromkeys(names, link)
    out: dict[str, Link] = {}
    for item in spec.split(","):
        device, text = split_item(item, f"--link {spec!r}: {item.strip()!r} is not device=KBIT[:DELAY_MS]")
        if device not in names:
            raise InputError(f"--link {spec!r}: device {device!r} is not in the population ({', '.join(names)})")
        out[device] = _link(text.strip(), spec)
    return out


def _link(text: str, spec: str) -> Link:
    rate_text, _, delay_text = text.partition(":")
    try:
        rate, delay = float(rate_text), float(delay_text or 0.0)
    except ValueError:
        raise InputError(f"--link {spec!r}: {text!r} is not KBIT[:DELAY_MS]") from None
    if not (math.isfinite(rate) and rate > 0) or not (math.isfinite(delay) and delay >= 0):
        raise InputError(f"--link {spec!r}: rate must be positive and delay >= 0 in {text!r}")
    return rate, delay


def modelled_transfer_seconds(nbytes: int, rate_kbit: int | None, delay_ms: float | None) -> float | None:
    """Return the modelled one-way transfer time of ``nbytes`` over an emulated link.

    Parameters
    ----------
    nbytes : int
        Payload size in bytes.
    rate_kbit : int or None
        Link rate in kbit/s; None when the link is not shaped.
    delay_ms : float or None
        One-way delay in milliseconds.

    Returns
    -------
    float or None
        ``nbytes * 8 / (rate_kbit * 1000) + delay_ms / 1000``; None without a rate.
    """
    if not rate_kbit:
        return None
    return nbytes * 8 / (rate_kbit * 1000.0) + (delay_ms or 0.0) / 1000.0


def link_transfer(links: Mapping[str, Link] | None) -> Callable[[str, int], float | None]:
    """Return ``(device, nbytes) -> seconds or None``: the modelled transfer time of a device with a link.

    ``bytes * 8 / rate + delay`` (`modelled_transfer_seconds`) for a
    device of ``links``; None for the others (their measured transfer time stands).
    """
    link_of = dict(links or {})

    def transfer(device: str, nbytes: int) -> float | None:
        if device not in link_of:
            return None
        rate, delay = link_of[device]
        return float(modelled_transfer_seconds(nbytes, rate, delay) or 0.0)  # type: ignore[arg-type]

    return transfer


def round_cost_from_rows(
    rows: Any,
    model: str,
    batch: int,
    devices: Iterable[str],
    *,
    backend: str | None = None,
    links: Mapping[str, Link] | None = None,
    costs: Mapping[str, RoundCostModel] | None = None,
    warn: Callable[[str], None] | None = None,
) -> RoundCost:
    """Build the round-cost function of ``devices`` from profile rows (see the module docstring).

    Parameters
    ----------
    rows : pandas.DataFrame, rows or ``{device: rows}``
        The store's latest cells.
    model : str
        The run's model.
    batch : int
        The run's local batch size.
    devices : iterable of str
        Devices to cost (each must have a usable profile of ``model``).
    backend : str, optional
        Only this backend's measurements.
    links : mapping of str to (kbit/s, delay ms), optional
        Modelled links; they replace a device's measured transfer time.
    costs : mapping of str to RoundCostModel, optional
        Each device's measured round costs; a device without one (none given: every device)
        is costed from its latency alone.
    warn : callable, optional
        Receives the fallback warnings (only when ``costs`` is given: without measurements
        the latency-only cost is what was asked for).

    Returns
    -------
    RoundCost

    Raises
    ------
    InputError
        When a device has no usable profile of ``model``, or several batches and none is the run's.
    """
    from harness.latency import fit
    from harness.roundcost import config_key

    names = list(devices)
    chosen = select(profile_rows(rows), model=model, backend=backend)
    models = fit(chosen)
    for device in names:
        if device not in models:
            raise InputError(f"device {device!r} has no usable profile of model {model!r}")
        config_key(models[device], model, batch, backend)  # several batches, none the run's: refused now
    wanted = {d: c for d, c in (costs or {}).items() if d in names}
    return round_cost(
        [r for r in chosen if r["device"] in names], model, batch, backend, costs=wanted, transfer=link_transfer(links),
        warn=warn if costs is not None else None,
    )  # fmt: skip


def round_cost_from_store(
    store: Any,
    model: str,
    batch: int,
    wants: Mapping[str, ProfileConfig],
    *,
    links: Mapping[str, Link] | None = None,
    warn: Callable[[str], None] | None = None,
) -> RoundCost:
    """Build the round-cost function of the devices of ``wants`` from a profile store.

    Each device's profile and round-cost measurement are the ones matching the configuration
    it trains with (`fl.scheduling.configs`), or the nearest, with a warning naming the
    difference.

    Parameters
    ----------
    store : harness.store.ProfileStore
    model : str
    batch : int
    wants : mapping of str to ProfileConfig
        The devices and their configurations in the run.
    links : mapping of str to (kbit/s, delay ms), optional
    warn : callable, optional
        Receives every warning line.

    Returns
    -------
    RoundCost

    Raises
    ------
    InputError
        When a device has no usable profile of ``model``.
    """
    cells = profile_rows(store.latest_cells())
    stored = store.round_costs()
    rows: list[dict[str, Any]] = []
    costs: dict[str, RoundCostModel] = {}
    for device in sorted(wants):
        match = match_profile(cells, device, model, wants[device])
        if not match.exact and warn is not None:
            warn(match.warning(model))
        rows += list(match.rows)
        cost, differences = match_round_cost(stored, device, model, wants[device])
        if cost is not None:
            costs[device] = cost
            if differences and warn is not None:
                warn(
                    f"device {device!r}: no round-cost measurement of {model} in the run's configuration; using the "
                    f"nearest, which differs in {', '.join(differences)}"
                )
    return round_cost_from_rows(rows, model, batch, sorted(wants), links=links, costs=costs, warn=warn)


def payload_bytes_of(arch: Arch) -> int:
    """Return the bytes of an architecture's parameters in the runner's wire format (float32 ``.npy``).

    Parameters
    ----------
    arch : Arch
        A zoo architecture.

    Returns
    -------
    int
    """
    return int(arch_counts(arch).params) * 4 + NPY_HEADER_BYTES


@dataclass(frozen=True)
class ClientRoundPredictor:
    """Predict one client's round on its device from a round cost.

    Attributes
    ----------
    cost : RoundCost
    batch : int
        The run's local batch size.
    epochs : int
        Local epochs.
    devices : frozenset of str
        The devices ``cost`` knows; clients elsewhere (or without a device) get None.
    """

    cost: RoundCost
    batch: int
    epochs: int
    devices: frozenset[str]

    def steps(self, examples: int) -> float:
        """Return the training work of a client with ``examples`` examples, in full-batch steps."""
        return full_batch_steps(examples, self.batch, self.epochs)

    def __call__(self, client: ClientSpec, arch: Arch, bytes_down: int | None = None) -> float | None:
        """Return the predicted seconds of ``client``'s round at ``arch`` (None: not predictable).

        Parameters
        ----------
        client : ClientSpec
        arch : Arch
            The architecture it trains (and, unless ``bytes_down`` says otherwise, receives and returns).
        bytes_down : int, optional
            The payload it receives and returns when that is not ``arch``'s (FjORD on a device
            trains a prefix of the capacity's parameters it is sent).
        """
        if client.device is None or client.device not in self.devices:
            return None
        nbytes = payload_bytes_of(arch) if bytes_down is None else int(bytes_down)
        return float(self.cost(client.device, arch, self.steps(client.num_examples), nbytes, nbytes))


#: Recent rounds of a device whose measured/predicted ratios calibrate its next prediction.
CALIBRATION_WINDOW = 3
#: Rounds of a device measured before its calibration applies (one round's noise alone
#: would swing it: the same client round on an emulated device varies by 15 % and more).
CALIBRATION_MIN_ROUNDS = 2
#: A calibration factor further than this from 1 says the device's profile no longer
#: describes it (`stale_profile_warning`): a shared host can move the same cell by a fifth
#: within hours, while a run's factors stay within 0.9 to 1.1 on a profile measured just
#: before it.
STALE_PROFILE_LIMIT = 0.20
#: A profile older than this is called stale before the run's first round (`profile_age_warning`).
STALE_PROFILE_AGE_S = 7 * 24 * 3600.0


def profiled_at(profiles: Mapping[str, Sequence[Mapping[str, Any]]]) -> dict[str, float]:
    """Return when each device's profile was measured: the newest ``finished_at`` of its rows (pure).

    Parameters
    ----------
    profiles : mapping of str to sequence of mapping
        Profile rows per device (`fl.server.profiles_for`).

    Returns
    -------
    dict of str to float
        Unix seconds; devices whose rows do not say are left out.
    """
    out: dict[str, float] = {}
    for device, rows in profiles.items():
        times = [float(t) for r in rows if isinstance(t := r.get("finished_at"), (int, float)) and t > 0]
        if times:
            out[str(device)] = max(times)
    return out


def profiled_export_formats(profiles: Mapping[str, Sequence[Mapping[str, Any]]]) -> dict[str, set[str]]:
    """Return the artifact export formats each device's profile was measured on (pure).

    Parameters
    ----------
    profiles : mapping of str to sequence of mapping
        Profile rows per device (`harness.store.ProfileStore.latest_cells` records).

    Returns
    -------
    dict of str to set of str
        Per device, the ``export_format`` of its rows; ``""`` for a row that does not say (a
        store written before the format was recorded).
    """
    return {str(device): {str(row.get("export_format") or "") for row in rows} for device, rows in profiles.items()}


def export_format_warning(
    device: str, formats: Iterable[str], current: int, changes: Mapping[int, str], first_recorded: int
) -> str | None:
    """Return the warning for a profile measured on artifacts of another export format, or None (pure).

    Parameters
    ----------
    device : str
    formats : iterable of str
        The formats of the device's profile rows (`profiled_export_formats`); ``""``
        for rows that do not record one.
    current : int
        The format this installation exports (`exporters.manifest.EXPORT_FORMAT_VERSION`).
    changes : mapping of int to str
        What each format changed that a step time can see (`exporters.manifest.timed_format_changes`);
        a profile is of another format only when one of these lies between its format and
        ``current``, and those newer than the profile's oldest format are named.
    first_recorded : int
        The first format cells recorded (`exporters.manifest.FIRST_RECORDED_EXPORT_FORMAT`):
        a row without one is older.

    Returns
    -------
    str or None
    """
    def number(f: str) -> int:
        return int(f) if f.isdigit() else first_recorded - 1

    other = {f for f in formats if number(f) > current or any(number(f) < n <= current for n in changes)}
    if not other:
        return None
    oldest = min(number(f) for f in other)
    named = sorted(f or f"unrecorded (before {first_recorded})" for f in other)
    since = "; ".join(f"format {n}: {what}" for n, what in sorted(changes.items()) if oldest < n <= current)
    return (
        f"device {device!r}: its profile was measured on artifacts of export format {', '.join(named)}, and this "
        f"version trains format {current}" + (f" ({since})" if since else "") + "; its rounds are planned on the "
        "profile and calibrated on their measured times; re-profile it (fleetbench profile)"
    )


def _when(unix_seconds: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(unix_seconds))


def profile_age_warning(device: str, measured_at: float | None, now: float) -> str | None:
    """Return the warning for a profile older than `STALE_PROFILE_AGE_S`, or None (pure).

    Parameters
    ----------
    device : str
    measured_at : float or None
        When the profile was measured (`profiled_at`), unix seconds.
    now : float
        Unix seconds.

    Returns
    -------
    str or None
    """
    if measured_at is None or now - measured_at <= STALE_PROFILE_AGE_S:
        return None
    days = (now - measured_at) / 86400.0
    return (
        f"device {device!r}: its profile was measured {days:.0f} days ago ({_when(measured_at)}); its rounds "
        f"are planned on it and calibrated on their measured times; re-profile it (fleetbench profile) if "
        f"its software or load changed"
    )


def stale_profile_warning(device: str, factor: float, rounds: int, measured_at: float | None = None) -> str | None:
    """Return the warning for a calibration factor that says the profile is stale, or None (pure).

    Parameters
    ----------
    device : str
    factor : float
        The device's calibration factor (`CalibratedPredictor.factor`): measured rounds over
        the profile's predictions.
    rounds : int
        How many of its rounds set it.
    measured_at : float, optional
        When the profile was measured, unix seconds.

    Returns
    -------
    str or None
        None while the factor is within `STALE_PROFILE_LIMIT` of 1.
    """
    if not math.isfinite(factor) or abs(factor - 1.0) <= STALE_PROFILE_LIMIT:
        return None
    when = "" if measured_at is None else f", measured {_when(measured_at)}"
    return (
        f"device {device!r}: its last {rounds} rounds took {factor:.2f} x what its profile{when} predicts: the "
        f"profile looks stale; its rounds are planned on the measured ones from now on; re-profile it "
        f"(fleetbench profile) before relying on planned rounds"
    )


def cpu_reference_from_rows(rows: Any, model: str, batch: int) -> Callable[[str, Arch], float | None]:
    """Return ``(device, arch) -> CPU seconds per step`` that the profile predicts for training ``arch``.

    The profile's cells carry the CPU time per image of their undisturbed samples
    (``cpu_median_us``, `harness.cell_view.cell_cpu_seconds`); the device's latency model
    (`harness.latency.fit`) is fitted on those instead of the wall times, in the
    configuration a round is costed with (`harness.roundcost.config_key`). A round's own
    CPU time per step set against it shows whether the host slowed the round's cpu, for a
    width the device has trained only once too (`CalibratedPredictor`).

    Parameters
    ----------
    rows : pandas.DataFrame, rows or ``{device: rows}``
        Profile rows (the run's matched profiles).
    model : str
    batch : int
        The run's local batch size.

    Returns
    -------
    callable
        None for a device without CPU times in its profile, or without a profile of ``model``.
    """
    from harness.latency import finite_positive, fit
    from harness.roundcost import config_key

    chosen = select(profile_rows(rows), model=model)
    # CPU times have no pass means: the fit takes ``median_us`` where ``pass_mean_us`` is None
    cpu_rows = [
        {**r, "median_us": r["cpu_median_us"], "pass_mean_us": None}
        for r in chosen
        if finite_positive(r.get("cpu_median_us"))
    ]
    models = fit(cpu_rows) if cpu_rows else {}
    cache: dict[tuple[str, tuple[int, ...]], float | None] = {}

    def reference(device: str, arch: Arch) -> float | None:
        key = (device, arch.sizes)
        if key not in cache:
            try:
                fitted = models[device]
                cache[key] = fitted.latency[config_key(fitted, model, batch, None)].predict(arch).value * batch
            except (KeyError, InputError):
                cache[key] = None
        return cache[key]

    return reference


@dataclass
class CalibratedPredictor:
    """A `ClientRoundPredictor` corrected by each device's measured rounds in this run.

    A profile predicts a round's shape well (how it grows with the width, the steps and the
    payload) but not always its level: a step's time depends on the values it trains on
    (the data, and the weights as training moves them), and a round makes its host work.
    So the prediction of a device's next round is the profile's times the median ratio
    measured / profile-predicted over the device's last `CALIBRATION_WINDOW` rounds,
    once it has `CALIBRATION_MIN_ROUNDS` (1 before). The server records only rounds that
    opened no session: a runner's first rounds also open its sessions, a once-per-run
    cost the round-cost model leaves out. The profile's own prediction is kept beside it in every client
    round's metrics (``profile_predicted_seconds``, ``calibration``). A resumed run starts
    from the profiles again.

    **Rounds the host slowed** do not calibrate: with ``cpu_reference``, a round whose step
    loop cost more than `HOST_DISTURBANCE_LIMIT` more CPU per step than the profile predicts
    for its architecture ran on a cpu slowed from outside the device (as `host_disturbed`
    judges rounds against each other, which needs rounds at the same width on both sides);
    its ratio would carry that stretch into the next rounds' predictions. Nor do rounds
    whose transfers stalled against the device's earlier rounds (`transfer_stalled`, with
    no later rounds to see yet). Only when a device's last `CALIBRATION_WINDOW` rounds were
    all slowed do they calibrate: a slowdown that lasts is the level the next round will see.
    A FjORD round that drew several widths is judged by its CPU per step over the profile's
    mean at its draws (`cpu_vs_mix`) against the device's cheapest recent such round
    (`mix_slowdown`): switching widths costs CPU that the profile's steps do not carry.

    Attributes
    ----------
    base : ClientRoundPredictor
        The profile's predictor.
    window : int
        Rounds per device that calibrate it.
    min_rounds : int
        Rounds a device needs before its factor departs from 1.
    cpu_reference : callable, optional
        ``(device, arch) -> CPU seconds per step`` (`cpu_reference_from_rows`); without it no
        round is judged.
    warn : callable, optional
        Receives `stale_profile_warning`'s line, once per device, when its factor says its
        profile is stale.
    measured_at : mapping of str to float
        When each device's profile was measured (`profiled_at`), for that line.
    mixes : dict of str to list of float
        Per device, `cpu_vs_mix` of its last rounds that drew several widths (as many as
        `HOST_DISTURBANCE_SPAN`), oldest first (`mix_slowdown`).
    rounds : dict of str to list of (float, bool)
        Per device, each of its rounds so far, oldest first: measured / profile-predicted,
        and whether the host slowed it (or its transfers stalled).
    transfers : dict of str to list of (float, float) or None
        Per device, the transfer seconds and bytes of its last observed rounds (as many as
        `HOST_DISTURBANCE_SPAN` and the newest), oldest first.
    warned : set of str
        The devices whose stale profile was said.
    """

    base: ClientRoundPredictor
    window: int = CALIBRATION_WINDOW
    min_rounds: int = CALIBRATION_MIN_ROUNDS
    cpu_reference: Callable[[str, Arch], float | None] | None = None
    warn: Callable[[str], None] | None = None
    measured_at: Mapping[str, float] = field(default_factory=dict)
    mixes: dict[str, list[float]] = field(default_factory=dict)
    rounds: dict[str, list[tuple[float, bool]]] = field(default_factory=dict)
    transfers: dict[str, list[tuple[float, float] | None]] = field(default_factory=dict)
    warned: set[str] = field(default_factory=set)

    @property
    def devices(self) -> frozenset[str]:
        """The devices ``base`` predicts."""
        return self.base.devices

    def factor(self, device: str | None) -> float:
        """Return the calibration factor of ``device`` (1.0 until it has ``min_rounds`` calibrating rounds)."""
        counted = self.calibrating(device)
        if len(counted) < self.min_rounds:
            return 1.0
        return float(statistics.median(counted))

    def calibrating(self, device: str | None) -> list[float]:
        """Return the ratios measured / profile-predicted of ``device``'s rounds that set its factor, oldest first."""
        seen = self.rounds.get(device or "", [])
        if len(seen) >= self.window and all(slowed for _, slowed in seen[-self.window :]):
            return [ratio for ratio, _ in seen[-self.window :]]
        return [ratio for ratio, slowed in seen if not slowed][-self.window :]

    def __call__(self, client: ClientSpec, arch: Arch, bytes_down: int | None = None) -> float | None:
        """Return the calibrated prediction of ``client``'s round at ``arch`` (None: not predictable)."""
        value = self.base(client, arch, bytes_down)
        return None if value is None else value * self.factor(client.device)

    def cpu_slowdown(self, device: str, arch: Arch | None, cpu_per_step: float | None) -> float | None:
        """Return a round's CPU seconds per step over the profile's for ``arch`` (None: not judged).

        Parameters
        ----------
        device : str
        arch : Arch or None
            The architecture every step trained (None: several, FjORD's draws).
        cpu_per_step : float or None
            The round's step loop CPU seconds per step.
        """
        if self.cpu_reference is None or arch is None or cpu_per_step is None or not math.isfinite(cpu_per_step):
            return None
        reference = self.cpu_reference(device, arch)
        return None if reference is None or reference <= 0 else float(cpu_per_step) / reference

    def cpu_vs_mix(self, device: str, drawn: Sequence[tuple[Arch, float]], cpu_per_step: float | None) -> float | None:
        """Return a round's CPU seconds per step over the profile's mean at the architectures its steps drew.

        Parameters
        ----------
        device : str
        drawn : sequence of (Arch, float)
            Each architecture a step trained and how many steps trained it (FjORD's draws,
            `drawn_steps`).
        cpu_per_step : float or None
            The round's step loop CPU seconds per step.

        Returns
        -------
        float or None
            None without a reference for every architecture drawn, or without the round's
            CPU time. Switching widths costs CPU too, so this is above 1 on an undisturbed
            round; `mix_slowdown` judges it against the device's other such rounds.
        """
        steps = sum(n for _, n in drawn)
        if self.cpu_reference is None or steps <= 0 or cpu_per_step is None or not math.isfinite(cpu_per_step):
            return None
        references = [self.cpu_reference(device, arch) for arch, _ in drawn]
        known = [float(r) for r in references if r is not None and r > 0]
        if len(known) != len(drawn):
            return None
        expected = sum(r * n for r, (_, n) in zip(known, drawn, strict=True)) / steps
        return float(cpu_per_step) / expected

    def mix_slowdown(self, device: str, cpu_vs_mix: float | None) -> float | None:
        """Record a round's `cpu_vs_mix` and return it over the lowest of the device's last such rounds.

        The cost of switching widths varies little from round to round on one device (on
        the example emulated fleet, `cpu_vs_mix` 1.05 to 1.12 over a quiet run's FjORD
        rounds on one device), so a round's excess over the device's cheapest recent one
        says, as `host_disturbed` does for one width, that the host slowed its cpu.

        Parameters
        ----------
        device : str
        cpu_vs_mix : float or None
            `cpu_vs_mix` of the round (None: nothing recorded).

        Returns
        -------
        float or None
            None for the device's first such round (no reference yet) or without a value;
            above ``1 + HOST_DISTURBANCE_LIMIT``, `slowed_by_host` says the host slowed it.
        """
        if cpu_vs_mix is None or not math.isfinite(cpu_vs_mix) or cpu_vs_mix <= 0:
            return None
        earlier = self.mixes.setdefault(device, [])
        slowdown = cpu_vs_mix / min(earlier) if earlier else None
        earlier.append(float(cpu_vs_mix))
        del earlier[:-HOST_DISTURBANCE_SPAN]
        return slowdown

    def observe(
        self,
        device: str,
        profile_seconds: float,
        measured_seconds: float,
        slowdown: float | None = None,
        transfer: tuple[float, float] | None = None,
    ) -> None:
        """Record one measured round of ``device`` against the profile's prediction of it.

        Parameters
        ----------
        device : str
        profile_seconds : float
            The uncalibrated prediction (``base``'s); not positive or not finite: ignored.
        measured_seconds : float
            Download, compute and upload of the round as measured.
        slowdown : float, optional
            `cpu_slowdown` of the round; above ``1 + HOST_DISTURBANCE_LIMIT`` the round
            was slowed by the host.
        transfer : (float, float), optional
            The round's transfer seconds (download plus upload) and bytes (both ways),
            judged by `transfer_stalled` against the device's earlier rounds.
        """
        if profile_seconds > 0 and math.isfinite(profile_seconds) and math.isfinite(measured_seconds):
            ratio = float(measured_seconds) / float(profile_seconds)
            earlier = self.transfers.setdefault(device, [])
            earlier.append(transfer)
            del earlier[: -(HOST_DISTURBANCE_SPAN + 1)]  # the rounds that can set this one's reference
            stalled = transfer_stalled(earlier, [None] * (len(earlier) - 1) + [float(measured_seconds)])[-1]
            self.rounds.setdefault(device, []).append((ratio, slowed_by_host(slowdown) or stalled))
            if self.warn is not None and device not in self.warned:
                counted = len(self.calibrating(device))
                line = stale_profile_warning(device, self.factor(device), counted, self.measured_at.get(device))
                if line is not None:
                    self.warned.add(device)
                    self.warn(line)


#: A client round whose step loop cost more than this much more CPU per step than the
#: cheapest comparable round nearby ran while something outside its device slowed the cpu
#: (the runner's ``DISTURBANCE_LIMIT`` for a bench run's samples).
HOST_DISTURBANCE_LIMIT = 0.10
#: Rounds on either side of a round among which the cheapest sets its reference.
HOST_DISTURBANCE_SPAN = 4
#: What a round flagged disturbed met (`host_disturbed`, `cpu_starved`, `slowed_by_host`,
#: `transfer_stalled`), in words for the demo and the benchmark.
DISTURBANCE_RULES = (
    f"CPU per step more than {HOST_DISTURBANCE_LIMIT:.0%} above the device's other rounds at that width (or "
    f"draws) or above its profile's, {HOST_DISTURBANCE_LIMIT:.0%} more wall time per CPU second than its other rounds, "
    f"or transfers slower than its other rounds' by more than {HOST_DISTURBANCE_LIMIT:.0%} of the round"
)


def slowed_by_host(cpu_vs_profile: float | None) -> bool:
    """Say whether a round's CPU per step over its profile's says the host slowed its cpu (pure).

    Parameters
    ----------
    cpu_vs_profile : float or None
        `CalibratedPredictor.cpu_slowdown` of the round (None or NaN: not judged).

    Returns
    -------
    bool
        True above ``1 + HOST_DISTURBANCE_LIMIT``.
    """
    return cpu_vs_profile is not None and cpu_vs_profile > 1.0 + HOST_DISTURBANCE_LIMIT


def drawn_steps(metrics: Mapping[str, Any]) -> dict[float, float]:
    """Return the steps a logged client round trained at each width (pure).

    Parameters
    ----------
    metrics : Mapping
        A client round's logged metrics: ``steps_at_width`` maps each width a FjORD
        per-step round drew (as text) to its steps. Rounds logged by earlier versions
        carry one ``steps_at_width/<w>`` key per width instead; both are read.

    Returns
    -------
    dict of float to float
        Width to steps, for the widths with at least one step; empty for a round that did
        not log its draws.
    """
    nested = metrics.get("steps_at_width")
    pairs = list(nested.items()) if isinstance(nested, Mapping) else []
    pairs += [(key.split("/", 1)[1], value) for key, value in metrics.items() if key.startswith("steps_at_width/")]
    out: dict[float, float] = {}
    for width, value in pairs:
        try:
            w, steps = float(width), float(value)
        except (TypeError, ValueError):
            continue
        if math.isfinite(steps) and steps > 0:
            out[w] = steps
    return out


def loop_cpu_per_step(metrics: Mapping[str, Any]) -> float | None:
    """Return the step loop's CPU seconds per step of a resident runner's round (pure).

    Parameters
    ----------
    metrics : Mapping
        A client round's metrics (``loop_cpu_seconds``, ``steps``).

    Returns
    -------
    float or None
        None where either is missing, not a finite number, or the round took no step.
    """
    try:
        cpu, steps = float(metrics["loop_cpu_seconds"]), float(metrics["steps"])
    except (KeyError, TypeError, ValueError):
        return None
    return cpu / steps if math.isfinite(cpu) and steps > 0 else None


def host_disturbed(
    cpu_per_step: Sequence[float | None], limit: float = HOST_DISTURBANCE_LIMIT, span: int = HOST_DISTURBANCE_SPAN
) -> list[bool]:
    """Flag the rounds whose CPU time per step says the host slowed the device's cpu (pure).

    A training step at one configuration is the same work every round, and a CPU quota
    stops a process without charging it CPU time, so a round's CPU time per step rises
    only when something outside the device slows the cpu it runs on (a neighbour on the
    host's caches and memory bandwidth, an SMT sibling), in windows of a fraction of a
    second to a second in which a step costs up to nearly twice its CPU time. Such a round
    is slower than any round-cost model predicts, and it says so.

    Parameters
    ----------
    cpu_per_step : sequence of float or None
        One device's rounds at one configuration (width, architecture), in round order:
        the step loop's CPU seconds per step (``loop_cpu_seconds / steps``); None where
        not measured.
    limit : float
        Relative excess over the reference that flags a round.
    span : int
        The reference of round ``i`` is the lowest value among rounds ``i - span`` to
        ``i + span``; a round is never its own only reference (a lone round is not flagged).

    Returns
    -------
    list of bool
        One flag per round; False where the value is None.
    """
    values = list(cpu_per_step)
    flags = []
    for i, value in enumerate(values):
        first = max(0, i - span)
        near = enumerate(values[first : i + span + 1], start=first)
        known = [v for j, v in near if j != i and v is not None and v > 0]
        flags.append(value is not None and bool(known) and value > (1.0 + limit) * min([value, *known]))
    return flags


def transfer_stalled(
    transfers: Sequence[tuple[float, float] | None],
    round_seconds: Sequence[float | None],
    limit: float = HOST_DISTURBANCE_LIMIT,
    span: int = HOST_DISTURBANCE_SPAN,
) -> list[bool]:
    """Flag the rounds whose transfers stalled: slower than nearby rounds' by a share of the round (pure).

    A round's transfers (parameters down, update up) take about the same time every round
    for the same payload over the same link. A round whose transfers took longer than the
    fastest nearby round would have needed for its payload, by more than ``limit`` of the
    round's own time, met a hiccup of the link or of the host's network stack (on the
    example emulated fleet: an upload of 0.27 s where the device's other rounds took 2 to 21 ms),
    which no round-cost model predicts. The CPU rules (`host_disturbed`, `cpu_starved`)
    see only the step loop, not the transfers.

    Parameters
    ----------
    transfers : sequence of (float, float) or None
        One device's rounds in one run, in round order, any width: the transfer seconds
        (download plus upload) and bytes (both ways); None where not measured.
    round_seconds : sequence of float or None
        The same rounds' measured time (download, compute and upload).
    limit : float
        Excess over the reference, as a share of the round's time, that flags a round.
    span : int
        Rounds on either side whose transfers set the reference: each nearby round ``j``
        says a payload of ``b`` bytes needs at most ``s_j * max(1, b / b_j)`` seconds (its
        time, stretched by the byte ratio where this payload is larger), and the reference
        is the lowest of those. A round is never its own reference.

    Returns
    -------
    list of bool
        One flag per round; False where its transfers or time are not known.
    """
    flags = []
    for i, (own, seconds) in enumerate(zip(transfers, round_seconds, strict=True)):
        if own is None or seconds is None or not (own[1] > 0 and seconds > 0):
            flags.append(False)
            continue
        first = max(0, i - span)
        near = [t for j, t in enumerate(transfers[first : i + span + 1], start=first) if j != i and t is not None]
        bounds = [s * max(1.0, own[1] / b) for s, b in near if b > 0 and math.isfinite(s)]
        flags.append(bool(bounds) and own[0] - min(bounds) > limit * seconds)
    return flags


def cpu_starved(
    cpu_share: Sequence[float | None], limit: float = HOST_DISTURBANCE_LIMIT, span: int = HOST_DISTURBANCE_SPAN
) -> list[bool]:
    """Flag the rounds whose step loop got less of a cpu than the device's other rounds (pure).

    A round's CPU share is its step loop's CPU seconds per wall second
    (``loop_cpu_seconds / loop_seconds``). It is the device's CPU quota (or one cpu per
    thread) whatever the width: on the example emulated fleet it stayed within 3 % of a
    device's quota over a run's rounds. A round that got clearly less waited for its cpu
    while something else held it (another process on the device's cpus, the hypervisor),
    which neither adds CPU time per step (`host_disturbed` does not see it) nor any
    round-cost model predicts.

    Parameters
    ----------
    cpu_share : sequence of float or None
        One device's rounds in one run, in round order, any width; None where not measured.
    limit : float
        Relative excess of wall seconds per CPU second over the nearby rounds' lowest that
        flags a round: a share below ``1 / (1 + limit)`` of the highest nearby.
    span : int
        As `host_disturbed`.

    Returns
    -------
    list of bool
        One flag per round; False where the share is None or not positive.
    """
    inverse = [1.0 / v if v is not None and v > 0 else None for v in cpu_share]
    return host_disturbed(inverse, limit, span)


def executor_configs(executor: Any, devices: Iterable[Any], batch: int) -> dict[str, ProfileConfig]:
    """Return the configuration each device trains with under a devices executor.

    Parameters
    ----------
    executor : fl.executors.devices.DevicesExecutor
        Its ``backend_of(device)``, ``threads_of(device)`` and ``optimizer``.
    devices : iterable of devices.fleet.Device
    batch : int
        The run's local batch size.

    Returns
    -------
    dict of str to ProfileConfig
    """
    return {
        d.name: ProfileConfig(
            batch=batch, backend=executor.backend_of(d), optimizer=executor.optimizer, threads=executor.threads_of(d)
        )
        for d in devices
    }


def run_predictor(
    store: Any,
    model: str,
    batch: int,
    epochs: int,
    devices: Iterable[str],
    profiles: Mapping[str, Sequence[Mapping[str, Any]]],
    device_configs: Mapping[str, ProfileConfig] | None,
    cost: RoundCost | None,
    *,
    warn: Callable[[str], None],
    now: float,
) -> CalibratedPredictor | None:
    """Return the calibrated predictor of a run's client rounds, or None when nothing can be predicted.

    The round cost is ``cost`` when given (a plan's, whose fit it reuses), else built from the
    store's profiles and round costs of the clients' devices in the configuration each trains
    with (`round_cost_from_store`); either predicts the devices with a usable profile of
    ``model``. Each predicted device's profile age and export format are checked once (a
    warning each through ``warn``).

    Parameters
    ----------
    store : harness.store.ProfileStore
    model : str
    batch, epochs : int
        The run's local batch and epochs.
    devices : iterable of str
        The clients' devices.
    profiles : mapping of str to rows
        The devices' profile rows the run uses (``fl.server.profiles_for``).
    device_configs : mapping of str to ProfileConfig, optional
    cost : RoundCost, optional
    warn : callable
    now : float
        Unix time the profiles' ages are judged at.

    Returns
    -------
    CalibratedPredictor or None
    """
    from exporters.manifest import EXPORT_FORMAT_VERSION, FIRST_RECORDED_EXPORT_FORMAT, timed_format_changes

    measured = {d for d, ok in measured_models(profiles).items() if model in ok and d in set(devices)}
    if not measured:
        return None
    if cost is None:
        configs = device_configs or {}
        wants = {d: configs.get(d, ProfileConfig(batch=batch)) for d in sorted(measured)}
        try:
            cost = round_cost_from_store(store, model, batch, wants, warn=warn)
        except InputError as exc:
            warn(f"client rounds are not predicted: {exc}")
            return None
    predictor = ClientRoundPredictor(cost, batch, epochs, frozenset(measured))
    measured_at = profiled_at(profiles)
    formats = profiled_export_formats(profiles)
    for device in sorted(predictor.devices):
        for line in (
            profile_age_warning(device, measured_at.get(device), now),
            export_format_warning(
                device, formats.get(device, ()), EXPORT_FORMAT_VERSION, timed_format_changes(),
                FIRST_RECORDED_EXPORT_FORMAT,
            ),  # fmt: skip
        ):
            if line is not None:
                warn(line)
    return CalibratedPredictor(
        predictor, cpu_reference=cpu_reference_from_rows(profiles, model, batch), warn=warn, measured_at=measured_at
    )
