"""Tiers under a deadline and memory budgets, and capacities (fl/scheduling/tiers.py).

Every expectation is worked by hand from the module's equations on rows whose latency is a
line chosen here: ``median_us = a + b * train_flops`` (`tests.fl.scheduling.profiles`).
"""

from __future__ import annotations

import pytest

from exporters.errors import InputError
from exporters.flops import count
from exporters.zoo import get_model
from fl.scheduling.tiers import HETEROFL_LEVELS, assign_tiers, capacities_for, uniform_levels
from tests.fl.scheduling.profiles import FLOPS, WIDTHS, failed_rows, line_rows

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
    assert a.round_seconds == pytest.approx(0.8, rel=1e-2)
    assert b.round_seconds == pytest.approx(0.66, rel=1e-2)
    assert [c.fits_deadline for c in a.checks] == [True, True, True, False]
    assert a.checks[-1].round_seconds == pytest.approx(1.0, rel=1e-2)
    assert "deadline" in a.checks[-1].note
    assert plan.excluded == {}
    assert plan.tier_widths == (0.75, 0.25) and (a.tier, b.tier) == (0, 1)


def test_a_backend_per_device_reads_each_devices_own_rows() -> None:
    # B (a phone on a runtime bundle) was profiled with onnx only; its slow ort rows are another
    # device's history and must not count. With onnx rows as fast as A's, B fits 0.75 too.
    rows = line_rows("A", 100.0, 1e-4) + line_rows("B", 200.0, 2e-3) + line_rows("B", 100.0, 1e-4, backend="onnx")
    common = dict(deadline_s=0.9, examples_per_round={"A": 1000, "B": 1000}, epochs=2, batch=20,
                  memory_budget_bytes=None, k=2)  # fmt: skip
    plan = assign_tiers(rows, "m", WIDTHS, backend={"B": "onnx"}, **common)  # type: ignore[arg-type]
    assert (plan.choice("A").width, plan.choice("B").width) == (0.75, 0.75)
    only_ort = assign_tiers(rows, "m", WIDTHS, **common)  # type: ignore[arg-type]
    assert only_ort.choice("B").width is None  # its ort rows meet the deadline at no width
    # None: each device's one measured backend; B has two, so it must be named
    any_one = assign_tiers(rows, "m", WIDTHS, backend=None, **common)  # type: ignore[arg-type]
    assert any_one.choice("A").width == 0.75 and any_one.choice("B").width is None
    assert "2 fitted configuration(s)" in any_one.excluded["B"]


def test_a_device_the_backend_mapping_leaves_out_takes_its_one_measured_backend() -> None:
    # A was measured with onnx only (a phone on a runtime bundle); the mapping names only B
    rows = line_rows("A", 100.0, 1e-4, backend="onnx") + line_rows("B", 200.0, 2e-3) + line_rows("B", 100.0, 1e-4,
                                                                                                 backend="onnx")
    common = dict(deadline_s=0.9, examples_per_round={"A": 1000, "B": 1000}, epochs=2, batch=20,
                  memory_budget_bytes=None, k=2)  # fmt: skip
    plan = assign_tiers(rows, "m", WIDTHS, backend={"B": "ort"}, **common)  # type: ignore[arg-type]
    assert (plan.choice("A").width, plan.choice("B").width) == (0.75, None)


def test_round_overhead_is_added_to_the_round_time() -> None:
    # A at 0.75: 0.8 + 0.15 = 0.95 s > 0.9 -> 0.5 (0.6 + 0.15 = 0.75 s).
    plan = assign_tiers(
        two_devices(), "m", WIDTHS, deadline_s=0.9, examples_per_round=EXAMPLES, epochs=2, batch=20,
        memory_budget_bytes=None, k=2, round_overhead_s={"A": 0.15},
    )  # fmt: skip
    assert plan.choice("A").width == 0.5
    assert plan.choice("A").round_seconds == pytest.approx(0.75, rel=1e-2)
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
    assert a.peak_memory_bytes == pytest.approx(4.2e6, rel=1e-2)
    assert [c.fits_memory for c in a.checks] == [True, True, False, False]
    assert a.checks[2].peak_memory_bytes == pytest.approx(5.8e6, rel=1e-2)
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
    assert p.round_seconds == pytest.approx((50.0 + 1e-3 * flops[0.6]) * 1e-4, rel=1e-2)


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


def test_level_sets() -> None:
    assert HETEROFL_LEVELS == (1.0, 0.5, 0.25, 0.125, 0.0625)  # HeteroFL's a..e, widest first
    assert uniform_levels(4) == (1.0, 0.75, 0.5, 0.25)
    assert uniform_levels(1) == (1.0,)
    with pytest.raises(InputError):
        uniform_levels(0)


def test_the_predicted_round_replaces_latency_times_examples() -> None:
    # a round-cost model's rounds: A has a 0.3 s fixed cost on top of its steps, B none
    def round_seconds(device: str, width: float) -> float:
        steps = {"A": (0.4, 0.6, 0.8, 1.0), "B": (0.66, 1.26, 1.86, 2.46)}[device][WIDTHS.index(width)]
        return steps + (0.3 if device == "A" else 0.0)

    plan = assign_tiers(
        two_devices(), "m", WIDTHS, deadline_s=0.9, examples_per_round=EXAMPLES, epochs=2, batch=20,
        memory_budget_bytes=None, k=2, round_seconds=round_seconds,
    )  # fmt: skip
    # A at 0.75: 0.8 + 0.3 > 0.9 -> 0.5 (0.9 s meets it); B unchanged
    assert plan.choice("A").width == 0.5 and plan.choice("A").round_seconds == pytest.approx(0.9)
    assert plan.choice("B").width == 0.25
