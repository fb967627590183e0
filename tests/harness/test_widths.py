"""Width requests and widths chosen by the latency model (`harness.widths`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from devices.emulation import emulate
from exporters.userinput import InputError
from harness.cells import plan_cells
from harness.store import ProfileStore
from harness.widths import AUTO_CANDIDATES, choose_widths, parse_width_request
from tests.harness.campaigns import BATCH, MODEL, TIMEOUT, Counting, load


def test_width_requests() -> None:
    assert parse_width_request("0.25,0.5") == (0.25, 0.5)
    assert parse_width_request("auto:4") == 4
    for bad in ("auto:0", "auto:x", "auto:99", "0.25,2"):
        with pytest.raises(InputError):
            parse_width_request(bad)


def test_widths_chosen_by_the_model(fleet_file: Path, artifacts: Path, tmp_path: Path) -> None:
    fleet = load(fleet_file)
    assert emulate.up(fleet, say=lambda line: None).ok
    one = fleet.devices[:1]
    store = ProfileStore(tmp_path / "fleetbench.db")
    said: list[str] = []
    choice = choose_widths(
        fleet, store, 3,
        cells=lambda widths: plan_cells(one, MODEL, widths, [BATCH], ["ort"], 6, 5, precision=0.0),
        say=said.append, artifacts_dir=artifacts, timeout=TIMEOUT, progress=Counting(), announce=lambda line: None,
    )  # fmt: skip
    assert choice.complete and len(choice.widths) == 3 and len(choice.results) == 2
    assert choice.widths[:2] == [1.0, AUTO_CANDIDATES[0]]
    # the third is the candidate the fit on the first two was least sure of
    from harness.latency import choose_next_width, fit_device

    first_two = store.latest_cells()
    first_two = first_two[first_two["width"].isin(choice.widths[:2])]
    lat = fit_device(first_two).latency_model(MODEL)
    assert choice.widths[2] == choose_next_width([lat], AUTO_CANDIDATES, choice.widths[:2])[0]  # type: ignore[index]
    assert sorted(store.latest_cells()["width"]) == sorted(choice.widths)
    assert {r.campaign_id for r in choice.results} == {choice.results[0].campaign_id}  # one stored campaign
    assert any("most uncertain" in line for line in said)
