"""FedAvg: every client trains the full model; the server averages weighted by examples.

`FedAvg` is also the base of the sub-model strategies (HeteroFL, FjORD, FedRolex,
Federated Dropout): they differ only in which sub-model a client gets in a round
(`FedAvg.submodel_for`), the local trainer and whether the per-weight average is
weighted by examples. Aggregation is always `fl.maths.aggregate.selective_average`: each
global weight is averaged over the clients whose sub-model held it, which for the full
model is plain FedAvg, ``sum_k n_k theta_k / sum_k n_k``.

Options arrive as keyword arguments, possibly as strings from the command line
(``--opt key=value``); `parse_options` converts them to the type of their default and
rejects unknown names.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from exporters.arch import SubModel, static_submodel
from exporters.userinput import InputError
from exporters.zoo import ZooModel
from fl.maths.aggregate import selective_average, updates_from_results
from fl.records import ClientFailure, ClientSpec, Params, RoundMetrics, TrainIns, TrainRes
from fl.strategies.base import Profiles, Strategy

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def parse_options(strategy: str, options: Mapping[str, Any], defaults: Mapping[str, Any]) -> dict[str, Any]:
    """Merge ``options`` into ``defaults``, converting each value to its default's type.

    Parameters
    ----------
    strategy : str
        Strategy name, for error messages.
    options : mapping
        Given options (values may be strings such as ``"true"`` or ``"0.5"``).
    defaults : mapping
        Every accepted option and its default; a default of ``None`` accepts a float.

    Returns
    -------
    dict

    Raises
    ------
    InputError
        On an unknown option name or a value that does not convert.
    """
    unknown = sorted(set(options) - set(defaults))
    if unknown:
        known = ", ".join(sorted(defaults)) or "none"
        raise InputError(f"{strategy}: unknown option(s) {', '.join(unknown)}; known: {known}")
    out = dict(defaults)
    for key, value in options.items():
        out[key] = _convert(strategy, key, value, defaults[key])
    return out


def parse_bool(value: bool | str, name: str) -> bool:
    """Read a boolean option given as a bool or as a word (``1/true/yes/on``, ``0/false/no/off``).

    Parameters
    ----------
    value : bool or str
    name : str
        Option name, for the error message.

    Returns
    -------
    bool

    Raises
    ------
    InputError
        If ``value`` is neither a bool nor one of the words.
    """
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise InputError(f"option {name}={value!r} is not a boolean")


def _convert(strategy: str, key: str, value: Any, default: Any) -> Any:
    try:
        if isinstance(default, bool):
            return parse_bool(value, key)
        if isinstance(default, int):
            if isinstance(value, float) and not value.is_integer():
                raise ValueError(value)
            return int(value)
        if isinstance(default, float) or default is None:
            return None if value is None else float(value)
        return str(value)
    except (TypeError, ValueError):  # InputError is a ValueError
        raise InputError(f"{strategy}: option {key}={value!r} is not a valid {type(default).__name__}") from None


class FedAvg(Strategy):
    """Federated Averaging: full model for everyone, average weighted by example counts.

    Parameters
    ----------
    model : ZooModel
    initial : Params
    seed : int
    local : mapping
        Local training defaults (see `Strategy`).
    **options
        ``weighted`` (bool, default True): weight clients by their example counts.
    """

    name = "fedavg"

    #: Accepted options and their defaults (subclasses extend).
    defaults: Mapping[str, Any] = {"weighted": True}

    def __init__(
        self,
        model: ZooModel,
        initial: Params,
        seed: int = 0,
        local: Mapping[str, Any] | None = None,
        **options: Any,
    ) -> None:
        super().__init__(model, initial, seed=seed, local=local)
        missing = sorted(set(model.layouts) - set(self.global_state))
        extra = sorted(set(self.global_state) - set(model.layouts))
        if missing or extra:
            raise InputError(
                f"{self.name}: initial parameters do not match {model.name}: missing {missing}, extra {extra}"
            )
        self.options = parse_options(self.name, options, self.defaults)
        self.check_options()

    def check_options(self) -> None:
        """Validate ``self.options`` and derive state from them (the constructor's last step; subclasses extend)."""

    def submodel_for(self, rnd: int, client: ClientSpec) -> SubModel:
        """Return the sub-model ``client`` trains in round ``rnd`` (here: the full model)."""
        return static_submodel(self.model.full_arch())

    def trainer_config(self, rnd: int, client: ClientSpec, submodel: SubModel) -> dict[str, Any]:
        """Return extra local-config keys for one client (none here)."""
        return {}

    def configure_round(
        self, rnd: int, clients: Sequence[ClientSpec], profiles: Profiles | None = None
    ) -> dict[str, TrainIns]:
        """Return each client's sub-model, its slice of the global parameters and its config."""
        out: dict[str, TrainIns] = {}
        for client in clients:
            sub = self.submodel_for(rnd, client)
            out[client.cid] = TrainIns(
                cid=client.cid,
                submodel=sub,
                parameters=self.model.extract(self.global_state, sub),
                config=self.client_config(rnd, client.cid, **self.trainer_config(rnd, client, sub)),
            )
        return out

    def aggregate_round(
        self, rnd: int, results: Sequence[TrainRes], failures: Sequence[ClientFailure]
    ) -> tuple[Params, RoundMetrics]:
        """Average every weight over the clients that held it; failed clients count as absent.

        Returns the new global state and ``clients``, ``failures``, ``examples`` and the
        example-weighted ``train_loss`` / ``train_accuracy`` of the clients' last epoch.
        """
        if results:
            updates = updates_from_results(results, bool(self.options["weighted"]))
            self.global_state = selective_average(self.model, self.global_state, updates)
        return self.global_state, round_metrics(results, failures)

    def eval_submodels(self, clients: Sequence[ClientSpec]) -> dict[float, SubModel]:
        """Evaluate the full global model only."""
        return {1.0: static_submodel(self.model.full_arch())}


def round_metrics(results: Sequence[TrainRes], failures: Sequence[ClientFailure]) -> dict[str, float]:
    """Return a round's client counts and example-weighted training loss and accuracy.

    Parameters
    ----------
    results : sequence of TrainRes
    failures : sequence of ClientFailure

    Returns
    -------
    dict of str to float
        ``clients``, ``failures``, ``examples``, and when any client reported them,
        ``train_loss`` and ``train_accuracy``.
    """
    metrics = {"clients": float(len(results)), "failures": float(len(failures))}
    metrics["examples"] = float(sum(r.num_examples for r in results))
    for key, out in (("loss", "train_loss"), ("accuracy", "train_accuracy")):
        pairs = [(float(r.metrics[key]), r.num_examples) for r in results if key in r.metrics]
        total = sum(n for _, n in pairs)
        if pairs and total > 0:
            metrics[out] = float(np.sum([v * n for v, n in pairs]) / total)
    return metrics
