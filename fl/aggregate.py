"""Aggregation of sub-model parameters into the global model (pure functions).

Every method of this project aggregates *per weight over the clients that held
it*: FjORD's nested average (paper eq. 1) weighted by sample counts, FedRolex's
selective average (eq. 10, unweighted), HeteroFL's, FLuID's count-aware FedAvg
and Coded FD's per-weight average. `selective_average` is that one rule; the
strategies choose the weights. A weight no client held keeps its global value.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from exporters.arch import SubModel, tensor_index
from exporters.zoo import ZooModel
from fl.records import Params


def selective_average(
    model: ZooModel,
    global_state: Mapping[str, np.ndarray],
    updates: Sequence[tuple[SubModel, Mapping[str, np.ndarray], float]],
) -> Params:
    """Average every global weight over the updates whose sub-model holds it.

    Parameters
    ----------
    model : ZooModel
        The global model's zoo entry (its layouts map sub-model to global positions).
    global_state : mapping of str to numpy.ndarray
        Current full-width parameters.
    updates : sequence of (SubModel, params, weight)
        Each client's sub-model, trained parameters and aggregation weight
        (sample count for FedAvg-style, 1.0 for a plain average).

    Returns
    -------
    Params
        New full-width parameters: ``sum_k w_k * theta_k / sum_k w_k`` over the
        clients ``k`` holding each position; positions nobody held are unchanged.
    """
    out: Params = {}
    for name, tensor in global_state.items():
        acc = np.zeros(tensor.shape, dtype=np.float64)
        weight = np.zeros(tensor.shape, dtype=np.float64)
        for submodel, params, w in updates:
            index = full_index(model, submodel, name, tensor.shape)
            acc[index] += w * np.asarray(params[name], dtype=np.float64)
            weight[index] += w
        held = weight > 0
        new = np.array(tensor, dtype=np.float32, copy=True)
        new[held] = (acc[held] / weight[held]).astype(np.float32)
        out[name] = new
    return out


def holder_counts(
    model: ZooModel, global_state: Mapping[str, np.ndarray], submodels: Sequence[SubModel]
) -> dict[str, np.ndarray]:
    """Return, per parameter, how many of ``submodels`` hold each global position."""
    out: dict[str, np.ndarray] = {}
    for name, tensor in global_state.items():
        count = np.zeros(np.shape(tensor), dtype=np.int64)
        for submodel in submodels:
            count[full_index(model, submodel, name, np.shape(tensor))] += 1
        out[name] = count
    return out


def full_index(
    model: ZooModel, submodel: SubModel, name: str, shape: tuple[int, ...]
) -> tuple[np.ndarray, ...]:
    """Return an ``numpy.ix_`` index of the global positions of sub-model tensor ``name``.

    ``global[full_index(...)]`` has exactly the sub-model tensor's shape and order,
    so ``global[idx] = sub`` scatters and ``global[idx]`` extracts.
    """
    order = {g: i for i, g in enumerate(model.group_names)}
    per_dim = tensor_index(model.layouts[name], submodel, order, model.group_sizes)
    return np.ix_(*[np.arange(n) if isinstance(p, slice) else p for p, n in zip(per_dim, shape, strict=True)])
