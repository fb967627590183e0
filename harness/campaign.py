"""Profiling campaigns: measure the matrix device x width x batch x backend.

A campaign is thin orchestration over the other harness pieces:

1. `harness.cells.plan_cells` turns the request into `BenchSpec` cells (pure);
2. `harness.isolation.plan_isolation` decides which devices may be measured at the same
   time (pure);
3. `run_campaign` exports every artifact set the cells need once, on the host
   (`harness.cells.export_sets`, plus the TorchScript model for torch cells), checks the
   bench data against them (`harness.bench_data`), stores the campaign and its isolation
   plan, prints the plan, then runs one thread per device (`harness.device_run.DeviceRun`),
   each starting when the plan lets it. On a device the cells run strictly one at a time,
   each stored as it finishes; with ``passes`` above 1 (the default,
   `harness.passes.DEFAULT_PASSES`) a cell's samples are spread over passes that devices
   sharing cpus take in turns (`harness.isolation.may_take_turn`), and pooled
   (`harness.passes.merge_passes`).

Ctrl-C sets a stop event; each device thread finishes (or times out) its current
cell, stores it and stops; `run_campaign` returns with ``interrupted=True`` and
`harness.profile_cli.cmd_profile` prints the command that resumes the campaign. A store
that a device thread cannot write (a full disk) sets the same event, and `run_campaign`
raises its `harness.store_errors.StoreUnavailable` once every thread has stopped.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from devices.connect import connect as default_connect
from devices.fleet import Device, Fleet
from devices.transport import Transport
from exporters.manifest import EXPORT_FORMAT_VERSION
from harness.bench_data import bench_data_file, check_bench_data
from harness.cells import export_sets, round_cost_config, round_cost_specs, set_key
from harness.device_run import Campaign, CampaignResult, DeviceRun, DeviceWork
from harness.isolation import Activity, Turns, pinned_cpus, plan_isolation
from harness.passes import DEFAULT_PASSES
from harness.progress import CellEvent, print_progress
from harness.records import BenchSpec, model_record

if TYPE_CHECKING:
    from harness.store import ProfileStore


def run_campaign(
    fleet: Fleet,
    specs: Sequence[BenchSpec],
    store: ProfileStore,
    *,
    artifacts_dir: Path | str,
    timeout: float,
    resume: bool = False,
    connect: Callable[[Device], Transport] = default_connect,
    clock: Callable[[], float] = time.time,
    progress: Callable[[CellEvent], None] = print_progress,
    stop: threading.Event | None = None,
    announce: Callable[[str], None] | None = None,
    campaign_id: int | None = None,
    round_cost: bool = False,
    data: Path | str | None = None,
    passes: int = DEFAULT_PASSES,
    interleave: bool = True,
) -> CampaignResult:
    """Measure ``specs`` on the fleet and store every cell as it finishes.

    Parameters
    ----------
    fleet : Fleet
        Devices named by the cells.
    specs : sequence of BenchSpec
        Cells to measure (`harness.cells.plan_cells`).
    store : harness.store.ProfileStore
        Where each cell is recorded (one transaction per cell).
    artifacts_dir : path
        Artifact cache root on the host.
    timeout : float
        Seconds per cell (connect, deploy and runner each bounded by it).
    resume : bool
        Skip cells whose key the store already has measured.
    connect : callable
        ``connect(device) -> Transport`` (injected for tests).
    clock : callable
        Unix time source for the records' timestamps.
    progress : callable
        Called with a `CellEvent` after every stored cell, from the device's thread.
    stop : threading.Event, optional
        Set it to stop after the cells in progress (Ctrl-C sets it too).
    announce : callable, optional
        Receives the isolation plan's lines before anything is measured (default: stderr).
    campaign_id : int, optional
        Add the cells to this stored campaign instead of starting one (`harness.widths.choose_widths`).
    round_cost : bool
        After a device's cells, measure its round cost (`harness.roundcost`) for every
        configuration of ``specs`` (`harness.cells.round_cost_specs`), in the device's turn; with
        ``resume``, only configurations without a stored successful one.
    data : path, optional
        The bench data of cells planned with it (``plan_cells(data=bench_data_label(data))``,
        `harness.bench_data`):
        an ``.npz`` shard deployed once per device; their steps, and the round-cost
        requests, train on it instead of random inputs.
    passes : int
        Passes each cell's time cap is split over (`harness.device_run.DeviceRun`; 1: one run per cell,
        in a process of its own). Cells of a fixed sample count (precision 0) take one.
    interleave : bool
        Devices that share cpus take turns pass by pass (`harness.isolation.may_take_turn`; the default), so
        that a stretch in which the host is slow falls on one pass of a cell, not on all;
        False: each device runs all its passes in one turn.

    Returns
    -------
    CampaignResult

    Raises
    ------
    exporters.userinput.InputError
        Before anything is measured, when cells name bench data that ``data`` is not, or
        the file does not fit their models (`check_bench_data`).
    exporters.host_disk.DiskFull
        Before anything is measured, when the artifact cache has no room for a set.
    harness.store_errors.StoreUnavailable
        When the store could not be written (a full disk): raised after every device
        stopped; the cells stored before stay stored.
    """
    stop = stop or threading.Event()
    say = announce if announce is not None else (lambda line: print(line, file=sys.stderr, flush=True))
    data = bench_data_file(specs, data)
    done_keys = store.measured_keys() if resume else set()
    todo = [s for s in specs if s.cell_key() not in done_keys]
    skipped = [s for s in specs if s.cell_key() in done_keys]
    from harness.provenance import git_commit, host_versions

    versions, commit = {**host_versions(), "export_format": str(EXPORT_FORMAT_VERSION)}, git_commit()
    by_device: dict[str, list[BenchSpec]] = {}
    for spec in todo:
        by_device.setdefault(spec.device, []).append(spec)
    costs_by_device: dict[str, list[BenchSpec]] = {}
    if round_cost:
        stored = {(c.device, c.model, c.batch, c.backend, c.optimizer, c.threads) for c in store.round_costs()}
        for spec in round_cost_specs(specs):
            if resume and (spec.device, *round_cost_config(spec)) in stored:
                continue
            costs_by_device.setdefault(spec.device, []).append(spec)
            by_device.setdefault(spec.device, [])
    devices = [d for d in fleet.devices if d.name in by_device]
    plan = plan_isolation(devices, pinned_cpus(fleet))
    cost_specs = [spec for specs_of in costs_by_device.values() for spec in specs_of]
    sets = export_sets([*todo, *cost_specs], Path(artifacts_dir)) if todo or cost_specs else {}
    if data is not None:  # refused before the campaign is stored
        set_dirs = {sets[set_key(s)] for s in [*todo, *cost_specs] if s.data}
        check_bench_data(data, [json.loads((d / "manifest.json").read_text()) for d in sorted(set_dirs)])
    if campaign_id is None:
        models = sorted({s.model for s in specs})
        campaign_id = store.start_campaign(
            fleet=str(fleet.path), model=",".join(models) or None, versions=versions, commit=commit,
            started_at=clock(), plan=plan.to_dict(),
        )  # fmt: skip
    from exporters.zoo import get_model

    for name in sorted({s.model for s in specs}):
        record = model_record(get_model(name))
        if record is not None:
            store.record_model(record)
    result = CampaignResult(campaign_id=campaign_id, skipped=skipped, plan=plan if todo or cost_specs else None)
    if not todo and not cost_specs:
        return result
    for line in plan.describe():
        say(line)
    shared = Campaign(
        id=campaign_id, store=store, sets=sets, timeout=timeout, passes=max(1, int(passes)), interleave=interleave,
        data=data, scratch=Path(artifacts_dir) / ".roundcost", versions=versions, git_commit=commit,
        connect=connect, clock=clock, progress=progress, say=say, stop=stop, plan=plan,
        turns=Turns(plan, by_device), activity=Activity(), result=result, lock=threading.Lock(),
    )  # fmt: skip
    finished = []
    for name, cells in by_device.items():
        work = DeviceWork(fleet.device(name), tuple(cells), tuple(costs_by_device.get(name, ())))
        finished.append(start_device_thread(f"campaign-{name}", DeviceRun(work, shared)))

    def interrupted() -> None:
        stop.set()
        result.interrupted = True
        say_now = "fleetbench: stopping after the cells in progress (Ctrl-C again to quit now)"
        print(say_now, file=sys.stderr, flush=True)

    wait_for_devices(finished, interrupted)
    if result.store_failure is not None:
        raise result.store_failure
    if stop.is_set():
        result.interrupted = True
    return result


def start_device_thread(name: str, work: Callable[[], None]) -> threading.Event:
    """Run ``work`` in a daemon thread called ``name``; return the event set when it has returned or raised.

    Parameters
    ----------
    name : str
    work : callable
        A device's share of the campaign (`harness.device_run.DeviceRun`).

    Returns
    -------
    threading.Event
        Set once ``work`` is over, whichever way it ended.
    """
    finished = threading.Event()

    def run() -> None:
        try:
            work()
        finally:
            finished.set()

    threading.Thread(target=run, name=name, daemon=True).start()
    return finished


def wait_for_devices(finished: Sequence[threading.Event], interrupted: Callable[[], None]) -> None:
    """Wait until every device thread is over; at the first Ctrl-C call ``interrupted`` and wait on.

    The wait is on each thread's own event (`start_device_thread`), not on ``Thread.join``:
    on Python 3.11, a KeyboardInterrupt that lands inside ``join`` releases the thread's
    state lock on its behalf and marks it stopped while it still runs, so a loop over
    ``is_alive`` would return, and the store be closed, before that device had stored the
    cell in progress.

    Parameters
    ----------
    finished : sequence of threading.Event
    interrupted : callable
        Called once, from the waiting thread, when the first KeyboardInterrupt arrives; a
        second one propagates (the user's "quit now").
    """

    def every_one() -> None:
        for event in finished:
            while not event.wait(0.2):
                pass

    try:
        every_one()
    except KeyboardInterrupt:
        interrupted()
        every_one()
