"""Exact 1-D k-means (fl/scheduling/kmeans.py), against clusterings worked by hand."""

from __future__ import annotations

import pytest

from exporters.userinput import InputError
from fl.scheduling.kmeans import kmeans_1d


def test_kmeans_1d_is_exact_and_deterministic() -> None:
    # {0.1, 0.2, 0.3} | {0.9, 1.0}: SSE 0.02 + 0.005; {0.1, 0.2} | {0.3, 0.9, 1.0} costs 0.005 + 0.2867.
    assert kmeans_1d([0.3, 1.0, 0.1, 0.9, 0.2], 2) == (1, 0, 1, 0, 1)
    # A weighted value: three copies of 0.5 pull the split; {0.1} | {0.5 x3, 0.6}: SSE 0.0075.
    assert kmeans_1d([0.1, 0.5, 0.5, 0.5, 0.6], 2) == (1, 0, 0, 0, 0)
    assert kmeans_1d([0.4, 0.4], 3) == (0, 0)
    assert kmeans_1d([0.2, 0.8], 1) == (0, 0)
    # Tie: {0, 1} splits at either gap of {0, 0.5, 1} with equal SSE; the earlier split wins.
    assert kmeans_1d([0.0, 0.5, 1.0], 2) == (1, 0, 0)
    assert kmeans_1d([], 2) == ()
    with pytest.raises(InputError):
        kmeans_1d([0.5], 0)
