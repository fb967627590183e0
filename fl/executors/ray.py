"""The ``ray`` executor: clients train in Ray actors, on this machine or on a cluster.

Decisions:

- **Actors, one per core.** ``workers=N`` actors (0: one per CPU Ray reports: this
  machine's cores for a local instance, the cluster's CPUs with ``address``), each
  holding one CPU and ``threads`` torch threads. More workers than the cluster's CPUs is
  refused (such actors would wait for a CPU forever); on a shared cluster, actors wait
  until CPUs are free. An actor keeps its zoo model between
  clients and trains each client with `fl.client.run_local`, exactly as the
  ``inprocess`` executor does, so a run gives the same parameters bit for bit with
  either executor (tested with one torch thread on both sides). The torch module is
  built anew per client: trainers seed torch before building it, and a reused module
  would leave the random stream at another place.
- **Parameters through the object store, once per distinct payload.** Strategies send
  every client its own extracted copy of the global parameters (`fl.records.TrainIns`).
  The executor groups the round's payloads by sub-model and ``ray.put`` s each
  distinct one once (equality checked array by array, so a strategy that sends
  something else still gets exactly what it sent); FedAvg's round is one put. A
  client's data shard is put once per run and reused in every round. Actors receive
  object references, which Ray resolves to read-only zero-copy arrays; trainers only
  read them (their first step copies the parameters into a torch module).
- **Dispatch in batches.** A round's clients are cut into batches of
  ``ceil(clients / (actors * CALLS_PER_ACTOR))``, one actor call each; batches go to
  actors as actors free up, ``IN_FLIGHT`` calls queued per actor to hide the round trip;
  results come back in the order of the instructions. One call per client cost the
  driver more CPU than the client's training for a small model (FedAvg's FjORD CNN on
  4 examples: about 3.5 ms of submitting, waiting and fetching per call against 3 ms of
  training, ``tests/bench/fl_scale.py``), and on a machine with as many actors as cores
  the driver's time is taken from the actors. ``CALLS_PER_ACTOR`` calls per actor keep
  the actors evenly loaded when clients differ in cost. With a timeout, every call holds
  one client, so a client past it is found within the timeout and fails alone.
  Objects a batch needs (parameter payloads, shards) are top-level arguments, each
  distinct reference once, which Ray resolves before the call.
- **Failures.** A client whose trainer raises fails with ``error`` (its exception's type
  and message); one whose compute time exceeds the timeout fails with ``timeout``, and
  a call that does not return within the timeout fails with ``timeout`` too: its actor
  is killed and replaced (a running torch step cannot be interrupted), the calls queued
  behind it go back to the queue. An actor that dies (its process killed, a crash) fails
  the clients it held with ``unreachable`` and the reason Ray gives (``out_of_memory``
  when Ray's memory monitor killed it); it is replaced and the round goes on without
  those clients.
- **Lifecycle.** Without ``address`` the executor starts a local Ray instance (no dashboard;
  asked for the loopback address, though Ray's services still listen on every interface of
  the host and name its first address) and `close` stops it: ``ray.shutdown()``, then every
  process the instance started, found by a marker in their environment
  (`devices.processes.marked`), is stopped by pid and waited for
  (`devices.processes.stop`). With ``address`` it joins that cluster and `close` only
  disconnects (the cluster keeps running); if this process is already connected to Ray,
  the executor uses that connection and leaves it as it found it.
- **Ray missing** is `RAY_MISSING`, one line naming the extra (`require_ray`).
"""

from __future__ import annotations

import dataclasses
import os
import time
import uuid
import warnings
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from exporters.userinput import InputError
from exporters.zoo import ZooModel, get_model
from fl.client import run_local
from fl.executors import ClosingExecutor, Shard
from fl.records import ClientFailure, Params, TrainIns, TrainRes

#: The one line printed when Ray is not installed.
RAY_MISSING = "the ray executor needs Ray: pip install 'fleetbench[scale]' (the 'scale' extra)"
#: Environment variable marking the processes of a Ray instance this executor started.
MARK_ENV = "FLEETBENCH_RAY_INSTANCE"
#: Calls queued per actor.
IN_FLIGHT = 2
#: Calls per actor a round is cut into (without a timeout).
CALLS_PER_ACTOR = 4


def require_ray() -> Any:
    """Import and return the ``ray`` module.

    Returns
    -------
    module

    Raises
    ------
    InputError
        `RAY_MISSING` when Ray is not installed.
    """
    try:
        import ray
    except ImportError:
        raise InputError(RAY_MISSING) from None
    return ray


