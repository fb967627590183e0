"""Profiling campaigns end to end on an emulated fleet (real sshd, real runner, real store)."""

from __future__ import annotations

import json
import signal
import threading
import time
from pathlib import Path

import pytest

from devices.emulation import emulate
from exporters.flops import count
from exporters.manifest import EXPORT_FORMAT_VERSION
from exporters.zoo import get_model
from harness.campaign import run_campaign, start_device_thread, wait_for_devices
from harness.cells import plan_cells
from harness.progress import CellEvent
from harness.store import ProfileStore
from harness.store_errors import StoreUnavailable
from tests.conftest import SmallFileSystems
from tests.devices.conftest import kill_device
from tests.harness.campaigns import BATCH, MODEL, STEPS, TIMEOUT, WARMUP, WIDTHS, Counting, load, local_fleet_file

#: Two widths per device: a device that dies after its first cell still has one to lose, and each
#: cell's first pass is a runner process of its own, so every width more costs a process per device.
TWO_WIDTHS = WIDTHS[:2]


def test_campaign_device_dies_then_resume_then_warm_cache(fleet_file: Path, artifacts: Path, tmp_path: Path) -> None:
    fleet = load(fleet_file)
    alpha, beta = (d.name for d in fleet.devices[:2])
    n = len(fleet.devices) * len(TWO_WIDTHS)
    specs = plan_cells(fleet, MODEL, TWO_WIDTHS, [BATCH], ["ort"], STEPS, WARMUP, precision=0.0)
    store = ProfileStore(tmp_path / "fleetbench.db")

    def kill_beta_after_first(event: CellEvent) -> None:
        if event.device == beta and event.done == 1:
            kill_device(fleet, beta)

    progress = Counting(kill_beta_after_first)
    result = run_campaign(fleet, specs, store, artifacts_dir=artifacts, timeout=TIMEOUT, progress=progress)
    assert len(result.measurements) == len(specs) == n and not result.interrupted
    by_key = {m.spec.cell_key(): m for m in result.measurements}
    for spec in specs:
        m = by_key[spec.cell_key()]
        if spec.device == beta and spec.width != TWO_WIDTHS[0]:
            assert m.status in ("unreachable", "connection lost"), m
            assert m.message
        else:
            assert m.ok, (m.status, m.message)
            assert len(m.step_seconds) == STEPS and m.peak_memory_bytes and m.facts
    assert [e.done for e in progress.events if e.device == alpha] == [1, 2]
    assert {e.total for e in progress.events} == {len(TWO_WIDTHS)}

    # every cell is a stored row with derived statistics
    cells = store.latest_cells()
    assert len(cells) == n
    ok = cells[cells["status"] == "ok"]
    dead = len(TWO_WIDTHS) - 1
    assert len(ok) == n - dead and (ok["median_us"] > 0).all() and (ok["p95_us"] >= ok["median_us"]).all()
    model = get_model("fjord-cnn")
    expected_flops = {w: count(model, model.arch(w)).train_flops for w in TWO_WIDTHS}
    assert all(row.train_flops == expected_flops[row.width] for row in ok.itertuples())
    # the runtime's memory is read apart on the device: the same at every width, the model adding to it
    assert (ok["runtime_memory_bytes"] > 20 * 2**20).all() and (ok["model_memory_bytes"] > 0).all()
    spread = ok.groupby("device")["runtime_memory_bytes"].agg(lambda v: int(v.max() - v.min()))
    assert (spread < 4 * 2**20).all(), spread
    # the artifacts' export format is recorded with every cell (an FL run names a profile of another one)
    assert {json.loads(v)["export_format"] for v in cells["versions"]} == {str(EXPORT_FORMAT_VERSION)}
    assert set(cells["export_format"]) == {str(EXPORT_FORMAT_VERSION)}
    # fast keeps its emulated power sensor in the tests' fleet: each of its measured cells stores its energy per
    # image, marked so; the devices without one store none
    powered = ok[ok["device"] == "fast"]
    assert len(powered) and (powered["energy_j_per_image"] > 0).all(), powered[["device", "energy_flag"]]
    assert powered["energy_emulated"].all() and powered["energy_flag"].isna().all()
    assert (powered["energy_sensor"] == "ina3221-hwmon").all()
    assert ok.loc[ok["device"] != "fast", "energy_sensor"].isna().all()
    failed_keys = [s.cell_key() for s in specs if s.device == beta and s.width != TWO_WIDTHS[0]]
    assert store.measured_keys() == {s.cell_key() for s in specs} - set(failed_keys)

    # bring beta back: resume measures only the failed cells
    assert emulate.up(fleet, say=lambda line: None).ok
    resumed = run_campaign(
        fleet, specs, store, artifacts_dir=artifacts, timeout=TIMEOUT, resume=True, progress=Counting()
    )
    assert resumed.runner_invocations == dead and len(resumed.skipped) == n - dead
    assert [m.spec.cell_key() for m in resumed.measurements] == failed_keys
    assert all(m.ok for m in resumed.measurements)
    assert store.measured_keys() == {s.cell_key() for s in specs}

    # a second full campaign over the same artifacts pushes nothing
    again = run_campaign(fleet, specs, store, artifacts_dir=artifacts, timeout=TIMEOUT, progress=Counting())
    assert again.runner_invocations == n and all(m.ok for m in again.measurements)
    deploys = [d for per_device in again.deploys.values() for d in per_device]
    assert len(deploys) == n and sum(d.pushed_bytes for d in deploys) == 0


