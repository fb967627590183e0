"""The ``fleetbench fl`` commands: ``fl run`` (train, log, checkpoint, resume) and ``fl runs``.

``fl run`` builds a `fl.server.RunConfig` from its options and calls
`fl.server.run_fl`; progress goes to stderr one line per round, the summary to
stdout (one JSON document with ``--json``). ``--resume RUN`` continues a logged
run from its last checkpoint with the stored configuration; options given again
must equal the stored ones, except ``--rounds``, ``--workers``, ``--eval-every``,
``--timeout``, ``--executor`` and ``--profiles``, which may change.

``--executor ray`` trains in Ray actors (`fl.executors.ray`; ``--ray-address`` joins a
cluster). ``--population SPEC --profiles DB`` runs the rounds on a virtual clock
(`fl.population`, costs from `fl.roundcost`); ``--clock-only`` runs its schedule alone
(`fl.server.run_clock_only`). Everything the options name (Ray, the profile store, its
devices and their profiles) is checked before the run's store is touched.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any

from exporters.cli import add_model_arguments
from exporters.userinput import InputError, non_negative_int, number, positive_float, positive_int

#: Defaults of ``fl run`` (also the `RunConfig` defaults).
DEFAULTS: dict[str, Any] = {
    "strategy": "fedavg",
    "model": "fjord-cnn",
    "dataset": "mnist5k",
    "clients": 10,
    "rounds": 5,
    "capacities": "1",
    "partition": "iid",
    "seed": 0,
    "epochs": 1,
    "batch": 20,
    "lr": 0.05,
    "eval_every": 1,
    "workers": 0,
    "db": "fleetbench.db",
    "optimizer": "sgd",
}


def parse_options(items: Sequence[str]) -> dict[str, Any]:
    """Parse ``key=value`` items; values are JSON when they parse, else strings.

    Parameters
    ----------
    items : sequence of str
        ``["width=0.5", "mode=random", "levels=[1, 0.5]"]``.

    Returns
    -------
    dict
        ``{"width": 0.5, "mode": "random", "levels": [1, 0.5]}``.

    Raises
    ------
    InputError
        If an item has no ``=`` or an empty key.
    """
    from fl.population import split_item

    out: dict[str, Any] = {}
    for item in items:
        key, text = split_item(item, f"--opt {item!r} is not key=value")
        try:
            out[key] = json.loads(text)
        except json.JSONDecodeError:
            out[key] = text
    return out


def register(commands: argparse._SubParsersAction) -> None:
    """Add the ``fl`` command group to the ``fleetbench`` parser."""
    from fl.strategies import STRATEGIES

    fl = commands.add_parser("fl", help="federated learning runs")
    actions = fl.add_subparsers(dest="fl_command", required=True, parser_class=type(fl))

    run = actions.add_parser("run", help="run (or resume) FL rounds in process, logged in the profile store")
    run.add_argument("--strategy", choices=sorted(STRATEGIES), help="FL method (default fedavg)")
    add_model_arguments(run, None)
    run.add_argument("--dataset", help="mnist5k, digits, shakespeare or synthetic (default mnist5k)")
    run.add_argument("--clients", type=positive_int, help="number of clients (default 10)")
    run.add_argument("--rounds", type=positive_int, help="rounds in total (default 5)")
    per_round = run.add_mutually_exclusive_group()
    per_round.add_argument("--fraction", type=number, help="fraction of clients per round (default 1)")
    per_round.add_argument("--per-round", type=positive_int, help="clients per round")
    run.add_argument("--capacities", help="capacity spec, e.g. 1 or uniform:1,0.5,0.25 (default 1)")
    run.add_argument("--partition", help="iid, dirichlet:ALPHA, labels:K or natural (default iid)")
    run.add_argument("--seed", type=int, help="run seed (default 0)")
    run.add_argument("--epochs", type=positive_int, help="local epochs (default 1)")
    run.add_argument("--batch", type=positive_int, help="local batch size (default 20)")
    run.add_argument("--lr", type=number, help="local learning rate (default 0.05)")
    run.add_argument("--opt", action="append", default=[], metavar="KEY=VALUE", help="strategy option (repeatable)")
    run.add_argument("--eval-every", type=positive_int, help="evaluate every N rounds (default 1)")
    run.add_argument("--timeout", type=positive_float, help="seconds a client may train before it counts as failed")
    run.add_argument(
        "--max-failed-rounds",
        type=positive_int,
        help="stop the run as failed after this many rounds in which no client trained (default 1)",
    )
    run.add_argument(
        "--workers",
        type=non_negative_int,
        help="training processes (default 0: one at a time; with --executor ray: actors, 0 = one per core)",
    )
    run.add_argument(
        "--executor", choices=("inprocess", "ray"), help="where clients train (default inprocess; --fleet: devices)"
    )
    run.add_argument("--ray-address", help="join this running Ray cluster (--executor ray; default: a local instance)")
    run.add_argument(
        "--population", metavar="SPEC", help="virtual clients on measured devices: device=share,... (a virtual clock)"
    )
    run.add_argument("--profiles", metavar="DB", help="profile store the --population devices were measured in")
    run.add_argument(
        "--variation", type=number, help="lognormal sigma of each client's speed factor (default 0.1; 0: none)"
    )
    run.add_argument("--availability", type=number, help="probability that a client is online in a round (1)")
    run.add_argument(
        "--overcommit", type=number, help="sample K*(1+O) clients, keep the first K to finish (default 0)"
    )
    run.add_argument("--deadline", type=positive_float, help="round deadline in virtual seconds")
    run.add_argument("--link", metavar="SPEC", help="KBIT[:DELAY_MS] or device=KBIT[:DELAY_MS],...: transfer times")
    run.add_argument("--clock-only", action="store_true", help="run the virtual schedule only, no training")
    run.add_argument(
        "--client-examples", type=positive_int, help="examples per client in --clock-only (default: the partition)"
    )
    run.add_argument(
        "--threads", type=positive_int, default=1, help="torch threads for in-process training (default 1)"
    )
    run.add_argument("--fleet", help="train on this fleet's devices (devices executor; clients placed round-robin)")
    run.add_argument("--artifacts", default="artifacts", help="artifact cache for --fleet (default ./artifacts)")
    run.add_argument(
        "--backend",
        choices=("auto", "ort", "onnx", "torch"),
        default="auto",
        help="runner backend on the --fleet devices (default auto: each device's best available, ort > onnx > torch; "
        "a phone on its runtime bundle: onnx; --strategy feddrop: onnx, whose step model takes the masks)",
    )
    run.add_argument(
        "--optimizer",
        choices=("sgd", "adamw"),
        help="optimizer graph the devices train with (--fleet; default sgd, or the resumed run's); "
        "profile with the same",
    )
    run.add_argument("--db", help="profile store the run is logged in (default fleetbench.db)")
    run.add_argument(
        "--plan",
        nargs="?",
        const="default",
        metavar="DEADLINE",
        help="plan capacities, FedDrop budgets and FLuID's start on the measured profiles (--fleet: the --db store; "
        "--population: --profiles), as `fleetbench plan` does; DEADLINE: auto (default; none with --energy-budget), "
        "SECONDS, pNN or none",
    )
    add_plan_arguments(run)
    run.add_argument("--resume", type=positive_int, metavar="RUN", help="continue run RUN from its checkpoint")
    run.add_argument("--json", action="store_true", help="print one JSON summary")
    run.set_defaults(handler="fl.cli:cmd_run")

    plan = commands.add_parser(
        "plan", help="plan an FL run on measured profiles: each device's width, tier, budget and predicted round"
    )
    where = plan.add_mutually_exclusive_group(required=True)
    where.add_argument("--fleet", help="fleet file (memory budgets and threads from it)")
    where.add_argument("--population", metavar="SPEC", help="virtual clients on measured devices: device=share,...")
    plan.add_argument("--db", default=DEFAULTS["db"], help="profile store the devices were measured in")
    add_model_arguments(plan, DEFAULTS["model"])
    plan.add_argument("--strategy", choices=sorted(STRATEGIES), default="fjord", help="FL method (default fjord)")
    plan.add_argument("--batch", type=positive_int, default=DEFAULTS["batch"], help="local batch (default 20)")
    plan.add_argument("--optimizer", choices=("sgd", "adamw"), default="sgd", help="optimizer graph (default sgd)")
    plan.add_argument("--epochs", type=positive_int, default=DEFAULTS["epochs"], help="local epochs (default 1)")
    plan.add_argument("--clients", type=positive_int, help="clients (default: one per fleet device; population 10)")
    plan.add_argument("--dataset", default=DEFAULTS["dataset"], help="data set the clients hold (default mnist5k)")
    plan.add_argument("--partition", default=DEFAULTS["partition"], help="partition (default iid)")
    plan.add_argument("--seed", type=int, default=0, help="run seed: partition and population (default 0)")
    plan.add_argument("--examples", type=positive_int, help="examples every client holds (instead of the data set)")
    plan.add_argument(
        "--deadline", default="default",
        help="auto (the median device's round at full width, FjORD's at full capacity; the default without "
        "--energy-budget), SECONDS, pNN, or "
        "none (the default with --energy-budget: the budget alone limits the widths)",
    )  # fmt: skip
    plan.add_argument(
        "--backend", choices=("auto", "ort", "onnx", "torch"), default="auto",
        help="the backend whose profiles to plan with (default auto: each device's profiled one, ort > onnx > torch)",
    )  # fmt: skip
    plan.add_argument("--opt", action="append", default=[], metavar="KEY=VALUE", help="strategy option (repeatable)")
    add_plan_arguments(plan)
    plan.add_argument("--json", action="store_true", help="print the plan as one JSON document")
    plan.set_defaults(handler="fl.cli:cmd_plan")

    runs = actions.add_parser("runs", help="list the FL runs in a profile store")
    runs.add_argument("--db", default=DEFAULTS["db"], help="profile store (default fleetbench.db)")
    runs.add_argument("--json", action="store_true", help="print one JSON document")
    runs.set_defaults(handler="fl.cli:cmd_runs")

    data = actions.add_parser(
        "data", help="write the FL data as a model reads it, for fleetbench profile --data (profiles of FL's job)"
    )
    data.add_argument("--out", required=True, help=".npz to write (x, y)")
    add_model_arguments(data, DEFAULTS["model"])
    data.add_argument("--dataset", default=DEFAULTS["dataset"], help=f"data set (default {DEFAULTS['dataset']})")
    data.add_argument("--examples", type=positive_int, default=None, help="examples to write (default 520)")
    data.add_argument("--seed", type=int, default=0, help="seed of the subset (default 0)")
    data.set_defaults(handler="fl.cli:cmd_data")


def add_plan_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the planner's options shared by ``fleetbench plan`` and ``fl run --plan``."""
    from fl.plan import DEFAULT_TIERS, UNPROFILED

    parser.add_argument(
        "--tiers",
        type=positive_int,
        default=DEFAULT_TIERS,
        help=f"tiers of FjORD / HeteroFL / FedRolex (default {DEFAULT_TIERS})",
    )
    parser.add_argument(
        "--unprofiled", choices=UNPROFILED, default="refuse",
        help="a device without a profile of the model: refuse the plan (default), give it the smallest width, or "
        "exclude it",
    )  # fmt: skip
    parser.add_argument(
        "--energy-budget", type=positive_float, metavar="J",
        help="energy budget per client round in joules: each device's widest width (FedDrop: keep probability) whose "
        "predicted energy, from the profiles' energy per image, fits it; with a deadline both limits hold",
    )  # fmt: skip


