"""Profiling campaigns: measure the matrix device x width x batch x backend.

A campaign is thin orchestration over the other harness pieces:

1. `plan_cells` turns the request into `BenchSpec` cells (pure);
2. `run_campaign` exports every artifact set the cells need once, on the host
   (plus the TorchScript model for torch cells), then runs one thread per device.
   On a device the cells run strictly one at a time: connect, take one facts
   snapshot, deploy the runner and the artifact set (content-addressed cache, so an
   unchanged set pushes nothing), run ``runner.py bench`` under the per-cell
   timeout, parse its JSON document and store the `Measurement` at once (one
   transaction per cell, so an interrupted campaign loses no finished cell).

Failure policy (decided here):

- a `TransportError` during a cell records the cell with the error's ``kind``
  (``unreachable``, ``timeout``, ``connection lost``, ...); the transport is closed
  and the next cell reconnects;
- after a failure that says the device cannot be reached at all (``unreachable``,
  ``authentication failed``, ``host key rejected``) the device's remaining cells
  are recorded as failed with the same kind without being tried, so a dead device
  costs at most one connect timeout, never one per cell;
- the runner's status (its JSON ``status``, else its exit code; see
  `harness.contract.parse_output`) becomes the cell's status; output that is not
  a JSON document is a ``runner error``.

Ctrl-C sets a stop event; each device thread finishes (or times out) its current
cell, stores it and stops; `run_campaign` returns with ``interrupted=True`` and
`cmd_profile` prints the command that resumes the campaign.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from devices.connect import connect as default_connect
from devices.errors import TransportError
from devices.fleet import Device, Fleet
from devices.transport import Transport
from harness import contract
from harness.records import Backend, BenchSpec, Measurement

if TYPE_CHECKING:
    from harness.store import ProfileStore

#: Backends `plan_cells` accepts.
BACKENDS: tuple[str, ...] = ("ort", "onnx", "torch")

#: Failure kinds after which a device's remaining cells are not tried.
DEVICE_DOWN_KINDS = frozenset({"unreachable", "authentication failed", "host key rejected"})

#: Seconds the facts probe may take (bounded by the cell timeout too).
FACTS_TIMEOUT_S = 30.0

#: Exit status when some cell was not measured.
EXIT_INCOMPLETE = 1


@dataclass(frozen=True)
class CellEvent:
    """Progress of one device: a cell just finished (measured or failed).

    Attributes
    ----------
    device : str
        Device name.
    done : int
        Cells of this device finished so far in this run (this one included).
    total : int
        Cells of this device to run in this run.
    measurement : Measurement
        The stored result of the cell.
    """

    device: str
    done: int
    total: int
    measurement: Measurement


@dataclass
class CampaignResult:
    """What `run_campaign` did.

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
        Runner commands actually started on devices.
    interrupted : bool
        True when the stop event was set before every cell ran.
    """

    campaign_id: int
    measurements: list[Measurement] = field(default_factory=list)
    skipped: list[BenchSpec] = field(default_factory=list)
    deploys: dict[str, list[Any]] = field(default_factory=dict)
    runner_invocations: int = 0
    interrupted: bool = False

    @property
    def complete(self) -> bool:
        """Whether every planned cell is measured (now or before, for resumed cells)."""
        return not self.interrupted and all(m.ok for m in self.measurements)


class MissingBackend(TransportError):
    """The device's runtime cannot run the cell's backend (a runtime bundle runs ``onnx`` only)."""

    kind = "missing runtime"


# --------------------------------------------------------------------------- planning


def plan_cells(
    fleet: Fleet | Sequence[Device],
    model: str,
    widths: Iterable[float],
    batches: Iterable[int],
    backends: Iterable[str],
    steps: int,
    warmup: int,
    optimizer: str = "adamw",
) -> list[BenchSpec]:
    """Return the cells of a campaign, device-major (pure).

    Parameters
    ----------
    fleet : Fleet or sequence of Device
        Devices to measure; each cell uses the device's ``threads``.
    model : str
        Zoo model name (`exporters.zoo.get_model`).
    widths : iterable of float
        Widths in (0, 1].
    batches : iterable of int
        Training batch sizes.
    backends : iterable of str
        ``"ort"`` and/or ``"torch"``.
    steps, warmup : int
        Timed and warm-up steps per cell.
    optimizer : str
        ``"adamw"`` or ``"sgd"``.

    Returns
    -------
    list of BenchSpec
        One per device x width x batch x backend, in that nesting order.

    Raises
    ------
    exporters.errors.InputError
        For an unknown model or backend.
    """
    from exporters.errors import InputError
    from exporters.zoo import get_model

    zoo_model = get_model(model)
    devices = fleet.devices if isinstance(fleet, Fleet) else tuple(fleet)
    backend_list = list(backends)
    for backend in backend_list:
        if backend not in BACKENDS:
            raise InputError(f"unknown backend {backend!r} (expected one of {', '.join(BACKENDS)})")
    archs = [(width, tuple(zoo_model.arch(width).widths)) for width in widths]
    return [
        BenchSpec(
            device=device.name,
            model=zoo_model.name,
            width=width,
            arch_widths=arch_widths,
            batch=batch,
            backend=cast(Backend, backend),
            threads=device.threads,
            warmup=warmup,
            steps=steps,
            optimizer=optimizer,
        )
        for device in devices
        for width, arch_widths in archs
        for batch in batches
        for backend in backend_list
    ]


# --------------------------------------------------------------------------- host side


def _set_key(spec: BenchSpec) -> tuple[str, tuple[int, ...], int, str]:
    return (spec.model, spec.arch_widths, spec.batch, spec.optimizer)


def export_sets(specs: Sequence[BenchSpec], artifacts_dir: Path) -> dict[tuple[str, tuple[int, ...], int, str], Path]:
    """Export (or find in the cache) every artifact set the cells need, once each.

    Parameters
    ----------
    specs : sequence of BenchSpec
    artifacts_dir : pathlib.Path
        Artifact cache root (`exporters.artifacts.export_artifacts` ``out_dir``).

    Returns
    -------
    dict
        ``(model, arch_widths, batch, optimizer)`` -> artifact set directory. Sets used
        by a torch cell also hold ``model.pt`` (`exporters.torchscript`).
    """
    from exporters.artifacts import export_artifacts
    from exporters.zoo import get_model

    sets: dict[tuple[str, tuple[int, ...], int, str], Path] = {}
    torch_sets: set[tuple[str, tuple[int, ...], int, str]] = set()
    for spec in specs:
        key = _set_key(spec)
        if spec.backend == "torch":
            torch_sets.add(key)
        if key in sets:
            continue
        model = get_model(spec.model)
        arch = model.arch(spec.width)
        if tuple(arch.widths) != spec.arch_widths:
            arch = replace(arch, widths=spec.arch_widths)
        exported = export_artifacts(model, arch, batch=spec.batch, optimizer=spec.optimizer, out_dir=artifacts_dir)
        sets[key] = exported.directory
    for key in torch_sets:
        from exporters.torchscript import export_torchscript

        spec = next(s for s in specs if _set_key(s) == key)
        model = get_model(spec.model)
        arch = model.arch(spec.width)
        if not (sets[key] / "model.pt").exists():
            export_torchscript(model, arch, sets[key])
    return sets


# --------------------------------------------------------------------------- one cell


#: Seconds per timed sample on a device held to a CPU share: 20 CFS periods of
#: `devices.limits.PERIOD_US` (see the runner's ``--sample-seconds``).
EMULATED_SAMPLE_S = 0.2


def sample_seconds_for(device: Device) -> float:
    """Return the runner's ``--sample-seconds`` for ``device``.

    Parameters
    ----------
    device : Device

    Returns
    -------
    float
        `EMULATED_SAMPLE_S` when the device is emulated with a CPU share (its own or its
        preset's), else 0 (every step is one sample).
    """
    emulation = device.emulate
    if emulation is not None and (emulation.cpu_share is not None or emulation.preset is not None):
        return EMULATED_SAMPLE_S
    return 0.0


def measurement_from_doc(
    spec: BenchSpec,
    status: str,
    message: str,
    doc: Mapping[str, Any],
    *,
    facts: Mapping[str, Any],
    started_at: float,
    finished_at: float,
    versions: Mapping[str, str],
    git_commit: str | None,
) -> Measurement:
    """Build the `Measurement` of one cell from the runner's document (pure).

    Parameters
    ----------
    spec : BenchSpec
    status, message : str
        From `harness.contract.parse_output` (or a transport failure).
    doc : Mapping
        The runner's JSON document (may be empty).
    facts : Mapping
        The device's facts snapshot.
    started_at, finished_at : float
        Unix times from the campaign's clock.
    versions : Mapping
        Host tool versions.
    git_commit : str or None

    Returns
    -------
    Measurement
    """
    steps = tuple(float(s) for s in doc.get("step_seconds") or ()) if status == "ok" else ()
    peak = doc.get("peak_memory_bytes")
    gflops = doc.get("matmul_gflops")
    return Measurement(
        spec=spec,
        status=status,
        message=message,
        step_seconds=steps,
        peak_memory_bytes=int(peak) if isinstance(peak, (int, float)) else None,
        peak_memory_source=doc.get("peak_memory_source"),
        throttled=bool(doc.get("throttled", False)),
        matmul_gflops=float(gflops) if isinstance(gflops, (int, float)) else None,
        runner=dict(doc),
        facts=dict(facts),
        started_at=started_at,
        finished_at=finished_at,
        versions=dict(versions),
        git_commit=git_commit,
    )


# --------------------------------------------------------------------------- progress


def per_image_us(measurement: Measurement) -> float | None:
    """Median per-image training time of a measured cell in microseconds (None if failed)."""
    if not measurement.ok or not measurement.step_seconds:
        return None
    from harness.stats import summarize

    stats = summarize(measurement.step_seconds, measurement.spec.batch)
    return float(stats.median_us)


def format_event(event: CellEvent) -> str:
    """One progress line, e.g. ``[fast] 2/4 w0.50 b20 ort ok 812 us/img``.

    Parameters
    ----------
    event : CellEvent

    Returns
    -------
    str
    """
    m = event.measurement
    spec = m.spec
    head = f"[{event.device}] {event.done}/{event.total} w{spec.width:.2f} b{spec.batch} {spec.backend}"
    if m.ok:
        us = per_image_us(m)
        return f"{head} ok" + (f" {us:.0f} us/img" if us is not None else "")
    return f"{head} {m.status}: {m.message}"


def print_progress(event: CellEvent) -> None:
    """Default progress callback: one line per finished cell on stderr."""
    print(format_event(event), file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- campaign


class _DeviceRun:
    """The cells of one device, run one at a time in this device's thread."""

    def __init__(
        self,
        device: Device,
        specs: list[BenchSpec],
        sets: Mapping[tuple[str, tuple[int, ...], int, str], Path],
        *,
        store: ProfileStore,
        campaign_id: int,
        timeout: float,
        connect: Callable[[Device], Transport],
        clock: Callable[[], float],
        progress: Callable[[CellEvent], None],
        stop: threading.Event,
        versions: Mapping[str, str],
        git_commit: str | None,
        result: CampaignResult,
        lock: threading.Lock,
    ) -> None:
        self.device, self.specs, self.sets = device, specs, sets
        self.store, self.campaign_id, self.timeout = store, campaign_id, timeout
        self.connect, self.clock, self.progress, self.stop = connect, clock, progress, stop
        self.versions, self.git_commit = versions, git_commit
        self.result, self.lock = result, lock
        self.transport: Transport | None = None
        self.facts: dict[str, Any] | None = None
        self.runner_remote: str | None = None
        self.start: contract.RunnerStart | None = None
        self.remote_sets: dict[tuple[Path, bool], str] = {}

    def _transport(self) -> Transport:
        if self.transport is None:
            self.transport = self.connect(self.device)
        return self.transport

    def _drop_transport(self) -> None:
        if self.transport is not None:
            try:
                self.transport.close()
            except Exception:  # noqa: BLE001 - closing a broken connection must not mask the failure
                pass
            self.transport = None

    def _prepare(self, set_dir: Path, backend: str) -> tuple[Transport, str, str]:
        """Connect, snapshot facts, deploy runner and set (each once per device).

        A torch cell needs ``model.pt`` beside the set's files, which the manifest does
        not list; such cells get the set's files plus ``model.pt`` materialised as
        ``<workdir>/sets/<set>+torch`` through the same content-addressed cache.
        """
        from devices.facts import probe_device
        from harness.deploy import deploy_artifact_set, deploy_files, deploy_runner

        transport = self._transport()
        if self.facts is None:
            facts = probe_device(transport, self.device.python, timeout=min(FACTS_TIMEOUT_S, self.timeout))
            self.facts = facts.to_dict()
        if self.start is None:  # a phone without Python gets its runtime bundle (harness.phone_runtime)
            from harness.phone_runtime import runner_start

            self.start = runner_start(transport, self.device, timeout=self.timeout, say=print)
        if not self.start.offers(backend):
            raise MissingBackend(f"{self.device.name}: the {backend} backend does not run on {self.start.detail}")
        if self.runner_remote is None:
            self.runner_remote = str(deploy_runner(transport, self.device, contract.RUNNER_PATH, timeout=self.timeout))
        key = (set_dir, backend == "torch")
        if key not in self.remote_sets:
            if backend == "torch":
                files = sorted(p for p in set_dir.iterdir() if p.is_file() and not p.name.startswith("."))
                into = f"sets/{set_dir.name}+torch"
                deployed = deploy_files(transport, self.device, files, into=into, timeout=self.timeout)
            else:
                deployed = deploy_artifact_set(transport, self.device, set_dir, timeout=self.timeout)
            with self.lock:
                self.result.deploys.setdefault(self.device.name, []).append(deployed)
            self.remote_sets[key] = str(deployed.remote_dir)
        return transport, self.runner_remote, self.remote_sets[key]

    def _measure(self, spec: BenchSpec) -> Measurement:
        started = self.clock()
        status, message, doc = "runner error", "", cast(dict[str, Any], {})
        try:
            set_dir = self.sets[_set_key(spec)]
            transport, runner, remote_set = self._prepare(set_dir, spec.backend)
            with self.lock:
                self.result.runner_invocations += 1
            argv = contract.bench_argv(
                self.start or self.device.python, runner, remote_set, backend=spec.backend, warmup=spec.warmup,
                steps=spec.steps, threads=spec.threads, sample_seconds=sample_seconds_for(self.device),
            )  # fmt: skip
            run = transport.run(argv, timeout=self.timeout)
            output = contract.parse_output(run.rc, run.stdout, run.stderr)
            status, message, doc = output.status, output.message, output.document
            if doc:
                # The analytic counts travel with the cell, so stored rows carry train FLOPs.
                manifest = json.loads((set_dir / "manifest.json").read_text())
                doc = {**doc, "counts": manifest.get("counts", {})}
        except TransportError as exc:
            status, message = exc.kind, str(exc) or type(exc).__name__
            self._drop_transport()
        except Exception as exc:  # noqa: BLE001 - one broken cell is a record, never a crashed campaign
            status, message = "runner error", f"{type(exc).__name__}: {exc}"
            self._drop_transport()
        return self._build(spec, status, message, doc, started)

    def _build(self, spec: BenchSpec, status: str, message: str, doc: Mapping[str, Any], started: float) -> Measurement:
        return measurement_from_doc(
            spec,
            status,
            message,
            doc,
            facts=self.facts or {},
            started_at=started,
            finished_at=self.clock(),
            versions=self.versions,
            git_commit=self.git_commit,
        )

    def __call__(self) -> None:
        down: Measurement | None = None
        try:
            for done, spec in enumerate(self.specs, 1):
                if self.stop.is_set():
                    with self.lock:
                        self.result.interrupted = True
                    return
                if down is not None:
                    now = self.clock()
                    measurement = self._build(
                        spec, down.status, f"not tried: device failed earlier ({down.message})", {}, now
                    )
                else:
                    measurement = self._measure(spec)
                    if measurement.status in DEVICE_DOWN_KINDS:
                        down = measurement
                self.store.record(self.campaign_id, measurement)
                with self.lock:
                    self.result.measurements.append(measurement)
                try:
                    self.progress(CellEvent(self.device.name, done, len(self.specs), measurement))
                except Exception as exc:  # noqa: BLE001 - a broken display must not stop the measurements
                    print(f"fleetbench: progress display failed: {exc!r}", file=sys.stderr)
        finally:
            self._drop_transport()


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
) -> CampaignResult:
    """Measure ``specs`` on the fleet and store every cell as it finishes.

    Parameters
    ----------
    fleet : Fleet
        Devices named by the cells.
    specs : sequence of BenchSpec
        Cells to measure (`plan_cells`).
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

    Returns
    -------
    CampaignResult
    """
    stop = stop or threading.Event()
    done_keys = store.measured_keys() if resume else set()
    todo = [s for s in specs if s.cell_key() not in done_keys]
    skipped = [s for s in specs if s.cell_key() in done_keys]
    from harness.store import git_commit, host_versions

    versions, commit = host_versions(), git_commit()
    models = sorted({s.model for s in specs})
    campaign_id = store.start_campaign(
        fleet=str(fleet.path), model=",".join(models) or None, versions=versions, commit=commit, started_at=clock()
    )
    result = CampaignResult(campaign_id=campaign_id, skipped=skipped)
    if not todo:
        return result
    sets = export_sets(todo, Path(artifacts_dir))
    lock = threading.Lock()
    by_device: dict[str, list[BenchSpec]] = {}
    for spec in todo:
        by_device.setdefault(spec.device, []).append(spec)
    threads = []
    for name, cells in by_device.items():
        worker = _DeviceRun(
            fleet.device(name),
            cells,
            sets,
            store=store,
            campaign_id=campaign_id,
            timeout=timeout,
            connect=connect,
            clock=clock,
            progress=progress,
            stop=stop,
            versions=versions,
            git_commit=commit,
            result=result,
            lock=lock,
        )
        thread = threading.Thread(target=worker, name=f"campaign-{name}", daemon=True)
        thread.start()
        threads.append(thread)
    try:
        for thread in threads:
            while thread.is_alive():
                thread.join(0.2)
    except KeyboardInterrupt:
        stop.set()
        result.interrupted = True
        print(
            "fleetbench: stopping after the cells in progress (Ctrl-C again to quit now)",
            file=sys.stderr,
            flush=True,
        )
        for thread in threads:
            while thread.is_alive():
                thread.join(0.2)
    if stop.is_set():
        result.interrupted = True
    return result


