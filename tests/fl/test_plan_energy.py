"""The planner under an energy budget per client round, on energy tables worked by hand."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from exporters.flops import count
from exporters.userinput import InputError
from exporters.zoo import get_model
from fl.plan import FleetPlan, PlanRequest, format_plan, make_plan
from harness.store import ProfileStore
from tests.fl.scheduling.profiles import store_lines

ZOO = get_model("fjord-cnn")
LINES = {"fast": (20.0, 1e-4), "mid": (40.0, 2e-4), "slow": (80.0, 4e-4)}
#: joules per image at the measured widths; mid spends twice fast's, slow four times.
JOULES = {0.25: 0.001, 0.5: 0.002, 0.75: 0.004, 1.0: 0.008}
SCALE = {"fast": 1.0, "mid": 2.0, "slow": 4.0}
EXAMPLES = {"fast": 200, "mid": 200, "slow": 200}  # one epoch: 200 images a round


def flops(width: float) -> float:
    return float(count(ZOO, ZOO.arch(width)).train_flops)


def joules(device: str, width: float, images: int = 200) -> float:
    return SCALE[device] * JOULES[width] * images


@pytest.fixture
def cells(tmp_path: Path) -> Any:
    path = tmp_path / "p.db"
    store_lines(path, LINES)
    with ProfileStore(path) as store:
        frame = store.latest_cells()
    pairs = zip(frame["device"], frame["width"], strict=True)
    frame["energy_j_per_image"] = [SCALE[d] * JOULES[float(w)] for d, w in pairs]
    frame["energy_flag"] = None
    frame["energy_emulated"] = True
    return frame


def plan(cells: Any, strategy: str, **fields: Any) -> FleetPlan:
    base: dict[str, Any] = {
        "model": "fjord-cnn", "strategy": strategy, "batch": 20, "epochs": 1, "optimizer": "adamw",
        "examples": EXAMPLES, "deadline": "none", "tiers": 3,
    }  # fmt: skip
    base.update(fields)
    return make_plan(cells, [], PlanRequest(**base))


def test_heterofl_takes_each_devices_widest_level_within_the_budget(cells: Any) -> None:
    budget = 1.0  # fast: 0.5 -> 0.4 J (1.0 -> 1.6 J); mid: 0.5 -> 0.8 J; slow: 0.25 -> 0.8 J (0.5 -> 1.6 J)
    out = plan(cells, "heterofl", energy_budget_j=budget)
    assert {d.device: d.width for d in out.devices} == {"fast": 0.5, "mid": 0.5, "slow": 0.25}
    assert {d.device: d.energy_j for d in out.devices} == pytest.approx(
        {"fast": joules("fast", 0.5), "mid": joules("mid", 0.5), "slow": joules("slow", 0.25)}
    )
    assert all(d.status == "planned" and d.energy_j <= budget for d in out.devices)  # type: ignore[operator]
    assert out.deadline_s is None and out.energy_budget_j == budget
    assert "meets the energy budget" in out.device("fast").notes
    table = "\n".join(format_plan(out))
    assert "energy J" in table and "energy budget 1 J per client round" in table and "no deadline" in table


def test_fjord_counts_the_widths_a_client_draws(cells: Any) -> None:
    # capacity c draws every level <= c per step: fast at 1.0 averages (0.2 + 0.4 + 0.8 + 1.6) / 4 = 0.75 J,
    # at 0.75 (0.2 + 0.4 + 0.8) / 3 = 0.467 J; its 10 draws' mean spreads by sd 0.2494 / sqrt(10) = 0.0789 J,
    # so the budget must hold 0.467 + 2 x 0.0789 = 0.624 J
    out = plan(cells, "fjord", energy_budget_j=0.65, options={"k": 4})
    fast = out.device("fast")
    assert fast.width == 0.75
    assert fast.energy_j == pytest.approx((0.2 + 0.4 + 0.8) / 3)
    assert out.device("slow").width == 0.25  # 0.8 J at 0.25 already: the smallest, over budget
    assert out.device("slow").status == "misses"


def test_a_fjord_budget_holds_for_the_rounds_draw_not_only_on_average(cells: Any) -> None:
    # fast at 0.75 expects 0.467 J <= 0.5, but its draw's bound is 0.624 J: 0.5 (0.3 + 2 x 0.1 / sqrt(10) = 0.363 J)
    out = plan(cells, "fjord", energy_budget_j=0.5, options={"k": 4})
    assert out.device("fast").width == 0.5
    assert out.device("fast").energy_j == pytest.approx(0.3)


def test_examples_and_epochs_count_the_rounds_images(cells: Any) -> None:
    out = plan(cells, "heterofl", energy_budget_j=1.0, epochs=2, examples={"fast": 100, "mid": 200, "slow": 200})
    assert out.device("fast").width == 0.5  # 2 epochs x 100 examples: the same 200 images
    assert out.device("mid").width == 0.25  # 400 images: 0.5 -> 1.6 J, 0.25 -> 0.8 J


def test_a_device_over_budget_at_its_smallest_width_trains_there_and_says_by_how_much(cells: Any) -> None:
    warnings: list[str] = []
    smallest = 0.0625  # below the measured widths: joules per FLOP of width 0.25 times its FLOPs
    expected = 4.0 * JOULES[0.25] / flops(0.25) * flops(smallest) * 200
    budget = expected / 2
    request = PlanRequest(
        model="fjord-cnn", strategy="heterofl", batch=20, epochs=1, optimizer="adamw", examples=EXAMPLES,
        deadline="none", tiers=3, energy_budget_j=budget,
    )  # fmt: skip
    out = make_plan(cells, [], request, warn=warnings.append)
    slow = out.device("slow")
    assert (slow.status, slow.width) == ("misses", smallest)
    assert slow.energy_j == pytest.approx(expected)
    line = f"exceeds the energy budget by {expected - budget:.3g} J at its smallest width 0.0625"
    assert line in slow.notes
    assert any(w.startswith("slow: ") and line in w for w in warnings)
    assert any("extrapolated beyond the measured widths" in n for n in slow.notes)


def test_the_deadline_and_the_budget_both_hold(cells: Any) -> None:
    deadline_only = plan(cells, "heterofl", deadline="auto")
    both = plan(cells, "heterofl", deadline="auto", energy_budget_j=1.0)
    for device in both.devices:
        alone = deadline_only.device(device.device).width
        energy_alone = plan(cells, "heterofl", energy_budget_j=1.0).device(device.device).width
        assert alone is not None and energy_alone is not None
        assert device.width == min(alone, energy_alone)
        assert device.round_s <= both.deadline_s  # type: ignore[operator]
        assert device.energy_j <= 1.0  # type: ignore[operator]
    assert deadline_only.device("slow").width != 1.0 and both.device("fast").width == 0.5


def test_feddrop_keep_probability_follows_the_energy_budget(cells: Any) -> None:
    budget = 0.6  # 0.003 J per image: between the widths 0.5 (0.002) and 0.75 (0.004) of fast
    out = plan(cells, "feddrop", energy_budget_j=budget)
    fast = out.device("fast")
    f0, f1 = flops(0.5), flops(0.75)
    affordable = f0 + (budget / 200 - 0.002) / (0.004 - 0.002) * (f1 - f0)
    assert fast.budget == pytest.approx(affordable / flops(1.0), rel=1e-6)
    assert fast.energy_j == pytest.approx(budget, rel=1e-6)
    assert 0 < fast.keep < 1  # type: ignore[operator]
    assert out.device("slow").keep < fast.keep  # type: ignore[operator]
    unlimited = plan(cells, "feddrop")
    assert unlimited.device("fast").budget == 1.0 and unlimited.device("fast").energy_j == pytest.approx(1.6)


def test_feddrop_over_budget_even_at_one_neuron_misses(cells: Any) -> None:
    out = plan(cells, "feddrop", energy_budget_j=1e-6)
    slow = out.device("slow")
    assert slow.status == "misses" and slow.budget is None and slow.keep is None
    assert any("over the energy budget" in n and " J" in n for n in slow.notes)


def test_a_device_without_energy_is_named_and_planned_on_the_deadline_alone(cells: Any) -> None:
    cells.loc[cells["device"] == "mid", "energy_j_per_image"] = None
    cells.loc[cells["device"] == "mid", "energy_flag"] = "external-power"
    warnings: list[str] = []
    request = PlanRequest(
        model="fjord-cnn", strategy="heterofl", batch=20, epochs=1, optimizer="adamw", examples=EXAMPLES,
        deadline="none", tiers=3, energy_budget_j=1.0,
    )  # fmt: skip
    out = make_plan(cells, [], request, warn=warnings.append)
    mid = out.device("mid")
    assert mid.width == 1.0 and mid.energy_j is None
    assert any(
        w.startswith("mid: no energy per image of fjord-cnn on mid: width 0.25: external-power") for w in warnings
    )
    assert "planned without the energy budget" in " ".join(mid.notes)
    assert not any("meets the energy budget" in w for w in warnings)  # a planned device's reason is no warning


def test_a_store_without_energy_columns_plans_as_before(cells: Any) -> None:
    plain = cells.drop(columns=["energy_j_per_image", "energy_flag", "energy_emulated"])
    out = plan(plain, "heterofl", deadline="auto")
    assert all(d.energy_j is None for d in out.devices)
    assert FleetPlan.from_json({k: v for k, v in out.to_json().items() if k != "energy_budget_j"}) == out


def test_a_non_positive_budget_is_refused(cells: Any) -> None:
    for bad in (0.0, -1.0, math.inf):
        with pytest.raises(InputError, match="--energy-budget"):
            plan(cells, "heterofl", energy_budget_j=bad)