def config_from_args(args: argparse.Namespace) -> Any:
    """Build the `fl.server.RunConfig` of ``fl run`` (a new run, not ``--resume``).

    Raises
    ------
    InputError
        On a value the configuration rejects.
    """
    from fl.server import RunConfig

    def pick(name: str, attr: str | None = None) -> Any:
        value = getattr(args, attr or name)
        return DEFAULTS[name] if value is None else value

    fraction = 1.0 if args.fraction is None else args.fraction
    config = RunConfig(
        strategy=pick("strategy"),
        model=pick("model"),
        dataset=pick("dataset"),
        clients=pick("clients"),
        rounds=pick("rounds"),
        fraction=fraction,
        per_round=args.per_round,
        capacities=pick("capacities"),
        partition=pick("partition"),
        seed=pick("seed"),
        epochs=pick("epochs"),
        batch_size=pick("batch"),
        lr=pick("lr"),
        options=parse_options(args.opt),
        eval_every=pick("eval_every"),
        workers=pick("workers"),
        db=pick("db"),
        timeout_s=args.timeout,
        max_failed_rounds=1 if args.max_failed_rounds is None else args.max_failed_rounds,
        executor=args.executor or "inprocess",
        optimizer=pick("optimizer"),
        **_population_fields(args),
    )
    config.validate()
    return config


