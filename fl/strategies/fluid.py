"""FLuID: stragglers train Invariant Dropout sub-models sized from their measured times.

Per round ``rnd`` (paper Algorithm 1; the maths is in `fl.maths.fluid`):

``configure_round``
    On a calibration round (the first round with known times, then every
    ``calibration_period`` rounds) the stragglers are re-determined from every
    sampled client's latest end-to-end time, re-estimated as a full-model time
    (``T / r`` for a client that trained a sub-model of width ``r``, or with its
    device's measured curve), so that a different client that became slowest
    takes over as straggler and every straggler's width is recomputed. A
    straggler's width comes from its device's latency-vs-width profile for this
    model when ``profiles`` has one (the width whose predicted time is closest to the target), else
    from the linear rule (width closest to 1 / speed-up, ties to the smaller width):
    `fl.maths.fluid.straggler_width`, the project's one straggler sizing. Stragglers train
    sub-models of the chosen dropout (``invariant``: invariant neurons first,
    random fill; ``ordered``: FjORD prefix; ``random``: uniform draw), everyone
    else the full model. Per-layer thresholds are raised until enough neurons are
    invariant.
``aggregate_round``
    Non-stragglers' updates give each neuron's invariance score (and, in the first
    ``threshold_init_rounds`` rounds, the initial thresholds); the clients' round
    times are recorded; the global model is the sample-count weighted average per
    weight over the clients that held it (`fl.maths.aggregate.selective_average`). A
    client that timed out counts with the seconds it was waited for.

**On the predicted round** (when the server gives the strategy a round predictor, the
round-cost model of `fl.roundcost`: fixed cost, steps at the sub-model's architecture and
transfers of its payload): the stragglers are still the clients with the slowest measured
times, but the target is the *predicted* full-model round of the slowest non-straggler, and a
straggler's width is the one whose predicted round is closest to that target
(`fl.maths.fluid.curve_width` on the predicted round as a function of the width). **Decision:**
target and width come from one model, so its bias toward one device cancels between them,
and a fixed cost no width can remove is seen before the round (the smallest width is then
chosen, and the demo shows the straggler above its target). Without a predictor, or for a
client without a prediction, the measured rules below apply.

Round times are ``TrainRes.round_seconds`` (download + compute + upload). Only the
training steps scale with the sub-model width: the rest of a client's time (transfers and, on
a device, the runner's start and loading, see `FLuID.fixed_seconds`) is carried over
unchanged when times are re-estimated or predicted for another width. For
in-process runs, where every client runs on the same machine, ``slowdown``
(``{"c0": 3.0}``) multiplies a client's measured compute seconds: a *simulation*
of a slower device that lets the straggler logic run without hardware; with real
devices leave it empty.
"""

from __future__ import annotations

import json
import math
import zlib
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from exporters.arch import SubModel
from exporters.userinput import InputError
from exporters.zoo import ZooModel
from fl.maths import fluid
from fl.maths.aggregate import selective_average
from fl.maths.submodels import random_submodel
from fl.records import ClientFailure, ClientSpec, Params, RoundMetrics, TrainIns, TrainRes
from fl.renamed_keys import current_fluid_memory
from fl.scheduling.checks import check_width, check_widths
from fl.strategies.base import Profiles, Strategy
from fl.strategies.fedavg import parse_bool

#: Values of the ``dropout`` option.
DROPOUTS = ("invariant", "ordered", "random")


