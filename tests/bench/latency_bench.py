"""Latency-model prediction on the emulated fleet: leave-one-width-out error at every width of three models.

Run from the repository root: ``python -m tests.bench.latency_bench [--models ...] [--widths ...]``.
It starts the example emulated fleet (`devices/fleets/emulated.yaml`) as ``harness_bench`` does,
profiles ``fjord-cnn``, ``feddrop-vgg9`` and ``fluid-lstm`` at widths 0.25 / 0.375 / 0.5 / 0.75 / 1
(batch 20, AdamW, +-2 % or ``--max-seconds`` per cell, each model's cells training on its FL
data: MNIST, MNIST, Shakespeare), then, per device and model, refits the
latency model (`harness.latency`) without each width in turn and predicts it. It prints the error
of every width on every device, the model's own uncertainty beside it, and the targets: at most
10 % at every width (the narrowest and the widest are extrapolations). With ``--db`` it reuses a
store that already holds the cells (``--resume`` semantics), so a second look costs no measuring.
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path

from devices.emulation import emulate
from devices.emulation.sshd import free_port
from devices.fleetfile import load_fleet
from exporters.arch import parse_widths
from exporters.zoo import get_model
from fl.data import write_bench_data
from harness.bench_data import bench_data_label
from harness.campaign import run_campaign
from harness.cells import plan_cells
from harness.latency_validation import leave_one_out_error
from harness.progress import print_progress
from harness.store import ProfileStore
from tests.devices.conftest import copy_example_fleet

MODELS = ("fjord-cnn", "feddrop-vgg9", "fluid-lstm")
#: The data each model's cells train on (`fl.data.write_bench_data`), as its FL rounds would.
DATASETS = {"fjord-cnn": "mnist5k", "feddrop-vgg9": "mnist5k", "fluid-lstm": "shakespeare"}
WIDTHS = "0.25,0.375,0.5,0.75,1"
TARGET = 0.10


def report(cells: object) -> bool:
    """Print the leave-one-width-out error table; True when every width is within `TARGET`."""
    reports = leave_one_out_error(cells)
    ok = True
    print(f"\n{'device':<7} {'model':<13} {'width':>6} {'pred us':>9} {'+-std':>7} {'meas us':>9} {'error':>7}")
    worst_by_width: dict[tuple[str, float], float] = {}
    for device, rep in sorted(reports.items()):
        for p in rep.points:
            mark = "" if abs(p.relative_error) <= TARGET else "  > 10 %"
            ok &= not mark
            key = (p.model, p.width)
            worst_by_width[key] = max(worst_by_width.get(key, 0.0), abs(p.relative_error))
            print(
                f"{device:<7} {p.model:<13} {p.width:>6g} {p.predicted_us:>9.0f} {p.predicted_std_us:>7.0f} "
                f"{p.measured_us:>9.0f} {p.relative_error:>+7.1%}{mark}"
            )
    print("\nworst |error| per model and width over the devices:")
    for (model, width), worst in sorted(worst_by_width.items()):
        print(f"  {model:<13} {width:>6g}  {worst:.1%}")
    print(f"every width within {TARGET:.0%}: {ok}")
    return ok


def main(argv: list[str] | None = None) -> int:
    """Profile the models on the emulated fleet and print the prediction error per width.

    Parameters
    ----------
    argv : list of str, optional

    Returns
    -------
    int
        0 when every cell was measured and every width predicted within 10 %.
    """
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--widths", default=WIDTHS)
    parser.add_argument("--devices", default="", help="only these devices of the example fleet (comma-separated)")
    parser.add_argument("--max-seconds", type=float, default=30.0)
    parser.add_argument("--db", default=None, help="keep the store here (reused: measured cells are skipped)")
    args = parser.parse_args(argv)
    widths = parse_widths(args.widths)
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    os.environ["ANDROID_ADB_SERVER_PORT"] = str(free_port())
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        fleet = load_fleet(copy_example_fleet(root))
        if args.devices:
            wanted = {d.strip() for d in args.devices.split(",")}
            fleet = type(fleet)(fleet.path, tuple(d for d in fleet.devices if d.name in wanted), fleet.state_dir)
        db = Path(args.db).resolve() if args.db else root / "latency.db"
        artifacts = db.parent / "artifacts"  # beside a kept store, so a second run exports nothing
        complete = True
        try:
            if not emulate.up(fleet, say=lambda line: None).ok:
                raise SystemExit("the emulated fleet did not start")
            with ProfileStore(db) as store:
                for model in models:
                    data = write_bench_data(DATASETS.get(model, "synthetic"), get_model(model), root / f"{model}.npz")
                    specs = plan_cells(
                        fleet, model, widths, [20], ["ort"], 6, 20, max_seconds=args.max_seconds,
                        data=bench_data_label(data),
                    )  # fmt: skip
                    result = run_campaign(
                        fleet, specs, store, artifacts_dir=artifacts, timeout=600, resume=True,
                        progress=print_progress, data=data,
                    )  # fmt: skip
                    complete &= result.complete
                cells = store.latest_cells()
        finally:
            emulate.down(fleet, say=lambda line: None)
    cells = cells[cells["model"].isin(models) & cells["width"].isin(widths)]
    ok = report(cells)
    return 0 if ok and complete else 1


if __name__ == "__main__":
    from devices.processes import terminate_as_interrupt

    with terminate_as_interrupt():  # kill: stop the fleet it started, as Ctrl-C does
        raise SystemExit(main())
