"""Campaign benchmarks on the emulated fleet: wall time, deployment cache, repeatability, false alarms, monotone curves.

Run from the repository root: ``python -m tests.bench.harness_bench [--only wall,repeat,deploy,monotone]``.
It copies ``devices/fleets/emulated.yaml`` (3 SSH devices and the phone, the slowest pinned to a
cpu of its own) onto free loopback ports with a private state directory and a private adb
server, starts it, and measures the demo's cells (``fjord-cnn`` at widths 0.25 / 0.5 / 0.75 / 1,
batch 20, SGD, +-2 % or 2 s per cell: `fleetbench.demo`) the way ``fleetbench demo`` does:

- ``wall``: the wall time of one campaign of the demo's cells (artifacts exported beforehand
  and timed apart; devices' caches cold), with its isolation plan, per ``--passes`` value;
- ``repeat``: ``--repeats`` campaigns (5) of the same cells; per cell the coefficient of
  variation of its median across campaigns (targets: at most 5 % on every cell, median over
  the cells at most 3 %), how many cells were flagged noisy (target: none) or imprecise, and
  the campaigns' wall times;
  ``--passes 1,4`` alternates campaigns of one and four passes per cell (ABBA order) and
  prints both, measured side by side; ``--passes 4,4:one-turn`` compares devices taking
  turns pass by pass (the default) with each device running all its passes in one turn;
- ``deploy``: a campaign with fresh device work directories (everything pushed) and one
  with warm caches (0 bytes pushed);
- ``monotone``: ``fleetbench demo --local`` (three local devices, measured one at a time),
  then checks that each device's median latency rises with the width.

Timings taken while other work shares the cores are noisy: the bench prints the 1-minute load
average before and after each part, so a figure can be read with its load.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from devices.emulation import emulate
from devices.emulation.sshd import free_port
from devices.fleet import Fleet
from devices.fleetfile import load_fleet
from exporters.arch import DEFAULT_MODEL, parse_widths
from harness.bench_data import bench_data_label
from harness.campaign import run_campaign
from harness.cells import export_sets, plan_cells
from harness.device_run import CampaignResult
from harness.isolation import pinned_cpus, plan_isolation
from harness.passes import DEFAULT_PASSES
from harness.records import BenchSpec
from harness.stats import summarize
from harness.store import ProfileStore
from tests.devices.conftest import copy_example_fleet

PARTS = ("wall", "repeat", "deploy", "monotone")


def load() -> str:
    """The 1-minute load average of this machine, for the figures' context."""
    return f"load {os.getloadavg()[0]:.1f} on {os.cpu_count()} cpus"


def demo_cells(fleet: Fleet, args: argparse.Namespace) -> list[BenchSpec]:
    """The demo's cells (`fleetbench.demo`) at this bench's widths."""
    from fleetbench.demo import DEMO_BATCH

    return plan_cells(
        fleet, args.model, parse_widths(args.widths), [DEMO_BATCH], ["ort"], args.steps, 20, "sgd",
        precision=args.precision, max_seconds=args.max_seconds,
        data=bench_data_label(args.data) if args.data else None,
    )  # fmt: skip


def run(
    fleet: Fleet,
    specs: Sequence[BenchSpec],
    store: ProfileStore,
    artifacts: Path,
    data: Path | None = None,
    variant: str = str(DEFAULT_PASSES),
) -> CampaignResult:
    """One campaign, silent (its cells on ``data``, the demo's bench data, measured as ``variant`` says).

    ``variant`` is a ``--passes`` item: ``K`` passes per cell, devices taking turns pass by
    pass, or ``K:one-turn``, each device running all its passes in one turn.
    """
    count, _, turns = variant.partition(":")
    if turns not in ("", "one-turn"):
        raise SystemExit(f"--passes item {variant!r}: K or K:one-turn")
    return run_campaign(
        fleet, specs, store, artifacts_dir=artifacts, timeout=300, progress=lambda e: None,
        announce=lambda line: None, data=data, passes=int(count), interleave=turns != "one-turn",
    )  # fmt: skip


def wall(fleet: Fleet, store: ProfileStore, artifacts: Path, args: argparse.Namespace) -> bool:
    """Print the wall time of one campaign of the demo's cells per ``--passes`` value, one after the other."""
    specs = demo_cells(fleet, args)
    start = time.perf_counter()
    export_sets(specs, artifacts)
    print(f"export (host, once): {time.perf_counter() - start:.1f} s")
    print("\n".join(plan_isolation(fleet.devices, pinned_cpus(fleet)).describe()))
    ok = True
    for passes in args.passes:
        before = load()
        start = time.perf_counter()
        result = run(fleet, specs, store, artifacts, args.data, passes)
        seconds = time.perf_counter() - start
        imprecise = sum(m.imprecise for m in result.measurements)
        print(f"campaign of {len(specs)} cells, passes {passes}: {seconds:.1f} s, "
              f"complete={result.complete}, {imprecise} imprecise ({before} before, {load()} after)")  # fmt: skip
        ok &= result.complete
    return ok


