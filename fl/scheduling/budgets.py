"""FedDrop's FLOPs-budget ratio per device from its fitted latency model (pure functions).

The per-image time budget ``t = (round_time_budget_s - overhead_s) / (examples * epochs)``
(``overhead_s`` per device: the predicted round without training, fixed cost and the dense
model's transfers, `fl.roundcost.round_overheads`, so the budget is one of the whole round)
is solved on the device's latency model (`harness.latency`): the affordable training FLOPs
per example ``F`` are those of the widest uniform width whose predicted time is ``t``, found
by bisection over the architectures of the model (``ceil(r * K)`` neurons per layer, so at
most ``K`` distinct ones for the widest layer ``K``; the prediction grows with the width, as
every coefficient of the model is non-negative) and interpolated linearly in FLOPs between
the two neighbouring architectures. For a model outside the zoo the model is the line
``a + b * F`` and is solved directly. The budget ratio is ``r = F / flops(dense)``, clamped
to (0, 1]. FedDrop's SyncDrop masks fed to a dense graph save no time without sparse kernels
(see DESIGN.md): the ratio is then the *expected FLOPs* budget of eq. 5, not a measured time.

Profiles are rows in any form `fl.scheduling.rows.profile_rows` accepts.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from exporters.errors import InputError
from fl.scheduling.checks import count, overhead, positive
from fl.scheduling.rows import Rows, predicted_latency, profile_rows, select, width_flops
from harness.latency import LatencyModel, fit, usable_rows


@dataclass(frozen=True)
class BudgetRatio:
    """The FLOPs budget ratio a device affords in a round time budget.

    Attributes
    ----------
    device : str
    ratio : float or None
        ``r`` in (0, 1]: affordable over dense training FLOPs per example; ``None`` when
        nothing fits (the fitted intercept alone exceeds the per-image budget) or the
        device has no usable profile.
    affordable_flops : float or None
        Training FLOPs per example whose predicted time is the per-image budget (may exceed
        the dense FLOPs, extrapolated linearly beyond them).
    dense_flops : float
        Training FLOPs per example of the full-width model.
    per_image_budget_us : float
        ``1e6 * (round_time_budget_s - overhead_s) / (examples * epochs)``.
    smallest_measured_fits : bool
        Whether the smallest measured width fits in the budget; when False, a positive
        ``ratio`` is an extrapolation below every measured width.
    note : str
        Human-readable explanation when ``ratio`` is None, clamped or extrapolated.
    """

    device: str
    ratio: float | None
    affordable_flops: float | None
    dense_flops: float
    per_image_budget_us: float
    smallest_measured_fits: bool
    note: str = ""


def flops_budget_ratio(
    profiles: Rows,
    device: str,
    model: str,
    round_time_budget_s: float,
    examples: int,
    epochs: int,
    *,
    batch: int | None = None,
    backend: str = "ort",
    round_overhead_s: float = 0.0,
) -> BudgetRatio:
    """Return the fraction of dense training FLOPs ``device`` can afford in the round time budget.

    Parameters
    ----------
    profiles : DataFrame, rows or ``{device: rows}``
    device : str
    model : str
    round_time_budget_s : float
        Seconds a round may take on the device.
    examples : int
        Local training examples.
    epochs : int
        Local epochs.
    batch : int, optional
        Profile batch size (needed when the device was measured at several).
    backend : str
    round_overhead_s : float
        Fixed per-round cost subtracted from the budget before solving.

    Returns
    -------
    BudgetRatio
        See the module docstring for the equation; ``ratio = min(1, F / dense)``.

    Raises
    ------
    InputError
        On a non-positive budget, examples or epochs.
    """
    budget = positive(round_time_budget_s, "round_time_budget_s")
    examples = count(examples, "examples")
    epochs = count(epochs, "epochs")
    fixed = overhead(round_overhead_s, device)
    rows = select(profile_rows(profiles), model=model, backend=backend)
    dense = width_flops(model, 1.0, rows)
    per_image_us = 1e6 * (budget - fixed) / (examples * epochs)
    mine = select(usable_rows(rows), device=device, batch=batch)
    if not mine:
        return BudgetRatio(device, None, None, dense, per_image_us, False, f"no usable profile of {model} on {device}")
    try:
        dm = fit(mine)[device]
        latency = dm.latency[dm.key(model, batch, backend)]
    except KeyError as exc:
        raise InputError(str(exc.args[0])) from None
    smallest_width = min(float(r["width"]) for r in mine)
    smallest = width_flops(model, smallest_width, rows)
    smallest_fits = _us(latency, model, smallest_width, rows) <= per_image_us
    solved = _affordable(latency, model, per_image_us, dense, rows)
    if isinstance(solved, str):
        return BudgetRatio(device, None, None, dense, per_image_us, False, solved)
    affordable = solved
    ratio = min(1.0, affordable / dense)
    note = ""
    if ratio == 1.0 and affordable > dense:
        note = f"dense model fits ({affordable / dense:.3g}x the dense FLOPs affordable); clamped to 1"
    elif not smallest_fits:
        note = (
            f"even the smallest measured width ({smallest:.4g} FLOPs) does not fit; "
            f"ratio {ratio:.3g} is extrapolated below the measured range"
        )
    return BudgetRatio(device, ratio, affordable, dense, per_image_us, smallest_fits, note)


def _us(latency: LatencyModel, model: str, width: float, rows: Sequence[Mapping[str, Any]]) -> float:
    return predicted_latency(latency, model, width, rows).value * 1e6


def _affordable(
    latency: LatencyModel, model: str, per_image_us: float, dense: float, rows: Sequence[Mapping[str, Any]]
) -> float | str:
    """Training FLOPs per example whose predicted time is ``per_image_us``, or why there are none."""
    if not latency.zoo:
        a, b = latency.fit.coef[0] * 1e6, latency.fit.coef[1] * 1e6
        if b <= 0:
            flat = f"fitted latency does not grow with FLOPs; intercept {a:.4g} us > budget"
            return math.inf if a <= per_image_us else flat
        if a >= per_image_us:
            return f"fixed per-image cost {a:.4g} us alone exceeds the per-image budget {per_image_us:.4g} us"
        return (per_image_us - a) / b
    from exporters.zoo import get_model

    top = max(get_model(model).arch(1.0).widths)
    rate = [k / top for k in range(top + 1)]  # rate[k]: the width whose widest layer keeps k neurons

    def cost(k: int) -> tuple[float, float]:
        return _us(latency, model, rate[k], rows), width_flops(model, rate[k], rows)

    low_us, low_flops = cost(1)
    if low_us > per_image_us:
        return (
            f"fixed per-image cost: even one neuron per layer takes {low_us:.4g} us, "
            f"more than the per-image budget {per_image_us:.4g} us"
        )
    high_us, high_flops = cost(top)
    if high_us <= per_image_us:  # the dense model fits: extend along the widest step
        below_us, below_flops = cost(top - 1) if top > 1 else (0.0, 0.0)
        slope = (high_us - below_us) / (high_flops - below_flops) if high_flops > below_flops else 0.0
        return high_flops + (per_image_us - high_us) / slope if slope > 0 else math.inf
    lo, hi = 1, top  # predicted(lo) <= budget < predicted(hi)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if cost(mid)[0] <= per_image_us:
            lo = mid
        else:
            hi = mid
    (lo_us, lo_flops), (hi_us, hi_flops) = cost(lo), cost(hi)
    return lo_flops + (per_image_us - lo_us) / (hi_us - lo_us) * (hi_flops - lo_flops) if hi_us > lo_us else lo_flops


def budgets_for_fleet(
    profiles: Rows,
    model: str,
    round_time_budget_s: float,
    examples_per_round: Mapping[str, int],
    epochs: int,
    *,
    batch: int | None = None,
    backend: str = "ort",
    round_overhead_s: float | Mapping[str, float] = 0.0,
) -> dict[str, BudgetRatio]:
    """Return `flops_budget_ratio` for every device of ``examples_per_round``.

    Parameters
    ----------
    profiles : DataFrame, rows or ``{device: rows}``
    model : str
    round_time_budget_s : float
    examples_per_round : mapping of str to int
        Local examples per device; its keys are the devices returned.
    epochs : int
    batch : int, optional
    backend : str
    round_overhead_s : float or mapping of str to float
        One fixed cost for all devices or one per device (missing: 0).

    Returns
    -------
    dict of str to BudgetRatio
        Sorted by device name.
    """
    rows = profile_rows(profiles)
    return {
        device: flops_budget_ratio(
            rows,
            device,
            model,
            round_time_budget_s,
            examples_per_round[device],
            epochs,
            batch=batch,
            backend=backend,
            round_overhead_s=overhead(round_overhead_s, device),
        )
        for device in sorted(examples_per_round)
    }


def round_budget_ratio(
    round_at: Callable[[float], float], flops_at: Callable[[float], float], deadline_s: float, top: int
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
        return 1.0, "the dense model meets the deadline"
    if round_at(1 / top) > deadline:
        return None, f"even one neuron per layer takes {round_at(1 / top):.3g} s, over the deadline {deadline:.3g} s"
    lo, hi = 1, top  # round(lo) <= deadline < round(hi)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if round_at(mid / top) <= deadline else (lo, mid)
    lo_s, hi_s = round_at(lo / top), round_at(hi / top)
    lo_f, hi_f = flops_at(lo / top), flops_at(hi / top)
    affordable = lo_f + (deadline - lo_s) / (hi_s - lo_s) * (hi_f - lo_f) if hi_s > lo_s else lo_f
    return min(1.0, max(affordable / dense, 0.0)), ""
