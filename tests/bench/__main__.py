"""Benchmarks: export time per model, and the training time of every backend per width.

Run from the repository root: ``python -m tests.bench [--models a,b] [--widths ...]``
(or ``tox -e bench``). Training time is measured for the ORT training build (``ort``),
the portable step model on the same ONNX Runtime (``onnx``, through the runner's own
backend), the portable step model on the newest ``onnxruntime`` (``onnx-latest``, from an
environment of its own: `tests.bench.ort_latest`) and PyTorch eager (``torch``), each in a
process of its own, the processes alternated (ort, onnx, onnx-latest, torch, ort, ...); each
ratio is taken round by round, then its median reported: timing two runtimes in one process is
wrong because their thread pools contend. Next to the times it prints each backend's achieved
GFLOP/s (`exporters.flops`) and its share of the host's float32 matmul rate (measured before and
after the rounds, in a process of its own, at the backends' thread count, the higher reading
taken: `tests.bench.matmul_rate`), and each
process's peak memory split into the runtime's baseline and the model's share. Per model, the
targets of `tests.bench.training_targets` are checked.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import numpy as np

from exporters import flops
from exporters.arch import DEFAULT_WIDTHS
from exporters.artifacts import export_artifacts
from exporters.step_model import write_step_model
from exporters.zoo import get_model, model_names
from tests.bench import ort_latest
from tests.bench.matmul_rate import thread_environment
from tests.bench.training_targets import (
    BEST,
    MATMUL_SHARE_WIDTH,
    ONNX_FORMS,
    ModelResult,
    WorkerRun,
    gflops,
    memory_mib,
    parse_worker_output,
    ratio_pairs,
    round_ratio,
    verdict_line,
    verdicts,
    with_best,
)

REPO_ROOT = Path(__file__).resolve().parents[2]

#: Backends of the training-time benchmark, in the order their processes alternate.
BACKENDS = ("ort", "onnx", "onnx-latest", "torch")

#: Seconds of the matmul-rate probe (`tests.bench.matmul_rate`).
MATMUL_SECONDS = 1.0


def bench_export(models: list[str], widths: tuple[float, ...], batch: int) -> None:
    """Print cold and cached export time of all ``widths`` per model, and the step model's share."""
    print(f"\n== Export time, all of {widths} per model, batch {batch}, AdamW ==")
    print(f"{'model':<20} {'cold s':>8} {'cached s':>9} {'cold/cached':>12} {'step model s':>13} {'share':>6}")
    for name in models:
        model = get_model(name)
        with tempfile.TemporaryDirectory() as tmp:
            times = []
            for _ in range(2):
                start = time.perf_counter()
                results = [
                    export_artifacts(model, model.arch(w), batch=batch, optimizer="adamw", out_dir=Path(tmp))
                    for w in widths
                ]
                times.append(time.perf_counter() - start)
            assert all(r.cached for r in results), "second export was not served from the cache"
            step = sum(_step_model_seconds(r.directory, Path(tmp)) for r in results)
        share = step / times[0]
        print(
            f"{name:<20} {times[0]:>8.2f} {times[1]:>9.3f} {times[0] / times[1]:>11.0f}x {step:>13.2f} {share:>6.1%}",
            flush=True,
        )


def _step_model_seconds(directory: Path, scratch: Path) -> float:
    """Time the export's step-model stage again (lowering, checks, writing) on a copy of its inputs."""
    import shutil

    from exporters.manifest import OPTIMIZER_MODEL, TRAINING_MODEL, read_manifest
    from exporters.step_model import initial_flat

    work = Path(tempfile.mkdtemp(dir=scratch))
    for name in (TRAINING_MODEL, OPTIMIZER_MODEL):
        shutil.copy(directory / name, work / name)
    flat = np.load(directory / "initial_parameters.npy")
    params = read_manifest(directory)["parameters"]
    initial = {p["name"]: flat[p["offset"] : p["offset"] + p["size"]].reshape(p["shape"]) for p in params}
    start = time.perf_counter()
    write_step_model(work, params, initial)
    seconds = time.perf_counter() - start
    assert np.array_equal(np.load(work / "initial_parameters.npy"), initial_flat(params, initial))
    shutil.rmtree(work)
    return seconds