def repeat(fleet: Fleet, store: ProfileStore, artifacts: Path, args: argparse.Namespace) -> bool:
    """Print per cell the CV of its median across ``--repeats`` campaigns, and the noisy / imprecise flags.

    With several ``--passes`` values, each repeat runs one campaign per value, in ABBA
    order (A B, then B A, ...) so that a drift of the host falls on both alike; each value
    gets its own table. Side by side, from the same campaigns: the CV of the median of every
    sample the runner took, disturbed ones included.
    """
    specs = demo_cells(fleet, args)
    keys = [(p, s.cell_key()) for p in args.passes for s in specs]
    medians: dict[tuple[str, str], list[float]] = {k: [] for k in keys}
    every: dict[tuple[str, str], list[float]] = {k: [] for k in keys}
    flags: dict[tuple[str, str], list[str]] = {k: [] for k in keys}
    noisy = dict.fromkeys(args.passes, 0)
    imprecise = dict.fromkeys(args.passes, 0)
    walls: dict[str, list[float]] = {p: [] for p in args.passes}
    ok = True
    before = load()
    for i in range(args.repeats):
        for passes in args.passes if i % 2 == 0 else args.passes[::-1]:
            start = time.perf_counter()
            result = run(fleet, specs, store, artifacts, args.data, passes)
            walls[passes].append(time.perf_counter() - start)
            ok &= result.complete
            for m in result.measurements:
                if m.ok and m.step_seconds:
                    key = (passes, m.spec.cell_key())
                    stats = summarize(m.step_seconds, m.spec.batch)
                    medians[key].append(stats.median_us)
                    every[key].append(summarize(m.runner.step_seconds, m.spec.batch).median_us)
                    noisy[passes] += stats.noisy
                    imprecise[passes] += m.imprecise
                    flags[key].append(("N" if stats.noisy else "") + ("I" if m.imprecise else "") or "-")
        print(f"repeat {i + 1}/{args.repeats} done ({load()})", flush=True)
    for passes in args.passes:
        print(f"\npasses {passes}")
        print(f"{'device':<8} {'width':>6} {'medians us/img':<44} {'CV':>6}  flags (N noisy, I imprecise)")
        cvs, every_cvs = [], []
        for spec in specs:
            key = (passes, spec.cell_key())
            spread = cv(medians[key])
            cvs.append(spread)
            every_cvs.append(cv(every[key]))
            shown = ", ".join(f"{v:.0f}" for v in medians[key])
            print(f"{spec.device:<8} {spec.width:>6g} {shown:<44} {spread:>6.1%}  {' '.join(flags[key])}")
        print(
            f"passes {passes}: CV of a cell's median across {args.repeats} campaigns: max {max(cvs):.1%} "
            f"(target <= 5 %), median {statistics.median(cvs):.1%} (target <= 3 %); noisy flags {noisy[passes]} "
            f"(target 0), imprecise {imprecise[passes]} of {len(specs) * args.repeats} cells; campaign wall time "
            f"median {statistics.median(walls[passes]):.1f} s ({', '.join(f'{w:.1f}' for w in walls[passes])})"
        )
        print(
            f"passes {passes}, every sample counted (disturbed ones too): CV max {max(every_cvs):.1%}, "
            f"median {statistics.median(every_cvs):.1%}"
        )
    print(f"({before} before, {load()} after)")
    return ok


def cv(values: Sequence[float]) -> float:
    """Return the sample standard deviation over the mean (NaN below two values or a mean of 0)."""
    if len(values) < 2 or not statistics.fmean(values):
        return float("nan")
    return statistics.stdev(values) / statistics.fmean(values)


def deploy(fleet: Fleet, store: ProfileStore, artifacts: Path, args: argparse.Namespace) -> bool:
    """Print a campaign with cold device caches and one with warm caches: bytes pushed and wall time."""
    specs = demo_cells(fleet, args)
    export_sets(specs, artifacts)
    ok = True
    for label in ("cold cache", "warm cache"):
        if label == "cold cache":
            for device in fleet.devices:
                if device.kind == "ssh":
                    shutil.rmtree(device.workdir, ignore_errors=True)
        start = time.perf_counter()
        result = run(fleet, specs, store, artifacts, args.data)
        seconds = time.perf_counter() - start
        pushed = sum(d.pushed_bytes for per in result.deploys.values() for d in per)
        ok &= result.complete
        print(f"{label}: {seconds:.1f} s, {pushed:,} bytes pushed, complete={result.complete} ({load()})")
    return ok


