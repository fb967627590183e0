"""The ``devices`` executor: clients train on fleet devices with the on-device runner.

Each round, for each client placed on a device:

1. the artifact set of the client's width is exported on the host (cached by
   `exporters.artifacts.export_artifacts`, SGD optimizer graph) and deployed once per
   device through the device's content-addressed cache, like the runner itself;
2. the client's data shard is written as ``.npz`` and deployed once (the cache keys it
   by content, so later rounds push nothing);
3. the sub-model parameters go to the device as a flat float32 ``.npy`` in manifest
   order (*download*, timed), the runner's ``train`` mode trains ``epochs`` over the
   shard (*compute*: the runner's wall time on the device), and the trained vector
   comes back (*upload*, timed).

Devices work in parallel, the clients of one device one after another. Every remote
command has a timeout, so a round never hangs; a device that cannot be reached, times
out or whose runner fails gives a `ClientFailure` for that client and the others go on.
A failed device's connection is dropped and opened again when a later round uses it.
Connections stay open from round to round; `close` (or leaving ``with DevicesExecutor(...)
as executor:``) closes all of them, whether the run finished or failed.

Emulated links: when the device's ``emulate:`` block has a link rate, the modelled
transfer times (bytes / rate + one-way delay, per direction) are reported beside the
measured ones in the metrics (``download_modelled_s``, ``upload_modelled_s``).

Local trainers: ``plain`` trains the sent sub-model. ``fjord`` (ordered dropout) is
sampled **per round** on a device, not per step: the runner trains one fixed-width
artifact set per call, so each client draws one width from ``{p in widths: p <=
p_max}`` with its round seed, trains that prefix of its p_max parameters and returns
the p_max parameters with the trained prefix written back. Per-step sampling would
need one ``copy_buffer_to_parameters`` round trip per step and width; per-round
sampling keeps the expectation over widths and costs nothing extra on the device.
SyncDrop (FedDrop) masks are not part of the exported graphs, so ``syncdrop`` is
refused with a clear error.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from devices.errors import TransportError
from devices.fleet import Device
from devices.transport import Transport
from exporters.arch import Arch, SubModel, extract, static_submodel, tensor_index
from exporters.artifacts import export_artifacts
from exporters.errors import InputError
from exporters.zoo import ZooModel
from fl.executors import ClosingExecutor
from fl.records import ClientFailure, Params, TrainIns, TrainRes
from harness.contract import RunnerStart

#: Seconds allowed for one remote command when the caller gives no timeout.
DEFAULT_TIMEOUT_S = 300.0


@dataclass(frozen=True)
class _Job:
    """One client's work on its device (built on the host before dispatch)."""

    ins: TrainIns
    device: Device
    set_dir: Path
    manifest: Mapping[str, Any]
    train_sub: SubModel
    params: Params
    shard: Path


def modelled_transfer_seconds(nbytes: int, rate_kbit: int | None, delay_ms: float | None) -> float | None:
    """Return the modelled one-way transfer time of ``nbytes`` over an emulated link.

    Parameters
    ----------
    nbytes : int
        Payload size in bytes.
    rate_kbit : int or None
        Link rate in kbit/s; None when the link is not shaped.
    delay_ms : float or None
        One-way delay in milliseconds.

    Returns
    -------
    float or None
        ``nbytes * 8 / (rate_kbit * 1000) + delay_ms / 1000``; None without a rate.
    """
    if not rate_kbit:
        return None
    return nbytes * 8 / (rate_kbit * 1000.0) + (delay_ms or 0.0) / 1000.0