def _population_fields(args: argparse.Namespace) -> dict[str, Any]:
    """Return the `RunConfig` fields of the virtual-clock options that were given."""
    fields = {
        "population": args.population,
        "profiles": args.profiles,
        "variation": args.variation,
        "availability": args.availability,
        "overcommit": args.overcommit,
        "deadline_s": args.deadline,
        "link": args.link,
        "client_examples": args.client_examples,
    }
    out = {k: v for k, v in fields.items() if v is not None}
    if args.clock_only:
        out["clock_only"] = True
    return out


def _resume_config(args: argparse.Namespace) -> Any:
    """Return the stored configuration of ``--resume RUN`` with the options given on this command line.

    `fl.server.run_fl` then refuses any change other than `fl.server.RESUMABLE_CHANGES`.
    """
    import dataclasses

    from fl.runlog import RunLog
    from fl.server import RunConfig
    from harness.store import ProfileStore

    db = args.db or DEFAULTS["db"]
    with ProfileStore(db, create=False) as store:
        stored = RunConfig.from_dict(RunLog(store).run(args.resume)["config"])
    given = {field: getattr(args, attr) for attr, field in _ARG_FIELDS.items() if getattr(args, attr) is not None}
    given.update(_population_fields(args))
    if args.opt:
        given["options"] = parse_options(args.opt)
    config = dataclasses.replace(stored, db=db, **given)
    config.validate()
    return config


