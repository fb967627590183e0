"""Beyond one machine: fleetbench ``inprocess`` and ``ray`` against Flower's simulation engine, and the clock.

Workload (the issue's): FedAvg on MNIST 5k (4,000 training examples after the 20 % test
split), 1,000 clients (IID, 4 examples each), 100 clients per round, 20 rounds, one local
epoch, batch 20, SGD at lr 0.05, the FjORD CNN, seed 0; the global model is evaluated on
the test split after the last round only.

Configurations, each in its own process (a fresh interpreter, so imports, Ray start and
memory are its own):

``inprocess``  `fl.server.run_fl` with the in-process executor, clients one after another.
``ray``        the same with `fl.executors.ray.RayExecutor` (a local Ray instance, one actor per core).
``flower``     Flower's simulation engine (``flwr.simulation.run_simulation``, its Ray backend,
               one CPU per client actor): a ``ServerApp`` with Flower's own ``FedAvg`` and a
               ``ClientApp`` whose ``NumPyClient.fit`` trains with the very same local trainer
               (`fl.client.run_local`), data partition, initial parameters and per-client seeds.
               Flower samples clients with its own unseeded random draw, so its accuracy agrees
               with fleetbench's within seed noise, not bit for bit; the spread of fleetbench's
               accuracy over ``--seeds`` is that noise.

Accuracy agreement. With every client in every round (``--clients 100 --per-round 100``)
nothing is drawn at random and Flower's accuracy equals fleetbench's to the last digit
(0.6090 both after 20 rounds, 0.1090 after 5): model, data, partition, hyper-parameters,
seeds, parameter order, aggregation and evaluation are the same. With 100 of 1,000 clients
per round the accuracy after 20 rounds depends strongly on which clients are drawn: 20
steps of about 400 examples each leave the CNN early on its learning curve. Measured
(2 shared cores; accuracy does not depend on the load): fleetbench at seed 0 with the
sampling draw alone changed gave 0.20 to 0.51 over 11 draws (mean 0.38); over seeds 0 to 3
0.24 to 0.49; Flower at seed 0 gave 0.283, 0.346 and 0.353 in three runs. One seed's
accuracies cannot be compared; the summary's last accuracy line compares the means over
``--seeds`` against their standard error (`accuracy_agreement`). Flower cannot be made to
draw fleetbench's clients: its simulation gives nodes random ids, and the server sees no
partition id without a message to every node.

Figures per configuration: wall time of the whole process (interpreter start, imports, data,
Ray start, rounds, evaluation), rounds per minute over that wall time and over the rounds
alone (steady state, from the second round on), peak memory (the largest sum of PSS over the
configuration's process tree, Ray's processes included, sampled every 0.2 s) and the final
accuracy. Ratios are fleetbench over Flower, end to end.

Clock only: `fl.server.run_clock_only` for 10,000 clients x 100 rounds (100 per round,
over-commitment 0.3, a deadline) on a population of three devices from a generated profile
store, timed in this process.

Every process a configuration leaves running (a Ray instance not stopped) is found by a marker
in its environment, reported and stopped by pid.

Run: ``python -m tests.bench.fl_scale`` (defaults: the issue's sizes);
``--clients 200 --per-round 20 --rounds 5`` for a quick look.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

MARK_ENV = "FLEETBENCH_BENCH_SCALE"
SETTINGS_ENV = "FLEETBENCH_BENCH_SCALE_SETTINGS"
CONFIGS = ("inprocess", "ray", "flower")
MODEL = "fjord-cnn"


@dataclass(frozen=True)
class Settings:
    """One workload."""

    clients: int = 1000
    per_round: int = 100
    rounds: int = 20
    seed: int = 0
    batch: int = 20
    lr: float = 0.05
    workers: int = 0

    def to_json(self) -> str:
        """Return the settings as JSON (passed to child processes)."""
        return json.dumps(self.__dict__)


@dataclass
class Outcome:
    """What one configuration measured."""

    config: str
    seed: int
    wall_s: float = float("nan")
    round_s: list[float] = field(default_factory=list)
    accuracy: float = float("nan")
    peak_pss_mib: float = float("nan")
    leftovers: int = 0
    error: str = ""

    @property
    def rounds_per_min(self) -> float:
        """Rounds per minute over the whole process's wall time."""
        return 60.0 * len(self.round_s) / self.wall_s if self.round_s else float("nan")

    @property
    def steady_rounds_per_min(self) -> float:
        """Rounds per minute from the second round on."""
        later = self.round_s[1:]
        return 60.0 * len(later) / sum(later) if later else float("nan")


