"""How well the latency models predict a width they did not see: leave one width out (pure).

`leave_one_out_error` refits each device's models without one measured width at a time and
compares the prediction with the measurement; `format_loo` prints the table.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from harness.latency import ProfileRows, cell_latency_us, fit_config, group_rows, row_sizes, usable_rows

if TYPE_CHECKING:
    from exporters.arch import Arch

# ---------------------------------------------------------------------------- validation


@dataclass(frozen=True)
class LooPoint:
    """One left-out width.

    Attributes
    ----------
    model : str
    batch : int
    backend : str
    width : float
    predicted_us, measured_us : float
        Prediction of the model refitted without this width; median of its measured rows.
    predicted_std_us : float
        The refitted model's standard deviation at this width.
    relative_error : float
        ``(predicted - measured) / measured``.
    extrapolated : bool
        The width lay outside the other measured widths.
    """

    model: str
    batch: int
    backend: str
    width: float
    predicted_us: float
    measured_us: float
    relative_error: float
    predicted_std_us: float = math.nan
    extrapolated: bool = False


@dataclass(frozen=True)
class LooReport:
    """Leave-one-width-out validation of one device.

    Attributes
    ----------
    device : str
    points : tuple of LooPoint
    median_abs_error : float
        Median of ``|relative_error|`` over ``points`` (NaN when there is none: a
        configuration needs at least two measured widths).
    max_abs_error : float
        Largest ``|relative_error|`` (NaN when there is none).
    """

    device: str
    points: tuple[LooPoint, ...]
    median_abs_error: float
    max_abs_error: float = math.nan


def leave_one_out_error(rows: ProfileRows) -> dict[str, LooReport]:
    """Measure prediction error by refitting each configuration without one width at a time.

    Parameters
    ----------
    rows : iterable of mapping or pandas.DataFrame

    Returns
    -------
    dict of str to LooReport
        Per device: each left-out width's prediction (with its uncertainty), measured
        median and relative error, and the median and largest absolute error.
    """
    out: dict[str, LooReport] = {}
    for device, groups in group_rows(usable_rows(rows)).items():
        points: list[LooPoint] = []
        for key, group in sorted(groups.items()):
            widths = sorted({float(r["width"]) for r in group})
            if len(widths) < 2:
                continue
            for w in widths:
                held = [r for r in group if float(r["width"]) == w]
                rest = [r for r in group if float(r["width"]) != w]
                lat, _ = fit_config(device, key, rest)
                estimate = lat.predict_flops(float(held[0]["train_flops"])) if not lat.zoo else lat.predict(
                    _held_arch(held[0])
                )
                measured = float(np.median([cell_latency_us(r) for r in held]))
                predicted = estimate.value * 1e6
                points.append(
                    LooPoint(
                        key[0], key[1], key[2], w, predicted, measured, (predicted - measured) / measured,
                        estimate.std * 1e6, estimate.extrapolated,
                    )  # fmt: skip
                )
        errors = [abs(p.relative_error) for p in points]
        med = float(np.median(errors)) if errors else math.nan
        worst = float(np.max(errors)) if errors else math.nan
        out[device] = LooReport(device, tuple(points), med, worst)
    return out


def _held_arch(r: Mapping[str, Any]) -> Arch | float:
    from exporters.arch import Arch

    widths = row_sizes(r)
    return Arch(str(r["model"]), widths) if widths else float(r["width"])


def format_loo(reports: Mapping[str, LooReport]) -> str:
    """Render `leave_one_out_error` output as a plain-text table.

    Parameters
    ----------
    reports : dict of str to LooReport

    Returns
    -------
    str
    """
    lines = [
        f"{'device':<16} {'model':<16} {'batch':>5} {'backend':<8} {'width':>6} "
        f"{'pred_us':>10} {'+-std':>8} {'meas_us':>10} {'err':>7}"
    ]
    for device, rep in sorted(reports.items()):
        for p in rep.points:
            lines.append(
                f"{device:<16} {p.model:<16} {p.batch:>5} {p.backend:<8} {p.width:>6.3g} "
                f"{p.predicted_us:>10.1f} {p.predicted_std_us:>8.1f} {p.measured_us:>10.1f} {p.relative_error:>+7.1%}"
            )
        lines.append(f"{device:<16} median |error| {rep.median_abs_error:.1%}, max {rep.max_abs_error:.1%}")
    return "\n".join(lines)