#: ``fl run`` argument -> `RunConfig` field.
_ARG_FIELDS = {
    "strategy": "strategy",
    "model": "model",
    "dataset": "dataset",
    "clients": "clients",
    "rounds": "rounds",
    "fraction": "fraction",
    "per_round": "per_round",
    "capacities": "capacities",
    "partition": "partition",
    "seed": "seed",
    "epochs": "epochs",
    "batch": "batch_size",
    "lr": "lr",
    "eval_every": "eval_every",
    "workers": "workers",
    "timeout": "timeout_s",
    "max_failed_rounds": "max_failed_rounds",
    "executor": "executor",
    "optimizer": "optimizer",
}


def cmd_run(args: argparse.Namespace) -> int:
    """Run ``fleetbench fl run``.

    Parameters
    ----------
    args : argparse.Namespace

    Returns
    -------
    int
        0 when the run finished; 1 when it stopped after ``--max-failed-rounds`` failed
        rounds (every client's failure reason is printed, and is in ``--json``).
    """
    from fl.server import run_clock_only, run_fl

    config = _resume_config(args) if args.resume is not None else config_from_args(args)
    fleet = _load_fleet(args.fleet) if args.fleet else None
    if fleet is not None and (config.executor == "ray" or config.population is not None):
        raise InputError("--fleet trains on the fleet's devices; it takes neither --executor ray nor --population")
    if fleet is None and config.optimizer != "sgd":
        raise InputError(f"--optimizer {config.optimizer} needs --fleet: in-process training uses SGD")
    if args.ray_address is not None and config.executor != "ray":
        raise InputError("--ray-address needs --executor ray")
    if config.clock_only and args.resume is not None:
        raise InputError("a --clock-only run trains nothing and has nothing to resume; start it again")
    if config.executor == "ray":
        from fl.executors.ray import require_ray

        require_ray()
    if args.plan is not None and fleet is None and config.population is None:
        raise InputError("--plan needs the devices it plans for: --fleet FILE or --population SPEC --profiles DB")
    virtual, profiles = _virtual_clock(config) if config.population is not None else (None, None)
    plan, capacities, fed = None, None, None
    if virtual is not None and args.plan is not None:
        from fl.scheduling.configs import ProfileConfig

        fed = _federated(config)
        placement = virtual.population.placement()
        configs = {d: ProfileConfig(batch=config.batch_size, optimizer=config.optimizer) for d in placement.values()}
        config, plan, capacities = _planned(args, config, placement, configs, {}, config.profiles, fed)
    import torch

    # Small models train fastest on one thread; more only oversubscribe a shared machine.
    torch.set_num_threads(args.threads)
    if fleet is not None:
        summary = _run_on_fleet(args, config, fleet)
    elif virtual is not None and config.clock_only:
        summary = run_clock_only(config, virtual, capacities=capacities, profiles=profiles)
    elif config.executor == "ray":
        from exporters.zoo import get_model
        from fl.executors.ray import RayExecutor

        with RayExecutor(
            get_model(config.model), config.workers, address=args.ray_address, threads=args.threads
        ) as executor:
            summary = run_fl(
                config, executor=executor, resume_run=args.resume, virtual=virtual, profiles=profiles,
                capacities=capacities, plan=plan, data=fed,
            )  # fmt: skip
    else:
        summary = run_fl(
            config, resume_run=args.resume, virtual=virtual, profiles=profiles, capacities=capacities, plan=plan,
            data=fed,
        )  # fmt: skip
    if summary.status != "finished":
        print(f"FL run {summary.run_id} failed after {summary.rounds} round(s): {summary.error}", file=sys.stderr)
        for rnd in summary.history:
            for failure in rnd.failures if rnd.failed else ():
                detail = f": {failure.message}" if failure.message else ""
                print(f"  round {rnd.round + 1}: {failure.cid} {failure.reason}{detail}", file=sys.stderr)
    if args.json:
        print(json.dumps(summary.to_json()))
        return 0 if summary.status == "finished" else 1
    if summary.status != "finished":
        return 1
    if config.clock_only:
        total = sum(h.virtual_seconds or 0.0 for h in summary.history)
        kept = sum(h.clients_ok for h in summary.history)
        joules = [h.predicted_energy_j for h in summary.history if h.predicted_energy_j is not None]
        energy = f", {sum(joules):.4g} virtual joules" if joules else ""
        print(
            f"FL run {summary.run_id} (clock only, {config.clients} clients on {config.population}, seed "
            f"{config.seed}): {summary.rounds} rounds, {kept} client updates kept, {total:.2f} virtual seconds"
            f"{energy}; logged in {config.db}"
        )
        return 0
    accuracy = ", ".join(f"{w:g}: {a:.4f}" for w, a in summary.accuracy.items()) or "not evaluated"
    print(
        f"FL run {summary.run_id} ({config.strategy}, {config.model} on {config.dataset}, {config.clients} clients, "
        f"seed {config.seed}): {summary.rounds} rounds; final global accuracy per width: {accuracy}"
    )
    energy = energy_line(summary.history, virtual=config.population is not None)
    if energy:
        print(energy)
    resume = f"fleetbench fl run --resume {summary.run_id} --rounds N --db {config.db}"
    print(f"Logged in {config.db}; resume with: {resume}")
    return 0


