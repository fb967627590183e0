"""Plan FL on an energy budget and check it: predicted against measured energy per client round.

Run from the repository root: ``python -m tests.bench.energy_plan_bench [--rounds 3] [--keep DIR]``.

On the example emulated fleet, every device given an emulated power sensor (a ``power:``
block under its ``emulate:`` block: ``rapl`` on the SSH boards, ``power-supply`` on the
phone; docs/fleet-files.md, "Emulated power sensors"), the benchmark types what a user types
(``python -m fleetbench ...``):

1. ``fleet up`` and ``fleet provision --install``;
2. ``fl data`` and ``profile`` of ``fjord-cnn`` at widths 0.25-1 with SGD: the cells carry
   each width's energy per image;
3. per strategy (HeteroFL, FjORD with ``k=4``): ``plan --json`` without a budget, to read each
   device's predicted full-width energy per client round; the budget is the median device's
   (so that some devices must train narrower); ``plan --energy-budget J --json``; and
   ``fl run --plan none --energy-budget J``, one client per device, `EPOCHS` local epochs (the
   plans too);
4. ``fleet down``.

It then reads the run log and prints, per strategy, each client round's predicted and
measured energy (``fl_client_rounds.predicted_energy_j``, ``measured_energy_j``), the median
``|predicted - measured| / measured`` (target <= 10 %), and each client's measured energy per
round against the budget (target: every round <= budget + 10 %).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
from pathlib import Path
from typing import Any

import yaml

from devices.emulation import emulate
from devices.emulation.sshd import free_port
from fl.runlog import RunLog
from harness.store import ProfileStore
from tests.bench.fl_hil import fleetbench

MODEL = "fjord-cnn"
WIDTHS = "0.25,0.5,0.75,1"
STRATEGIES: dict[str, list[str]] = {"heterofl": [], "fjord": ["--opt", "k=4"]}
#: The emulated sensors: a board's RAPL package counter, a phone's battery.
SENSOR = {"ssh": {"format": "rapl", "idle_w": 2.0, "busy_core_w": 3.0}}
PHONE_SENSOR = {"format": "power-supply", "idle_w": 0.8, "busy_core_w": 1.5}
#: Local epochs per client round: a round must last two updates of its device's sensor to be
#: measured (shorter ones are flagged ``sensor-slower-than-cell`` by the runner, not measured).
EPOCHS = 3
#: Targets: median relative error of the predicted energy, and the budget's tolerance.
ERROR_TARGET = 0.10
BUDGET_TOLERANCE = 0.10


def with_sensors(fleet_file: Path) -> Path:
    """Give every emulated device of a fleet file an emulated power sensor; return the file."""
    fleet = yaml.safe_load(fleet_file.read_text())
    for device in fleet["devices"]:
        block = device.get("emulate")
        if isinstance(block, dict):
            block.setdefault("power", dict(SENSOR.get(device.get("kind", ""), PHONE_SENSOR)))
    fleet_file.write_text(yaml.safe_dump(fleet, sort_keys=False))
    return fleet_file


def median_full_width_energy(plan: dict[str, Any]) -> float:
    """Return the median device's predicted energy per client round in a plan made without a budget."""
    joules = [float(d["energy_j"]) for d in plan["devices"] if d.get("energy_j") is not None]
    if not joules:
        raise SystemExit("the profiles hold no energy per image: is every device's power sensor up?")
    return float(statistics.median(joules))


