"""The ``inprocess`` executor: clients train with PyTorch on this machine.

With ``workers=0`` (or 1) clients train one after another in this process; with
``workers=N > 1`` they train in a pool of N spawned processes (``forkserver``
where available, else ``spawn``: no forked torch thread pools), each with one
torch thread. Instructions and shards travel to the workers pickled; numpy
arrays pickle as plain buffers, and the model travels by its zoo name (a zoo
entry holds a builder function, which is rebuilt in the worker rather than
pickled). A client that raises becomes ``ClientFailure(reason="error")``; one
slower than the timeout becomes ``ClientFailure(reason="timeout")`` (in
sequential mode the check happens after the client finishes, since a running
torch step cannot be interrupted).
"""

from __future__ import annotations

import multiprocessing
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout

import numpy as np

from exporters.zoo import ZooModel, get_model
from fl.client import run_local
from fl.executors import ClosingExecutor, Shard
from fl.records import ClientFailure, TrainIns, TrainRes


class InProcessExecutor(ClosingExecutor):
    """Train clients with `fl.client.run_local`, sequentially or in a process pool.

    Parameters
    ----------
    model : ZooModel
        The run's global model (workers rebuild it by name).
    workers : int
        0 or 1: one client after another in this process; N > 1: a pool of N processes.
    clock : callable
        Monotonic clock in seconds (injected for tests).
    """

    def __init__(self, model: ZooModel, workers: int = 0, clock: Callable[[], float] = time.perf_counter) -> None:
        self.model = model
        self.workers = max(int(workers), 0)
        self.clock = clock
        self._pool: ProcessPoolExecutor | None = None

    def run(
        self, instructions: Mapping[str, TrainIns], shards: Mapping[str, Shard], timeout_s: float | None = None
    ) -> tuple[list[TrainRes], list[ClientFailure]]:
        """Train every instructed client on its shard (see `fl.executors.Executor.run`)."""
        if self.workers > 1:
            return self._run_pool(instructions, shards, timeout_s)
        results: list[TrainRes] = []
        failures: list[ClientFailure] = []
        for cid, ins in instructions.items():
            start = self.clock()
            try:
                x, y = shards[cid]
                res = run_local(self.model, ins, x, y, clock=self.clock)
            except Exception as exc:  # noqa: BLE001 - any client error is that client's failure
                failures.append(_error(cid, exc, self.clock() - start))
                continue
            if timeout_s is not None and res.compute_seconds > timeout_s:
                message = f"took {res.compute_seconds:.3f} s > {timeout_s:g} s"
                failures.append(ClientFailure(cid, "timeout", message, res.compute_seconds))
                continue
            results.append(res)
        return results, failures

    def _run_pool(
        self, instructions: Mapping[str, TrainIns], shards: Mapping[str, Shard], timeout_s: float | None
    ) -> tuple[list[TrainRes], list[ClientFailure]]:
        pool = self._ensure_pool()
        start = self.clock()
        futures: dict[str, Future[TrainRes]] = {}
        failures: dict[str, ClientFailure] = {}
        for cid, ins in instructions.items():
            try:
                x, y = shards[cid]
                futures[cid] = pool.submit(_train_in_worker, self.model.name, ins, np.asarray(x), np.asarray(y))
            except Exception as exc:  # noqa: BLE001 - a missing shard or unpicklable input fails this client only
                failures[cid] = _error(cid, exc, 0.0)
        done: dict[str, TrainRes] = {}
        for cid, future in futures.items():
            remaining = None if timeout_s is None else max(timeout_s - (self.clock() - start), 0.0)
            try:
                done[cid] = future.result(timeout=remaining)
            except FutureTimeout:
                future.cancel()
                failures[cid] = ClientFailure(cid, "timeout", f"no result within {timeout_s:g} s", self.clock() - start)
            except Exception as exc:  # noqa: BLE001 - the worker's exception is this client's failure
                failures[cid] = _error(cid, exc, self.clock() - start)
        results = [done[cid] for cid in instructions if cid in done]
        return results, [failures[cid] for cid in instructions if cid in failures]

    def _ensure_pool(self) -> ProcessPoolExecutor:
        if self._pool is None:
            method = "forkserver" if "forkserver" in multiprocessing.get_all_start_methods() else "spawn"
            self._pool = ProcessPoolExecutor(
                max_workers=self.workers, mp_context=multiprocessing.get_context(method), initializer=_init_worker
            )
        return self._pool

    def close(self) -> None:
        """Shut the worker pool down (idempotent; nothing to do in sequential mode)."""
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None


def _error(cid: str, exc: BaseException, seconds: float) -> ClientFailure:
    return ClientFailure(cid, "error", f"{type(exc).__name__}: {exc}", seconds)


def _init_worker() -> None:
    import torch

    torch.set_num_threads(1)


def _train_in_worker(model_name: str, ins: TrainIns, x: np.ndarray, y: np.ndarray) -> TrainRes:
    return run_local(get_model(model_name), ins, x, y)
