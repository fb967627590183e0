"""Isolation: which devices of a campaign may be measured at the same time, and in which turns.

Devices that run on this host (``local`` devices, emulated devices, and devices whose
address is a loopback one) share its cpus. Two of them *conflict* unless both are pinned
to disjoint cpus (``emulate: {cpus: ...}`` applied by ``fleet up``, read back from the
fleet's state by `pinned_cpus`, so that a pin the machine did not permit does not count);
an unpinned one conflicts with every other device on this host. Devices elsewhere (real
SSH / ADB boards) conflict with nothing. Conflicting devices are never measured at the
same time, and the others are. They take *turns*, one pass of their cells at a time
(`may_take_turn`): in fleet order, each device waits for every earlier device it
conflicts with to finish pass k before it runs its own pass k, so with four devices on
this host's cpus the order is pass 1 of each, then pass 2 of each, and so on. A stretch
in which the host slows its cpus for seconds at a time then falls on one pass of a cell,
which the pooled judgement of the passes can leave out (`harness.passes.merge_passes`),
instead of on all of them. The plan's *groups* (printed, stored with the campaign) are
the waves of one pass: group 1 starts at once, a device of group k follows one of group
k - 1.

Every cell records how it was measured (`Measurement.isolation`, from
`IsolationPlan.isolation` and the devices `Activity` saw busy): alone, or beside which
devices (those busy at any moment of its run), and why that was allowed. The host's own
work for a campaign (SSH, deployment pushes) is not pinned; it is light next to a training
step and happens between the runner's timed samples of a device only when another device
is deploying.

FL rounds follow a stricter plan (`round_isolation`): every device on this host takes its
turn alone, whatever its pins.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from devices.emulation.limits import format_cpu_list, parse_cpu_list
from devices.fleet import Device, Fleet

#: Host names that mean this machine.
LOOPBACK_HOSTS = frozenset({"localhost", "ip6-localhost", "::1"})


def on_this_host(device: Device) -> bool:
    """Whether ``device`` runs on this machine's cpus.

    Parameters
    ----------
    device : Device

    Returns
    -------
    bool
        True for local devices, emulated devices and devices reached at a loopback
        address (an SSH server or an Android emulator on this machine).
    """
    if device.kind == "local" or device.emulate is not None:
        return True
    address = device.host if device.kind == "ssh" else (device.serial or "").rpartition(":")[0]
    address = (address or "").strip("[]").lower()
    return address in LOOPBACK_HOSTS or address.startswith("127.")


@dataclass(frozen=True)
class Placement:
    """Where one device runs and whom it waits for.

    Attributes
    ----------
    device : str
    on_host : bool
        It runs on this machine's cpus (`on_this_host`).
    cpus : frozenset of int or None
        The cpus it is pinned to; None: every cpu of this machine (or not on it).
    after : tuple of str
        Earlier devices it shares cpus with: each pass of its cells waits for theirs
        (`may_take_turn`).
    group : int
        1-based wave of the plan within one pass.
    """

    device: str
    on_host: bool
    cpus: frozenset[int] | None
    after: tuple[str, ...]
    group: int

    def where(self) -> str:
        """Its cpus in words: ``cpus 0-1``, ``every cpu of this host`` or ``another host``."""
        if not self.on_host:
            return "another host"
        return "every cpu of this host" if self.cpus is None else f"cpus {format_cpu_list(self.cpus)}"


@dataclass(frozen=True)
class IsolationPlan:
    """Which devices of a campaign may be measured at the same time (`plan_isolation`).

    Attributes
    ----------
    placements : tuple of Placement
        One per device, in fleet order.
    """

    placements: tuple[Placement, ...]

    def placement(self, device: str) -> Placement:
        """Return the placement of ``device`` (KeyError if absent)."""
        for p in self.placements:
            if p.device == device:
                return p
        raise KeyError(device)

    def conflict(self, a: str, b: str) -> bool:
        """Whether devices ``a`` and ``b`` share cpus of this host (never measured together)."""
        return a != b and _conflict(self.placement(a), self.placement(b))

    @property
    def groups(self) -> list[list[str]]:
        """Device names per wave, in order."""
        waves: dict[int, list[str]] = {}
        for p in self.placements:
            waves.setdefault(p.group, []).append(p.device)
        return [waves[g] for g in sorted(waves)]

    def why_together(self, device: str, other: str) -> str:
        """Why ``device`` may run beside ``other``, in a few words."""
        a, b = self.placement(device), self.placement(other)
        if not b.on_host:
            return f"{other} is another host"
        if not a.on_host:
            return f"{device} is another host"
        assert a.cpus is not None and b.cpus is not None  # on this host and not in conflict: both pinned
        return f"disjoint cpus {format_cpu_list(a.cpus)} | {format_cpu_list(b.cpus)}"

    def isolation(self, device: str, concurrent: Iterable[str]) -> dict[str, Any]:
        """Return the isolation record of a cell of ``device`` measured while ``concurrent`` were busy.

        Parameters
        ----------
        device : str
        concurrent : iterable of str
            Devices busy at some moment of the cell.

        Returns
        -------
        dict
            ``alone`` (bool), ``concurrent_with`` (sorted names), ``cpus`` (in words) and
            ``reason``: why it was measured alone (the devices it shares cpus with) or why
            each device beside it was allowed.
        """
        others = sorted(set(concurrent) - {device})
        placement = self.placement(device)
        if others:
            reason = "concurrent with " + ", ".join(f"{o} ({self.why_together(device, o)})" for o in others)
        else:
            sharing = [p.device for p in self.placements if self.conflict(device, p.device)]
            reason = "measured alone" + (f": shares this host's cpus with {', '.join(sharing)}" if sharing else "")
        return {"alone": not others, "concurrent_with": others, "cpus": placement.where(), "reason": reason}

    def describe(self) -> list[str]:
        """Return the plan as printed lines: one per device, then the groups."""
        width = max((len(p.device) for p in self.placements), default=0)
        lines = [
            "isolation plan (devices that share this host's cpus are measured one at a time, "
            "taking turns pass by pass):"
        ]
        for p in self.placements:
            when = "starts at once" if not p.after else f"after {', '.join(p.after)} (shares cpus)"
            lines.append(f"  {p.device:<{width}}  {p.where():<22}  group {p.group}: {when}")
        groups = " -> ".join("{" + ", ".join(g) + "}" for g in self.groups)
        lines.append(f"  groups, in order: {groups}")
        return lines

    def to_dict(self) -> dict[str, Any]:
        """Return the plan as JSON-ready data (stored with the campaign)."""
        return {
            "groups": self.groups,
            "devices": {
                p.device: {
                    "on_host": p.on_host,
                    "cpus": None if p.cpus is None else format_cpu_list(p.cpus),
                    "after": list(p.after),
                    "group": p.group,
                }
                for p in self.placements
            },
        }


def _conflict(a: Placement, b: Placement) -> bool:
    if not (a.on_host and b.on_host):
        return False
    if a.cpus is None or b.cpus is None:
        return True
    return bool(a.cpus & b.cpus)


def may_take_turn(plan: IsolationPlan, done: Mapping[str, float], device: str, turn: int) -> bool:
    """Whether ``device`` may run turn ``turn`` of its work now (pure).

    A device's turn k is pass k of its cells (turn 1: every cell's first pass). It waits
    until every *earlier* device of the plan it shares cpus with has finished its turn k,
    and every *later* one its turn k - 1, so devices that share cpus alternate, one pass
    at a time, in fleet order, and never two of them run at once. Devices it does not
    conflict with are not waited for.

    Parameters
    ----------
    plan : IsolationPlan
        The campaign's plan (fleet order, conflicts).
    done : mapping of str to float
        The last turn each device has finished (0: none; ``inf``: it has no more work).
        A device absent from it has no more work.
    device : str
        The device that wants its turn.
    turn : int
        1-based.

    Returns
    -------
    bool
    """
    names = [p.device for p in plan.placements]
    mine = names.index(device)
    for index, other in enumerate(names):
        if index != mine and plan.conflict(device, other):
            if done.get(other, math.inf) < (turn if index < mine else turn - 1):
                return False
    return True


class Turns:
    """The turn each device of a campaign has finished; a device waits for its next one (`may_take_turn`)."""

    def __init__(self, plan: IsolationPlan, devices: Iterable[str]) -> None:
        self.plan = plan
        self.done: dict[str, float] = {name: 0 for name in devices}
        self.changed = threading.Condition()

    def finish(self, device: str, turn: float) -> None:
        """Record that ``device`` finished turn ``turn`` (``inf``: all its work) and wake the others."""
        with self.changed:
            self.done[device] = max(self.done[device], turn)
            self.changed.notify_all()

    def wait(self, device: str, turn: int, stopped: Callable[[], bool]) -> bool:
        """Block until ``device`` may run ``turn``; False when ``stopped()`` says the campaign stops."""
        with self.changed:
            while not may_take_turn(self.plan, self.done, device, turn):
                self.changed.wait(0.2)
                if stopped():
                    return False
        return not stopped()


def plan_isolation(devices: Sequence[Device], cpus: Mapping[str, frozenset[int] | None]) -> IsolationPlan:
    """Decide which devices may be measured at the same time (pure; see the module docstring).

    Parameters
    ----------
    devices : sequence of Device
        In the order their cells are planned (fleet order).
    cpus : mapping of str to frozenset of int or None
        The cpus each device is really pinned to (`pinned_cpus`); absent or None: not pinned.

    Returns
    -------
    IsolationPlan
        Each device waits for every earlier device it conflicts with; its group is one
        more than the largest group among them.
    """
    placed: list[Placement] = []
    for device in devices:
        here = on_this_host(device)
        mine = Placement(device.name, here, cpus.get(device.name) if here else None, (), 1)
        after = tuple(p.device for p in placed if _conflict(mine, p))
        group = 1 + max((p.group for p in placed if p.device in after), default=0)
        placed.append(replace(mine, after=after, group=group))
    return IsolationPlan(tuple(placed))


def round_isolation(fleet: Fleet) -> IsolationPlan:
    """Return the plan FL rounds follow: every device on this host takes its turn alone.

    Unlike a campaign's cells, whose sampling needs nothing from the host, a client round
    makes this host work while the device trains: parameter files, transfers, a phone's
    adb traffic, reading replies. That work runs on whichever cpus are free, including
    those a neighbouring device is pinned to, and would slow it below its profile; so
    devices on this host take turns whatever their pins (`plan_isolation` without
    pins). Devices on other hosts train side by side.

    Parameters
    ----------
    fleet : Fleet

    Returns
    -------
    IsolationPlan
    """
    return plan_isolation(fleet.devices, {})


def pinned_cpus(fleet: Fleet) -> dict[str, frozenset[int] | None]:
    """Return the cpus each emulated device of ``fleet`` is pinned to, as ``fleet up`` applied them.

    Read from the fleet's state (`devices.emulation.emulate.load_state`): a pin asked for in the
    fleet file but not applied (the device is down, or was started before pinning)
    counts as no pin.

    Parameters
    ----------
    fleet : Fleet

    Returns
    -------
    dict of str to frozenset of int or None
    """
    from devices.emulation.emulate import load_state

    state = load_state(fleet.state_dir)
    out: dict[str, frozenset[int] | None] = {}
    for device in fleet.devices:
        dev = state.get(device.name)
        applied = dev.cpus if dev is not None and dev.cpuset != "none" else None
        out[device.name] = parse_cpu_list(applied) if applied else None
    return out


class Activity:
    """Which devices are busy now, and which other devices each cell in progress has seen busy."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.busy: set[str] = set()
        self.seen: dict[str, set[str]] = {}

    def device_started(self, name: str) -> None:
        """Mark ``name`` busy; every other device's cell in progress has now seen it busy."""
        with self.lock:
            self.busy.add(name)
            for other, seen in self.seen.items():
                if other != name:
                    seen.add(name)

    def device_finished(self, name: str) -> None:
        """Mark ``name`` idle."""
        with self.lock:
            self.busy.discard(name)

    def cell_started(self, name: str) -> None:
        """Start a cell of ``name``: it has seen busy the other devices busy now."""
        with self.lock:
            self.seen[name] = self.busy - {name}

    def cell_finished(self, name: str) -> set[str]:
        """End the cell of ``name`` in progress; return the other devices it saw busy."""
        with self.lock:
            return self.seen.pop(name, set())
