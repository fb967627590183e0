"""Benchmark: building Coded-FD masks for one layer (Gold, constant-weight, random).

Run from the repository root: ``python -m tests.bench.fl_codes [--size 2048] [--width 0.5] [--clients 35]``.
For a layer of ``--size`` units kept at ``--width`` (the paper's dense layer: 2048 units,
width 0.5, 35 clients per round), times in one process (median of ``--repeats``):

* the Gold code matrix (`fl.maths.codes.gold_code_matrix`) and the constant-weight code
  (`fl.maths.codes.constant_weight_code`), built once per run;
* the per-round step a strategy repeats (`fl.maths.codes.assign_rows`: shuffle rows and
  columns, one row per client);
* the naive peer: an independent random mask per client (`fl.maths.codes.random_rows`),
  what random-per-client Federated Dropout draws every round.

It prints seconds, the ratio of each construction to the random peer, and the quality
of the masks the clients get: the smallest Hamming distance between two clients' masks
(larger is more orthogonal) and the largest overlap.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable, Sequence
from typing import TypeVar

import numpy as np

from exporters.arch import size_at_width
from fl.maths.codes import assign_rows, constant_weight_code, gold_code_matrix, min_pairwise_distance, random_rows

T = TypeVar("T")


def timed(fn: Callable[[], T], repeats: int) -> tuple[float, T]:
    """Return the median seconds of ``repeats`` calls and the last result."""
    times = []
    for _ in range(max(1, repeats)):
        start = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), out


def main(argv: Sequence[str] | None = None) -> None:
    """Time Gold, constant-weight and random mask generation for one layer and print ratios."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--size", type=int, default=2048)
    parser.add_argument("--width", type=float, default=0.5)
    parser.add_argument("--clients", type=int, default=35)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    size, clients = args.size, args.clients
    weight = size_at_width(args.width, size)
    print(f"layer {size} units, weight {weight} (width {args.width}), {clients} clients, seed {args.seed}")

    t_random, rand = timed(lambda: random_rows(size, weight, clients, np.random.default_rng(args.seed)), args.repeats)
    t_gold, gold = timed(
        lambda: gold_code_matrix(size, weight, clients, np.random.default_rng(args.seed)), args.repeats
    )
    t_cwc, cwc = timed(
        lambda: constant_weight_code(size, weight, clients, np.random.default_rng(args.seed)), args.repeats
    )
    t_assign, gold_round = timed(
        lambda: assign_rows(gold.rows, clients, np.random.default_rng((args.seed, 1))),
        args.repeats,
    )
    cwc_round = assign_rows(cwc.rows, clients, np.random.default_rng((args.seed, 1)))

    print(f"{'masks':<34} {'seconds':>10} {'x random':>9} {'min dist':>9} {'max overlap':>12}")
    rows: list[tuple[str, float, np.ndarray]] = [
        ("random per client (peer)", t_random, np.asarray(rand)),
        (f"Gold build (degree {gold.degree}, {len(gold.rows)} rows)", t_gold, gold_round),
        (f"constant-weight build ({len(cwc.rows)} rows)", t_cwc, cwc_round),
        ("per-round shuffle+assign (Gold)", t_assign, gold_round),
    ]
    for name, seconds, masks in rows:
        dist = min_pairwise_distance(masks)
        overlap = weight - dist // 2
        print(f"{name:<34} {seconds:>10.4f} {seconds / t_random:>9.1f} {dist:>9d} {overlap:>12d}")
    print(f"constant-weight code: greedy minimum distance {cwc.min_distance}")


if __name__ == "__main__":
    main()
