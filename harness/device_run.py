"""One device's part of a campaign: its cells, one at a time, in the device's own thread.

A `DeviceRun` connects, takes one facts snapshot, deploys the runner and every ONNX
Runtime set the device's cells need in one deployment (content-addressed cache, so an
unchanged set pushes nothing; `harness.deploy.deploy_artifact_sets`: three remote commands
for all the sets instead of three or four per set, as every remote command starts
processes a device held to a small CPU share pays for), runs ``runner.pyz bench`` under the
per-cell timeout (the runner samples until the median is precise or its cap, see
`harness.runner.sampling`), parses its JSON document and stores the `Measurement` at once (one
transaction per cell, so an interrupted campaign loses no finished cell). With ``passes``
above 1 that run is the cell's first pass, on its share of the cap; the device's resident
runner then takes the later passes of every cell in turn, and a cell is stored after its
last (`harness.passes.merge_passes`). Devices that share cpus take turns pass by pass
(`harness.isolation.may_take_turn`), so a cell's passes lie apart in time.

Failure policy:

- a `TransportError` during a cell records the cell with the error's ``kind``
  (``unreachable``, ``timeout``, ``connection lost``, ...); the transport is closed
  and the next cell reconnects;
- a device whose file system is full records the cell as ``out of space``
  (`devices.errors.OutOfSpace` from a push or a deployment step, or the runner's own
  status), its message naming the device, the path and what failed; the other cells
  and devices go on (a later cell finds the space freed, or fails the same way);
- a store that cannot be written (`harness.store_errors.StoreUnavailable`: a full disk on the
  host, a lock held too long) stops the campaign: the device keeps the error in
  `CampaignResult.store_failure` and sets the stop event, every device stops after its
  cell in progress, and `harness.campaign.run_campaign` raises it (one line on the
  command line); every cell stored before it stays, for ``--resume``;
- after a failure that says the device cannot be reached at all (`DEVICE_DOWN_KINDS`)
  the device's remaining cells are recorded as failed with the same kind without being
  tried, so a dead device costs at most one connect timeout, never one per cell;
- the runner's status (its JSON ``status``, else its exit code; see
  `harness.contract.parse_output`) becomes the cell's status; output that is not
  a JSON document is a ``runner error``.
"""

from __future__ import annotations

import json
import math
import statistics
import sys
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from devices.errors import OutOfSpace, TransportError
from devices.fleet import Device
from devices.transport import Transport
from harness import contract, runner_archive
from harness.cells import SetKey, set_key
from harness.document import EMPTY_DOCUMENT, RunnerDocument, parse_document
from harness.isolation import Activity, IsolationPlan, Turns
from harness.passes import measurement_from_doc, merge_passes
from harness.progress import CellEvent
from harness.records import BenchSpec, Measurement

if TYPE_CHECKING:
    from harness.store import ProfileStore

#: Failure kinds after which a device's remaining cells are not tried.
DEVICE_DOWN_KINDS = frozenset({"unreachable", "authentication failed", "host key rejected"})

#: Seconds the facts probe may take (bounded by the cell timeout too).
FACTS_TIMEOUT_S = 30.0


class MissingBackend(TransportError):
    """The device's runtime cannot run the cell's backend (a runtime bundle runs ``onnx`` only)."""

    kind = "missing runtime"