def run_worker(
    backend: str,
    name: str,
    width: float,
    artifact_dir: Path,
    data_dir: Path,
    args: argparse.Namespace,
    python: str = sys.executable,
) -> WorkerRun:
    """Run one timing process (``python -m tests.bench.worker``, at ``--threads`` threads) and return its result."""
    argv = [
        python,
        "-m",
        "tests.bench.worker",
        backend,
        name,
        str(width),
        str(artifact_dir),
        str(data_dir),
        str(args.steps),
        str(args.warmup),
        str(args.threads),
    ]
    env = {**os.environ, **thread_environment(args.threads)}
    done = subprocess.run(argv, cwd=REPO_ROOT, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{backend} worker failed for {name} at {width}: {done.stderr.strip()[-2000:]}")
    return parse_worker_output(done.stdout)


def measure_matmul_rate(threads: int) -> tuple[float, int]:
    """Measure the host's float32 matmul rate at ``threads`` threads in a process of its own.

    Returns
    -------
    gflops : float
    size : int
        The matrix size of the best rate.
    """
    argv = [sys.executable, "-m", "tests.bench.matmul_rate", str(threads), str(MATMUL_SECONDS)]
    env = {**os.environ, **thread_environment(threads)}
    done = subprocess.run(argv, cwd=REPO_ROOT, env=env, capture_output=True, text=True, check=True)
    document = json.loads(done.stdout.strip().splitlines()[-1])
    return float(document["gflops"]), int(document["size"])


def training_runtime_version() -> str:
    """Return the version of this environment's onnxruntime (the training build, else the plain package)."""
    for dist in ("onnxruntime-training", "onnxruntime"):
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            return importlib.metadata.version(dist)
    return "not installed"


@contextlib.contextmanager
def prepared(name: str, width: float, batch: int, artifact_root: Path) -> Iterator[tuple[Path, Path]]:
    """Export (or reuse) one width's artifacts and save a batch; yield both directories."""
    model = get_model(name)
    result = export_artifacts(model, model.arch(width), batch=batch, optimizer="adamw", out_dir=artifact_root)
    with tempfile.TemporaryDirectory() as data_dir:
        x, y = model.example_batch(batch, seed=0)
        np.save(Path(data_dir) / "x.npy", x.numpy(), allow_pickle=False)
        np.save(Path(data_dir) / "y.npy", y.numpy(), allow_pickle=False)
        yield result.directory, Path(data_dir)


def step_flops(name: str, width: float, batch: int) -> tuple[int, bool]:
    """Return the FLOPs of one AdamW training step over ``batch`` examples, and whether the model convolves.

    Returns
    -------
    flops : int
        ``train_flops * batch`` plus the optimizer's FLOPs (`exporters.flops`).
    convolutional : bool
        Whether the model has a convolution layer.
    """
    model = get_model(name)
    counts = flops.count(model, model.arch(width))
    total = counts.train_flops * batch + flops.optimizer_flops(counts.params, "adamw")
    return total, any(layer.kind == "conv" for layer in counts.layers)


def _cell(value: float | None, spec: str, width: int) -> str:
    return f"{'-':>{width}}" if value is None else f"{value:>{width}{spec}}"


def _width(label: str) -> int:
    """Return a column's width for its ``label`` (values need 8 characters)."""
    return max(len(label), 8)


def measure_width(
    name: str, width: float, python_of: dict[str, str], args: argparse.Namespace, artifact_root: Path
) -> dict[str, list[WorkerRun]]:
    """Run ``args.pairs`` rounds of alternated processes, one per backend of ``python_of``; return them per backend."""
    runs: dict[str, list[WorkerRun]] = {b: [] for b in python_of}
    with prepared(name, width, args.batch, artifact_root) as (artifact_dir, data_dir):
        for _ in range(args.pairs):  # alternated: ort, onnx, onnx-latest, torch, ort, ...
            for backend, python in python_of.items():
                worker = "onnx" if backend == "onnx-latest" else backend
                runs[backend].append(run_worker(worker, name, width, artifact_dir, data_dir, args, python))
    return runs


def backend_pythons(backends: tuple[str, ...], version: str | None) -> tuple[dict[str, str], str]:
    """Return the interpreter of every backend, in ``backends``' order, and onnx-latest's onnxruntime version.

    ``onnx-latest`` runs from `tests.bench.ort_latest`'s environment (made or updated here, holding
    ``version`` or the newest release); the others from this interpreter.
    """
    python_of = {b: sys.executable for b in backends}
    latest = "not measured"
    if "onnx-latest" in backends:
        try:
            python, latest = ort_latest.ensure(version)
        except ort_latest.EnvironmentFailure as exc:
            raise SystemExit(f"onnx-latest: {exc}") from None
        python_of["onnx-latest"] = str(python)
    return python_of, latest


def bench_training(models: list[str], widths: tuple[float, ...], args: argparse.Namespace, artifact_root: Path) -> None:
    """Print per-image training time of every backend, their ratios, rates and memory per model and width."""
    backends = tuple(b for b in BACKENDS if b in args.backends.split(","))
    python_of, latest = backend_pythons(backends, args.ort_latest)
    matmul, size = measure_matmul_rate(args.threads)
    print(
        f"\n== Training step, per image, batch {args.batch}, AdamW, {args.threads} threads, median of {args.steps} "
        f"steps after {args.warmup} warm-up, {args.pairs} rounds of alternated processes ({', '.join(backends)}) =="
    )
    print(f"onnxruntime {training_runtime_version()} (ort, onnx) | onnxruntime {latest} (onnx-latest)")
    print(f"host matmul rate before the rounds: {matmul:.1f} GFLOP/s (float32, {size}x{size}, {args.threads} threads)")
    pairs = ratio_pairs(backends)
    labels = [f"{a}/{b}" for a, b in pairs]
    rate_columns = [*backends, BEST] if set(ONNX_FORMS) & set(backends) else list(backends)
    head = " ".join(f"{b + ' us':>{_width(b + ' us')}}" for b in backends)
    head += " " + " ".join(f"{label:>{_width(label)}}" for label in labels)
    print(f"{'model':<20} {'width':>6} {head}   {labels[0] + ' by round' if labels else ''}")
    results: list[ModelResult] = []
    rate_rows: list[tuple[str, float, int, dict[str, float]]] = []
    memory_rows: list[str] = []
    full_width_rates: dict[str, float] = {}
    for name in models:
        per_width: dict[tuple[str, str], list[float]] = {pair: [] for pair in pairs}
        convolutional = False
        for width in widths:
            work, convolutional = step_flops(name, width, args.batch)
            runs = measure_width(name, width, python_of, args, artifact_root)
            rounds = with_best({b: [r.step_seconds for r in v] for b, v in runs.items()})
            ratios = {pair: round_ratio(rounds, pair) for pair in pairs}
            for pair, values in ratios.items():
                per_width[pair].append(statistics.median(values))
            rate = {b: gflops(work, statistics.median(v)) for b, v in rounds.items()}
            if BEST in rate and width == MATMUL_SHARE_WIDTH:
                full_width_rates[name] = rate[BEST]
            cells = " ".join(
                f"{statistics.median(rounds[b]) / args.batch * 1e6:>{_width(b + ' us')}.1f}" for b in backends
            )
            cells += " " + " ".join(
                f"{statistics.median(v):>{_width(label) - 1}.2f}x"
                for label, v in zip(labels, ratios.values(), strict=True)
            )
            shown = " ".join(f"{r:.2f}" for r in ratios[pairs[0]]) if pairs else ""
            print(f"{name:<20} {width:>6.2f} {cells}   {shown}", flush=True)
            rate_rows.append((name, width, work, rate))
            mib_cells = " ".join(
                f"{_cell(base, '.0f', _width(b + ' base'))} {_cell(share, '.1f', 8)}"
                for b, (base, share) in ((b, memory_mib(runs[b])) for b in backends)
            )
            memory_rows.append(f"{name:<20} {width:>6.2f} {mib_cells}")
        ratio_medians = {pair: statistics.median(v) for pair, v in per_width.items() if v}
        results.append(ModelResult(name, convolutional, ratio_medians, None))
    # A busy host only ever slows the probe down: the higher of the two readings is the limit.
    after, size_after = measure_matmul_rate(args.threads)
    print(f"\nhost matmul rate after the rounds: {after:.1f} GFLOP/s ({size_after}x{size_after})")
    matmul = max(matmul, after)
    results = [
        replace(r, full_width_share=full_width_rates[r.name] / matmul) if r.name in full_width_rates else r
        for r in results
    ]
    print(f"\n== Achieved training GFLOP/s per backend and its share of the matmul rate ({matmul:.1f} GFLOP/s) ==")
    print(f"{'model':<20} {'width':>6} {'MFLOP/img':>10} " + " ".join(f"{b:>{_width(b) + 6}}" for b in rate_columns))
    for name, width, work, rate in rate_rows:
        rate_cells = " ".join(f"{rate[b]:>{_width(b) + 1}.2f} {rate[b] / matmul:>4.0%}" for b in rate_columns)
        print(f"{name:<20} {width:>6.2f} {work / args.batch / 1e6:>10.2f} {rate_cells}")
    print(
        "\n== Peak resident memory per process, MiB: the runtime's baseline (runtime, numpy, batch loaded) "
        "and the model's share (peak - baseline) =="
    )
    print(
        f"{'model':<20} {'width':>6} "
        + " ".join(f"{b + ' base':>{_width(b + ' base')}} {'+model':>8}" for b in backends)
    )
    print("\n".join(memory_rows))
    print(
        "\n== Targets per model (ratios: median over widths; share@1: the best ONNX form's share of the matmul rate "
        "at width 1) =="
    )
    print(f"{'model':<20} " + " ".join(f"{label:>{_width(label)}}" for label in labels) + f" {'share@1':>8}  verdict")
    for result in results:
        ratio_cells = " ".join(
            f"{result.ratios[p]:>{_width(label) - 1}.2f}x" for p, label in zip(pairs, labels, strict=True)
        )
        share = _cell(result.full_width_share, ".0%", 8)
        print(f"{result.name:<20} {ratio_cells} {share}  {verdict_line(verdicts(result))}")


def read_trace_events(directory: Path) -> list[dict]:
    """Return every event of the ORT profiler traces (JSON arrays) in ``directory``."""
    events: list[dict] = []
    for path in sorted(directory.glob("ort*.json")):
        events.extend(e for e in json.loads(path.read_text()) if isinstance(e, dict))
    return events


def kernel_time_by_op(events: list[dict]) -> dict[str, float]:
    """Sum the kernel microseconds of profiler events per ONNX op type."""
    totals: dict[str, float] = {}
    for event in events:
        if event.get("cat") == "Node" and str(event.get("name", "")).endswith("_kernel_time"):
            op = event.get("args", {}).get("op_name", "?")
            totals[op] = totals.get(op, 0.0) + float(event.get("dur", 0))
    return totals


def bench_profile(models: list[str], widths: tuple[float, ...], args: argparse.Namespace, artifact_root: Path) -> None:
    """Print where each runtime's training step spends its time, per operator kind, side by side.

    ``onnx`` (the portable step model) is read from ONNX Runtime's profiler (kernel time per
    node), ``ort`` likewise, and ``torch`` from PyTorch's profiler (self CPU time per operator);
    `tests.bench.op_kinds` maps both to common kinds. Times are per step, under the profilers
    (so they compare kinds, not whole steps: use ``--only training`` for those).
    """
    from tests.bench.op_kinds import KINDS, by_kind, onnx_kind, torch_kind
    from tests.bench.worker import TORCH_PROFILE

    backends = [b for b in ("onnx", "ort", "torch") if b in args.backends.split(",")]
    print(
        f"\n== Where the training step's time goes: ms per step by operator kind (profilers; batch {args.batch}, "
        f"{args.threads} threads, {args.steps} steps after {args.warmup} warm-up) =="
    )
    print(f"{'model':<20} {'width':>5} {'backend':<7} " + " ".join(f"{k:>11}" for k in KINDS) + f" {'total':>9}")
    for name in models:
        for width in widths:
            with prepared(name, width, args.batch, artifact_root) as (artifact_dir, data_dir):
                rows = {}
                for backend in backends:
                    for stale in (*data_dir.glob("ort*.json"), data_dir / TORCH_PROFILE):
                        stale.unlink(missing_ok=True)
                    run_worker(f"{backend}-profile", name, width, artifact_dir, data_dir, args)
                    if backend == "torch":
                        totals = json.loads((data_dir / TORCH_PROFILE).read_text())
                        rows[backend] = {k: v / args.steps for k, v in by_kind(totals, torch_kind).items()}
                    else:  # ORT traces every step, warm-up included
                        totals = kernel_time_by_op(read_trace_events(data_dir))
                        per_step = args.steps + args.warmup
                        rows[backend] = {k: v / per_step for k, v in by_kind(totals, onnx_kind).items()}
            for backend, row in rows.items():
                cells = " ".join(f"{row[k] / 1e3:>11.2f}" for k in KINDS)
                print(f"{name:<20} {width:>5.2f} {backend:<7} {cells} {sum(row.values()) / 1e3:>9.2f}", flush=True)


def bench_knobs(models: list[str], widths: tuple[float, ...], args: argparse.Namespace, artifact_root: Path) -> None:
    """Print a backend's training step time under each ORT session variant, relative to the default."""
    from tests.bench.worker import ORT_VARIANTS

    print(
        f"\n== {args.knob_backend} session variants: median step time relative to the default (batch {args.batch}, "
        f"{args.pairs} rounds, variants alternated within a round) =="
    )
    print(f"{'model':<20} {'width':>6} {'default ms':>11}  " + " ".join(f"{v:>13}" for v in ORT_VARIANTS[1:]))
    for name in models:
        for width in widths:
            with prepared(name, width, args.batch, artifact_root) as (artifact_dir, data_dir):
                medians: dict[str, list[float]] = {v: [] for v in ORT_VARIANTS}
                for _ in range(args.pairs):
                    for variant in ORT_VARIANTS:
                        run = run_worker(f"{args.knob_backend}:{variant}", name, width, artifact_dir, data_dir, args)
                        medians[variant].append(run.step_seconds)
            base = statistics.median(medians["default"])
            shown = " ".join(f"{statistics.median(medians[v]) / base:>12.2f}x" for v in ORT_VARIANTS[1:])
            print(f"{name:<20} {width:>6.2f} {base * 1e3:>11.2f}  {shown}", flush=True)


def bench_fusion(models: list[str], widths: tuple[float, ...], args: argparse.Namespace, artifact_root: Path) -> None:
    """Print the training step with and without `exporters.export_forms.fuse_gradient_sums`, same weights."""
    from unittest import mock

    backends = [b for b in ("ort", "onnx") if b in args.backends.split(",")]
    print(
        f"\n== Recurrent weight gradients: one stacked product (fused) vs a product per time step and their Sum "
        f"(unfused), per image, batch {args.batch}, {args.threads} threads, {args.pairs} rounds of alternated "
        "processes =="
    )
    head = " ".join(f"{b + ' fused us':>15} {b + ' unfused/fused':>19}" for b in backends)
    print(f"{'model':<20} {'width':>6} {head}")
    for name in models:
        model = get_model(name)
        for width in widths:
            with prepared(name, width, args.batch, artifact_root) as (fused_dir, data_dir):
                with mock.patch("exporters.artifacts.fuse_gradient_sums", lambda graph: 0):
                    unfused = export_artifacts(
                        model, model.arch(width), batch=args.batch, optimizer="adamw", out_dir=artifact_root / "unfused"
                    )
                medians: dict[tuple[str, str], list[float]] = {}
                for _ in range(args.pairs):
                    for backend in backends:
                        for form, directory in (("fused", fused_dir), ("unfused", unfused.directory)):
                            run = run_worker(backend, name, width, directory, data_dir, args)
                            medians.setdefault((backend, form), []).append(run.step_seconds)
            cells = []
            for backend in backends:
                fused, slow = medians[(backend, "fused")], medians[(backend, "unfused")]
                ratio = statistics.median([u / f for u, f in zip(slow, fused, strict=True)])
                cells.append(f"{statistics.median(fused) / args.batch * 1e6:>15.1f} {ratio:>18.2f}x")
            print(f"{name:<20} {width:>6.2f} " + " ".join(cells), flush=True)


def main() -> None:
    """Parse arguments and run the selected benchmarks."""
    parser = argparse.ArgumentParser(prog="python -m tests.bench", description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(model_names()), help="comma-separated zoo models (default: all)")
    parser.add_argument("--widths", default=",".join(f"{w:g}" for w in DEFAULT_WIDTHS))
    parser.add_argument("--batch", type=int, default=20)
    parser.add_argument("--steps", type=int, default=10, help="timed steps per process")
    parser.add_argument("--warmup", type=int, default=3, help="warm-up steps per process (never timed)")
    parser.add_argument("--pairs", type=int, default=5, help="rounds of alternated backend processes")
    parser.add_argument("--backends", default=",".join(BACKENDS), help="backends of the training benchmark")
    parser.add_argument("--knob-backend", default="ort", choices=("ort", "onnx"), help="backend of --only knobs")
    parser.add_argument(
        "--ort-latest",
        default=None,
        metavar="VERSION",
        help="onnxruntime of the onnx-latest backend (default: the newest)",
    )
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--only",
        choices=("export", "training", "profile", "knobs", "fusion"),
        help="run one benchmark only (profile, knobs and fusion run only when named)",
    )
    parser.add_argument("--artifacts", default=None, help="artifact cache directory (default: a temporary one)")
    args = parser.parse_args()
    models = [m for m in args.models.split(",") if m]
    widths = tuple(float(w) for w in args.widths.split(","))
    print(f"fleetbench benchmarks on {sys.platform}, python {sys.version.split()[0]}")
    if args.only in (None, "export"):
        bench_export(models, widths, args.batch)
    with tempfile.TemporaryDirectory() as tmp:
        if args.only in (None, "training"):
            bench_training(models, widths, args, Path(args.artifacts or tmp))
        if args.only == "profile":
            bench_profile(models, widths, args, Path(args.artifacts or tmp))
        if args.only == "knobs":
            bench_knobs(models, widths, args, Path(args.artifacts or tmp))
        if args.only == "fusion":
            bench_fusion(models, widths, args, Path(args.artifacts or tmp))


if __name__ == "__main__":
    main()
