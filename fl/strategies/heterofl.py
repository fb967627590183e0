"""HeteroFL: static sub-models at each client's capacity, per-weight average over holders.

* Extraction: the prefix ``0 .. ceil(beta*K)-1`` of every layer for a client of
  capacity ``beta``, in every round (FedRolex eq. 6).
* Aggregation: each global weight is averaged over the clients of the round whose
  sub-model holds it; weights nobody held keep their value. HeteroFL averages these
  *without* example weighting: its rule divides by the number of clients holding a
  weight, and FedRolex's Algorithm 2 (its HeteroFL pseudocode) aggregates with the same
  unweighted selective average, eq. 10. Option ``weighted=true`` weights by example
  counts instead.
* Static BN and the scaler are part of the zoo model (``heterofl-resnet18``): BN layers
  normalise with the statistics of the current batch in training and in evaluation,
  and the scaler divides activations by the sub-model's width during training.
* ``bn_recompute``: HeteroFL's server-side pass that recomputes BN running statistics
  for evaluation only means something for a model whose BN layers keep running
  statistics. No model of this zoo does (their BN always uses batch statistics, so an
  evaluated batch is normalised by its own statistics and there is nothing to
  recompute), and parameters travel without buffers, so ``bn_recompute=true`` is
  refused with an `InputError` rather than silently ignored.

The global model is the zoo model at width 1; parts wider than every client's capacity
are never trained (a limitation of static extraction that FedRolex removes).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from torch import nn

from exporters.arch import SubModel
from exporters.userinput import InputError
from exporters.zoo import ZooModel
from fl.maths.submodels import static_submodel
from fl.records import ClientSpec
from fl.strategies.fedavg import FedAvg


def has_running_stats(model: ZooModel) -> bool:
    """Return whether any normalisation layer of ``model``'s full module tracks running statistics."""
    module = model.build()
    return any(
        isinstance(m, nn.modules.batchnorm._NormBase) and m.track_running_stats for m in module.modules()
    )


class HeteroFL(FedAvg):
    """HeteroFL (static extraction at the client's capacity).

    Parameters
    ----------
    model, initial, seed, local
        As for `FedAvg`.
    **options
        ``weighted`` (bool, default False): weight clients by example counts;
        ``bn_recompute`` (bool, default False): see the module docstring.
    """

    name = "heterofl"
    defaults: Mapping[str, Any] = {"weighted": False, "bn_recompute": False}

    def check_options(self) -> None:
        """Refuse ``bn_recompute`` (see the module docstring)."""
        if self.options["bn_recompute"]:
            if has_running_stats(self.model):
                raise InputError(
                    f"{self.name}: bn_recompute is not supported: {self.model.name} has BN running statistics, "
                    "which are buffers and do not travel with the parameters"
                )
            raise InputError(
                f"{self.name}: bn_recompute does not apply to {self.model.name}: its BatchNorm layers keep no running "
                "statistics (batch statistics in training and evaluation), so there is nothing to recompute"
            )

    def submodel_for(self, rnd: int, client: ClientSpec) -> SubModel:
        """Return the prefix sub-model at the client's capacity."""
        return static_submodel(self.model, client.capacity)

    def eval_submodels(self, clients: Sequence[ClientSpec]) -> dict[float, SubModel]:
        """Evaluate the prefix sub-model at every distinct client capacity."""
        return {c: static_submodel(self.model, c) for c in sorted({cl.capacity for cl in clients}, reverse=True)}
