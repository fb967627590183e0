"""FedDrop's FLOPs-budget ratio per device from its fitted latency line (pure functions).

The per-image time budget ``t = (round_time_budget_s - overhead_s) / (examples * epochs)``
solved on the device's fitted line ``a + b * F = t`` (`harness.latency.fit`) gives the
affordable training FLOPs per example ``F``; the budget ratio is ``r = F / flops(dense)``,
clamped to (0, 1]. The ratio assumes that fewer FLOPs take proportionally less time on the
line, which holds for width-sliced sub-models. FedDrop's SyncDrop masks fed to a dense graph
save no time without sparse kernels (see DESIGN.md): the ratio is then the *expected FLOPs*
budget of eq. 5, not a measured time.

Profiles are rows in any form `fl.scheduling.rows.profile_rows` accepts.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from exporters.errors import InputError
from fl.scheduling.checks import count, overhead, positive
from fl.scheduling.rows import Rows, profile_rows, select, width_flops
from harness.latency import fit, usable_rows


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
        Solution ``F`` of ``a + b * F = per_image_budget_us`` (may exceed the dense FLOPs).
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
    a, b = latency.intercept_us, latency.slope_us_per_flop
    smallest = min(width_flops(model, float(r["width"]), rows) for r in mine)
    smallest_fits = latency.predict(smallest) <= per_image_us
    if b <= 0:  # a flat (or falling) fit: time does not depend on FLOPs
        fits = a <= per_image_us
        note = "fitted latency does not grow with FLOPs" + ("" if fits else f"; intercept {a:.4g} us > budget")
        return BudgetRatio(device, 1.0 if fits else None, math.inf if fits else None, dense, per_image_us, fits, note)
    affordable = (per_image_us - a) / b
    if affordable <= 0:
        note = f"fixed per-image cost {a:.4g} us alone exceeds the per-image budget {per_image_us:.4g} us"
        return BudgetRatio(device, None, affordable, dense, per_image_us, False, note)
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
