"""Benchmarks: export time per model, and ORT against PyTorch training time per width.

Run from the repository root: ``python -m tests.bench [--models a,b] [--widths ...]``
(or ``tox -e bench``). Training time is measured with each backend in a process of its
own, the processes alternated (ORT, PyTorch, ORT, PyTorch, ...), and the ORT/PyTorch ratio
taken pair by pair, then its median reported: timing both runtimes in one process is wrong
because their thread pools contend.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from exporters.arch import DEFAULT_WIDTHS
from exporters.artifacts import export_artifacts
from exporters.zoo import get_model, model_names

REPO_ROOT = Path(__file__).resolve().parents[2]


def bench_export(models: list[str], widths: tuple[float, ...], batch: int) -> None:
    """Print cold and cached export time of all ``widths`` per model."""
    print(f"\n== Export time, all of {widths} per model, batch {batch}, AdamW ==")
    print(f"{'model':<20} {'cold s':>8} {'cached s':>9} {'cold/cached':>12}")
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
        print(f"{name:<20} {times[0]:>8.2f} {times[1]:>9.3f} {times[0] / times[1]:>11.0f}x", flush=True)


def run_worker(
    backend: str, name: str, width: float, artifact_dir: Path, data_dir: Path, args: argparse.Namespace
) -> list[float]:
    """Run one timing process and return its per-step seconds."""
    argv = [
        sys.executable,
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
    done = subprocess.run(argv, cwd=REPO_ROOT, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{backend} worker failed for {name} at {width}: {done.stderr.strip()[-2000:]}")
    return list(json.loads(done.stdout.strip().splitlines()[-1])["seconds"])


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


def bench_training(models: list[str], widths: tuple[float, ...], args: argparse.Namespace, artifact_root: Path) -> None:
    """Print per-image training time of ORT and PyTorch and their ratio per model and width."""
    print(
        f"\n== Training step, per image, batch {args.batch}, AdamW, {args.threads} threads, "
        f"median of {args.steps} steps after {args.warmup} warm-up, {args.pairs} alternated process pairs =="
    )
    print(f"{'model':<20} {'width':>6} {'ORT us':>10} {'PyTorch us':>11} {'ORT/PyTorch':>12} {'pair ratios':>30}")
    for name in models:
        for width in widths:
            with prepared(name, width, args.batch, artifact_root) as (artifact_dir, data_dir):
                ort_medians, torch_medians = [], []
                for _ in range(args.pairs):  # alternated: ORT, PyTorch, ORT, PyTorch, ...
                    for backend, medians in (("ort", ort_medians), ("torch", torch_medians)):
                        seconds = run_worker(backend, name, width, artifact_dir, data_dir, args)
                        medians.append(statistics.median(seconds))
            ratios = [o / t for o, t in zip(ort_medians, torch_medians, strict=True)]
            ort_us = statistics.median(ort_medians) / args.batch * 1e6
            torch_us = statistics.median(torch_medians) / args.batch * 1e6
            shown = " ".join(f"{r:.2f}" for r in ratios)
            ratio = statistics.median(ratios)
            print(f"{name:<20} {width:>6.2f} {ort_us:>10.1f} {torch_us:>11.1f} {ratio:>11.2f}x {shown:>30}", flush=True)


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
    """Print where ORT's training step spends its kernel time, per model and width."""
    print(f"\n== Where ORT's training time goes (kernel time share per op type, batch {args.batch}) ==")
    for name in models:
        for width in widths:
            with prepared(name, width, args.batch, artifact_root) as (artifact_dir, data_dir):
                run_worker("ort-profile", name, width, artifact_dir, data_dir, args)
                totals = kernel_time_by_op(read_trace_events(data_dir))
            whole = sum(totals.values()) or 1.0
            top = sorted(totals.items(), key=lambda item: -item[1])[:6]
            shares = ", ".join(f"{op} {100 * us / whole:.0f}%" for op, us in top)
            print(f"{name:<20} {width:>5.2f}  {shares}", flush=True)


def bench_knobs(models: list[str], widths: tuple[float, ...], args: argparse.Namespace, artifact_root: Path) -> None:
    """Print ORT's training step time under each session variant, relative to the default."""
    from tests.bench.worker import ORT_VARIANTS

    print(
        f"\n== ORT session variants: median step time relative to the default (batch {args.batch}, "
        f"{args.pairs} rounds, variants alternated within a round) =="
    )
    print(f"{'model':<20} {'width':>6} {'default ms':>11}  " + " ".join(f"{v:>13}" for v in ORT_VARIANTS[1:]))
    for name in models:
        for width in widths:
            with prepared(name, width, args.batch, artifact_root) as (artifact_dir, data_dir):
                medians: dict[str, list[float]] = {v: [] for v in ORT_VARIANTS}
                for _ in range(args.pairs):
                    for variant in ORT_VARIANTS:
                        seconds = run_worker(f"ort:{variant}", name, width, artifact_dir, data_dir, args)
                        medians[variant].append(statistics.median(seconds))
            base = statistics.median(medians["default"])
            shown = " ".join(f"{statistics.median(medians[v]) / base:>12.2f}x" for v in ORT_VARIANTS[1:])
            print(f"{name:<20} {width:>6.2f} {base * 1e3:>11.2f}  {shown}", flush=True)


def main() -> None:
    """Parse arguments and run the selected benchmarks."""
    parser = argparse.ArgumentParser(prog="python -m tests.bench", description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(model_names()), help="comma-separated zoo models (default: all)")
    parser.add_argument("--widths", default=",".join(f"{w:g}" for w in DEFAULT_WIDTHS))
    parser.add_argument("--batch", type=int, default=20)
    parser.add_argument("--steps", type=int, default=10, help="timed steps per process")
    parser.add_argument("--warmup", type=int, default=3, help="warm-up steps per process (never timed)")
    parser.add_argument("--pairs", type=int, default=5, help="alternated ORT / PyTorch process pairs")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--only",
        choices=("export", "training", "profile", "knobs"),
        help="run one benchmark only (profile and knobs run only when named)",
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


if __name__ == "__main__":
    main()