# --------------------------------------------------------------------------- CLI


def _split(text: str, what: str, convert: Callable[[str], Any]) -> list[Any]:
    from exporters.errors import InputError

    values: list[Any] = []
    for item in text.split(","):
        item = item.strip()
        try:
            value = convert(item)
        except ValueError:
            raise InputError(f"{what} {item!r} is not valid") from None
        if value not in values:
            values.append(value)
    if not values:
        raise InputError(f"no {what} given")
    return values


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise ValueError(text)
    return value


def summary_table(cells: Any, specs: Sequence[BenchSpec]) -> str:
    """Format the stored cells of ``specs`` as a device x width table.

    Parameters
    ----------
    cells : pandas.DataFrame
        `ProfileStore.latest_cells` (one row per cell key, latest attempt).
    specs : sequence of BenchSpec
        The campaign's cells, in plan order.

    Returns
    -------
    str
        One row per cell: median and p95 per-image latency (us), peak memory (MB), status.
    """
    import pandas as pd

    by_key = {}
    if len(cells):
        for row in cells.to_dict("records"):
            by_key[row["cell_key"]] = row
    header = (
        f"{'device':<16} {'width':>6} {'batch':>5} {'backend':<7} "
        f"{'median us':>10} {'p95 us':>10} {'peak MB':>8}  status"
    )
    lines = [header]
    for spec in specs:
        row = by_key.get(spec.cell_key())

        def num(name: str, scale: float = 1.0, row: Mapping[str, Any] | None = row) -> str:
            value = None if row is None else row.get(name)
            if value is None or bool(pd.isna(value)):
                return "-"
            return f"{float(value) / scale:.0f}"

        status = "not run" if row is None else str(row.get("status"))
        lines.append(
            f"{spec.device:<16} {spec.width:>6.2f} {spec.batch:>5} {spec.backend:<7} "
            f"{num('median_us'):>10} {num('p95_us'):>10} {num('peak_memory_bytes', 1e6):>8}  {status}"
        )
    return "\n".join(lines)


