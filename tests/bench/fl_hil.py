"""Hardware-in-the-loop FL on the emulated fleet: round-cost predictions, FLuID calibration and FedDrop budgets.

Run from the repository root: ``python -m tests.bench.fl_hil [--rounds 6] [--examples 4000]``.

1. The example emulated fleet (fast / mid / slow SSH devices and the phone) is brought up
   and profiled at every FLuID size (``fjord-cnn``, SGD artifact sets, each device's threads
   and best backend, the cells training on the rounds' MNIST examples), with each device's
   round cost (`harness.roundcost`: fixed cost, transfer lines); the devices whose best
   backend is not ``onnx`` are profiled with ``onnx`` too, the backend FedDrop trains with.
2. **No-dropout baseline**: FedAvg rounds on the devices, one client per device.
3. **FLuID** (invariant dropout) rounds with the same clients, data and seed: the
   straggler is found from measured round times and its sub-model size is chosen from its
   device's measured latency curve. Printed per round: the straggler, its size, its time,
   the target (the next-slowest client's time) and their ratio (FLuID reports within 10 %);
   and the mean round wall time of the rounds after the first calibration against the
   baseline's same rounds (FLuID reports 18-26 % faster with changing stragglers).
4. **FjORD** rounds with each client's p_max from tiers planned on the predicted round.
5. **Round-cost model**: median and worst |predicted - measured| / measured client round
   time over the three runs; the fixed per-round cost's share of the slowest device's
   full-width round; FLuID's and FjORD's mean round time against FedAvg at full width.
6. **FedDrop budgets**: each device's FLOPs budget ratio from its measured latency-vs-FLOPs
   fit and a per-round time budget less its predicted fixed cost and transfers, all from
   the ``onnx`` profiles and round costs (the configuration FedDrop trains in)
   (`fl.scheduling.budgets_for_fleet`, `fl.roundcost.round_overheads`), then three FedDrop
   rounds on the devices with those per-client budgets (SyncDrop masks as inputs of masked
   step models, onnx backend), and three with budget 1 (every mask kept) as the dense
   reference on the same graph; printed: each client's expected training-FLOPs ratio against
   its budget, and each device's measured round against the all-kept one and the profile's
   dense prediction (`reports.tables.fl_feddrop_time_table`): masks multiply dense kernels,
   so the time stays the dense model's.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import pandas as pd

from devices import emulate
from devices.connect import connect
from devices.fleetfile import load_fleet
from devices.sshd import free_port
from exporters.zoo import get_model
from fl import scheduling
from fl.data import load_federated, write_bench_data
from fl.executors.devices import MASK_BACKEND, DevicesExecutor
from fl.roundcost import DISTURBANCE_RULES, executor_configs, round_cost_from_store, round_overheads
from fl.runlog import RunLog
from fl.scheduling.configs import ProfileConfig
from fl.server import RunConfig, run_fl
from fleetbench.demo import Progress, choose_backends, plan_capacities
from harness import campaign
from harness.store import ProfileStore
from reports import tables

MODEL = "fjord-cnn"
SIZES = (0.25, 0.375, 0.5, 0.625, 0.75, 0.875, 1.0)
#: FLuID's sub-model sizes: a 1/32 grid, most of them never measured (the latency model
#: predicts them), fine enough (fjord-cnn: about a channel) that some size lands the straggler near its target.
FLUID_SIZES = tuple(i / 32 for i in range(8, 33))
BATCH = 20
OPTIMIZER = "sgd"


def _run(
    strategy: str,
    fleet: Any,
    store: ProfileStore,
    root: Path,
    args: argparse.Namespace,
    capacities: list[float] | None = None,
    backends: dict[str, str] | None = None,
    rounds: int | None = None,
    **options: Any,
) -> Any:
    model = get_model(MODEL)
    devices = list(fleet.devices)
    placement = {f"c{i}": d for i, d in enumerate(devices)}
    data = load_federated("mnist5k", model, len(devices), "iid", args.seed, max_examples=args.examples)
    executor = DevicesExecutor(
        model, placement, artifacts_dir=root / "artifacts", work_dir=root / f"work-{strategy}", batch=BATCH,
        connect=connect, timeout_s=300, optimizer=OPTIMIZER, isolation=campaign.round_isolation(fleet),
        backends=backends,
    )  # fmt: skip
    caps = capacities or [1.0] * len(devices)
    config = RunConfig(
        strategy=strategy, model=MODEL, dataset="mnist5k", clients=len(devices), rounds=rounds or args.rounds,
        seed=args.seed, epochs=args.epochs, batch_size=BATCH, lr=0.05, executor="devices", db=str(store.path),
        options=options, capacities="explicit:" + ",".join(f"{c:g}" for c in caps), optimizer=OPTIMIZER,
    )  # fmt: skip
    with executor:
        return run_fl(
            config, store=store, executor=executor, data=data, progress=lambda line: print(f"  {strategy}: {line}"),
            placement={cid: d.name for cid, d in placement.items()}, capacities=caps,
            device_configs=executor_configs(executor, devices, BATCH),
            backends={cid: (backends or {}).get(d.name, "ort") for cid, d in placement.items()},
        )  # fmt: skip


def fleet_round_seconds(store: ProfileStore, run_id: int) -> dict[int, float]:
    """Per round, the slowest client's measured round (compute and transfers): the fleet's round time.

    Devices on this host take turns in a round (`harness.campaign.round_isolation`),
    so the round's wall time adds their turns; real devices would train side by side, and
    the round would last as long as its slowest client.
    """
    frame = RunLog(store).client_rounds(run_id)
    frame = frame[frame["status"] == "ok"] if "status" in frame else frame
    seconds = frame[["compute_seconds", "download_seconds", "upload_seconds"]].fillna(0).sum(axis=1)
    return {int(r): float(s) for r, s in seconds.groupby(frame["round"]).max().items()}


def profile_prediction(metrics: Any) -> float | None:
    """The profile's uncalibrated prediction of a client round, from its metrics (`CalibratedPredictor`)."""
    values = json.loads(metrics) if isinstance(metrics, str) else (metrics or {})
    value = values.get("profile_predicted_seconds")
    return None if value is None else float(value)


