"""Latency and memory models: fits on synthetic timings from known coefficients, bounds, uncertainty, leave-one-out.

The leave-one-width-out check (`harness.latency_validation`) is tested here too: it needs these synthetic rows.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from exporters.arch import Arch
from exporters.zoo import get_model
from harness import latency
from harness.arch_counts import FEATURES, arch_counts, latency_features
from harness.latency import (
    FIXED_PRIOR_SD,
    LatencyModel,
    MemoryModel,
    choose_next_width,
    fit,
    fit_device,
    predict,
    predict_memory,
)
from harness.latency_validation import format_loo, leave_one_out_error
from tests.fl.scheduling import profiles as scheduling_profiles

MODEL = "fjord-cnn"
WIDTHS = (0.25, 0.375, 0.5, 0.75, 1.0)
#: Seconds per image per unit of each feature (fixed, conv FLOP, linear or LSTM FLOP, byte moved).
TRUE = np.array([20e-6, 5e-11, 9e-11, 4e-11])


def _truth(arch: Arch | float, batch: int = 20) -> float:
    zoo = get_model(MODEL)
    counts = arch_counts(zoo.arch(arch) if isinstance(arch, float) else arch)
    return float(TRUE @ latency_features(counts, batch))


def _row(width: float, seconds: float, *, device: str = "pi", arch: Arch | None = None, **extra: object) -> dict:
    row: dict[str, object] = {
        "device": device, "model": MODEL, "width": width, "batch": 20, "backend": "ort", "status": "ok",
        "median_us": seconds * 1e6,
    }  # fmt: skip
    if arch is not None:
        row["arch_sizes"] = ",".join(str(w) for w in arch.sizes)
    row.update(extra)
    return row


def _rows(widths: tuple[float, ...] = WIDTHS, noise: float = 0.0, seed: int = 0, device: str = "pi") -> list[dict]:
    rng = np.random.default_rng(seed)
    return [_row(w, _truth(w) * (1 + noise * rng.standard_normal()), device=device) for w in widths]


def test_only_a_zoo_models_fixed_latency_share_gets_the_tighter_prior() -> None:
    zoo = latency.latency_prior_sd(FEATURES)
    assert zoo[FEATURES.index("fixed")] == FIXED_PRIOR_SD
    assert all(sd == latency.PRIOR_SD for name, sd in zip(FEATURES, zoo, strict=True) if name != "fixed")
    assert latency.latency_prior_sd(latency.FLOPS_FEATURES) == [latency.PRIOR_SD] * len(latency.FLOPS_FEATURES)


# --------------------------------------------------------------------------- the latency model


def test_fit_on_synthetic_timings_predicts_unmeasured_and_mixed_architectures() -> None:
    zoo = get_model(MODEL)
    mixed = [Arch(MODEL, (20, 4)), Arch(MODEL, (5, 15)), Arch(MODEL, (10, 12))]
    rows = _rows() + [_row(0.5, _truth(a), arch=a) for a in mixed]
    lat = fit_device(rows).latency_model(MODEL)
    assert lat.zoo and lat.fit.features == FEATURES and lat.n_points == len(rows)
    assert all(c >= 0 for c in lat.fit.coef)
    # a width never measured, and layer widths mixed in proportions never measured
    for arch in (0.625, 0.875, Arch(MODEL, (15, 6)), Arch(MODEL, (8, 15))):
        estimate = lat.predict(arch)
        assert estimate.value == pytest.approx(_truth(arch), rel=0.02), arch
        assert not estimate.extrapolated and estimate.std > 0
    assert predict({"pi": fit_device(rows)}, "pi", zoo.arch(0.6)).value == pytest.approx(_truth(0.6), rel=0.02)


def test_uniform_widths_alone_predict_mixed_widths_within_their_uncertainty() -> None:
    lat = fit_device(_rows()).latency_model(MODEL)
    for arch in (Arch(MODEL, (20, 4)), Arch(MODEL, (5, 15))):
        estimate = lat.predict(arch)
        assert abs(estimate.value - _truth(arch)) <= 3 * estimate.std, (arch, estimate)


def test_extrapolation_far_below_the_measured_widths_says_so_with_a_larger_uncertainty() -> None:
    lat = fit_device(_rows((0.5, 0.75, 1.0))).latency_model(MODEL)
    inside = lat.predict(0.625)
    far = lat.predict(0.0625)
    assert not inside.extrapolated and inside.note == ""
    assert far.extrapolated and "far outside the measured range" in far.note and "%" in far.note
    assert far.relative > 2 * inside.relative


def test_uncertainty_shrinks_where_widths_are_measured() -> None:
    two = fit_device(_rows((0.25, 1.0))).latency_model(MODEL)
    five = fit_device(_rows()).latency_model(MODEL)
    assert five.predict(0.5).relative < two.predict(0.5).relative


def test_noisy_widths_still_predict_within_ten_percent() -> None:
    rows = _rows(noise=0.02, seed=3)
    lat = fit_device(rows).latency_model(MODEL)
    for w in (0.3, 0.625, 0.875):
        assert lat.predict(w).value == pytest.approx(_truth(w), rel=0.10)


def test_a_precise_row_weighs_more_than_an_imprecise_one() -> None:
    rows = _rows()
    wrong = {**rows[2], "median_us": rows[2]["median_us"] * 1.3}
    sloppy = fit_device([*rows[:2], {**wrong, "precision_achieved": 0.5}, *rows[3:]]).latency_model(MODEL)
    sharp = fit_device([*rows[:2], {**wrong, "precision_achieved": 0.001}, *rows[3:]]).latency_model(MODEL)
    truth = _truth(0.5)
    assert abs(sloppy.predict(0.5).value - truth) < abs(sharp.predict(0.5).value - truth)


def test_failed_and_unusable_rows_are_ignored_and_dataframes_accepted() -> None:
    rows = _rows()
    rows.append({**rows[0], "status": "timeout", "median_us": 1e9})
    rows.append({**rows[1], "median_us": float("nan")})
    frame = pd.DataFrame(rows)
    assert fit_device(frame).latency_model(MODEL).n_points == len(WIDTHS)
    with pytest.raises(ValueError, match="2 devices"):
        fit_device(rows + _rows(device="phone"))
    with pytest.raises(KeyError):
        predict(fit(rows), "pi", get_model(MODEL).arch(0.5), batch=32)


def test_a_model_outside_the_zoo_is_a_line_in_training_flops() -> None:
    flops = {0.25: 1e6, 0.5: 2e6, 0.75: 3e6, 1.0: 4e6}
    rows = [
        {"device": "d", "model": "m", "width": w, "batch": 20, "backend": "ort", "median_us": 100 + 1e-4 * f,
         "train_flops": f}
        for w, f in flops.items()
    ]  # fmt: skip
    lat = fit_device(rows).latency_model("m")
    assert not lat.zoo
    # the weak prior pulls exact data by well under 1 %
    assert lat.fixed_us == pytest.approx(100.0, rel=1e-2)
    assert lat.predict_flops(2.5e6).value * 1e6 == pytest.approx(350.0, rel=1e-2)
    with pytest.raises(ValueError, match="not a zoo model"):
        lat.predict(0.5)
    with pytest.raises(ValueError, match="train_flops"):
        fit_device([{k: v for k, v in r.items() if k != "train_flops"} for r in rows])


# --------------------------------------------------------------------------- memory


def test_memory_model_recovers_base_and_scales() -> None:
    base, per_param_byte, per_act_byte = 80e6, 1.5, 1.2
    rows = []
    for w in WIDTHS:
        counts = arch_counts(get_model(MODEL).arch(w))
        peak = base + per_param_byte * 16 * counts.params + per_act_byte * 4 * counts.activations * 20
        rows.append(_row(w, _truth(w), peak_memory_bytes=peak))
    mem = fit_device(rows).memory_model(MODEL)
    assert isinstance(mem, MemoryModel)
    assert mem.base_bytes == pytest.approx(base, rel=0.01)
    arch = Arch(MODEL, (12, 9))
    counts = arch_counts(arch)
    want = base + per_param_byte * 16 * counts.params + per_act_byte * 4 * counts.activations * 20
    assert predict_memory(fit(rows), "pi", arch).value == pytest.approx(want, rel=0.01)
    assert fit_device(_rows()).memory_model(MODEL) is None  # no peak memory measured


# --------------------------------------------------------------------------- choosing widths


def test_choose_next_width_picks_the_most_uncertain_unmeasured_candidate() -> None:
    measured = (0.125, 1.0)
    lat = fit_device(_rows(measured)).latency_model(MODEL)
    candidates = tuple(k / 16 for k in range(2, 17))
    width, score = choose_next_width([lat], candidates, measured)  # type: ignore[misc]
    assert width not in measured
    scores = {w: lat.predict(w).relative for w in candidates if w not in measured}
    assert score == pytest.approx(max(scores.values())) and scores[width] == pytest.approx(score)
    assert choose_next_width([lat], measured, measured) is None


# --------------------------------------------------------------------------- validation


def test_leave_one_out_matches_an_independent_refit() -> None:
    rows = _rows(noise=0.03, seed=5) + _rows(noise=0.03, seed=6, device="phone")
    reports = leave_one_out_error(rows)
    assert set(reports) == {"pi", "phone"}
    rep = reports["pi"]
    assert [p.width for p in rep.points] == list(WIDTHS)
    held = next(r for r in rows if r["device"] == "pi" and r["width"] == 0.5)
    refit = fit_device([r for r in rows if r["device"] == "pi" and r["width"] != 0.5]).latency_model(MODEL)
    point = next(p for p in rep.points if p.width == 0.5)
    assert point.measured_us == pytest.approx(held["median_us"])
    assert point.predicted_us == pytest.approx(refit.predict(0.5).value * 1e6)
    assert point.predicted_std_us == pytest.approx(refit.predict(0.5).std * 1e6)
    assert [p.extrapolated for p in rep.points] == [True, False, False, False, True]  # the ends lie outside
    errors = [abs(p.relative_error) for p in rep.points]
    assert rep.median_abs_error == pytest.approx(float(np.median(errors)))
    assert rep.max_abs_error == pytest.approx(max(errors)) and rep.max_abs_error < 0.15
    assert "median |error|" in format_loo(reports)


def test_the_fit_and_its_validation_use_a_cells_pass_mean_where_it_has_one() -> None:
    rows = _rows()
    # the pooled medians of 0.5 and 0.75 came out 10 % off while the pass means stayed on the truth
    off = {0.5, 0.75}
    skewed = [{**r, "median_us": r["median_us"] * 1.1, "pass_mean_us": r["median_us"]} if r["width"] in off else r
              for r in rows]  # fmt: skip
    assert latency.cell_latency_us(skewed[2]) == pytest.approx(rows[2]["median_us"])
    assert latency.cell_latency_us({**rows[2], "pass_mean_us": math.nan}) == rows[2]["median_us"]
    model = fit_device(skewed).latency_model(MODEL)
    for width in WIDTHS:
        assert model.predict(width).value == pytest.approx(_truth(width), rel=0.02)
    point = next(p for p in leave_one_out_error(skewed)["pi"].points if p.width == 0.5)
    assert point.measured_us == pytest.approx(rows[2]["median_us"])


def test_leave_one_out_needs_two_widths() -> None:
    rep = leave_one_out_error(_rows((1.0,)))["pi"]
    assert rep.points == () and math.isnan(rep.median_abs_error)


def test_a_zoo_model_s_configuration_fits_a_latency_model() -> None:
    assert isinstance(fit_device(_rows()).latency[(MODEL, 20, "ort")], LatencyModel)


def test_profile_rows_accept_a_frame_rows_or_a_device_mapping() -> None:
    rows = scheduling_profiles.line_rows("A", 100.0, 1e-4)
    frame = pd.DataFrame(rows).astype({"train_flops": "Float64"})
    frame.loc[0, "train_flops"] = pd.NA
    from_frame = latency.profile_rows(frame)
    assert [r["width"] for r in from_frame] == [0.25, 0.5, 0.75, 1.0]
    assert from_frame[0]["train_flops"] is None  # pandas NA becomes None
    assert latency.profile_rows(rows) == rows
    # {device: rows}: the key fills a missing device, an explicit one is kept
    mapped = latency.profile_rows({"X": [{"width": 0.5}], "Y": [{"device": "Z", "width": 1.0}]})
    assert mapped == [{"device": "X", "width": 0.5}, {"device": "Z", "width": 1.0}]
    assert latency.profile_rows(None) == []
