"""The ``devices`` executor: clients train on fleet devices with the on-device runner.

Each round, for each client placed on a device:

1. the artifact set of the client's width is exported on the host (cached by
   `exporters.artifacts.export_artifacts`, the executor's optimizer graph, SGD by default;
   the runner uses the device's fleet-file ``threads`` unless the executor fixes them) and deployed once per
   device through the device's content-addressed cache, like the runner itself;
2. the client's data shard is written as ``.npz`` and deployed once (the cache keys it
   by content, so later rounds push nothing);
3. the sub-model parameters go to the device as a flat float32 ``.npy`` in manifest
   order (*download*, timed), the runner trains ``epochs`` over the shard (*compute*),
   and the trained vector comes back (*upload*, timed).

Resident runner (default): one ``runner.pyz serve`` process per device per run
(`harness.resident.ResidentRunner`), started through the transport's streaming handle
with the device's first client and closed with the executor. Both modes start the
runner's Python as the device's `harness.contract.RunnerStart` says
(`harness.phone_runtime.runner_start`): its own interpreter, or on a phone without
Python the runtime bundle's, through the bundle's loader (pushed first when missing). It keeps the imports, the
sessions of the widths it has seen and the shard in memory, so a round costs the
request and its steps, not Python's start, the imports and session creation again.
A runner's first request also pays once-per-run costs (the SFTP session's start, the
shard's first load, opening the widths' sessions and their first, slower steps), so a
device whose runner has not trained yet (new, or started again), or not the job's
artifact sets (a width it has not held), first trains its client's round once and
discards it (``warm_up``, on by default); its wall time is the metric ``setup_seconds``
of the round that counts, and every counted round is a steady one.
*compute* is the request's wall time seen from the host (write to reply). A request that
times out kills the runner and the next request starts another; a runner that dies
mid-request fails its client with the reason (SIGKILL: out of memory) and is started
again for the next; a device whose connection failed is dropped with its runner, and
when it comes back it gets a new connection and a new runner. ``resident=False`` runs
the one-shot ``train`` mode per client instead (a process per client and round; plain
training only), the behaviour before the resident runner, kept for comparison.

Devices work in parallel, the clients of one device one after another. Every remote
command and request has a timeout, so a round never hangs; a device that cannot be
reached, times out or whose runner fails gives a `ClientFailure` for that client and
the others go on. Connections stay open from round to round; `close` (or leaving ``with
DevicesExecutor(...) as executor:``) closes all runners and connections, whether the run
finished or failed.

Emulated links: when the device's ``emulate:`` block has a link rate, the modelled
transfer times (bytes / rate + one-way delay, per direction) are reported beside the
measured ones in the metrics (``download_modelled_s``, ``upload_modelled_s``).

Local trainers:

* ``plain`` trains the sent sub-model.
* ``fjord`` (ordered dropout) samples a width **per local step**, as the paper does: the
  parameters at the client's ``capacity`` go to the device once, the request names one
  artifact set per width ``p <= capacity`` and, per narrower width, the positions of its
  parameters in the capacity's vector (an index ``.npy``, deployed once); the runner draws a
  width per step with ``default_rng((seed, 1))`` as `fl.strategies.fjord.train_ordered` does,
  copies the prefix in and out of the width's session when the width changes, and returns
  the capacity's vector (a train config under the old key ``p_max`` is read as
  ``capacity``). The metrics log the widths trained (``mean_width``, steps per width) and
  the switch cost. ``kd=true`` (self-distillation) is refused with a clear error: the
  step graphs train one width's cross-entropy, and a teacher's soft targets would need a
  second graph per width pair.
* ``syncdrop`` (FedDrop) trains the full model with SyncDrop masks drawn per step from
  the round's shared seed, as `fl.strategies.feddrop.train_syncdrop` does: the artifact set
  is the masked variant (`exporters.artifacts.export_masked_artifacts`, one ``mask.<group>``
  input per conv / linear group), and the runner draws the masks. The metrics carry the
  FLOPs as in process (expected, sampled, dense): the masks multiply dense kernels, so
  they save no time on the device; the measured step time stays the dense one.

Both need the resident runner; the one-shot mode refuses them. Momentum and weight decay
are refused (the exported graphs are plain SGD).
"""

from __future__ import annotations

import dataclasses
import hashlib
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from devices.errors import CommandTimeout, TransportError
from devices.fleet import Device
from devices.transport import Transport
from exporters.arch import Arch, extract, static_submodel
from exporters.artifacts import export_artifacts, export_masked_artifacts
from exporters.userinput import InputError
from exporters.zoo import ZooModel
from fl.executors import ClosingExecutor
from fl.records import ClientFailure, Params, TrainIns, TrainRes
from fl.renamed_keys import current_train_config
from fl.roundcost import modelled_transfer_seconds
from harness.contract import RunnerStart, round_power_options
from harness.document import RunnerDocument

if TYPE_CHECKING:
    from harness.isolation import IsolationPlan

#: Seconds allowed for one remote command when the caller gives no timeout.
DEFAULT_TIMEOUT_S = 300.0