def ordered_width_for_round(widths: Sequence[float], p_max: float, seed: int) -> float:
    """Draw the width a FjORD client trains in one round on a device.

    Parameters
    ----------
    widths : sequence of float
        FjORD's width set (uniform-k).
    p_max : float
        The client's largest width.
    seed : int
        The client's round seed (``TrainIns.config["seed"]``).

    Returns
    -------
    float
        A width drawn uniformly from ``{p in widths : p <= p_max}``.

    Raises
    ------
    InputError
        If no width of the set is at most ``p_max``.
    """
    allowed = sorted(w for w in widths if w <= p_max + 1e-9)
    if not allowed:
        raise InputError(f"no FjORD width at most p_max={p_max:g} in {list(widths)}")
    return float(allowed[int(np.random.default_rng(seed).integers(len(allowed)))])


class DevicesExecutor(ClosingExecutor):
    """Run `TrainIns` on fleet devices with the runner's ``train`` mode.

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
        Training batch size (the artifact sets' fixed batch).
    connect : callable
        ``connect(device) -> Transport`` (`devices.connect.connect` in production).
    timeout_s : float
        Seconds allowed per remote command.
    threads : int
        Threads the runner uses on the device.
    clock : callable
        Monotonic clock in seconds.
    backends : mapping of str to str, optional
        The runner backend of each device by name (``"ort"``, ``"onnx"``, ``"torch"``);
        devices not named train with ``"ort"``, or with their runtime's backend where the
        runtime offers only some (a phone running a runtime bundle: ``"onnx"``,
        `harness.phone_runtime`). Each client round records its backend.
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
        threads: int = 1,
        clock: Callable[[], float] = time.perf_counter,
        backends: Mapping[str, str] | None = None,
    ) -> None:
        self.model = model
        self.backends = dict(backends or {})
        self.placement = dict(placement)
        self.artifacts_dir = Path(artifacts_dir)
        self.work_dir = Path(work_dir)
        self.work_dir.mkdir(parents=True, exist_ok=True)
        self.batch = batch
        self.connect = connect
        self.timeout_s = timeout_s
        self.threads = threads
        self.clock = clock
        self._transports: dict[str, Transport] = {}
        self._runner: dict[str, str] = {}
        self._starts: dict[str, RunnerStart] = {}
        self._sets: dict[tuple[str, str], str] = {}
        self._shards: dict[tuple[str, str], tuple[str, str]] = {}
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

    # -- host side -----------------------------------------------------------------------

    def _artifact_set(self, arch: Arch) -> tuple[Path, Mapping[str, Any]]:
        result = export_artifacts(self.model, arch, batch=self.batch, optimizer="sgd", out_dir=self.artifacts_dir)
        return result.directory, result.manifest

    def _write_shard(self, cid: str, x: np.ndarray, y: np.ndarray) -> Path:
        digest = hashlib.sha256()
        digest.update(np.ascontiguousarray(x).tobytes())
        digest.update(np.ascontiguousarray(y, dtype=np.int64).tobytes())
        path = self.work_dir / f"shard-{cid}-{digest.hexdigest()[:16]}.npz"
        if not path.exists():
            tmp = path.with_suffix(".tmp.npz")
            np.savez(tmp, x=np.ascontiguousarray(x), y=np.ascontiguousarray(y, dtype=np.int64))
            tmp.replace(path)
        return path

    def _job(self, ins: TrainIns, x: np.ndarray, y: np.ndarray) -> _Job:
        if ins.cid not in self.placement:
            raise InputError(f"client {ins.cid} has no device")
        trainer = str(ins.config.get("trainer", "plain"))
        train_sub, params = ins.submodel, dict(ins.parameters)
        if trainer == "fjord":
            width = ordered_width_for_round(
                ins.config["widths"], float(ins.config["p_max"]), int(ins.config.get("seed", 0))
            )
            train_sub = static_submodel(self.model.arch(width))
            params = cut_prefix(self.model, ins.submodel.arch, ins.parameters, train_sub.arch)
        elif trainer != "plain":
            raise InputError(f"the devices executor cannot run the {trainer!r} local trainer on a device")
        set_dir, manifest = self._artifact_set(train_sub.arch)
        shard = self._write_shard(ins.cid, x, y)
        return _Job(ins, self.placement[ins.cid], set_dir, manifest, train_sub, params, shard)

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
            self._runner.pop(name, None)
            self._starts.pop(name, None)
            for key in [k for k in self._sets if k[0] == name]:
                del self._sets[key]
            for key in [k for k in self._shards if k[0] == name]:
                del self._shards[key]
        if transport is not None:
            try:
                transport.close()
            except Exception:  # noqa: BLE001 - closing a broken connection must not mask the failure
                pass

    def _prepared(self, transport: Transport, job: _Job) -> tuple[str, str, str, str]:
        """Deploy runner, artifact set and shard once per device; return their remote paths and the workdir."""
        from harness.contract import RUNNER_PATH
        from harness.deploy import deploy_artifact_set, deploy_files, deploy_runner

        name = job.device.name
        if name not in self._starts:  # a phone without Python gets its runtime bundle
            from harness.phone_runtime import runner_start

            self._starts[name] = runner_start(transport, job.device, timeout=self.timeout_s)
        if name not in self._runner:
            self._runner[name] = deploy_runner(transport, job.device, RUNNER_PATH, timeout=self.timeout_s)
        key = (name, job.set_dir.name)
        if key not in self._sets:
            self._sets[key] = deploy_artifact_set(transport, job.device, job.set_dir, timeout=self.timeout_s).remote_dir
        shard_key = (name, job.shard.name)
        if shard_key not in self._shards:
            deployed = deploy_files(transport, job.device, [job.shard], timeout=self.timeout_s)
            self._shards[shard_key] = (deployed.remote_paths[job.shard.name], deployed.workdir)
        remote_shard, workdir = self._shards[shard_key]
        return self._runner[name], self._sets[key], remote_shard, workdir

    def _train(self, job: _Job) -> TrainRes | ClientFailure:
        from harness import contract

        ins, device = job.ins, job.device
        started = self.clock()
        local_in = self.work_dir / f"{ins.cid}-in.npy"
        local_out = self.work_dir / f"{ins.cid}-out.npy"
        try:
            contract.write_params(local_in, job.manifest, job.params)
            transport = self._transport(device)
            runner, remote_set, remote_shard, workdir = self._prepared(transport, job)
            remote_in, remote_out = f"{workdir}/fl-{ins.cid}-in.npy", f"{workdir}/fl-{ins.cid}-out.npy"
            t0 = self.clock()
            transport.put(local_in, remote_in)
            download = self.clock() - t0
            argv = contract.train_argv(
                self._starts[device.name], runner, remote_set, backend=self.backend_of(device), params=remote_in,
                data=remote_shard,
                out=remote_out, epochs=int(ins.config.get("epochs", 1)), lr=float(ins.config.get("lr", 0.05)),
                threads=self.threads, seed=int(ins.config.get("seed", 0)),
            )  # fmt: skip
            run = transport.run(argv, timeout=self.timeout_s)
            output = contract.parse_output(run.rc, run.stdout, run.stderr)
            if not output.ok:
                reason = contract.FAILURE_REASON_OF_STATUS.get(output.status, "error")
                return ClientFailure(ins.cid, reason, output.message, self.clock() - started)
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
            return ClientFailure(ins.cid, "error", f"{type(exc).__name__}: {exc}", self.clock() - started)
        params = trained
        if job.train_sub is not ins.submodel:
            params = write_prefix(self.model, ins.submodel.arch, ins.parameters, job.train_sub.arch, trained)
        losses = [v for v in doc.get("loss", []) if isinstance(v, (int, float))]
        steps = len(doc.get("step_seconds", []))
        per_epoch = max(1, steps // max(1, int(ins.config.get("epochs", 1))))
        last = losses[-per_epoch:] if losses else []
        in_bytes, out_bytes = local_in.stat().st_size, local_out.stat().st_size
        emu = device.emulate
        metrics: dict[str, float] = {
            "loss": float(np.mean(last)) if last else float("nan"),
            "steps": float(steps),
            "step_seconds": float(sum(doc.get("step_seconds", []))),
            "trained_width": float(job.train_sub.arch.widths[0] / self.model.group_sizes[0]),
            "download_bytes": float(in_bytes),
            "upload_bytes": float(out_bytes),
        }
        if doc.get("peak_memory_bytes") is not None:
            metrics["peak_memory_bytes"] = float(doc["peak_memory_bytes"])
        if emu is not None:
            for key, nbytes in (("download_modelled_s", in_bytes), ("upload_modelled_s", out_bytes)):
                modelled = modelled_transfer_seconds(nbytes, emu.rate_kbit, emu.delay_ms)
                if modelled is not None:
                    metrics[key] = modelled
        return TrainRes(
            cid=ins.cid,
            submodel=ins.submodel,
            parameters=params,
            num_examples=int(doc.get("examples", 0)) // max(1, int(ins.config.get("epochs", 1))),
            compute_seconds=float(run.seconds),
            download_seconds=download,
            upload_seconds=upload,
            metrics=metrics,
        )

    def run(
        self,
        instructions: Mapping[str, TrainIns],
        shards: Mapping[str, tuple[np.ndarray, np.ndarray]],
        timeout_s: float | None = None,
    ) -> tuple[list[TrainRes], list[ClientFailure]]:
        """Train every client on its device; devices in parallel.

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

        def device_worker(device_jobs: list[_Job]) -> list[TrainRes | ClientFailure]:
            return [self._train(job) for job in device_jobs]

        results: list[TrainRes] = []
        with ThreadPoolExecutor(max_workers=max(1, len(jobs))) as pool:
            for outcome in pool.map(device_worker, jobs.values()):
                for item in outcome:
                    (results if isinstance(item, TrainRes) else failures).append(item)  # type: ignore[arg-type]
        order = {cid: i for i, cid in enumerate(instructions)}
        results.sort(key=lambda r: order[r.cid])
        failures.sort(key=lambda f: order.get(f.cid, len(order)))
        return results, failures

    def close(self) -> None:
        """Close every open device connection (idempotent; a later `run` opens them again)."""
        with self._lock:
            names = list(self._transports)
        for name in names:
            self._forget(name)


