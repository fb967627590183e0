"""The ``fleetbench models`` and ``fleetbench export`` commands, and the argument types every layer uses.

Like every layer's ``cli`` module, `register` only declares arguments; a command's
handler is named as ``"module:function"`` and imported by `fleetbench.cli` when the
command runs, so building the parser imports no heavy module.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any


def _int_at_least(text: str, minimum: int, bound: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < minimum:
        raise argparse.ArgumentTypeError(f"{value} must be {bound}")
    return value


def positive_int(text: str) -> int:
    """Parse a strictly positive integer (argparse type).

    Parameters
    ----------
    text : str

    Returns
    -------
    int

    Raises
    ------
    argparse.ArgumentTypeError
        If ``text`` is not an integer of at least 1.
    """
    return _int_at_least(text, 1, "at least 1")


def non_negative_int(text: str) -> int:
    """Parse an integer of 0 or more (argparse type).

    Parameters
    ----------
    text : str

    Returns
    -------
    int

    Raises
    ------
    argparse.ArgumentTypeError
        If ``text`` is not an integer of at least 0.
    """
    return _int_at_least(text, 0, "0 or more")


def positive_float(text: str) -> float:
    """Parse a finite number greater than 0 (argparse type).

    Parameters
    ----------
    text : str

    Returns
    -------
    float

    Raises
    ------
    argparse.ArgumentTypeError
        If ``text`` is not a finite positive number.
    """
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0.0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"{text} must be a positive number")
    return value


def register(commands: Any) -> None:
    """Add ``models`` and ``export`` to the ``fleetbench`` subcommands.

    Parameters
    ----------
    commands : argparse._SubParsersAction
        The subparsers of the ``fleetbench`` parser.
    """
    from exporters.arch import DEFAULT_MODEL, DEFAULT_WIDTHS

    models = commands.add_parser("models", help="list the model zoo with parameters, MACs and FLOPs per width")
    models.add_argument("--json", action="store_true", help="print one JSON document")
    models.set_defaults(handler="exporters.cli:cmd_models")

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
    export.set_defaults(handler="exporters.cli:cmd_export")


def cmd_models(args: argparse.Namespace) -> int:
    """Run ``fleetbench models``: parameters, MACs and FLOPs per model and width.

    Parameters
    ----------
    args : argparse.Namespace
        ``json``.

    Returns
    -------
    int
        Exit status 0.
    """
    from exporters.arch import DEFAULT_WIDTHS
    from exporters.flops import count
    from exporters.zoo import get_model, model_names

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


def cmd_export(args: argparse.Namespace) -> int:
    """Run ``fleetbench export``: one artifact set per width, cached by key.

    Parameters
    ----------
    args : argparse.Namespace
        ``model``, ``widths``, ``batch``, ``optimizer``, ``out``.

    Returns
    -------
    int
        Exit status 0.
    """
    from exporters.arch import parse_widths
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
