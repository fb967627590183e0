"""The ``fleetbench`` command line: thin glue over the packages.

Every command validates its input first; bad input is one line on stderr and
exit status 2, never a traceback.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from devices.errors import FleetFileError
from exporters.errors import InputError

#: Exit status for bad input (unknown model, bad width, unwritable directory, ...).
EXIT_USAGE = 2


class _Parser(argparse.ArgumentParser):
    """An argument parser whose errors are one line and exit status 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        """Print one line naming the program and exit with status 2."""
        raise InputError(f"{self.prog}: {message}")


def parse_widths(text: str) -> tuple[float, ...]:
    """Parse ``"0.25,0.5,1"`` into widths, each in (0, 1].

    Parameters
    ----------
    text : str
        Comma-separated widths.

    Returns
    -------
    tuple of float
        The widths in the order given, duplicates removed.

    Raises
    ------
    InputError
        If an item is not a number or lies outside (0, 1].
    """
    widths: list[float] = []
    for item in text.split(","):
        try:
            value = float(item)
        except ValueError:
            raise InputError(f"width {item.strip()!r} is not a number") from None
        if not 0.0 < value <= 1.0:
            raise InputError(f"width {value:g} is outside (0, 1]")
        if value not in widths:
            widths.append(value)
    return tuple(widths)