def monotone(args: argparse.Namespace) -> bool:
    """Run ``fleetbench demo --local`` and check every device's latency rises with the width."""
    from fleetbench.cli import main as fleetbench

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "demo"
        before = load()
        start = time.perf_counter()
        rc = fleetbench(["demo", "--local", "--out", str(out), "--rounds", "1", "--examples", "600"])
        seconds = time.perf_counter() - start
        with ProfileStore(out / "fleetbench.db", create=False) as store:
            cells = store.latest_cells()
    print(f"\nfleetbench demo --local: exit {rc}, {seconds:.0f} s ({before} before, {load()} after)")
    ok = rc == 0
    for device, group in cells[cells["status"] == "ok"].groupby("device"):
        curve = group.sort_values("width")
        medians = list(curve["median_us"])
        rising = all(b > a for a, b in zip(medians, medians[1:], strict=False))
        ok &= rising
        shown = ", ".join(f"{w:g}: {m:.0f}" for w, m in zip(curve["width"], medians, strict=True))
        print(f"{device:<6} {shown} us/img -> {'rises' if rising else 'NOT monotone'}")
    return ok


def main(argv: list[str] | None = None) -> int:
    """Run the campaign benchmarks and print their figures.

    Parameters
    ----------
    argv : list of str, optional
        Command-line arguments (default ``sys.argv[1:]``).

    Returns
    -------
    int
        0 when every campaign measured every cell (and the curves rose, for ``monotone``).
    """
    from exporters.zoo import get_model
    from fl.data import write_bench_data
    from fleetbench.demo import DEMO_DATASET, DEMO_MAX_SECONDS, DEMO_WIDTHS
    from harness.runner.protocol import DEFAULT_PRECISION
    from harness.runner.sampling import MIN_SAMPLES

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default=",".join(PARTS), help=f"parts, comma-separated ({', '.join(PARTS)})")
    parser.add_argument("--model", default=DEFAULT_MODEL)
    parser.add_argument("--widths", default=",".join(f"{w:g}" for w in DEMO_WIDTHS))
    parser.add_argument("--steps", type=int, default=MIN_SAMPLES, help="fewest samples per cell")
    parser.add_argument("--precision", type=float, default=DEFAULT_PRECISION)
    parser.add_argument("--max-seconds", type=float, default=DEMO_MAX_SECONDS)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument(
        "--passes", default=str(DEFAULT_PASSES),
        help="passes per cell, comma-separated to compare values side by side (e.g. 1,4); "
        "K:one-turn: each device runs all its passes in one turn instead of taking turns pass by pass",
    )  # fmt: skip
    parser.add_argument("--keep", type=Path, help="copy the bench's store (every campaign's samples) here at the end")
    args = parser.parse_args(argv)
    args.passes = [p.strip() for p in args.passes.split(",") if p.strip()]
    parts = [p.strip() for p in args.only.split(",") if p.strip()]
    unknown = set(parts) - set(PARTS)
    if unknown:
        parser.error(f"unknown part(s) {', '.join(sorted(unknown))}; choose from {', '.join(PARTS)}")
    os.environ["ANDROID_ADB_SERVER_PORT"] = str(free_port())  # never touch a user's adb server
    ok = True
    fleet_parts: dict[str, Callable[[Fleet, ProfileStore, Path, argparse.Namespace], bool]] = {
        "wall": wall, "deploy": deploy, "repeat": repeat,
    }  # fmt: skip
    if any(p in fleet_parts for p in parts):
        with tempfile.TemporaryDirectory() as tmp:
            root = Path(tmp)
            fleet = load_fleet(copy_example_fleet(root))
            # the demo's cells train on the rounds' data
            args.data = write_bench_data(DEMO_DATASET, get_model(args.model), root / "bench-data.npz")
            try:
                if not emulate.up(fleet, say=lambda line: None).ok:
                    raise SystemExit("the emulated fleet did not start")
                with ProfileStore(root / "bench.db") as store:
                    for part in (p for p in PARTS if p in parts and p in fleet_parts):
                        print(f"\n== {part}")
                        ok &= fleet_parts[part](fleet, store, root / "artifacts", args)
            finally:
                emulate.down(fleet, say=lambda line: None)
                if args.keep is not None and (root / "bench.db").exists():
                    shutil.copyfile(root / "bench.db", args.keep)
                    print(f"store kept at {args.keep}")
    if "monotone" in parts:
        print("\n== monotone")
        ok &= monotone(args)
    return 0 if ok else 1


if __name__ == "__main__":
    from devices.processes import terminate_as_interrupt

    with terminate_as_interrupt():  # kill: stop the fleet it started, as Ctrl-C does
        raise SystemExit(main())