@dataclass(frozen=True)
class _Width:
    """One FjORD width a client may train: its artifact set and where its parameters sit in its capacity's."""

    width: float
    set_dir: Path
    index: Path | None  # flat positions in the capacity's vector (.npy); None for the capacity itself


@dataclass(frozen=True)
class _Job:
    """One client's work on its device (built on the host before dispatch)."""

    ins: TrainIns
    device: Device
    set_dir: Path
    manifest: Mapping[str, Any]
    params: Params
    shard: Path
    widths: tuple[_Width, ...] = ()
    syncdrop: Mapping[str, Any] | None = field(default=None)

    @property
    def trainer(self) -> str:
        """The local trainer's name."""
        return str(self.ins.config.get("trainer", "plain"))


def _sets_of(job: _Job) -> frozenset[Path]:
    """Return the artifact sets ``job`` trains (a FjORD job: one per width)."""
    return frozenset([job.set_dir, *(w.set_dir for w in job.widths)])


def prefix_positions(
    model: ZooModel, outer: Arch, outer_manifest: Mapping[str, Any], inner: Arch, inner_manifest: Mapping[str, Any]
) -> np.ndarray:
    """Return where each flat parameter of the ``inner`` prefix set sits in the ``outer`` set's flat vector.

    Parameters
    ----------
    model : ZooModel
    outer, inner : Arch
        Nested prefix widths (every width of ``inner`` at most ``outer``'s).
    outer_manifest, inner_manifest : mapping
        The two artifact sets' manifests (flat parameter order).

    Returns
    -------
    numpy.ndarray
        int64 of ``inner``'s ``num_parameters``: ``inner_flat == outer_flat[positions]``.
    """
    positions = {
        p["name"]: np.arange(int(p["offset"]), int(p["offset"]) + int(p["size"]), dtype=np.int64).reshape(p["shape"])
        for p in outer_manifest["parameters"]
    }
    cut = cut_prefix(model, outer, positions, inner)
    parts = [np.asarray(cut[p["name"]], dtype=np.int64).reshape(-1) for p in inner_manifest["parameters"]]
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)


#: Strategies whose local trainer feeds masks to the step graph (SyncDrop): their inputs exist
#: only in the portable step model (`exporters.step_model`), which the ``onnx`` backend runs.
MASKED_STRATEGIES = frozenset({"feddrop"})
#: The runner backend that takes mask inputs.
MASK_BACKEND = "onnx"


def backend_for_strategy(strategy: str, requested: str) -> str:
    """Return the ``--backend`` a strategy's rounds run with on devices (pure).

    Parameters
    ----------
    strategy : str
        The FL strategy.
    requested : str
        ``--backend``: ``auto``, ``ort``, ``onnx`` or ``torch``.

    Returns
    -------
    str
        ``requested``, or `MASK_BACKEND` for a strategy in `MASKED_STRATEGIES` when
        ``requested`` is ``auto`` (ORT's training graphs and the PyTorch twin have no mask
        inputs; onnxruntime-training includes the plain onnxruntime that runs the step model).

    Raises
    ------
    InputError
        When a masked strategy is asked to run on another backend.
    """
    if strategy not in MASKED_STRATEGIES or requested == MASK_BACKEND:
        return requested
    if requested == "auto":
        return MASK_BACKEND
    raise InputError(
        f"--strategy {strategy} on devices trains with SyncDrop masks, which enter only the {MASK_BACKEND} "
        f"backend's step model; --backend {requested} has no mask inputs (use --backend {MASK_BACKEND} or auto)"
    )


def maskable_groups(model: ZooModel) -> list[str]:
    """Return the groups a masked step model can drop (those not produced by an LSTM).

    Parameters
    ----------
    model : ZooModel

    Returns
    -------
    list of str
    """
    from fl.strategies.feddrop import site_module

    return [g for g in model.group_names if not site_module(model, g)[1]]


