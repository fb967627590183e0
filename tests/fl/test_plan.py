"""The planner (`fl.plan`) on stores whose latency lines are known, so every figure is worked by hand."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from exporters.flops import count
from exporters.userinput import InputError
from exporters.zoo import get_model
from fl.plan import (
    MASKED_PROFILE_WARNING,
    FleetPlan,
    PlanRequest,
    deadline_seconds,
    device_examples,
    make_plan,
    parse_deadline,
    run_plan,
    strategy_options,
)
from fl.scheduling.configs import ProfileConfig
from harness.store import ProfileStore
from tests.fl.scheduling.profiles import store_lines

ZOO = get_model("fjord-cnn")
#: a + b * train FLOPs microseconds per image; slow is about 4x fast.
LINES = {"fast": (20.0, 1e-4), "mid": (40.0, 2e-4), "slow": (80.0, 4e-4)}
EXAMPLES = {"fast": 200, "mid": 200, "slow": 200}


def per_image_s(device: str, width: float) -> float:
    a, b = LINES[device]
    return (a + b * count(ZOO, ZOO.arch(width)).train_flops) * 1e-6


def round_s(device: str, width: float, examples: int = 200, batch: int = 20) -> float:
    """The latency-only round (the stores hold no round-cost measurement): steps * batch * latency."""
    return math.ceil(examples / batch) * batch * per_image_s(device, width)


@pytest.fixture
def store(tmp_path: Path) -> ProfileStore:
    path = tmp_path / "p.db"
    store_lines(path, LINES)
    with ProfileStore(path) as opened:
        yield opened


def request(strategy: str, **fields: object) -> PlanRequest:
    base: dict[str, object] = {
        "model": "fjord-cnn", "strategy": strategy, "batch": 20, "epochs": 1, "optimizer": "adamw",
        "examples": EXAMPLES,
    }  # fmt: skip
    base.update(fields)
    return PlanRequest(**base)  # type: ignore[arg-type]


def plan_of(store: ProfileStore, strategy: str, **fields: object) -> FleetPlan:
    return make_plan(store.latest_cells(), store.round_costs(), request(strategy, **fields))


def test_deadline_policies() -> None:
    rounds = [3.0, 1.0, 2.0, 4.0]
    assert deadline_seconds("auto", rounds) == pytest.approx(3.0)  # the upper median of four
    assert deadline_seconds("p25", rounds) == pytest.approx(1.0)
    assert deadline_seconds("p100", rounds) == pytest.approx(4.0)
    assert deadline_seconds("2.5", rounds) == 2.5
    assert parse_deadline("P90") == ("percentile", 90.0)
    for bad in ("soon", "p0", "p101", "-1", "0"):
        with pytest.raises(InputError, match="--deadline"):
            parse_deadline(bad)


def test_fjord_widths_tiers_and_rounds_follow_the_latency_lines(store: ProfileStore) -> None:
    plan = plan_of(store, "fjord", deadline="auto", tiers=2, options={"k": 4})
    full = {d: round_s(d, 1.0) for d in LINES}
    fast, mid, slow = (plan.device(d) for d in ("fast", "mid", "slow"))

    def drawn(device: str, capacity: float) -> float:  # a FjORD round: the mean over the widths it draws
        widths = [w for w in (0.25, 0.5, 0.75, 1.0) if w <= capacity]
        return sum(round_s(device, w) for w in widths) / len(widths)

    # the median device's round at full capacity, which it trains, not its full-width round
    assert plan.deadline_s == pytest.approx(drawn("mid", 1.0), rel=0.02)
    assert drawn("mid", 1.0) < 0.9 * full["mid"]

    assert fast.width == 1.0 and mid.width == 1.0
    assert fast.round_s == pytest.approx(drawn("fast", 1.0), rel=0.02)
    widest_for_slow = max(w for w in (0.25, 0.5, 0.75, 1.0) if drawn("slow", w) <= plan.deadline_s)
    assert slow.width == widest_for_slow < 1.0
    assert slow.round_s == pytest.approx(drawn("slow", widest_for_slow), rel=0.02)
    assert slow.round_s <= plan.deadline_s
    assert (fast.tier, mid.tier, slow.tier) == (0, 0, 1)
    assert slow.full_round_s == pytest.approx(full["slow"], rel=0.02)
    assert plan.fedavg_round_s == pytest.approx(full["slow"], rel=0.02)
    assert plan.fleet_round_s == pytest.approx(max(d.round_s for d in plan.devices))
    assert (plan.capacity("slow"), plan.capacity("fast")) == (widest_for_slow, 1.0)


def test_a_deadline_no_width_meets_gives_the_smallest_and_says_by_how_much(store: ProfileStore) -> None:
    deadline = 0.5 * round_s("slow", 0.25)
    plan = plan_of(store, "heterofl", deadline=str(deadline))
    slow = plan.device("slow")
    assert slow.status == "misses" and slow.width == min(0.0625, 0.125, 0.25, 0.5, 1.0)
    assert slow.round_s > deadline
    assert f"misses the deadline by {slow.round_s - deadline:.3g} s at its smallest width 0.0625" in slow.notes


def test_devices_without_a_profile(store: ProfileStore) -> None:
    examples = {**EXAMPLES, "pi": 200}
    with pytest.raises(InputError, match="device 'pi' has no profile of fjord-cnn.*--unprofiled"):
        plan_of(store, "fjord", examples=examples)
    smallest = plan_of(store, "fjord", examples=examples, unprofiled="smallest").device("pi")
    assert (smallest.status, smallest.width, smallest.round_s) == ("unprofiled", 0.2, None)  # FjORD's k=5: 1/5
    excluded = plan_of(store, "fjord", examples=examples, unprofiled="exclude")
    assert excluded.device("pi").status == "excluded"
    assert [d.device for d in excluded.devices if d.status != "excluded"] == ["fast", "mid", "slow"]


def test_a_store_without_the_model_is_refused(store: ProfileStore) -> None:
    with pytest.raises(InputError, match="no profile of model 'fluid-cnn' .*profiled models: fjord-cnn"):
        run_plan(store, request("fjord", model="fluid-cnn"))


def test_a_profile_of_another_configuration_is_named(store: ProfileStore) -> None:
    warnings: list[str] = []
    configs = {d: ProfileConfig(batch=20, optimizer="sgd") for d in LINES}
    make_plan(store.latest_cells(), store.round_costs(), request("fjord", configs=configs), warn=warnings.append)
    assert any(w.startswith("fast: profile differs from the run in optimizer adamw (run: sgd)") for w in warnings)


def test_feddrop_budgets_meet_the_deadline(store: ProfileStore) -> None:
    warnings: list[str] = []
    plan = make_plan(store.latest_cells(), store.round_costs(), request("feddrop"), warn=warnings.append)
    assert MASKED_PROFILE_WARNING in warnings  # the plain step model's profile plans the masked one's rounds
    fast, slow = plan.device("fast"), plan.device("slow")
    assert fast.budget == 1.0  # its dense round meets the median's
    assert slow.budget is not None and 0 < slow.budget < 1
    dense = count(ZOO, ZOO.arch(1.0)).train_flops
    widths = [i / 64 for i in range(1, 65)]
    flops = {w: count(ZOO, ZOO.arch(w)).train_flops for w in widths}
    # the affordable FLOPs lie between the widest width that meets the deadline and the next
    lo = max(w for w in widths if round_s("slow", w) <= plan.deadline_s)
    assert flops[lo] / dense <= slow.budget <= flops[min(1.0, lo + 1 / 64)] / dense + 1e-9
    assert 0 < slow.keep < fast.keep == 1.0
    options = strategy_options(plan, {"c0": "fast", "c1": "slow"})
    assert options == {"budgets": {"c0": 1.0, "c1": slow.budget}}


def test_fluid_plans_the_straggler_its_width_and_the_target(store: ProfileStore) -> None:
    widths = [0.25, 0.5, 0.75]  # measured widths: the fitted curve is the line there
    plan = plan_of(store, "fluid", options={"widths": widths})
    assert plan.target_s == pytest.approx(round_s("mid", 1.0), rel=0.02)
    slow = plan.device("slow")
    assert slow.straggler and not plan.device("mid").straggler
    nearest = min(widths, key=lambda w: abs(round_s("slow", w) - plan.target_s))
    assert slow.width == nearest
    assert plan.capacity("slow") == 1.0  # FLuID sizes stragglers itself; capacities stay full
    assert strategy_options(plan, {"c0": "slow", "c1": "mid"}) == {
        "planned": {"target": plan.target_s, "stragglers": {"c0": nearest}}
    }


def test_a_plan_revises_when_rounds_drift_and_survives_json(store: ProfileStore) -> None:
    runner = run_plan(store, request("fjord"))
    first = runner.current
    assert runner.revise({"fast": 1.05, "mid": 0.97, "slow": 1.0}) is None
    revised = runner.revise({"fast": 1.0, "mid": 1.0, "slow": 2.0})
    assert revised is not None and revised.revision == 1 and "slow at 2.00 x" in revised.reason
    assert revised.device("slow").full_round_s == pytest.approx(2 * first.device("slow").full_round_s)
    assert revised.device("slow").width <= first.device("slow").width
    assert runner.revise({"slow": 2.1}) is None  # the revision's own scale is the reference now
    assert FleetPlan.from_json(json.loads(json.dumps(revised.to_json()))) == revised


def test_device_examples_takes_each_devices_largest_client() -> None:
    placement = {"c0": "a", "c1": "b", "c2": "a"}
    assert device_examples(placement, {"c0": 30, "c1": 50, "c2": 45}) == {"a": 45, "b": 50}