def cmd_profile(args: argparse.Namespace) -> int:
    """``fleetbench profile``: run a campaign and print a summary table.

    Parameters
    ----------
    args : argparse.Namespace
        ``fleet, model, widths, batch, backend, steps, warmup, timeout, db, artifacts, resume``.

    Returns
    -------
    int
        0 when every cell is measured, 1 otherwise (2 for bad input, via `InputError`).
    """
    from devices.fleetfile import load_fleet
    from exporters.arch import parse_widths
    from exporters.errors import InputError
    from harness.store import ProfileStore

    widths = parse_widths(args.widths)
    batches = _split(args.batch, "batch size", _positive)
    backends = _split(args.backend, "backend", str)
    if args.timeout <= 0:
        raise InputError(f"timeout {args.timeout:g} must be positive")
    fleet = load_fleet(args.fleet)
    specs = plan_cells(fleet, args.model, widths, batches, backends, args.steps, args.warmup)
    with ProfileStore(Path(args.db)) as store:
        result = run_campaign(
            fleet, specs, store, artifacts_dir=Path(args.artifacts), timeout=args.timeout, resume=args.resume
        )
        print(summary_table(store.latest_cells(), specs))
    if result.skipped:
        print(f"{len(result.skipped)} cell(s) were already measured and skipped (--resume).")
    if result.complete:
        return 0
    measured_now = sum(m.ok for m in result.measurements)
    missing = len(specs) - len(result.skipped) - measured_now
    what = "interrupted: " if result.interrupted else ""
    resume = ["fleetbench", "profile", "--fleet", args.fleet, "--model", args.model, "--widths", args.widths]
    resume += ["--batch", args.batch, "--backend", args.backend, "--steps", str(args.steps)]
    resume += ["--warmup", str(args.warmup), "--timeout", f"{args.timeout:g}", "--db", args.db]
    resume += ["--artifacts", args.artifacts, "--resume"]
    print(
        f"{what}{missing} of {len(specs)} cell(s) not measured; every finished cell is stored. "
        f"Measure only the missing ones with:\n  {shlex.join(resume)}",
        file=sys.stderr,
    )
    return EXIT_INCOMPLETE