class DevicesExecutor(ClosingExecutor):
    """Run `TrainIns` on fleet devices with the on-device runner (resident by default).

    Parameters
    ----------
    model : ZooModel
        The global model's zoo entry.
    placement : mapping of str to Device
        The device of every client id.
    artifacts_dir : pathlib.Path
        Host artifact cache (exports land here).
    work_dir : pathlib.Path
        Host scratch directory for shards and parameter files.
    batch : int
        Training batch size: the artifact sets' ``batch`` (the one they are exported and
        profiled with; their graphs also take an epoch's short last batch, which the
        runner trains as in process).
    connect : callable
        ``connect(device) -> Transport`` (`devices.connect.connect` in production).
    timeout_s : float
        Seconds allowed per remote command, per request and for a runner's start.
    threads : int or None
        Threads the runner uses on every device; None: each device's fleet-file ``threads``
        (`threads_of`), the threads its profile was measured with.
    clock : callable
        Monotonic clock in seconds.
    backends : mapping of str to str, optional
        The runner backend of each device by name (``"ort"``, ``"onnx"``, ``"torch"``);
        devices not named train with ``"ort"``, or with their runtime's backend where the
        runtime offers only some (a phone running a runtime bundle: ``"onnx"``,
        `harness.phone_runtime`). Each client round records its backend.
    resident : bool
        One serving runner per device (default); False runs a one-shot runner per client.
    optimizer : str
        The optimizer graph clients train with (``"sgd"`` or ``"adamw"``); profile with the same.
    isolation : IsolationPlan, optional
        Which devices must not train at the same time (`harness.isolation.round_isolation`:
        every device on this host): in a round, a device starts its clients when the
        devices it conflicts with have finished theirs, so each client round sees the cpu
        its profile saw. None: every device at once (devices that are really apart).
    """

    name = "devices"

    def __init__(
        self,
        model: ZooModel,
        placement: Mapping[str, Device],
        *,
        artifacts_dir: Path,
        work_dir: Path,
        batch: int,
        connect: Callable[[Device], Transport],
        timeout_s: float = DEFAULT_TIMEOUT_S,
        threads: int | None = None,
        clock: Callable[[], float] = time.perf_counter,
        backends: Mapping[str, str] | None = None,
        resident: bool = True,
        optimizer: str = "sgd",
        isolation: IsolationPlan | None = None,
        warm_up: bool = True,
    ) -> None:
        self.model = model
        self.warm_up = warm_up
        self.isolation = isolation
        self.backends = dict(backends or {})
        self.placement = dict(placement)
        self.artifacts_dir = Path(artifacts_dir)
        self.work_dir = Path(work_dir)
        self.work_dir.mkdir(parents=True, exist_ok=True)
        self.batch = batch
        self.connect = connect
        self.timeout_s = timeout_s
        self.threads = threads
        self.optimizer = optimizer
        self.clock = clock
        self.resident = resident
        self._transports: dict[str, Transport] = {}
        self._runner: dict[str, str] = {}
        self._starts: dict[str, RunnerStart] = {}
        self._residents: dict[str, Any] = {}  # device name -> harness.resident.ResidentRunner
        self._sets: dict[tuple[str, str], str] = {}
        self._files: dict[tuple[str, str], tuple[str, str]] = {}
        # device name -> (id, starts) of its runner and the artifact sets that runner has trained
        self._warm: dict[str, tuple[tuple[int, int], frozenset[Path]]] = {}
        self._lock = threading.Lock()

    def backend_of(self, device: Device) -> str:
        """Return the runner backend ``device`` trains with.

        Parameters
        ----------
        device : Device

        Returns
        -------
        str
        """
        wanted = self.backends.get(device.name)
        start = self._starts.get(device.name)
        return start.backend(wanted) if start is not None else (wanted or "ort")

    def runner_of(self, name: str) -> Any:
        """Return the resident runner of device ``name`` (a `harness.resident.ResidentRunner`), or None.

        Parameters
        ----------
        name : str

        Returns
        -------
        ResidentRunner or None
        """
        with self._lock:
            return self._residents.get(name)

    # -- one configuration from profile to round (fleetbench issue 15) -------------------

    def threads_of(self, device: Device) -> int:
        """Return the threads ``device`` trains with: the executor's, else the fleet file's.

        Parameters
        ----------
        device : Device

        Returns
        -------
        int
        """
        return int(self.threads) if self.threads is not None else int(device.threads)

    # -- host side -----------------------------------------------------------------------

    def _artifact_set(self, arch: Arch) -> tuple[Path, Mapping[str, Any]]:
        result = export_artifacts(
            self.model, arch, batch=self.batch, optimizer=self.optimizer, out_dir=self.artifacts_dir
        )
        return result.directory, result.manifest

    def _write_npy_once(self, stem: str, digest: str, write: Callable[[Path], None]) -> Path:
        path = self.work_dir / f"{stem}-{digest[:16]}{'.npz' if stem.startswith('shard') else '.npy'}"
        if not path.exists():
            tmp = path.with_name(".tmp-" + path.name)
            write(tmp)
            tmp.replace(path)
        return path

    def _write_shard(self, cid: str, x: np.ndarray, y: np.ndarray) -> Path:
        digest = hashlib.sha256()
        digest.update(np.ascontiguousarray(x).tobytes())
        digest.update(np.ascontiguousarray(y, dtype=np.int64).tobytes())

        def write(tmp: Path) -> None:
            with open(tmp, "wb") as handle:
                np.savez(handle, x=np.ascontiguousarray(x), y=np.ascontiguousarray(y, dtype=np.int64))

        return self._write_npy_once(f"shard-{cid}", digest.hexdigest(), write)

    def _write_index(self, positions: np.ndarray) -> Path:
        def write(tmp: Path) -> None:
            with open(tmp, "wb") as handle:
                np.save(handle, positions, allow_pickle=False)

        return self._write_npy_once("index", hashlib.sha256(positions.tobytes()).hexdigest(), write)

    def _job(self, ins: TrainIns, x: np.ndarray, y: np.ndarray) -> _Job:
        if ins.cid not in self.placement:
            raise InputError(f"client {ins.cid} has no device")
        cfg = ins.config
        trainer = str(cfg.get("trainer", "plain"))
        if trainer not in ("plain", "fjord", "syncdrop"):
            raise InputError(f"the devices executor cannot run the {trainer!r} local trainer on a device")
        if trainer != "plain":
            if not self.resident:
                raise InputError(f"the {trainer!r} trainer needs the resident runner (resident=True) on devices")
            for key in ("momentum", "weight_decay"):
                if float(cfg.get(key, 0.0)) != 0.0:
                    raise InputError(f"{trainer} on devices: {key}={cfg[key]} is not supported (plain SGD graphs)")
        shard = self._write_shard(ins.cid, x, y)
        if trainer == "syncdrop":
            return self._syncdrop_job(ins, shard)
        set_dir, manifest = self._artifact_set(ins.submodel.arch)
        widths: tuple[_Width, ...] = ()
        if trainer == "fjord":
            widths = self._fjord_widths(ins, set_dir, manifest)
        return _Job(ins, self.placement[ins.cid], set_dir, manifest, dict(ins.parameters), shard, widths)

    def _fjord_widths(self, ins: TrainIns, outer_dir: Path, outer_manifest: Mapping[str, Any]) -> tuple[_Width, ...]:
        cfg = current_train_config(ins.config)
        if bool(cfg.get("kd", False)):
            raise InputError(
                "fjord kd=true (self-distillation) does not run on devices: the step graphs train one width's "
                "cross-entropy per step; use kd=false on devices, or the inprocess executor"
            )
        outer = ins.submodel.arch
        drawn = [float(w) for w in cfg.get("widths", [])] or [float(cfg.get("capacity", 1.0))]
        widths = []
        for width in drawn:
            arch = outer if not cfg.get("widths") else self.model.arch(width)
            if any(w > o for w, o in zip(arch.sizes, outer.sizes, strict=True)):
                raise InputError(f"fjord: width {width} does not fit in the client's sub-model {outer.key()}")
            if arch.sizes == outer.sizes:
                widths.append(_Width(width, outer_dir, None))
                continue
            set_dir, manifest = self._artifact_set(arch)
            positions = prefix_positions(self.model, outer, outer_manifest, arch, manifest)
            widths.append(_Width(width, set_dir, self._write_index(positions)))
        return tuple(widths)

    def _syncdrop_job(self, ins: TrainIns, shard: Path) -> _Job:
        from fl.strategies.feddrop import keep_lists

        model, cfg = self.model, ins.config
        if ins.submodel.arch != model.full_arch():
            raise InputError(f"{model.name}: SyncDrop trains the full model, got {ins.submodel.arch.key()}")
        keep = keep_lists(model, cfg.get("keep", {}))
        groups = maskable_groups(model)
        for group, values in zip(model.group_names, keep, strict=True):
            if group not in groups and np.any(values < 1.0):
                raise InputError(f"syncdrop on devices: group {group!r} (an LSTM's units) cannot be masked")
        device = self.placement[ins.cid]
        if self.backend_of(device) != MASK_BACKEND:  # before the masked set is exported for nothing
            raise InputError(
                f"syncdrop on device {device.name}: masks enter only the {MASK_BACKEND} backend's step model, and "
                f"{device.name} trains with {self.backend_of(device)} (`backend_for_strategy`)"
            )
        result = export_masked_artifacts(
            model, ins.submodel.arch, batch=self.batch, optimizer="sgd", out_dir=self.artifacts_dir, mask_groups=groups
        )
        syncdrop = {
            "sync_seed": int(cfg.get("sync_seed", 0)),
            "scale": bool(cfg.get("scale", True)),
            "groups": [[g, [float(v) for v in k]] for g, k in zip(model.group_names, keep, strict=True)],
        }
        return _Job(ins, device, result.directory, result.manifest, dict(ins.parameters), shard, syncdrop=syncdrop)

    # -- device side ---------------------------------------------------------------------

    def _transport(self, device: Device) -> Transport:
        with self._lock:
            transport = self._transports.get(device.name)
        if transport is None:
            transport = self.connect(device)
            with self._lock:
                self._transports[device.name] = transport
        return transport

    def _forget(self, name: str) -> None:
        with self._lock:
            transport = self._transports.pop(name, None)
            resident = self._residents.pop(name, None)
            self._runner.pop(name, None)
            self._starts.pop(name, None)
            self._warm.pop(name, None)
            for key in [k for k in self._sets if k[0] == name]:
                del self._sets[key]
            for key in [k for k in self._files if k[0] == name]:
                del self._files[key]
        if resident is not None:
            resident.close()
        if transport is not None:
            try:
                transport.close()
            except Exception:  # noqa: BLE001 - closing a broken connection must not mask the failure
                pass

    def _deployed_set(self, transport: Transport, device: Device, set_dir: Path) -> str:
        from harness.deploy import deploy_artifact_set

        key = (device.name, set_dir.name)
        if key not in self._sets:
            self._sets[key] = deploy_artifact_set(transport, device, set_dir, timeout=self.timeout_s).remote_dir
        return self._sets[key]

    def _deployed_file(self, transport: Transport, device: Device, path: Path) -> tuple[str, str]:
        from harness.deploy import deploy_files

        key = (device.name, path.name)
        if key not in self._files:
            deployed = deploy_files(transport, device, [path], timeout=self.timeout_s)
            self._files[key] = (deployed.remote_paths[path.name], deployed.workdir)
        return self._files[key]

    def _prepared(self, transport: Transport, job: _Job) -> tuple[str, str, str, str]:
        """Deploy runner, artifact sets, shard and index files once per device; return runner, set, shard, workdir."""
        from harness import runner_archive
        from harness.deploy import deploy_runner

        name = job.device.name
        if name not in self._starts:  # a phone without Python gets its runtime bundle
            from harness.phone_runtime import runner_start

            self._starts[name] = runner_start(transport, job.device, timeout=self.timeout_s)
        if name not in self._runner:
            archive = runner_archive.archive_path()
            self._runner[name] = deploy_runner(transport, job.device, archive, timeout=self.timeout_s)
        remote_set = self._deployed_set(transport, job.device, job.set_dir)
        remote_shard, workdir = self._deployed_file(transport, job.device, job.shard)
        return self._runner[name], remote_set, remote_shard, workdir

    def _fjord_request(self, transport: Transport, job: _Job) -> dict[str, list[Any]]:
        sets, index = [], []
        for width in job.widths:
            sets.append(self._deployed_set(transport, job.device, width.set_dir))
            index.append(None if width.index is None else self._deployed_file(transport, job.device, width.index)[0])
        return {"sets": sets, "index": index, "widths": [w.width for w in job.widths]}

    def _resident_runner(self, transport: Transport, device: Device, runner: str, workdir: str) -> Any:
        from harness.resident import ResidentRunner

        with self._lock:
            resident = self._residents.get(device.name)
            if resident is None:
                resident = ResidentRunner.for_device(
                    transport, self._starts[device.name], runner, backend=self.backend_of(device),
                    threads=self.threads_of(device), workdir=workdir, start_timeout=self.timeout_s, clock=self.clock,
                )  # fmt: skip
                self._residents[device.name] = resident
        return resident

    def _runner_sets(self, name: str) -> tuple[tuple[int, int] | None, frozenset[Path]]:
        """Return ``name``'s live runner (its id and starts; None: none) and the sets it has trained (hold the lock)."""
        resident = self._residents.get(name)
        if resident is None or not resident.alive():
            return None, frozenset()
        runner = (id(resident), resident.starts)
        warmed, trained = self._warm.get(name, (None, frozenset()))
        return runner, trained if warmed == runner else frozenset()

    def _is_cold(self, job: _Job) -> bool:
        """Whether ``job`` would meet a runner that has not trained yet, or not its artifact sets."""
        with self._lock:
            runner, trained = self._runner_sets(job.device.name)
        return runner is None or not _sets_of(job) <= trained

    def _trained(self, job: _Job) -> None:
        """Record that the device's runner has trained ``job``'s artifact sets."""
        with self._lock:
            runner, trained = self._runner_sets(job.device.name)
            if runner is not None:
                self._warm[job.device.name] = (runner, trained | _sets_of(job))

    def _warm_up(self, job: _Job) -> float | ClientFailure | None:
        """Train ``job`` once and discard it when its runner is cold; return the setup seconds.

        A runner's first request pays what no later round does: the SFTP session's start,
        the shard's first load, the sessions of the widths and their first steps; a width
        the runner has not trained yet pays its session and first steps. The discarded
        request pays them instead, so every round that counts is a steady one. Returns
        None when the runner is warm (or warming up is off), the failure when the warm-up
        failed.
        """
        if not (self.warm_up and self.resident and self._is_cold(job)):
            return None
        started = self.clock()
        warm = self._train(job)
        if isinstance(warm, ClientFailure):
            return dataclasses.replace(warm, message=f"{warm.message} (while warming up the device's runner)")
        self._trained(job)
        return self.clock() - started

    def _train_counted(self, job: _Job, setup: float | None) -> TrainRes | ClientFailure:
        """Train ``job`` for the round (after `_warm_up`, whose ``setup`` seconds join its metrics)."""
        res = self._train(job)
        if isinstance(res, TrainRes):
            self._trained(job)
            if setup is not None:
                res = dataclasses.replace(res, metrics={**res.metrics, "setup_seconds": setup})
        return res

    def _train(self, job: _Job) -> TrainRes | ClientFailure:
        from harness import contract

        ins, device = job.ins, job.device
        started = self.clock()
        local_in = self.work_dir / f"{ins.cid}-in.npy"
        local_out = self.work_dir / f"{ins.cid}-out.npy"
        epochs, lr, seed = (
            int(ins.config.get("epochs", 1)),
            float(ins.config.get("lr", 0.05)),
            int(ins.config.get("seed", 0)),
        )
        extra: dict[str, float] = {}
        try:
            contract.write_params(local_in, job.manifest, job.params)
            transport = self._transport(device)
            runner, remote_set, remote_shard, workdir = self._prepared(transport, job)
            fjord = self._fjord_request(transport, job) if job.widths else None
            remote_in, remote_out = f"{workdir}/fl-{ins.cid}-in.npy", f"{workdir}/fl-{ins.cid}-out.npy"
            t0 = self.clock()
            transport.put(local_in, remote_in)
            download = self.clock() - t0
            options: dict[str, Any] = dict(
                backend=self.backend_of(device), params=remote_in, data=remote_shard, out=remote_out,
                epochs=epochs, lr=lr, threads=self.threads_of(device), seed=seed,
            )  # fmt: skip
            options.update(round_power_options(device))
            if self.resident:
                resident = self._resident_runner(transport, device, runner, workdir)
                try:
                    output, compute = resident.train(
                        remote_set, **options, timeout=self.timeout_s, request_id=ins.cid, fjord=fjord,
                        syncdrop=job.syncdrop,
                    )  # fmt: skip
                except CommandTimeout as exc:
                    message = f"{exc}; the runner was killed and starts again with the next request"
                    return ClientFailure(ins.cid, "timeout", message, self.clock() - started)
                extra["runner_starts"] = float(resident.starts)
            else:
                run = transport.run(
                    contract.train_argv(self._starts[device.name], runner, remote_set, **options),
                    timeout=self.timeout_s,
                )
                output, compute = contract.parse_output(run.rc, run.stdout, run.stderr), run.seconds
            if not output.ok:
                reason = contract.FAILURE_REASON_OF_STATUS.get(output.status, "error")
                message = f"device {device.name}: {output.status}: {output.message}"
                return ClientFailure(ins.cid, reason, message, self.clock() - started)
            doc = output.document
            t0 = self.clock()
            transport.get(remote_out, local_out)
            upload = self.clock() - t0
            trained = contract.read_params(local_out, job.manifest)
        except TransportError as exc:
            self._forget(device.name)
            reason = contract.FAILURE_REASON_OF_STATUS.get(exc.kind, "error")
            return ClientFailure(ins.cid, reason, str(exc) or type(exc).__name__, self.clock() - started)
        except (OSError, ValueError) as exc:
            message = f"device {device.name}: {type(exc).__name__}: {exc}"
            return ClientFailure(ins.cid, "error", message, self.clock() - started)
        metrics = self._metrics(job, doc, local_in.stat().st_size, local_out.stat().st_size)
        metrics.update(extra)
        return TrainRes(
            cid=ins.cid,
            submodel=ins.submodel,
            parameters=trained,
            # the FedAvg weight: the examples of one epoch, every one the runner trained (its
            # short last batch included, as in process), not whole batches
            num_examples=(doc.examples or 0) // max(1, epochs),
            compute_seconds=float(compute),
            download_seconds=download,
            upload_seconds=upload,
            metrics=metrics,
            steps_at_width=steps_at_width(doc) if job.widths else {},
        )

    def _metrics(self, job: _Job, doc: RunnerDocument, in_bytes: int, out_bytes: int) -> dict[str, float]:
        """Return the client round's metrics from the runner's document."""
        ins = job.ins
        steps = len(doc.step_seconds)
        metrics: dict[str, float] = {
            "loss": last_epoch_loss(doc, int(ins.config.get("epochs", 1))),
            "steps": float(steps),
            "step_seconds": float(sum(doc.step_seconds)),
            "trained_width": float(ins.submodel.arch.sizes[0] / self.model.group_sizes[0]),
            "download_bytes": float(in_bytes),
            "upload_bytes": float(out_bytes),
        }
        timings = {
            "peak_memory_bytes": doc.peak_memory_bytes, "request_seconds": doc.request_seconds,
            "load_seconds": doc.load_seconds, "save_seconds": doc.save_seconds, "loop_seconds": doc.loop_seconds,
            "loop_cpu_seconds": doc.loop_cpu_seconds,
        }  # fmt: skip
        metrics.update((key, float(value)) for key, value in timings.items() if value is not None)
        if doc.sessions is not None:
            metrics["sessions_opened"] = float(doc.sessions.opened)
            metrics["session_open_seconds"] = doc.sessions.open_seconds
        if job.widths:
            metrics.update(fjord_metrics(doc))
        if job.syncdrop is not None:
            metrics.update(syncdrop_metrics(self.model, doc, int(job.manifest["batch"]), job.syncdrop))
        metrics.update(energy_metrics(doc.energy, doc.examples))
        emu = job.device.emulate
        if emu is not None:
            for key, nbytes in (("download_modelled_s", in_bytes), ("upload_modelled_s", out_bytes)):
                modelled = modelled_transfer_seconds(nbytes, emu.rate_kbit, emu.delay_ms)
                if modelled is not None:
                    metrics[key] = modelled
        return metrics

    def run(
        self,
        instructions: Mapping[str, TrainIns],
        shards: Mapping[str, tuple[np.ndarray, np.ndarray]],
        timeout_s: float | None = None,
    ) -> tuple[list[TrainRes], list[ClientFailure]]:
        """Train every client on its device; devices in parallel.

        Cold runners warm up first (`_warm_up`), all of them, and only then do the devices
        train the round's counted requests, each after the devices it shares cpus with
        (`device_turns`).

        Parameters
        ----------
        instructions : mapping of str to TrainIns
            By client id.
        shards : mapping of str to (x, y)
            Each client's training data.
        timeout_s : float, optional
            Overrides the per-command timeout for this round.

        Returns
        -------
        results : list of TrainRes
        failures : list of ClientFailure
            Clients that could not be placed, reached or trained, with the reason.
        """
        if timeout_s is not None:
            self.timeout_s = timeout_s
            with self._lock:
                for resident in self._residents.values():
                    resident.start_timeout = timeout_s
        jobs: dict[str, list[_Job]] = {}
        failures: list[ClientFailure] = []
        for cid, ins in instructions.items():
            try:
                x, y = shards[cid]
                job = self._job(ins, x, y)
            except InputError as exc:
                failures.append(ClientFailure(cid, "refused", str(exc)))
                continue
            except KeyError as exc:
                failures.append(ClientFailure(cid, "error", f"no data shard for client {exc}"))
                continue
            jobs.setdefault(job.device.name, []).append(job)

        # Every cold runner warms up before any device trains its counted round: another
        # device's warm-up (a runner starting, sessions opening) loads the host and would
        # slow a counted round that overlapped it.
        with ThreadPoolExecutor(max_workers=max(1, len(jobs))) as pool:
            warmed = pool.map(lambda name: [self._warm_up(job) for job in jobs[name]], list(jobs))
            setups = dict(zip(jobs, warmed, strict=True))
        finished = {name: threading.Event() for name in jobs}
        waits = device_turns(self.isolation, list(jobs))

        def device_worker(name: str) -> list[TrainRes | ClientFailure]:
            for earlier in waits[name]:
                finished[earlier].wait()
            try:
                return [
                    setup if isinstance(setup, ClientFailure) else self._train_counted(job, setup)
                    for job, setup in zip(jobs[name], setups[name], strict=True)
                ]
            finally:
                finished[name].set()

        results: list[TrainRes] = []
        with ThreadPoolExecutor(max_workers=max(1, len(jobs))) as pool:
            for outcome in pool.map(device_worker, list(jobs)):
                for item in outcome:
                    (results if isinstance(item, TrainRes) else failures).append(item)  # type: ignore[arg-type]
        order = {cid: i for i, cid in enumerate(instructions)}
        results.sort(key=lambda r: order[r.cid])
        failures.sort(key=lambda f: order.get(f.cid, len(order)))
        return results, failures

    def close(self) -> None:
        """Close every resident runner and device connection (idempotent; a later `run` opens them again)."""
        with self._lock:
            names = list(self._transports)
        for name in names:
            self._forget(name)


