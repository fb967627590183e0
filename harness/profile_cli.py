"""``fleetbench profile``: parse the request into cells, run the campaign (or choose its widths), print the table.

Backend per device (``--backend auto``, the default): before anything is exported,
every device is asked what it can run (`harness.provision.fleet_backends`) and measured
with its best available backend (`harness.backends`: ort > onnx > torch); the backend
is part of every cell, so the store records it. A device with no usable backend is
reported on stderr with its reason and gets no cells; the others are measured. Skipped
devices do not change the exit status (the campaign measured everything it could run;
``fleetbench fleet provision FLEET`` says how to fix them), unless no device is left.
``--backend ort,torch`` measures the named backends on every device, asking nothing first.

A campaign that did not measure every cell (a device failed, or Ctrl-C stopped it) exits
with `EXIT_INCOMPLETE` and prints the command that measures only the missing cells.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harness.bench_data import bench_data_label
from harness.campaign import run_campaign
from harness.cells import plan_cells
from harness.progress import summary_table
from harness.records import BenchSpec
from harness.widths import choose_widths, parse_width_request

if TYPE_CHECKING:
    from harness.backends import BackendChoice

#: Exit status when some cell was not measured.
EXIT_INCOMPLETE = 1


def _split(text: str, what: str, convert: Callable[[str], Any]) -> list[Any]:
    from exporters.userinput import InputError

    values: list[Any] = []
    for item in text.split(","):
        item = item.strip()
        try:
            value = convert(item)
        except ValueError:
            raise InputError(f"{what} {item!r} is not valid") from None
        if value not in values:
            values.append(value)
    if not values:
        raise InputError(f"no {what} given")
    return values


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise ValueError(text)
    return value


def report_choices(choices: Sequence[BackendChoice], say: Callable[[str], None] | None = None) -> list[BackendChoice]:
    """Print the backend each device uses, or why it is skipped; return ``choices``.

    Parameters
    ----------
    choices : sequence of harness.backends.BackendChoice
    say : callable, optional
        Receives each line (default: stderr).

    Returns
    -------
    list of BackendChoice
    """
    from harness.backends import format_choices

    out = say or (lambda line: print(f"fleetbench: {line}", file=sys.stderr, flush=True))
    for line in format_choices(choices):
        out(f"backend of {line}")
    return list(choices)


def cmd_profile(args: argparse.Namespace) -> int:
    """``fleetbench profile``: run a campaign and print a summary table.

    Parameters
    ----------
    args : argparse.Namespace
        ``fleet, model, widths, batch, backend, steps, warmup, optimizer, precision, max_seconds,
        timeout, db, artifacts, resume, no_round_cost, data``.

    Returns
    -------
    int
        0 when every cell is measured, 1 otherwise (2 for bad input, via `InputError`).
    """
    from devices.fleetfile import load_fleet
    from exporters.userinput import InputError
    from harness.backends import AUTO, check_override, usable_devices
    from harness.provision import fleet_backends
    from harness.store import ProfileStore

    request = parse_width_request(args.widths)
    batches = _split(args.batch, "batch size", _positive)
    backends = _split(args.backend, "backend", check_override)
    if AUTO in backends and len(backends) > 1:
        raise InputError(f"--backend {args.backend}: auto chooses one backend per device; name no others with it")
    if args.timeout <= 0:
        raise InputError(f"timeout {args.timeout:g} must be positive")
    if not 0 <= args.precision < 1:
        raise InputError(f"--precision {args.precision:g} must be a fraction in [0, 1) (0.02 is +-2 %)")
    if args.timeout <= args.max_seconds:
        raise InputError(
            f"--timeout {args.timeout:g} must exceed --max-seconds {args.max_seconds:g} (the runner's start-up and "
            "deployment come on top of its sampling)"
        )
    data_label = bench_data_label(args.data) if args.data else None
    fleet = load_fleet(args.fleet)
    plan: Sequence[str] | Mapping[str, str] = backends

    def cells(widths: Sequence[float]) -> list[BenchSpec]:
        return plan_cells(
            fleet, args.model, widths, batches, plan, args.steps, args.warmup, args.optimizer,
            precision=args.precision, max_seconds=args.max_seconds, data=data_label,
        )  # fmt: skip

    if backends == [AUTO]:
        plan_cells(fleet, args.model, [1.0], batches, [], args.steps, args.warmup)  # bad input fails first
        plan = usable_devices(report_choices(fleet_backends(fleet)))
    if not cells([1.0]):  # bad model or backend: refused before anything is measured
        print(f"no device of {args.fleet} can run a backend; see: fleetbench fleet provision {args.fleet}",
              file=sys.stderr)  # fmt: skip
        return EXIT_INCOMPLETE
    with ProfileStore(Path(args.db)) as store:
        run = {
            "artifacts_dir": Path(args.artifacts), "timeout": args.timeout, "resume": args.resume,
            "round_cost": not args.no_round_cost, "data": args.data, "passes": args.passes,
        }  # fmt: skip
        if isinstance(request, int):
            choice = choose_widths(fleet, store, request, cells=cells, **run)
            specs = cells(choice.widths)
            results = choice.results
            print(f"widths chosen: {', '.join(f'{w:g}' for w in sorted(choice.widths))}", file=sys.stderr)
        else:
            specs = cells(request)
            results = [run_campaign(fleet, specs, store, **run)]
        print(summary_table(store.latest_cells(), specs))
    for result in results:
        for reasons in result.round_cost_failures.values():
            for reason in reasons:
                print(f"round cost not measured: {reason}", file=sys.stderr)
    skipped = sum(len(r.skipped) for r in results)
    if skipped:
        print(f"{skipped} cell(s) were already measured and skipped (--resume).")
    interrupted = any(r.interrupted for r in results)
    if results and all(r.complete for r in results):
        return 0
    measured_now = sum(m.ok for r in results for m in r.measurements)
    missing = len(specs) - skipped - measured_now
    what = "interrupted: " if interrupted else ""
    resume = ["fleetbench", "profile", "--fleet", args.fleet, "--model", args.model, "--widths", args.widths]
    resume += ["--batch", args.batch, "--backend", args.backend, "--steps", str(args.steps)]
    resume += ["--warmup", str(args.warmup), "--optimizer", args.optimizer, "--precision", f"{args.precision:g}"]
    resume += ["--max-seconds", f"{args.max_seconds:g}", "--passes", str(args.passes)]
    resume += ["--timeout", f"{args.timeout:g}", "--db", args.db]
    resume += ["--artifacts", args.artifacts, "--resume"] + (["--no-round-cost"] if args.no_round_cost else [])
    resume += ["--data", args.data] if args.data else []
    print(
        f"{what}{missing} of {len(specs)} cell(s) not measured; every finished cell is stored. "
        f"Measure only the missing ones with:\n  {shlex.join(resume)}",
        file=sys.stderr,
    )
    return EXIT_INCOMPLETE
