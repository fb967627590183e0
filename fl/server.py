"""The FL server loop: sample clients, train them, aggregate, evaluate, log, checkpoint.

One run is a `RunConfig`; `run_fl` executes it round by round:

1. **Sampling.** Round ``rnd`` (0-based) draws its clients with
   ``numpy.random.default_rng((seed, rnd))`` (see `sample_clients`), so the draw of
   a round depends on nothing but the seed and the round number; a resumed run
   draws exactly what an uninterrupted one would.
2. **Training.** ``strategy.configure_round`` gives one `TrainIns` per sampled
   client; the executor (``inprocess`` by default) trains them; failed clients
   come back as `ClientFailure` and the round goes on without them. A result the
   global model must not take (parameters not as sent, NaN or Inf, a negative count
   or time: `refuse_invalid_results`) fails its client the same way.
3. **Aggregation** by ``strategy.aggregate_round``.
4. **Evaluation** of the global model on the test set at every width of
   ``strategy.eval_submodels(clients)``, every ``eval_every`` rounds and always
   after the last round.
5. **Log and checkpoint**: one transaction of the profile store holds the
   round's row, its client rows and a checkpoint ``{"round", "strategy"}``
   (see `fl.runlog`). ``resume_run`` reloads the stored configuration and the
   checkpoint and continues with the next round.

Exactness of resume: the global model's initial parameters come from
``torch.manual_seed(seed)``; data partition and capacities from the seed;
client sampling and every client's local seed from ``(seed, rnd, ...)``; the
strategy's memory from its checkpointed ``state()``. Nothing else carries from
round to round, so "2 rounds, then resume to 3" ends bit-identical to "3 rounds".
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from exporters.arch import Arch
from exporters.userinput import InputError
from exporters.zoo import ZooModel, get_model
from fl.executors import EXECUTORS, Executor, Shard, make_executor
from fl.population import (
    DEFAULT_VARIATION,
    RoundSchedule,
    Timing,
    VirtualClock,
    client_index,
    full_batch_steps,
    payload_bytes,
)
from fl.records import ClientFailure, ClientSpec, TrainIns, TrainRes
from fl.renamed_keys import current_options
from fl.roundcost import loop_cpu_per_step, payload_bytes_of, run_predictor
from fl.runlog import ClientRound, RunLog, round_energy_totals
from fl.scheduling.configs import ProfileConfig, matched_profiles
from fl.scheduling.energy import EnergyCurve, energy_cells, energy_curves, round_energy, round_images
from fl.scheduling.rows import width_flops
from fl.strategies import STRATEGIES, strategy_class
from fl.strategies.base import Profiles, Strategy
from harness.records import model_record
from harness.roundcost import RoundCost
from harness.store import DEFAULT_DB, ProfileStore

#: Config fields a resumed run may change (they do not affect the trained model).
RESUMABLE_CHANGES = frozenset(
    {"rounds", "executor", "workers", "db", "eval_every", "timeout_s", "max_failed_rounds", "profiles"}
)


@dataclass(frozen=True)
class RunConfig:
    """Everything that defines an FL run.

    Attributes
    ----------
    strategy : str
        A `fl.strategies.STRATEGIES` name.
    model : str
        A zoo model name.
    dataset : str
        A `fl.data` dataset name (``mnist5k``, ``digits``, ``shakespeare``, ``synthetic``).
    clients : int
        Number of clients.
    rounds : int
        Rounds to run in total.
    fraction : float
        Fraction of the clients sampled per round (``floor(fraction * clients)``, at least 1).
    per_round : int or None
        Clients per round; overrides ``fraction`` when given.
    capacities : str
        Capacity spec for `fl.capacity.assign` (``"1"``, ``"uniform:1,0.5,0.25"``, ...).
    partition : str
        Partition spec (``iid``, ``dirichlet:0.3``, ``labels:2``, ``natural``).
    seed : int
        Run seed.
    epochs, batch_size : int
        Local epochs and batch size.
    lr : float
        Local learning rate.
    options : mapping
        Strategy keyword options (``--opt key=value``); one given under an old name
        (`fl.renamed_keys.OPTION_RENAMES`) is kept under its current one.
    eval_every : int
        Evaluate the global model every this many rounds (and after the last).
    executor : str
        An `fl.executors.EXECUTORS` name.
    workers : int
        Executor workers (0: one client after another).
    db : str
        Profile store file the run is logged in.
    timeout_s : float or None
        Seconds a client may train before it counts as failed.
    max_failed_rounds : int
        The run stops as failed after this many failed rounds (rounds in which no
        client trained).
    population : str or None
        ``device=share,...`` over devices measured in ``profiles``: the clients run on a
        virtual clock (`fl.population`); None: no virtual clock.
    profiles : str or None
        The profile store the population's devices were measured in.
    variation : float
        Lognormal sigma of the per-client speed factor.
    availability : float
        Per-round probability that a client is online.
    overcommit : float
        Over-commitment: ``ceil(K * (1 + overcommit))`` clients are sampled to keep K.
    deadline_s : float or None
        Round deadline in virtual seconds.
    link : str or None
        ``KBIT[:DELAY_MS]`` or ``device=KBIT[:DELAY_MS],...``: the devices' links (`fl.roundcost.parse_links`).
    clock_only : bool
        Run the virtual schedule only, without training (`run_clock_only`).
    client_examples : int or None
        Examples per client in a clock-only run (default: the data set's partition).
    optimizer : str
        The optimizer graph devices train with (``"sgd"`` or ``"adamw"``; in process: SGD).
    """

    strategy: str = "fedavg"
    model: str = "fjord-cnn"
    dataset: str = "mnist5k"
    clients: int = 10
    rounds: int = 5
    fraction: float = 1.0
    per_round: int | None = None
    capacities: str = "1"
    partition: str = "iid"
    seed: int = 0
    epochs: int = 1
    batch_size: int = 20
    lr: float = 0.05
    options: Mapping[str, Any] = field(default_factory=dict)
    eval_every: int = 1
    executor: str = "inprocess"
    workers: int = 0
    db: str = DEFAULT_DB
    timeout_s: float | None = None
    max_failed_rounds: int = 1
    population: str | None = None
    profiles: str | None = None
    variation: float = DEFAULT_VARIATION
    availability: float = 1.0
    overcommit: float = 0.0
    deadline_s: float | None = None
    link: str | None = None
    clock_only: bool = False
    client_examples: int | None = None
    optimizer: str = "sgd"

    def __post_init__(self) -> None:
        """Put options given or stored under an old key under its current name (`fl.renamed_keys`)."""
        object.__setattr__(self, "options", current_options(self.strategy, self.options))

    def validate(self) -> None:
        """Check the fields that can be checked without loading anything.

        Raises
        ------
        InputError
            Naming the first bad field and its value.
        """
        if self.strategy not in STRATEGIES:
            raise InputError(f"unknown strategy {self.strategy!r}; known: {', '.join(sorted(STRATEGIES))}")
        if self.executor not in EXECUTORS:
            raise InputError(f"unknown executor {self.executor!r}; known: {', '.join(sorted(EXECUTORS))}")
        for name in ("clients", "rounds", "epochs", "batch_size", "eval_every", "max_failed_rounds"):
            if int(getattr(self, name)) < 1:
                raise InputError(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.workers < 0:
            raise InputError(f"workers must be 0 or more, got {self.workers}")
        if not 0.0 < self.fraction <= 1.0:
            raise InputError(f"fraction {self.fraction:g} is outside (0, 1]")
        if self.per_round is not None and not 1 <= self.per_round <= self.clients:
            raise InputError(f"per-round count {self.per_round} is outside 1..{self.clients} clients")
        if not (self.lr > 0 and math.isfinite(self.lr)):
            raise InputError(f"learning rate {self.lr!r} must be a positive number")
        if self.timeout_s is not None and not self.timeout_s > 0:
            raise InputError(f"timeout {self.timeout_s!r} must be positive")
        from exporters.artifacts import OPTIMIZERS

        if self.optimizer not in OPTIMIZERS:
            raise InputError(f"unknown optimizer {self.optimizer!r}; known: {', '.join(OPTIMIZERS)}")
        self._validate_population()

    def _validate_population(self) -> None:
        virtual = {
            "--profiles": self.profiles is not None,
            "--clock-only": self.clock_only,
            "--deadline": self.deadline_s is not None,
            "--overcommit": self.overcommit != 0.0,
            "--availability": self.availability != 1.0,
            "--variation": self.variation != DEFAULT_VARIATION,
            "--link": self.link is not None,
            "--client-examples": self.client_examples is not None,
        }
        given = [flag for flag, on in virtual.items() if on]
        if self.population is None:
            if given:
                raise InputError(f"{given[0]} needs --population SPEC (a virtual clock)")
            return
        if self.profiles is None:
            raise InputError("--population needs --profiles DB, the store its devices were measured in")
        if self.client_examples is not None and (not self.clock_only or self.client_examples < 1):
            raise InputError("--client-examples N (N >= 1) is for --clock-only runs")

    def to_dict(self) -> dict[str, Any]:
        """Return the configuration as JSON values (stored in ``fl_runs.config``)."""
        out = dataclasses.asdict(self)
        out["options"] = dict(self.options)
        return dict(json.loads(json.dumps(out)))

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> RunConfig:
        """Inverse of `to_dict` (unknown keys are ignored, missing ones take defaults)."""
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in values.items() if k in names})


@dataclass(frozen=True)
class RoundSummary:
    """What one round did (one progress line).

    Attributes
    ----------
    round : int
        0-based round number.
    clients_ok, clients_failed : int
    mean_loss : float or None
        Mean local training loss over the clients that finished.
    accuracy : mapping of float to float
        Global test accuracy per evaluated width (empty when not evaluated).
    seconds : float
        Round wall time.
    failures : tuple of ClientFailure
        The clients that failed, with their reasons.
    virtual_seconds : float or None
        The round's duration on the virtual clock (None without a population).
    predicted_energy_j, measured_energy_j : float or None
        The sums of the round's client rounds' predicted and measured energy
        (`fl.runlog.round_energy_totals`); a population run's predicted energy is its virtual energy.
    energy_measured : int
        Client rounds whose energy was measured (a round too short for its device's sensor,
        or on a device without one, has none): the measured sum is theirs alone.
    """

    round: int
    clients_ok: int
    clients_failed: int
    mean_loss: float | None
    accuracy: Mapping[float, float]
    seconds: float
    failures: tuple[ClientFailure, ...] = ()
    virtual_seconds: float | None = None
    predicted_energy_j: float | None = None
    measured_energy_j: float | None = None
    energy_measured: int = 0

    @property
    def failed(self) -> bool:
        """Whether no client trained in this round (a failed round)."""
        return self.clients_ok == 0


@dataclass(frozen=True)
class RunSummary:
    """The outcome of `run_fl`.

    Attributes
    ----------
    run_id : int
        The run's id in the profile store.
    rounds : int
        Rounds completed (in total, including those before a resume).
    accuracy : mapping of float to float
        Final global test accuracy per evaluated width.
    history : tuple of RoundSummary
        Every completed round, in order.
    config : RunConfig
    status : str
        ``"finished"``, or ``"failed"`` when the run stopped after
        ``config.max_failed_rounds`` failed rounds.
    error : str or None
        Why the run failed (None when it finished).
    """

    run_id: int
    rounds: int
    accuracy: Mapping[float, float]
    history: tuple[RoundSummary, ...]
    config: RunConfig
    status: str = "finished"
    error: str | None = None

    def to_json(self) -> dict[str, Any]:
        """Return a JSON-ready dict; widths become string keys (``"0.5"``)."""
        return {
            "run_id": self.run_id,
            "rounds": self.rounds,
            "strategy": self.config.strategy,
            "model": self.config.model,
            "dataset": self.config.dataset,
            "seed": self.config.seed,
            "status": self.status,
            "error": self.error,
            "accuracy": {str(float(w)): a for w, a in self.accuracy.items()},
            "history": [
                {
                    "round": r.round,
                    "clients_ok": r.clients_ok,
                    "clients_failed": r.clients_failed,
                    "failed": r.failed,
                    "failures": [{"cid": f.cid, "reason": f.reason, "message": f.message} for f in r.failures],
                    "mean_loss": r.mean_loss,
                    "accuracy": {str(float(w)): a for w, a in r.accuracy.items()},
                    "seconds": r.seconds,
                    "virtual_seconds": r.virtual_seconds,
                    "predicted_energy_j": r.predicted_energy_j,
                    "measured_energy_j": r.measured_energy_j,
                }
                for r in self.history
            ],
            "db": self.config.db,
        }


class FederatedDataLike(Protocol):
    """What the server needs of `fl.data.FederatedData`."""

    @property
    def train(self) -> Sequence[Shard]:
        """One ``(x, y)`` training shard per client."""
        ...

    @property
    def test(self) -> Shard:
        """The held-out ``(x, y)`` set."""
        ...


def clients_per_round(num_clients: int, fraction: float, per_round: int | None) -> int:
    """Return how many clients a round samples: ``per_round``, else ``max(1, floor(fraction * n))``."""
    if per_round is not None:
        return min(int(per_round), num_clients)
    return max(1, min(num_clients, math.floor(fraction * num_clients + 1e-9)))


def sample_clients(
    clients: Sequence[ClientSpec], rnd: int, *, seed: int, fraction: float = 1.0, per_round: int | None = None
) -> list[ClientSpec]:
    """Draw round ``rnd``'s clients without replacement, from ``default_rng((seed, rnd))``.

    Parameters
    ----------
    clients : sequence of ClientSpec
        All clients of the run.
    rnd : int
        Round number.
    seed : int
        Run seed.
    fraction, per_round
        See `clients_per_round`.

    Returns
    -------
    list of ClientSpec
        The sampled clients in their run order.
    """
    count = clients_per_round(len(clients), fraction, per_round)
    chosen = np.random.default_rng((seed, rnd)).choice(len(clients), size=count, replace=False)
    return [clients[i] for i in sorted(int(i) for i in chosen)]


def evaluate_global(strategy: Strategy, clients: Sequence[ClientSpec], test: Shard) -> dict[float, dict[str, float]]:
    """Evaluate the strategy's global model at each of its evaluation widths.

    Returns
    -------
    dict of float to dict
        ``{width: {"loss": ..., "accuracy": ...}}``.
    """
    from fl.client import evaluate

    x, y = test
    out: dict[float, dict[str, float]] = {}
    for width, submodel in strategy.eval_submodels(clients).items():
        params = strategy.model.extract(strategy.global_state, submodel)
        out[float(width)] = evaluate(strategy.model, submodel.arch, params, x, y)
    return out


def initial_parameters(model: ZooModel, seed: int) -> dict[str, np.ndarray]:
    """Return the full-width model's parameters as built after ``torch.manual_seed(seed)``."""
    import torch

    from fl.client import module_params

    torch.manual_seed(seed)
    return module_params(model.build())


def profiles_for(
    store: ProfileStore,
    clients: Sequence[ClientSpec],
    model: str | None = None,
    device_configs: Mapping[str, ProfileConfig] | None = None,
    *,
    warn: Callable[[str], None] | None = None,
) -> Profiles:
    """Return the store's latest cells grouped by device, for the clients' devices ({} when none).

    Parameters
    ----------
    store : ProfileStore
    clients : sequence of ClientSpec
    model : str, optional
        With ``device_configs``: keep each device's cells of this model in its matching configuration.
    device_configs : mapping of str to ProfileConfig, optional
        The configuration each device trains with; a device whose profile differs gets the
        nearest one and ``warn`` a line naming the difference; a device without any is left out.
    warn : callable, optional

    Returns
    -------
    Profiles
    """
    devices = {c.device for c in clients if c.device}
    if not devices:
        return {}
    cells = store.latest_cells()
    if cells.empty:
        return {}
    cells = cells[cells["device"].isin(devices)]
    if model is not None and device_configs is not None:
        wants = {d: c for d, c in device_configs.items() if d in devices}
        return matched_profiles(cells, model, wants, warn=warn, strict=False)
    return {str(device): group.to_dict("records") for device, group in cells.groupby("device")}


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def run_fl(
    config: RunConfig,
    *,
    store: ProfileStore | None = None,
    executor: Executor | None = None,
    resume_run: int | None = None,
    progress: Callable[[str], None] | None = _stderr,
    clock: Callable[[], float] = time.perf_counter,
    wall_clock: Callable[[], float] = time.time,
    data: FederatedDataLike | None = None,
    capacities: Sequence[float] | None = None,
    placement: Mapping[str, str] | None = None,
    virtual: VirtualClock | None = None,
    profiles: Profiles | None = None,
    backends: Mapping[str, str] | None = None,
    device_configs: Mapping[str, ProfileConfig] | None = None,
    round_cost: RoundCost | None = None,
    plan: Any = None,
) -> RunSummary:
    """Run (or resume) an FL run and log it in the profile store.

    Parameters
    ----------
    config : RunConfig
        The run. With ``resume_run``, every field but `RESUMABLE_CHANGES` must
        equal the stored run's.
    store : ProfileStore, optional
        Where the run is logged; default: open ``config.db`` (closed at the end).
    executor : Executor, optional
        Default: ``make_executor(config.executor, model, workers=config.workers)`` (closed at the end).
    resume_run : int, optional
        Continue this stored run from its last checkpoint up to ``config.rounds``.
    progress : callable or None
        Receives one line per round (default: print to stderr).
    clock : callable
        Monotonic clock for durations.
    wall_clock : callable
        Seconds since the epoch, for the log's timestamps.
    data : FederatedData, optional
        The federated data (``train`` shards, ``test``); default:
        ``fl.data.load_federated(config.dataset, model, config.clients, config.partition, config.seed)``.
    capacities : sequence of float, optional
        Per-client capacity; default: ``fl.capacity.assign(config.capacities, config.clients, config.seed)``.
    placement : mapping of str to str, optional
        Device name per client id (``ClientSpec.device``), for an executor that trains on
        devices; clients with a device get the store's profiles of that device.
    virtual : fl.population.VirtualClock, optional
        Run the rounds on this virtual clock (`fl.population`): its population places the
        clients (unless ``placement`` is given), it samples each round's clients, and the
        strategy sees the clients' virtual times.
    profiles : Profiles, optional
        The strategies' device profiles; default: the store's cells of the clients' devices
        (with ``device_configs``, each device's profile matching its configuration, or the
        nearest one with a warning naming the difference; `fl.scheduling.configs`).
    device_configs : mapping of str to ProfileConfig, optional
        The configuration each device trains with (`fl.roundcost.executor_configs`).
    round_cost : RoundCost, optional
        Predicts every client round (``fl_client_rounds.predicted_seconds``, and the
        strategies' ``round_predictor``); default: built from the store's profiles and
        round costs of the clients' devices (`fl.roundcost.round_cost_from_store`) when
        there are any, none in a virtual-clock run (its virtual times are the prediction).
    backends : mapping of str to str, optional
        Runner backend per client id (``ClientSpec.backend``), logged with each client round.
    plan : fl.plan.RunPlan, optional
        The plan the run trains with (its ``current`` `fl.plan.FleetPlan`), stored with the
        run (``fl_plans``). After every round each device's measured / predicted factor is
        offered to ``plan.revise``; a revision is stored, shown, and its widths become the
        clients' capacities from the next round on (also when the run is resumed).

    Returns
    -------
    RunSummary

    Raises
    ------
    InputError
        On a bad configuration, an unknown strategy option, capacities the strategy
        cannot serve, or a run to resume that does not exist, has no checkpoint, or
        was configured differently. Everything is checked before the run is logged,
        and a store that ``run_fl`` opens itself is created only after the checks.
    """
    config.validate()
    own_store = store is None
    if own_store and resume_run is not None:
        store = ProfileStore(config.db, create=False)
    own_executor = executor is None
    try:
        checkpoint: tuple[int, Any] | None = None
        if resume_run is not None:
            assert store is not None
            log = RunLog(store, clock=wall_clock)
            _check_resumable(config, log.run(resume_run)["config"], resume_run)
            checkpoint = log.load_checkpoint(resume_run)
            if checkpoint is None:
                raise InputError(f"FL run {resume_run} has no checkpoint to resume from")
        model = get_model(config.model)
        fed: FederatedDataLike
        if data is None:
            from fl.data import load_federated

            fed = load_federated(config.dataset, model, config.clients, config.partition, config.seed)
        else:
            fed = data
        shards = list(fed.train)
        if len(shards) != config.clients:
            raise InputError(f"data set has {len(shards)} client shards for {config.clients} clients")
        if capacities is None:
            from fl.capacity import assign

            capacities = assign(config.capacities, config.clients, config.seed)
        if placement is None and virtual is not None:
            placement = virtual.population.placement()
        clients = _client_specs([len(y) for _, y in shards], capacities, placement or {}, backends or {})
        strategy = _make_strategy(config, model)
        strategy.check_clients(clients)
        if store is None:
            store = ProfileStore(config.db)
        log = RunLog(store, clock=wall_clock)
        if executor is None:
            if config.executor == "devices":
                raise InputError("the devices executor needs a fleet: fleetbench fl run --fleet FILE")
            executor = make_executor(config.executor, model, workers=config.workers)
        history: list[RoundSummary] = []
        if checkpoint is not None and resume_run is not None:
            run_id = resume_run
            last_round, state = checkpoint
            strategy.load_state(state["strategy"])
            first = last_round + 1
            history = _history(log, run_id)
            log.mark_resumed(run_id, max(config.rounds, first), config.to_dict())
            stored = log.plans(run_id)
            if plan is not None and stored:
                plan.restore(stored[-1]["plan"])
                clients = _replanned(clients, plan)
        else:
            _record_model(log, model)
            run_id = log.start_run(
                strategy=config.strategy,
                model=config.model,
                dataset=config.dataset,
                executor=config.executor,
                seed=config.seed,
                rounds=config.rounds,
                config=config.to_dict(),
                clients=clients,
                label_counts={c.cid: _label_counts(y) for c, (_, y) in zip(clients, shards, strict=True)},
                speed_factors=None if virtual is None else _speed_factors(virtual),
            )
            first = 0
            if plan is not None:
                log.log_plan(run_id, plan.current.revision, 0, plan.current.to_json(), plan.current.reason)
        say = progress if progress is not None else (lambda line: None)
        warn = say_once(say)  # the profile lookups repeat per client and per model: one line per fallback
        if profiles is None:
            profiles = profiles_for(store, clients, config.model, device_configs, warn=warn)
        energy = profile_energy(profiles, config.model)
        if virtual is None:
            strategy.round_predictor = run_predictor(
                store, config.model, config.batch_size, config.epochs, [c.device for c in clients if c.device],
                profiles, device_configs, round_cost, warn=warn, now=wall_clock(),
            )  # fmt: skip
        by_cid = {c.cid: c for c, _ in zip(clients, shards, strict=True)}
        shard_of = {c.cid: shard for c, shard in zip(clients, shards, strict=True)}
        error: str | None = None
        earlier = len(history)  # rounds logged before this call (a resumed run's)
        try:
            for rnd in range(first, config.rounds):
                summary = _run_round(
                    rnd,
                    config,
                    strategy,
                    executor,
                    log,
                    run_id,
                    clients,
                    by_cid,
                    shard_of,
                    fed.test,
                    profiles,
                    clock,
                    wall_clock,
                    virtual,
                    energy,
                )
                history.append(summary)
                if progress is not None:
                    progress(format_round(summary, config.rounds))
                revised = _revise_plan(plan, strategy, clients)
                if revised is not None:
                    log.log_plan(run_id, revised.revision, rnd + 1, revised.to_json(), revised.reason)
                    say(f"plan revision {revised.revision} from round {rnd + 2}: {revised.reason}")
                    clients = _replanned(clients, plan)
                    by_cid = {c.cid: c for c in clients}
                failed_rounds = [h for h in history[earlier:] if h.failed]
                if len(failed_rounds) >= config.max_failed_rounds:
                    error = failure_report(failed_rounds)
                    break
        except KeyboardInterrupt:
            log.finish_run(run_id, "interrupted")
            raise
        except BaseException as exc:
            log.finish_run(run_id, "failed", f"{type(exc).__name__}: {exc}")
            raise
        status = "finished" if error is None else "failed"
        log.finish_run(run_id, status, error)
        accuracy: Mapping[float, float] = next((h.accuracy for h in reversed(history) if h.accuracy), {})
        return RunSummary(run_id, len(history), dict(accuracy), tuple(history), config, status, error)
    finally:
        if own_executor and executor is not None:
            executor.close()
        if own_store and store is not None:
            store.close()


def run_clock_only(
    config: RunConfig,
    virtual: VirtualClock,
    *,
    store: ProfileStore | None = None,
    examples: Sequence[int] | None = None,
    capacities: Sequence[float] | None = None,
    progress: Callable[[str], None] | None = _stderr,
    clock: Callable[[], float] = time.perf_counter,
    wall_clock: Callable[[], float] = time.time,
    profiles: Profiles | None = None,
) -> RunSummary:
    """Run the virtual schedule of ``config`` without training, and log it.

    Each round samples its clients (`fl.population.VirtualClock.sample`), gives every
    sampled client its virtual round at its capacity's static sub-model (the width a
    HeteroFL-style strategy would send it; methods that decide widths from training
    results, FLuID's stragglers, need training), keeps the first K to finish by the
    deadline and logs the round: kept clients ``ok``, the others ``timeout``, with
    their virtual times. A round that keeps no client is a failed round, as in training
    (``config.max_failed_rounds``). No data are loaded when ``examples`` is given. With
    ``profiles`` that hold energy, every sampled client round also gets its predicted energy
    at its width (its virtual energy, the late ones' too: they trained), summed per round.

    Parameters
    ----------
    config : RunConfig
        With ``clock_only`` set.
    virtual : VirtualClock
    store : ProfileStore, optional
        Default: open ``config.db`` (closed at the end).
    examples : sequence of int, optional
        Examples per client; default ``config.client_examples`` for every client, else
        the data set's partition.
    capacities : sequence of float, optional
        Default: ``fl.capacity.assign(config.capacities, config.clients, config.seed)``.
    progress, clock, wall_clock
        As in `run_fl`.
    profiles : Profiles, optional
        The population's devices' profile rows (energy per image: each client round's virtual energy).

    Returns
    -------
    RunSummary
        Rounds without accuracy; ``virtual_seconds`` and ``predicted_energy_j`` per round.
    """
    config.validate()
    model = get_model(config.model)
    if examples is None:
        if config.client_examples is not None:
            examples = [config.client_examples] * config.clients
        else:
            from fl.data import load_federated

            fed = load_federated(config.dataset, model, config.clients, config.partition, config.seed)
            examples = [len(y) for _, y in fed.train]
    if capacities is None:
        from fl.capacity import assign

        capacities = assign(config.capacities, config.clients, config.seed)
    clients = _client_specs(examples, capacities, virtual.population.placement())
    energy = profile_energy(profiles or {}, config.model)
    initial = initial_parameters(model, config.seed)
    timings: dict[str, Timing] = {}

    def timing(client: ClientSpec) -> Timing:
        if client.cid not in timings:
            sub = model.static(client.capacity)
            steps = full_batch_steps(client.num_examples, config.batch_size, config.epochs)
            nbytes = payload_bytes(model.extract(initial, sub))
            timings[client.cid] = virtual.timing(client_index(client.cid), sub.arch, steps, nbytes, nbytes)
        return timings[client.cid]

    own_store = store is None
    store = ProfileStore(config.db) if store is None else store
    try:
        log = RunLog(store, clock=wall_clock)
        _record_model(log, model)
        run_id = log.start_run(
            strategy=config.strategy,
            model=config.model,
            dataset=config.dataset,
            executor="clock-only",
            seed=config.seed,
            rounds=config.rounds,
            config=config.to_dict(),
            clients=clients,
            speed_factors=_speed_factors(virtual),
        )
        keep = clients_per_round(len(clients), config.fraction, config.per_round)
        history: list[RoundSummary] = []
        error: str | None = None
        for rnd in range(config.rounds):
            start, started_at = clock(), wall_clock()
            sampled = [clients[i] for i in virtual.sample(rnd, keep)]
            times = {c.cid: timing(c).total for c in sampled}
            plan = virtual.schedule(times, keep)
            failures = _virtual_failures(plan, [c.cid for c in sampled])
            failed = {f.cid: f for f in failures}
            rows = [
                ClientRound(
                    cid=c.cid,
                    width=c.capacity,
                    status=failed[c.cid].reason if c.cid in failed else "ok",
                    device=c.device,
                    tier=c.tier,
                    message=failed[c.cid].message if c.cid in failed else "",
                    num_examples=c.num_examples,
                    virtual_seconds=times[c.cid],
                    predicted_energy_j=predicted_energy(
                        energy, config.model, c.device, {c.capacity: 1.0}, c.num_examples, config.epochs
                    ),
                )
                for c in sampled
            ]
            seconds = clock() - start
            log.log_round(
                run_id,
                rnd,
                started_at=started_at,
                finished_at=wall_clock(),
                wall_seconds=seconds,
                metrics={"clients_ok": len(plan.kept), "clients_failed": len(failures), "mean_loss": None},
                evaluation={},
                clients=rows,
                checkpoint={"round": rnd, "clock_only": True},
                virtual_seconds=plan.seconds,
            )
            summary = RoundSummary(
                rnd, len(plan.kept), len(failures), None, {}, seconds, tuple(failures), plan.seconds,
                *round_energy_totals(rows), measured_count(rows),
            )  # fmt: skip
            history.append(summary)
            if progress is not None:
                progress(format_round(summary, config.rounds))
            failed_rounds = [h for h in history if h.failed]
            if len(failed_rounds) >= config.max_failed_rounds:
                error = failure_report(failed_rounds)
                break
        status = "finished" if error is None else "failed"
        log.finish_run(run_id, status, error)
        return RunSummary(run_id, len(history), {}, tuple(history), config, status, error)
    finally:
        if own_store:
            store.close()


def _run_round(
    rnd: int,
    config: RunConfig,
    strategy: Strategy,
    executor: Executor,
    log: RunLog,
    run_id: int,
    clients: Sequence[ClientSpec],
    by_cid: Mapping[str, ClientSpec],
    shard_of: Mapping[str, Shard],
    test: Shard,
    profiles: Profiles,
    clock: Callable[[], float],
    wall_clock: Callable[[], float],
    virtual: VirtualClock | None = None,
    energy: Mapping[str, EnergyCurve] | None = None,
) -> RoundSummary:
    start, started_at = clock(), wall_clock()
    keep = clients_per_round(len(clients), config.fraction, config.per_round)
    if virtual is None:
        sampled = sample_clients(clients, rnd, seed=config.seed, fraction=config.fraction, per_round=config.per_round)
    else:
        sampled = [clients[i] for i in virtual.sample(rnd, keep)]
    instructions = strategy.configure_round(rnd, sampled, profiles)
    # FLuID names the clients it treats as stragglers this round; other strategies have none.
    stragglers = {str(c) for c in getattr(strategy, "stragglers", ())}
    shards = {cid: shard_of[cid] for cid in instructions}
    virtual_of: dict[str, float] = {}
    virtual_seconds: float | None = None
    if virtual is None:
        results, failures = refuse_invalid_results(instructions, *executor.run(instructions, shards, config.timeout_s))
        seen, seen_failures = results, failures
    else:
        timings = _virtual_timings(virtual, instructions, shards, config.epochs, config.batch_size)
        plan = virtual.schedule({cid: t.total for cid, t in timings.items()}, keep)
        kept = {cid: instructions[cid] for cid in instructions if cid in set(plan.kept)}
        results, failures = refuse_invalid_results(kept, *executor.run(kept, shards, config.timeout_s))
        failures = [*failures, *_virtual_failures(plan, instructions)]
        # The strategy sees virtual times; the log keeps the measured ones beside them.
        seen = [_with_timing(r, timings[r.cid]) for r in results]
        seen_failures = [
            dataclasses.replace(f, seconds=plan.seconds) if f.cid in plan.cut or f.cid in plan.late else f
            for f in failures
        ]
        virtual_of = {cid: t.total for cid, t in timings.items()}
        virtual_seconds = plan.seconds
    strategy_metrics: Mapping[str, Any] = {}
    evaluation: dict[float, dict[str, float]] = {}
    if results:
        # A failed round (no client trained) leaves the global model and the strategy as they were.
        _, strategy_metrics = strategy.aggregate_round(rnd, seen, seen_failures)
        if (rnd + 1) % config.eval_every == 0 or rnd + 1 == config.rounds:
            evaluation = evaluate_global(strategy, clients, test)
    seconds = clock() - start
    losses = [float(r.metrics["loss"]) for r in results if "loss" in r.metrics]
    mean_loss = float(np.mean(losses)) if losses else None
    metrics = {
        **{str(k): v for k, v in strategy_metrics.items()},
        "clients_ok": len(results),
        "clients_failed": len(failures),
        "mean_loss": mean_loss,
    }
    predicted, results = _predict_and_calibrate(strategy, instructions, results, by_cid)
    rows = _client_rows(
        strategy.model, instructions, results, failures, by_cid, config.epochs, stragglers, virtual_of, predicted,
        energy,
    )  # fmt: skip
    log.log_round(
        run_id,
        rnd,
        started_at=started_at,
        finished_at=wall_clock(),
        wall_seconds=seconds,
        metrics=metrics,
        evaluation={str(w): v for w, v in evaluation.items()},
        clients=rows,
        checkpoint={"round": rnd, "strategy": strategy.state()},
        virtual_seconds=virtual_seconds,
    )
    accuracy = {w: v["accuracy"] for w, v in evaluation.items()}
    return RoundSummary(
        rnd, len(results), len(failures), mean_loss, accuracy, seconds, tuple(failures), virtual_seconds,
        *round_energy_totals(rows), measured_count(rows),
    )  # fmt: skip


def measured_count(rows: Sequence[ClientRound]) -> int:
    """Return how many of a round's client rounds carry a measured energy."""
    return sum(1 for r in rows if r.measured_energy_j is not None)


def say_once(say: Callable[[str], None]) -> Callable[[str], None]:
    """Return a printer that passes each distinct line to ``say`` once.

    Parameters
    ----------
    say : callable
        Receives lines.

    Returns
    -------
    callable
        ``line -> None``; a line seen before is dropped.
    """
    seen: set[str] = set()

    def once(line: str) -> None:
        if line not in seen:
            seen.add(line)
            say(line)

    return once


def _predict_and_calibrate(
    strategy: Strategy,
    instructions: Mapping[str, TrainIns],
    results: Sequence[TrainRes],
    by_cid: Mapping[str, ClientSpec],
) -> tuple[dict[str, float], list[TrainRes]]:
    """Return the logged prediction of every instructed client's round, and the results to log.

    With a calibrated predictor (`fl.roundcost.CalibratedPredictor`), the profile's
    predictions are made once and each is scaled by its device's factor so far; each predicted result gains
    ``profile_predicted_seconds`` and ``calibration`` in its metrics, and then, unless
    the round opened a session on the runner (a once-per-run cost the profile leaves
    out), its device's ratio measured / profile-predicted is recorded for the rounds to
    come. Otherwise `_predictions` with the strategy's predictor, results unchanged.
    """
    predictor: Any = strategy.round_predictor
    if getattr(predictor, "base", None) is None:  # not calibrated
        return _predictions(strategy, instructions, results, by_cid), list(results)
    profile = _predictions(strategy, instructions, results, by_cid, predictor.base)
    factors = {cid: predictor.factor(by_cid[cid].device) for cid in profile}
    predicted = {cid: value * factors[cid] for cid, value in profile.items()}
    out = []
    for res in results:
        device = by_cid[res.cid].device
        if res.cid not in profile or device is None:
            out.append(res)
            continue
        metrics = {**res.metrics, "profile_predicted_seconds": profile[res.cid], "calibration": factors[res.cid]}
        arch = _trained_arch(strategy, instructions[res.cid], res)
        cpu_per_step = loop_cpu_per_step(res.metrics)
        drawn = dict(res.steps_at_width) if arch is None else {}
        slowdown = predictor.cpu_slowdown(device, arch, cpu_per_step)
        if slowdown is not None:
            metrics["cpu_vs_profile"] = slowdown
        elif len(drawn) > 1:
            mix = [(strategy.model.arch(w), n) for w, n in sorted(drawn.items())]
            vs_mix = predictor.cpu_vs_mix(device, mix, cpu_per_step)
            slowdown = predictor.mix_slowdown(device, vs_mix)
            if vs_mix is not None:
                metrics["cpu_vs_profile_mix"] = vs_mix
        out.append(dataclasses.replace(res, metrics=metrics))
        if not res.metrics.get("sessions_opened"):  # a runner's first rounds also open its sessions
            transferred = res.download_seconds + res.upload_seconds
            nbytes = sum(float(res.metrics.get(k, math.nan)) for k in ("download_bytes", "upload_bytes"))
            transfer = (transferred, nbytes) if math.isfinite(nbytes) else None
            predictor.observe(device, profile[res.cid], res.compute_seconds + transferred, slowdown, transfer)
    return predicted, out


def _trained_arch(strategy: Strategy, ins: TrainIns, res: TrainRes | None) -> Arch | None:
    """Return the architecture every step of a client's round trained (None: several).

    The result's ``trained_width`` where it trained a narrower prefix than it was sent, else
    its instruction's. For FjORD per step (a ``widths`` list), the one width the result's
    steps drew (`fl.records.TrainRes.steps_at_width`), else None: they drew several, or did not say.
    """
    if ins.config.get("widths"):
        drawn = dict(res.steps_at_width) if res is not None else {}
        return strategy.model.arch(next(iter(drawn))) if len(drawn) == 1 else None
    width = None if res is None else res.metrics.get("trained_width")
    arch = ins.submodel.arch
    if width is not None and strategy.model.arch(float(width)).sizes != arch.sizes:
        return strategy.model.arch(float(width))
    return arch


def _predictions(
    strategy: Strategy,
    instructions: Mapping[str, TrainIns],
    results: Sequence[TrainRes],
    by_cid: Mapping[str, ClientSpec],
    predictor: Any = None,
) -> dict[str, float]:
    """Return the round-cost model's prediction of every instructed client's round (none without a predictor).

    The architecture is the one the client trains:

    - a strategy whose steps train several widths (`fl.strategies.base.Strategy.step_widths`,
      FjORD's widths drawn from the instruction's seed): the mean of the rounds at each width
      weighted by its steps (the fixed cost and the payload, what was sent, are the same in
      each; the step time averages); without the counts, the widths' plain mean;
    - a result's ``trained_width`` when it trained a narrower prefix than it was sent;
    - else its instruction's.

    The payload is always what was sent. ``predictor`` defaults to the strategy's.
    """
    predictor = strategy.round_predictor if predictor is None else predictor
    if predictor is None:
        return {}
    by_result = {r.cid: r for r in results}
    out: dict[str, float] = {}
    for cid, ins in instructions.items():
        sent = payload_bytes_of(ins.submodel.arch)
        drawn = [float(w) for w in ins.config.get("widths", ())]
        trained = _trained_arch(strategy, ins, by_result.get(cid))
        value: float | None
        if drawn:
            steps = strategy.step_widths(ins, by_cid[cid]) or {w: 1 for w in drawn}
            rounds = {w: predictor(by_cid[cid], strategy.model.arch(w), bytes_down=sent) for w in steps}
            known = {w: r for w, r in rounds.items() if r is not None}
            value = sum(known[w] * n for w, n in steps.items()) / sum(steps.values()) if known == rounds else None
        elif trained is not None and trained.sizes != ins.submodel.arch.sizes:
            value = predictor(by_cid[cid], trained, bytes_down=sent)
        else:
            value = predictor(by_cid[cid], ins.submodel.arch)
        if value is not None:
            out[cid] = float(value)
    return out


def invalid_result(ins: TrainIns, res: TrainRes) -> str | None:
    """Return why the global model must not take ``res`` (one line), or None when it may.

    A client's result may come from a device that is broken or lies, so before
    aggregation it must hold exactly the parameters sent (names, shapes), as floats, all
    finite, with a whole number of examples >= 0 and finite, non-negative seconds.

    Parameters
    ----------
    ins : TrainIns
        What the client was sent.
    res : TrainRes
        What it returned.

    Returns
    -------
    str or None
    """
    if set(res.parameters) != set(ins.parameters):
        names = sorted(set(res.parameters) ^ set(ins.parameters))
        return f"parameters {', '.join(names[:3])}{' ...' if len(names) > 3 else ''} not as sent"
    for name, sent in ins.parameters.items():
        value = res.parameters[name]
        if not isinstance(value, np.ndarray) or value.shape != np.shape(sent) or value.dtype.kind != "f":
            got = f"{getattr(value, 'dtype', type(value).__name__)} {getattr(value, 'shape', '')}"
            return f"parameter {name!r} is {got}, sent as {np.asarray(sent).dtype} {np.shape(sent)}"
        if not np.isfinite(value).all():
            return f"parameter {name!r} holds NaN or Inf"
    examples = res.num_examples
    if isinstance(examples, bool) or not isinstance(examples, (int, np.integer)) or examples < 0:
        return f"num_examples {examples!r} is not a count"
    if not _timed(res):
        return f"seconds {(res.compute_seconds, res.download_seconds, res.upload_seconds)!r:.120} are not all >= 0"
    return None


def _timed(res: TrainRes) -> bool:
    """Whether ``res``'s seconds are finite numbers >= 0."""
    values = (res.compute_seconds, res.download_seconds, res.upload_seconds)
    return all(isinstance(v, (int, float, np.floating)) and math.isfinite(v) and v >= 0 for v in values)


def refuse_invalid_results(
    instructions: Mapping[str, TrainIns], results: Sequence[TrainRes], failures: Sequence[ClientFailure]
) -> tuple[list[TrainRes], list[ClientFailure]]:
    """Turn every result the global model must not take (`invalid_result`) into a failure of its client.

    Parameters
    ----------
    instructions : mapping of str to TrainIns
        What each client was sent this round.
    results : sequence of TrainRes
        What the executor returned.
    failures : sequence of ClientFailure
        The executor's failures.

    Returns
    -------
    results : list of TrainRes
        The results that may be aggregated, in their order.
    failures : list of ClientFailure
        ``failures``, then an ``"error"`` failure per refused result, its message
        ``"result refused: <why>"``.
    """
    kept: list[TrainRes] = []
    refused = list(failures)
    for res in results:
        ins = instructions.get(res.cid)
        why = "no instruction was sent to this client" if ins is None else invalid_result(ins, res)
        if why is None:
            kept.append(res)
        else:
            seconds = res.round_seconds if ins is not None and _timed(res) else 0.0
            refused.append(ClientFailure(res.cid, "error", f"result refused: {why}", seconds))
    return kept, refused


def _virtual_timings(
    virtual: VirtualClock, instructions: Mapping[str, TrainIns], shards: Mapping[str, Shard], epochs: int, batch: int
) -> dict[str, Timing]:
    """Return every instructed client's virtual round at the sub-model it was given."""
    out = {}
    for cid, ins in instructions.items():
        steps = full_batch_steps(
            len(shards[cid][1]), int(ins.config.get("batch_size", batch)), int(ins.config.get("epochs", epochs))
        )
        nbytes = payload_bytes(ins.parameters)
        out[cid] = virtual.timing(client_index(cid), ins.submodel.arch, steps, nbytes, nbytes)
    return out


def _virtual_failures(plan: RoundSchedule, cids: Iterable[str]) -> list[ClientFailure]:
    """Return the clients the virtual round did not keep, as ``timeout`` failures, in the order of ``cids``."""
    out = []
    for cid in cids:
        if cid in plan.late:
            out.append(ClientFailure(cid, "timeout", f"virtual round {plan.late[cid]:.3f} s > deadline", 0.0))
        elif cid in plan.cut:
            message = f"over-committed: virtual round {plan.cut[cid]:.3f} s, the round closed at {plan.seconds:.3f} s"
            out.append(ClientFailure(cid, "timeout", message, 0.0))
    return out


def _with_timing(res: TrainRes, timing: Timing) -> TrainRes:
    """Return ``res`` with its virtual times (the measured compute seconds kept in its metrics)."""
    metrics = {**res.metrics, "measured_compute_seconds": res.compute_seconds, "step_seconds": timing.steps}
    return dataclasses.replace(
        res,
        compute_seconds=timing.compute,
        download_seconds=timing.download,
        upload_seconds=timing.upload,
        metrics=metrics,
    )


def format_round(summary: RoundSummary, rounds: int) -> str:
    """Return the progress line of one round.

    Parameters
    ----------
    summary : RoundSummary
    rounds : int
        Rounds in the run.

    Returns
    -------
    str
        One line; a failed round says so instead of a loss.
    """
    loss = "-" if summary.mean_loss is None else f"{summary.mean_loss:.4f}"
    accuracy = " ".join(f"{w:g}:{a:.4f}" for w, a in summary.accuracy.items()) or "-"
    head = f"round {summary.round + 1}/{rounds}: clients ok {summary.clients_ok} failed {summary.clients_failed}"
    virtual = "" if summary.virtual_seconds is None else f" (virtual {summary.virtual_seconds:.2f} s)"
    if summary.virtual_seconds is not None and summary.predicted_energy_j is not None:
        virtual = f" (virtual {summary.virtual_seconds:.2f} s, {summary.predicted_energy_j:.4g} J)"
    elif summary.measured_energy_j is not None or summary.predicted_energy_j is not None:
        parts = [] if summary.predicted_energy_j is None else [f"predicted {summary.predicted_energy_j:.4g} J"]
        if summary.measured_energy_j is not None:
            of = f"{summary.energy_measured} of {summary.clients_ok + summary.clients_failed} clients"
            parts.append(f"measured {summary.measured_energy_j:.4g} J on {of}")
        virtual += ", energy " + ", ".join(parts)
    if summary.failed:
        return f"{head}: FAILED, no client trained, {summary.seconds:.2f} s{virtual}"
    return f"{head}, loss {loss}, accuracy {accuracy}, {summary.seconds:.2f} s{virtual}"


def failure_report(rounds: Sequence[RoundSummary]) -> str:
    """Say why rounds failed: every client's failure reason, one ``; ``-separated list.

    Parameters
    ----------
    rounds : sequence of RoundSummary
        The failed rounds.

    Returns
    -------
    str
        ``"round 1: c0 unreachable (connection refused); c1 timeout (...)"``, rounds
        joined by ``" | "``.
    """
    parts = []
    for summary in rounds:
        reasons = "; ".join(f"{f.cid} {f.reason}" + (f" ({f.message})" if f.message else "") for f in summary.failures)
        parts.append(f"round {summary.round + 1}: {reasons or 'no client was sampled'}")
    return " | ".join(parts)


def _check_resumable(config: RunConfig, stored: Mapping[str, Any], run_id: int) -> None:
    mine = config.to_dict()
    if "options" in stored:
        stored = {**stored, "options": current_options(str(stored.get("strategy", "")), stored["options"] or {})}
    for key, value in stored.items():
        if key in RESUMABLE_CHANGES or key not in mine:
            continue
        if mine[key] != value:
            raise InputError(f"cannot resume FL run {run_id}: it has {key}={value!r}, the request has {mine[key]!r}")


def _make_strategy(config: RunConfig, model: ZooModel) -> Strategy:
    cls = strategy_class(config.strategy)
    local = {"epochs": config.epochs, "batch_size": config.batch_size, "lr": config.lr}
    try:
        return cls(model, initial_parameters(model, config.seed), seed=config.seed, local=local, **dict(config.options))
    except TypeError as exc:
        raise InputError(f"strategy {config.strategy!r} rejected options {dict(config.options)}: {exc}") from None


def _revise_plan(plan: Any, strategy: Strategy, clients: Sequence[ClientSpec]) -> Any:
    """Offer the plan each device's calibration factor so far; return its revision, or None."""
    factor = getattr(strategy.round_predictor, "factor", None)
    if plan is None or factor is None:
        return None
    devices = sorted({c.device for c in clients if c.device is not None})
    return plan.revise({d: float(factor(d)) for d in devices})


def _replanned(clients: Sequence[ClientSpec], plan: Any) -> list[ClientSpec]:
    """Return the clients with the capacities of the plan in force (tiers recounted)."""
    from fl.capacity import tiers

    caps = [plan.capacity(c.device, c.capacity) for c in clients]
    return [
        dataclasses.replace(c, capacity=cap, tier=tier) for c, cap, tier in zip(clients, caps, tiers(caps), strict=True)
    ]


def _client_specs(
    examples: Sequence[int],
    capacities: Sequence[float],
    placement: Mapping[str, str],
    backends: Mapping[str, str] | None = None,
) -> list[ClientSpec]:
    caps = [float(c) for c in capacities]
    if len(caps) != len(examples):
        raise InputError(f"{len(caps)} capacities for {len(examples)} clients")
    from fl.capacity import tiers

    return [
        ClientSpec(
            cid=f"c{i}",
            num_examples=int(n),
            capacity=cap,
            tier=tier,
            device=placement.get(f"c{i}"),
            backend=(backends or {}).get(f"c{i}"),
        )
        for i, (n, cap, tier) in enumerate(zip(examples, caps, tiers(caps), strict=True))
    ]


def _label_counts(y: np.ndarray) -> dict[int, int]:
    labels = np.asarray(y)
    if labels.ndim != 1 or not np.issubdtype(labels.dtype, np.integer):
        return {}
    values, counts = np.unique(labels, return_counts=True)
    return {int(v): int(c) for v, c in zip(values, counts, strict=True)}


def _width_of(model: ZooModel, ins: TrainIns, capacity: float) -> float:
    """Return the width a client trained: the config's ``width``, else its capacity when the shapes match it."""
    if "width" in ins.config:
        return float(ins.config["width"])
    if model.arch(capacity).sizes == ins.submodel.arch.sizes:
        return float(capacity)
    ratios = [w / k for w, k in zip(ins.submodel.arch.sizes, model.group_sizes, strict=True)]
    return round(min(ratios), 6) if ratios else capacity


_FLOPS_CACHE: dict[str, float] = {}


def _train_flops(model: ZooModel, ins: TrainIns) -> float | None:
    key = ins.submodel.arch.key()
    if key not in _FLOPS_CACHE:
        try:
            from exporters.flops import count

            _FLOPS_CACHE[key] = float(count(model, ins.submodel.arch).train_flops)
        except Exception:  # noqa: BLE001 - FLOPs are informative; a model the counter lacks logs none
            return None
    return _FLOPS_CACHE[key]


def _client_rows(
    model: ZooModel,
    instructions: Mapping[str, TrainIns],
    results: Sequence[TrainRes],
    failures: Sequence[ClientFailure],
    by_cid: Mapping[str, ClientSpec],
    epochs: int,
    stragglers: set[str],
    virtual_of: Mapping[str, float] | None = None,
    predicted_of: Mapping[str, float] | None = None,
    energy: Mapping[str, EnergyCurve] | None = None,
) -> list[ClientRound]:
    energy = energy or {}
    virtual_of = virtual_of or {}
    predicted_of = predicted_of or {}
    rows: list[ClientRound] = []
    result_of = {r.cid: r for r in results}
    failure_of = {f.cid: f for f in failures}
    for cid, ins in instructions.items():
        client = by_cid[cid]
        width = _width_of(model, ins, client.capacity)
        epochs_run = int(ins.config.get("epochs", epochs))
        common = ClientRound(
            cid=cid,
            width=width,
            status="ok",
            device=client.device,
            backend=client.backend,
            arch_sizes=tuple(ins.submodel.arch.sizes),
            tier=client.tier,
            straggler=cid in stragglers or bool(ins.config.get("straggler", False)),
            virtual_seconds=virtual_of.get(cid),
            predicted_seconds=predicted_of.get(cid),
            predicted_energy_j=predicted_energy(
                energy, model.name, client.device, _width_shares(width, result_of.get(cid)), client.num_examples,
                epochs_run,
            ),
        )  # fmt: skip
        if cid in result_of:
            res = result_of[cid]
            per_example = _train_flops(model, ins)
            rows.append(
                dataclasses.replace(
                    common,
                    num_examples=res.num_examples,
                    loss=_float_or_none(res.metrics.get("loss")),
                    accuracy=_float_or_none(res.metrics.get("accuracy")),
                    steps=None if "steps" not in res.metrics else int(res.metrics["steps"]),
                    compute_seconds=res.compute_seconds,
                    download_seconds=res.download_seconds,
                    upload_seconds=res.upload_seconds,
                    train_flops=None if per_example is None else per_example * res.num_examples * epochs_run,
                    metrics=_logged_metrics(res),
                    measured_energy_j=_float_or_none(res.metrics.get("energy_j")),
                    energy_emulated=None if "energy_j" not in res.metrics else bool(res.metrics.get("energy_emulated")),
                )
            )
        else:
            failure = failure_of.get(cid, ClientFailure(cid, "error", "no result and no failure reported"))
            rows.append(
                dataclasses.replace(
                    common,
                    status=failure.reason,
                    message=failure.message,
                    num_examples=client.num_examples,
                    wait_seconds=failure.seconds,
                )
            )
    return rows


def _speed_factors(virtual: VirtualClock) -> dict[str, float]:
    return {f"c{i}": factor for i, factor in enumerate(virtual.population.factors)}


def profile_energy(profiles: Profiles, model: str) -> dict[str, EnergyCurve]:
    """Return each profiled device's energy per image of ``model`` (devices without energy left out).

    Parameters
    ----------
    profiles : Profiles
        The run's devices' profile rows.
    model : str

    Returns
    -------
    dict of str to EnergyCurve
    """
    return energy_curves(energy_cells(profiles), model, functools.partial(width_flops, model))


def predicted_energy(
    energy: Mapping[str, EnergyCurve],
    model: str,
    device: str | None,
    widths: Mapping[float, float],
    examples: int,
    epochs: int,
) -> float | None:
    """Return a client round's predicted energy in joules: its device's energy per image x the images it trained.

    Parameters
    ----------
    energy : mapping of str to EnergyCurve
        Each device's energy per image of the run's model (`fl.scheduling.energy`).
    model : str
    device : str or None
        The client's device (None: not placed on one).
    widths : mapping of float to float
        The widths the round trained and the steps at each (one width for a static sub-model).
    examples, epochs : int
        The client's examples and the round's epochs (``epochs * examples`` images).

    Returns
    -------
    float or None
        None when the device has no energy per image of the model.
    """
    curve = None if device is None else energy.get(device)
    if curve is None or not widths:
        return None
    joules, _ = round_energy(
        curve, list(widths), round_images(examples, epochs), functools.partial(width_flops, model),
        shares=list(widths.values()),
    )  # fmt: skip
    return joules


def _width_shares(width: float, res: TrainRes | None) -> dict[float, float]:
    """Return the widths a client round trained with their steps: FjORD's drawn widths, else its one width."""
    if res is not None and res.steps_at_width:
        return {float(w): float(n) for w, n in res.steps_at_width.items() if n}
    return {float(width): 1.0}


def _logged_metrics(res: TrainRes) -> dict[str, Any]:
    """Return a client result's metrics as the run log stores them.

    The steps per width of a FjORD per-step round are one object, ``steps_at_width``,
    keyed by the width as text (JSON keys are strings), so a reader gets them back
    with `fl.roundcost.drawn_steps`.
    """
    logged: dict[str, Any] = dict(res.metrics)
    if res.steps_at_width:
        logged["steps_at_width"] = {f"{width:g}": int(n) for width, n in res.steps_at_width.items()}
    return logged


def _float_or_none(value: Any) -> float | None:
    return None if value is None else float(value)


def _finite_or_none(value: Any) -> float | None:
    number = _float_or_none(value)
    return number if number is not None and math.isfinite(number) else None


def _history(log: RunLog, run_id: int) -> list[RoundSummary]:
    frame = log.rounds(run_id)
    clients = log.client_rounds(run_id)
    failed = clients[clients.status != "ok"] if not clients.empty else clients
    out = []
    for row in frame.itertuples(index=False):
        metrics, evaluation = row.metrics, row.evaluation
        failures = () if failed.empty else tuple(
            ClientFailure(str(c.cid), str(c.status), str(c.message), float(c.wait_seconds or 0.0))
            for c in failed[failed["round"] == row.round].itertuples(index=False)
        )  # fmt: skip
        out.append(
            RoundSummary(
                round=int(row.round),
                clients_ok=int(metrics.get("clients_ok", 0)),
                clients_failed=int(metrics.get("clients_failed", 0)),
                mean_loss=metrics.get("mean_loss"),
                accuracy={float(w): float(v["accuracy"]) for w, v in evaluation.items()},
                seconds=float(row.wall_seconds),
                failures=failures,
                virtual_seconds=_finite_or_none(getattr(row, "virtual_seconds", None)),
                predicted_energy_j=_finite_or_none(getattr(row, "predicted_energy_j", None)),
                measured_energy_j=_finite_or_none(getattr(row, "measured_energy_j", None)),
            )
        )
    return out


def _record_model(log: RunLog, model: ZooModel) -> None:
    record = model_record(model)
    if record is not None:
        log.store.record_model(record)
