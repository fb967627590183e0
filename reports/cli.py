"""The ``fleetbench report`` command: the HTML report and its files from the profile store.

``fleetbench report [--db PATH] [--out DIR] [--log-scale]`` reads the store (never
measures), writes ``DIR/report.html`` (self-contained: images embedded, no network
needed) with every figure as PNG and SVG and every table as CSV next to it, and
prints the headline table. A missing store is an `InputError` (exit status 2).
"""

from __future__ import annotations

import argparse
import sys


def register(commands: argparse._SubParsersAction) -> None:
    """Add the ``report`` command to the ``fleetbench`` parser.

    Parameters
    ----------
    commands : argparse._SubParsersAction
        The ``fleetbench`` sub-command parsers.
    """
    report = commands.add_parser("report", help="write the HTML report from the profile store")
    report.add_argument("--db", default="fleetbench.db", help="profile store (default fleetbench.db)")
    report.add_argument("--out", default="report", help="output directory (default ./report)")
    report.add_argument("--log-scale", action="store_true", help="logarithmic latency axis")
    report.set_defaults(handler="reports.cli:cmd_report")


def cmd_report(args: argparse.Namespace) -> int:
    """Run ``fleetbench report``.

    Parameters
    ----------
    args : argparse.Namespace
        ``db``, ``out``, ``log_scale``.

    Returns
    -------
    int
        Exit status 0.

    Raises
    ------
    InputError
        If the store is missing or unusable, or the output directory cannot be created.
    """
    from pathlib import Path

    from exporters.userinput import InputError
    from reports.report import format_headline, load_sources, write_report

    sources = load_sources(args.db)
    out = Path(args.out)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InputError(f"cannot create output directory {out}: {exc.strerror}") from None
    path, headline = write_report(sources, out, log_scale=bool(args.log_scale))
    from reports.tables import emulated_devices

    print(format_headline(headline, emulated_devices(sources.cells)))
    print(f"wrote {path} (figures as PNG and SVG, tables as CSV, in {out})", file=sys.stderr)
    return 0