class _Trainer:
    """A Ray actor's body: the zoo model kept between clients, one client trained per call."""

    def __init__(self, model_name: str, threads: int) -> None:
        import torch

        torch.set_num_threads(threads)
        # Arguments arrive as read-only views of the object store; trainers copy before writing.
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        self.model = get_model(model_name)

    def pid(self) -> int:
        """Return the actor's process id."""
        return os.getpid()

    def train(self, jobs: list[tuple[TrainIns, int, int, int]], *objects: Any) -> list[TrainRes | tuple[str, float]]:
        """Train a batch of clients, one after another.

        Parameters
        ----------
        jobs : list of (TrainIns, int, int, int)
            Per client: its instructions without parameters, and the positions in
            ``objects`` of its parameters, ``x`` and ``y``.
        *objects
            The distinct parameter payloads and shards of the batch (Ray resolves them).

        Returns
        -------
        list
            Per client, its `TrainRes`, or ``(message, seconds)`` when its trainer raised.
        """
        out: list[TrainRes | tuple[str, float]] = []
        for ins, p, x, y in jobs:
            start = time.perf_counter()
            try:
                out.append(
                    run_local(self.model, dataclasses.replace(ins, parameters=objects[p]), objects[x], objects[y])
                )
            except Exception as exc:  # noqa: BLE001 - a client's error fails that client only
                out.append((f"{type(exc).__name__}: {_first_line(exc)}", time.perf_counter() - start))
        return out


@dataclasses.dataclass
class _Slot:
    """One actor and the calls queued on it: ``(ref, cids)``, the running one first."""

    actor: Any
    calls: deque[tuple[Any, tuple[str, ...]]] = dataclasses.field(default_factory=deque)
    head_started: float = 0.0