def fluid_figures(store: ProfileStore, fluid_run: int) -> None:
    """Print FLuID's straggler per round: size, measured and predicted round against the target."""
    log = RunLog(store)
    table = tables.fl_straggler_table(log.rounds(fluid_run), log.client_rounds(fluid_run))
    print("\n== FLuID calibration (target: the slowest non-straggler's predicted full-width round)")
    print(
        f"{'round':>5} {'straggler':>9} {'device':>7} {'size':>5} {'time s':>7} {'pred s':>7} {'target s':>8} "
        f"{'ratio':>6} host"
    )
    for r in table.itertuples(index=False):
        print(
            f"{int(r.round):>5} {r.cid:>9} {r.device:>7} {r.size:>5.3g} {r.seconds:>7.2f} {r.predicted_s:>7.2f} "
            f"{r.target_s:>8.2f} {r.over_target:>6.2f} {'disturbed' if r.disturbed else ''}"
        )
    if table.empty:
        print("  no straggler was calibrated")
    else:
        later = table[table["round"] >= 2]  # from the second calibrated round on
        kept = later[~later["disturbed"].astype(bool)]
        for name, part in (("every round", later), ("rounds the host did not disturb", kept)):
            ratios = ", ".join(f"{v:.2f}" for v in part["over_target"])
            inside = int(((part["over_target"] >= 0.9) & (part["over_target"] <= 1.1)).sum())
            print(f"  from the second calibrated round, {name}: {ratios} ({inside} of {len(part)} in [0.9, 1.1])")


