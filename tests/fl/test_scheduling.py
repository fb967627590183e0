"""Scheduling from profiles: tiers, FLuID straggler sizing, FedDrop budgets, the store loader.

Every expectation is worked by hand from the module's equations on rows whose latency is a
line (or a curve) chosen here: ``median_us = a + b * train_flops``.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from devices.fleet import Device, Emulation, Fleet
from exporters.errors import InputError
from exporters.flops import count
from exporters.zoo import get_model
from fl.scheduling import (
    HETEROFL_LEVELS,
    assign_tiers,
    budgets_for_fleet,
    capacities_for,
    flops_budget_ratio,
    kmeans_1d,
    memory_budgets_from_fleet,
    profile_rows,
    profiles_from_store,
    straggler_width,
    uniform_levels,
)
from harness.latency import fit
from harness.records import BenchSpec, Measurement
from harness.store import ProfileStore

WIDTHS = (0.25, 0.5, 0.75, 1.0)
# A synthetic model "m": training FLOPs and parameters per example at each width.
FLOPS = {0.25: 1e6, 0.5: 2e6, 0.75: 3e6, 1.0: 4e6}
PARAMS = {0.25: 1e4, 0.5: 2e4, 0.75: 3e4, 1.0: 4e4}


def line_rows(
    device: str,
    a: float,
    b: float,
    *,
    widths: tuple[float, ...] = WIDTHS,
    memory: tuple[float, float] | None = None,
    batch: int = 20,
    backend: str = "ort",
    model: str = "m",
) -> list[dict[str, object]]:
    """Rows with median_us = a + b * FLOPS[w]; peak = c + d * (16 * params) when memory = (c, d)."""
    out: list[dict[str, object]] = []
    for w in widths:
        row: dict[str, object] = {
            "device": device,
            "model": model,
            "width": w,
            "batch": batch,
            "backend": backend,
            "status": "ok",
            "median_us": a + b * FLOPS[w],
            "train_flops": FLOPS[w],
            "params": PARAMS[w],
            "activation_elements": 0,  # footprint = 16 bytes * params
        }
        if memory is not None:
            row["peak_memory_bytes"] = memory[0] + memory[1] * 16 * PARAMS[w]
        out.append(row)
    return out


def failed_rows(device: str, status: str = "timeout") -> list[dict[str, object]]:
    return [
        {"device": device, "model": "m", "width": w, "batch": 20, "backend": "ort", "status": status} for w in WIDTHS
    ]


# ---------------------------------------------------------------------------- tiers

# Round seconds = a + b * F (us) * 1e-6 * examples * epochs.
# A: a=100, b=1e-4 -> 200/300/400/500 us; 1000 examples x 2 epochs -> 0.4/0.6/0.8/1.0 s.
# B: a=200, b=2e-3 -> 2200/4200/6200/8200 us; 150 x 2 -> 0.66/1.26/1.86/2.46 s.
# With a 0.9 s deadline A fits 0.75 (0.8 s) but not 1.0 (1.0 s); B fits only 0.25 (0.66 s).
EXAMPLES = {"A": 1000, "B": 150}


def two_devices() -> list[dict[str, object]]:
    return line_rows("A", 100.0, 1e-4) + line_rows("B", 200.0, 2e-3)


def test_largest_width_meeting_the_deadline() -> None:
    plan = assign_tiers(
        two_devices(), "m", WIDTHS, deadline_s=0.9, examples_per_round=EXAMPLES, epochs=2, batch=20,
        memory_budget_bytes=None, k=2,
    )  # fmt: skip
    a, b = plan.choice("A"), plan.choice("B")
    assert (a.width, b.width) == (0.75, 0.25)
    assert a.round_seconds == pytest.approx(0.8)
    assert b.round_seconds == pytest.approx(0.66)
    assert [c.fits_deadline for c in a.checks] == [True, True, True, False]
    assert a.checks[-1].round_seconds == pytest.approx(1.0)
    assert "deadline" in a.checks[-1].note
    assert plan.excluded == {}
    assert plan.tier_widths == (0.75, 0.25) and (a.tier, b.tier) == (0, 1)


def test_round_overhead_is_added_to_the_round_time() -> None:
    # A at 0.75: 0.8 + 0.15 = 0.95 s > 0.9 -> 0.5 (0.6 + 0.15 = 0.75 s).
    plan = assign_tiers(
        two_devices(), "m", WIDTHS, deadline_s=0.9, examples_per_round=EXAMPLES, epochs=2, batch=20,
        memory_budget_bytes=None, k=2, round_overhead_s={"A": 0.15},
    )  # fmt: skip
    assert plan.choice("A").width == 0.5
    assert plan.choice("A").round_seconds == pytest.approx(0.75)
    assert plan.choice("B").width == 0.25


def test_memory_budget_excludes_a_width() -> None:
    # A's peak = 1e6 + 10 * 16 * params: 2.6e6 / 4.2e6 / 5.8e6 / 7.4e6 bytes; budget 5e6 rules out 0.75.
    rows = line_rows("A", 100.0, 1e-4, memory=(1e6, 10.0)) + line_rows("B", 200.0, 2e-3)
    plan = assign_tiers(
        rows, "m", WIDTHS, deadline_s=0.9, examples_per_round=EXAMPLES, epochs=2, batch=20,
        memory_budget_bytes={"A": 5_000_000, "B": 1}, k=2,
    )  # fmt: skip
    a = plan.choice("A")
    assert a.width == 0.5
    assert a.peak_memory_bytes == pytest.approx(4.2e6)
    assert [c.fits_memory for c in a.checks] == [True, True, False, False]
    assert a.checks[2].peak_memory_bytes == pytest.approx(5.8e6)
    assert "memory" in a.checks[2].note
    # B has no memory measurement: its tiny budget cannot be checked and does not exclude it.
    assert plan.choice("B").width == 0.25 and plan.choice("B").peak_memory_bytes is None


def test_memory_budget_below_every_width_excludes_with_reason() -> None:
    rows = line_rows("A", 100.0, 1e-4, memory=(1e6, 10.0)) + line_rows("B", 200.0, 2e-3)
    plan = assign_tiers(
        rows, "m", WIDTHS, deadline_s=0.9, examples_per_round=EXAMPLES, epochs=2, batch=20,
        memory_budget_bytes={"A": 2_000_000}, k=2,
    )  # fmt: skip
    assert plan.choice("A").excluded and plan.choice("A").tier is None
    assert "memory" in plan.excluded["A"] and "0.25" in plan.excluded["A"]
    assert plan.included == ("B",)
    assert plan.tier_widths == (0.25,)


def test_deadline_below_every_width_excludes_with_reason() -> None:
    plan = assign_tiers(
        two_devices(), "m", WIDTHS, deadline_s=0.5, examples_per_round=EXAMPLES, epochs=2, batch=20,
        memory_budget_bytes=None, k=2,
    )  # fmt: skip
    assert plan.choice("A").width == 0.25
    assert plan.choice("B").excluded
    assert "deadline" in plan.excluded["B"]


def test_failed_cells_only_and_unprofiled_devices_are_excluded_with_reasons() -> None:
    rows = two_devices() + failed_rows("C", "timeout")
    examples = {**EXAMPLES, "C": 10, "D": 10}
    plan = assign_tiers(
        rows, "m", WIDTHS, deadline_s=0.9, examples_per_round=examples, epochs=2, batch=20,
        memory_budget_bytes=None, k=2,
    )  # fmt: skip
    assert set(plan.excluded) == {"C", "D"}
    assert "no successful measurement" in plan.excluded["C"] and "4 x timeout" in plan.excluded["C"]
    assert "no measured profile" in plan.excluded["D"]
    assert plan.included == ("A", "B")


def test_out_of_memory_cell_rules_its_width_out() -> None:
    # E: a=0, b=1e-4, 1000 x 2 -> 0.2/0.4/0.6/0.8 s: the deadline allows 1.0 but its 1.0 cell ran out of memory.
    rows = [r for r in line_rows("E", 0.0, 1e-4) if r["width"] != 1.0]
    rows += [{**r, "train_flops": FLOPS[1.0]} for r in failed_rows("E", "out of memory") if r["width"] == 1.0]
    plan = assign_tiers(
        rows, "m", WIDTHS, deadline_s=0.9, examples_per_round={"E": 1000}, epochs=2, batch=20,
        memory_budget_bytes=None, k=1,
    )  # fmt: skip
    e = plan.choice("E")
    assert e.width == 0.75
    assert e.checks[-1].fits_deadline and not e.checks[-1].fits_memory
    assert e.checks[-1].note == "measured out of memory"


def fleet_rows() -> tuple[list[dict[str, object]], dict[str, int]]:
    # Chosen widths at a 0.9 s deadline, 2 epochs: A 0.75, B 0.25, E 1.0 (0.8 s), G 0.25.
    rows = two_devices() + line_rows("E", 0.0, 1e-4) + line_rows("G", 200.0, 2e-3)
    return rows, {**EXAMPLES, "E": 1000, "G": 150}


def fleet_plan(k: int, **more_examples: int):
    """`assign_tiers` of `fleet_rows` at the 0.9 s deadline, 2 epochs, batch 20, no memory budget."""
    rows, examples = fleet_rows()
    return assign_tiers(
        rows, "m", WIDTHS, deadline_s=0.9, examples_per_round={**examples, **more_examples}, epochs=2, batch=20,
        memory_budget_bytes=None, k=k,
    )  # fmt: skip


def test_k2_tiers_cluster_chosen_widths_and_tier_width_is_the_smallest_member() -> None:
    # Widths {1.0, 0.75} | {0.25, 0.25}: SSE 2 * 0.125^2 = 0.03125, against 0.1667 for {1.0} | {0.75, 0.25, 0.25}.
    plan = fleet_plan(2)
    assert plan.choice("E").width == 1.0
    assert plan.tier_widths == (0.75, 0.25)
    assert plan.tiers == (("A", "E"), ("B", "G"))
    e = plan.choice("E")
    assert e.tier_width == 0.75 and e.round_seconds == pytest.approx(0.6)  # E runs at its tier's width


def test_capacities_snap_tier_widths_down_to_level_sets() -> None:
    plan = fleet_plan(2, C=5)
    hetero = capacities_for(plan, HETEROFL_LEVELS)
    assert hetero.capacity == {"A": 0.5, "B": 0.25, "E": 0.5, "G": 0.25}
    assert hetero.tier == {"A": 0, "B": 1, "E": 0, "G": 1}
    assert set(hetero.left_out) == {"C"}
    fjord = capacities_for(plan, uniform_levels(5))
    assert fjord.capacity == {"A": 0.6, "B": 0.2, "E": 0.6, "G": 0.2}
    # A tier width below every level leaves the device out with a reason.
    coarse = capacities_for(plan, (1.0, 0.5))
    assert coarse.capacity == {"A": 0.5, "E": 0.5}
    assert "below the smallest level" in coarse.left_out["B"]


def test_more_tiers_than_distinct_widths() -> None:
    plan = fleet_plan(5)
    assert plan.tier_widths == (1.0, 0.75, 0.25)
    assert plan.tiers == (("E",), ("A",), ("B", "G"))


def test_unmeasured_widths_are_predicted_from_the_fit_with_zoo_flops() -> None:
    model = get_model("fjord-cnn")
    flops = {w: count(model, model.arch(w)).train_flops for w in (0.25, 0.5, 0.6, 1.0)}
    rows = [
        {"device": "P", "model": "fjord-cnn", "width": w, "batch": 20, "backend": "ort", "status": "ok",
         "median_us": 50.0 + 1e-3 * flops[w], "train_flops": flops[w]}
        for w in (0.25, 0.5, 1.0)
    ]  # fmt: skip
    # 100 examples, 1 epoch: round = (50 + 1e-3 F) * 1e-4 s. The deadline sits between 0.6 and 1.0.
    deadline = (50.0 + 1e-3 * (flops[0.6] + flops[1.0]) / 2) * 1e-4
    plan = assign_tiers(
        rows, "fjord-cnn", (0.25, 0.6, 1.0), deadline_s=deadline, examples_per_round={"P": 100}, epochs=1,
        batch=20, memory_budget_bytes=None, k=1,
    )  # fmt: skip
    p = plan.choice("P")
    assert p.width == 0.6
    assert p.round_seconds == pytest.approx((50.0 + 1e-3 * flops[0.6]) * 1e-4)


def test_bad_tier_inputs_raise() -> None:
    kw = dict(deadline_s=0.9, examples_per_round=EXAMPLES, epochs=2, batch=20, memory_budget_bytes=None, k=2)
    with pytest.raises(InputError, match="1.5"):
        assign_tiers(two_devices(), "m", (0.5, 1.5), **kw)  # type: ignore[arg-type]
    with pytest.raises(InputError, match="k must"):
        assign_tiers(two_devices(), "m", WIDTHS, **{**kw, "k": 0})  # type: ignore[arg-type]
    with pytest.raises(InputError, match="deadline_s"):
        assign_tiers(two_devices(), "m", WIDTHS, **{**kw, "deadline_s": -1.0})  # type: ignore[arg-type]
    with pytest.raises(InputError, match="examples_per_round"):
        assign_tiers(two_devices(), "m", WIDTHS, **{**kw, "examples_per_round": {"A": 0}})  # type: ignore[arg-type]


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


def test_uniform_levels() -> None:
    assert uniform_levels(4) == (1.0, 0.75, 0.5, 0.25)
    with pytest.raises(InputError):
        uniform_levels(0)


def test_memory_budgets_from_fleet_fill_presets() -> None:
    fleet = Fleet(
        Path("f.yaml"),
        (
            Device("pi", "ssh", emulate=Emulation(preset="pi4")),
            Device("small", "ssh", emulate=Emulation(memory_mb=512)),
            Device("real", "ssh"),
        ),
    )
    budgets = memory_budgets_from_fleet(fleet)
    assert budgets == {"pi": 2048 * 2**20, "small": 512 * 2**20}


# ---------------------------------------------------------------------------- FLuID straggler sizing


def fjord_flops() -> dict[float, int]:
    model = get_model("fjord-cnn")
    return {w: count(model, model.arch(w)).train_flops for w in WIDTHS}


def curve_rows(latency: dict[float, float], device: str = "S") -> list[dict[str, object]]:
    flops = fjord_flops()
    return [
        {"device": device, "model": "fjord-cnn", "width": w, "batch": 20, "backend": "ort", "status": "ok",
         "median_us": lat, "train_flops": flops[w]}
        for w, lat in latency.items()
    ]  # fmt: skip


def test_straggler_width_from_the_measured_curve() -> None:
    # Measured 500 / 600 / 800 us at 0.25 / 0.5 / 1.0; 0.75 interpolates between 0.5 and 1.0 in FLOPs.
    f = fjord_flops()
    lat75 = 600 + (f[0.75] - f[0.5]) / (f[1.0] - f[0.5]) * 200
    rows = curve_rows({0.25: 500.0, 0.5: 600.0, 1.0: 800.0})
    # Full model took 10 s; target 8 s: 0.75 -> 10 * lat75 / 800 = 8.66 s misses, 0.5 -> 7.5 s meets.
    choice = straggler_width(rows, "S", 8.0, 10.0, 1.0, WIDTHS)
    assert choice.rule == "curve" and choice.width == 0.5
    assert choice.predicted_seconds == pytest.approx(7.5)
    assert choice.meets_target and choice.speedup == pytest.approx(1.25)
    # Target 9 s: 0.75 meets (10 * lat75 / 800).
    choice = straggler_width(rows, "S", 9.0, 10.0, 1.0, WIDTHS)
    assert choice.width == 0.75 and choice.predicted_seconds == pytest.approx(10 * lat75 / 800)
    # The linear rule would pick 0.75 (closest to 1 / 1.25 = 0.8) for the 8 s target: the curve differs.
    linear = straggler_width(None, "S", 8.0, 10.0, 1.0, WIDTHS)
    assert linear.rule == "linear" and linear.width == 0.75


def test_straggler_curve_from_a_sub_model_time() -> None:
    # Straggler currently at 0.5 taking 6 s (600 us): 0.25 -> 6 * 500 / 600 = 5 s.
    rows = curve_rows({0.25: 500.0, 0.5: 600.0, 1.0: 800.0})
    choice = straggler_width({"S": rows}, "S", 5.0, 6.0, 0.5, WIDTHS)
    assert choice.width == 0.25 and choice.predicted_seconds == pytest.approx(5.0)
    assert choice.speedup == pytest.approx(12.0 / 5.0)
    # Nothing meets 4 s: the smallest width, flagged.
    choice = straggler_width(rows, "S", 4.0, 6.0, 0.5, WIDTHS)
    assert choice.width == 0.25 and not choice.meets_target


def test_straggler_curve_extends_the_nearest_segment_below_the_measured_range() -> None:
    f = fjord_flops()
    rows = curve_rows({0.5: 600.0, 0.75: 650.0, 1.0: 800.0})
    slope = 50 / (f[0.75] - f[0.5])  # the lowest segment, not the steeper upper one
    lat25 = 600 - slope * (f[0.5] - f[0.25])
    choice = straggler_width(rows, "S", 10 * lat25 / 800 + 1e-6, 10.0, 1.0, WIDTHS)
    assert choice.width == 0.25 and choice.predicted_seconds == pytest.approx(10 * lat25 / 800)


def test_straggler_linear_fallback_without_profile() -> None:
    # Recalibration: at 0.5 it took 4 s, so the full model takes 8 s; target 3 s -> r closest to 3/8 = 0.375.
    # 0.25 and 0.5 are equally close: the smaller wins. Another device's profile does not count.
    rows = curve_rows({0.25: 500.0, 0.5: 600.0, 1.0: 800.0}, device="other")
    choice = straggler_width(rows, "S", 3.0, 4.0, 0.5, WIDTHS)
    assert choice.rule == "linear" and choice.width == 0.25
    assert choice.speedup == pytest.approx(8.0 / 3.0)
    assert choice.predicted_seconds == pytest.approx(2.0) and choice.meets_target
    # Full model 10 s, target 9 s: closest to 0.9 is 1.0, which misses the target.
    choice = straggler_width(None, "S", 9.0, 10.0, 1.0, WIDTHS)
    assert choice.width == 1.0 and not choice.meets_target


def test_straggler_width_from_fitted_models_uses_the_line() -> None:
    # Fitted line 400 + 1e-4 F us: full model 10 s, target 7.5 s -> 0.5 (7.32 s); 0.75 takes 8.57 s.
    f = fjord_flops()
    models = fit(curve_rows({w: 400 + 1e-4 * f[w] for w in (0.25, 0.5, 1.0)}))
    full = 400 + 1e-4 * f[1.0]
    expected = {w: 10 * (400 + 1e-4 * f[w]) / full for w in WIDTHS}
    wanted = max(w for w in WIDTHS if expected[w] <= 7.5)
    assert wanted == 0.5
    for given in (models, models["S"]):
        choice = straggler_width(given, "S", 7.5, 10.0, 1.0, WIDTHS)
        assert choice.rule == "curve" and choice.width == wanted
        assert choice.predicted_seconds == pytest.approx(expected[wanted])
    assert straggler_width(models, "other", 7.0, 10.0, 1.0, WIDTHS).rule == "linear"


def test_straggler_bad_inputs() -> None:
    with pytest.raises(InputError, match="target_seconds"):
        straggler_width(None, "S", 0.0, 1.0, 1.0, WIDTHS)
    with pytest.raises(InputError, match="available_widths"):
        straggler_width(None, "S", 1.0, 2.0, 1.0, ())
    rows = curve_rows({0.5: 600.0, 1.0: 800.0}) + [{**r, "batch": 8} for r in curve_rows({0.5: 300.0, 1.0: 400.0})]
    with pytest.raises(InputError, match="configurations"):
        straggler_width(rows, "S", 8.0, 10.0, 1.0, WIDTHS)
    assert straggler_width(rows, "S", 8.0, 10.0, 1.0, WIDTHS, batch=8).width == 0.5


# ---------------------------------------------------------------------------- FedDrop budget

# Device A: median_us = 100 + 1e-4 * F; dense F = 4e6.


def test_budget_ratio_solves_the_line() -> None:
    # 1000 examples x 1 epoch in 0.35 s -> 350 us per image -> F = (350 - 100) / 1e-4 = 2.5e6 -> r = 0.625.
    r = flops_budget_ratio(line_rows("A", 100.0, 1e-4), "A", "m", 0.35, 1000, 1)
    assert r.per_image_budget_us == pytest.approx(350.0)
    assert r.affordable_flops == pytest.approx(2.5e6)
    assert r.ratio == pytest.approx(0.625) and r.smallest_measured_fits
    # 2 epochs in 0.7 s is the same budget; a 0.1 s overhead leaves 300 us -> F = 2e6 -> r = 0.5.
    assert flops_budget_ratio(line_rows("A", 100.0, 1e-4), "A", "m", 0.7, 1000, 2).ratio == pytest.approx(0.625)
    r = flops_budget_ratio(line_rows("A", 100.0, 1e-4), "A", "m", 0.4, 1000, 1, round_overhead_s=0.1)
    assert r.ratio == pytest.approx(0.5)


def test_budget_ratio_clamps_and_reports() -> None:
    rows = line_rows("A", 100.0, 1e-4)
    dense = flops_budget_ratio(rows, "A", "m", 1.0, 1000, 1)  # 1000 us -> F = 9e6 > 4e6
    assert dense.ratio == 1.0 and dense.affordable_flops == pytest.approx(9e6) and "clamped" in dense.note
    small = flops_budget_ratio(rows, "A", "m", 0.15, 1000, 1)  # 150 us -> F = 5e5 < smallest 1e6
    assert small.ratio == pytest.approx(0.125)
    assert not small.smallest_measured_fits and "smallest measured" in small.note
    none = flops_budget_ratio(rows, "A", "m", 0.05, 1000, 1)  # 50 us < a = 100 us
    assert none.ratio is None and none.affordable_flops == pytest.approx(-5e5)
    assert "exceeds" in none.note


def test_budgets_for_fleet() -> None:
    # B: 200 + 2e-3 F, 100 examples in 0.6 s -> 6000 us -> F = 2.9e6 -> r = 0.725.
    rows = line_rows("A", 100.0, 1e-4) + line_rows("B", 200.0, 2e-3) + failed_rows("C")
    budgets = budgets_for_fleet(
        pd.DataFrame(rows), "m", 0.6, {"A": 1000, "B": 100, "C": 10}, 1, round_overhead_s={"A": 0.25}
    )
    assert list(budgets) == ["A", "B", "C"]
    assert budgets["A"].ratio == pytest.approx(0.625)  # 0.35 s left -> as above
    assert budgets["B"].ratio == pytest.approx(0.725)
    assert budgets["C"].ratio is None and "no usable profile" in budgets["C"].note
    with pytest.raises(InputError, match="examples"):
        flops_budget_ratio(rows, "A", "m", 0.6, 0, 1)


# ---------------------------------------------------------------------------- store loader


def measurement(
    device: str, model: str, width: float, per_image_us: float, status: str = "ok", backend: str = "ort"
) -> Measurement:
    zoo = get_model("fjord-cnn")
    arch = zoo.arch(width)
    spec = BenchSpec(
        device=device, model=model, width=width, arch_widths=arch.widths, batch=20,
        backend=backend, threads=1, warmup=1, steps=3,  # type: ignore[arg-type]
    )  # fmt: skip
    if status != "ok":
        return Measurement(spec=spec, status=status, message="failed")
    step = per_image_us * 1e-6 * 20
    return Measurement(
        spec=spec,
        status="ok",
        step_seconds=(step, step, step),
        runner={"counts": {"train_flops": count(zoo, arch).train_flops}},
    )


def test_profiles_from_store_filters_and_feeds_the_scheduler(tmp_path: Path) -> None:
    with ProfileStore(tmp_path / "p.db") as store:
        cid = store.start_campaign(None, "fjord-cnn", versions={}, commit=None)
        for w, lat in ((0.25, 500.0), (0.5, 600.0), (1.0, 800.0)):
            store.record(cid, measurement("S", "fjord-cnn", w, lat))
        store.record(cid, measurement("S", "fjord-cnn", 0.75, 0.0, status="timeout"))
        store.record(cid, measurement("S", "fjord-cnn", 0.5, 1.0, backend="torch"))
        store.record(cid, measurement("S", "other", 0.5, 1.0))
        store.record(cid, measurement("dead", "fjord-cnn", 0.5, 0.0, status="unreachable"))
        profiles = profiles_from_store(store, "fjord-cnn")
        assert list(profiles) == ["S"]
        assert [r["width"] for r in profiles["S"]] == [0.25, 0.5, 1.0]
        assert profiles["S"][1]["median_us"] == pytest.approx(600.0)
        assert profiles["S"][1]["peak_memory_bytes"] is None  # pandas NA cleaned
        assert profiles_from_store(store, "fjord-cnn", batch=8) == {}
        # Straggler sizing straight from the loaded profiles, as in the hand-worked curve test.
        assert straggler_width(profiles, "S", 8.0, 10.0, 1.0, WIDTHS, model="fjord-cnn").width == 0.5
        # The whole table gives the failure reason of a device with failed cells only.
        cells = store.latest_cells()
    plan = assign_tiers(
        cells, "fjord-cnn", WIDTHS, deadline_s=1.0, examples_per_round={"S": 1000, "dead": 10}, epochs=1,
        batch=20, memory_budget_bytes=None, k=1,
    )  # fmt: skip
    assert "1 x unreachable" in plan.excluded["dead"]
    assert plan.choice("S").width == 1.0  # the fitted line stays near 800 us < 1000 us per image at 1.0
    assert len(profile_rows(cells)) == 7