def energy_line(history: Sequence[Any], *, virtual: bool) -> str:
    """Return the run's energy in one line: predicted (a population's virtual) and measured joules summed over rounds.

    Parameters
    ----------
    history : sequence of fl.server.RoundSummary
    virtual : bool
        A population run: its predicted energy is its virtual energy.

    Returns
    -------
    str
        "" when no round has any energy.
    """
    parts = []
    for name, key in (("virtual" if virtual else "predicted", "predicted_energy_j"), ("measured", "measured_energy_j")):
        values = [getattr(h, key) for h in history if getattr(h, key) is not None]
        if values:
            parts.append(f"{name} {sum(values):.4g} J")
    return f"energy over the rounds: {', '.join(parts)}" if parts else ""


def _virtual_clock(config: Any) -> tuple[Any, dict[str, list[dict[str, Any]]]]:
    """Build the virtual clock of a population run, and its devices' profiles for the strategies.

    Reads ``config.profiles`` (never creates it) and checks the population against it.

    Raises
    ------
    InputError
        On a malformed spec, an unknown device, a device without a profile of the model, a
        store that does not exist, or a bad ``--link``.
    """
    from fl.population import VirtualClock, check_devices, draw_population, parse_population
    from fl.roundcost import measured_models, parse_links, round_cost_from_rows
    from fl.scheduling.configs import ProfileConfig, match_round_cost
    from harness.latency import profile_rows
    from harness.store import ProfileStore

    shares = parse_population(config.population)
    with ProfileStore(config.profiles, create=False) as store:
        cells = store.latest_cells()
        stored = store.round_costs()
    check_devices(shares, measured_models(cells), config.model, config.profiles)
    devices = [d for d, share in shares.items() if share > 0]
    links = parse_links(config.link, devices)
    population = draw_population(
        shares, config.clients, config.seed, variation=config.variation, availability=config.availability
    )
    costs = {}
    for device in devices:
        measured, _ = match_round_cost(stored, device, config.model, ProfileConfig(batch=config.batch_size))
        if measured is not None:
            costs[device] = measured
    cost = round_cost_from_rows(
        cells, config.model, config.batch_size, devices, links=links, costs=costs,
        warn=_warning,
    )  # fmt: skip
    clock = VirtualClock(population, cost, seed=config.seed, overcommit=config.overcommit, deadline_s=config.deadline_s)
    profiles: dict[str, list[dict[str, Any]]] = {}
    for row in profile_rows(cells):
        if row["device"] in shares and row["model"] == config.model and row.get("status") == "ok":
            profiles.setdefault(str(row["device"]), []).append(row)
    return clock, profiles