def device_turns(isolation: IsolationPlan | None, names: Sequence[str]) -> dict[str, list[str]]:
    """Return, per device of a round, the earlier devices of that round it waits for (pure).

    Parameters
    ----------
    isolation : IsolationPlan or None
        The fleet's plan (`harness.isolation.round_isolation`); None: nobody waits.
    names : sequence of str
        The devices with clients this round, in fleet order.

    Returns
    -------
    dict of str to list of str
        ``name`` -> the devices listed before it that share its cpus (as the plan's
        ``after``); devices the plan does not know wait for no one.
    """
    if isolation is None:
        return {name: [] for name in names}
    known = {p.device for p in isolation.placements}
    return {
        name: [other for other in names[:i] if {name, other} <= known and isolation.conflict(name, other)]
        for i, name in enumerate(names)
    }


def step_examples(doc: RunnerDocument, batch: int) -> list[int]:
    """Return the examples of each step of a runner's train document.

    Parameters
    ----------
    doc : RunnerDocument
        A train reply (``step_examples``; a runner without it trained whole batches).
    batch : int
        The artifact set's batch.

    Returns
    -------
    list of int
        One entry per step of ``step_seconds``.
    """
    sizes = doc.step_examples
    steps = len(doc.step_seconds)
    if len(sizes) == steps:
        return list(sizes)
    return [int(batch)] * steps