class RayExecutor(ClosingExecutor):
    """Train clients in Ray actors (see the module docstring).

    Parameters
    ----------
    model : ZooModel
        The run's global model (actors rebuild it by name).
    workers : int
        Actors; 0: one per CPU.
    address : str, optional
        A running cluster to join (``ray start --head`` prints it); default: start a local instance.
    threads : int
        Torch threads per actor.
    clock : callable
        Monotonic clock in seconds (injected for tests).

    Raises
    ------
    InputError
        When Ray is not installed (`RAY_MISSING`).
    """

    name = "ray"

    def __init__(
        self,
        model: ZooModel,
        workers: int = 0,
        *,
        address: str | None = None,
        threads: int = 1,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.ray = require_ray()
        self.model = model
        self.threads = max(int(threads), 1)
        self.clock = clock
        self.address = address
        self._owns_connection = False
        self._mark: str | None = None
        self._slots: list[_Slot] = []
        self._shards: dict[str, tuple[np.ndarray, np.ndarray, Any]] = {}
        #: Parameter payloads put into the object store in the last round, clients served, actor calls made.
        self.last_round: dict[str, int] = {"payloads": 0, "clients": 0, "calls": 0}
        try:
            self._connect(int(workers))
            cpus = int(self.ray.cluster_resources().get("CPU", 0))
            if int(workers) > cpus:
                raise InputError(f"--workers {workers}: the Ray cluster has {cpus} CPU(s), one per actor")
            count = int(workers) or max(cpus, 1)
            self._actor_class = self.ray.remote(num_cpus=1)(_Trainer)
            self._slots = [_Slot(self._new_actor()) for _ in range(count)]
        except BaseException:
            self.close()
            raise

    # -- lifecycle -----------------------------------------------------------------------

    def _connect(self, workers: int) -> None:
        ray = self.ray
        if ray.is_initialized():
            return
        options: dict[str, Any] = {"configure_logging": False, "log_to_driver": False}
        if self.address is not None:
            ray.init(address=self.address, **options)
            self._owns_connection = True
            return
        self._mark = uuid.uuid4().hex
        previous = os.environ.get(MARK_ENV)
        os.environ[MARK_ENV] = self._mark  # inherited by every process of the instance
        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", FutureWarning)
                ray.init(
                    # "local": a new instance even when `ray start` left a cluster on this machine
                    address="local",
                    num_cpus=max(workers, os.cpu_count() or 1),
                    include_dashboard=False,
                    _node_ip_address="127.0.0.1",
                    **options,
                )
            self._owns_connection = True
        finally:
            if previous is None:
                os.environ.pop(MARK_ENV, None)
            else:
                os.environ[MARK_ENV] = previous

    def _new_actor(self) -> Any:
        return self._actor_class.remote(self.model.name, self.threads)

    def worker_pids(self) -> list[int]:
        """Return the process id of every actor (in actor order)."""
        return [int(pid) for pid in self.ray.get([slot.actor.pid.remote() for slot in self._slots])]

    def close(self) -> None:
        """Kill the actors; stop a local instance this executor started and wait for its processes (idempotent)."""
        ray = self.ray
        for slot in self._slots:
            try:
                ray.kill(slot.actor)
            except Exception:  # noqa: BLE001, S110 - an actor already gone needs no kill
                pass
        self._slots = []
        self._shards = {}
        if self._owns_connection:
            ray.shutdown()
            self._owns_connection = False
        if self._mark is not None:
            from devices import processes

            mark = self._mark
            processes.stop([], also=lambda: processes.marked(MARK_ENV, mark))
            self._mark = None

    # -- one round -----------------------------------------------------------------------

    def run(
        self, instructions: Mapping[str, TrainIns], shards: Mapping[str, Shard], timeout_s: float | None = None
    ) -> tuple[list[TrainRes], list[ClientFailure]]:
        """Train every instructed client on its shard (see `fl.executors.Executor.run`)."""
        failures: dict[str, ClientFailure] = {}
        done: dict[str, TrainRes] = {}
        jobs: dict[str, tuple[TrainIns, Any, Any, Any]] = {}  # parameters removed, payload, x, y
        payloads = self._payload_refs(instructions)
        for cid, ins in instructions.items():
            try:
                x_ref, y_ref = self._shard_refs(cid, shards[cid])
            except Exception as exc:  # noqa: BLE001 - a missing shard fails this client only
                failures[cid] = _failure(cid, "error", exc, 0.0)
                continue
            jobs[cid] = (dataclasses.replace(ins, parameters={}), payloads[cid], x_ref, y_ref)
        queue = self._batches(list(jobs), timeout_s)
        self.last_round = {"payloads": len(set(payloads.values())), "clients": len(jobs), "calls": len(queue)}
        started = self.clock()
        pending: dict[Any, int] = {}  # call ref -> slot index
        while queue or pending:
            self._dispatch(queue, jobs, pending)
            if not pending:
                break
            wait_s = None if timeout_s is None else max(self._next_deadline(pending, timeout_s) - self.clock(), 0.0)
            ready, _ = self.ray.wait(list(pending), num_returns=1, timeout=wait_s)
            if not ready:
                self._expire(pending, queue, failures, timeout_s)
                continue
            ref = ready[0]
            index = pending.pop(ref)
            slot = self._slots[index]
            # An actor runs its calls in order, but when it dies they all fail at once, in any order.
            entry = next(e for e in slot.calls if e[0] == ref)
            if slot.calls[0] == entry:
                slot.head_started = self.clock()
            slot.calls.remove(entry)
            self._collect(ref, entry[1], index, done, failures, timeout_s, pending, started)
        results = [done[cid] for cid in instructions if cid in done]
        return results, [failures[cid] for cid in instructions if cid in failures]

    def _batches(self, cids: list[str], timeout_s: float | None) -> deque[tuple[str, ...]]:
        size = 1 if timeout_s is not None else max(-(-len(cids) // (len(self._slots) * CALLS_PER_ACTOR)), 1)
        return deque(tuple(cids[i : i + size]) for i in range(0, len(cids), size))

    def _dispatch(
        self, queue: deque[tuple[str, ...]], jobs: Mapping[str, tuple[Any, ...]], pending: dict[Any, int]
    ) -> None:
        for index, slot in enumerate(self._slots):
            while queue and len(slot.calls) < IN_FLIGHT:
                cids = queue.popleft()
                objects: dict[Any, int] = {}  # each distinct reference once, by position
                batch = [(jobs[cid][0], *(objects.setdefault(r, len(objects)) for r in jobs[cid][1:])) for cid in cids]
                ref = slot.actor.train.remote(batch, *objects)
                if not slot.calls:
                    slot.head_started = self.clock()
                slot.calls.append((ref, cids))
                pending[ref] = index

    def _next_deadline(self, pending: Mapping[Any, int], timeout_s: float) -> float:
        busy = {index for index in pending.values()}
        return min(self._slots[index].head_started for index in busy) + timeout_s

    def _expire(
        self,
        pending: dict[Any, int],
        queue: deque[tuple[str, ...]],
        failures: dict[str, ClientFailure],
        timeout_s: float | None,
    ) -> None:
        """Fail the running call of every actor past the timeout; replace the actor, requeue the calls behind it."""
        assert timeout_s is not None
        now = self.clock()
        for index, slot in enumerate(self._slots):
            if not slot.calls or now - slot.head_started < timeout_s:
                continue
            head_ref, head_cids = slot.calls.popleft()
            for cid in head_cids:
                failures[cid] = ClientFailure(
                    cid, "timeout", f"no result within {timeout_s:g} s", now - slot.head_started
                )
            pending.pop(head_ref, None)
            for ref, cids in reversed(slot.calls):
                pending.pop(ref, None)
                queue.appendleft(cids)
            self._replace(index)

    def _collect(
        self,
        ref: Any,
        cids: tuple[str, ...],
        index: int,
        done: dict[str, TrainRes],
        failures: dict[str, ClientFailure],
        timeout_s: float | None,
        pending: dict[Any, int],
        started: float,
    ) -> None:
        exceptions = self.ray.exceptions
        try:
            outcomes: list[TrainRes | tuple[str, float]] = self.ray.get(ref)
        except exceptions.RayTaskError as exc:
            cause = exc.cause if isinstance(exc.cause, BaseException) else exc
            failures.update((cid, _failure(cid, "error", cause, self.clock() - started)) for cid in cids)
            return
        except exceptions.RayActorError as exc:
            reason = "out_of_memory" if isinstance(exc, exceptions.OutOfMemoryError) else "unreachable"
            message = f"Ray worker died: {_first_line(exc)}"
            slot = self._slots[index]
            lost = list(cids)
            for queued_ref, queued_cids in slot.calls:  # the dead actor's other clients fail too
                pending.pop(queued_ref, None)
                lost.extend(queued_cids)
            failures.update((cid, ClientFailure(cid, reason, message, self.clock() - started)) for cid in lost)
            slot.calls.clear()
            self._replace(index)
            return
        except exceptions.RayError as exc:  # an object lost with its node, a runtime environment that failed
            failures.update((cid, _failure(cid, "error", exc, self.clock() - started)) for cid in cids)
            return
        for cid, res in zip(cids, outcomes, strict=True):
            if isinstance(res, tuple):
                failures[cid] = ClientFailure(cid, "error", res[0], res[1])
            elif timeout_s is not None and res.compute_seconds > timeout_s:
                message = f"took {res.compute_seconds:.3f} s > {timeout_s:g} s"
                failures[cid] = ClientFailure(cid, "timeout", message, res.compute_seconds)
            else:
                done[cid] = res

    def _replace(self, index: int) -> None:
        slot = self._slots[index]
        try:
            self.ray.kill(slot.actor)
        except Exception:  # noqa: BLE001, S110 - a dead actor needs no kill
            pass
        self._slots[index] = _Slot(self._new_actor())

    # -- object store ----------------------------------------------------------------------

    def _payload_refs(self, instructions: Mapping[str, TrainIns]) -> dict[str, Any]:
        """Put each distinct parameter payload of the round once; return its reference per client."""
        groups: dict[tuple[Any, ...], list[tuple[Params, Any]]] = {}
        refs: dict[str, Any] = {}
        for cid, ins in instructions.items():
            candidates = groups.setdefault(_submodel_key(ins), [])
            for params, ref in candidates:
                if _same_params(params, ins.parameters):
                    refs[cid] = ref
                    break
            else:
                ref = self.ray.put(dict(ins.parameters))
                candidates.append((ins.parameters, ref))
                refs[cid] = ref
        return refs

    def _shard_refs(self, cid: str, shard: Shard) -> tuple[Any, Any]:
        x, y = shard
        cached = self._shards.get(cid)
        if cached is not None and cached[0] is x and cached[1] is y:
            return cached[2]
        refs = (self.ray.put(np.asarray(x)), self.ray.put(np.asarray(y)))
        self._shards[cid] = (x, y, refs)
        return refs


def _submodel_key(ins: TrainIns) -> tuple[Any, ...]:
    sub = ins.submodel
    indices = tuple(np.asarray(i).tobytes() for i in sub.indices)
    return (sub.arch.key(), indices, tuple((k, np.shape(v)) for k, v in ins.parameters.items()))


def _same_params(a: Mapping[str, np.ndarray], b: Mapping[str, np.ndarray]) -> bool:
    if a is b:
        return True
    if list(a) != list(b):
        return False
    return all(a[k] is b[k] or (a[k].dtype == b[k].dtype and np.array_equal(a[k], b[k])) for k in a)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _failure(cid: str, reason: str, exc: BaseException, seconds: float) -> ClientFailure:
    return ClientFailure(cid, reason, f"{type(exc).__name__}: {_first_line(exc)}", seconds)
