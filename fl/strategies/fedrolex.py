"""FedRolex: rolling sub-model extraction and unweighted selective averaging.

* Extraction (paper eq. 4): in round ``j`` every layer with ``K`` neurons keeps the
  window of ``ceil(beta*K)`` neurons starting at ``j mod K``, wrapping around
  (`fl.maths.submodels.rolling_submodel`). All clients of a round share the start, so a
  smaller client's window is a prefix of a larger client's; round 0 is static extraction.
* Aggregation (eq. 10): per global weight, the plain average over the clients of this
  round that held it; weights nobody held keep their value. The count is of *this
  round's* holders only (the public reference accumulates a per-element count across
  clients and rounds; that is not eq. 10 and is not repeated here). Option
  ``weighted=true`` weights by example counts (the paper's Appendix E ablation).
* The global model is the zoo model at width 1 and may be larger than every client's
  model: capacities below 1 for all clients are fine, the rolling windows still cover
  every neuron over ``K`` rounds. Scaler rates in the zoo model are relative to it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from exporters.arch import SubModel, static_submodel
from fl.maths.submodels import rolling_submodel
from fl.records import ClientSpec
from fl.strategies.fedavg import FedAvg


class FedRolex(FedAvg):
    """FedRolex (rolling window at the client's capacity, eq. 4 and eq. 10).

    Parameters
    ----------
    model, initial, seed, local
        As for `FedAvg`.
    **options
        ``weighted`` (bool, default False): weight clients by example counts.
    """

    name = "fedrolex"
    defaults: Mapping[str, Any] = {"weighted": False}

    def submodel_for(self, rnd: int, client: ClientSpec) -> SubModel:
        """Return the rolling-window sub-model of round ``rnd`` at the client's capacity."""
        return rolling_submodel(self.model, client.capacity, rnd)

    def eval_submodels(self, clients: Sequence[ClientSpec]) -> dict[float, SubModel]:
        """Evaluate the whole global model and its prefix sub-model at every client capacity."""
        out = {1.0: static_submodel(self.model.full_arch())}
        for c in sorted({cl.capacity for cl in clients}, reverse=True):
            out.setdefault(c, self.model.static(c))
        return out
