"""Energy per image on the emulated fleet: how much it varies from one campaign to the next.

Run from the repository root: ``python -m tests.bench.energy_bench [--widths ...] [--campaigns N]``.
It starts the example emulated fleet (`devices/fleets/emulated.yaml`: ``fast``, ``mid`` and
``slow`` carry emulated power sensors in the ina3221-hwmon, rapl and power-supply formats; the
phone has none) as ``latency_bench`` does, profiles ``fjord-cnn`` at a few widths (batch 20,
AdamW, +-2 % or ``--max-seconds`` per cell, random batches) in ``--campaigns`` campaigns one
after another, and prints, per cell, the energy per image of every campaign, its coefficient of
variation across them (sample standard deviation / mean) beside the latency's, the host's load
average before and after, and the verdict: every cell's CV at most `TARGET` (5 %).
"""

from __future__ import annotations

import argparse
import math
import os
import tempfile
from pathlib import Path

from devices.emulation import emulate
from devices.emulation.sshd import free_port
from devices.fleetfile import load_fleet
from exporters.arch import parse_widths
from harness.campaign import run_campaign
from harness.cells import plan_cells
from harness.progress import print_progress
from harness.store import ProfileStore
from tests.bench.harness_bench import cv
from tests.devices.conftest import copy_example_fleet

MODEL = "fjord-cnn"
WIDTHS = "0.25,0.5,1"
CAMPAIGNS = 3
#: Most coefficient of variation of a cell's energy per image across the campaigns.
TARGET = 0.05


def report(runs: list[dict[tuple[str, float], tuple[float, float, bool]]], devices: list[str]) -> bool:
    """Print the per-cell table; True when every cell with energy varies at most `TARGET`."""
    keys = sorted({key for run in runs for key in run})
    heads = " ".join(f"{f'mJ #{i + 1}':>9}" for i in range(len(runs)))
    print(f"\n{'device':<7} {'width':>6} {heads} {'CV mJ':>7} {'CV us':>7}  sensor")
    ok = True
    for key in keys:
        values = [run.get(key) for run in runs]
        joules = [v[0] for v in values if v is not None and math.isfinite(v[0])]
        latency = [v[1] for v in values if v is not None and math.isfinite(v[1])]
        emulated = any(v is not None and v[2] for v in values)
        if not joules:
            continue
        spread = cv(joules)
        fine = len(joules) == len(runs) and spread <= TARGET
        ok &= fine
        shown = [f"{1e3 * v[0]:.3f}" if v is not None and math.isfinite(v[0]) else "-" for v in values]
        cells = " ".join(f"{text:>9}" for text in shown)
        print(
            f"{key[0]:<7} {key[1]:>6g} {cells} {spread:>7.1%} {cv(latency):>7.1%}  "
            f"{'emulated' if emulated else 'device'}{'' if fine else '  > 5 %'}"
        )
    without = [d for d in devices if not any(k[0] == d for k in keys if any(k in run for run in runs))]
    if without:
        print(f"no energy measured on: {', '.join(without)}")
    print(f"every cell's energy per image within CV {TARGET:.0%} across {len(runs)} campaigns: {ok}")
    return ok


def main(argv: list[str] | None = None) -> int:
    """Profile ``fjord-cnn`` on the emulated fleet several times and print the CV of energy per image.

    Parameters
    ----------
    argv : list of str, optional

    Returns
    -------
    int
        0 when every cell was measured in every campaign and its energy per image varied
        at most `TARGET`.
    """
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--widths", default=WIDTHS)
    parser.add_argument("--campaigns", type=int, default=CAMPAIGNS)
    parser.add_argument("--devices", default="fast,mid,slow", help="devices of the example fleet (comma-separated)")
    parser.add_argument("--max-seconds", type=float, default=10.0)
    args = parser.parse_args(argv)
    widths = parse_widths(args.widths)
    wanted = [d.strip() for d in args.devices.split(",") if d.strip()]
    os.environ["ANDROID_ADB_SERVER_PORT"] = str(free_port())
    runs: list[dict[tuple[str, float], tuple[float, float, bool]]] = []
    complete = True
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        fleet = load_fleet(copy_example_fleet(root))
        fleet = type(fleet)(fleet.path, tuple(d for d in fleet.devices if d.name in wanted), fleet.state_dir)
        try:
            if not emulate.up(fleet, say=lambda line: None).ok:
                raise SystemExit("the emulated fleet did not start")
            load_before = os.getloadavg()
            with ProfileStore(root / "energy.db") as store:
                specs = plan_cells(fleet, MODEL, widths, [20], ["ort"], 6, 20, max_seconds=args.max_seconds)
                for number in range(args.campaigns):
                    print(f"campaign {number + 1} of {args.campaigns}", flush=True)
                    result = run_campaign(
                        fleet, specs, store, artifacts_dir=root / "artifacts", timeout=600, progress=print_progress
                    )
                    complete &= result.complete
                    cells = store.latest_cells(result.campaign_id)
                    runs.append(
                        {
                            (str(row["device"]), float(row["width"])): (
                                float(row["energy_j_per_image"]), float(row["median_us"]),
                                bool(row["energy_emulated"]) if row["energy_emulated"] is not None else False,
                            )
                            for row in cells.to_dict("records")
                            if row["status"] == "ok"
                        }
                    )  # fmt: skip
            load_after = os.getloadavg()
        finally:
            emulate.down(fleet, say=lambda line: None)
    print(f"\nload average before: {' '.join(f'{v:.2f}' for v in load_before)}; "
          f"after: {' '.join(f'{v:.2f}' for v in load_after)} (on {os.cpu_count()} cpus)")  # fmt: skip
    ok = report(runs, wanted)
    return 0 if ok and complete else 1


if __name__ == "__main__":
    from devices.processes import terminate_as_interrupt

    with terminate_as_interrupt():  # kill: stop the fleet it started, as Ctrl-C does
        raise SystemExit(main())