@dataclass
class CampaignResult:
    """What `harness.campaign.run_campaign` did (every device run adds to it, under `Campaign.lock`).

    Attributes
    ----------
    campaign_id : int
        The store's id of this campaign.
    measurements : list of Measurement
        Every cell stored by this run, in completion order.
    skipped : list of BenchSpec
        Cells not run because the store already had them measured (resume).
    deploys : dict
        Device name -> list of ``harness.deploy.DeployResult`` (one per artifact set).
    runner_invocations : int
        ``runner.pyz bench`` processes actually started on devices (one per cell: its first pass).
    resident_requests : int
        Bench requests sent to resident runners (the cells' later passes).
    interrupted : bool
        True when the stop event was set before every cell ran.
    plan : harness.isolation.IsolationPlan or None
        Which devices were allowed to run at the same time (None when nothing ran).
    round_costs : dict
        Device name -> list of `harness.roundcost.RoundCostModel` measured by this run.
    round_cost_failures : dict
        Device name -> list of one-line reasons a round-cost measurement failed.
    store_failure : Exception or None
        The first `harness.store_errors.StoreUnavailable` a device run met recording a cell (it
        stopped the campaign; `harness.campaign.run_campaign` raises it).
    """

    campaign_id: int
    measurements: list[Measurement] = field(default_factory=list)
    skipped: list[BenchSpec] = field(default_factory=list)
    deploys: dict[str, list[Any]] = field(default_factory=dict)
    runner_invocations: int = 0
    resident_requests: int = 0
    interrupted: bool = False
    plan: IsolationPlan | None = None
    round_costs: dict[str, list[Any]] = field(default_factory=dict)
    round_cost_failures: dict[str, list[str]] = field(default_factory=dict)
    store_failure: Exception | None = None

    @property
    def complete(self) -> bool:
        """Whether every planned cell (and round-cost measurement) is measured (now or before, when resumed)."""
        return not self.interrupted and all(m.ok for m in self.measurements) and not self.round_cost_failures


#: On a device held to a CPU share by a CFS quota, a timed sample may start and end inside a
#: throttled gap of up to ``(1 - share / threads)`` of a period; samples span enough periods
#: that this is at most this fraction of a sample (see the runner's ``--sample-seconds``).
EMULATED_BLOCK_ERROR = 0.04


def sample_seconds_for(device: Device) -> float:
    """Return the runner's ``--sample-seconds`` for ``device``.

    Parameters
    ----------
    device : Device

    Returns
    -------
    float
        For a device emulated with a CPU share (its own or its preset's) below its
        runner's threads, so that the quota really throttles it:
        ``period * (1 - share / threads) / EMULATED_BLOCK_ERROR`` (0.215 s for a Pi 3's
        0.14 of a core at the 10 ms period of `devices.emulation.limits.PERIOD_US`, 0.1 s at 0.6);
        else 0 (every step is one sample: a share of at least ``threads`` cores never
        stops the runner's threads, and its single steps are not bimodal).
    """
    from devices.emulation.limits import PERIOD_US

    share = quota_share(device)
    if share is None or share >= device.threads:
        return 0.0
    return PERIOD_US * 1e-6 * (1.0 - share / device.threads) / EMULATED_BLOCK_ERROR


def quota_share(device: Device) -> float | None:
    """Return the CPU share (cores) ``device`` is emulated with, its own or its preset's.

    Parameters
    ----------
    device : Device

    Returns
    -------
    float or None
        None for a device that is not emulated or has no CPU share.
    """
    from devices.emulation.presets import resolve

    return None if device.emulate is None else resolve(device.emulate).cpu_share


@dataclass(frozen=True)
class DeviceWork:
    """What one device measures in a campaign.

    Attributes
    ----------
    device : Device
    specs : tuple of BenchSpec
        Its cells, in plan order.
    cost_specs : tuple of BenchSpec
        The cells whose configuration gets a round-cost measurement after its cells
        (`harness.cells.round_cost_specs`).
    """

    device: Device
    specs: tuple[BenchSpec, ...]
    cost_specs: tuple[BenchSpec, ...] = ()


