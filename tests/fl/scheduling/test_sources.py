"""Scheduling inputs: profiles read from a real store, memory budgets from a fleet (fl/scheduling/sources.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from devices.fleet import Device, Emulation, Fleet
from exporters.flops import count
from exporters.zoo import get_model
from fl import fluid
from fl.scheduling.rows import profile_rows
from fl.scheduling.sources import memory_budgets_from_fleet, profiles_from_store
from fl.scheduling.tiers import assign_tiers
from harness.records import BenchSpec, Measurement
from harness.store import ProfileStore

WIDTHS = (0.25, 0.5, 0.75, 1.0)


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
        # FLuID's straggler sizing straight from the loaded profiles (tests/fl/test_fluid.py works
        # the same curve by hand): full model 10 s, target 8 s -> 0.75 takes 8.75 s, 0.5 takes 7.5 s.
        curve = fluid.profile_curve(profiles["S"], "fjord-cnn", batch=20)
        assert curve is not None and curve[0] == (0.25, 0.5, 1.0)
        assert curve[1] == pytest.approx((500.0, 600.0, 800.0))
        assert fluid.straggler_rate(10.0, 8.0, WIDTHS, fluid.curve_predictor(*curve)) == 0.5
        # The whole table gives the failure reason of a device with failed cells only.
        cells = store.latest_cells()
    plan = assign_tiers(
        cells, "fjord-cnn", WIDTHS, deadline_s=1.0, examples_per_round={"S": 1000, "dead": 10}, epochs=1,
        batch=20, memory_budget_bytes=None, k=1,
    )  # fmt: skip
    assert "1 x unreachable" in plan.excluded["dead"]
    assert plan.choice("S").width == 1.0  # the fitted line stays near 800 us < 1000 us per image at 1.0
    assert len(profile_rows(cells)) == 7
