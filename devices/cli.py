"""The ``fleetbench fleet`` commands: argument parsing only, handlers live beside their logic.

Handlers are named ``"module:function"``; `fleetbench.cli` imports them when the command runs.
"""

from __future__ import annotations

from typing import Any


def register(commands: Any) -> None:
    """Add ``fleet check|facts|up|down|status`` to the ``fleetbench`` subcommands.

    Parameters
    ----------
    commands : argparse._SubParsersAction
        The subparsers of the ``fleetbench`` parser.
    """
    fleet = commands.add_parser("fleet", help="fleet files, device facts and the emulated fleet")
    actions = fleet.add_subparsers(dest="fleet_command", required=True, parser_class=type(fleet))

    check = actions.add_parser("check", help="validate a fleet file")
    check.add_argument("file", help="fleet YAML file")
    check.set_defaults(handler="devices.fleetfile:cmd_check")

    facts = actions.add_parser("facts", help="collect device facts concurrently")
    facts.add_argument("file", help="fleet YAML file")
    facts.add_argument("--json", action="store_true", help="print one JSON document")
    facts.add_argument("--timeout", type=float, default=20.0, help="seconds per device (default 20)")
    facts.set_defaults(handler="devices.facts:cmd_facts")

    for name, text in (
        ("up", "start the emulated devices of a fleet file on this machine"),
        ("down", "stop them and remove what up created"),
        ("status", "say which emulated devices are up and answer"),
    ):
        action = actions.add_parser(name, help=text)
        action.add_argument("file", help="fleet YAML file")
        action.set_defaults(handler=f"devices.emulation.emulate:cmd_{name}")
