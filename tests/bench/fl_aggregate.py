"""Benchmark: aggregating many ResNet18 sub-models at mixed widths.

Run from the repository root: ``python -m tests.bench.fl_aggregate [--clients 100]``.
Builds the HeteroFL PreResNet18 (``heterofl-resnet18``, 11.2M parameters), gives
``--clients`` clients the static sub-models at widths 1, 1/2, 1/4, 1/8, 1/16 in turn
(plus ``--rolling`` for FedRolex windows of round 5, which wrap around), times
`fl.maths.aggregate.selective_average` (median of ``--repeats``) and the naive reference
below (one ``numpy.ix_`` scatter per client and tensor, the project's first
implementation) in the same process, checks that both give the same parameters and
prints seconds and the ratio.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Mapping, Sequence

import numpy as np

from exporters.arch import SubModel
from exporters.zoo import ZooModel, get_model
from exporters.zoo.heterofl import HETEROFL_WIDTHS
from fl.client import module_params
from fl.maths.aggregate import full_index, selective_average
from fl.maths.submodels import rolling_submodel


def naive_selective_average(
    model: ZooModel, global_state: Mapping[str, np.ndarray], updates: Sequence[tuple[SubModel, Mapping, float]]
) -> dict[str, np.ndarray]:
    """Per tensor, per client: scatter through ``numpy.ix_`` into float64 sums (the reference)."""
    out = {}
    for name, tensor in global_state.items():
        acc = np.zeros(tensor.shape, dtype=np.float64)
        weight = np.zeros(tensor.shape, dtype=np.float64)
        for submodel, params, w in updates:
            index = full_index(model, submodel, name, tensor.shape)
            acc[index] += w * np.asarray(params[name], dtype=np.float64)
            weight[index] += w
        held = weight > 0
        new = np.array(tensor, dtype=np.float32, copy=True)
        new[held] = (acc[held] / weight[held]).astype(np.float32)
        out[name] = new
    return out


def main(argv: Sequence[str] | None = None) -> None:
    """Time fast and naive aggregation of mixed-width ResNet18 sub-models and print the ratio."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--clients", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--variants", type=int, default=4, help="distinct parameter sets per width")
    parser.add_argument("--rolling", action="store_true", help="FedRolex windows of round 5 instead of prefixes")
    args = parser.parse_args(argv)

    model = get_model("heterofl-resnet18")
    global_state = module_params(model.build())
    rng = np.random.default_rng(0)
    by_width = []
    for width in HETEROFL_WIDTHS:
        sub = rolling_submodel(model, width, 5) if args.rolling else model.static(width)
        base = model.extract(global_state, sub)
        variants = [
            {k: (v + rng.standard_normal(v.shape, dtype=np.float32) * 0.01).astype(np.float32) for k, v in base.items()}
            for _ in range(args.variants)
        ]
        by_width.append((sub, variants))
    updates = []
    for c in range(args.clients):
        sub, variants = by_width[c % len(by_width)]
        updates.append((sub, variants[(c // len(by_width)) % len(variants)], float(10 + c % 7)))
    held = sum(sum(v.size for v in p.values()) for _, p, _ in updates)
    print(f"heterofl-resnet18, {args.clients} clients at widths {HETEROFL_WIDTHS}"
          f"{' (rolling, round 5)' if args.rolling else ''}: {held / 1e6:.0f}M parameters received")

    fast_times = []
    fast = {}
    for _ in range(args.repeats):
        start = time.perf_counter()
        fast = selective_average(model, global_state, updates)
        fast_times.append(time.perf_counter() - start)
    start = time.perf_counter()
    naive = naive_selective_average(model, global_state, updates)
    naive_seconds = time.perf_counter() - start
    diff = max(float(np.max(np.abs(fast[k] - naive[k]))) for k in naive)
    fast_seconds = statistics.median(fast_times)
    print(f"selective_average: {fast_seconds:.3f} s (median of {args.repeats})")
    print(f"naive reference:   {naive_seconds:.3f} s")
    print(f"speed-up: {naive_seconds / fast_seconds:.1f}x; max |fast - naive| = {diff:.2e}")


if __name__ == "__main__":
    main()