def _warning(line: str) -> None:
    print(f"fleetbench: warning: {line}", file=sys.stderr, flush=True)


def _federated(config: Any) -> Any:
    """Return the run's federated data, as `fl.server.run_fl` loads it (the plan's shards are the run's)."""
    from exporters.zoo import get_model
    from fl.data import load_federated

    return load_federated(config.dataset, get_model(config.model), config.clients, config.partition, config.seed)


def _shard_sizes(fed: Any) -> dict[str, int]:
    """Return each client's training examples in the federated data."""
    return {f"c{i}": len(y) for i, (_, y) in enumerate(fed.train)}


def plan_request(
    config: Any,
    placement: dict[str, str],
    configs: dict[str, Any],
    memory: dict[str, int],
    deadline: str,
    args: argparse.Namespace,
    sizes: dict[str, int],
) -> Any:
    """Return the `fl.plan.PlanRequest` of a run's configuration and client placement.

    Parameters
    ----------
    config : fl.server.RunConfig
    placement : dict of str to str
        Client id -> device.
    configs : dict of str to ProfileConfig
        The configuration each device trains with.
    memory : dict of str to int
        Memory budgets in bytes.
    deadline : str
        The deadline policy.
    args : argparse.Namespace
        ``tiers``, ``unprofiled`` and ``energy_budget``.
    sizes : dict of str to int
        Client id -> training examples.
    """
    from fl.plan import PlanRequest, device_examples

    budget = getattr(args, "energy_budget", None)
    return PlanRequest(
        model=config.model, strategy=config.strategy, batch=config.batch_size, epochs=config.epochs,
        optimizer=config.optimizer, examples=device_examples(placement, sizes), configs=configs,
        deadline=deadline_policy(deadline, budget), tiers=args.tiers, unprofiled=args.unprofiled, memory=memory,
        options=dict(config.options), energy_budget_j=budget,
    )  # fmt: skip


def deadline_policy(given: str, energy_budget: float | None) -> str:
    """Return the deadline policy of ``--deadline`` / ``--plan``: ``default`` is ``none`` under a budget, else ``auto``.

    Parameters
    ----------
    given : str
        The option's value (``default`` when not given).
    energy_budget : float or None
        ``--energy-budget``.

    Returns
    -------
    str
    """
    if given != "default":
        return given
    return "none" if energy_budget is not None else "auto"


def cmd_plan(args: argparse.Namespace) -> int:
    """Run ``fleetbench plan``: print each device's planned width, tier, budget and predicted round.

    Parameters
    ----------
    args : argparse.Namespace

    Returns
    -------
    int
        0.

    Raises
    ------
    InputError
        A store without the model, a device without a profile (unless ``--unprofiled``), a bad deadline.
    """
    from fl.plan import format_plan, run_plan
    from fl.population import draw_population, parse_population
    from fl.scheduling import memory_budgets_from_fleet
    from fl.scheduling.configs import ProfileConfig
    from fl.server import RunConfig
    from harness.store import ProfileStore

    backend = None if args.backend == "auto" else args.backend
    if args.fleet:
        fleet = _load_fleet(args.fleet)
        names = [d.name for d in fleet.devices]
        clients = args.clients or len(names)
        placement = {f"c{i}": names[i % len(names)] for i in range(clients)}
        configs = {
            d.name: ProfileConfig(batch=args.batch, backend=backend, optimizer=args.optimizer, threads=d.threads)
            for d in fleet.devices
        }
        memory = memory_budgets_from_fleet(fleet)
    else:
        shares = parse_population(args.population)
        clients = args.clients or DEFAULTS["clients"]
        placement = draw_population(shares, clients, args.seed).placement()
        configs = {d: ProfileConfig(batch=args.batch, backend=backend, optimizer=args.optimizer) for d in shares}
        memory = {}
    config = RunConfig(
        strategy=args.strategy, model=args.model, dataset=args.dataset, clients=clients, partition=args.partition,
        seed=args.seed, epochs=args.epochs, batch_size=args.batch, optimizer=args.optimizer,
        options=parse_options(args.opt),
    )  # fmt: skip
    sizes = (
        {f"c{i}": int(args.examples) for i in range(clients)}
        if args.examples is not None
        else _shard_sizes(_federated(config))
    )
    request = plan_request(config, placement, configs, memory, args.deadline, args, sizes)
    with ProfileStore(args.db, create=False) as store:
        plan = run_plan(store, request, warn=None if args.json else _warning).current
    if args.json:
        print(json.dumps(plan.to_json()))
        return 0
    print("\n".join(format_plan(plan)))
    run = f"fleetbench fl run --{'fleet ' + args.fleet if args.fleet else 'population ' + args.population}"
    budget = "" if args.energy_budget is None else f" --energy-budget {args.energy_budget:g}"
    print(f"train with it: {run} --strategy {args.strategy} --db {args.db} --plan {plan.deadline}{budget} ...")
    return 0


