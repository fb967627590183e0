"""FedDrop's FLOPs-budget ratio per device from the round-cost model (a pure function).

A device's budget ratio ``r`` is the fraction of the dense model's training FLOPs per example
whose predicted whole round meets the round deadline (`fl.plan`: fixed cost, local steps at the
architecture, the dense model's transfers, since SyncDrop sends the dense model). The
affordable FLOPs are found by bisection over the uniform widths ``k / K`` (``K`` the widest
layer's neurons; the prediction grows with the width, as every coefficient of the latency model
is non-negative) and interpolated linearly in FLOPs between the two widths around the deadline.
FedDrop's SyncDrop masks fed to a dense graph save no time without sparse kernels: the ratio is
the *expected FLOPs* budget of FedDrop's eq. 5, not a measured time.
"""

from __future__ import annotations

from collections.abc import Callable

from fl.scheduling.checks import positive


def round_budget_ratio(
    round_at: Callable[[float], float],
    flops_at: Callable[[float], float],
    deadline_s: float,
    top: int,
    *,
    limit: str = "deadline",
    unit: str = "s",
) -> tuple[float | None, str]:
    """Return the FLOPs budget ratio whose predicted whole round meets ``deadline_s``, and a note.

    The planner's form of `flops_budget_ratio`: the round is the round-cost model's (fixed
    cost, local steps at the architecture, the dense model's transfers), not a per-image
    budget. The widths searched are ``k / top`` for ``k = 1..top`` (one more neuron in the
    widest layer each); the ratio interpolates FLOPs linearly between the two widths around
    the deadline and is clamped to (0, 1].

    Parameters
    ----------
    round_at : callable
        ``width -> seconds``: the predicted round at a uniform width (non-decreasing).
    flops_at : callable
        ``width -> training FLOPs per example``.
    deadline_s : float
    top : int
        Neurons of the model's widest layer.
    limit, unit : str
        What ``deadline_s`` limits and its unit, for the note: the energy budget of a round
        is searched the same way, with ``round_at`` its predicted joules (``"energy budget"``, ``"J"``).

    Returns
    -------
    ratio : float or None
        None when even one neuron per layer misses the deadline.
    note : str
        Why there is no ratio, or that the dense model fits ("" otherwise).
    """
    deadline = positive(deadline_s, "deadline_s")
    dense = flops_at(1.0)
    if round_at(1.0) <= deadline:
        return 1.0, f"the dense model meets the {limit}"
    if round_at(1 / top) > deadline:
        least = round_at(1 / top)
        return None, f"even one neuron per layer takes {least:.3g} {unit}, over the {limit} {deadline:.3g} {unit}"
    lo, hi = 1, top  # round(lo) <= deadline < round(hi)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if round_at(mid / top) <= deadline else (lo, mid)
    lo_s, hi_s = round_at(lo / top), round_at(hi / top)
    lo_f, hi_f = flops_at(lo / top), flops_at(hi / top)
    affordable = lo_f + (deadline - lo_s) / (hi_s - lo_s) * (hi_f - lo_f) if hi_s > lo_s else lo_f
    return min(1.0, max(affordable / dense, 0.0)), ""
