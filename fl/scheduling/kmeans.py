"""Exact 1-D k-means (pure).

Tiers group the widths chosen by the devices (`fl.scheduling.tiers`). Lloyd's algorithm
depends on its start and may stop at a local optimum; in one dimension the optimal
clustering is contiguous in sorted order, so dynamic programming over the sorted distinct
values finds it exactly in O(k m^2) for m distinct values, which is small here (one value
per candidate width).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from exporters.userinput import InputError
from fl.scheduling.checks import count


def kmeans_1d(values: Sequence[float], k: int) -> tuple[int, ...]:
    """Cluster 1-D values into at most ``k`` contiguous groups minimising the within-group SSE.

    Exact, by dynamic programming over the sorted distinct values weighted by their
    multiplicity (equal values always share a group): ``D[c][j]`` = least SSE of the
    first ``j`` distinct values in ``c`` groups, ``D[c][j] = min_i D[c-1][i] + SSE(i..j-1)``.
    Ties go to the smallest split index, so the result is deterministic.

    Parameters
    ----------
    values : sequence of float
        Values to cluster (any order).
    k : int
        Number of groups wanted (>= 1); ``min(k, distinct values)`` are formed.

    Returns
    -------
    tuple of int
        Group of each value in input order, 0 = the group of the largest values.

    Raises
    ------
    InputError
        If ``k < 1`` or a value is not finite.
    """
    wanted = count(k, "k")
    xs = [float(v) for v in values]
    if not xs:
        return ()
    if not all(math.isfinite(v) for v in xs):
        raise InputError(f"values to cluster must be finite; got {xs}")
    distinct = sorted(set(xs))
    m = len(distinct)
    groups = min(wanted, m)
    weight = np.array([xs.count(v) for v in distinct], dtype=float)
    x = np.array(distinct)
    cw = np.concatenate([[0.0], np.cumsum(weight)])
    cx = np.concatenate([[0.0], np.cumsum(weight * x)])
    cxx = np.concatenate([[0.0], np.cumsum(weight * x * x)])

    def sse(i: int, j: int) -> float:  # distinct values i..j-1
        w, s, ss = cw[j] - cw[i], cx[j] - cx[i], cxx[j] - cxx[i]
        return max(0.0, float(ss - s * s / w))

    cost = np.full((groups + 1, m + 1), np.inf)
    split = np.zeros((groups + 1, m + 1), dtype=int)
    cost[0][0] = 0.0
    for c in range(1, groups + 1):
        for j in range(c, m + 1):
            for i in range(c - 1, j):
                candidate = cost[c - 1][i] + sse(i, j)
                if candidate < cost[c][j] - 1e-15:
                    cost[c][j], split[c][j] = candidate, i
    # Walk the splits back: group index counted from the smallest values.
    label_of_distinct = [0] * m
    j = m
    for c in range(groups, 0, -1):
        i = int(split[c][j])
        for t in range(i, j):
            label_of_distinct[t] = groups - c  # the last group (largest values) gets 0
        j = i
    index = {v: label_of_distinct[t] for t, v in enumerate(distinct)}
    return tuple(index[v] for v in xs)