def _load_fleet(path: str) -> Any:
    """Load ``--fleet`` and refuse a fleet without devices."""
    from pathlib import Path

    from devices.fleetfile import load_fleet

    fleet = load_fleet(Path(path))
    if not fleet.devices:
        raise InputError(f"{path}: the fleet has no devices")
    return fleet


def fleet_placement(fleet: Any, override: str, clients: int) -> tuple[dict[str, Any], dict[str, str]]:
    """Choose each device's backend and place the clients on the devices that have one.

    Every device is asked what it can run (`harness.provision.fleet_backends`; ``override``
    other than ``"auto"`` is taken as given); each choice is printed on stderr, and a
    device with no usable backend is skipped with its reason. Client ``i`` goes to usable
    device ``i mod n``.

    Parameters
    ----------
    fleet : devices.fleet.Fleet
    override : str
        ``--backend``: ``auto``, ``ort``, ``onnx`` or ``torch``.
    clients : int

    Returns
    -------
    placement : dict of str to Device
        Client id -> device.
    backends : dict of str to str
        Client id -> runner backend.

    Raises
    ------
    InputError
        When no device of the fleet can run a backend.
    """
    from harness.backends import format_choices, usable_devices
    from harness.provision import fleet_backends

    choices = fleet_backends(fleet, override)
    for line in format_choices(choices):
        print(f"fleetbench: backend of {line}", file=sys.stderr, flush=True)
    backend_of = usable_devices(choices)
    usable = [d for d in fleet.devices if d.name in backend_of]
    if not usable:
        reasons = "; ".join(f"{c.device}: {c.reason}" for c in choices)
        raise InputError(
            f"no device of {fleet.path} can run a backend ({reasons}); see: fleetbench fleet provision {fleet.path}"
        )
    placement = {f"c{i}": usable[i % len(usable)] for i in range(clients)}
    return placement, {cid: backend_of[device.name] for cid, device in placement.items()}


def _run_on_fleet(args: argparse.Namespace, config: Any, fleet: Any) -> Any:
    """Run ``config`` with the devices executor on ``fleet`` (`fleet_placement` places the clients).

    Each device trains with its fleet-file threads and ``--optimizer``; the run plans with the
    profile of each device matching that configuration (the nearest, with a warning).
    """
    import dataclasses
    import tempfile
    from pathlib import Path

    from devices.connect import connect
    from exporters.zoo import get_model
    from fl.executors.devices import DevicesExecutor, backend_for_strategy
    from fl.roundcost import executor_configs
    from fl.server import run_fl
    from harness.isolation import round_isolation

    config = dataclasses.replace(config, executor="devices")
    backend = backend_for_strategy(config.strategy, args.backend)
    placement, backends = fleet_placement(fleet, backend, config.clients)
    plan, capacities, fed = None, None, None
    if args.plan is not None:
        from fl.scheduling import memory_budgets_from_fleet
        from fl.scheduling.configs import ProfileConfig

        backend_of = {device.name: backends[cid] for cid, device in placement.items()}

        def planned(placement: dict[str, Any]) -> tuple[Any, Any, list[float] | None]:
            configs = {
                d.name: ProfileConfig(config.batch_size, backend_of[d.name], config.optimizer, d.threads)
                for d in placement.values()
            }
            names = {cid: d.name for cid, d in placement.items()}
            return _planned(args, config, names, configs, memory_budgets_from_fleet(fleet), config.db, fed)

        fed = _federated(config)
        planned_config, plan, capacities = planned(placement)
        excluded = {d.device for d in plan.current.devices if d.status == "excluded"}
        if excluded:
            kept = [d for d in dict.fromkeys(placement.values()) if d.name not in excluded]
            if not kept:
                raise InputError(f"the plan excludes every device of {fleet.path}")
            placement = {f"c{i}": kept[i % len(kept)] for i in range(config.clients)}
            backends = {cid: backend_of[device.name] for cid, device in placement.items()}
            planned_config, plan, capacities = planned(placement)
        config = planned_config
    with (
        tempfile.TemporaryDirectory(prefix="fleetbench-fl-") as work,
        DevicesExecutor(
            get_model(config.model),
            placement,
            artifacts_dir=Path(args.artifacts),
            work_dir=Path(work),
            batch=config.batch_size,
            connect=connect,
            timeout_s=config.timeout_s or 300.0,
            backends={device.name: backends[cid] for cid, device in placement.items()},
            optimizer=config.optimizer,
            isolation=round_isolation(fleet),
        ) as executor,
    ):
        return run_fl(
            config,
            executor=executor,
            resume_run=args.resume,
            placement={cid: device.name for cid, device in placement.items()},
            backends=backends,
            device_configs=executor_configs(executor, fleet.devices, config.batch_size),
            capacities=capacities,
            plan=plan,
            round_cost=None if plan is None else plan.cost,
            data=fed,
        )