def test_stop_event_keeps_finished_cells_and_resume_completes(
    fleet_file: Path, artifacts: Path, tmp_path: Path
) -> None:
    fleet = load(fleet_file)
    assert emulate.up(fleet, say=lambda line: None).ok
    specs = plan_cells(fleet, MODEL, TWO_WIDTHS, [BATCH], ["ort"], STEPS, WARMUP, precision=0.0)
    store = ProfileStore(tmp_path / "fleetbench.db")
    stop = threading.Event()
    result = run_campaign(
        fleet, specs, store, artifacts_dir=artifacts, timeout=TIMEOUT, progress=lambda e: stop.set(), stop=stop
    )
    assert result.interrupted and not result.complete
    stored = store.measured_keys()
    n = len(specs)
    assert 1 <= len(stored) < n and stored == {m.spec.cell_key() for m in result.measurements if m.ok}
    resumed = run_campaign(
        fleet, specs, store, artifacts_dir=artifacts, timeout=TIMEOUT, resume=True, progress=Counting()
    )
    assert resumed.complete, [(m.status, m.message) for m in resumed.measurements]
    assert resumed.runner_invocations == n - len(stored)
    assert store.measured_keys() == {s.cell_key() for s in specs}


def test_a_store_that_fills_up_stops_the_campaign_in_one_error_and_resume_completes(
    artifacts: Path, tmp_path: Path, small_fs: SmallFileSystems
) -> None:
    fleet = load(local_fleet_file(tmp_path))
    specs = plan_cells(fleet, MODEL, WIDTHS[:3], [BATCH], ["ort"], 2, 1, precision=0.0)
    db = small_fs.mount("store", "2m") / "fleetbench.db"
    store = ProfileStore(db)
    filler: list[Path] = []

    def fill_after_first(event: CellEvent) -> None:
        if event.done == 1:
            filler.append(small_fs.fill(db.parent))

    with pytest.raises(StoreUnavailable, match="file system is full") as caught:
        run_campaign(fleet, specs, store, artifacts_dir=artifacts, timeout=TIMEOUT, progress=Counting(fill_after_first),
                     announce=lambda line: None)  # fmt: skip
    assert str(db) in str(caught.value) and "\n" not in str(caught.value)
    assert len(store.measured_keys()) == 1  # the cell stored before the disk filled up; none after it

    filler[0].unlink()
    resumed = run_campaign(fleet, specs, store, artifacts_dir=artifacts, timeout=TIMEOUT, resume=True,
                           progress=Counting(), announce=lambda line: None)  # fmt: skip
    assert resumed.complete and len(resumed.skipped) == 1 and len(resumed.measurements) == 2
    assert store._conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    store.close()


def _interrupt_main_after(seconds: float) -> None:
    """Deliver a real SIGINT to the main thread after ``seconds`` (as Ctrl-C does)."""
    main = threading.main_thread().ident
    assert main is not None
    threading.Timer(seconds, signal.pthread_kill, (main, signal.SIGINT)).start()


def test_a_ctrl_c_while_waiting_still_waits_for_the_device_storing_its_cell() -> None:
    """The first Ctrl-C stops the campaign, and the wait then lasts until the device's thread is over.

    Python 3.11's ``Thread.join``, interrupted, marks a thread that still runs as stopped: a wait
    built on it returned here at once, before the device had stored its cell.
    """
    assert threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    release, stored, stopped = threading.Event(), [], []

    def device() -> None:  # the cell in progress, stored once the stop has been seen
        assert release.wait(30)
        time.sleep(0.3)
        stored.append("cell")

    def interrupted() -> None:
        stopped.append(True)
        release.set()

    try:
        finished = [start_device_thread("campaign-d", device)]
        _interrupt_main_after(0.3)
        wait_for_devices(finished, interrupted)
    finally:
        signal.signal(signal.SIGINT, previous)
    assert len(stopped) == 1 and stored == ["cell"]