@dataclass(frozen=True)
class Campaign:
    """What every device run of one campaign shares: how it measures, where it records, how the devices take turns.

    Attributes
    ----------
    id : int
        The store's id of the campaign.
    store : harness.store.ProfileStore
        Where each cell and round cost is recorded.
    sets : mapping
        `harness.cells.SetKey` -> artifact set directory on the host (`harness.cells.export_sets`).
    timeout : float
        Seconds per cell (connect, deploy and runner each bounded by it).
    passes : int
        Passes each cell's time cap is split over (at least 1).
    interleave : bool
        Each pass is a turn of its own (`harness.isolation.may_take_turn`); False: a device
        takes all its passes in one turn.
    data : pathlib.Path or None
        The bench data file of cells planned with it (`harness.bench_data`); None: random batches.
    scratch : pathlib.Path or None
        Host directory for the round-cost step's transfer files.
    versions : mapping of str to str
        Host tool versions, recorded with every cell.
    git_commit : str or None
        The fleetbench commit, recorded with every cell.
    connect : callable
        ``connect(device) -> Transport``.
    clock : callable
        Unix time source for the records' timestamps.
    progress : callable
        Called with a `harness.progress.CellEvent` after every stored cell.
    say : callable or None
        Receives the lines said between stored cells (passes done, round costs).
    stop : threading.Event
        Set: each device stops after its cell in progress.
    plan : harness.isolation.IsolationPlan
        Which devices may be measured at the same time.
    turns : harness.isolation.Turns
        The turn each device has finished.
    activity : harness.isolation.Activity
        Which devices are busy, for the cells' isolation records.
    result : CampaignResult
        What the campaign did, filled in by every device run under ``lock``.
    lock : threading.Lock
    """

    id: int
    store: ProfileStore
    sets: Mapping[SetKey, Path]
    timeout: float
    passes: int
    interleave: bool
    data: Path | None
    scratch: Path | None
    versions: Mapping[str, str]
    git_commit: str | None
    connect: Callable[[Device], Transport]
    clock: Callable[[], float]
    progress: Callable[[CellEvent], None]
    say: Callable[[str], None] | None
    stop: threading.Event
    plan: IsolationPlan
    turns: Turns
    activity: Activity
    result: CampaignResult
    lock: threading.Lock


@dataclass
class _Cell:
    """One cell on its way through its passes: the documents of the passes measured so far."""

    spec: BenchSpec
    started: float
    passes: int
    status: str = "runner error"
    message: str = ""
    docs: list[RunnerDocument] = field(default_factory=list)
    concurrent: set[str] = field(default_factory=set)
    pass_failure: str = ""
    finished: bool = False


