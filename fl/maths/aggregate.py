"""Aggregation of sub-model parameters into the global model (pure functions).

Every method of this project aggregates *per weight over the clients that held
it*: FjORD's nested average (paper eq. 1) weighted by sample counts, FedRolex's
selective average (eq. 10, unweighted), HeteroFL's, FLuID's count-aware FedAvg
and Coded FD's per-weight average. `selective_average` is that one rule; the
strategies choose the weights. A weight no client held keeps its global value.

How it stays fast (100 ResNet18 sub-models in well under two seconds, see
``tests/bench/fl_aggregate.py``): per parameter, updates whose sub-models hold the
same positions are summed first (one weighted sum per distinct index set: at most one
per width for static and rolling extraction), and each sum is scattered once. A
sub-model's positions along a dimension are split into runs of consecutive global
positions, so a prefix (static), a wrapped window (rolling: two runs), a flatten
block or LSTM gate blocks scatter through plain slices; only index sets with many
runs (random extraction) fall back to ``numpy.ix_`` fancy indexing. Sums and
denominators are accumulated in float64.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from exporters.arch import Dim, ParamLayout, SubModel, expand_indices, tensor_index
from exporters.userinput import InputError
from exporters.zoo import ZooModel
from fl.records import Params, TrainRes

#: Above this many slice blocks per tensor, scatter through ``numpy.ix_`` instead.
MAX_SLICE_BLOCKS = 64

#: One run of consecutive positions along a dimension: (start in the sub-model
#: tensor, start in the global tensor, length).
_Run = tuple[int, int, int]


@dataclass(frozen=True)
class _Scatter:
    """Where a sub-model tensor lands in its global tensor.

    Either ``blocks`` (pairs of sub-model and global slice tuples) or, when the
    positions are too fragmented, ``fancy`` (an ``numpy.ix_`` index of the global
    positions in the sub-model tensor's order).
    """

    shape: tuple[int, ...]
    blocks: tuple[tuple[tuple[slice, ...], tuple[slice, ...]], ...] | None
    fancy: tuple[np.ndarray, ...] | None


class _Sum:
    """A running weighted sum of the updates that hold the same positions of one tensor."""

    def __init__(self, scatter: _Scatter) -> None:
        self.scatter = scatter
        self.total: np.ndarray | None = None
        self.weight = 0.0

    def add(self, value: np.ndarray, w: float) -> None:
        """Add ``w * value`` (in float64)."""
        if self.total is None:
            self.total = np.multiply(value, w, dtype=np.float64)
        elif w == 1.0:
            self.total += value
        else:
            self.total += np.multiply(value, w, dtype=np.float64)
        self.weight += w


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
        (sample count for FedAvg-style, 1.0 for a plain average). A weight must be
        >= 0; an update of weight 0 holds nothing.

    Returns
    -------
    Params
        New full-width parameters: ``sum_k w_k * theta_k / sum_k w_k`` over the
        clients ``k`` holding each position; positions nobody held are unchanged.

    Raises
    ------
    InputError
        If a weight is negative or not finite, or an update's tensor has the wrong shape.
    """
    for _, _, w in updates:
        if not np.isfinite(w) or w < 0:
            raise InputError(f"aggregation weight {w!r} must be finite and >= 0")
    active = [(sub, params, float(w)) for sub, params, w in updates if w > 0]
    plan = _Planner(model, [sub for sub, _, _ in active])
    out: Params = {}
    for name, tensor in global_state.items():
        shape = tuple(np.shape(tensor))
        layout = model.layouts[name]
        # one weighted sum per distinct index set of this tensor
        sums: dict[tuple[object, ...], _Sum] = {}
        for u, (_, params, w) in enumerate(active):
            key = plan.key(u, layout)
            value = np.asarray(params[name])
            entry = sums.get(key)
            if entry is None:
                entry = _Sum(plan.scatter(u, layout, shape))
                sums[key] = entry
            if value.shape != entry.scatter.shape:
                raise InputError(f"update {u}: {name!r} has shape {value.shape}, its sub-model {entry.scatter.shape}")
            entry.add(value, w)
        new = np.array(tensor, dtype=np.float32, copy=True)
        if not sums:
            out[name] = new
            continue
        total = np.zeros(shape, dtype=np.float64)
        weight = np.zeros(shape, dtype=np.float64)
        for entry in sums.values():
            assert entry.total is not None
            _scatter_add(total, weight, entry.total, entry.weight, entry.scatter)
        held = weight > 0
        np.divide(total, weight, out=total, where=held)
        np.copyto(new, total, casting="same_kind", where=held)
        out[name] = new
    return out


def updates_from_results(
    results: Sequence[TrainRes], weighted: bool
) -> list[tuple[SubModel, Mapping[str, np.ndarray], float]]:
    """Turn client results into `selective_average` updates.

    Parameters
    ----------
    results : sequence of TrainRes
    weighted : bool
        Weight each client by its example count (FedAvg, FjORD eq. 1) or by 1
        (FedRolex eq. 10: a plain per-weight average over holders).

    Returns
    -------
    list of (SubModel, params, weight)
    """
    return [(r.submodel, r.parameters, float(r.num_examples) if weighted else 1.0) for r in results]


def holder_counts(
    model: ZooModel, global_state: Mapping[str, np.ndarray], submodels: Sequence[SubModel]
) -> dict[str, np.ndarray]:
    """Return, per parameter, how many of ``submodels`` hold each global position."""
    plan = _Planner(model, list(submodels))
    out: dict[str, np.ndarray] = {}
    for name, tensor in global_state.items():
        shape = tuple(np.shape(tensor))
        layout = model.layouts[name]
        count = np.zeros(shape, dtype=np.float64)
        for u in range(len(submodels)):
            _scatter_add(None, count, None, 1.0, plan.scatter(u, layout, shape))
        out[name] = count.astype(np.int64)
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


def runs(positions: np.ndarray) -> list[_Run]:
    """Split increasing positions into runs of consecutive values.

    Parameters
    ----------
    positions : numpy.ndarray
        Strictly increasing int positions.

    Returns
    -------
    list of (int, int, int)
        ``(offset in positions, first position, length)`` per run; ``[2, 3, 4, 9]``
        gives ``[(0, 2, 3), (3, 9, 1)]``.
    """
    if positions.size == 0:
        return []
    breaks = np.flatnonzero(np.diff(positions) != 1) + 1
    starts = np.concatenate(([0], breaks))
    ends = np.concatenate((breaks, [positions.size]))
    return [(int(s), int(positions[s]), int(e - s)) for s, e in zip(starts, ends, strict=True)]


def _scatter_add(
    total: np.ndarray | None, weight: np.ndarray, values: np.ndarray | None, w: float, scatter: _Scatter
) -> None:
    """Add ``values`` into ``total`` and ``w`` into ``weight`` at the scatter's positions."""
    if scatter.blocks is not None:
        for sub, glob in scatter.blocks:
            if total is not None and values is not None:
                total[glob] += values[sub]
            weight[glob] += w
    else:
        assert scatter.fancy is not None
        # the positions of one sub-model are distinct, so read-add-write is exact
        if total is not None and values is not None:
            total[scatter.fancy] += values
        weight[scatter.fancy] += w


class _Planner:
    """Per-aggregation cache of index keys and scatters (sub-models are immutable)."""

    def __init__(self, model: ZooModel, submodels: list[SubModel]) -> None:
        self.model = model
        self.submodels = submodels
        self.order = {g: i for i, g in enumerate(model.group_names)}
        self._group_keys: dict[tuple[int, int], bytes] = {}
        self._runs: dict[tuple[int, Dim], tuple[np.ndarray, list[_Run]]] = {}

    def _group_key(self, u: int, g: int) -> bytes:
        key = self._group_keys.get((u, g))
        if key is None:
            key = np.ascontiguousarray(self.submodels[u].indices[g], dtype=np.int64).tobytes()
            self._group_keys[(u, g)] = key
        return key

    def key(self, u: int, layout: ParamLayout) -> tuple[object, ...]:
        """Return a hashable key equal for updates holding the same positions of a tensor."""
        return tuple(None if d is None else (d, self._group_key(u, self.order[d.group])) for d in layout)

    def _dim_runs(self, u: int, dim: Dim) -> tuple[np.ndarray, list[_Run]]:
        found = self._runs.get((u, dim))
        if found is None:
            g = self.order[dim.group]
            positions = expand_indices(self.submodels[u].indices[g], dim, self.model.group_sizes[g])
            found = (positions, runs(positions))
            self._runs[(u, dim)] = found
        return found

    def scatter(self, u: int, layout: ParamLayout, shape: tuple[int, ...]) -> _Scatter:
        """Return where update ``u``'s tensor of this layout lands in a global tensor of ``shape``."""
        if len(layout) != len(shape):
            raise InputError(f"{self.model.name}: layout rank {len(layout)} differs from tensor rank {len(shape)}")
        per_dim: list[tuple[np.ndarray, list[_Run]] | None] = [
            None if d is None else self._dim_runs(u, d) for d in layout
        ]
        sub_shape = tuple(n if p is None else int(p[0].size) for p, n in zip(per_dim, shape, strict=True))
        n_blocks = 1
        for p in per_dim:
            if p is not None:
                n_blocks *= len(p[1])
        if n_blocks <= MAX_SLICE_BLOCKS:
            choices = [
                [(slice(None), slice(None))]
                if p is None
                else [(slice(s, s + n), slice(g, g + n)) for s, g, n in p[1]]
                for p in per_dim
            ]
            blocks = tuple(
                (tuple(c[0] for c in combo), tuple(c[1] for c in combo)) for combo in itertools.product(*choices)
            )
            return _Scatter(sub_shape, blocks, None)
        fancy = np.ix_(*[np.arange(n) if p is None else p[0] for p, n in zip(per_dim, shape, strict=True)])
        return _Scatter(sub_shape, None, fancy)
