"""Federated Dropout (Caldas et al.): random sub-models, redrawn every round.

* Extraction (FedRolex eq. 5): every round each layer keeps ``ceil(r*K)`` neurons drawn
  uniformly at random, one draw per neuron group, so layers coupled by a residual
  addition share their draw (`fl.maths.submodels.random_submodel`; the public reference draws
  per layer and adds mismatched channels).
* ``mask="same"`` (default; the baseline of the Coded FD paper): one draw per round for
  all clients. The draw is a random permutation per group seeded by ``(seed, round)``;
  a client keeps its first ``ceil(r*K)`` entries, so clients of equal width get the
  identical mask and a smaller client's mask is a subset of a larger one's.
  ``mask="per_client"``: each client draws its own, seeded by ``(seed, round, client)``.
* Width: the client's capacity, or option ``width`` for everyone (Caldas' single rate).
* Aggregation: per weight over the clients that held it, weighted by examples as FedAvg
  does (Caldas builds on FedAvg; the Coded FD paper's FAVG weights by ``n_k/n``);
  ``weighted=false`` gives FedRolex's unweighted variant (its Algorithm 3).
  Weights no client held keep their value. No rescaling of kept neurons.

All randomness is keyed by the round, so a resumed run draws the same masks.
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping
from typing import Any

import numpy as np

from exporters.arch import SubModel
from exporters.userinput import InputError
from fl.maths.submodels import random_submodel
from fl.records import ClientSpec
from fl.scheduling.checks import check_width
from fl.strategies.fedavg import FedAvg

#: Values of the ``mask`` option.
MASKS = ("same", "per_client")


def client_key(cid: str) -> int:
    """Return a stable integer for a client id (CRC-32 of its UTF-8 bytes), for seeding."""
    return zlib.crc32(cid.encode("utf-8"))


class FederatedDropout(FedAvg):
    """Federated Dropout: a random sub-model per round (one shared mask or one per client).

    Parameters
    ----------
    model, initial, seed, local
        As for `FedAvg`.
    **options
        ``mask`` (``"same"`` or ``"per_client"``, default ``"same"``), ``width`` (float in
        (0, 1]; default: each client's capacity), ``weighted`` (bool, default True).
    """

    name = "fd"
    defaults: Mapping[str, Any] = {"mask": "same", "width": None, "weighted": True}

    def check_options(self) -> None:
        """Check ``mask`` and validate ``width``."""
        if self.options["mask"] not in MASKS:
            raise InputError(f"fd: mask={self.options['mask']!r} is not one of {', '.join(MASKS)}")
        if self.options["width"] is not None:
            self.options["width"] = check_width(self.options["width"], "fd width")

    def width_for(self, client: ClientSpec) -> float:
        """Return the width ``client`` keeps: option ``width`` or its capacity."""
        width = self.options["width"]
        return float(client.capacity if width is None else width)

    def submodel_for(self, rnd: int, client: ClientSpec) -> SubModel:
        """Return the client's random sub-model of round ``rnd``."""
        if self.options["mask"] == "same":
            rng = np.random.default_rng((self.seed, rnd))
        else:
            rng = np.random.default_rng((self.seed, rnd, client_key(client.cid)))
        return random_submodel(self.model, self.width_for(client), rng)
