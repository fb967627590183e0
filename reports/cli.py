"""The ``fleetbench report`` command."""

from __future__ import annotations

import argparse


def register(commands: argparse._SubParsersAction) -> None:
    """Add the ``report`` command to the ``fleetbench`` parser."""
    commands.add_parser("report", help="write the HTML report from the profile store")
