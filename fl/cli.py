"""The ``fleetbench fl`` commands (``fl run``)."""

from __future__ import annotations

import argparse


def register(commands: argparse._SubParsersAction) -> None:
    """Add the ``fl`` command group to the ``fleetbench`` parser."""
    fl = commands.add_parser("fl", help="federated learning runs")
    fl.add_subparsers(dest="fl_command", required=True, parser_class=type(fl))