class FLuID(Strategy):
    """Federated Learning using Invariant Dropout (Wang et al.).

    Parameters
    ----------
    model, initial, seed, local
        See `fl.strategies.base.Strategy`.
    dropout : {"invariant", "ordered", "random"}
        How stragglers' sub-models are chosen (the paper's method and its two baselines).
    widths : sequence of float or str
        Available sub-model widths (paper Table 2: 0.95, 0.85, 0.75, 0.65, 0.5);
        a string is JSON or comma-separated.
    width : float, optional
        Fixed width for every straggler (Table 2's experiments), bypassing the
        time-based choice; stragglers are still detected from times.
    num_stragglers : int
        Stragglers per calibration (the paper's phones: 1).
    straggler_fraction : float, optional
        Instead the slowest fraction of the sampled clients (the paper's simulations: 0.2).
    calibration_period : int
        Rounds between calibrations (the paper calibrates every epoch: 1).
    quorum : float
        Fraction of non-stragglers for which a neuron must be invariant (0.75).
    threshold_step : float
        Multiplicative threshold increment (0.1: ``th <- 1.1 * th``).
    threshold_init_rounds : int
        Rounds whose minimum neuron change is averaged into the initial thresholds.
    slowdown : mapping of str to float or str
        Simulated slow-down factor of a client's compute time (in-process runs).
    use_profiles : bool
        Use the devices' measured curves when available (else always the linear rule).
    planned : mapping or JSON str, optional
        A plan's start (`fl.plan.strategy_options`): ``{"target": seconds, "stragglers":
        {cid: width}}``. Those stragglers train at those widths from the first round, before
        any round was measured; the first calibration then replaces them.
    """

    name = "fluid"

    def __init__(
        self,
        model: ZooModel,
        initial: Params,
        seed: int = 0,
        local: Mapping[str, Any] | None = None,
        *,
        dropout: str = "invariant",
        widths: Sequence[float] | float | str = fluid.PAPER_WIDTHS,
        width: float | str | None = None,
        num_stragglers: int | str = 1,
        straggler_fraction: float | str | None = None,
        calibration_period: int | str = 1,
        quorum: float | str = fluid.DEFAULT_QUORUM,
        threshold_step: float | str = fluid.DEFAULT_THRESHOLD_STEP,
        threshold_init_rounds: int | str = 1,
        slowdown: Mapping[str, float] | str | None = None,
        use_profiles: bool | str = True,
        planned: Mapping[str, Any] | str | None = None,
    ) -> None:
        super().__init__(model, initial, seed=seed, local=local)
        if dropout not in DROPOUTS:
            raise InputError(f"unknown FLuID dropout {dropout!r}; known: {', '.join(DROPOUTS)}")
        self.dropout = dropout
        self.widths = _parse_widths(widths)
        self.fixed_width = None if width in (None, "", "none", "None") else check_width(width, "FLuID width")
        self.num_stragglers = int(num_stragglers)
        self.straggler_fraction = (
            None if straggler_fraction in (None, "", "none", "None") else float(straggler_fraction)
        )
        fluid.straggler_count(2, self.num_stragglers, self.straggler_fraction)  # validates both
        self.calibration_period = int(calibration_period)
        if self.calibration_period < 1:
            raise InputError(f"calibration_period {calibration_period!r} must be at least 1")
        self.quorum = float(quorum)
        if not 0.0 < self.quorum <= 1.0:
            raise InputError(f"quorum {quorum!r} is outside (0, 1]")
        self.threshold_step = float(threshold_step)
        if not self.threshold_step > 0:
            raise InputError(f"threshold_step {threshold_step!r} is not positive")
        self.threshold_init_rounds = int(threshold_init_rounds)
        if self.threshold_init_rounds < 1:
            raise InputError(f"threshold_init_rounds {threshold_init_rounds!r} must be at least 1")
        self.slowdown = _parse_slowdown(slowdown)
        self.use_profiles = parse_bool(use_profiles, "use_profiles")
        # memory across rounds (all of it in state())
        self.stragglers: list[str] = []
        self.client_widths: dict[str, float] = {}
        self.assigned: dict[str, float] = {}
        self.last_seconds: dict[str, float] = {}
        self.last_width: dict[str, float] = {}
        self.last_fixed: dict[str, float] = {}
        self.thresholds: dict[str, float] = {}
        self.threshold_history: dict[str, list[float]] = {}
        self.scores: dict[str, np.ndarray] | None = None
        self.last_calibration: int | None = None
        self.target_seconds: float | None = None
        self._start_from(_parse_planned(planned))

    def _start_from(self, planned: Mapping[str, Any]) -> None:
        """Take a plan's stragglers, widths and target as the state before the first calibration."""
        if not planned:
            return
        widths = {str(cid): float(width) for cid, width in dict(planned.get("stragglers") or {}).items()}
        self.client_widths = {cid: width for cid, width in widths.items() if width < 1.0}
        self.stragglers = sorted(self.client_widths)
        target = planned.get("target")
        self.target_seconds = None if target is None else float(target)

    # -- round logic -------------------------------------------------------------------

    def configure_round(
        self, rnd: int, clients: Sequence[ClientSpec], profiles: Profiles | None = None
    ) -> dict[str, TrainIns]:
        """Calibrate when due, then give stragglers their sub-models and the others the full model."""
        predictors = self._predictors(clients, profiles)
        if self._calibration_due(rnd, clients):
            self.calibrate(rnd, clients, predictors)
        sampled = {c.cid for c in clients}
        active = {cid: r for cid, r in self.client_widths.items() if cid in sampled and cid in self.stragglers}
        if self.dropout == "invariant" and self.scores is not None and active:
            self._raise_thresholds(active.values())
        full = self.model.static(1.0)
        out: dict[str, TrainIns] = {}
        self.assigned = {}
        for client in clients:
            width = active.get(client.cid, 1.0)
            submodel = full if width >= 1.0 else self._straggler_submodel(rnd, client.cid, width)
            self.assigned[client.cid] = width
            config = self.client_config(rnd, client.cid, straggler=client.cid in active, width=width)
            out[client.cid] = TrainIns(client.cid, submodel, self.model.extract(self.global_state, submodel), config)
        return out

    def aggregate_round(
        self, rnd: int, results: Sequence[TrainRes], failures: Sequence[ClientFailure]
    ) -> tuple[Params, RoundMetrics]:
        """Update invariance scores and round times, then average per weight over its holders."""
        full_results = [r for r in results if self.assigned.get(r.cid, 1.0) >= 1.0]
        if full_results:
            changes = [fluid.neuron_changes(self.model, r.parameters, self.global_state) for r in full_results]
            self.scores = fluid.invariance_scores(changes, self.quorum)
            self._update_initial_thresholds(fluid.minimum_changes(changes))
        seconds: dict[str, float] = {}
        for res in results:
            seconds[res.cid] = self.simulated_seconds(res)
            self.last_seconds[res.cid] = self.steady_seconds(res)
            self.last_fixed[res.cid] = self.fixed_seconds(res)
            self.last_width[res.cid] = self.assigned.get(res.cid, 1.0)
        for failure in failures:
            if failure.reason == "timeout" and failure.seconds > 0:
                # a lower bound on its time: enough to make it a straggler at the next calibration
                self.last_seconds[failure.cid] = float(failure.seconds)
                self.last_width[failure.cid] = self.assigned.get(failure.cid, 1.0)
        if results:
            self.global_state = selective_average(
                self.model, self.global_state, [(r.submodel, r.parameters, float(r.num_examples)) for r in results]
            )
        return self.global_state, self._metrics(seconds, failures)

    def eval_submodels(self, clients: Sequence[ClientSpec]) -> dict[float, SubModel]:
        """Evaluate the full model only: every client, stragglers included, infers with it."""
        return {1.0: self.model.static(1.0)}

    def simulated_seconds(self, res: TrainRes) -> float:
        """Return a result's end-to-end time with the client's simulated compute slow-down applied."""
        factor = self.slowdown.get(res.cid, 1.0)
        return float(res.download_seconds + factor * res.compute_seconds + res.upload_seconds)

    def steady_seconds(self, res: TrainRes) -> float:
        """Return `simulated_seconds` less the once-per-run cost of opening the runner's sessions.

        A resident runner's first rounds also open its sessions (``metrics["session_open_seconds"]``
        from the ``devices`` executor); later rounds reuse them, so stragglers and their widths
        are decided on the time a round takes once the sessions are open.
        """
        opened = float(res.metrics.get("session_open_seconds", 0.0)) * self.slowdown.get(res.cid, 1.0)
        return max(self.simulated_seconds(res) - opened, 0.0)

    def fixed_seconds(self, res: TrainRes) -> float:
        """Return the part of a result's time that does not shrink with the sub-model.

        Transfers, plus, on a device, everything of the runner's wall time outside its
        training steps (interpreter and runtime start, loading artifacts and data): the
        ``devices`` executor reports the steps' sum as ``metrics["step_seconds"]``. In
        process the compute time is all training.
        """
        compute = float(res.compute_seconds)
        steps = float(res.metrics.get("step_seconds", compute))
        opened = float(res.metrics.get("session_open_seconds", 0.0))
        factor = self.slowdown.get(res.cid, 1.0)
        return float(res.download_seconds + res.upload_seconds + factor * max(compute - steps - opened, 0.0))

    def calibrate(
        self, rnd: int, clients: Sequence[ClientSpec], predictors: Mapping[str, fluid.LatencyPredictor]
    ) -> None:
        """Re-determine stragglers, the target time and every straggler's sub-model width.

        Parameters
        ----------
        rnd : int
            The round being configured.
        clients : sequence of ClientSpec
            Sampled clients; those without a measured time are not considered.
        predictors : mapping of str to callable
            Latency-vs-width curves of the clients that have one.
        """
        full_times = {
            c.cid: fluid.full_model_seconds(
                self.last_seconds[c.cid],
                self.last_width.get(c.cid, 1.0),
                predictors.get(c.cid),
                self.last_fixed.get(c.cid, 0.0),
            )
            for c in clients
            if c.cid in self.last_seconds
        }
        count = fluid.straggler_count(len(full_times), self.num_stragglers, self.straggler_fraction)
        stragglers, measured_target = fluid.find_stragglers(full_times, count)
        planned = self._predicted_plan(clients, full_times, stragglers)
        target, widths = (measured_target, {}) if planned is None else planned
        for cid in stragglers:
            if self.fixed_width is not None:
                widths[cid] = self.fixed_width
            elif cid not in widths:
                fixed = self.last_fixed.get(cid, 0.0)
                widths[cid] = fluid.straggler_width(
                    full_times[cid], measured_target, self.widths, predictors.get(cid), fixed
                )
        self.client_widths = {cid: r for cid, r in widths.items() if r < 1.0}
        self.stragglers = [cid for cid in stragglers if cid in self.client_widths]
        self.target_seconds = None if math.isnan(target) else target
        self.last_calibration = rnd

    def _predicted_plan(
        self, clients: Sequence[ClientSpec], full_times: Mapping[str, float], stragglers: Sequence[str]
    ) -> tuple[float, dict[str, float]] | None:
        """Return the target and the stragglers' widths planned on the predicted round, or None.

        The target is the predicted full-model round of the slowest non-straggler; a
        straggler's width is the one whose predicted round is closest to it (fixed cost and
        transfers included). None when there is no round predictor or a client lacks a
        prediction: the measured rules apply then. A straggler the model predicts no
        slower than the target at full width (the measurement and the model disagree) is
        left out of the widths returned and sized by the measured rule.
        """
        predictor = self.round_predictor
        others = [cid for cid in full_times if cid not in stragglers]
        if predictor is None or not stragglers or not others:
            return None
        by_cid = {c.cid: c for c in clients}
        full = self.model.arch(1.0)
        predicted = {cid: predictor(by_cid[cid], full) for cid in full_times}
        if any(value is None for value in predicted.values()):
            return None
        slowest_other = max(others, key=lambda cid: full_times[cid])
        target = float(predicted[slowest_other])  # type: ignore[arg-type]
        widths: dict[str, float] = {}
        for cid in stragglers:
            client = by_cid[cid]

            def round_at(width: float, client: ClientSpec = client) -> float:
                value = predictor(client, self.model.arch(width))
                return math.inf if value is None else float(value)

            full_round = round_at(1.0)
            if full_round > target:
                widths[cid] = fluid.curve_width(full_round, target, self.widths, round_at)
        return target, widths

    # -- helpers -----------------------------------------------------------------------

    def _calibration_due(self, rnd: int, clients: Sequence[ClientSpec]) -> bool:
        known = sum(1 for c in clients if c.cid in self.last_seconds)
        if known < 2:
            return False
        return self.last_calibration is None or rnd - self.last_calibration >= self.calibration_period

    def _predictors(
        self, clients: Sequence[ClientSpec], profiles: Profiles | None
    ) -> dict[str, fluid.LatencyPredictor]:
        if not profiles or not self.use_profiles:
            return {}
        curves: dict[str, fluid.LatencyPredictor | None] = {}
        out: dict[str, fluid.LatencyPredictor] = {}
        for client in clients:
            device = client.device
            if device is None or device not in profiles:
                continue
            if device not in curves:
                batch = _int_or_none(self.local.get("batch_size"))
                curves[device] = fluid.profile_predictor(profiles[device], self.model.name, batch)
            predictor = curves[device]
            if predictor is not None:
                out[client.cid] = predictor
        return out

    def _raise_thresholds(self, widths: Any) -> None:
        assert self.scores is not None
        needed = fluid.neurons_to_drop(self.model, list(widths))
        for group, scores in self.scores.items():
            current = self.thresholds.get(group, 0.0)
            self.thresholds[group] = fluid.raise_threshold(current, scores, needed[group], self.threshold_step)

    def _update_initial_thresholds(self, minima: Mapping[str, float]) -> None:
        for group, value in minima.items():
            history = self.threshold_history.setdefault(group, [])
            if len(history) >= self.threshold_init_rounds:
                continue
            if math.isfinite(value):
                history.append(float(value))
            if history:
                self.thresholds[group] = float(np.mean(history))

    def _straggler_submodel(self, rnd: int, cid: str, width: float) -> SubModel:
        rng = np.random.default_rng((self.seed, rnd, zlib.crc32(cid.encode())))
        if self.dropout == "ordered":
            return self.model.static(width)
        if self.dropout == "random":
            return random_submodel(self.model, width, rng)
        return fluid.invariant_submodel(self.model, width, self.scores, self.thresholds, rng)

    def _metrics(self, seconds: Mapping[str, float], failures: Sequence[ClientFailure]) -> dict[str, float]:
        stragglers = [cid for cid in seconds if self.assigned.get(cid, 1.0) < 1.0]
        others = [seconds[cid] for cid in seconds if cid not in stragglers]
        metrics: dict[str, float] = {
            "stragglers": float(len(stragglers)),
            "failures": float(len(failures)),
            "round_seconds": max(seconds.values(), default=0.0),
        }
        if self.target_seconds is not None:
            metrics["target_seconds"] = self.target_seconds
        if stragglers:
            metrics["straggler_width"] = min(self.assigned[cid] for cid in stragglers)
            metrics["straggler_seconds"] = max(seconds[cid] for cid in stragglers)
            if others:
                # the paper's Fig. 4a check: straggler time vs the slowest non-straggler this round
                metrics["straggler_over_target"] = metrics["straggler_seconds"] / max(others)
        if self.scores is not None:
            counts = [fluid.invariant_count(s, self.thresholds.get(g, -math.inf)) for g, s in self.scores.items()]
            metrics["invariant_fraction"] = float(sum(counts)) / float(sum(self.model.group_sizes))
        return metrics

    # -- checkpointing -----------------------------------------------------------------

    def state(self) -> dict[str, Any]:
        """Return the global model, invariance scores and the calibration memory (numpy / JSON)."""
        return {
            "global": self.global_state,
            "scores": {} if self.scores is None else {g: np.array(s, copy=True) for g, s in self.scores.items()},
            "fluid": {
                "has_scores": self.scores is not None,
                "stragglers": list(self.stragglers),
                "client_widths": dict(self.client_widths),
                "assigned": dict(self.assigned),
                "last_seconds": dict(self.last_seconds),
                "last_width": dict(self.last_width),
                "last_fixed": dict(self.last_fixed),
                "thresholds": dict(self.thresholds),
                "threshold_history": {g: list(h) for g, h in self.threshold_history.items()},
                "last_calibration": self.last_calibration,
                "target_seconds": self.target_seconds,
            },
        }

    def load_state(self, state: Mapping[str, Any]) -> None:
        """Restore what `state` returned (a checkpoint's memory under older keys too: `fl.renamed_keys`)."""
        super().load_state(state)
        memory = current_fluid_memory(state["fluid"])
        self.scores = (
            {g: np.asarray(s, dtype=np.float64).copy() for g, s in state["scores"].items()}
            if memory["has_scores"]
            else None
        )
        self.stragglers = [str(c) for c in memory["stragglers"]]
        self.client_widths = {str(k): float(v) for k, v in memory["client_widths"].items()}
        self.assigned = {str(k): float(v) for k, v in memory["assigned"].items()}
        self.last_seconds = {str(k): float(v) for k, v in memory["last_seconds"].items()}
        self.last_width = {str(k): float(v) for k, v in memory["last_width"].items()}
        self.last_fixed = {str(k): float(v) for k, v in memory.get("last_fixed", {}).items()}
        self.thresholds = {str(k): float(v) for k, v in memory["thresholds"].items()}
        self.threshold_history = {str(g): [float(x) for x in h] for g, h in memory["threshold_history"].items()}
        last = memory["last_calibration"]
        self.last_calibration = None if last is None else int(last)
        target = memory["target_seconds"]
        self.target_seconds = None if target is None else float(target)


