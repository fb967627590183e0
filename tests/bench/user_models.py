"""Users' own models through the whole journey: groups, counts, export, step model, profiles and FjORD.

Run from the repository root: ``python -m tests.bench.user_models [--fleet] [--rounds 5]``.

For each example model of ``docs/examples/models`` (a small CNN, MobileNetV2 x0.5 and
ResNet18, all through ``--model FILE.py:FACTORY``) it prints:

- the channel groups the dependency graph found;
- parameters and training FLOPs per example at widths 0.25, 0.5, 0.75 and 1;
- the export time of each width's artifact set (ONNX Runtime training artifacts and the
  portable ``step_model.onnx``), and of the zoo's ``fjord-resnet18`` beside ResNet18, the same
  network written by hand, as the peer;
- the step model against the training build after one SGD step from the same parameters and
  batch: the loss's relative difference and the largest parameter difference as a fraction of
  the largest parameter step;
- the global accuracy per width after ``--rounds`` FjORD rounds, and two HeteroFL and FedRolex
  rounds at capacities 1, 0.5 and 0.25, in process (10 clients on scikit-learn's digits, shaped
  for the model);
- with ``--fleet``: per-image training latency per width on the example emulated fleet, typed as
  a user types it (``fleet up``, ``fleet provision --install`` for its fresh board, ``profile``,
  ``plan``, ``fleet down``), ResNet18 at widths 0.25
  and 0.5 only and next to ``fjord-resnet18`` (the ratio of the two, measured in the same
  campaign), and each device's FjORD width as ``plan`` chooses it.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from exporters.artifacts import export_artifacts
from exporters.flops import count
from exporters.ort_training import OrtTrainer
from exporters.zoo import get_model
from tests.exporters.examples import ALL, RESNET18
from tests.exporters.test_step_model import StepRunner

WIDTHS = (0.25, 0.5, 0.75, 1.0)
ROOT = Path(__file__).resolve().parents[2]
FLEET = ROOT / "devices" / "fleets" / "emulated.yaml"


def _fleetbench(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "fleetbench.cli", *args]
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, check=False)


def _step_difference(spec: str, width: float, out: Path) -> tuple[float, float]:
    model = get_model(spec)
    result = export_artifacts(model, model.arch(width), batch=8, optimizer="sgd", out_dir=out)
    trainer = OrtTrainer(result.directory, lr=0.05)
    initial = trainer.get_parameters()
    stepper = StepRunner(result.directory, result.manifest, initial, 0.05)
    x, y = (t.numpy() for t in model.example_batch(8, seed=1))
    step = stepper.step(x, y)
    loss = trainer.train_step(x, y)
    after = trainer.get_parameters()
    largest = max(float(np.abs(after[p] - initial[p]).max()) for p in initial)
    worst = max(float(np.abs(step[p + ".next"] - after[p]).max()) for p in initial)
    return abs(float(step["loss"]) - loss) / abs(loss), worst / largest


def _describe(spec: str, out: Path) -> None:
    model = get_model(spec)
    print(f"\n## {model.name} ({Path(model.source.rpartition(':')[0]).name})")
    print(f"{len(model.groups)} channel groups: " + ", ".join(f"{g} ({k})" for g, k in model.groups))
    for note in model.notes:
        print(f"  {note}")
    print(f"{'width':>6} {'params':>12} {'train FLOPs':>15} {'export s':>9}")
    for width in WIDTHS:
        counts = count(model, model.arch(width))
        start = time.perf_counter()
        export_artifacts(model, model.arch(width), batch=20, optimizer="adamw", out_dir=out)
        seconds = time.perf_counter() - start
        print(f"{width:>6.2f} {counts.params:>12,} {counts.train_flops:>15,} {seconds:>9.1f}")
    if spec == RESNET18:
        peer = get_model("fjord-resnet18")
        for width in WIDTHS:
            start = time.perf_counter()
            export_artifacts(peer, peer.arch(width), batch=20, optimizer="adamw", out_dir=out)
            print(f"  peer fjord-resnet18 width {width:.2f}: export {time.perf_counter() - start:.1f} s")
    for width in (0.5, 1.0):
        loss, params = _step_difference(spec, width, out)
        print(f"step model vs training build at width {width:g}: loss {loss:.1e} relative, "
              f"parameters within {100 * params:.2f} % of the largest step")  # fmt: skip


def _train(spec: str, strategy: str, rounds: int, work: Path) -> None:
    levels = () if strategy == "fjord" else ("--capacities", "uniform:1,0.5,0.25")
    start = time.perf_counter()
    result = _fleetbench(
        "fl", "run", "--strategy", strategy, "--model", spec, "--dataset", "digits", "--clients", "10",
        "--rounds", str(rounds), *levels, "--db", str(work / "fl.db"), "--json", cwd=work,
    )  # fmt: skip
    seconds = time.perf_counter() - start
    if result.returncode:
        print(f"{strategy} in process failed: {result.stderr.strip().splitlines()[-1]}")
        return
    accuracy = json.loads(result.stdout)["accuracy"]
    shown = ", ".join(f"{w}: {a:.3f}" for w, a in accuracy.items())
    print(f"{strategy}, {rounds} rounds in process ({seconds:.0f} s): accuracy per width {shown}")


def _fleet_profiles(work: Path) -> None:
    print("\n## Per-image latency on the emulated fleet")
    subprocess.run(["uptime"], check=False)
    up = _fleetbench("fleet", "up", str(FLEET), cwd=work)
    if up.returncode:
        print(f"fleet up failed: {up.stderr.strip()}")
        return
    try:
        provision = _fleetbench("fleet", "provision", str(FLEET), "--install", cwd=work)  # the fresh board
        if provision.returncode:
            print(f"fleet provision failed: {provision.stderr.strip().splitlines()[-1]}")
        for spec in ALL:
            widths = "0.25,0.5" if spec == RESNET18 else ",".join(f"{w:g}" for w in WIDTHS)
            models = [spec, "fjord-resnet18"] if spec == RESNET18 else [spec]
            for model in models:
                run = _fleetbench(
                    "profile", "--fleet", str(FLEET), "--model", model, "--widths", widths, "--batch", "8",
                    "--max-seconds", "6", "--passes", "2", "--db", str(work / "fleet.db"), cwd=work,
                )  # fmt: skip
                lines = run.stdout.splitlines()
                header = next((i for i, line in enumerate(lines) if line.startswith("device ")), len(lines))
                print(f"\n{model}:")
                print("\n".join(lines[header:]))
                if run.returncode:
                    print(f"profile exited {run.returncode}: {run.stderr.strip().splitlines()[-1]}")
            _plan(spec, work)
        _resnet_ratio(work / "fleet.db")
    finally:
        _fleetbench("fleet", "down", str(FLEET), cwd=work)
        subprocess.run(["uptime"], check=False)


def _plan(spec: str, work: Path) -> None:
    plan = _fleetbench(
        "plan", "--fleet", str(FLEET), "--db", str(work / "fleet.db"), "--model", spec, "--strategy", "fjord",
        "--batch", "8", "--optimizer", "adamw", "--unprofiled", "exclude", "--json", cwd=work,
    )  # fmt: skip
    if plan.returncode:
        print(f"plan failed: {plan.stderr.strip().splitlines()[-1]}")
        return
    document = json.loads(plan.stdout)
    widths = ", ".join(f"{d['device']} {d.get('width')}" for d in document["devices"] if d.get("status") == "planned")
    print(f"FjORD plan: {widths}")


def _resnet_ratio(db: Path) -> None:
    from harness.store import ProfileStore

    with ProfileStore(db) as store:
        cells = store.latest_cells()
    ok = cells[cells["status"] == "ok"]
    mine = ok[ok["model"].str.startswith("resnet18@")].set_index(["device", "width"])["median_us"]
    peer = ok[ok["model"] == "fjord-resnet18"].set_index(["device", "width"])["median_us"]
    both = mine.index.intersection(peer.index)
    print("\nResNet18 through the dependency graph / fjord-resnet18 written by hand, per-image latency:")
    for device, width in sorted(both):
        print(f"  {device:<8} width {width:.2f}: {mine[(device, width)] / peer[(device, width)]:.2f}")


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print its tables."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fleet", action="store_true", help="also profile on the example emulated fleet")
    parser.add_argument("--rounds", type=int, default=5, help="FjORD rounds in process (default 5)")
    args = parser.parse_args(argv)
    subprocess.run(["uptime"], check=False)
    with tempfile.TemporaryDirectory(prefix="fleetbench-user-models-") as tmp:
        work = Path(tmp)
        os.environ.setdefault("FLEETBENCH_MODELS_DIR", str(work / "models"))
        for spec in ALL:
            _describe(spec, work / "artifacts")
            _train(spec, "fjord", args.rounds, work)
            for strategy in ("heterofl", "fedrolex"):
                _train(spec, strategy, 2, work)
        if args.fleet:
            _fleet_profiles(work)
    subprocess.run(["uptime"], check=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