def last_epoch_loss(doc: RunnerDocument, epochs: int) -> float:
    """Return the mean loss per example over a train document's last epoch, as in-process training reports it.

    Each step's loss is its batch's mean, so the steps are weighted by their examples
    (``step_examples``): an epoch's short last batch counts for its examples only, as in
    `fl.client.sgd_epochs`.

    Parameters
    ----------
    doc : RunnerDocument
        A train reply (``loss``, ``step_seconds``, ``step_examples``, ``batch``).
    epochs : int
        The local epochs it trained.

    Returns
    -------
    float
        NaN without losses.
    """
    losses = list(doc.loss)
    sizes = step_examples(doc, doc.batch or 1)
    if len(sizes) != len(losses):
        sizes = [1] * len(losses)
    per_epoch = max(1, len(losses) // max(1, epochs))
    # a non-finite loss arrives as null
    last = [(v, n) for v, n in zip(losses[-per_epoch:], sizes[-per_epoch:], strict=True) if v is not None]
    if not last:
        return float("nan")
    return sum(v * n for v, n in last) / max(sum(n for _, n in last), 1)


def fjord_metrics(doc: RunnerDocument) -> dict[str, float]:
    """Return the FjORD metrics of a runner document: widths trained, switches and their cost.

    Parameters
    ----------
    doc : RunnerDocument
        A train reply with ``step_widths`` and ``switch_seconds``.

    Returns
    -------
    dict of str to float
        ``mean_width`` (as `fl.strategies.fjord.train_ordered`), ``width_switches`` and
        ``switch_seconds`` (total); the steps per width are `steps_at_width`.
    """
    widths = list(doc.step_widths)
    switches = list(doc.switch_seconds)
    out = {
        "mean_width": float(np.mean(widths)) if widths else 0.0,
        "width_switches": float(len(switches)),
        "switch_seconds": float(sum(switches)),
    }
    return out


class EnergyReadingLike(Protocol):
    """What a client round's energy needs of a train document's reading (`harness.energy.EnergyReading`)."""

    @property
    def joules_per_image(self) -> float | None:
        """Joules per image over the timed steps (None: flagged or unreadable)."""
        ...

    @property
    def emulated(self) -> bool:
        """Whether the sensor was emulated."""
        ...


def energy_metrics(reading: EnergyReadingLike | None, images: int | None) -> dict[str, float]:
    """Return a client round's measured energy metrics from its train document's energy reading.

    The runner measures energy over the round's training steps when the host gave it the
    device's power root; the typed document's ``energy`` (`harness.energy.EnergyReading`)
    is read by attribute, so a document without one gives no metrics.

    Parameters
    ----------
    reading : EnergyReadingLike or None
        The document's ``energy``.
    images : int or None
        The examples the round trained (the document's ``examples``).

    Returns
    -------
    dict of str to float
        ``energy_j`` (joules per image x images) and ``energy_emulated`` (1.0 or 0.0);
        empty without a reading with joules.
    """
    if reading is None or reading.joules_per_image is None or not images:
        return {}
    per_image = reading.joules_per_image
    return {"energy_j": float(per_image) * int(images), "energy_emulated": float(bool(reading.emulated))}


def steps_at_width(doc: RunnerDocument) -> dict[float, int]:
    """Return how many steps of a FjORD train reply trained at each width, by width.

    Parameters
    ----------
    doc : RunnerDocument
        A train reply; ``step_widths`` is the width each step drew (absent: no draws).

    Returns
    -------
    dict of float to int
    """
    widths = list(doc.step_widths)
    return {width: widths.count(width) for width in sorted(set(widths))}


def syncdrop_metrics(model: ZooModel, doc: RunnerDocument, batch: int, keep: Mapping[str, Any]) -> dict[str, float]:
    """Return FedDrop's FLOPs metrics (as `fl.strategies.feddrop.train_syncdrop`) from a runner document.

    Parameters
    ----------
    model : ZooModel
    doc : RunnerDocument
        A train reply with ``mask_means`` (kept fraction per group, per step) and
        ``step_examples`` (examples per step).
    batch : int
        The artifact set's batch (examples per step of a runner that reports none).
    keep : mapping
        The request's ``syncdrop`` entry (its ``groups``' keep probabilities).

    Returns
    -------
    dict of str to float
        ``expected_train_flops`` (per example, Appendix B with the mean keep probabilities),
        ``sampled_train_flops`` (per example, with the drawn masks), ``dense_train_flops``,
        ``train_flops`` (sampled, summed over every example trained), ``kept_fraction``
        (mean over steps and groups) and ``mask_seconds``. The step times stay dense ones:
        masks multiply dense kernels and save no time without sparse kernels.
    """
    from fl.strategies.feddrop import cached_flops_model

    flops = cached_flops_model(model, "training")
    means = [np.asarray(m, dtype=np.float64) for m in doc.mask_means]
    batches = step_examples(doc, batch)
    if len(batches) != len(means):
        batches = [batch] * len(means)
    sampled = [float(flops.flops(m)) * n for m, n in zip(means, batches, strict=True)]
    sizes = np.asarray(model.group_sizes, dtype=np.float64)
    kept = [float((m * sizes).sum() / sizes.sum()) for m in means]
    examples = max(1, sum(batches))
    expected = float(flops.flops(np.array([np.mean(values) for _, values in keep["groups"]])))
    return {
        "expected_train_flops": expected,
        "sampled_train_flops": float(sum(sampled)) / examples,
        "dense_train_flops": float(flops.dense),
        "train_flops": float(sum(sampled)),
        "kept_fraction": float(np.mean(kept)) if kept else 1.0,
        "mask_seconds": doc.mask_seconds or 0.0,
    }


def cut_prefix(model: ZooModel, outer: Arch, outer_params: Mapping[str, np.ndarray], inner: Arch) -> Params:
    """Cut the prefix ``inner`` out of an already extracted, wider prefix sub-model.

    Parameters
    ----------
    model : ZooModel
    outer : Arch
        The wider sub-model's architecture (its widths are the group sizes here).
    outer_params : mapping of str to numpy.ndarray
        The wider sub-model's parameters (any dtype: also flat positions).
    inner : Arch
        The narrower architecture; every width at most ``outer``'s.

    Returns
    -------
    Params
    """
    return extract(outer_params, static_submodel(inner), model.layouts, model.group_names, outer.sizes)