class DeviceRun:
    """The cells of one device, run one at a time in this device's thread.

    With `Campaign.passes` above 1, each cell's time cap is split over that many passes:
    every cell's first pass runs ``runner.pyz bench`` in a process of its own (as with one
    pass), then pass 2 of every cell, pass 3 of every cell, ... run as requests to the
    device's resident runner (`harness.resident.ResidentRunner`), and each cell is stored
    after its last pass (`merge_passes`). With `Campaign.interleave` each pass is a turn of
    its own (`harness.isolation.may_take_turn`): devices that share cpus run their pass k
    one after another before any runs pass k + 1, so a cell's passes lie a whole round of turns apart and do not all
    fall in one window in which the host slows the device. Without it the device takes
    all its passes in one turn. Its round costs run in its last turn.
    """

    def __init__(self, work: DeviceWork, campaign: Campaign) -> None:
        from harness.resident import ResidentRunner

        self.work, self.campaign = work, campaign
        self.residents: dict[tuple[str, int], ResidentRunner] = {}
        self.workdir: str | None = None
        self.remote_data: str | None = None
        self.transport: Transport | None = None
        self.prefetched = False
        self.facts: dict[str, Any] | None = None
        self.runner_remote: str | None = None
        self.start: contract.RunnerStart | None = None
        self.remote_sets: dict[tuple[Path, bool], str] = {}

    @property
    def device(self) -> Device:
        """The device this run measures."""
        return self.work.device

    def _transport(self) -> Transport:
        if self.transport is None:
            self.transport = self.campaign.connect(self.device)
        return self.transport

    def _drop_transport(self) -> None:
        residents, self.residents = list(self.residents.values()), {}
        for resident in residents:
            resident.close()
        if self.transport is not None:
            try:
                self.transport.close()
            except Exception:  # noqa: BLE001 - closing a broken connection must not mask the failure
                pass
            self.transport = None

    def _prefetch(self, transport: Transport) -> None:
        """Deploy every ONNX Runtime set the device's cells need in one deployment (`deploy_artifact_sets`).

        One check, push, commit and materialise for the whole campaign instead of one of
        each per set: every remote command starts processes, which a device held to a small
        CPU share pays for. Torch cells keep their own deployment (`_prepare`).
        """
        from harness.deploy import deploy_artifact_sets

        self.prefetched = True
        wanted = list(
            dict.fromkeys(self.campaign.sets[set_key(spec)] for spec in self.work.specs if spec.backend != "torch")
        )
        if not wanted:
            return
        deployed = deploy_artifact_sets(transport, self.device, wanted, timeout=self.campaign.timeout)
        with self.campaign.lock:
            self.campaign.result.deploys.setdefault(self.device.name, []).extend(deployed)
        for set_dir, result in zip(wanted, deployed, strict=True):
            self.remote_sets[(set_dir, False)] = str(result.remote_dir)
            self.workdir = self.workdir or result.workdir

    def _runner_start(self) -> contract.RunnerStart:
        """How the device starts the runner (`_prepare` chose it)."""
        assert self.start is not None, "_prepare chooses the runner's start"
        return self.start

    def _prepare(self, set_dir: Path, backend: str) -> tuple[Transport, str, str]:
        """Connect, snapshot facts, deploy runner and set (each once per device).

        A torch cell gets the set with its ``model.pt`` (`harness.deploy.deploy_set_for`).
        """
        from devices.facts import probe_device
        from harness.deploy import deploy_files, deploy_runner, deploy_set_for

        transport = self._transport()
        if self.start is None:  # a phone without Python gets its runtime bundle (harness.phone_runtime)
            from harness.phone_runtime import runner_start

            self.start = runner_start(transport, self.device, timeout=self.campaign.timeout, say=print)
        if self.facts is None:  # what the runner's Python sees
            timeout = min(FACTS_TIMEOUT_S, self.campaign.timeout)
            facts = probe_device(transport, self.start.argv, timeout=timeout, power_root=self.device.power_root)
            self.facts = facts.to_dict()
        if not self.start.offers(backend):
            raise MissingBackend(f"{self.device.name}: the {backend} backend does not run on {self.start.detail}")
        if not self.prefetched:
            self._prefetch(transport)
        if self.runner_remote is None:
            self.runner_remote = str(
                deploy_runner(transport, self.device, runner_archive.archive_path(), timeout=self.campaign.timeout)
            )
        if self.campaign.data is not None and self.remote_data is None:
            shard = deploy_files(
                transport, self.device, [self.campaign.data], into="data", timeout=self.campaign.timeout
            )
            self.remote_data = shard.remote_paths[self.campaign.data.name]
        key = (set_dir, backend == "torch")
        if key not in self.remote_sets:
            deployed = deploy_set_for(transport, self.device, set_dir, backend, timeout=self.campaign.timeout)
            with self.campaign.lock:
                self.campaign.result.deploys.setdefault(self.device.name, []).append(deployed)
            self.remote_sets[key] = str(deployed.remote_dir)
            self.workdir = self.workdir or deployed.workdir
        return transport, self.runner_remote, self.remote_sets[key]

    def _passes_of(self, spec: BenchSpec) -> int:
        # a fixed count of samples (precision 0) is one run's count: it is not split
        return self.campaign.passes if spec.precision > 0 else 1

    def _pass_options(self, spec: BenchSpec, passes: int) -> dict[str, Any]:
        """Return the `harness.contract.bench_options` of one of ``spec``'s ``passes`` passes (its share of the cap).

        A device whose facts list a power sensor, or with an emulated one, measures each
        pass's energy too (`harness.contract.power_options`).
        """
        emulated_power = self.device.emulate is not None and self.device.emulate.power is not None
        return {
            "backend": spec.backend, "warmup": spec.warmup, "steps": -(-spec.steps // passes), "threads": spec.threads,
            "sample_seconds": sample_seconds_for(self.device), "precision": spec.precision,
            "max_seconds": spec.max_seconds / passes,
            **contract.power_options(self.device.power_root, self.facts, emulated_power),
        }  # fmt: skip

    def _first_pass(self, spec: BenchSpec) -> _Cell:
        """Run ``spec``'s first pass as ``runner.pyz bench`` in a process of its own."""
        cell = _Cell(spec, self.campaign.clock(), self._passes_of(spec))
        self.campaign.activity.cell_started(self.device.name)
        try:
            set_dir = self.campaign.sets[set_key(spec)]
            transport, runner, remote_set = self._prepare(set_dir, spec.backend)
            with self.campaign.lock:
                self.campaign.result.runner_invocations += 1
            argv = contract.bench_argv(
                self._runner_start(), runner, remote_set, **self._pass_options(spec, cell.passes),
                data=self.remote_data if spec.data else None,
            )  # fmt: skip
            run = transport.run(argv, timeout=self.campaign.timeout)
            output = contract.parse_output(run.rc, run.stdout, run.stderr)
            cell.status, cell.message = output.status, self._named(output.status, output.message)
            if output.document.raw:
                # The analytic counts travel with the cell, so stored rows carry train FLOPs.
                manifest = json.loads((set_dir / "manifest.json").read_text())
                cell.docs.append(parse_document({**output.document.raw, "counts": manifest.get("counts", {})}))
        except TransportError as exc:
            cell.status, cell.message = exc.kind, self._reason(exc)
            self._drop_transport()
        except Exception as exc:  # noqa: BLE001 - one broken cell is a record, never a crashed campaign
            cell.status, cell.message = "runner error", f"{type(exc).__name__}: {exc}"
            self._drop_transport()
        cell.concurrent |= self.campaign.activity.cell_finished(self.device.name)
        return cell

    def _reason(self, exc: TransportError) -> str:
        """Return the message of a cell that ``exc`` failed (`_named`)."""
        return self._named(exc.kind, str(exc) or type(exc).__name__)

    def _named(self, status: str, message: str) -> str:
        """Return a failed cell's message; an ``out of space`` one is led by the device's name."""
        name = self.device.name
        if status == OutOfSpace.kind and not message.startswith(f"{name}: "):
            return f"{name}: {message}"
        return message

    def _later_pass(self, cell: _Cell, number: int) -> tuple[str, str] | None:
        """Run pass ``number`` of ``cell`` on the device's resident runner; the failure when the device is gone."""
        from harness.resident import ResidentRunner

        spec, name = cell.spec, self.device.name
        self.campaign.activity.cell_started(name)
        down, reason = None, ""
        try:
            transport, runner, remote_set = self._prepare(self.campaign.sets[set_key(spec)], spec.backend)
            key = (spec.backend, spec.threads)
            if key not in self.residents:
                assert self.workdir is not None  # set by the deployment `_prepare` made
                self.residents[key] = ResidentRunner.for_device(
                    transport, self._runner_start(), runner, backend=spec.backend, threads=spec.threads,
                    workdir=self.workdir, start_timeout=self.campaign.timeout,
                )  # fmt: skip
            with self.campaign.lock:
                self.campaign.result.resident_requests += 1
            output = self.residents[key].bench(
                remote_set, timeout=self.campaign.timeout, data=self.remote_data if spec.data else None,
                request_id=f"{spec.cell_key()}#{number}", matmul_seconds=0.0, **self._pass_options(spec, cell.passes),
            )  # fmt: skip
            if output.ok:
                cell.docs.append(output.document)
            else:
                reason = f"{output.status}: {output.message}"
        except TransportError as exc:
            detail = str(exc) or type(exc).__name__
            reason = f"{exc.kind}: {detail}"
            self._drop_transport()
            if exc.kind in DEVICE_DOWN_KINDS:
                down = (exc.kind, detail)
        except Exception as exc:  # noqa: BLE001 - one broken pass is a record, never a crashed campaign
            reason = f"runner error: {type(exc).__name__}: {exc}"
            self._drop_transport()
        if reason:
            cell.pass_failure = f"pass {number} of {cell.passes} failed: {reason}"
        cell.concurrent |= self.campaign.activity.cell_finished(name)
        return down

    def _finish(self, cell: _Cell) -> Measurement:
        """Return the cell's `Measurement`, its passes merged (`merge_passes`) where it has more than one."""
        doc = merge_passes(cell.docs, cell.spec.precision) if len(cell.docs) > 1 else (cell.docs or [EMPTY_DOCUMENT])[0]
        measurement = self._build(cell.spec, cell.status, cell.message, doc, cell.started, cell.concurrent)
        if cell.pass_failure:
            message = "; ".join(part for part in (measurement.message, cell.pass_failure) if part)
            measurement = replace(measurement, message=message)
        return measurement

    def _build(
        self,
        spec: BenchSpec,
        status: str,
        message: str,
        doc: RunnerDocument,
        started: float,
        concurrent: Iterable[str] = (),
    ) -> Measurement:
        return measurement_from_doc(
            spec,
            status,
            message,
            doc,
            facts=self.facts or {},
            started_at=started,
            finished_at=self.campaign.clock(),
            versions=self.campaign.versions,
            git_commit=self.campaign.git_commit,
            isolation=self.campaign.plan.isolation(self.device.name, concurrent),
            share=quota_share(self.device),
        )

    def _measure_round_cost(self, spec: BenchSpec) -> None:
        """Measure and store the round cost of ``spec``'s configuration (`harness.roundcost`); never raises."""
        from harness.roundcost import RoundCostError, measure_round_cost, payload_bytes, step_counts_for

        name = self.device.name
        status, message = "runner error", ""
        try:
            set_dir = self.campaign.sets[set_key(spec)]
            transport, runner, remote_set = self._prepare(set_dir, spec.backend)
            assert self.campaign.scratch is not None
            # the transfers move this model's own payloads: its sets of this configuration
            config = (spec.model, spec.batch, spec.optimizer)
            model_sets = [
                d for (model, _, batch, opt), d in self.campaign.sets.items() if (model, batch, opt) == config
            ]
            cost = measure_round_cost(
                transport, self.device, runner=runner, remote_set=remote_set, set_dir=set_dir, width=spec.width,
                scratch=self.campaign.scratch / name, backend=spec.backend, optimizer=spec.optimizer,
                threads=spec.threads, timeout=self.campaign.timeout, campaign_id=self.campaign.id,
                measured_at=self.campaign.clock(), start=self.start,
                data=self.campaign.data if spec.data else None, transfer_bytes=payload_bytes(model_sets),
                step_counts=step_counts_for(self._step_seconds(spec)),
                resident=self.residents.get((spec.backend, spec.threads)),
            )  # fmt: skip
        except TransportError as exc:
            status, message = exc.kind, self._reason(exc)
            self._drop_transport()
        except RoundCostError as exc:
            status, message = exc.status, str(exc)
        except Exception as exc:  # noqa: BLE001 - a failed round-cost step is a record, never a crashed campaign
            status, message = "runner error", f"{type(exc).__name__}: {exc}"
            self._drop_transport()
        else:
            self.campaign.store.record_round_cost(self.campaign.id, cost)
            with self.campaign.lock:
                self.campaign.result.round_costs.setdefault(name, []).append(cost)
            self._tell(
                f"{name}: round cost: fixed {cost.fixed_s:.3f} s, {cost.step_s * 1e3:.1f} ms/step at width "
                f"{spec.width:g}; down {cost.down_latency_s * 1e3:.1f} ms + {cost.down_s_per_byte * 1e9:.2f} ns/B, "
                f"up {cost.up_latency_s * 1e3:.1f} ms + {cost.up_s_per_byte * 1e9:.2f} ns/B"
            )
            return
        failed = {
            "device": name, "model": spec.model, "width": spec.width, "batch": spec.batch, "backend": spec.backend,
            "optimizer": spec.optimizer, "threads": spec.threads, "status": status, "message": message,
            "measured_at": self.campaign.clock(),
        }  # fmt: skip
        self.campaign.store.record_round_cost(self.campaign.id, failed=failed)
        reason = f"round cost of {spec.model} width {spec.width:g} ({spec.backend}): {status}: {message}"
        with self.campaign.lock:
            self.campaign.result.round_cost_failures.setdefault(name, []).append(reason)
        self._tell(f"{name}: {reason}")

    def _step_seconds(self, spec: BenchSpec) -> float | None:
        """Return the median step time of ``spec``'s cell: as this campaign measured it, else as stored.

        A resumed campaign measures the round cost of a cell an earlier one stored; None when
        the cell has no measured steps at all.
        """
        key = spec.cell_key()
        with self.campaign.lock:
            found = [m for m in self.campaign.result.measurements if m.spec.cell_key() == key]
        if not found:
            found = [m for m in self.campaign.store.measurements(latest=True) if m.spec.cell_key() == key]
        steps = next((m.step_seconds for m in found if m.ok), ())
        return statistics.median(steps) if steps else None

    def _tell(self, line: str) -> None:
        if self.campaign.say is not None:
            try:
                self.campaign.say(line)
            except Exception as exc:  # noqa: BLE001 - a broken display must not stop the measurements
                print(f"fleetbench: progress display failed: {exc!r}", file=sys.stderr)

    def _take_turn(self, turn: int) -> bool:
        """Wait for turn ``turn`` (`harness.isolation.may_take_turn`), mark the device busy; False when stopped."""
        if not self.campaign.turns.wait(self.device.name, turn, self._stopped):
            return False
        self.campaign.activity.device_started(self.device.name)
        return True

    def _next_turn(self, turn: int) -> bool:
        """End turn ``turn - 1`` and take turn ``turn`` (with `Campaign.interleave`); False when stopped."""
        if not self.campaign.interleave:
            return not self._stopped()
        self.campaign.activity.device_finished(self.device.name)
        self.campaign.turns.finish(self.device.name, turn - 1)
        return self._take_turn(turn)

    def _stopped(self) -> bool:
        """Whether the stop event is set; marks the campaign interrupted when it is."""
        if self.campaign.stop.is_set():
            with self.campaign.lock:
                self.campaign.result.interrupted = True
            return True
        return False

    def _tell_pass(self, number: int, pending: Sequence[_Cell]) -> None:
        """Say that pass ``number`` of the cells still to finish is done (progress between stored cells)."""
        waiting = sum(not cell.finished for cell in pending)
        if waiting:
            self._tell(
                f"{self.device.name}: pass {number} of {self.campaign.passes} done for {waiting} cell(s); "
                "each is stored after its last pass"
            )

    def _record(self, measurement: Measurement, done: int) -> None:
        self.campaign.store.record(self.campaign.id, measurement)
        with self.campaign.lock:
            self.campaign.result.measurements.append(measurement)
        try:
            self.campaign.progress(CellEvent(self.device.name, done, len(self.work.specs), measurement))
        except Exception as exc:  # noqa: BLE001 - a broken display must not stop the measurements
            print(f"fleetbench: progress display failed: {exc!r}", file=sys.stderr)

    def __call__(self) -> None:
        """Run the device's cells pass by pass in its turns, then its round costs; store each cell as it finishes.

        A store that cannot be written stops the campaign (`CampaignResult.store_failure`).
        """
        from harness.store_errors import StoreUnavailable

        try:
            self._run()
        except StoreUnavailable as exc:
            with self.campaign.lock:
                if self.campaign.result.store_failure is None:
                    self.campaign.result.store_failure = exc
            self.campaign.stop.set()

    def _run(self) -> None:
        down: tuple[str, str] | None = None
        name = self.device.name
        done = 0
        try:
            if not self._take_turn(1):
                return
            pending: list[_Cell] = []
            for spec in self.work.specs:
                if self._stopped():
                    return
                if down is not None:
                    cell = _Cell(
                        spec, self.campaign.clock(), 1, down[0], f"not tried: device failed earlier ({down[1]})"
                    )
                else:
                    cell = self._first_pass(spec)
                    if cell.status in DEVICE_DOWN_KINDS:
                        down = (cell.status, cell.message)
                    if cell.docs and cell.status == "ok" and cell.passes > 1:
                        pending.append(cell)  # stored after its last pass
                        continue
                done += 1
                self._record(self._finish(cell), done)
            self._tell_pass(1, pending)
            for number in range(2, self.campaign.passes + 1):
                if all(cell.finished for cell in pending):
                    break
                if down is None and not self._next_turn(number):
                    return  # cells short of their passes are not stored: a resume measures them again
                for cell in pending:
                    if cell.finished:
                        continue
                    if self._stopped():
                        return  # cells short of their passes are not stored: a resume measures them again
                    if down is not None and not cell.pass_failure:
                        cell.pass_failure = f"passes {number}-{cell.passes} not measured: the device failed ({down[0]})"
                    if not cell.pass_failure:
                        down = self._later_pass(cell, number) or down
                    if number == cell.passes or cell.pass_failure:
                        cell.finished = True
                        done += 1
                        self._record(self._finish(cell), done)
                self._tell_pass(number, pending)
            for spec in self.work.cost_specs:
                if self._stopped():
                    return
                if down is not None:
                    continue  # the device is gone; its cells say why
                self._measure_round_cost(spec)
        finally:
            self._drop_transport()
            self.campaign.activity.device_finished(name)
            self.campaign.turns.finish(name, math.inf)
