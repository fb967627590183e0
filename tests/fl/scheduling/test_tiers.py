"""Tiers under a deadline and memory budgets, and capacities (fl/scheduling/tiers.py).

Every expectation is worked by hand from the module's equations on rows whose latency is a
line chosen here: ``median_us = a + b * train_flops`` (`tests.fl.scheduling.profiles`).
"""

from __future__ import annotations

import pytest

from exporters.flops import count
from exporters.userinput import InputError
from exporters.zoo import get_model
from fl.scheduling.tiers import HETEROFL_LEVELS, assign_tiers, capacities_for, uniform_levels
from tests.fl.scheduling.profiles import FLOPS, WIDTHS, failed_rows, line_rows

# The rounds the tests give (a round-cost model's, here of latency alone):
# round seconds = a + b * F (us) * 1e-6 * examples * epochs.
# A: a=100, b=1e-4 -> 200/300/400/500 us; 1000 examples x 2 epochs -> 0.4/0.6/0.8/1.0 s.
# B: a=200, b=2e-3 -> 2200/4200/6200/8200 us; 150 x 2 -> 0.66/1.26/1.86/2.46 s.
# With a 0.9 s deadline A fits 0.75 (0.8 s) but not 1.0 (1.0 s); B fits only 0.25 (0.66 s).
EXAMPLES = {"A": 1000, "B": 150}
LINES = {"A": (100.0, 1e-4), "B": (200.0, 2e-3), "E": (0.0, 1e-4), "G": (200.0, 2e-3)}


def rounds(examples: dict[str, int], epochs: int = 2, extra: dict[str, float] | None = None):
    """``(device, width) -> seconds`` of the lines above, plus a fixed cost per device."""

    def seconds(device: str, width: float) -> float:
        a, b = LINES[device]
        return (extra or {}).get(device, 0.0) + (a + b * FLOPS[width]) * 1e-6 * examples[device] * epochs

    return seconds


def tiers(rows, deadline: float, examples: dict[str, int], k: int = 2, **kw):
    """`assign_tiers` of ``rows`` at batch 20 with the rounds of `rounds`."""
    kw.setdefault("memory_budget_bytes", None)
    seconds = kw.pop("round_seconds", rounds(examples))
    return assign_tiers(
        rows, "m", kw.pop("widths", WIDTHS), deadline_s=deadline, round_seconds=seconds, devices=examples, batch=20,
        k=k, **kw,
    )  # fmt: skip


def two_devices() -> list[dict[str, object]]:
    return line_rows("A", 100.0, 1e-4) + line_rows("B", 200.0, 2e-3)


def test_largest_width_meeting_the_deadline() -> None:
    plan = tiers(two_devices(), 0.9, EXAMPLES)
    a, b = plan.choice("A"), plan.choice("B")
    assert (a.width, b.width) == (0.75, 0.25)
    assert a.round_seconds == pytest.approx(0.8, rel=1e-2)
    assert b.round_seconds == pytest.approx(0.66, rel=1e-2)
    assert [c.fits_deadline for c in a.checks] == [True, True, True, False]
    assert a.checks[-1].round_seconds == pytest.approx(1.0, rel=1e-2)
    assert "deadline" in a.checks[-1].note
    assert plan.excluded == {}
    assert plan.tier_widths == (0.75, 0.25) and (a.tier, b.tier) == (0, 1)


def test_a_backend_per_device_reads_each_devices_own_rows() -> None:
    # B (a phone on a runtime bundle) was profiled with onnx only; A with ort.
    rows = line_rows("A", 100.0, 1e-4) + line_rows("B", 200.0, 2e-3, backend="onnx")
    plan = tiers(rows, 0.9, EXAMPLES, backend={"B": "onnx", "A": "ort"})
    assert (plan.choice("A").width, plan.choice("B").width) == (0.75, 0.25)
    only_ort = tiers(rows, 0.9, EXAMPLES)
    assert "no measured profile" in only_ort.excluded["B"]  # its onnx rows are not the ort profile
    # None: each device's one measured backend; B with two must be named
    rows += line_rows("B", 100.0, 1e-4)
    any_one = tiers(rows, 0.9, EXAMPLES, backend=None)
    assert any_one.choice("A").width == 0.75 and "2 fitted configuration(s)" in any_one.excluded["B"]


def test_the_round_cost_models_rounds_decide() -> None:
    # A has a 0.3 s fixed cost on top of its steps: at 0.75, 0.8 + 0.3 > 0.9 -> 0.5 (0.9 s meets it)
    plan = tiers(two_devices(), 0.9, EXAMPLES, round_seconds=rounds(EXAMPLES, extra={"A": 0.3}))
    assert plan.choice("A").width == 0.5 and plan.choice("A").round_seconds == pytest.approx(0.9, rel=1e-2)
    assert plan.choice("B").width == 0.25


def test_memory_budget_excludes_a_width() -> None:
    # A's peak = 1e6 + 10 * 16 * params: 2.6e6 / 4.2e6 / 5.8e6 / 7.4e6 bytes; budget 5e6 rules out 0.75.
    rows = line_rows("A", 100.0, 1e-4, memory=(1e6, 10.0)) + line_rows("B", 200.0, 2e-3)
    plan = tiers(rows, 0.9, EXAMPLES, memory_budget_bytes={"A": 5_000_000, "B": 1})
    a = plan.choice("A")
    assert a.width == 0.5
    assert a.peak_memory_bytes == pytest.approx(4.2e6, rel=1e-2)
    assert [c.fits_memory for c in a.checks] == [True, True, False, False]
    assert a.checks[2].peak_memory_bytes == pytest.approx(5.8e6, rel=1e-2)
    assert "memory" in a.checks[2].note
    # B has no memory measurement: its tiny budget cannot be checked and does not exclude it.
    assert plan.choice("B").width == 0.25 and plan.choice("B").peak_memory_bytes is None