def run_bench(root: Path, rounds: int) -> dict[str, Any]:
    """Profile, plan on a budget and train on the emulated fleet; return the store, budgets and run ids."""
    env = {**os.environ, "ANDROID_ADB_SERVER_PORT": str(free_port()), "PYTHONPATH": str(Path.cwd())}
    fleet_file = with_sensors(emulate.write_example_fleet(root, free_port))
    from devices.fleetfile import load_fleet

    clients = str(len(load_fleet(fleet_file).devices))
    db, artifacts = str(root / "fleetbench.db"), str(root / "artifacts")
    common = ["--fleet", str(fleet_file), "--db", db]
    out: dict[str, Any] = {"db": db, "budgets": {}, "plans": {}, "runs": {}}
    fleetbench("fleet", "up", str(fleet_file), cwd=root, env=env)
    try:
        fleetbench("fleet", "provision", str(fleet_file), "--install", cwd=root, env=env)
        data = str(root / "bench-data.npz")
        fleetbench("fl", "data", "--out", data, "--model", MODEL, cwd=root, env=env)
        fleetbench(
            "profile", *common, "--model", MODEL, "--widths", WIDTHS, "--batch", "20", "--optimizer", "sgd",
            "--data", data, "--artifacts", artifacts, "--max-seconds", "3", cwd=root, env=env,
        )  # fmt: skip
        for strategy, options in STRATEGIES.items():
            plan = ["plan", *common, "--strategy", strategy, "--clients", clients, "--epochs", str(EPOCHS), *options,
                    "--json"]  # fmt: skip
            budget = median_full_width_energy(json.loads(fleetbench(*plan, "--deadline", "none", cwd=root, env=env)))
            out["budgets"][strategy] = budget
            out["plans"][strategy] = json.loads(
                fleetbench(*plan, "--energy-budget", repr(budget), cwd=root, env=env)
            )
            summary = fleetbench(
                "fl", "run", *common, "--strategy", strategy, "--clients", clients, "--rounds", str(rounds),
                "--epochs", str(EPOCHS), "--artifacts", artifacts, *options, "--plan", "none",
                "--energy-budget", repr(budget), "--json", cwd=root, env=env,
            )  # fmt: skip
            out["runs"][strategy] = json.loads(summary)["run_id"]
    finally:
        fleetbench("fleet", "down", str(fleet_file), cwd=root, env=env)
    return out


def report(result: dict[str, Any]) -> bool:
    """Print the figures against the targets; return whether every target was met."""
    met = True
    with ProfileStore(result["db"], create=False) as store:
        log = RunLog(store)
        frames = {s: log.client_rounds(r) for s, r in result["runs"].items()}
    for strategy, rows in frames.items():
        budget = result["budgets"][strategy]
        planned = {d["device"]: d for d in result["plans"][strategy]["devices"]}
        print(f"\n== {strategy}: energy budget {budget:.4g} J per client round ==")
        print(f"{'round':>5} {'client':<7} {'device':<8} {'width':>6} {'predicted J':>12} {'measured J':>11} "
              f"{'error':>7} {'vs budget':>9}")  # fmt: skip
        ok = rows[rows["status"] == "ok"]
        errors, over = [], []
        for row in ok.itertuples(index=False):
            predicted, measured = _number(row.predicted_energy_j), _number(row.measured_energy_j)
            error = "-"
            if predicted is not None and measured is not None and measured > 0:
                errors.append(abs(predicted - measured) / measured)
                error = f"{errors[-1]:.1%}"
            against = "-" if measured is None else f"{measured / budget:.2f}"
            if measured is not None and planned.get(row.device, {}).get("status") == "planned":
                over.append(measured > budget * (1 + BUDGET_TOLERANCE))
            print(
                f"{int(row.round) + 1:>5} {row.cid:<7} {str(row.device):<8} {row.width:>6g} "
                f"{'-' if predicted is None else format(predicted, '.4g'):>12} "
                f"{'-' if measured is None else format(measured, '.4g'):>11} {error:>7} {against:>9}"
            )
        if not errors:
            print("no client round has both a predicted and a measured energy")
            met = False
            continue
        print(f"client rounds measured: {len(errors)} of {len(ok)} (the rest trained for less than two updates "
              "of their sensor, or on a device without one)")  # fmt: skip
        median = statistics.median(errors)
        print(f"median |predicted - measured| / measured: {median:.1%} (target <= {ERROR_TARGET:.0%})")
        print(
            f"planned clients' rounds within budget + {BUDGET_TOLERANCE:.0%}: {len(over) - sum(over)}/{len(over)} "
            "(target: all)"
        )
        for device, plan in planned.items():
            if plan["status"] != "planned":
                print(f"  {device}: {plan['status']} at width {plan['width']}: {'; '.join(plan['notes'])}")
        met = met and median <= ERROR_TARGET and not any(over)
    return met


def _number(value: Any) -> float | None:
    """Return a logged value as a float, None where the log holds none (NULL reads back as NaN in a float column)."""
    return None if value is None or value != value else float(value)


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; see the module docstring."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--keep", help="keep everything in this directory (default: a temporary one)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="fleetbench-energy-") as scratch:
        root = Path(args.keep or scratch).resolve()
        root.mkdir(parents=True, exist_ok=True)
        met = report(run_bench(root, args.rounds))
    print("\nevery target met" if met else "\nsome target missed")
    return 0 if met else 1


if __name__ == "__main__":
    raise SystemExit(main())