# -- the children ----------------------------------------------------------------------------


@lru_cache(maxsize=1)
def _federated(clients: int, seed: int) -> Any:
    from exporters.zoo import get_model
    from fl.data import load_federated

    return load_federated("mnist5k", get_model(MODEL), clients, "iid", seed)


def _fleetbench(settings: Settings, executor_name: str) -> dict[str, Any]:
    from fl.server import RunConfig, run_fl

    config = RunConfig(
        model=MODEL, dataset="mnist5k", clients=settings.clients, rounds=settings.rounds,
        per_round=settings.per_round, seed=settings.seed, batch_size=settings.batch, lr=settings.lr,
        eval_every=settings.rounds, executor=executor_name, workers=settings.workers,
    )  # fmt: skip
    data = _federated(settings.clients, settings.seed)
    with tempfile.TemporaryDirectory() as tmp:
        config = RunConfig(**{**config.__dict__, "db": str(Path(tmp) / "fl.db")})
        if executor_name == "ray":
            from exporters.zoo import get_model
            from fl.executors.ray import RayExecutor

            with RayExecutor(get_model(MODEL), settings.workers) as executor:
                summary = run_fl(config, executor=executor, data=data, progress=None)
        else:
            summary = run_fl(config, data=data, progress=None)
    return {"round_s": [h.seconds for h in summary.history], "accuracy": summary.accuracy[1.0]}


def _param_names() -> list[str]:
    from exporters.zoo import get_model
    from fl.server import initial_parameters

    return list(initial_parameters(get_model(MODEL), 0))


def _flower_client_fn(context: Any) -> Any:
    """Flower's ClientApp: one client of the partition, trained with fleetbench's local trainer."""
    import numpy as np
    import torch
    from flwr.client import NumPyClient

    from exporters.arch import static_submodel
    from exporters.zoo import get_model
    from fl.client import run_local
    from fl.records import TrainIns

    torch.set_num_threads(1)
    settings = Settings(**json.loads(os.environ[SETTINGS_ENV]))
    pid = int(context.node_config["partition-id"])
    x, y = _federated(settings.clients, settings.seed).train[pid]
    model = get_model(MODEL)
    names = _param_names()

    class Client(NumPyClient):  # type: ignore[misc]
        def fit(self, parameters: list[np.ndarray], config: dict[str, Any]) -> tuple[list[np.ndarray], int, dict]:
            rnd = int(config["round"])  # Flower counts rounds from 1, fleetbench from 0
            seed = int(np.random.default_rng((settings.seed, rnd - 1, pid)).integers(2**31 - 1))
            local = {"epochs": 1, "batch_size": settings.batch, "lr": settings.lr, "seed": seed}
            params = {n: np.asarray(p, dtype=np.float32) for n, p in zip(names, parameters, strict=True)}
            res = run_local(model, TrainIns(f"c{pid}", static_submodel(model.full_arch()), params, local), x, y)
            return [res.parameters[n] for n in names], res.num_examples, {"loss": float(res.metrics["loss"])}

    return Client().to_client()