def round_cost_figures(store: ProfileStore, runs: dict[str, Any], backends: dict[str, str]) -> None:
    """Print prediction error, the slowest device's fixed-cost share and round times against FedAvg."""
    log = RunLog(store)
    print("\n== Round-cost model: |predicted - measured| / measured client round time")
    frames = []
    for name, summary in runs.items():
        frame = log.client_rounds(summary.run_id)
        frames.append(frame)
        median, worst, n = tables.prediction_errors(frame)
        later = frame[frame["round"] >= 1]
        median_later, worst_later, n_later = tables.prediction_errors(later)
        print(
            f"  {name:>7}: median {median:.1%}, worst {worst:.1%} over {n} client rounds; "
            f"rounds >= 1: median {median_later:.1%}, worst {worst_later:.1%} over {n_later}"
        )
        for r in tables.fl_prediction_table(frame).itertuples(index=False):
            print(
                f"           {r.device:>6}: predicted {r.predicted_s:.2f} s, measured {r.measured_s:.2f} s "
                f"(median error {r.median_error:.1%}, worst {r.worst_error:.1%})"
            )
    everything = pd.concat(frames, ignore_index=True)
    median, worst, n = tables.prediction_errors(everything)
    print(f"  all runs: median {median:.1%}, worst {worst:.1%} over {n} client rounds (targets: 10 %, 25 %)")
    predicted = tables.fl_predicted_rounds(everything)
    disturbed = predicted[predicted["disturbed"].astype(bool)]
    median, worst, n = tables.prediction_errors(everything, skip_disturbed=True)
    print(
        f"  all runs, the {n} rounds the host did not disturb: median {median:.1%}, worst {worst:.1%}; "
        f"{len(disturbed)} disturbed ({DISTURBANCE_RULES}): "
        + ", ".join(f"{r.device} r{int(r['round'])} {r.error:.0%}" for _, r in disturbed.iterrows())
    )
    later = everything[everything["round"] >= 1]
    median, worst, n = tables.prediction_errors(later)
    print(f"  rounds >= 1 (calibrated by earlier rounds): median {median:.1%}, worst {worst:.1%}")
    profile_only = everything.assign(predicted_seconds=[profile_prediction(m) for m in everything["metrics"]])
    median, worst, n = tables.prediction_errors(profile_only)
    print(f"  all runs, the profiles' own predictions (uncalibrated): median {median:.1%}, worst {worst:.1%} over {n}")

    costs = {
        c.device: c
        for c in store.round_costs()
        if c.model == MODEL and c.optimizer == OPTIMIZER and c.backend == backends.get(c.device)
    }
    base = tables.fl_predicted_rounds(log.client_rounds(runs["fedavg"].run_id))
    measured_full = base.groupby("device")["total_s"].median()
    if costs and not measured_full.empty:
        slowest = str(measured_full.idxmax())
        cost = costs.get(slowest)
        if cost is not None:
            share = cost.fixed_s / float(measured_full[slowest])
            print(
                f"\n== Fixed per-round cost on the slowest device ({slowest}): {cost.fixed_s:.2f} s of its "
                f"{float(measured_full[slowest]):.2f} s full-width round = {share:.0%} (target <= 10 %)"
            )
    fleet_rounds = {name: fleet_round_seconds(store, summary.run_id) for name, summary in runs.items()}
    walls = {
        name: dict(zip(frame["round"].astype(int), frame["wall_seconds"].astype(float), strict=True))
        for name, summary in runs.items()
        for frame in [log.rounds(summary.run_id)]
    }
    print(
        "\n== Mean round time, rounds 2.. (after the first calibration), against FedAvg at full width:\n"
        "   fleet round = the slowest client's measured round (devices side by side); wall = this host's round,\n"
        "   where the devices on this host take turns"
    )

    def mean_after_first(values: dict[int, float]) -> float:
        later = [v for r, v in values.items() if r >= 1]
        return statistics.mean(later) if later else float("nan")

    for name in ("fluid", "fjord"):
        b, t = mean_after_first(fleet_rounds["fedavg"]), mean_after_first(fleet_rounds[name])
        bw, tw = mean_after_first(walls["fedavg"]), mean_after_first(walls[name])
        print(
            f"  {name}: fleet round {t:.2f} s vs FedAvg {b:.2f} s: ratio {t / b:.2f} (FLuID's paper: 0.74-0.82); "
            f"wall {tw:.2f} s vs {bw:.2f} s: ratio {tw / bw:.2f}"
        )


