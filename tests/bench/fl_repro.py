"""Issue 6's reproduction: FedRolex, HeteroFL and Federated Dropout under two data heterogeneities.

Run from the repository root: ``python -m tests.bench.fl_repro [--rounds R] [--clients N]
[--seeds 0,1] [--json]``.

In the spirit of FedRolex Table 3 (scaled down to MNIST 5k and the FjORD FEMNIST CNN, so that it
finishes in about ten minutes on 2 cores): clients hold capacities spread uniformly over the
FedRolex levels 1, 1/2, 1/4, 1/8, 1/16 (``--capacities uniform:1,0.5,0.25,0.125,0.0625``) and
train sub-models extracted by rolling windows (FedRolex), static prefixes (HeteroFL) or random
draws redrawn every round (Federated Dropout, ``fd``, width = each client's capacity). Two
bounds bracket them: every client at the smallest capacity 1/16 (homogeneous-smallest:
``heterofl`` with capacities ``0.0625``, i.e. FedAvg of the 1/16 model) and every client at
full capacity (homogeneous-largest: ``heterofl`` with capacities ``1``, i.e. FedAvg). Data
heterogeneity: high = each client holds two labels (``--partition labels:2``), low = IID.

Printed: the final global test accuracy per method and heterogeneity (the full-width global
model; the 1/16 model for homogeneous-smallest), per seed and the mean. Every run is an
ordinary logged FL run; the store (a temporary file unless ``--db``) holds the per-round log.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from exporters.zoo import get_model
from fl.data import load_federated
from fl.server import RunConfig, run_fl
from harness.store import ProfileStore

LEVELS = "uniform:1,0.5,0.25,0.125,0.0625"

#: Row label -> (strategy, capacity spec, width whose global accuracy is reported).
METHODS: dict[str, tuple[str, str, float]] = {
    "homogeneous-smallest (1/16)": ("heterofl", "0.0625", 0.0625),
    "FedRolex": ("fedrolex", LEVELS, 1.0),
    "HeteroFL": ("heterofl", LEVELS, 1.0),
    "Federated Dropout": ("fd", LEVELS, 1.0),
    "homogeneous-largest (1)": ("heterofl", "1", 1.0),
}

#: Column label -> partition spec.
HETEROGENEITY = {"high (labels:2)": "labels:2", "low (iid)": "iid"}


def main(argv: list[str] | None = None) -> int:
    """Run every method under both heterogeneities and print the accuracy table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=30, help="rounds per run (default 30)")
    parser.add_argument("--clients", type=int, default=10, help="clients, all train every round (default 10)")
    parser.add_argument("--seeds", default="0,1", help="comma-separated run seeds (default 0,1)")
    parser.add_argument("--epochs", type=int, default=1, help="local epochs (default 1)")
    parser.add_argument("--lr", type=float, default=0.05, help="local SGD learning rate (default 0.05)")
    parser.add_argument("--batch", type=int, default=20, help="local batch size (default 20)")
    parser.add_argument("--model", default="fjord-cnn", help="zoo model (default fjord-cnn)")
    parser.add_argument("--db", default=None, help="profile store to log the runs in (default: a temporary file)")
    parser.add_argument("--json", action="store_true", help="also print the results as one JSON document")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    seeds = [int(s) for s in args.seeds.split(",")]
    model = get_model(args.model)
    print(
        f"MNIST 5k, {args.model}, {args.clients} clients (all per round), {args.rounds} rounds, "
        f"{args.epochs} local epoch(s), batch {args.batch}, lr {args.lr}, seeds {seeds}",
        file=sys.stderr,
    )
    results: dict[str, dict[str, list[float]]] = {m: {h: [] for h in HETEROGENEITY} for m in METHODS}
    with tempfile.TemporaryDirectory() as tmp:
        db = args.db or str(Path(tmp) / "fl_repro.db")
        with ProfileStore(db) as store:
            for column, partition in HETEROGENEITY.items():
                for seed in seeds:
                    data = load_federated("mnist5k", model, args.clients, partition, seed)
                    for row, (strategy, capacities, width) in METHODS.items():
                        config = RunConfig(
                            strategy=strategy,
                            model=args.model,
                            dataset="mnist5k",
                            clients=args.clients,
                            rounds=args.rounds,
                            capacities=capacities,
                            partition=partition,
                            seed=seed,
                            epochs=args.epochs,
                            batch_size=args.batch,
                            lr=args.lr,
                            eval_every=args.rounds,
                            db=db,
                        )
                        start = time.perf_counter()
                        summary = run_fl(config, store=store, data=data, progress=None)
                        accuracy = summary.accuracy[width]
                        results[row][column].append(accuracy)
                        print(
                            f"{column:<16} seed {seed} {row:<28} accuracy {accuracy:.4f} "
                            f"(run {summary.run_id}, {time.perf_counter() - start:.1f} s)",
                            file=sys.stderr,
                            flush=True,
                        )
    print_table(results, seeds)
    if args.json:
        print(json.dumps({"seeds": seeds, "rounds": args.rounds, "clients": args.clients, "accuracy": results}))
    return 0


def print_table(results: dict[str, dict[str, list[float]]], seeds: list[int]) -> None:
    """Print final global accuracy (%) per method and heterogeneity: mean, then per seed."""
    columns = list(HETEROGENEITY)
    print(f"\nFinal global test accuracy (%), seeds {seeds}; per seed in brackets")
    print(f"{'method':<28} " + " ".join(f"{c:>28}" for c in columns))
    for row, by_column in results.items():
        cells = []
        for column in columns:
            values = by_column[column]
            per_seed = ", ".join(f"{100 * v:.1f}" for v in values)
            cells.append(f"{100 * statistics.mean(values):.1f} [{per_seed}]" if values else "-")
        print(f"{row:<28} " + " ".join(f"{c:>28}" for c in cells))


if __name__ == "__main__":
    sys.exit(main())
