"""Hardware-in-the-loop FL on the emulated fleet: FLuID calibration and FedDrop budgets.

Run from the repository root: ``python -m tests.bench.fl_hil [--rounds 6] [--examples 4000]``.

1. The example emulated fleet (fast / mid / slow SSH devices and the phone) is brought up
   and profiled at every FLuID size (``fjord-cnn``, SGD artifact sets).
2. **No-dropout baseline**: FedAvg rounds on the devices, one client per device.
3. **FLuID** (invariant dropout) rounds with the same clients, data and seed: the
   straggler is found from measured round times and its sub-model size is chosen from its
   device's measured latency curve. Printed per round: the straggler, its size, its time,
   the target (the next-slowest client's time) and their ratio (FLuID reports within 10 %);
   and the mean round wall time of the rounds after the first calibration against the
   baseline's same rounds (FLuID reports 18-26 % faster with changing stragglers).
4. **FedDrop budgets**: each device's FLOPs budget ratio from its measured latency-vs-FLOPs
   fit and a per-round time budget (`fl.scheduling.budgets_for_fleet`), then FedDrop rounds
   in process with those per-client budgets; printed: each client's expected training-FLOPs
   ratio against its budget (SyncDrop masks do not run on the devices' ORT graphs).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from devices import emulate
from devices.connect import connect
from devices.fleetfile import load_fleet
from devices.sshd import free_port
from exporters.zoo import get_model
from fl import scheduling
from fl.data import load_federated
from fl.executors.devices import DevicesExecutor
from fl.runlog import RunLog
from fl.server import RunConfig, run_fl
from harness import campaign
from harness.store import ProfileStore

MODEL = "fjord-cnn"
SIZES = (0.25, 0.375, 0.5, 0.625, 0.75, 0.875, 1.0)
BATCH = 20


def _run(strategy: str, fleet: Any, store: ProfileStore, root: Path, args: argparse.Namespace, **options: Any) -> Any:
    model = get_model(MODEL)
    devices = list(fleet.devices)
    placement = {f"c{i}": d for i, d in enumerate(devices)}
    data = load_federated("mnist5k", model, len(devices), "iid", args.seed, max_examples=args.examples)
    executor = DevicesExecutor(
        model, placement, artifacts_dir=root / "artifacts", work_dir=root / f"work-{strategy}", batch=BATCH,
        connect=connect, timeout_s=300,
    )  # fmt: skip
    config = RunConfig(
        strategy=strategy, model=MODEL, dataset="mnist5k", clients=len(devices), rounds=args.rounds,
        seed=args.seed, epochs=args.epochs, batch_size=BATCH, lr=0.05, executor="devices", db=str(store.path),
        options=options,
    )  # fmt: skip
    return run_fl(
        config, store=store, executor=executor, data=data, progress=lambda line: print(f"  {strategy}: {line}"),
        placement={cid: d.name for cid, d in placement.items()},
    )  # fmt: skip


def _client_times(store: ProfileStore, run_id: int) -> dict[int, dict[str, dict[str, Any]]]:
    rows = RunLog(store).client_rounds(run_id).to_dict("records")
    out: dict[int, dict[str, dict[str, Any]]] = {}
    for r in rows:
        seconds = (r["compute_seconds"] or 0) + (r["download_seconds"] or 0) + (r["upload_seconds"] or 0)
        out.setdefault(int(r["round"]), {})[r["cid"]] = {**r, "seconds": seconds}
    return out


def fluid_figures(store: ProfileStore, fluid_run: int, base_run: int, base_summary: Any, fluid_summary: Any) -> None:
    """Print the straggler's time against the target per round, and round wall times."""
    times = _client_times(store, fluid_run)
    print("\n== FLuID calibration (straggler time vs target = next-slowest client's time)")
    print(f"{'round':>5} {'straggler':>9} {'device':>7} {'size':>5} {'time s':>7} {'target s':>8} {'ratio':>6}")
    for rnd in sorted(times):
        clients = times[rnd]
        stragglers = [c for c in clients.values() if c["straggler"]]
        for s in stragglers:
            others = sorted((c["seconds"] for c in clients.values() if not c["straggler"]), reverse=True)
            target = others[0] if others else float("nan")
            print(
                f"{rnd:>5} {s['cid']:>9} {s['device']:>7} {s['width']:>5.3g} {s['seconds']:>7.2f} {target:>8.2f} "
                f"{s['seconds'] / target:>6.2f}"
            )
    base = [r.seconds for r in base_summary.history[1:]]
    fl = [r.seconds for r in fluid_summary.history[1:]]
    if base and fl:
        b, f = statistics.mean(base), statistics.mean(fl)
        print(f"\nround wall time, rounds 1..{len(fl)} (after the first calibration):")
        print(f"  no-dropout baseline {b:.2f} s, FLuID {f:.2f} s: FLuID / baseline = {f / b:.2f}")


def feddrop_budgets(store: ProfileStore, fleet: Any, args: argparse.Namespace) -> None:
    """Per-device FLOPs budgets from the profiles; FedDrop rounds in process kept within them."""
    model = get_model(MODEL)
    devices = [d.name for d in fleet.devices]
    data = load_federated("mnist5k", model, len(devices), "iid", args.seed, max_examples=args.examples)
    examples = {name: len(shard[1]) for name, shard in zip(devices, data.train, strict=True)}
    cells = store.latest_cells()
    full = cells[(cells.status == "ok") & (cells.width == 1.0)].set_index("device").median_us
    budget_s = statistics.median(float(full[d]) * 1e-6 * examples[d] * args.epochs for d in devices)
    ratios = scheduling.budgets_for_fleet(cells, MODEL, budget_s, examples, args.epochs, batch=BATCH)
    budgets = {f"c{i}": min(1.0, max(0.1, ratios[d].ratio or 0.1)) for i, d in enumerate(devices)}
    print(f"\n== FedDrop FLOPs budgets from the profiles (per-round training time budget {budget_s:.2f} s)")
    for i, d in enumerate(devices):
        r = ratios[d]
        print(f"  {d:>6} (c{i}): budget ratio {budgets[f'c{i}']:.3f} (fit gives {r.ratio})")
    config = RunConfig(
        strategy="feddrop", model=MODEL, dataset="mnist5k", clients=len(devices), rounds=2, seed=args.seed,
        epochs=1, batch_size=BATCH, lr=0.05, db=str(store.path),
        options={"budgets": budgets, "convention": "training", "iterations": 2000},
    )  # fmt: skip
    summary = run_fl(config, store=store, data=data, progress=lambda line: print(f"  feddrop: {line}"))
    rounds = RunLog(store).rounds(summary.run_id).to_dict("records")
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


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; return 0 when every step finished."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--examples", type=int, default=4000, help="MNIST examples over all clients")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
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
                specs = campaign.plan_cells(fleet, MODEL, SIZES, [BATCH], ["ort"], 6, 20, "sgd", max_seconds=3.0)
                campaign.export_sets(specs, root / "artifacts")
                campaign.run_campaign(
                    fleet, specs, store, artifacts_dir=root / "artifacts", timeout=300, progress=lambda e: None
                )
                print(f"profiled {len(specs)} cells in {time.perf_counter() - start:.0f} s")
                base = _run("fedavg", fleet, store, root, args)
                fluid = _run("fluid", fleet, store, root, args, sizes=list(SIZES))
                fluid_figures(store, fluid.run_id, base.run_id, base, fluid)
                feddrop_budgets(store, fleet, args)
        finally:
            emulate.down(fleet, say=lambda line: None)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