def _planned(
    args: argparse.Namespace,
    config: Any,
    placement: dict[str, str],
    configs: dict[str, Any],
    memory: dict[str, int],
    db: str,
    fed: Any,
) -> tuple[Any, Any, list[float] | None]:
    """Plan ``fl run --plan`` on the store ``db``; return the planned configuration, the plan and the capacities.

    ``fed`` is the run's federated data (`_federated`): the plan assumes its shards.

    The plan's table goes to stderr. A new run gets the plan's capacities (``explicit:...``)
    and strategy options (FedDrop's budgets, FLuID's start); a resumed run keeps its stored
    configuration, and `fl.server.run_fl` restores its latest plan revision.
    """
    import dataclasses

    from fl.plan import format_plan, run_plan, strategy_options
    from harness.store import ProfileStore

    request = plan_request(config, placement, configs, memory, args.plan, args, _shard_sizes(fed))
    with ProfileStore(db, create=False) as store:
        plan = run_plan(store, request, warn=_warning)
    for line in format_plan(plan.current):
        print(f"fleetbench: plan: {line}", file=sys.stderr, flush=True)
    if args.resume is not None:
        return config, plan, None
    capacities = [plan.capacity(placement[f"c{i}"]) for i in range(config.clients)]
    options = {**config.options, **strategy_options(plan.current, placement)}
    spec = "explicit:" + ",".join(repr(float(c)) for c in capacities)
    planned = dataclasses.replace(config, capacities=spec, options=options)
    planned.validate()
    return planned, plan, capacities


def cmd_data(args: argparse.Namespace) -> int:
    """Run ``fleetbench fl data``: write the bench data file of a model and data set.

    Parameters
    ----------
    args : argparse.Namespace
        ``out, model, dataset, examples, seed``.

    Returns
    -------
    int
        0.
    """
    from pathlib import Path

    from exporters.zoo import get_model
    from fl.data import BENCH_EXAMPLES, write_bench_data

    model = get_model(args.model)
    examples = args.examples or BENCH_EXAMPLES
    path = write_bench_data(args.dataset, model, Path(args.out), examples=examples, seed=args.seed)
    print(f"wrote {path}: {args.dataset} for {model.name}; profile with: fleetbench profile --data {path} ...")
    return 0


def cmd_runs(args: argparse.Namespace) -> int:
    """Run ``fleetbench fl runs``."""
    from fl.runlog import RunLog
    from harness.store import ProfileStore

    with ProfileStore(args.db, create=False) as store:
        frame = RunLog(store).runs()
    columns = ["id", "strategy", "model", "dataset", "seed", "rounds", "rounds_done", "status"]
    rows = frame[columns].to_dict("records") if not frame.empty else []
    if args.json:
        print(json.dumps(rows, default=str))
        return 0
    print(f"{'run':>4} {'strategy':<10} {'model':<18} {'dataset':<12} {'seed':>5} {'rounds':>9} status")
    for row in rows:
        done = f"{row['rounds_done']}/{row['rounds']}"
        print(
            f"{row['id']:>4} {row['strategy']:<10} {row['model']:<18} {row['dataset']:<12} {row['seed']:>5} "
            f"{done:>9} {row['status']}"
        )
    if not rows:
        print(f"no FL runs in {args.db}", file=sys.stderr)
    return 0
