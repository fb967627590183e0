"""Typed records exchanged between the FL server loop, strategies and executors.

A strategy's ``configure_round`` returns one `TrainIns` per sampled client; an
executor runs them and returns a `TrainRes` per client that finished and a
`ClientFailure` per client that did not; ``aggregate_round`` receives both.
Parameters travel as ``{name: float32 ndarray}`` dictionaries in the model's
parameter order (the zoo module's ``state_dict`` order, which is also the ORT
manifest order). Serialisation happens only at the edges (``np.save(...,
allow_pickle=False)``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from exporters.arch import SubModel

#: Parameters by name, float32, in the model's parameter order.
Params = dict[str, np.ndarray]

#: A strategy's metrics of one round: a number each, or a number per client id (e.g. each
#: client's FLOPs budget) as one mapping, never encoded in the metric's name.
RoundMetrics = Mapping[str, float | Mapping[str, float]]

#: Why a client produced no result (stored in the round log). ``refused``: the executor or
#: the device's backend cannot run what the client was asked to do.
FAILURE_REASONS = ("unreachable", "timeout", "out_of_memory", "refused", "error")


@dataclass(frozen=True)
class ClientSpec:
    """A client of a run: its data shard, capacity and (optionally) device.

    Attributes
    ----------
    cid : str
        Client id, unique in the run (``"c0"``, ``"c1"``, ...).
    num_examples : int
        Training examples in the client's shard.
    capacity : float
        The largest width (in (0, 1]) the client may train: FjORD's capacity,
        HeteroFL / FedRolex's capacity level, 1.0 for homogeneous methods.
    tier : int
        Index of the client's capacity tier (0 = largest), for the round log.
    device : str or None
        Name of the fleet device the client runs on (``devices`` executor only).
    backend : str or None
        The runner backend it trains with there (``ort``, ``onnx``, ``torch``), logged
        with every client round.
    """

    cid: str
    num_examples: int
    capacity: float = 1.0
    tier: int = 0
    device: str | None = None
    backend: str | None = None


@dataclass(frozen=True, eq=False)
class TrainIns:
    """What one client trains in one round.

    Attributes
    ----------
    cid : str
        Client id.
    submodel : SubModel
        The architecture and the global neuron indices the client's parameters hold.
    parameters : Params
        The sub-model's parameters (``ZooModel.extract(global_state, submodel)``).
    config : mapping
        Local training settings. Keys every executor honours: ``epochs`` (int),
        ``batch_size`` (int), ``lr`` (float), ``seed`` (int, drives the client's
        shuffling and any per-step sampling), ``trainer`` (str, the name of a
        local trainer registered in `fl.client`; ``"plain"`` by default). A
        trainer may read further keys of its own (FjORD's width set, FedDrop's
        keep probabilities, ...).
    """

    cid: str
    submodel: SubModel
    parameters: Params
    config: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, eq=False)
class TrainRes:
    """What one client returned.

    Attributes
    ----------
    cid : str
        Client id.
    submodel : SubModel
        The sub-model the parameters belong to (as sent in `TrainIns`).
    parameters : Params
        Trained sub-model parameters, same names and shapes as sent.
    num_examples : int
        Examples the client trained on (per epoch).
    compute_seconds : float
        Local training wall time.
    download_seconds, upload_seconds : float
        Server -> client and client -> server transfer time (0 in process).
    metrics : mapping of str to float
        At least ``loss`` (mean training loss of the last epoch) and
        ``accuracy`` (training accuracy of the last epoch) and ``steps``.
    steps_at_width : mapping of float to int
        FjORD per step: how many steps trained at each width drawn. Empty when every
        step trained the sub-model sent (or the client did not report its draws).
    """

    cid: str
    submodel: SubModel
    parameters: Params
    num_examples: int
    compute_seconds: float = 0.0
    download_seconds: float = 0.0
    upload_seconds: float = 0.0
    metrics: Mapping[str, float] = field(default_factory=dict)
    steps_at_width: Mapping[float, int] = field(default_factory=dict)

    @property
    def round_seconds(self) -> float:
        """End-to-end client time: download + compute + upload."""
        return self.download_seconds + self.compute_seconds + self.upload_seconds


@dataclass(frozen=True)
class ClientFailure:
    """A client that returned nothing in a round.

    Attributes
    ----------
    cid : str
        Client id.
    reason : str
        One of `FAILURE_REASONS`.
    message : str
        Human-readable detail.
    seconds : float
        Time spent before the failure was declared.
    """

    cid: str
    reason: str
    message: str = ""
    seconds: float = 0.0
