"""Campaign benchmarks on the emulated fleet: wall time (cold / warm cache) and repeatability.

Run from the repository root: ``python -m tests.bench.harness_bench [--widths ...] [--repeats 5]``.
It copies ``devices/fleets/emulated.yaml`` (3 SSH devices and the phone) onto free loopback
ports with a private state directory and a private adb server, starts it, and prints:

- the wall time of the device x width campaign with a cold deployment cache (fresh device
  work directories; artifacts exported beforehand and timed apart) and again with a warm one
  (every set already on the devices: 0 bytes pushed);
- repeatability: the coefficient of variation of one cell's median and mean per-image
  latency over ``--repeats`` campaigns on an idle emulated device (target at most 5 %).
  On an emulated device the CPU quota is enforced per CFS period, so single steps are
  bimodal (throttled or not) while the mean over a cell's steps averages the periods out.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

from devices import emulate
from devices.fleetfile import load_fleet
from devices.sshd import free_port
from exporters.arch import parse_widths
from harness import campaign
from harness.stats import summarize
from harness.store import ProfileStore
from tests.devices.conftest import copy_example_fleet


def main(argv: list[str] | None = None) -> int:
    """Run the campaign benchmarks and print their figures.

    Parameters
    ----------
    argv : list of str, optional
        Command-line arguments (default ``sys.argv[1:]``).

    Returns
    -------
    int
        0 when every campaign measured every cell.
    """
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="fjord-cnn")
    parser.add_argument("--widths", default="0.25,0.5,0.75,1")
    parser.add_argument("--batch", type=int, default=20)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    widths = parse_widths(args.widths)
    os.environ["ANDROID_ADB_SERVER_PORT"] = str(free_port())  # never touch a user's adb server
    ok = True
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        fleet = load_fleet(copy_example_fleet(root))
        artifacts = root / "artifacts"
        try:
            if not emulate.up(fleet, say=lambda line: None).ok:
                raise SystemExit("the emulated fleet did not start")
            specs = campaign.plan_cells(fleet, args.model, widths, [args.batch], ["ort"], args.steps, args.warmup)
            start = time.perf_counter()
            campaign.export_sets(specs, artifacts)
            export_s = time.perf_counter() - start
            print(f"\n== Campaign wall time: {len(fleet.devices)} devices x {len(widths)} widths ({len(specs)} cells)")
            print(f"export (host, once): {export_s:.1f} s")
            with ProfileStore(root / "bench.db") as store:
                for label in ("cold cache", "warm cache"):
                    start = time.perf_counter()
                    result = campaign.run_campaign(
                        fleet, specs, store, artifacts_dir=artifacts, timeout=300, progress=lambda e: None
                    )
                    seconds = time.perf_counter() - start
                    pushed = sum(d.pushed_bytes for per in result.deploys.values() for d in per)
                    ok &= result.complete
                    print(f"{label}: {seconds:.1f} s, {pushed:,} bytes pushed, complete={result.complete}")

                device = fleet.devices[0]
                width = widths[len(widths) // 2]
                cell = campaign.plan_cells(
                    [device], args.model, [width], [args.batch], ["ort"], args.steps, args.warmup
                )
                medians, means, cvs = [], [], []
                for _ in range(args.repeats):
                    result = campaign.run_campaign(
                        fleet, cell, store, artifacts_dir=artifacts, timeout=300, progress=lambda e: None
                    )
                    m = result.measurements[0]
                    ok &= m.ok
                    if m.ok:
                        stats = summarize(m.step_seconds, args.batch)
                        medians.append(stats.median_us)
                        means.append(stats.mean_us)
                        cvs.append(stats.cv)
            if len(medians) >= 2:
                print(f"\n== Repeatability: {device.name}, width {width:g}, {args.repeats} campaigns")
                for label, values in (("median", medians), ("mean", means)):
                    cv = statistics.stdev(values) / statistics.mean(values)
                    print(f"{label} us/img per campaign: {', '.join(f'{v:.0f}' for v in values)}; "
                          f"CV across campaigns {cv:.1%} (target <= 5 %)")
                print(f"within-cell CV (median over campaigns): {statistics.median(cvs):.1%}")
        finally:
            emulate.down(fleet, say=lambda line: None)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