def test_memory_budget_below_every_width_excludes_with_reason() -> None:
    rows = line_rows("A", 100.0, 1e-4, memory=(1e6, 10.0)) + line_rows("B", 200.0, 2e-3)
    plan = tiers(rows, 0.9, EXAMPLES, memory_budget_bytes={"A": 2_000_000})
    assert plan.choice("A").excluded and plan.choice("A").tier is None
    assert "memory" in plan.excluded["A"] and "0.25" in plan.excluded["A"]
    assert plan.included == ("B",)
    assert plan.tier_widths == (0.25,)


def test_deadline_below_every_width_excludes_with_reason_and_keeps_the_checks() -> None:
    plan = tiers(two_devices(), 0.5, EXAMPLES)
    assert plan.choice("A").width == 0.25
    b = plan.choice("B")
    assert b.excluded and "deadline" in plan.excluded["B"]
    assert b.checks[0].width == 0.25 and b.checks[0].round_seconds == pytest.approx(0.66, rel=1e-2)


def test_failed_cells_only_and_unprofiled_devices_are_excluded_with_reasons() -> None:
    rows = two_devices() + failed_rows("C", "timeout")
    plan = tiers(rows, 0.9, {**EXAMPLES, "C": 10, "D": 10})
    assert set(plan.excluded) == {"C", "D"}
    assert "no successful measurement" in plan.excluded["C"] and "4 x timeout" in plan.excluded["C"]
    assert "no measured profile" in plan.excluded["D"]
    assert plan.included == ("A", "B")


def test_out_of_memory_cell_rules_its_width_out() -> None:
    # E: a=0, b=1e-4, 1000 x 2 -> 0.2/0.4/0.6/0.8 s: the deadline allows 1.0 but its 1.0 cell ran out of memory.
    rows = [r for r in line_rows("E", 0.0, 1e-4) if r["width"] != 1.0]
    rows += [{**r, "train_flops": FLOPS[1.0]} for r in failed_rows("E", "out of memory") if r["width"] == 1.0]
    plan = tiers(rows, 0.9, {"E": 1000}, k=1)
    e = plan.choice("E")
    assert e.width == 0.75
    assert e.checks[-1].fits_deadline and not e.checks[-1].fits_memory
    assert e.checks[-1].note == "measured out of memory"


def fleet_plan(k: int, **more_examples: int):
    """Chosen widths at a 0.9 s deadline, 2 epochs: A 0.75, B 0.25, E 1.0 (0.8 s), G 0.25."""
    rows = two_devices() + line_rows("E", 0.0, 1e-4) + line_rows("G", 200.0, 2e-3)
    return tiers(rows, 0.9, {**EXAMPLES, "E": 1000, "G": 150, **more_examples}, k=k)


def test_k2_tiers_cluster_chosen_widths_and_tier_width_is_the_smallest_member() -> None:
    # Widths {1.0, 0.75} | {0.25, 0.25}: SSE 2 * 0.125^2 = 0.03125, against 0.1667 for {1.0} | {0.75, 0.25, 0.25}.
    plan = fleet_plan(2)
    assert plan.choice("E").width == 1.0
    assert plan.tier_widths == (0.75, 0.25)
    assert plan.tiers == (("A", "E"), ("B", "G"))
    e = plan.choice("E")
    assert e.tier_width == 0.75 and e.round_seconds == pytest.approx(0.6, rel=1e-2)  # E runs at its tier's width


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


def test_an_unmeasured_width_is_checked_and_says_it_is_interpolated() -> None:
    model = get_model("fjord-cnn")
    flops = {w: count(model, model.arch(w)).train_flops for w in (0.25, 0.5, 0.6, 1.0)}
    rows = [
        {"device": "P", "model": "fjord-cnn", "width": w, "batch": 20, "backend": "ort", "status": "ok",
         "median_us": 50.0 + 1e-3 * flops[w], "train_flops": flops[w]}
        for w in (0.25, 0.5, 1.0)
    ]  # fmt: skip

    def seconds(device: str, width: float) -> float:
        return (50.0 + 1e-3 * flops[width]) * 1e-4

    deadline = (50.0 + 1e-3 * (flops[0.6] + flops[1.0]) / 2) * 1e-4  # between 0.6 and 1.0
    plan = assign_tiers(
        rows, "fjord-cnn", (0.25, 0.6, 1.0), deadline_s=deadline, round_seconds=seconds, devices=["P"], batch=20,
        memory_budget_bytes=None, k=1,
    )  # fmt: skip
    p = plan.choice("P")
    assert p.width == 0.6 and not p.checks[1].extrapolated
    assert p.checks[1].train_flops == pytest.approx(flops[0.6])


def test_bad_tier_inputs_raise() -> None:
    with pytest.raises(InputError, match="1.5"):
        tiers(two_devices(), 0.9, EXAMPLES, widths=(0.5, 1.5))
    with pytest.raises(InputError, match="k must"):
        tiers(two_devices(), 0.9, EXAMPLES, k=0)
    with pytest.raises(InputError, match="deadline_s"):
        tiers(two_devices(), -1.0, EXAMPLES)


def test_level_sets() -> None:
    assert HETEROFL_LEVELS == (1.0, 0.5, 0.25, 0.125, 0.0625)  # HeteroFL's a..e, widest first
    assert uniform_levels(4) == (1.0, 0.75, 0.5, 0.25)
    assert uniform_levels(1) == (1.0,)
    with pytest.raises(InputError):
        uniform_levels(0)
