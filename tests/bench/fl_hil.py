"""Profile, plan, train: measured profiles drive FL on the example emulated fleet and on the local fleet.

Run from the repository root: ``python -m tests.bench.fl_hil [--fleet emulated|local|both] [--rounds 4]``.

For each fleet the benchmark types exactly what a user types (``python -m fleetbench ...``):

1. ``fleet up``, and for the emulated fleet ``fleet provision --install`` (its ``fresh`` board);
2. ``fl data`` (the rounds' MNIST examples, so the cells train on FL's data) and ``profile``
   of ``fjord-cnn`` at widths 0.25-1 with SGD, each device on its best backend, and again on
   ``onnx``, the backend FedDrop trains with;
3. per strategy (FedAvg at full width as the reference, FjORD, HeteroFL, FedDrop, FLuID):
   ``plan --json`` and ``fl run --plan``, one client per device;
4. ``fleet down``.

It then reads the store and prints, per fleet and strategy, against the targets:

- client rounds against their predictions: median and worst ``|predicted - measured| /
  measured`` (targets 10 % and 25 %);
- the client rounds within the plan's deadline + 10 % (target: all), for the tiered strategies;
- FedDrop: each device's expected training FLOPs against its planned budget (target <= 1);
- FLuID: the straggler's round against its target from the second calibrated round on
  (target 0.9-1.1);
- the fleet round (per round the slowest client's, median over rounds) against FedAvg's;

and per device and backend the latency model's leave-one-width-out error, the model that plans
unmeasured widths (target: every left-out width within 10 %).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from devices.emulation import emulate
from devices.emulation.sshd import free_port
from fl.runlog import RunLog
from harness.latency_validation import leave_one_out_error
from harness.store import ProfileStore
from reports import tables

MODEL = "fjord-cnn"
WIDTHS = "0.25,0.5,0.75,1"
#: FLuID's widths: a 1/32 grid, fine enough that some width lands the straggler near its target.
FLUID_WIDTHS = [i / 32 for i in range(8, 33)]
STRATEGIES: dict[str, list[str]] = {
    "fedavg": [],
    "fjord": ["--opt", "k=4"],
    "heterofl": [],
    "feddrop": [],
    "fluid": ["--opt", f"widths={json.dumps(FLUID_WIDTHS)}"],
}
TIERED = ("fjord", "heterofl")


def fleetbench(*argv: str, cwd: Path, env: dict[str, str]) -> str:
    """Run one ``fleetbench`` command as a user would; return its stdout (stderr is echoed)."""
    started = time.monotonic()
    run = subprocess.run(
        [sys.executable, "-m", "fleetbench", *argv], cwd=cwd, env=env, capture_output=True, text=True, check=False
    )
    print(f"  $ fleetbench {' '.join(argv)[:140]}  ({time.monotonic() - started:.0f} s, exit {run.returncode})")
    if run.returncode != 0:
        print(run.stdout[-2000:] + run.stderr[-4000:])
        raise SystemExit(f"fleetbench {argv[0]} failed")
    return run.stdout


def run_fleet(kind: str, root: Path, args: argparse.Namespace) -> dict[str, Any]:
    """Profile, plan and train on one fleet; return the plans and run ids per strategy."""
    env = {**os.environ, "ANDROID_ADB_SERVER_PORT": str(free_port()), "PYTHONPATH": str(Path.cwd())}
    directory = root / kind
    fleet_file = (
        emulate.write_example_fleet(directory, free_port)
        if kind == "emulated"
        else emulate.write_local_fleet(directory)
    )
    from devices.fleetfile import load_fleet

    clients = str(len(load_fleet(fleet_file).devices))
    db, artifacts = str(directory / "fleetbench.db"), str(directory / "artifacts")
    common = ["--fleet", str(fleet_file), "--db", db]
    out: dict[str, Any] = {"db": db, "plans": {}, "runs": {}}
    fleetbench("fleet", "up", str(fleet_file), cwd=directory, env=env)
    try:
        if kind == "emulated":
            fleetbench("fleet", "provision", str(fleet_file), "--install", cwd=directory, env=env)
        data = str(directory / "bench-data.npz")
        fleetbench("fl", "data", "--out", data, "--model", MODEL, cwd=directory, env=env)
        profile = [
            "profile", *common, "--model", MODEL, "--widths", WIDTHS, "--batch", "20", "--optimizer", "sgd",
            "--data", data, "--artifacts", artifacts, "--max-seconds", "3",
        ]  # fmt: skip
        fleetbench(*profile, cwd=directory, env=env)
        fleetbench(*profile, "--backend", "onnx", "--no-round-cost", cwd=directory, env=env)
        for strategy, options in STRATEGIES.items():
            backend = ["--backend", "onnx"] if strategy == "feddrop" else []
            plan = fleetbench(
                "plan", *common, "--strategy", strategy, "--clients", clients, *options, *backend, "--json",
                cwd=directory, env=env,
            )  # fmt: skip
            out["plans"][strategy] = json.loads(plan)
            summary = fleetbench(
                "fl", "run", *common, "--strategy", strategy, "--clients", clients, "--rounds", str(args.rounds),
                "--artifacts", artifacts, *options, "--plan", "--json", cwd=directory, env=env,
            )  # fmt: skip
            out["runs"][strategy] = json.loads(summary)["run_id"]
    finally:
        fleetbench("fleet", "down", str(fleet_file), cwd=directory, env=env)
    return out


def fleet_rounds(client_rounds: Any) -> list[float]:
    """Per round, the slowest client's round (download, compute, upload): the fleet's round on real devices.

    Devices that share this host's cpus take turns in a round, so the round's wall time adds
    their turns; real devices train side by side and the round lasts as long as its slowest client.
    """
    ok = client_rounds[client_rounds["status"] == "ok"]
    seconds = ok[["compute_seconds", "download_seconds", "upload_seconds"]].fillna(0).sum(axis=1)
    return [float(v) for v in seconds.groupby(ok["round"]).max()]


def report(kind: str, result: dict[str, Any]) -> None:
    """Print one fleet's figures against the targets."""
    print(f"\n== {kind} fleet ==")
    with ProfileStore(result["db"], create=False) as store:
        log = RunLog(store)
        cells = store.latest_cells()
        frames = {s: (log.rounds(r), log.client_rounds(r)) for s, r in result["runs"].items()}
    fedavg = statistics.median(fleet_rounds(frames["fedavg"][1]))
    header = ("strategy", "pred. median", "worst", "<= deadline+10%", "fleet round s", "vs FedAvg")
    print(f"{header[0]:<9} {header[1]:>12} {header[2]:>6} {header[3]:>15} {header[4]:>13} {header[5]:>9}")
    for strategy, (_, client_rounds) in frames.items():
        median, worst, _ = tables.prediction_errors(client_rounds)
        plan = result["plans"][strategy]
        within = "-"
        if strategy in TIERED and plan["deadline_s"]:
            ok = client_rounds[client_rounds["status"] == "ok"]
            measured = ok[["compute_seconds", "download_seconds", "upload_seconds"]].fillna(0).sum(axis=1)
            within = f"{int((measured <= 1.1 * plan['deadline_s']).sum())}/{len(ok)}"
        fleet = statistics.median(fleet_rounds(client_rounds))
        print(f"{strategy:<9} {median:>12.1%} {worst:>6.1%} {within:>15} {fleet:>13.3f} {fleet / fedavg:>9.2f}")
    feddrop_plan = {d["device"]: d["budget"] for d in result["plans"]["feddrop"]["devices"]}
    spent = tables.fl_feddrop_time_table(frames["feddrop"][1])
    for row in spent.itertuples(index=False):
        budget = feddrop_plan.get(row.device)
        ratio = "-" if not budget else f"{row.expected_flops / budget:.3f}"
        print(f"FedDrop {row.device}: expected FLOPs {row.expected_flops:.3f} of dense, budget {budget}, ratio {ratio}")
    stragglers = tables.fl_straggler_table(*frames["fluid"])
    for row in stragglers.itertuples(index=False):
        print(f"FLuID round {int(row.round) + 1}: {row.device} at size {row.size:g}: {row.over_target:.2f} x target")
    print("latency model, leave one width out (per device, backend: each width's error):")
    for device, loo in sorted(leave_one_out_error(cells[cells["model"] == MODEL]).items()):
        by_backend: dict[str, list[str]] = {}
        for point in loo.points:
            by_backend.setdefault(point.backend, []).append(f"{point.width:g}: {point.relative_error:+.0%}")
        for backend, errors in sorted(by_backend.items()):
            print(f"  {device} {backend}: {', '.join(errors)}")


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; see the module docstring."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fleet", choices=("emulated", "local", "both"), default="both")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--keep", help="keep everything in this directory (default: a temporary one)")
    args = parser.parse_args(argv)
    print(f"uptime before: {os.getloadavg()}")
    kinds = ["emulated", "local"] if args.fleet == "both" else [args.fleet]
    with tempfile.TemporaryDirectory(prefix="fleetbench-hil-") as scratch:
        root = Path(args.keep or scratch).resolve()
        results = {kind: run_fleet(kind, root, args) for kind in kinds}
        for kind, result in results.items():
            report(kind, result)
    print(f"uptime after: {os.getloadavg()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
