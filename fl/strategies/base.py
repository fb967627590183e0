"""The strategy interface: one small class per FL method, maths in pure functions.

A strategy owns the global model state between rounds. The server loop calls,
per round ``rnd`` (0-based):

1. ``configure_round(rnd, clients, profiles)`` with the sampled clients, which
   returns ``{cid: TrainIns}``;
2. an executor runs the instructions;
3. ``aggregate_round(rnd, results, failures)``, which updates and returns the
   global state plus a dictionary of round metrics (numbers only).

Evaluation asks ``eval_submodels()`` for the sub-models to evaluate the global
model at (one per width any client trains). Checkpointing asks ``state()`` for
everything needed to continue (global parameters plus any strategy memory) and
restores it with ``load_state``; a resumed run must continue exactly as an
uninterrupted one, so any randomness a strategy uses must come from
``numpy.random.default_rng((seed, rnd, ...))`` keyed by the round, never from a
generator carried across rounds.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from exporters.arch import SubModel
from fl.records import ClientFailure, ClientSpec, Params, RoundMetrics, TrainIns, TrainRes

if TYPE_CHECKING:
    from exporters.arch import Arch
    from exporters.zoo import ZooModel

#: Per-device profile rows (``ProfileStore.latest_cells`` records), keyed by device
#: name; empty when the run has no devices or no profiles.
Profiles = Mapping[str, Sequence[Mapping[str, Any]]]

#: ``(client, arch) -> predicted seconds of its round at arch, or None`` (`fl.roundcost.ClientRoundPredictor`):
#: the round-cost model's prediction, fixed cost and transfers included. The server sets a strategy's
#: ``round_predictor`` when the run has profiles to predict from; strategies that plan on the predicted
#: round (FLuID) use it and fall back to their measured rules without it.
RoundPredictor = Callable[[ClientSpec, "Arch"], "float | None"]


class Strategy:
    """Base class of FL strategies.

    Parameters
    ----------
    model : ZooModel
        The global model's zoo entry.
    initial : Params
        Initial global parameters (full width).
    seed : int
        Run seed; round-level randomness derives from ``(seed, rnd)``.
    local : mapping
        Default local training config merged into every `TrainIns.config`
        (``epochs``, ``batch_size``, ``lr``).

    Attributes
    ----------
    round_predictor : RoundPredictor or None
        Set by the server when the run can predict client rounds (see `RoundPredictor`).
    """

    #: Name used on the command line (``--strategy``).
    name = "base"

    def __init__(self, model: ZooModel, initial: Params, seed: int = 0, local: Mapping[str, Any] | None = None) -> None:
        self.model = model
        self.global_state: Params = {k: np.array(v, dtype=np.float32, copy=True) for k, v in initial.items()}
        self.seed = seed
        self.local: dict[str, Any] = {"epochs": 1, "batch_size": 20, "lr": 0.05, "trainer": "plain"}
        self.local.update(local or {})
        self.round_predictor: RoundPredictor | None = None

    def check_clients(self, clients: Sequence[ClientSpec]) -> None:
        """Refuse, before the run is logged, clients this strategy cannot serve (default: none).

        Parameters
        ----------
        clients : sequence of ClientSpec
            Every client of the run.

        Raises
        ------
        InputError
            Naming the first client that cannot take part, and why.
        """

    def configure_round(
        self, rnd: int, clients: Sequence[ClientSpec], profiles: Profiles | None = None
    ) -> dict[str, TrainIns]:
        """Return the training instructions of every sampled client."""
        raise NotImplementedError

    def aggregate_round(
        self, rnd: int, results: Sequence[TrainRes], failures: Sequence[ClientFailure]
    ) -> tuple[Params, RoundMetrics]:
        """Fold the clients' results into the global state; return it and round metrics."""
        raise NotImplementedError

    def eval_submodels(self, clients: Sequence[ClientSpec]) -> dict[float, SubModel]:
        """Return ``{width: SubModel}`` to evaluate the global model at.

        The default evaluates the prefix sub-model at every distinct client capacity.
        """
        return {c: self.model.static(c) for c in sorted({cl.capacity for cl in clients}, reverse=True)}

    def step_widths(self, ins: TrainIns, client: ClientSpec) -> dict[float, float] | None:
        """Return the work a client's round trains at each width (in full-batch steps), when it differs by step.

        The round-cost model predicts such a round as the mean of its rounds at each width,
        weighted by that work. None (the default): every step trains the instruction's sub-model.
        """
        return None

    def client_config(self, rnd: int, cid: str, **extra: Any) -> dict[str, Any]:
        """Return the local config for one client: defaults, a per-(round, client) seed, extras."""
        config = dict(self.local)
        config["seed"] = int(np.random.default_rng((self.seed, rnd, _cid_number(cid))).integers(2**31 - 1))
        config.update(extra)
        return config

    def state(self) -> dict[str, Any]:
        """Return everything needed to resume: ``{"global": Params, ...}`` (numpy and JSON types only)."""
        return {"global": self.global_state}

    def load_state(self, state: Mapping[str, Any]) -> None:
        """Restore what `state` returned."""
        self.global_state = {k: np.array(v, dtype=np.float32, copy=True) for k, v in state["global"].items()}


def _cid_number(cid: str) -> int:
    digits = "".join(ch for ch in cid if ch.isdigit())
    return int(digits) if digits else sum(map(ord, cid))
