"""Executors: where the clients of a round train.

An executor takes the round's `TrainIns` per client plus each client's data
shard and returns the results of the clients that finished and a
`ClientFailure` for each one that did not; one failing client never stops the
others. Executors are looked up by name in `EXECUTORS` (``"module:Class"``,
imported on first use) so that new ones (``devices``, ``ray``) plug in without
touching the server loop. `make_executor` builds one as ``cls(model,
workers=N, **options)``; an executor that needs more (a fleet, a placement) can
also be built by the caller and passed to `fl.server.run_fl`.

Executors are context managers: ``with make_executor(...) as executor:`` closes
every worker pool and device connection on the way out, whether the run finished or
failed, and `close` may be called any number of times (`ClosingExecutor` gives a
class both). `fl.server.run_fl` closes an executor it built itself; one passed in is
the caller's to close.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from types import TracebackType
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from exporters.userinput import InputError
from fl.records import ClientFailure, TrainIns, TrainRes

if TYPE_CHECKING:
    from typing_extensions import Self  # typing.Self is Python 3.11+

    from exporters.zoo import ZooModel

#: One client's training data: examples and labels.
Shard = tuple[np.ndarray, np.ndarray]

#: Executor name (``RunConfig.executor``) -> ``"module:Class"``.
EXECUTORS: dict[str, str] = {
    "inprocess": "fl.executors.inprocess:InProcessExecutor",
    "devices": "fl.executors.devices:DevicesExecutor",
    "ray": "fl.executors.ray:RayExecutor",
}


class Executor(Protocol):
    """Runs one round of local training (see the module docstring)."""

    def run(
        self, instructions: Mapping[str, TrainIns], shards: Mapping[str, Shard], timeout_s: float | None = None
    ) -> tuple[list[TrainRes], list[ClientFailure]]:
        """Train every instructed client on its shard.

        Parameters
        ----------
        instructions : mapping of str to TrainIns
            The round's instructions by client id.
        shards : mapping of str to (x, y)
            Training data by client id (at least every instructed client).
        timeout_s : float or None
            Seconds a client may take; a slower client becomes a failure with
            reason ``"timeout"``.

        Returns
        -------
        results : list of TrainRes
            Clients that finished, in the order of ``instructions``.
        failures : list of ClientFailure
            Clients that did not, in the order of ``instructions``.
        """
        ...

    def close(self) -> None:
        """Release workers and connections (idempotent)."""
        ...

    def __enter__(self) -> Self:
        """Return the executor itself."""
        ...

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        """Close the executor (`close`); an exception propagates."""
        ...


class ClosingExecutor:
    """Base class giving an executor ``with`` support around its `close`."""

    def close(self) -> None:
        """Release workers and connections (idempotent; subclasses override)."""

    def __enter__(self) -> Self:
        """Return the executor itself."""
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        """Close the executor; an exception raised in the block propagates."""
        self.close()


def make_executor(name: str, model: ZooModel, *, workers: int = 0, **options: Any) -> Executor:
    """Build the executor registered as ``name``.

    Parameters
    ----------
    name : str
        A key of `EXECUTORS`.
    model : ZooModel
        The run's global model.
    workers : int
        Parallel workers (0: the executor's own default, e.g. one client after another).
    **options
        Further keyword arguments of the executor class.

    Raises
    ------
    InputError
        If no executor has that name.
    """
    if name not in EXECUTORS:
        raise InputError(f"unknown executor {name!r}; known: {', '.join(sorted(EXECUTORS))}")
    module, _, cls = EXECUTORS[name].partition(":")
    executor: Executor = getattr(importlib.import_module(module), cls)(model, workers=workers, **options)
    return executor