def _int_at_least(text: str, minimum: int, bound: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < minimum:
        raise argparse.ArgumentTypeError(f"{value} must be {bound}")
    return value


def positive_int(text: str) -> int:
    """Parse a strictly positive integer (argparse type)."""
    return _int_at_least(text, 1, "at least 1")


def non_negative_int(text: str) -> int:
    """Parse an integer of 0 or more (argparse type)."""
    return _int_at_least(text, 0, "0 or more")


def _cmd_models(args: argparse.Namespace) -> int:
    from exporters.flops import count
    from exporters.zoo import DEFAULT_WIDTHS, get_model, model_names

    rows = []
    for name in model_names():
        model = get_model(name)
        for width in sorted(set(DEFAULT_WIDTHS) | set(model.paper_widths)):
            counts = count(model, model.arch(width))
            rows.append(
                {
                    "model": name,
                    "width": width,
                    "params": counts.params,
                    "macs": counts.macs,
                    "flops": counts.flops,
                    "train_flops": counts.train_flops,
                }
            )
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    print(f"{'model':<20} {'width':>6} {'params':>12} {'MACs':>14} {'FLOPs':>14} {'train FLOPs':>14}")
    for row in rows:
        print(
            f"{row['model']:<20} {row['width']:>6.2f} {row['params']:>12,} {row['macs']:>14,} "
            f"{row['flops']:>14,} {row['train_flops']:>14,}"
        )
    print("Counts are per example; train FLOPs = forward + backward (see exporters/flops.py).")
    return 0


def _cmd_export(args: argparse.Namespace) -> int:
    from exporters.artifacts import check_writable, export_artifacts
    from exporters.flops import count
    from exporters.zoo import get_model

    model = get_model(args.model)
    widths = parse_widths(args.widths)
    out_dir = Path(args.out)
    check_writable(out_dir)
    rows = []
    for i, width in enumerate(widths, 1):
        arch = model.arch(width)
        print(f"[{i}/{len(widths)}] {model.name} width {width:.2f} {arch.widths} ...", file=sys.stderr, flush=True)
        start = time.perf_counter()
        result = export_artifacts(model, arch, batch=args.batch, optimizer=args.optimizer, out_dir=out_dir)
        seconds = time.perf_counter() - start
        counts = count(model, arch)
        rows.append((width, arch, counts, result, seconds))
    print(f"{model.name}: batch {args.batch}, optimizer {args.optimizer}, artifacts under {out_dir}")
    header = f"{'width':>6} {'layer widths':<24} {'params':>11} {'MACs':>13} {'train FLOPs':>14} {'export':>10}"
    print(f"{header}  directory")
    for width, arch, counts, result, seconds in rows:
        status = "cached" if result.cached else f"{seconds:.2f} s"
        layer_widths = ",".join(str(w) for w in arch.widths)
        print(
            f"{width:>6.2f} {layer_widths:<24} {counts.params:>11,} {counts.macs:>13,} "
            f"{counts.train_flops:>14,} {status:>10}  {result.directory}"
        )
    if all(row[3].cached for row in rows):
        print("Nothing changed: every artifact set was already in the cache; nothing was written.")
    return 0


def build_parser() -> argparse.ArgumentParser:
    """Return the ``fleetbench`` argument parser with every subcommand."""
    from exporters.zoo import DEFAULT_MODEL, DEFAULT_WIDTHS

    parser = _Parser(prog="fleetbench", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    models = commands.add_parser("models", help="list the model zoo with parameters, MACs and FLOPs per width")
    models.add_argument("--json", action="store_true", help="print one JSON document")
    models.set_defaults(handler=_cmd_models)

    export = commands.add_parser("export", help="export ONNX Runtime training artifacts per width")
    export.add_argument("--model", default=DEFAULT_MODEL, help=f"zoo model (default {DEFAULT_MODEL})")
    export.add_argument(
        "--widths",
        default=",".join(f"{w:g}" for w in DEFAULT_WIDTHS),
        help="comma-separated widths in (0, 1] (default %(default)s)",
    )
    export.add_argument("--batch", type=positive_int, default=20, help="training batch size (default 20)")
    export.add_argument("--optimizer", choices=("adamw", "sgd"), default="adamw")
    export.add_argument("--out", default="artifacts", help="artifact root directory (default ./artifacts)")
    export.set_defaults(handler=_cmd_export)

    from devices.cli import register as register_fleet

    register_fleet(commands)
    _register_harness(commands)
    from fl.cli import register as register_fl
    from fl.demo import register as register_demo
    from reports.cli import register as register_report

    register_demo(commands)
    register_fl(commands)
    register_report(commands)
    return parser


def _lazy(module: str, name: str) -> Callable[[argparse.Namespace], int]:
    """Return a handler that imports ``module`` only when the command runs."""

    def run(args: argparse.Namespace) -> int:
        import importlib

        handler: Callable[[argparse.Namespace], int] = getattr(importlib.import_module(module), name)
        return handler(args)

    return run


def _register_harness(commands: argparse._SubParsersAction) -> None:
    """Add ``profile`` and ``profiles export``; extend ``fleet`` with ``provision`` and ``up --match``."""
    from exporters.zoo import DEFAULT_MODEL, DEFAULT_WIDTHS

    profile = commands.add_parser("profile", help="measure training latency and memory per device and width")
    profile.add_argument("--fleet", required=True, help="fleet YAML file")
    profile.add_argument("--model", default=DEFAULT_MODEL, help=f"zoo model (default {DEFAULT_MODEL})")
    profile.add_argument("--widths", default=",".join(f"{w:g}" for w in DEFAULT_WIDTHS), help="widths in (0, 1]")
    profile.add_argument("--batch", default="20", help="batch sizes, comma-separated (default 20)")
    profile.add_argument("--backend", default="ort", help="ort, torch, or both comma-separated (default ort)")
    profile.add_argument("--steps", type=positive_int, default=10, help="timed steps per cell (default 10)")
    profile.add_argument("--warmup", type=positive_int, default=3, help="warm-up steps per cell (default 3)")
    profile.add_argument("--timeout", type=float, default=300.0, help="seconds per cell (default 300)")
    profile.add_argument("--db", default="fleetbench.db", help="profile store (default fleetbench.db)")
    profile.add_argument("--artifacts", default="artifacts", help="artifact cache directory (default ./artifacts)")
    profile.add_argument("--resume", action="store_true", help="measure only cells the store does not have yet")
    profile.set_defaults(handler=_lazy("harness.campaign", "cmd_profile"))

    profiles = commands.add_parser("profiles", help="stored profiles")
    actions = profiles.add_subparsers(dest="profiles_command", required=True, parser_class=_Parser)
    export = actions.add_parser("export", help="write one row per cell as CSV or Parquet")
    export.add_argument("--db", default="fleetbench.db", help="profile store (default fleetbench.db)")
    export.add_argument("--format", choices=("csv", "parquet"), default="csv")
    export.add_argument("--out", default=None, help="output file (default: stdout for csv)")
    export.set_defaults(handler=_lazy("harness.store", "cmd_export"))

    fleet_actions = next(
        action for action in commands.choices["fleet"]._actions if isinstance(action, argparse._SubParsersAction)
    )
    provision = fleet_actions.add_parser("provision", help="report and install the backends each device can run")
    provision.add_argument("file", help="fleet YAML file")
    provision.add_argument("--wheel", action="append", default=[], help="a wheel file to install where missing")
    provision.set_defaults(handler=_lazy("harness.provision", "cmd_provision"))
    up = fleet_actions.choices["up"]
    up.add_argument("--match", metavar="DEVICE", help="calibrate CPU shares to replay a stored device's profile")
    up.add_argument("--db", default="fleetbench.db", help="profile store for --match (default fleetbench.db)")


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``fleetbench`` command line and return its exit status."""
    try:
        args = build_parser().parse_args(argv)
        handler: Callable[[argparse.Namespace], int] = args.handler
        if getattr(args, "match", None):
            handler = _lazy("harness.calibrate", "cmd_up_match")
        return handler(args)
    except (InputError, FleetFileError) as exc:
        print(f"fleetbench: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("fleetbench: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # The reader went away (`fleetbench ... | head`): stop quietly, as shell tools do.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    sys.exit(main())