def _flower(settings: Settings) -> dict[str, Any]:
    from flwr.client import ClientApp
    from flwr.common import ndarrays_to_parameters
    from flwr.server import ServerApp, ServerAppComponents, ServerConfig
    from flwr.server.strategy import FedAvg
    from flwr.simulation import run_simulation

    from exporters.zoo import get_model
    from fl.client import evaluate
    from fl.server import initial_parameters

    os.environ[SETTINGS_ENV] = settings.to_json()
    model = get_model(MODEL)
    names = _param_names()
    initial = initial_parameters(model, settings.seed)
    test = _federated(settings.clients, settings.seed).test
    marks: list[float] = []
    accuracy: list[float] = []
    failures: list[str] = []

    class CountingFedAvg(FedAvg):  # type: ignore[misc]
        """Flower's FedAvg, counting the clients that failed (Flower aggregates the others silently)."""

        def aggregate_fit(self, server_round: int, results: list[Any], failed: list[Any]) -> Any:
            failures.extend(f"round {server_round}: {f}" for f in failed)
            return super().aggregate_fit(server_round, results, failed)

    def evaluate_fn(server_round: int, parameters: list[Any], config: dict[str, Any]) -> tuple[float, dict] | None:
        marks.append(time.perf_counter())  # called once before the first round and after every round
        if server_round != settings.rounds:
            return None
        params = dict(zip(names, parameters, strict=True))
        out = evaluate(model, model.full_arch(), params, *test)
        accuracy.append(out["accuracy"])
        return out["loss"], {"accuracy": out["accuracy"]}

    def server_fn(context: Any) -> Any:
        strategy = CountingFedAvg(
            fraction_fit=settings.per_round / settings.clients, fraction_evaluate=0.0,
            min_fit_clients=settings.per_round, min_evaluate_clients=0, min_available_clients=settings.clients,
            initial_parameters=ndarrays_to_parameters([initial[n] for n in names]), evaluate_fn=evaluate_fn,
            on_fit_config_fn=lambda rnd: {"round": rnd},
        )  # fmt: skip
        return ServerAppComponents(strategy=strategy, config=ServerConfig(num_rounds=settings.rounds))

    cpus = settings.workers or os.cpu_count() or 1
    # By reference, not by value: run as `python -m`, this module is __main__, which Ray's workers cannot import.
    client_fn = importlib.import_module("tests.bench.fl_scale")._flower_client_fn
    run_simulation(
        server_app=ServerApp(server_fn=server_fn),
        client_app=ClientApp(client_fn=client_fn),
        num_supernodes=settings.clients,
        backend_config={"client_resources": {"num_cpus": 1, "num_gpus": 0.0}, "init_args": {"num_cpus": cpus}},
    )
    rounds = [b - a for a, b in zip(marks, marks[1:], strict=False)]
    error = f"{len(failures)} client failures, e.g. {failures[0]}" if failures else ""
    return {"round_s": rounds, "accuracy": accuracy[-1] if accuracy else float("nan"), "error": error}


def child(config: str, settings: Settings) -> None:
    """Run one configuration and print its figures as one JSON line."""
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    import torch

    torch.set_num_threads(1)
    out = _flower(settings) if config == "flower" else _fleetbench(settings, config)
    print("RESULT " + json.dumps(out), flush=True)


# -- the parent ------------------------------------------------------------------------------


def _pss_kib(pid: int) -> int:
    try:
        text = Path(f"/proc/{pid}/smaps_rollup").read_text()
    except OSError:
        return 0
    for line in text.splitlines():
        if line.startswith("Pss:"):
            return int(line.split()[1])
    return 0


def _tree_pss_mib(root: int, mark: str) -> float:
    from devices import processes

    pids = set(processes.descendants(root, processes.process_parents())) | set(processes.marked(MARK_ENV, mark))
    return sum(_pss_kib(p) for p in pids) / 1024.0


