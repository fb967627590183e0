"""Keys written under earlier names, mapped onto the current ones (pure; the one place that knows them).

The project calls a fraction of a model's neurons a *width* and a client's upper bound on
width its *capacity*. Run configurations stored in ``fl_runs.config``, strategy checkpoints
and scripts written before those names settled use older keys; every reader maps them here,
so that a stored run resumes and an existing ``--opt`` keeps working:

* strategy options (`current_options`): FD's and CFD's ``rate`` is ``width``; FLuID's
  ``sizes`` is ``widths`` and its ``rate`` ``width``;
* a client's train config (`current_train_config`): FjORD's ``p_max`` is ``capacity``;
* FLuID's checkpoint memory (`current_fluid_memory`): ``rates`` is ``client_widths`` and
  ``last_rate`` ``last_width``.

A mapping given both an old key and its current one is refused: which of the two was
meant cannot be told.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from exporters.userinput import InputError

#: Strategy name -> {old option key: current key}.
OPTION_RENAMES: Mapping[str, Mapping[str, str]] = {
    "fd": {"rate": "width"},
    "cfd": {"rate": "width"},
    "fluid": {"sizes": "widths", "rate": "width"},
}

#: Old train-config key -> current key (`fl.records.TrainIns.config`).
TRAIN_CONFIG_RENAMES: Mapping[str, str] = {"p_max": "capacity"}

#: Old key of FLuID's checkpoint memory -> current key.
FLUID_MEMORY_RENAMES: Mapping[str, str] = {"rates": "client_widths", "last_rate": "last_width"}


def renamed(values: Mapping[str, Any], renames: Mapping[str, str], what: str) -> dict[str, Any]:
    """Return ``values`` with every old key of ``renames`` replaced by its current key.

    Parameters
    ----------
    values : mapping of str to any
    renames : mapping of str to str
        Old key -> current key.
    what : str
        What ``values`` are, for the error message (``"fluid options"``).

    Returns
    -------
    dict
        A new dict, in the order of ``values``; other keys are kept as they are.

    Raises
    ------
    InputError
        If ``values`` holds both an old key and its current one.
    """
    out: dict[str, Any] = {}
    for key, value in values.items():
        current = renames.get(key, key)
        if current != key and current in values:
            raise InputError(f"{what}: {key!r} is the old name of {current!r}; give only {current!r}")
        out[current] = value
    return out


def current_options(strategy: str, options: Mapping[str, Any]) -> dict[str, Any]:
    """Return a strategy's options with old option keys under their current names.

    Parameters
    ----------
    strategy : str
        The ``--strategy`` name.
    options : mapping
        Its ``--opt key=value`` options, given now or stored with a run.

    Returns
    -------
    dict

    Raises
    ------
    InputError
        If an old key and its current one are both given.
    """
    return renamed(options, OPTION_RENAMES.get(strategy, {}), f"{strategy} options")


def current_train_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """Return a client's train config with old keys under their current names (``p_max`` -> ``capacity``)."""
    return renamed(config, TRAIN_CONFIG_RENAMES, "train config")


def current_fluid_memory(memory: Mapping[str, Any]) -> dict[str, Any]:
    """Return FLuID's checkpoint memory with old keys under their current names."""
    return renamed(memory, FLUID_MEMORY_RENAMES, "FLuID checkpoint")
