"""Harness overhead: per-step time the runner reports against a bare ORT training loop.

Run from the repository root: ``python -m tests.bench.runner_overhead [--models ...] [--widths ...]``.
Artifacts are exported in a child process (export needs PyTorch); the timing process then
imports only the runner package ``harness.runner`` (stdlib at import) and ONNX Runtime, and alternates, on the
same artifacts, the runner's ``bench`` mode (`harness.runner.modes.run`) with a bare loop of the
same three calls (train step, optimizer step, lazy gradient reset) on the same bound batch.
Each round's ratio is the runner's median step over the bare loop's; the median of the
ratios is printed (target: at most 1.02).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from harness.runner.artifacts import load_manifest, random_batch
from harness.runner.modes import run
from harness.runner.runtimes import import_ort_training

REPO_ROOT = Path(__file__).resolve().parents[2]

EXPORT = """
import json, sys
from pathlib import Path
from exporters.artifacts import export_artifacts
from exporters.zoo import get_model
out, batch, pairs = Path(sys.argv[1]), int(sys.argv[2]), json.loads(sys.argv[3])
dirs = {}
for name, width in pairs:
    model = get_model(name)
    dirs[f"{name}@{width}"] = str(export_artifacts(model, model.arch(width), batch=batch, optimizer="adamw",
                                                  out_dir=out).directory)
print(json.dumps(dirs))
"""


def bare_loop(directory: str, threads: int, warmup: int, steps: int) -> list[float]:
    """Time ``steps`` bare ORT training steps after ``warmup`` on the runner's random batch."""
    ort, api = import_ort_training()
    import numpy as np

    manifest = load_manifest(directory, "ort")
    x, y = random_batch(np, manifest, 0)
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    state = api.CheckpointState.load_checkpoint(f"{directory}/checkpoint")
    module = api.Module(f"{directory}/training_model.onnx", state, session_options=options)
    optimizer = api.Optimizer(f"{directory}/optimizer_model.onnx", module)
    module.train()
    inputs = (ort.OrtValue.ortvalue_from_numpy(x), ort.OrtValue.ortvalue_from_numpy(y))
    seconds = []
    for i in range(warmup + steps):
        start = time.perf_counter()
        module(*inputs)
        optimizer.step()
        module.lazy_reset_grad()
        if i >= warmup:
            seconds.append(time.perf_counter() - start)
    return seconds


def main() -> None:
    """Export, then alternate runner and bare loop per model and width; print the ratios."""
    parser = argparse.ArgumentParser(prog="python -m tests.bench.runner_overhead", description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="fjord-cnn,cfd-cnn,feddrop-lstm")
    parser.add_argument("--widths", default="0.25,1")
    parser.add_argument("--batch", type=int, default=20)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    pairs = [(m, float(w)) for m in args.models.split(",") for w in args.widths.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        done = subprocess.run(
            [sys.executable, "-c", EXPORT, tmp, str(args.batch), json.dumps(pairs)],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            check=True,
        )
        dirs = json.loads(done.stdout.strip().splitlines()[-1])
        print(
            f"== Runner overhead: runner-reported step / bare ORT loop step, same process and artifacts "
            f"(batch {args.batch}, {args.threads} threads, {args.steps} steps, {args.rounds} alternated rounds) =="
        )
        print(f"{'model':<16} {'width':>6} {'runner ms':>10} {'bare ms':>9} {'ratio':>7}  per-round ratios")
        for name, width in pairs:
            directory = dirs[f"{name}@{width}"]
            ratios, runner_ms, bare_ms = [], [], []
            argv = [
                "bench",
                "--artifacts",
                directory,
                "--backend",
                "ort",
                "--warmup",
                str(args.warmup),
                "--steps",
                str(args.steps),
                "--threads",
                str(args.threads),
            ]
            for _ in range(args.rounds):
                doc = run(argv)
                if doc["status"] != "ok":
                    raise SystemExit(f"runner failed on {name} {width}: {doc['error']}")
                r = statistics.median(doc["step_seconds"])
                b = statistics.median(bare_loop(directory, args.threads, args.warmup, args.steps))
                ratios.append(r / b)
                runner_ms.append(r * 1e3)
                bare_ms.append(b * 1e3)
            shown = " ".join(f"{q:.3f}" for q in ratios)
            print(
                f"{name:<16} {width:>6.2f} {statistics.median(runner_ms):>10.3f} {statistics.median(bare_ms):>9.3f} "
                f"{statistics.median(ratios):>7.3f}  {shown}",
                flush=True,
            )


if __name__ == "__main__":
    main()