def cut_prefix(model: ZooModel, outer: Arch, outer_params: Mapping[str, np.ndarray], inner: Arch) -> Params:
    """Cut the prefix ``inner`` out of an already extracted, wider prefix sub-model.

    Parameters
    ----------
    model : ZooModel
    outer : Arch
        The wider sub-model's architecture (its widths are the group sizes here).
    outer_params : mapping of str to numpy.ndarray
        The wider sub-model's parameters.
    inner : Arch
        The narrower architecture; every width at most ``outer``'s.

    Returns
    -------
    Params
    """
    return extract(outer_params, static_submodel(inner), model.layouts, model.group_names, outer.widths)


def write_prefix(
    model: ZooModel,
    outer: Arch,
    outer_params: Mapping[str, np.ndarray],
    inner: Arch,
    inner_params: Mapping[str, np.ndarray],
) -> Params:
    """Write a trained prefix back into the wider parameters it was cut from (`cut_prefix`'s inverse).

    Parameters
    ----------
    model : ZooModel
    outer : Arch
    outer_params : mapping of str to numpy.ndarray
        The wider sub-model's parameters; updated copies are returned.
    inner : Arch
    inner_params : mapping of str to numpy.ndarray
        The trained prefix's parameters.

    Returns
    -------
    Params
    """
    order = {g: i for i, g in enumerate(model.group_names)}
    out = {k: np.array(v, dtype=np.float32, copy=True) for k, v in outer_params.items()}
    for name, tensor in out.items():
        per_dim = tensor_index(model.layouts[name], static_submodel(inner), order, outer.widths)
        positions = [np.arange(n) if isinstance(p, slice) else p for p, n in zip(per_dim, tensor.shape, strict=True)]
        tensor[np.ix_(*positions)] = inner_params[name]
    return out
