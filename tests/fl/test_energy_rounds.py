"""Energy per client round in the run log: predicted from the profiles, measured by the device, summed per round."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest

from exporters.flops import count
from exporters.zoo import get_model
from fl.executors.devices import energy_metrics
from fl.executors.inprocess import InProcessExecutor
from fl.population import Population, VirtualClock
from fl.runlog import FL_MIGRATIONS, ClientRound, RunLog, round_energy_totals
from fl.scheduling.energy import energy_cells, energy_curves, round_energy
from fl.server import format_round, predicted_energy, run_clock_only, run_fl
from harness.store import ProfileStore
from tests.fl.test_runlog import start
from tests.fl.test_server import (
    CAPACITIES,
    DEVICES,
    FACTORS,
    blob_data,
    config,
    hand_cost,
    registered,  # noqa: F401 - the fixture
)

ZOO = get_model("fjord-cnn")
#: joules per image measured at widths 0.5 and 1.0; 'slow' spends three times 'fast''s.
JOULES = {"fast": {0.5: 0.001, 1.0: 0.004}, "slow": {0.5: 0.003, 1.0: 0.012}}

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def flops(width: float) -> float:
    return float(count(ZOO, ZOO.arch(width)).train_flops)


def profiles(emulated: bool = True) -> dict[str, list[dict[str, object]]]:
    return {
        device: [
            {
                "device": device, "model": "fjord-cnn", "width": w, "status": "ok", "train_flops": flops(w),
                "energy_j_per_image": j, "energy_flag": None, "energy_emulated": emulated,
            }  # fmt: skip
            for w, j in table.items()
        ]
        for device, table in JOULES.items()
    }


# -- the energy view ---------------------------------------------------------------------------


def test_energy_cells_take_the_median_and_keep_a_flagged_widths_reason() -> None:
    rows = [
        {"device": "a", "model": "m", "width": 0.5, "status": "ok", "energy_j_per_image": j, "train_flops": 2.0}
        for j in (1.0, 3.0, 2.0)
    ]
    rows += [
        {"device": "a", "model": "m", "width": 1.0, "status": "ok", "energy_j_per_image": None,
         "energy_flag": "external-power", "train_flops": 4.0},
        {"device": "a", "model": "m", "width": 0.25, "status": "timeout", "energy_j_per_image": 9.0},
    ]  # fmt: skip
    cells = {(c.width): c for c in energy_cells(rows)}
    assert set(cells) == {0.5, 1.0}
    assert cells[0.5].joules_per_image == 2.0 and cells[0.5].flag is None
    assert cells[1.0].joules_per_image is None and cells[1.0].flag == "external-power"
    [curve] = energy_curves(cells.values(), "m", lambda w: 4.0 * w).values()
    assert curve.points == ((0.5, 2.0, 2.0),)


def test_a_curve_interpolates_in_flops_and_extrapolates_per_flop() -> None:
    [curve] = energy_curves(energy_cells(profiles()["fast"]), "fjord-cnn", flops).values()
    assert curve.at(1.0, flops).joules_per_image == 0.004 and not curve.at(1.0, flops).extrapolated
    middle = flops(0.75)
    share = (middle - flops(0.5)) / (flops(1.0) - flops(0.5))
    assert curve.at(0.75, flops).joules_per_image == pytest.approx(0.001 + share * 0.003)
    low = curve.at(0.25, flops)
    assert low.extrapolated and low.joules_per_image == pytest.approx(0.001 / flops(0.5) * flops(0.25))
    joules, extrapolated = round_energy(curve, [0.5, 1.0], 100, flops, shares=[3, 1])
    assert joules == pytest.approx((3 * 0.001 + 0.004) / 4 * 100) and not extrapolated


# -- the run log -------------------------------------------------------------------------------


def test_energy_columns_round_trip_and_a_round_holds_their_sums(tmp_path: Path) -> None:
    path = tmp_path / "v7.db"
    with ProfileStore(path) as old:
        old.ensure_schema("fl", FL_MIGRATIONS[:7])  # the log as it was before energy
    with ProfileStore(path) as upgraded:
        log = RunLog(upgraded)
        run_id = start(log)
        clients = [
            ClientRound("c0", 1.0, "ok", predicted_energy_j=2.0, measured_energy_j=2.2, energy_emulated=True),
            ClientRound("c1", 0.5, "ok", predicted_energy_j=0.5),
            ClientRound("c2", 0.5, "timeout"),
        ]
        log.log_round(
            run_id, 0, started_at=1.0, finished_at=2.0, wall_seconds=1.0, metrics={}, evaluation={},
            clients=clients, checkpoint={"round": 0},
        )  # fmt: skip
        rows = log.client_rounds(run_id).set_index("cid")
        rounds = log.rounds(run_id)
    assert rows.loc["c0", "predicted_energy_j"] == 2.0 and rows.loc["c0", "measured_energy_j"] == 2.2
    assert rows.loc["c0", "energy_emulated"] is True and rows.loc["c1", "energy_emulated"] is None
    assert pd.isna(rows.loc["c1", "measured_energy_j"]) and pd.isna(rows.loc["c2", "predicted_energy_j"])
    assert list(rounds["predicted_energy_j"]) == [2.5] and list(rounds["measured_energy_j"]) == [2.2]
    assert round_energy_totals(clients[2:]) == (None, None)


def test_energy_metrics_of_a_train_documents_reading() -> None:
    reading = SimpleNamespace(joules_per_image=0.01, emulated=True)
    assert energy_metrics(reading, 120) == {"energy_j": pytest.approx(1.2), "energy_emulated": 1.0}
    assert energy_metrics(SimpleNamespace(joules_per_image=None, emulated=False), 120) == {}
    assert energy_metrics(None, 120) == {}


# -- runs --------------------------------------------------------------------------------------


class MeteredExecutor(InProcessExecutor):
    """Trains in process and reports each client round as measured at 1.5 J by an emulated sensor."""

    def run(self, instructions, shards, timeout_s=None):  # type: ignore[no-untyped-def]
        results, failures = super().run(instructions, shards, timeout_s)
        metered = {"energy_j": 1.5, "energy_emulated": 1.0}
        return [dataclasses.replace(r, metrics={**r.metrics, **metered}) for r in results], failures


@pytest.mark.usefixtures("registered")
def test_a_population_run_logs_virtual_and_measured_energy(tmp_path: Path) -> None:
    cfg = config(tmp_path, rounds=1)
    clock = VirtualClock(Population(DEVICES, FACTORS), hand_cost, seed=cfg.seed)
    summary = run_fl(
        cfg, data=blob_data(4, 10), capacities=CAPACITIES, virtual=clock, profiles=profiles(),
        executor=MeteredExecutor(ZOO), progress=None,
    )  # fmt: skip
    with ProfileStore(cfg.db) as store:
        rows = RunLog(store).client_rounds(summary.run_id).set_index("cid")
    # client i holds 10 + i examples, trains 2 epochs at its capacity on its device
    expected = {
        f"c{i}": JOULES[DEVICES[i]][CAPACITIES[i]] * (10 + i) * cfg.epochs for i in range(4)
    }
    assert rows["predicted_energy_j"].to_dict() == pytest.approx(expected)
    assert set(rows["measured_energy_j"]) == {1.5} and set(rows["energy_emulated"]) == {True}
    (round0,) = summary.history
    assert round0.predicted_energy_j == pytest.approx(sum(expected.values()))
    assert round0.measured_energy_j == pytest.approx(6.0)
    assert f"{round0.predicted_energy_j:.4g} J" in format_round(round0, 1)


@pytest.mark.usefixtures("registered")
def test_clock_only_rounds_sum_the_virtual_energy_of_every_simulated_client(tmp_path: Path) -> None:
    cfg = dataclasses.replace(config(tmp_path, rounds=2, per_round=3), deadline_s=None)
    clock = VirtualClock(Population(DEVICES, FACTORS), hand_cost, seed=cfg.seed, deadline_s=2.0)
    examples = [10, 11, 12, 13]
    summary = run_clock_only(
        cfg, clock, examples=examples, capacities=CAPACITIES, progress=None, profiles=profiles()
    )
    with ProfileStore(cfg.db) as store:
        rows = RunLog(store).client_rounds(summary.run_id)
    for row in rows.itertuples(index=False):
        i = int(row.cid[1:])
        assert row.predicted_energy_j == pytest.approx(JOULES[DEVICES[i]][CAPACITIES[i]] * examples[i] * cfg.epochs)
    for h in summary.history:
        assert h.predicted_energy_j == pytest.approx(rows[rows["round"] == h.round]["predicted_energy_j"].sum())
        assert h.measured_energy_j is None and "J)" in format_round(h, 2)


def test_a_device_without_energy_predicts_none() -> None:
    curves = energy_curves(energy_cells(profiles()["fast"]), "fjord-cnn", flops)
    assert predicted_energy(curves, "fjord-cnn", "slow", {1.0: 1.0}, 10, 1) is None
    assert predicted_energy(curves, "fjord-cnn", None, {1.0: 1.0}, 10, 1) is None
    assert predicted_energy(curves, "fjord-cnn", "fast", {1.0: 1.0}, 10, 2) == pytest.approx(0.08)