def measure(config: str, settings: Settings) -> Outcome:
    """Run ``config`` in a child process; sample its tree's memory; stop whatever it leaves running."""
    from devices import processes

    mark = uuid.uuid4().hex
    env = {**os.environ, MARK_ENV: mark, SETTINGS_ENV: settings.to_json(), "RAY_USAGE_STATS_ENABLED": "0"}
    argv = [sys.executable, "-m", "tests.bench.fl_scale", "--child", config, "--settings", settings.to_json()]
    outcome = Outcome(config, settings.seed)
    peak = [0.0]
    start = time.perf_counter()
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    done = threading.Event()

    def sample() -> None:
        while not done.wait(0.2):
            peak[0] = max(peak[0], _tree_pss_mib(proc.pid, mark))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        stdout, stderr = proc.communicate()
    except BaseException:  # Ctrl-C or kill: the child's Ray instance goes too
        done.set()
        processes.stop([], also=lambda: processes.marked(MARK_ENV, mark))
        raise
    outcome.wall_s = time.perf_counter() - start
    done.set()
    sampler.join()
    outcome.peak_pss_mib = peak[0]
    left = processes.marked(MARK_ENV, mark)
    outcome.leftovers = len(left)
    processes.stop([], also=lambda: processes.marked(MARK_ENV, mark))
    lines = [line for line in stdout.splitlines() if line.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        outcome.error = (stderr.strip().splitlines() or [f"exit {proc.returncode}"])[-1]
        return outcome
    result = json.loads(lines[-1][len("RESULT ") :])
    outcome.round_s, outcome.accuracy = result["round_s"], result["accuracy"]
    outcome.error = result.get("error", "")
    return outcome


def clock_only(clients: int, rounds: int, per_round: int) -> tuple[float, int]:
    """Time `run_clock_only` for ``clients`` x ``rounds`` on a generated three-device store."""
    from fl.population import VirtualClock, draw_population
    from fl.roundcost import round_cost_from_rows
    from fl.server import RunConfig, run_clock_only
    from harness.store import ProfileStore
    from tests.fl.scheduling.profiles import store_lines

    with tempfile.TemporaryDirectory() as tmp:
        profiles = Path(tmp) / "profiles.db"
        store_lines(profiles, {"fast": (60.0, 2e-4), "mid": (150.0, 6e-4), "slow": (400.0, 2e-3)})
        with ProfileStore(profiles, create=False) as store:
            cells = store.latest_cells()
        shares = {"fast": 0.3, "mid": 0.5, "slow": 0.2}
        config = RunConfig(
            clients=clients, rounds=rounds, per_round=per_round, db=str(Path(tmp) / "clock.db"),
            population="fast=0.3,mid=0.5,slow=0.2", profiles=str(profiles), clock_only=True, client_examples=50,
            overcommit=0.3, deadline_s=2.0, max_failed_rounds=rounds,
        )  # fmt: skip
        start = time.perf_counter()
        cost = round_cost_from_rows(cells, MODEL, config.batch_size, list(shares))
        clock = VirtualClock(draw_population(shares, clients, config.seed), cost, overcommit=0.3, deadline_s=2.0)
        summary = run_clock_only(config, clock, progress=None)
        return time.perf_counter() - start, sum(h.clients_ok for h in summary.history)


def accuracy_agreement(by_config: dict[str, list[Outcome]]) -> str:
    """Return one line comparing Flower's mean accuracy with fleetbench's against the seeds' spread.

    Parameters
    ----------
    by_config : dict of str to list of Outcome
        Every configuration's outcomes, one per seed.

    Returns
    -------
    str
        The difference of the means and the standard error of that difference (from the
        sample standard deviations over seeds); "agree" when the difference is within two
        standard errors. With fewer than two seeds on either side the spread is unknown and
        the line says so.
    """
    flower = [o.accuracy for o in by_config.get("flower", []) if not o.error]
    ours = [o.accuracy for o in by_config.get("inprocess", by_config.get("ray", [])) if not o.error]
    if not flower or not ours:
        return "accuracy agreement: needs flower and inprocess (or ray) outcomes"
    diff = statistics.fmean(flower) - statistics.fmean(ours)
    if len(flower) < 2 or len(ours) < 2:
        return f"accuracy flower - fleetbench: {diff:+.4f} (one seed: spread unknown, run --seeds 0,1,2,...)"
    stderr = (statistics.variance(flower) / len(flower) + statistics.variance(ours) / len(ours)) ** 0.5
    verdict = "agree" if abs(diff) <= 2 * stderr else "DISAGREE"
    return (
        f"accuracy flower - fleetbench: {diff:+.4f}, standard error {stderr:.4f} over "
        f"{len(flower)} and {len(ours)} seeds: {verdict} within seed noise (2 standard errors)"
    )


def _fmt(value: float, digits: int = 1) -> str:
    return "-" if value != value else f"{value:.{digits}f}"


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=1000)
    parser.add_argument("--per-round", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--seeds", default="0", help="comma-separated; each configuration runs once per seed")
    parser.add_argument("--configs", default=",".join(CONFIGS))
    parser.add_argument("--workers", type=int, default=0, help="Ray actors (0: one per core)")
    parser.add_argument("--clock-clients", type=int, default=10_000)
    parser.add_argument("--clock-rounds", type=int, default=100)
    parser.add_argument("--child", choices=CONFIGS, help=argparse.SUPPRESS)
    parser.add_argument("--settings", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child(args.child, Settings(**json.loads(args.settings)))
        return 0
    print(f"load average before: {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores", flush=True)
    outcomes: list[Outcome] = []
    for seed in (int(s) for s in args.seeds.split(",")):
        for config in args.configs.split(","):
            settings = Settings(args.clients, args.per_round, args.rounds, seed, workers=args.workers)
            outcome = measure(config, settings)
            outcomes.append(outcome)
            print(
                f"{config:<10} seed {seed}: wall {_fmt(outcome.wall_s)} s, {_fmt(outcome.rounds_per_min)} rounds/min "
                f"({_fmt(outcome.steady_rounds_per_min)} steady), peak {_fmt(outcome.peak_pss_mib, 0)} MiB, "
                f"accuracy {_fmt(outcome.accuracy, 4)}"
                + (f", {outcome.leftovers} process(es) left running and stopped" if outcome.leftovers else "")
                + (f", FAILED: {outcome.error}" if outcome.error else ""),
                flush=True,
            )
    print(f"\nFedAvg, MNIST 5k, {args.clients} clients, {args.per_round} per round, {args.rounds} rounds")
    print(f"{'config':<10} {'wall s':>8} {'rounds/min':>11} {'steady':>8} {'peak MiB':>9} {'accuracy':>9}")
    by_config: dict[str, list[Outcome]] = {}
    for o in outcomes:
        by_config.setdefault(o.config, []).append(o)
    medians: dict[str, float] = {}
    for config, group in by_config.items():
        ok = [o for o in group if not o.error]
        if not ok:
            print(f"{config:<10} failed: {group[0].error}")
            continue
        wall = statistics.median(o.wall_s for o in ok)
        medians[config] = statistics.median(o.rounds_per_min for o in ok)
        accuracies = ", ".join(_fmt(o.accuracy, 4) for o in ok)
        print(
            f"{config:<10} {wall:>8.1f} {medians[config]:>11.1f} "
            f"{statistics.median(o.steady_rounds_per_min for o in ok):>8.1f} "
            f"{max(o.peak_pss_mib for o in ok):>9.0f} {accuracies:>9}"
        )
    print(accuracy_agreement(by_config))
    if "flower" in medians:
        for config in ("inprocess", "ray"):
            if config in medians:
                print(f"throughput {config} / flower: {medians[config] / medians['flower']:.2f}x (goal >= 3x)")
    if args.clock_clients > 0:
        seconds, kept = clock_only(args.clock_clients, args.clock_rounds, 100)
        print(
            f"clock only: {args.clock_clients} clients x {args.clock_rounds} rounds (100 per round, over-commitment "
            f"0.3, deadline 2 s) in {seconds:.1f} s ({kept} updates kept; goal < 60 s)"
        )
    print(f"load average after: {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    from devices.processes import terminate_as_interrupt

    with terminate_as_interrupt():  # kill: stop the fleet it started, as Ctrl-C does
        sys.exit(main())
