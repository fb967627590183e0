"""What an architecture costs to train, counted: FLOPs per kind of layer, bytes moved, parameters, activations.

The features the latency and memory models of `harness.latency` are fitted on, per
example of one training step (`exporters.flops.count`), computed from the architecture
alone (pure; the zoo's counts are cached).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from exporters.arch import Arch

#: Bytes per trainable parameter during training: weight + gradient + 2 Adam moments.
BYTES_PER_PARAM = 16
#: Bytes per activation element (float32).
BYTES_PER_ACTIVATION = 4

#: Latency features of a zoo model, in order (see `harness.latency`'s docstring).
FEATURES: tuple[str, ...] = ("fixed", "conv", "matmul", "bytes")
#: Memory features.
MEMORY_FEATURES: tuple[str, ...] = ("fixed", "params_bytes", "activation_bytes")


# ---------------------------------------------------------------------------- analytic counts


@dataclass(frozen=True)
class ArchCounts:
    """What the models need to know about one architecture, per example.

    Attributes
    ----------
    conv, linear, lstm : float
        Training FLOPs of the layers of each kind.
    train_flops : float
        All training FLOPs (`exporters.flops.Counts.train_flops`).
    params : float
        Trainable parameters.
    activations : float
        Output elements of every executed layer, summed.
    """

    conv: float
    linear: float
    lstm: float
    train_flops: float
    params: float
    activations: float


@lru_cache(maxsize=4096)
def zoo_counts(model_name: str, which: tuple[int, ...] | float) -> ArchCounts:
    """Count a zoo model's architecture: its layer sizes, or the uniform width ``which``."""
    from exporters.arch import Arch
    from exporters.flops import count
    from exporters.zoo import get_model

    model = get_model(model_name)
    arch = Arch(model.name, which) if isinstance(which, tuple) else model.arch(float(which))
    counts = count(model, arch)
    kinds = {"conv": 0.0, "linear": 0.0, "lstm": 0.0}
    for layer in counts.layers:
        if layer.kind in kinds:
            kinds[layer.kind] += layer.train_flops
    activations = float(sum(math.prod(layer.output_shape) for layer in counts.layers))
    return ArchCounts(
        kinds["conv"], kinds["linear"], kinds["lstm"], float(counts.train_flops), float(counts.params), activations
    )


def arch_counts(arch: Arch) -> ArchCounts:
    """Return the counts of a zoo architecture (cached).

    Parameters
    ----------
    arch : Arch
        Any widths of a zoo model.

    Returns
    -------
    ArchCounts
    """
    return zoo_counts(arch.model, tuple(int(w) for w in arch.sizes))


def train_flops_per_example(model_name: str, width: float) -> int:
    """Return the training-step FLOPs of one example of a zoo model at a width.

    Parameters
    ----------
    model_name : str
        Zoo model name (`exporters.zoo.get_model`).
    width : float
        Width in (0, 1] (``model.arch(width)``).

    Returns
    -------
    int
        Forward plus backward FLOPs per example (`exporters.flops.Counts.train_flops`).
    """
    return int(zoo_counts(model_name, float(width)).train_flops)


def memory_features(model_name: str, width: float) -> tuple[int, int]:
    """Return ``(params, activation_elements)`` of one example of a zoo model at a width.

    Parameters
    ----------
    model_name : str
        Zoo model name.
    width : float
        Width in (0, 1].

    Returns
    -------
    tuple of int
        Trainable parameters and the sum of the layers' output elements for one example.
    """
    counts = zoo_counts(model_name, float(width))
    return int(counts.params), int(counts.activations)


def footprint_bytes(
    params: float, activation_elements: float, batch: int, bytes_per_param: float = BYTES_PER_PARAM
) -> float:
    """Return ``params * bytes_per_param + activations * batch * 4``: a training step's own memory.

    Parameters
    ----------
    params : float
        Trainable parameters.
    activation_elements : float
        Sum of layer output elements for ONE example.
    batch : int
        Batch size.
    bytes_per_param : float
        Bytes per parameter with gradient and optimizer state (default 16, AdamW).

    Returns
    -------
    float
        Estimated training footprint in bytes.
    """
    return float(params) * bytes_per_param + float(activation_elements) * batch * BYTES_PER_ACTIVATION


def latency_features(counts: ArchCounts, batch: int) -> np.ndarray:
    """Return the `FEATURES` of an architecture at a batch size.

    Parameters
    ----------
    counts : ArchCounts
    batch : int

    Returns
    -------
    numpy.ndarray
        ``[1, conv, linear + lstm, 4 * (3 A + 4 P / batch)]``.
    """
    moved = BYTES_PER_ACTIVATION * (3.0 * counts.activations + 4.0 * counts.params / batch)
    return np.array([1.0, counts.conv, counts.linear + counts.lstm, moved])


def memory_feature_vector(params: float, activations: float, batch: int) -> np.ndarray:
    """Return the `MEMORY_FEATURES`: ``[1, 16 P, 4 A batch]``.

    Parameters
    ----------
    params, activations : float
    batch : int

    Returns
    -------
    numpy.ndarray
    """
    return np.array([1.0, BYTES_PER_PARAM * float(params), BYTES_PER_ACTIVATION * float(activations) * batch])


