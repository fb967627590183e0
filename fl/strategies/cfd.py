"""Coded Federated Dropout (Verardo et al. 2022): a different coded sub-model per client.

Per round and per neuron group (conv filters, dense units, LSTM units: the zoo's
layouts already tie an LSTM unit's four gate blocks to one neuron, so one mask per
group is one mask across the gates), every sampled client gets a different row of a
code matrix with exactly ``ceil(width * K)`` ones; the ones are the neurons its
sub-model keeps (section 3.2). Codes (option ``code``):

* ``"gold"``: Gold codes (`fl.maths.codes.gold_code_matrix`; the paper's setting is
  ``width = 0.5``, where every row is a balanced Gold sequence);
* ``"constant_weight"``: greedy constant-weight codes maximising the minimum
  distance (`fl.maths.codes.constant_weight_code`);
* ``"random"``: an independent random mask per client (Wen et al.);
* ``"same"``: one random mask shared by every client of the round (baseline
  Federated Dropout, Caldas et al.).

A Gold or constant-weight matrix is built once per group (seeded by the run seed,
cached in-process by `code_matrix`) and reused: every round its rows and columns are shuffled with
``default_rng((seed, rnd, group))``, so spare rows (beyond the number of clients)
take part and the same neurons are not tied together round after round.

Aggregation: each global weight is averaged over the sub-models that held it
(`fl.maths.aggregate.selective_average`, weighted by sample counts unless
``weighted=False``); the difference to the current model is the mean update,
applied by the server optimiser (`fl.maths.server_opt`): FedAvg with server learning rate
``server_lr`` or FedAdam. The optimiser's moments are part of `state`.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from exporters.arch import SubModel, make_submodel
from exporters.userinput import InputError
from exporters.zoo import ZooModel
from fl.maths.aggregate import selective_average
from fl.maths.codes import assign_rows, constant_weight_code, gold_code_matrix, random_rows
from fl.maths.server_opt import ServerOptimizer, mean_update
from fl.records import ClientFailure, ClientSpec, Params, RoundMetrics, TrainIns, TrainRes
from fl.scheduling.checks import check_width
from fl.strategies.base import Profiles, Strategy
from fl.strategies.fedavg import parse_bool

#: Values of the ``code`` option.
CODES = ("gold", "constant_weight", "random", "same")


class CodedFD(Strategy):
    """Coded Federated Dropout with a server optimiser.

    Parameters
    ----------
    model, initial, seed, local
        As for `fl.strategies.base.Strategy`.
    code : str
        One of `CODES`.
    width : float
        Kept fraction of every neuron group, in (0, 1] (the paper: 0.5).
    server_opt : str
        ``"fedavg"`` or ``"fedadam"``.
    server_lr : float
        Server learning rate ``eta``.
    beta1, beta2, tau : float
        FedAdam's hyper-parameters (paper Table 3: 0.9, 0.99, 1e-3).
    weighted : bool
        Weight clients by their sample counts in the per-weight average.
    """

    name = "cfd"

    def __init__(
        self,
        model: ZooModel,
        initial: Params,
        seed: int = 0,
        local: Mapping[str, Any] | None = None,
        *,
        code: str = "gold",
        width: float = 0.5,
        server_opt: str = "fedavg",
        server_lr: float = 1.0,
        beta1: float = 0.9,
        beta2: float = 0.99,
        tau: float = 1e-3,
        weighted: bool | str = True,
    ) -> None:
        super().__init__(model, initial, seed, local)
        if code not in CODES:
            raise InputError(f"unknown code {code!r}; known: {', '.join(CODES)}")
        self.code = code
        self.width = check_width(width, "cfd width")
        self.arch = model.arch(self.width)
        self.weighted = parse_bool(weighted, "weighted")
        self.optimizer = ServerOptimizer(str(server_opt), float(server_lr), float(beta1), float(beta2), float(tau))

    def masks(self, rnd: int, clients: int) -> list[np.ndarray]:
        """Return, per neuron group, the boolean ``(clients, K)`` masks of round ``rnd``.

        Row ``i`` is client ``i``'s mask; every row has ``ceil(width * K)`` ones.
        """
        out = []
        for g, (size, kept) in enumerate(zip(self.model.group_sizes, self.arch.sizes, strict=True)):
            rng = np.random.default_rng((self.seed, rnd, g))
            if self.code == "random":
                out.append(random_rows(size, kept, clients, rng))
            elif self.code == "same":
                out.append(np.repeat(random_rows(size, kept, 1, rng), clients, axis=0))
            else:
                out.append(assign_rows(self._matrix(g, size, kept, clients), clients, rng))
        return out

    def _matrix(self, group: int, size: int, kept: int, clients: int) -> np.ndarray:
        return code_matrix(self.code, size, kept, clients, (self.seed, group))

    def configure_round(
        self, rnd: int, clients: Sequence[ClientSpec], profiles: Profiles | None = None
    ) -> dict[str, TrainIns]:
        """Give every client its coded sub-model (row ``i`` of each group's mask to client ``i``)."""
        if not clients:
            return {}
        masks = self.masks(rnd, len(clients))
        out: dict[str, TrainIns] = {}
        for i, client in enumerate(clients):
            indices = [np.flatnonzero(mask[i]).tolist() for mask in masks]
            submodel = make_submodel(self.arch, self.model.group_sizes, indices)
            out[client.cid] = TrainIns(
                cid=client.cid,
                submodel=submodel,
                parameters=self.model.extract(self.global_state, submodel),
                config=self.client_config(rnd, client.cid),
            )
        return out

    def aggregate_round(
        self, rnd: int, results: Sequence[TrainRes], failures: Sequence[ClientFailure]
    ) -> tuple[Params, RoundMetrics]:
        """Average per weight over the holders, then apply the server optimiser to the mean update."""
        metrics: dict[str, float] = {"clients": float(len(results)), "failures": float(len(failures))}
        if not results:
            return self.global_state, metrics
        updates = [(r.submodel, r.parameters, float(r.num_examples) if self.weighted else 1.0) for r in results]
        averaged = selective_average(self.model, self.global_state, updates)
        update = mean_update(self.global_state, averaged)
        self.global_state = self.optimizer.step(self.global_state, update)
        accuracies = [float(r.metrics["accuracy"]) for r in results if "accuracy" in r.metrics]
        losses = [float(r.metrics["loss"]) for r in results if "loss" in r.metrics]
        if accuracies:
            metrics["median_accuracy"] = float(np.median(accuracies))
        if losses:
            metrics["mean_loss"] = float(np.mean(losses))
        metrics["coverage"] = _coverage(self.model, [r.submodel.indices for r in results])
        squares = sum(float(np.sum(np.square(u, dtype=np.float64))) for u in update.values())
        metrics["update_norm"] = float(np.sqrt(squares))
        return self.global_state, metrics

    def eval_submodels(self, clients: Sequence[ClientSpec]) -> dict[float, SubModel]:
        """Evaluate the full global model (dropout is a training-time device only)."""
        return {1.0: self.model.static(1.0)}

    def state(self) -> dict[str, Any]:
        """Return the global parameters plus the server optimiser's moments (``server_opt``)."""
        return {"global": self.global_state, "server_opt": self.optimizer.state()}

    def load_state(self, state: Mapping[str, Any]) -> None:
        """Restore what `state` returned."""
        super().load_state(state)
        self.optimizer.load_state(state.get("server_opt") or {})


@functools.lru_cache(maxsize=64)
def code_matrix(code: str, size: int, kept: int, clients: int, key: tuple[int, int]) -> np.ndarray:
    """Return the (read-only) Gold or constant-weight matrix of one neuron group.

    Deterministic in its arguments, hence cached: a run resumed round by round (as the
    server learning-rate search does) does not rebuild its codes. ``key`` is
    ``(run seed, group index)`` and seeds the construction.

    Parameters
    ----------
    code : str
        ``"gold"`` or ``"constant_weight"``.
    size, kept : int
        Group size ``K`` and kept neurons ``w``.
    clients : int
        Rows needed.
    key : tuple of int

    Returns
    -------
    numpy.ndarray
        Boolean ``(R, K)``, ``R >= clients`` unless fewer words of weight ``w`` exist.
    """
    rng = np.random.default_rng((*key, 0x0C0DE, clients))
    if code == "gold":
        rows = gold_code_matrix(size, kept, clients, rng).rows
    else:
        # Fewer distinct words than clients (tiny layers, width 1): rows are then reused cyclically.
        rows = constant_weight_code(size, kept, min(clients, math.comb(size, kept)), rng).rows
    rows.setflags(write=False)
    return rows


def _coverage(model: ZooModel, indices: Sequence[Sequence[np.ndarray]]) -> float:
    """Mean over groups of the fraction of neurons that at least one client held."""
    fractions = []
    for g, size in enumerate(model.group_sizes):
        held = np.zeros(size, dtype=bool)
        for per_client in indices:
            held[per_client[g]] = True
        fractions.append(float(held.mean()))
    return float(np.mean(fractions)) if fractions else 1.0

