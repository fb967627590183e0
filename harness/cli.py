"""The harness's commands: ``profile``, ``profiles export``, ``fleet provision`` and ``fleet up --match``.

`register` only declares arguments; handlers are named ``"module:function"`` and
imported by `fleetbench.cli` when the command runs.
"""

from __future__ import annotations

import argparse
from typing import Any

from exporters.userinput import positive_float, positive_int


def add_passes_argument(parser: argparse.ArgumentParser) -> None:
    """Add ``--passes`` (`harness.campaign.run_campaign`'s ``passes``) to a command that runs a campaign.

    Parameters
    ----------
    parser : argparse.ArgumentParser
    """
    from harness.passes import DEFAULT_PASSES

    parser.add_argument(
        "--passes",
        type=positive_int,
        default=DEFAULT_PASSES,
        help=f"passes each cell's time is split over, interleaved with the device's other cells and taken in "
        f"turns with the devices that share its cpus, so that a moment the host slows the device does not move "
        f"the whole cell (default {DEFAULT_PASSES}; 1: one run per cell)",
    )


def register(commands: Any) -> None:
    """Add ``profile`` and ``profiles export``; extend ``fleet`` with ``provision`` and ``up --match``.

    Parameters
    ----------
    commands : argparse._SubParsersAction
        The subparsers of the ``fleetbench`` parser, on which ``fleet`` is already registered.
    """
    from exporters.arch import DEFAULT_MODEL, DEFAULT_WIDTHS
    from exporters.cli import add_model_arguments
    from harness.runner.protocol import DEFAULT_MAX_SECONDS, DEFAULT_PRECISION
    from harness.runner.sampling import MIN_SAMPLES

    profile = commands.add_parser("profile", help="measure training latency and memory per device and width")
    profile.add_argument("--fleet", required=True, help="fleet YAML file")
    add_model_arguments(profile, DEFAULT_MODEL)
    profile.add_argument(
        "--widths",
        default=",".join(f"{w:g}" for w in DEFAULT_WIDTHS),
        help="widths in (0, 1], or auto:N to measure the N widths the latency model is least sure of",
    )
    profile.add_argument("--batch", default="20", help="batch sizes, comma-separated (default 20)")
    profile.add_argument(
        "--backend",
        default="auto",
        help="auto (each device's best available: ort > onnx > torch; a runtime bundle runs onnx), or ort, onnx, "
        "torch, comma-separated for every device (default auto)",
    )
    profile.add_argument(
        "--steps", type=positive_int, default=MIN_SAMPLES, help=f"fewest timed samples per cell (default {MIN_SAMPLES})"
    )
    profile.add_argument("--warmup", type=positive_int, default=20, help="most warm-up steps per cell (default 20)")
    profile.add_argument(
        "--optimizer",
        choices=("adamw", "sgd"),
        default="adamw",
        help="optimizer graph the cells train with; profile with the one FL will use (default adamw)",
    )
    profile.add_argument(
        "--no-round-cost",
        action="store_true",
        help="skip the round-cost step (fixed cost of a resident runner request, transfer time per byte each way)",
    )
    profile.add_argument(
        "--precision",
        type=float,
        default=DEFAULT_PRECISION,
        help=f"target half-width of the median's 95%% interval, a fraction (default {DEFAULT_PRECISION:g}: +-2%%; "
        "0: exactly --steps samples)",
    )
    profile.add_argument(
        "--max-seconds",
        type=positive_float,
        default=DEFAULT_MAX_SECONDS,
        help=f"per-cell cap on warm-up and sampling; a cell still imprecise then is flagged (default "
        f"{DEFAULT_MAX_SECONDS:g})",
    )
    add_passes_argument(profile)
    profile.add_argument(
        "--data",
        help=".npz with x (examples shaped as the model's input) and integer labels y: the cells and round-cost "
        "requests train on these examples, as FL clients do (`fleetbench fl data` writes one); default: random "
        "normal inputs",
    )
    profile.add_argument("--timeout", type=positive_float, default=300.0, help="seconds per cell (default 300)")
    profile.add_argument("--db", default="fleetbench.db", help="profile store (default fleetbench.db)")
    profile.add_argument("--artifacts", default="artifacts", help="artifact cache directory (default ./artifacts)")
    profile.add_argument("--resume", action="store_true", help="measure only cells the store does not have yet")
    profile.set_defaults(handler="harness.profile_cli:cmd_profile")

    profiles = commands.add_parser("profiles", help="stored profiles")
    actions = profiles.add_subparsers(dest="profiles_command", required=True, parser_class=type(profiles))
    export = actions.add_parser("export", help="write one row per cell as CSV or Parquet")
    export.add_argument("--db", default="fleetbench.db", help="profile store (default fleetbench.db)")
    export.add_argument("--format", choices=("csv", "parquet"), default="csv")
    export.add_argument("--out", default=None, help="output file (default: stdout for csv)")
    export.set_defaults(handler="harness.store_cli:cmd_export")

    fleet_actions = next(
        action for action in commands.choices["fleet"]._actions if isinstance(action, argparse._SubParsersAction)
    )
    provision = fleet_actions.add_parser("provision", help="report and install the backends each device can run")
    provision.add_argument("file", help="fleet YAML file")
    provision.add_argument("--wheel", action="append", default=[], help="a wheel file to install where missing")
    provision.add_argument(
        "--install",
        action="store_true",
        help="install what each device's best backend misses (numpy, onnxruntime-training where it has a wheel, else "
        "onnxruntime) into <workdir>/site",
    )
    provision.add_argument(
        "--via",
        choices=("host", "device"),
        default="host",
        help="host: this machine fetches the wheels for each device's Python and platform and pushes them (the device "
        "needs no internet; default); device: the device's own pip fetches them from the index",
    )
    provision.add_argument("--index-url", help="package index for --install (default: the fetching pip's own)")
    provision.set_defaults(handler="harness.provision_cli:cmd_provision")
    # The packages `fleet facts` reports are those the runner imports (its runtime, its site).
    fleet_actions.choices["facts"].set_defaults(handler="harness.provision_cli:cmd_facts")
    up = fleet_actions.choices["up"]
    up.add_argument("--match", metavar="DEVICE", help="calibrate CPU shares to replay a stored device's profile")
    up.add_argument("--db", default="fleetbench.db", help="profile store for --match (default fleetbench.db)")
    up.set_defaults(handler="harness.calibrate:cmd_up")
