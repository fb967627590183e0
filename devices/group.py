"""Fleet-wide operations: one action per device, concurrently, failures kept apart."""

from __future__ import annotations

import concurrent.futures
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from devices.errors import TransportError
from devices.fleet import Device

T = TypeVar("T")


@dataclass(frozen=True)
class DeviceFailure:
    """Why an action failed on one device.

    Attributes
    ----------
    kind : str
        A `TransportError` kind (``unreachable``, ``authentication failed``,
        ``host key rejected``, ``timeout``, ``connection lost``) or ``runner error``.
    message : str
        One line for people.
    """

    kind: str
    message: str


@dataclass(frozen=True)
class FleetResult(Generic[T]):
    """Per-device outcome of a fleet-wide action, in fleet order.

    Attributes
    ----------
    successes : dict of str to T
        Device name to the action's result.
    failures : dict of str to DeviceFailure
        Device name to its failure.
    """

    successes: dict[str, T] = field(default_factory=dict)
    failures: dict[str, DeviceFailure] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        """Whether every device succeeded."""
        return not self.failures


def _failure(exc: BaseException) -> DeviceFailure:
    kind = exc.kind if isinstance(exc, TransportError) else "runner error"
    message = str(exc).strip().replace("\n", " ") or type(exc).__name__
    return DeviceFailure(kind, message)


def run_on_fleet(
    devices: Sequence[Device],
    action: Callable[[Device], T],
    max_workers: int = 8,
    timeout: float | None = None,
) -> FleetResult[T]:
    """Call ``action(device)`` for every device concurrently.

    One device's exception never stops the others: a `TransportError` is recorded
    with its ``kind``, any other exception as ``runner error``.

    Parameters
    ----------
    devices : sequence of Device
        Names must be unique.
    action : callable
        Called once per device in a worker thread.
    max_workers : int
        Threads at most.
    timeout : float, optional
        Seconds for the whole fleet; devices still running then are recorded as
        ``timeout`` failures (their threads are left to finish in the background).

    Returns
    -------
    FleetResult
        Successes and failures, each in fleet order.
    """
    outcomes: dict[str, tuple[bool, object]] = {}
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=max(1, min(max_workers, len(devices) or 1)))
    try:
        futures = {pool.submit(action, device): device.name for device in devices}
        done, pending = concurrent.futures.wait(futures, timeout=timeout)
        for future in done:
            exc = future.exception()
            outcomes[futures[future]] = (True, future.result()) if exc is None else (False, _failure(exc))
        for future in pending:
            future.cancel()
            outcomes[futures[future]] = (False, DeviceFailure("timeout", f"no result within {timeout:g} s"))
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
    successes: dict[str, T] = {}
    failures: dict[str, DeviceFailure] = {}
    for device in devices:
        good, value = outcomes[device.name]
        if good:
            successes[device.name] = value  # type: ignore[assignment]
        else:
            assert isinstance(value, DeviceFailure)
            failures[device.name] = value
    return FleetResult(successes, failures)
