"""Which neurons a client's sub-model keeps: static, rolling and random extraction (pure).

The three index rules of the FedRolex paper (section 3), per layer ``i`` with ``K_i``
neurons and a client of capacity ``beta``, keeping ``ceil(beta * K_i)`` neurons
(`exporters.arch.size_at_width`):

* static (HeteroFL, FjORD; FedRolex eq. 6): ``{0, ..., ceil(beta*K_i) - 1}`` in every round;
* rolling (FedRolex eq. 4): in round ``j`` the window of that length starting at
  ``j mod K_i``, wrapping around past ``K_i - 1``. The start depends only on the
  round and ``K_i``, so every client of a round shares it (a smaller client's
  window is a prefix of a larger one's) and layers of equal size get equal windows.
  The paper prints the length as ``beta*K_i`` rounded down; this project rounds up
  everywhere (as every width of the project, `exporters.arch.size_at_width`), which is
  the same at the paper's power-of-two capacities and sizes;
* random (Federated Dropout; FedRolex eq. 5): ``ceil(beta*K_i)`` neurons drawn
  uniformly without replacement.

Coupling. Layers tied by an identity shortcut must keep the same neurons. In the
zoo, coupling is expressed by the neuron groups themselves: every tensor added by a
shortcut indexes its channels with the stage's stream group (``"layerS"`` in the
ResNets, see `exporters.zoo.fjord.resnet_groups`), so a sub-model is one index set
per *group*, and one draw per group is exactly "one draw per set of coupled layers".
(The public FD reference draws per layer and so adds mismatched channels.)

Random draws are prefixes of one permutation per group: two calls with identically
seeded generators give nested index sets for different widths, which is what a round
with one shared mask ("same") needs when clients differ in capacity.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from exporters.arch import SubModel
from exporters.userinput import InputError
from exporters.zoo import ZooModel


def _check(size: int, kept: int) -> None:
    if size < 1 or not 1 <= kept <= size:
        raise InputError(f"{kept} kept neurons is outside [1, {size}] for a layer of {size} neurons")


def static_indices(size: int, kept: int) -> np.ndarray:
    """Return the prefix ``0 .. kept-1`` of a layer with ``size`` neurons (FedRolex eq. 6).

    Parameters
    ----------
    size : int
        Neurons ``K`` of the global layer.
    kept : int
        Neurons kept, in ``[1, size]``.

    Returns
    -------
    numpy.ndarray
        Sorted int64 indices.
    """
    _check(size, kept)
    return np.arange(kept, dtype=np.int64)


def rolling_indices(rnd: int, size: int, kept: int) -> np.ndarray:
    """Return FedRolex's rolling window of round ``rnd`` (paper eq. 4), sorted.

    Parameters
    ----------
    rnd : int
        Communication round ``j`` (0-based, >= 0).
    size : int
        Neurons ``K`` of the global layer.
    kept : int
        Window length ``ceil(beta * K)``.

    Returns
    -------
    numpy.ndarray
        ``{(j mod K) + t mod K : t = 0 .. kept-1}`` as sorted int64 indices; for
        ``K = 8``, 3 kept and round 6 this is ``[0, 6, 7]``.
    """
    _check(size, kept)
    if rnd < 0:
        raise InputError(f"round {rnd} is negative")
    start = rnd % size
    return np.sort((start + np.arange(kept, dtype=np.int64)) % size)


def random_indices(rng: np.random.Generator, size: int, kept: int) -> np.ndarray:
    """Return ``kept`` of ``size`` neurons drawn uniformly without replacement (FedRolex eq. 5).

    The draw is the first ``kept`` entries of one permutation of ``range(size)``,
    so equally seeded generators give nested sets for different counts.

    Parameters
    ----------
    rng : numpy.random.Generator
    size : int
    kept : int

    Returns
    -------
    numpy.ndarray
        Sorted int64 indices.
    """
    _check(size, kept)
    return np.sort(rng.permutation(size)[:kept].astype(np.int64))


def static_submodel(model: ZooModel, width: float) -> SubModel:
    """Return the prefix sub-model of ``model`` at ``width`` (HeteroFL / FjORD).

    Parameters
    ----------
    model : ZooModel
    width : float
        Kept fraction in (0, 1].

    Returns
    -------
    SubModel
    """
    return model.static(width)


def rolling_submodel(model: ZooModel, width: float, rnd: int) -> SubModel:
    """Return FedRolex's rolling sub-model of round ``rnd`` at ``width`` (eq. 4 per group).

    Parameters
    ----------
    model : ZooModel
    width : float
        The client's capacity ``beta`` in (0, 1].
    rnd : int
        Communication round.

    Returns
    -------
    SubModel
    """
    return _per_group_submodel(model, width, lambda size, kept: rolling_indices(rnd, size, kept))


def random_submodel(model: ZooModel, width: float, rng: np.random.Generator) -> SubModel:
    """Return a Federated Dropout sub-model at ``width``: one uniform draw per neuron group.

    Groups are drawn in the model's group order from ``rng``; coupled layers share a
    group and therefore a draw (see the module docstring).

    Parameters
    ----------
    model : ZooModel
    width : float
        Kept fraction in (0, 1].
    rng : numpy.random.Generator

    Returns
    -------
    SubModel
    """
    return _per_group_submodel(model, width, lambda size, kept: random_indices(rng, size, kept))


def _per_group_submodel(model: ZooModel, width: float, indices: Callable[[int, int], np.ndarray]) -> SubModel:
    """Return the sub-model at ``width`` keeping ``indices(group size, kept neurons)`` of each group, in group order."""
    arch = model.arch(width)
    return SubModel(arch, tuple(indices(size, kept) for size, kept in zip(model.group_sizes, arch.sizes, strict=True)))
