"""FedDrop's FLOPs-budget ratio (fl/scheduling/budgets.py), solved by hand on lines.

Device A: ``median_us = 100 + 1e-4 * F``; dense ``F = 4e6`` (`tests.fl.scheduling.profiles`).
"""

from __future__ import annotations

import pandas as pd
import pytest

from exporters.errors import InputError
from fl.scheduling.budgets import budgets_for_fleet, flops_budget_ratio
from tests.fl.scheduling.profiles import failed_rows, line_rows


def test_budget_ratio_solves_the_line() -> None:
    # 1000 examples x 1 epoch in 0.35 s -> 350 us per image -> F = (350 - 100) / 1e-4 = 2.5e6 -> r = 0.625.
    r = flops_budget_ratio(line_rows("A", 100.0, 1e-4), "A", "m", 0.35, 1000, 1)
    assert r.per_image_budget_us == pytest.approx(350.0, rel=1e-2)
    assert r.affordable_flops == pytest.approx(2.5e6, rel=1e-2)
    assert r.ratio == pytest.approx(0.625, rel=1e-2) and r.smallest_measured_fits
    # 2 epochs in 0.7 s is the same budget; a 0.1 s overhead leaves 300 us -> F = 2e6 -> r = 0.5.
    two_epochs = flops_budget_ratio(line_rows("A", 100.0, 1e-4), "A", "m", 0.7, 1000, 2)
    assert two_epochs.ratio == pytest.approx(0.625, rel=1e-2)
    r = flops_budget_ratio(line_rows("A", 100.0, 1e-4), "A", "m", 0.4, 1000, 1, round_overhead_s=0.1)
    assert r.ratio == pytest.approx(0.5, rel=1e-2)


def test_budget_ratio_clamps_and_reports() -> None:
    rows = line_rows("A", 100.0, 1e-4)
    dense = flops_budget_ratio(rows, "A", "m", 1.0, 1000, 1)  # 1000 us -> F = 9e6 > 4e6
    assert dense.ratio == 1.0 and dense.affordable_flops == pytest.approx(9e6, rel=1e-2) and "clamped" in dense.note
    small = flops_budget_ratio(rows, "A", "m", 0.15, 1000, 1)  # 150 us -> F = 5e5 < smallest 1e6
    assert small.ratio == pytest.approx(0.125, rel=1e-2)
    assert not small.smallest_measured_fits and "smallest measured" in small.note
    none = flops_budget_ratio(rows, "A", "m", 0.05, 1000, 1)  # 50 us < a = 100 us
    assert none.ratio is None and none.affordable_flops is None
    assert "exceeds" in none.note


def test_budgets_for_fleet() -> None:
    # B: 200 + 2e-3 F, 100 examples in 0.6 s -> 6000 us -> F = 2.9e6 -> r = 0.725.
    rows = line_rows("A", 100.0, 1e-4) + line_rows("B", 200.0, 2e-3) + failed_rows("C")
    budgets = budgets_for_fleet(
        pd.DataFrame(rows), "m", 0.6, {"A": 1000, "B": 100, "C": 10}, 1, round_overhead_s={"A": 0.25}
    )
    assert list(budgets) == ["A", "B", "C"]
    assert budgets["A"].ratio == pytest.approx(0.625, rel=1e-2)  # 0.35 s left -> as above
    assert budgets["B"].ratio == pytest.approx(0.725, rel=1e-2)
    assert budgets["C"].ratio is None and "no usable profile" in budgets["C"].note
    with pytest.raises(InputError, match="examples"):
        flops_budget_ratio(rows, "A", "m", 0.6, 0, 1)


def test_budget_of_a_zoo_model_is_solved_on_its_latency_model() -> None:
    from exporters.zoo import get_model
    from harness.latency import fit_device, train_flops_per_example

    # timings of fjord-cnn that grow faster than its FLOPs at small widths (a fixed cost per image)
    widths = (0.25, 0.5, 0.75, 1.0)
    rows = [
        {"device": "Z", "model": "fjord-cnn", "width": w, "batch": 20, "backend": "ort", "status": "ok",
         "median_us": 30.0 + 8e-5 * train_flops_per_example("fjord-cnn", w)}
        for w in widths
    ]  # fmt: skip
    lat = fit_device(rows).latency_model("fjord-cnn")
    budget_us = lat.predict_us(0.6)  # the time of width 0.6, which was never measured
    r = flops_budget_ratio(rows, "Z", "fjord-cnn", budget_us * 1e-6 * 1000, 1000, 1)
    dense = train_flops_per_example("fjord-cnn", 1.0)
    assert r.per_image_budget_us == pytest.approx(budget_us)
    # the affordable FLOPs lie between the architectures just below and above width 0.6
    top = max(get_model("fjord-cnn").arch(1.0).widths)
    below = max(k for k in range(1, top + 1) if lat.predict_us(k / top) <= budget_us)
    low, high = (train_flops_per_example("fjord-cnn", k / top) for k in (below, min(top, below + 1)))
    assert low * (1 - 1e-12) <= r.affordable_flops <= high * (1 + 1e-12)  # type: ignore[operator]
    assert r.ratio == pytest.approx(r.affordable_flops / dense) and r.smallest_measured_fits  # type: ignore[operator]
    none = flops_budget_ratio(rows, "Z", "fjord-cnn", 1e-6 * 1000, 1000, 1)  # 1 us per image
    assert none.ratio is None and "even one neuron per layer" in none.note
