"""FL strategies: one module per method (see `fl.strategies.base`).

`STRATEGIES` maps each ``--strategy`` name to ``"module:Class"``; classes are
imported on first use. Every class takes ``(model, initial, seed=0, local=None,
**options)`` where ``options`` are keyword-only method parameters with defaults
(the command line's ``--opt key=value``).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from exporters.userinput import InputError

if TYPE_CHECKING:
    from fl.strategies.base import Strategy

#: ``--strategy`` name -> ``"module:Class"``.
STRATEGIES: dict[str, str] = {
    "fedavg": "fl.strategies.fedavg:FedAvg",
    "heterofl": "fl.strategies.heterofl:HeteroFL",
    "fjord": "fl.strategies.fjord:FjORD",
    "fedrolex": "fl.strategies.fedrolex:FedRolex",
    "fd": "fl.strategies.fd:FederatedDropout",
    "fluid": "fl.strategies.fluid:FLuID",
    "cfd": "fl.strategies.cfd:CodedFD",
    "feddrop": "fl.strategies.feddrop:FedDrop",
}


def strategy_class(name: str) -> type[Strategy]:
    """Return the strategy class registered as ``name``.

    Raises
    ------
    InputError
        If no strategy has that name (the message lists the known names).
    """
    if name not in STRATEGIES:
        raise InputError(f"unknown strategy {name!r}; known: {', '.join(sorted(STRATEGIES))}")
    module, _, cls = STRATEGIES[name].partition(":")
    found: type[Strategy] = getattr(importlib.import_module(module), cls)
    return found
