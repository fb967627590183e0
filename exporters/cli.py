"""The ``fleetbench models`` and ``fleetbench export`` commands.

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

from exporters.userinput import input_shape, positive_int


def add_model_arguments(parser: argparse.ArgumentParser, default: str | None) -> None:
    """Add ``--model`` and the options of a user's own model to a command.

    Parameters
    ----------
    parser : argparse.ArgumentParser
    default : str or None
        The default model (a zoo name), or ``None`` when the command has its own default.
    """
    where = f" (default {default})" if default else ""
    parser.add_argument(
        "--model", default=default,
        help=f"a zoo model, or your own: FILE.py:FACTORY, MODULE:FACTORY, a registered name{where}",
    )  # fmt: skip
    own = parser.add_argument_group("your own model (--model FILE.py:FACTORY)")
    own.add_argument(
        "--input-shape", type=input_shape, help="one example's shape, e.g. 3,32,32 (default: the factory's input_shape)"
    )
    own.add_argument(
        "--input-dtype", choices=("float32", "int64"), help="input dtype (default: the factory's, else float32)"
    )
    own.add_argument("--num-classes", type=positive_int, help="number of classes (default: the model's logits)")
    own.add_argument(
        "--unsliceable", choices=("refuse", "keep"), default="refuse",
        help="a layer the dependency graph cannot slice: refuse the model (default) or keep it at full width",
    )  # fmt: skip


def settle_model(args: argparse.Namespace) -> None:
    """Resolve a command's ``--model`` to its canonical name, once, before the command runs.

    A zoo name stays as it is. A user's model is loaded, checked and named
    ``factory@digest`` (`exporters.user_model.user_model`); ``args.model`` becomes that
    name, so that everything the command stores names the definition it measured.

    Parameters
    ----------
    args : argparse.Namespace
        Modified in place; commands without the model options are left alone.

    Raises
    ------
    InputError
        If the model cannot be loaded, or the options are given for a zoo model.
    """
    spec = getattr(args, "model", None)
    if spec is None or not hasattr(args, "unsliceable"):
        return
    from exporters.user_model import ModelOptions, is_model_name, is_user_spec, user_model
    from exporters.userinput import InputError
    from exporters.zoo import get_model, model_names

    options = ModelOptions(args.input_shape, args.input_dtype, args.num_classes, args.unsliceable)
    given = options != ModelOptions()
    if spec in model_names():
        if given:
            raise InputError(
                f"--input-shape, --input-dtype, --num-classes and --unsliceable are for your own model, not {spec}"
            )
        return
    if given and is_model_name(spec):
        raise InputError(f"model {spec} was named with its options; give FILE.py:FACTORY to change them")
    model = user_model(spec, options if given else None) if is_user_spec(spec) else get_model(spec)
    args.model = model.name
    print(f"model {model.name}: {model.source}, {len(model.groups)} channel groups", file=sys.stderr)
    for note in model.notes:
        print(f"  {note}", file=sys.stderr)


def register(commands: Any) -> None:
    """Add ``models`` and ``export`` to the ``fleetbench`` subcommands.

    Parameters
    ----------
    commands : argparse._SubParsersAction
        The subparsers of the ``fleetbench`` parser.
    """
    from exporters.arch import DEFAULT_MODEL, DEFAULT_WIDTHS

    models = commands.add_parser("models", help="list the model zoo with parameters, MACs and FLOPs per width")
    add_model_arguments(models, None)
    models.add_argument("--widths", help="widths to list (default: 0.25,0.5,0.75,1 and the paper's)")
    models.add_argument("--json", action="store_true", help="print one JSON document")
    models.set_defaults(handler="exporters.cli:cmd_models")

    export = commands.add_parser("export", help="export ONNX Runtime training artifacts per width")
    add_model_arguments(export, DEFAULT_MODEL)
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
        ``model`` (one model, or every zoo model when ``None``), ``widths``, ``json``.

    Returns
    -------
    int
        Exit status 0.
    """
    from exporters.arch import DEFAULT_WIDTHS, parse_widths
    from exporters.flops import count
    from exporters.zoo import get_model, model_names

    chosen = [get_model(name) for name in ([args.model] if args.model else model_names())]
    rows = []
    for model in chosen:
        widths = parse_widths(args.widths) if args.widths else sorted(set(DEFAULT_WIDTHS) | set(model.paper_widths))
        for width in widths:
            counts = count(model, model.arch(width))
            rows.append(
                {
                    "model": model.name,
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
    for model in chosen:
        if model.source:
            print(f"{model.name}: {model.source}")
            print(f"  {len(model.groups)} channel groups: " + ", ".join(f"{g} ({k})" for g, k in model.groups))
            for note in model.notes:
                print(f"  {note}")
    width = max(20, *(len(model.name) for model in chosen))
    print(f"{'model':<{width}} {'width':>6} {'params':>12} {'MACs':>14} {'FLOPs':>14} {'train FLOPs':>14}")
    for row in rows:
        print(
            f"{row['model']:<{width}} {row['width']:>6.2f} {row['params']:>12,} {row['macs']:>14,} "
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
        print(f"[{i}/{len(widths)}] {model.name} width {width:.2f} {arch.sizes} ...", file=sys.stderr, flush=True)
        start = time.perf_counter()
        result = export_artifacts(model, arch, batch=args.batch, optimizer=args.optimizer, out_dir=out_dir)
        seconds = time.perf_counter() - start
        counts = count(model, arch)
        rows.append((width, arch, counts, result, seconds))
    print(f"{model.name}: batch {args.batch}, optimizer {args.optimizer}, artifacts under {out_dir}")
    header = f"{'width':>6} {'layer sizes':<24} {'params':>11} {'MACs':>13} {'train FLOPs':>14} {'export':>10}"
    print(f"{header}  directory")
    for width, arch, counts, result, seconds in rows:
        status = "cached" if result.cached else f"{seconds:.2f} s"
        layer_sizes = ",".join(str(w) for w in arch.sizes)
        print(
            f"{width:>6.2f} {layer_sizes:<24} {counts.params:>11,} {counts.macs:>13,} "
            f"{counts.train_flops:>14,} {status:>10}  {result.directory}"
        )
    if all(row[3].cached for row in rows):
        print("Nothing changed: every artifact set was already in the cache; nothing was written.")
    return 0