def _parse_planned(value: Mapping[str, Any] | str | None) -> dict[str, Any]:
    """Return the ``planned`` option: ``{"target": seconds, "stragglers": {cid: width}}`` (JSON text accepted).

    Raises
    ------
    InputError
        When it is not such an object, or a width is outside (0, 1].
    """
    if value in (None, "", "none", "None"):
        return {}
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            raise InputError(f"FLuID planned {value!r} is not JSON") from None
    if not isinstance(value, Mapping) or not isinstance(value.get("stragglers", {}), Mapping):
        raise InputError(f"FLuID planned {value!r}: expected {{'target': seconds, 'stragglers': {{cid: width}}}}")
    for cid, width in value.get("stragglers", {}).items():
        if not 0.0 < float(width) <= 1.0:
            raise InputError(f"FLuID planned width {width!r} of {cid} is outside (0, 1]")
    return dict(value)


def _parse_widths(widths: Sequence[float] | float | str) -> tuple[float, ...]:
    """Return the available sub-model widths, largest first (JSON text or comma-separated accepted)."""
    if isinstance(widths, int | float):
        widths = [float(widths)]
    if isinstance(widths, str):
        text = widths.strip()
        try:
            parsed = json.loads(text) if text.startswith("[") else [float(s) for s in text.split(",") if s.strip()]
        except ValueError:
            raise InputError(f"FLuID widths {widths!r} are not a list of numbers") from None
        widths = parsed
    try:
        values = check_widths(widths, "FLuID widths")
    except (TypeError, ValueError):
        raise InputError(f"FLuID widths {widths!r} are not a list of numbers") from None
    return tuple(sorted(set(values), reverse=True))


def _parse_slowdown(slowdown: Mapping[str, float] | str | None) -> dict[str, float]:
    if slowdown is None or slowdown == "":
        return {}
    if isinstance(slowdown, str):
        try:
            slowdown = json.loads(slowdown)
        except ValueError:
            raise InputError(f'slowdown {slowdown!r} is not a JSON object like {{"c0": 3.0}}') from None
    if not isinstance(slowdown, Mapping):
        raise InputError(f"slowdown {slowdown!r} is not a mapping of client id to factor")
    out = {}
    for cid, factor in slowdown.items():
        value = float(factor)
        if not value > 0 or math.isinf(value):
            raise InputError(f"slowdown factor {factor!r} of client {cid!r} is not a positive number")
        out[str(cid)] = value
    return out


def _int_or_none(value: Any) -> int | None:
    try:
        return None if value is None else int(value)
    except (TypeError, ValueError):
        return None
