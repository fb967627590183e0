"""Latency and memory models: exact recovery, constrained intercept, fallback, leave-one-out."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from harness import latency
from harness.latency import (
    BYTES_PER_PARAM,
    LatencyModel,
    MemoryModel,
    fit,
    fit_device,
    fit_line,
    footprint_bytes,
    leave_one_out_error,
    predict,
    train_flops_per_example,
)

WIDTHS = (0.25, 0.5, 0.75, 1.0)
FLOPS = {0.25: 3.1e5, 0.5: 8.8e5, 0.75: 1.6e6, 1.0: 2.67e6}


def _rows(a: float, b: float, device: str = "pi", noise: float = 0.0, seed: int = 0) -> list[dict[str, object]]:
    rng = np.random.default_rng(seed)
    out = []
    for w in WIDTHS:
        lat = (a + b * FLOPS[w]) * (1 + noise * rng.standard_normal())
        out.append(
            {
                "device": device,
                "model": "m",
                "width": w,
                "batch": 20,
                "backend": "ort",
                "status": "ok",
                "median_us": lat,
                "p95_us": lat * 1.1,
                "train_flops": FLOPS[w],
            }
        )
    return out


def test_fit_recovers_known_intercept_and_slope() -> None:
    a, b = 42.0, 7.5e-4
    models = fit(_rows(a, b))
    lat = models["pi"].latency[("m", 20, "ort")]
    assert lat.kind == "affine" and lat.n_points == 4 and lat.widths == WIDTHS
    assert lat.intercept_us == pytest.approx(a, abs=1e-6)
    assert lat.slope_us_per_flop == pytest.approx(b, abs=1e-6)
    assert lat.predict(1.2e6) == pytest.approx(a + b * 1.2e6, rel=1e-9)


def test_dataframe_rows_and_failed_cells_ignored() -> None:
    rows = _rows(10.0, 1e-3)
    rows.append({**rows[0], "status": "failed", "median_us": 1e9})
    rows.append({**rows[1], "median_us": float("nan")})
    dm = fit_device(pd.DataFrame(rows))
    lat = dm.latency[dm.key("m")]
    assert lat.intercept_us == pytest.approx(10.0, abs=1e-6)
    assert lat.slope_us_per_flop == pytest.approx(1e-3, abs=1e-9)


def test_negative_intercept_is_constrained_to_zero() -> None:
    a, b, kind = fit_line([1.0, 2.0, 3.0], [0.5, 2.0, 3.5])  # OLS: -1 + 1.5 x
    assert (a, kind) == (0.0, "affine")
    assert b == pytest.approx((0.5 + 4.0 + 10.5) / 14.0)


def test_proportional_fallback_with_one_width() -> None:
    rows = [r for r in _rows(0.0, 2e-3) if r["width"] == 0.5]
    lat = fit_device(rows).latency[("m", 20, "ort")]
    assert lat.kind == "proportional" and lat.intercept_us == 0.0
    assert lat.slope_us_per_flop == pytest.approx(2e-3)
    assert lat.predict(1e6) == pytest.approx(2000.0)


def test_fit_line_rejects_empty_and_zero_input() -> None:
    with pytest.raises(ValueError):
        fit_line([], [])
    with pytest.raises(ValueError):
        fit_line([0.0, 0.0], [1.0, 2.0])


def test_memory_model_recovers_base_and_scale() -> None:
    c, d = 80e6, 1.3
    params = {0.25: 6496, 0.5: 13290, 0.75: 20000, 1.0: 26227}
    acts = {0.25: 8735, 0.5: 17408, 0.75: 26000, 1.0: 34487}
    rows = _rows(1.0, 1e-3)
    for r in rows:
        w = float(r["width"])  # type: ignore[arg-type]
        r["params"], r["activation_elements"] = params[w], acts[w]
        r["peak_memory_bytes"] = c + d * (params[w] * BYTES_PER_PARAM + acts[w] * 20 * 4)
    mem = fit(rows)["pi"].memory[("m", 20, "ort")]
    assert isinstance(mem, MemoryModel) and mem.batch == 20
    assert mem.base_bytes == pytest.approx(c, rel=1e-9)
    assert mem.scale == pytest.approx(d, rel=1e-9)
    fp = footprint_bytes(15000, 20000, 20)
    assert fp == 15000 * 16 + 20000 * 20 * 4
    assert mem.predict(fp) == pytest.approx(c + d * fp, rel=1e-9)


def test_leave_one_out_matches_an_independent_refit() -> None:
    rows = _rows(30.0, 8e-4, noise=0.05, seed=3)
    rows += _rows(5.0, 2e-3, device="phone", noise=0.02, seed=4)
    reports = leave_one_out_error(rows)
    assert set(reports) == {"pi", "phone"}
    rep = reports["pi"]
    assert [p.width for p in rep.points] == list(WIDTHS)
    # independent check for width 0.5: plain least squares on the other three widths
    others = [r for r in rows if r["device"] == "pi" and r["width"] != 0.5]
    b, a = np.polyfit([FLOPS[float(r["width"])] for r in others], [float(r["median_us"]) for r in others], 1)  # type: ignore[arg-type]
    assert a >= 0  # the constraint is not active here, so polyfit is the same estimator
    measured = next(float(r["median_us"]) for r in rows if r["device"] == "pi" and r["width"] == 0.5)  # type: ignore[arg-type]
    expected = (a + b * FLOPS[0.5] - measured) / measured
    point = next(p for p in rep.points if p.width == 0.5)
    assert point.measured_us == pytest.approx(measured)
    assert point.relative_error == pytest.approx(expected, rel=1e-9)
    assert rep.median_abs_error == pytest.approx(float(np.median([abs(p.relative_error) for p in rep.points])))
    assert 0 < rep.median_abs_error < 0.3
    assert "median |error|" in latency.format_loo(reports)


def test_leave_one_out_needs_two_widths() -> None:
    rows = [r for r in _rows(1.0, 1e-3) if r["width"] == 1.0]
    rep = leave_one_out_error(rows)["pi"]
    assert rep.points == () and math.isnan(rep.median_abs_error)


def test_predict_unmeasured_width_from_zoo_counts() -> None:
    from exporters.arch import DEFAULT_MODEL
    from exporters.zoo import get_model

    model = get_model(DEFAULT_MODEL)
    a, b = 50.0, 6e-4
    rows = [
        {
            "device": "pi",
            "model": DEFAULT_MODEL,
            "width": w,
            "batch": 20,
            "backend": "ort",
            "status": "ok",
            "median_us": a + b * train_flops_per_example(DEFAULT_MODEL, w),
        }
        for w in (0.25, 0.5, 1.0)
    ]
    models = fit(rows)
    arch = model.arch(0.75)
    flops = train_flops_per_example(DEFAULT_MODEL, 0.75)
    assert predict(models, "pi", arch) == pytest.approx(a + b * flops, rel=1e-9)
    assert isinstance(models["pi"].latency[(DEFAULT_MODEL, 20, "ort")], LatencyModel)
    with pytest.raises(KeyError):
        predict(models, "pi", arch, batch=32)