def feddrop_budgets(store: ProfileStore, fleet: Any, root: Path, args: argparse.Namespace) -> None:
    """Per-device FLOPs budgets from the profiles; FedDrop rounds on the devices kept within them.

    The rounds train with SyncDrop masks on the devices (the masked artifact sets, onnx
    backend); printed per device: the FLOPs ratio against the budget, and the measured round
    against the same graph with every mask kept (budget 1) and the profile's dense prediction.
    """
    model = get_model(MODEL)
    devices = [d.name for d in fleet.devices]
    data = load_federated("mnist5k", model, len(devices), "iid", args.seed, max_examples=args.examples)
    examples = {name: len(shard[1]) for name, shard in zip(devices, data.train, strict=True)}
    cells = store.latest_cells()
    cells = cells[(cells.backend == MASK_BACKEND) & (cells.optimizer == OPTIMIZER)]
    full = cells[(cells.status == "ok") & (cells.width == 1.0)].set_index("device").median_us
    budget_s = statistics.median(float(full[d]) * 1e-6 * examples[d] * args.epochs for d in devices)
    wants = {d.name: ProfileConfig(BATCH, MASK_BACKEND, OPTIMIZER, d.threads) for d in fleet.devices}
    cost = round_cost_from_store(store, MODEL, BATCH, wants, warn=lambda line: print(f"  warning: {line}"))
    overheads = round_overheads(cost, model, devices)
    budget_s += statistics.median(overheads.values())  # the budget is one of the whole round
    ratios = scheduling.budgets_for_fleet(
        cells, MODEL, budget_s, examples, args.epochs, batch=BATCH, backend=MASK_BACKEND, round_overhead_s=overheads
    )
    budgets = {f"c{i}": min(1.0, max(0.1, ratios[d].ratio or 0.1)) for i, d in enumerate(devices)}
    print(
        f"\n== FedDrop FLOPs budgets on the predicted round (round budget {budget_s:.2f} s, fixed cost and "
        "transfers included), SyncDrop masks on the devices"
    )
    for i, d in enumerate(devices):
        r = ratios[d]
        print(f"  {d:>6} (c{i}): budget ratio {budgets[f'c{i}']:.3f} (fit gives {r.ratio})")
    onnx = {d: MASK_BACKEND for d in devices}  # masks enter the step model only (`backend_for_strategy`)
    summary = _run(
        "feddrop", fleet, store, root, args, backends=onnx, rounds=3, budgets=budgets, convention="training",
        iterations=2000,
    )  # fmt: skip
    dense = _run(
        "feddrop", fleet, store, root, args, backends=onnx, rounds=3, budgets={c: 1.0 for c in budgets},
        convention="training", iterations=2000,
    )  # fmt: skip
    log = RunLog(store)
    rounds = log.rounds(summary.run_id).to_dict("records")
    print(f"{'round':>5} {'client':>6} {'device':>7} {'FLOPs ratio':>11} {'budget':>7} {'within':>6}")
    for r in rounds:
        metrics = json.loads(r["metrics"]) if isinstance(r["metrics"], str) else r["metrics"]
        for i, d in enumerate(devices):
            ratio = metrics.get(f"flops_ratio/c{i}")
            if ratio is None:
                continue
            budget = budgets[f"c{i}"]
            within = ratio <= budget + 1e-9
            print(f"{int(r['round']):>5} {'c' + str(i):>6} {d:>7} {ratio:>11.3f} {budget:>7.3f} {within!s:>6}")
        print(f"      max budget excess {metrics.get('max_budget_excess')}")
    table = tables.fl_feddrop_time_table(log.client_rounds(summary.run_id))
    kept = tables.fl_feddrop_time_table(log.client_rounds(dense.run_id)).set_index("device")
    print(
        "\n== FedDrop on the devices (onnx step model with masks): time against FLOPs, medians over 3 rounds;\n"
        "   'all kept' is the same run with budget 1 (every mask 1), the dense reference on the same graph"
    )
    print(
        f"{'device':>7} {'exp FLOPs':>9} {'sampled':>7} {'round s':>7} {'all kept s':>10} {'time ratio':>10} "
        f"{'dense pred s':>12}"
    )
    for r in table.itertuples(index=False):
        full = float(kept["measured_s"].get(r.device, float("nan")))
        print(
            f"{r.device:>7} {r.expected_flops:>9.2f} {r.sampled_flops:>7.2f} {r.measured_s:>7.2f} {full:>10.2f} "
            f"{r.measured_s / full:>10.2f} {r.dense_s:>12.2f}"
        )
    failed = log.client_rounds(summary.run_id)
    failed = failed[failed["status"] != "ok"]
    for row in failed.itertuples(index=False):
        print(f"  failed: {row.device} round {row.round}: {row.status}: {row.message}")


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; return 0 when every step finished."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--examples", type=int, default=4000, help="MNIST examples over all clients")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--keep", type=Path, help="copy the bench's store (profiles and FL runs) here at the end")
    args = parser.parse_args(argv)
    os.environ["ANDROID_ADB_SERVER_PORT"] = str(free_port())
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        fleet = load_fleet(emulate.write_example_fleet(root / "fleet", free_port))
        try:
            if not emulate.up(fleet, say=lambda line: None).ok:
                raise SystemExit("the emulated fleet did not start")
            with ProfileStore(root / "bench.db") as store:
                start = time.perf_counter()
                fleet, backends = choose_backends(fleet, "auto", Progress(1, out=print))
                bench_data = write_bench_data("mnist5k", get_model(MODEL), root / "bench-data.npz", seed=args.seed)
                # FedDrop trains on the step model (masks as inputs): its budgets are planned on
                # profiles and round costs of that backend, also where a device's best is another
                feddrop_backends = {d.name: MASK_BACKEND for d in fleet.devices if backends[d.name] != MASK_BACKEND}
                best_specs, feddrop_specs = (
                    campaign.plan_cells(
                        fleet, MODEL, SIZES, [BATCH], chosen, 6, 20, OPTIMIZER, max_seconds=3.0,
                        data=campaign.bench_data_label(bench_data),
                    )
                    for chosen in (backends, feddrop_backends)
                )  # fmt: skip
                specs = best_specs + feddrop_specs
                campaign.export_sets(specs, root / "artifacts")
                campaign.run_campaign(
                    fleet, specs, store, artifacts_dir=root / "artifacts", timeout=300, progress=lambda e: None,
                    round_cost=True, announce=lambda line: print(f"  {line}") if "round cost" in line else None,
                    data=bench_data,
                )  # fmt: skip
                print(
                    f"profiled {len(specs)} cells ({len(feddrop_specs)} of them with {MASK_BACKEND} for FedDrop) "
                    f"and the round costs in {time.perf_counter() - start:.0f} s"
                )
                print(f"machine load average before the FL runs: {os.getloadavg()}")
                model = get_model(MODEL)
                data = load_federated(
                    "mnist5k", model, len(fleet.devices), "iid", args.seed, max_examples=args.examples
                )
                examples = {d.name: len(s[1]) for d, s in zip(fleet.devices, data.train, strict=True)}
                capacities = plan_capacities(fleet, store, examples, args.epochs, Progress(1, out=print), backends)
                runs = {"fedavg": _run("fedavg", fleet, store, root, args, backends=backends)}
                runs["fluid"] = _run("fluid", fleet, store, root, args, backends=backends, sizes=list(FLUID_SIZES))
                runs["fjord"] = _run("fjord", fleet, store, root, args, capacities=capacities, backends=backends, k=4)
                fluid_figures(store, runs["fluid"].run_id)
                round_cost_figures(store, runs, backends)
                print(f"machine load average after the FL runs: {os.getloadavg()}")
                feddrop_budgets(store, fleet, root, args)
        finally:
            emulate.down(fleet, say=lambda line: None)
            if args.keep is not None and (root / "bench.db").exists():
                shutil.copyfile(root / "bench.db", args.keep)
                print(f"store kept at {args.keep}")
    return 0


if __name__ == "__main__":
    from devices.processes import terminate_as_interrupt

    with terminate_as_interrupt():  # kill: stop the fleet it started, as Ctrl-C does
        raise SystemExit(main())
