"""Profiling campaigns: measure the matrix device x width x batch x backend.

A campaign is thin orchestration over the other harness pieces:

1. `plan_cells` turns the request into `BenchSpec` cells (pure);
2. `plan_isolation` decides which devices may be measured at the same time (pure,
   below);
3. `run_campaign` exports every artifact set the cells need once, on the host
   (plus the TorchScript model for torch cells), prints the isolation plan, then runs
   one thread per device, each starting when the plan lets it. On a device the cells
   run strictly one at a time: connect, take one facts snapshot, deploy the runner and
   every ONNX Runtime set the device's cells need (content-addressed cache, so an
   unchanged set pushes nothing; **decision**: all sets in one deployment,
   `harness.deploy.deploy_artifact_sets`, three remote commands instead of three or four
   per set, since on a device held to 0.14 of a core each remote command costs about a
   second), run
   ``runner.pyz bench`` under the per-cell timeout (the runner samples until the median
   is precise or its cap, see `harness.runner.sampling`), parse its JSON document and store the
   `Measurement` at once (one transaction per cell, so an interrupted campaign loses no
   finished cell). With ``passes`` above 1 (the default, `DEFAULT_PASSES`) that run is
   the cell's first pass, on its share of the cap; the device's resident runner then
   takes the later passes of every cell in turn, and a cell is stored after its last
   (`merge_passes`, `_DeviceRun`). Devices that share cpus take turns pass by pass
   (`may_take_turn`), so a cell's passes lie apart in time.

Isolation (decided here)
    Devices that run on this host (``local`` devices, emulated devices, and devices
    whose address is a loopback one) share its cpus. Two of them *conflict* unless both
    are pinned to disjoint cpus (``emulate: {cpus: ...}`` applied by ``fleet up``, read
    back from the fleet's state so that a pin the machine did not permit does not count);
    an unpinned one conflicts with every other device on this host. Devices elsewhere
    (real SSH / ADB boards) conflict with nothing. Conflicting devices are never measured
    at the same time, and the others are. They take *turns*, one pass of their cells at a
    time (`may_take_turn`): in fleet order, each device waits for every earlier device
    it conflicts with to finish pass k before it runs its own pass k, so with four devices
    on this host's cpus the order is pass 1 of each, then pass 2 of each, and so on. A
    stretch in which the host slows its cpus (neighbours on a virtual machine's host, for
    seconds at a time) then falls on one pass of a cell, which the pooled judgement of the
    passes can leave out (`merge_passes`), instead of on all of them. The plan's *groups*
    (printed, stored with the campaign) are the waves of one pass: group 1 starts at once,
    a device of group k follows one of group k - 1.
    Every cell records how it was measured (`Measurement.isolation`): alone, or beside
    which devices (those busy at any moment of its run), and why that was allowed.
    The host's own work for a campaign (SSH, deployment pushes) is not pinned; it is
    light next to a training step and happens between the runner's timed samples of a
    device only when another device is deploying.

Precision (decided here)
    A cell is measured until the 95 % interval of its median is within ``+-precision``
    or until ``max_seconds`` (`BenchSpec`); one that misses is stored with status ``ok``,
    ``imprecise`` set and a message that says by how much and, when the runner saw a load
    average above the cpus it may use, that the device was busy. The campaign goes on.

Widths chosen by the model (``--widths auto:N``)
    `choose_widths` measures the widest and the narrowest candidate width on every
    device, fits each device's latency model (`harness.latency`), and then, one round
    at a time, measures the candidate whose predicted latency is the most uncertain
    (relative standard deviation, averaged over the devices) until N widths are
    measured: nn-Meter's adaptive sampling, in one dimension. The widths are chosen for
    the fleet, not per device, so that every device is measured at the same widths
    (tables, tiers and cross-device comparisons need that); artifact sets are exported
    between rounds, never while a device is measured.

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

Backend per device (``--backend auto``, the default): before anything is exported,
every device is asked what it can run (`harness.provision.fleet_backends`) and measured
with its best available backend (`harness.backends`: ort > onnx > torch); the backend
is part of every cell, so the store records it. A device with no usable backend is
reported on stderr with its reason and gets no cells; the others are measured. Skipped
devices do not change the exit status (the campaign measured everything it could run;
``fleetbench fleet provision FLEET`` says how to fix them), unless no device is left. ``--backend ort,torch``
measures the named backends on every device, asking nothing first.

Ctrl-C sets a stop event; each device thread finishes (or times out) its current
cell, stores it and stops; `run_campaign` returns with ``interrupted=True`` and
`cmd_profile` prints the command that resumes the campaign.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import shlex
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from devices.connect import connect as default_connect
from devices.errors import TransportError
from devices.fleet import Device, Fleet
from devices.limits import format_cpu_list, parse_cpu_list
from devices.transport import Transport
from exporters.manifest import EXPORT_FORMAT_VERSION
from harness import contract, runner_archive
from harness.records import Backend, BenchSpec, Measurement, model_record
from harness.runner.protocol import DEFAULT_MAX_SECONDS, DEFAULT_PRECISION
from harness.runner.sampling import (
    DISTURBANCE_LIMIT,
    MIN_SAMPLES,
    counted_samples,
    disturbed_samples,
    median_interval,
    median_of_sorted,
)

if TYPE_CHECKING:
    from harness.backends import BackendChoice
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
        ``runner.pyz bench`` processes actually started on devices (one per cell: its first pass).
    resident_requests : int
        Bench requests sent to resident runners (the cells' later passes).
    interrupted : bool
        True when the stop event was set before every cell ran.
    plan : IsolationPlan or None
        Which devices were allowed to run at the same time (None when nothing ran).
    round_costs : dict
        Device name -> list of `harness.roundcost.RoundCostModel` measured by this run.
    round_cost_failures : dict
        Device name -> list of one-line reasons a round-cost measurement failed.
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

    @property
    def complete(self) -> bool:
        """Whether every planned cell (and round-cost measurement) is measured (now or before, when resumed)."""
        return not self.interrupted and all(m.ok for m in self.measurements) and not self.round_cost_failures


class MissingBackend(TransportError):
    """The device's runtime cannot run the cell's backend (a runtime bundle runs ``onnx`` only)."""

    kind = "missing runtime"


# --------------------------------------------------------------------------- planning


def plan_cells(
    fleet: Fleet | Sequence[Device],
    model: str,
    widths: Iterable[float],
    batches: Iterable[int],
    backends: Iterable[str] | Mapping[str, str],
    steps: int,
    warmup: int,
    optimizer: str = "adamw",
    *,
    precision: float = DEFAULT_PRECISION,
    max_seconds: float = DEFAULT_MAX_SECONDS,
    data: str | None = None,
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
    backends : iterable of str, or mapping of str to str
        Backends measured on every device (``"ort"``, ``"onnx"``, ``"torch"``), or one
        backend per device name; devices the mapping does not name get no cells.
    steps, warmup : int
        Fewest timed samples and most warm-up steps per cell.
    optimizer : str
        ``"adamw"`` or ``"sgd"``.
    precision : float
        Target half-width of the median's 95 % interval (fraction; 0: exactly ``steps``).
    max_seconds : float
        Per-cell cap on warm-up plus sampling.
    data : str, optional
        The bench data's label (`bench_data_label`); None: random batches.

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
    if isinstance(backends, Mapping):
        per_device = {d.name: [backends[d.name]] for d in devices if d.name in backends}
    else:
        per_device = {d.name: list(backends) for d in devices}
    for backend in {b for listed in per_device.values() for b in listed}:
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
            precision=precision,
            max_seconds=max_seconds,
            data=data,
        )
        for device in devices
        if device.name in per_device
        for width, arch_widths in archs
        for batch in batches
        for backend in per_device[device.name]
    ]


# --------------------------------------------------------------------------- bench data


@contextlib.contextmanager
def _open_bench_data(path: Path) -> Iterator[Any]:
    """Open a bench data file as an ``NpzFile`` holding ``x`` and ``y``; any other file is an `InputError` naming it."""
    import numpy as np

    from exporters.errors import InputError

    try:
        with np.load(path, allow_pickle=False) as shard:
            if "x" not in shard or "y" not in shard:
                raise InputError(f"--data {path}: needs arrays x and y, has {sorted(shard.keys())}")
            yield shard
    except InputError:
        raise
    except (OSError, ValueError, EOFError) as exc:  # InputError is a ValueError too: raised as it is, above
        raise InputError(f"--data {path}: not a readable .npz ({exc})") from None


def bench_data_label(path: Path | str) -> str:
    """Return the label cells record for a bench data file: ``<file name>@<sha256 prefix>``.

    The digest is of the arrays (``x`` and ``y``: dtype, shape and bytes), not of the file,
    whose zip members carry their write time: the same examples written twice label alike.

    Parameters
    ----------
    path : path
        An ``.npz`` shard with ``x`` and ``y``.

    Returns
    -------
    str

    Raises
    ------
    exporters.errors.InputError
        When the file cannot be read as such a shard.
    """
    import hashlib

    import numpy as np

    path = Path(path)
    digest = hashlib.sha256()
    with _open_bench_data(path) as shard:
        for name in ("x", "y"):
            array = np.ascontiguousarray(shard[name])
            digest.update(f"{name}:{array.dtype.str}:{array.shape}".encode())
            digest.update(array.tobytes())
    return f"{path.name}@{digest.hexdigest()[:12]}"


def check_bench_data(path: Path, manifests: Iterable[Mapping[str, Any]]) -> None:
    """Check that a bench data file fits every artifact set that will train on it.

    Parameters
    ----------
    path : pathlib.Path
        An ``.npz`` with ``x`` (examples, then the model's input shape) and integer ``y``.
    manifests : iterable of mapping
        The sets' manifests (``inputs``: the input's shape and the batch).

    Raises
    ------
    exporters.errors.InputError
        Naming the file and what does not fit: unreadable, no ``x`` / ``y``, an input
        shape other than the model's, fewer examples than a batch, labels that are not
        integers.
    """
    from exporters.errors import InputError

    with _open_bench_data(path) as shard:
        x_shape, y_shape, y_kind = shard["x"].shape, shard["y"].shape, shard["y"].dtype.kind
    if y_kind not in "iu" or y_shape != x_shape[:1]:
        raise InputError(f"--data {path}: y must be one integer label per example, got {y_shape} of kind {y_kind!r}")
    for manifest in manifests:
        want = tuple(int(d) for d in manifest["inputs"][0]["shape"][1:])
        if tuple(x_shape[1:]) != want:
            raise InputError(
                f"--data {path}: examples of shape {tuple(x_shape[1:])}, {manifest.get('model')} takes {want}"
            )
        if x_shape[0] < int(manifest["batch"]):
            raise InputError(f"--data {path}: {x_shape[0]} examples, fewer than one batch of {manifest['batch']}")


# --------------------------------------------------------------------------- isolation


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


class _Turns:
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

    Read from the fleet's state (`devices.emulate.load_state`): a pin asked for in the
    fleet file but not applied (the device is down, or was started before pinning)
    counts as no pin.

    Parameters
    ----------
    fleet : Fleet

    Returns
    -------
    dict of str to frozenset of int or None
    """
    from devices.emulate import load_state

    state = load_state(fleet.state_dir)
    out: dict[str, frozenset[int] | None] = {}
    for device in fleet.devices:
        dev = state.get(device.name)
        applied = dev.cpus if dev is not None and dev.cpuset != "none" else None
        out[device.name] = parse_cpu_list(applied) if applied else None
    return out


# --------------------------------------------------------------------------- host side


def round_cost_specs(specs: Sequence[BenchSpec]) -> list[BenchSpec]:
    """Return the cells whose configuration gets a round-cost measurement (pure).

    One per device and configuration (model, batch, backend, optimizer, threads) that FL
    trains with: the widest width of it; torch cells get none (FL trains with the ONNX
    Runtime backends).

    Parameters
    ----------
    specs : sequence of BenchSpec

    Returns
    -------
    list of BenchSpec
        In the order of first appearance.
    """
    widest: dict[tuple[Any, ...], BenchSpec] = {}
    for spec in specs:
        if spec.backend == "torch":
            continue
        key = (spec.device, *round_cost_config(spec))
        if key not in widest or spec.width > widest[key].width:
            widest[key] = spec
    return list(widest.values())


def round_cost_config(spec: BenchSpec) -> tuple[str, int, str, str, int]:
    """Return the ``(model, batch, backend, optimizer, threads)`` a round cost is stored under."""
    return (spec.model, spec.batch, spec.backend, spec.optimizer, spec.threads)


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
        0.14 of a core at the 10 ms period of `devices.limits.PERIOD_US`, 0.1 s at 0.6);
        else 0 (every step is one sample: a share of at least ``threads`` cores never
        stops the runner's threads, and its single steps are not bimodal).
    """
    from devices.limits import PERIOD_US

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
    from devices.presets import resolve

    return None if device.emulate is None else resolve(device.emulate).cpu_share


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
    isolation: Mapping[str, Any] | None = None,
    share: float | None = None,
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
    isolation : Mapping, optional
        How the cell was isolated (`IsolationPlan.isolation`).
    share : float, optional
        The device's emulated CPU share (`quota_share`), for `imprecision_reason`.

    Returns
    -------
    Measurement
        Its ``step_seconds`` are the samples that count (`counted_steps`). A measured cell
        that missed its precision keeps status ``ok``, with ``imprecise`` set and
        `imprecision_reason` as its message.
    """
    steps = tuple(counted_steps(doc)) if status == "ok" else ()
    peak = doc.get("peak_memory_bytes")
    gflops = doc.get("matmul_gflops")
    achieved = doc.get("precision_achieved")
    imprecise = status == "ok" and bool(doc.get("imprecise", False))
    if imprecise and not message:
        message = imprecision_reason(spec, doc, share)
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
        precision_achieved=float(achieved) if isinstance(achieved, (int, float)) else None,
        imprecise=imprecise,
        stop_reason=doc.get("stop_reason") if status == "ok" else None,
        isolation=dict(isolation or {}),
    )


def counted_steps(doc: Mapping[str, Any]) -> list[float]:
    """Return the runner's step samples that count: those it did not find disturbed (pure).

    Parameters
    ----------
    doc : Mapping
        The runner's document (``step_seconds``; ``disturbed``, a 0/1 flag per sample,
        where the runner judged them).

    Returns
    -------
    list of float
        Every sample when the runner judged none (no flags, or not one per sample).
    """
    return undisturbed([float(v) for v in doc.get("step_seconds") or ()], doc)


def undisturbed(values: list[float], doc: Mapping[str, Any]) -> list[float]:
    """Return the entries of ``values`` (one per runner sample) that the runner did not flag disturbed (pure).

    Parameters
    ----------
    values : list of float
        One value per sample of ``doc`` (its wall or its CPU seconds per step).
    doc : Mapping
        The runner's document (``disturbed``, a 0/1 flag per sample).

    Returns
    -------
    list of float
        Every value when the flags are not one per value: they are trusted only then.
    """
    flags = list(doc.get("disturbed") or ())
    if len(flags) != len(values):
        return values
    return counted_samples(values, flags)


#: Passes a cell's samples are spread over by default (`run_campaign`): its first in a
#: process of its own, the rest as requests to the device's resident runner, each pass
#: of every cell after the previous pass of all the device's cells.
DEFAULT_PASSES = 4


def merge_passes(docs: Sequence[Mapping[str, Any]], precision: float) -> dict[str, Any]:
    """Merge the runner documents of one cell's passes into the cell's document (pure).

    The samples of every pass are pooled; where every pass judged its samples
    (``disturbed``, one flag per sample), the pool is judged again as one
    (`harness.runner.sampling.disturbed_samples`, from `MIN_SAMPLES` samples on), so
    a pass the host slowed as a whole, or a first pass still cold, stands out against the
    others. The median and its interval are those of the pooled samples that
    count.

    Parameters
    ----------
    docs : sequence of Mapping
        The passes' documents, first pass first (each with status ``ok``). The first
        pass ran in a process of its own: its peak memory, warm-up and matmul rate are
        the cell's.
    precision : float
        The cell's target half-width (0: a fixed count, never imprecise).

    Returns
    -------
    dict
        The first pass's document with the pooled ``step_seconds``, ``cpu_step_seconds``,
        ``disturbed``, ``steps_per_sample``, ``loss``, ``samples``, ``timed_seconds``,
        ``median_ci_seconds``, ``precision_achieved``, ``imprecise`` and ``stop_reason``
        (``"precision"`` when the pool reaches it, else ``"time cap"`` when a pass hit its
        cap, else ``"passes differ"``); ``throttled`` when any pass was; the last pass's
        load average after; and ``passes`` and ``pass_medians`` (the median of each
        pass's samples that count by its own flags, seconds per step: each pass stands for
        its stretch of the host's speed, which every cell of the device went through).
    """
    if not docs:
        raise ValueError("merge_passes needs at least one pass")
    first = docs[0]
    seconds = [float(v) for doc in docs for v in doc.get("step_seconds") or ()]
    cpu = [float(v) for doc in docs for v in doc.get("cpu_step_seconds") or ()]
    judged = all(len(doc.get("disturbed") or ()) == len(doc.get("step_seconds") or ()) for doc in docs)
    # A pool's samples come from stretches of time apart, so it is judged from `MIN_SAMPLES` on
    # (a single run from `DISTURBANCE_MIN_SAMPLES`): a device held to a small CPU share takes
    # few, long samples.
    flags = disturbed_samples(cpu, min_samples=MIN_SAMPLES) if judged and len(cpu) == len(seconds) else []
    merged: dict[str, Any] = dict(first)
    merged.update(
        step_seconds=seconds,
        cpu_step_seconds=cpu if len(cpu) == len(seconds) else [],
        disturbed=[int(flag) for flag in flags],
        steps_per_sample=[n for doc in docs for n in doc.get("steps_per_sample") or ()],
        loss=[v for doc in docs for v in doc.get("loss") or ()],
        samples=len(seconds),
        timed_seconds=sum(float(doc.get("timed_seconds") or 0.0) for doc in docs),
        throttled=any(bool(doc.get("throttled")) for doc in docs),
        passes=len(docs),
        pass_medians=[median_of_sorted(sorted(c)) if (c := counted_steps(doc)) else None for doc in docs],
    )
    loads = [doc.get("loadavg") or {} for doc in docs]
    merged["loadavg"] = {**loads[0], "after": loads[-1].get("after")}
    counted = sorted(counted_steps(merged))
    _, low, high, half = median_interval(counted) if counted else (None, None, None, None)
    merged.pop("median_ci_seconds", None)
    if low is not None:
        merged["median_ci_seconds"] = [low, high]
    merged["precision_achieved"] = half
    merged["imprecise"] = precision > 0 and (half is None or half > precision)
    if precision <= 0:
        merged["stop_reason"] = "steps"
    elif not merged["imprecise"]:
        merged["stop_reason"] = "precision"
    elif any(doc.get("stop_reason") in ("time cap", "sample cap") for doc in docs):
        merged["stop_reason"] = "time cap"
    else:
        merged["stop_reason"] = "passes differ"
    return merged


def device_busy(doc: Mapping[str, Any]) -> str:
    """Say whether the runner saw a busy device: a load average above the cpus it may use.

    Parameters
    ----------
    doc : Mapping
        The runner's document (``loadavg``, ``cpus_available``).

    Returns
    -------
    str
        ``"load average 3.2 on 2 cpus"`` when the larger 1-minute load average (before or
        after) exceeds the available cpus, else "".
    """
    loads = doc.get("loadavg") or {}
    values = [float(v[0]) for v in (loads.get("before"), loads.get("after")) if isinstance(v, list) and v]
    cpus = doc.get("cpus_available")
    if not values or not isinstance(cpus, int) or cpus < 1:
        return ""
    worst = max(values)
    return f"load average {worst:.1f} on {cpus} cpu{'s' if cpus != 1 else ''}" if worst > cpus else ""


#: A runner that had less than this fraction of the cpu it could have (one cpu, or its
#: emulated share) while sampling was kept from running: the device was busy.
BUSY_CPU_FRACTION = 0.9


def cpu_time_findings(doc: Mapping[str, Any], share: float | None = None) -> list[str]:
    """Say what the runner's CPU time per step shows about a cell's samples (pure).

    Parameters
    ----------
    doc : Mapping
        The runner's document (``step_seconds``, ``cpu_step_seconds``).
    share : float, optional
        The device's emulated CPU share in cores (`quota_share`), what its runner could
        have at most; one cpu otherwise.

    Returns
    -------
    list of str
        ``"device busy: the runner ran 61 % of the time (at most 100 %)"`` when the CPU
        time per wall second is below `BUSY_CPU_FRACTION` of what it could be; ``"412 of
        655 samples disturbed: their CPU time per step rose over 10 %, the cpu was slowed
        from outside the runner"`` when the runner flagged any; and ``"its steps' own CPU
        time varied +-12.0 % (robust CV): the work cost more at times"`` when that of the
        samples that count exceeds the noisy threshold. Empty without CPU times (a runner
        that does not report them) or when none holds.
    """
    from harness.stats import NOISY_CV_THRESHOLD, summarize

    wall = [float(v) for v in doc.get("step_seconds") or ()]
    cpu = [float(v) for v in doc.get("cpu_step_seconds") or ()]
    if not cpu or len(cpu) != len(wall) or not all(v > 0 for v in wall):
        return []
    findings = []
    ran = sorted(c / w for c, w in zip(cpu, wall, strict=True))[len(wall) // 2]
    could = min(share, 1.0) if share is not None and share > 0 else 1.0
    if ran < BUSY_CPU_FRACTION * could:
        findings.append(f"device busy: the runner ran {100 * ran:.0f} % of the time (at most {100 * could:.0f} %)")
    counted = undisturbed(cpu, doc)
    if len(counted) < len(cpu):
        why = "the cpu was slowed from outside the runner"
        if int(doc.get("passes") or 1) > 1:
            why = f"over the cell's {doc['passes']} passes: a pass the host slowed, or the first pass still cold"
        findings.append(
            f"{len(cpu) - len(counted)} of {len(cpu)} samples disturbed: their CPU time per step rose "
            f"over {100 * (DISTURBANCE_LIMIT - 1):.0f} %, {why}"
        )
        cpu = counted
    varied = summarize(cpu, 1).robust_cv if all(v > 0 for v in cpu) else 0.0
    if varied > NOISY_CV_THRESHOLD:
        findings.append(
            f"its steps' own CPU time varied +-{100 * varied:.1f} % (robust CV): the work cost more at times"
        )
    return findings


def imprecision_reason(spec: BenchSpec, doc: Mapping[str, Any], share: float | None = None) -> str:
    """Return the stored reason of a cell that missed its precision (one line).

    What kept it imprecise comes from the runner's CPU time per step
    (`cpu_time_findings`); a runner that reports none is judged by the load average
    (`device_busy`).

    Parameters
    ----------
    spec : BenchSpec
    doc : Mapping
        The runner's document.
    share : float, optional
        The device's emulated CPU share (`quota_share`).

    Returns
    -------
    str
        E.g. ``imprecise: 95 % interval of the median +-3.4 % after 812 samples in 30.0 s
        (target +-2 %, time cap); device busy: the runner ran 61 % of the time (at most
        100 %)``.
    """
    achieved = doc.get("precision_achieved")
    samples = doc.get("samples") or len(doc.get("step_seconds") or ())
    seconds = doc.get("timed_seconds")
    reached = f"+-{100 * float(achieved):.1f} %" if isinstance(achieved, (int, float)) else "no interval"
    took = f" in {float(seconds):.1f} s" if isinstance(seconds, (int, float)) else ""
    text = (
        f"imprecise: 95 % interval of the median {reached} after {samples} samples{took} "
        f"(target +-{100 * spec.precision:g} %, {doc.get('stop_reason') or 'stopped'})"
    )
    if doc.get("cpu_step_seconds"):
        return "; ".join([text, *cpu_time_findings(doc, share)])
    busy = device_busy(doc)
    return text + (f"; device busy: {busy}" if busy else "")


# --------------------------------------------------------------------------- progress


def per_image_us(measurement: Measurement) -> float | None:
    """Median per-image training time of a measured cell in microseconds (None if failed)."""
    if not measurement.ok or not measurement.step_seconds:
        return None
    from harness.stats import summarize

    stats = summarize(measurement.step_seconds, measurement.spec.batch)
    return float(stats.median_us)


def format_event(event: CellEvent) -> str:
    """One progress line, e.g. ``[fast] 2/4 w0.50 b20 ort ok 812 us/img +-1.2 %``.

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
        text = f"{head} ok" + (f" {us:.0f} us/img" if us is not None else "")
        if m.precision_achieved is not None:
            text += f" +-{100 * m.precision_achieved:.1f} %"
        if not m.isolation.get("alone", True):
            text += " (concurrent with " + ", ".join(m.isolation.get("concurrent_with") or ()) + ")"
        return text + (f"; {m.message}" if m.imprecise else "")
    return f"{head} {m.status}: {m.message}"


def print_progress(event: CellEvent) -> None:
    """Default progress callback: one line per finished cell on stderr."""
    print(format_event(event), file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- campaign


class _Activity:
    """Which devices are busy now, and which other devices each cell in progress has seen busy."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.busy: set[str] = set()
        self.seen: dict[str, set[str]] = {}

    def device_started(self, name: str) -> None:
        with self.lock:
            self.busy.add(name)
            for other, seen in self.seen.items():
                if other != name:
                    seen.add(name)

    def device_finished(self, name: str) -> None:
        with self.lock:
            self.busy.discard(name)

    def cell_started(self, name: str) -> None:
        with self.lock:
            self.seen[name] = self.busy - {name}

    def cell_finished(self, name: str) -> set[str]:
        with self.lock:
            return self.seen.pop(name, set())


@dataclass
class _Cell:
    """One cell on its way through its passes: the documents of the passes measured so far."""

    spec: BenchSpec
    started: float
    passes: int
    status: str = "runner error"
    message: str = ""
    docs: list[dict[str, Any]] = field(default_factory=list)
    concurrent: set[str] = field(default_factory=set)
    pass_failure: str = ""
    finished: bool = False


class _DeviceRun:
    """The cells of one device, run one at a time in this device's thread.

    With ``passes`` above 1, each cell's time cap is split over that many passes: every
    cell's first pass runs ``runner.pyz bench`` in a process of its own (as with one pass),
    then pass 2 of every cell, pass 3 of every cell, ... run as requests to the device's
    resident runner (`harness.resident.ResidentRunner`), and each cell is stored after
    its last pass (`merge_passes`). With ``interleave`` each pass is a turn of its own
    (`may_take_turn`): devices that share cpus run their pass k one after another before
    any runs pass k + 1, so a cell's passes lie a whole round of turns apart and do not all
    fall in one window in which the host slows the device. Without it the device takes
    all its passes in one turn. Its round costs run in its last turn.
    """

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
        plan: IsolationPlan,
        activity: _Activity,
        turns: _Turns,
        cost_specs: Sequence[BenchSpec] = (),
        scratch: Path | None = None,
        say: Callable[[str], None] | None = None,
        data: Path | None = None,
        passes: int = 1,
        interleave: bool = True,
    ) -> None:
        from harness.resident import ResidentRunner

        self.passes, self.interleave = max(1, int(passes)), interleave
        self.residents: dict[tuple[str, int], ResidentRunner] = {}
        self.workdir: str | None = None
        self.cost_specs, self.scratch, self.say = list(cost_specs), scratch, say
        self.data, self.remote_data = data, cast(str | None, None)
        self.device, self.specs, self.sets = device, specs, sets
        self.store, self.campaign_id, self.timeout = store, campaign_id, timeout
        self.connect, self.clock, self.progress, self.stop = connect, clock, progress, stop
        self.versions, self.git_commit = versions, git_commit
        self.result, self.lock = result, lock
        self.plan, self.activity, self.turns = plan, activity, turns
        self.transport: Transport | None = None
        self.prefetched = False
        self.facts: dict[str, Any] | None = None
        self.runner_remote: str | None = None
        self.start: contract.RunnerStart | None = None
        self.remote_sets: dict[tuple[Path, bool], str] = {}

    def _transport(self) -> Transport:
        if self.transport is None:
            self.transport = self.connect(self.device)
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
        each per set: on a device held to a small CPU share each remote command costs
        about a second. Torch cells keep their own deployment (`_prepare`).
        """
        from harness.deploy import deploy_artifact_sets

        self.prefetched = True
        wanted = list(dict.fromkeys(self.sets[_set_key(spec)] for spec in self.specs if spec.backend != "torch"))
        if not wanted:
            return
        deployed = deploy_artifact_sets(transport, self.device, wanted, timeout=self.timeout)
        with self.lock:
            self.result.deploys.setdefault(self.device.name, []).extend(deployed)
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

            self.start = runner_start(transport, self.device, timeout=self.timeout, say=print)
        if self.facts is None:  # what the runner's Python sees
            facts = probe_device(transport, self.start.argv, timeout=min(FACTS_TIMEOUT_S, self.timeout))
            self.facts = facts.to_dict()
        if not self.start.offers(backend):
            raise MissingBackend(f"{self.device.name}: the {backend} backend does not run on {self.start.detail}")
        if not self.prefetched:
            self._prefetch(transport)
        if self.runner_remote is None:
            archive = runner_archive.archive_path()
            self.runner_remote = str(deploy_runner(transport, self.device, archive, timeout=self.timeout))
        if self.data is not None and self.remote_data is None:
            shard = deploy_files(transport, self.device, [self.data], into="data", timeout=self.timeout)
            self.remote_data = shard.remote_paths[self.data.name]
        key = (set_dir, backend == "torch")
        if key not in self.remote_sets:
            deployed = deploy_set_for(transport, self.device, set_dir, backend, timeout=self.timeout)
            with self.lock:
                self.result.deploys.setdefault(self.device.name, []).append(deployed)
            self.remote_sets[key] = str(deployed.remote_dir)
            self.workdir = self.workdir or deployed.workdir
        return transport, self.runner_remote, self.remote_sets[key]

    def _passes_of(self, spec: BenchSpec) -> int:
        # a fixed count of samples (precision 0) is one run's count: it is not split
        return self.passes if spec.precision > 0 else 1

    def _pass_options(self, spec: BenchSpec, passes: int) -> dict[str, Any]:
        """Return the `harness.contract.bench_options` of one of ``spec``'s ``passes`` passes (its share of the cap)."""
        return {
            "backend": spec.backend, "warmup": spec.warmup, "steps": -(-spec.steps // passes), "threads": spec.threads,
            "sample_seconds": sample_seconds_for(self.device), "precision": spec.precision,
            "max_seconds": spec.max_seconds / passes,
        }  # fmt: skip

    def _first_pass(self, spec: BenchSpec) -> _Cell:
        """Run ``spec``'s first pass as ``runner.pyz bench`` in a process of its own."""
        cell = _Cell(spec, self.clock(), self._passes_of(spec))
        self.activity.cell_started(self.device.name)
        try:
            set_dir = self.sets[_set_key(spec)]
            transport, runner, remote_set = self._prepare(set_dir, spec.backend)
            with self.lock:
                self.result.runner_invocations += 1
            argv = contract.bench_argv(
                self._runner_start(), runner, remote_set, **self._pass_options(spec, cell.passes),
                data=self.remote_data if spec.data else None,
            )  # fmt: skip
            run = transport.run(argv, timeout=self.timeout)
            output = contract.parse_output(run.rc, run.stdout, run.stderr)
            cell.status, cell.message = output.status, output.message
            if output.document:
                # The analytic counts travel with the cell, so stored rows carry train FLOPs.
                manifest = json.loads((set_dir / "manifest.json").read_text())
                cell.docs.append({**output.document, "counts": manifest.get("counts", {})})
        except TransportError as exc:
            cell.status, cell.message = exc.kind, str(exc) or type(exc).__name__
            self._drop_transport()
        except Exception as exc:  # noqa: BLE001 - one broken cell is a record, never a crashed campaign
            cell.status, cell.message = "runner error", f"{type(exc).__name__}: {exc}"
            self._drop_transport()
        cell.concurrent |= self.activity.cell_finished(self.device.name)
        return cell

    def _later_pass(self, cell: _Cell, number: int) -> tuple[str, str] | None:
        """Run pass ``number`` of ``cell`` on the device's resident runner; the failure when the device is gone."""
        from harness.resident import ResidentRunner

        spec, name = cell.spec, self.device.name
        self.activity.cell_started(name)
        down, reason = None, ""
        try:
            transport, runner, remote_set = self._prepare(self.sets[_set_key(spec)], spec.backend)
            key = (spec.backend, spec.threads)
            if key not in self.residents:
                assert self.workdir is not None  # set by the deployment `_prepare` made
                self.residents[key] = ResidentRunner.for_device(
                    transport, self._runner_start(), runner, backend=spec.backend, threads=spec.threads,
                    workdir=self.workdir, start_timeout=self.timeout,
                )  # fmt: skip
            with self.lock:
                self.result.resident_requests += 1
            output = self.residents[key].bench(
                remote_set, timeout=self.timeout, data=self.remote_data if spec.data else None,
                request_id=f"{spec.cell_key()}#{number}", matmul_seconds=0.0, **self._pass_options(spec, cell.passes),
            )  # fmt: skip
            if output.ok:
                cell.docs.append(dict(output.document))
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
        cell.concurrent |= self.activity.cell_finished(name)
        return down

    def _finish(self, cell: _Cell) -> Measurement:
        """Return the cell's `Measurement`, its passes merged (`merge_passes`) where it has more than one."""
        doc = merge_passes(cell.docs, cell.spec.precision) if len(cell.docs) > 1 else (cell.docs or [{}])[0]
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
        doc: Mapping[str, Any],
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
            finished_at=self.clock(),
            versions=self.versions,
            git_commit=self.git_commit,
            isolation=self.plan.isolation(self.device.name, concurrent),
            share=quota_share(self.device),
        )

    def _measure_round_cost(self, spec: BenchSpec) -> None:
        """Measure and store the round cost of ``spec``'s configuration (`harness.roundcost`); never raises."""
        from harness.roundcost import RoundCostError, measure_round_cost, payload_bytes

        name = self.device.name
        status, message = "runner error", ""
        try:
            set_dir = self.sets[_set_key(spec)]
            transport, runner, remote_set = self._prepare(set_dir, spec.backend)
            assert self.scratch is not None
            # the transfers move this model's own payloads: its sets of this configuration
            config = (spec.model, spec.batch, spec.optimizer)
            model_sets = [d for (model, _, batch, opt), d in self.sets.items() if (model, batch, opt) == config]
            cost = measure_round_cost(
                transport, self.device, runner=runner, remote_set=remote_set, set_dir=set_dir, width=spec.width,
                scratch=self.scratch / name, backend=spec.backend, optimizer=spec.optimizer, threads=spec.threads,
                timeout=self.timeout, campaign_id=self.campaign_id, measured_at=self.clock(), start=self.start,
                data=self.data if spec.data else None, transfer_bytes=payload_bytes(model_sets),
            )  # fmt: skip
        except TransportError as exc:
            status, message = exc.kind, str(exc) or type(exc).__name__
            self._drop_transport()
        except RoundCostError as exc:
            status, message = exc.status, str(exc)
        except Exception as exc:  # noqa: BLE001 - a failed round-cost step is a record, never a crashed campaign
            status, message = "runner error", f"{type(exc).__name__}: {exc}"
            self._drop_transport()
        else:
            self.store.record_round_cost(self.campaign_id, cost)
            with self.lock:
                self.result.round_costs.setdefault(name, []).append(cost)
            self._tell(
                f"{name}: round cost: fixed {cost.fixed_s:.3f} s, {cost.step_s * 1e3:.1f} ms/step at width "
                f"{spec.width:g}; down {cost.down_latency_s * 1e3:.1f} ms + {cost.down_s_per_byte * 1e9:.2f} ns/B, "
                f"up {cost.up_latency_s * 1e3:.1f} ms + {cost.up_s_per_byte * 1e9:.2f} ns/B"
            )
            return
        failed = {
            "device": name, "model": spec.model, "width": spec.width, "batch": spec.batch, "backend": spec.backend,
            "optimizer": spec.optimizer, "threads": spec.threads, "status": status, "message": message,
            "measured_at": self.clock(),
        }  # fmt: skip
        self.store.record_round_cost(self.campaign_id, failed=failed)
        reason = f"round cost of {spec.model} width {spec.width:g} ({spec.backend}): {status}: {message}"
        with self.lock:
            self.result.round_cost_failures.setdefault(name, []).append(reason)
        self._tell(f"{name}: {reason}")

    def _tell(self, line: str) -> None:
        if self.say is not None:
            try:
                self.say(line)
            except Exception as exc:  # noqa: BLE001 - a broken display must not stop the measurements
                print(f"fleetbench: progress display failed: {exc!r}", file=sys.stderr)

    def _take_turn(self, turn: int) -> bool:
        """Wait for turn ``turn`` (`may_take_turn`) and mark the device busy; False when stopped (`_stopped`)."""
        if not self.turns.wait(self.device.name, turn, self._stopped):
            return False
        self.activity.device_started(self.device.name)
        return True

    def _next_turn(self, turn: int) -> bool:
        """End the device's turn ``turn - 1`` and take turn ``turn`` (with ``interleave``); False when stopped."""
        if not self.interleave:
            return not self._stopped()
        self.activity.device_finished(self.device.name)
        self.turns.finish(self.device.name, turn - 1)
        return self._take_turn(turn)

    def _stopped(self) -> bool:
        """Whether the stop event is set; marks the campaign interrupted when it is."""
        if self.stop.is_set():
            with self.lock:
                self.result.interrupted = True
            return True
        return False

    def _tell_pass(self, number: int, pending: Sequence[_Cell]) -> None:
        """Say that pass ``number`` of the cells still to finish is done (progress between stored cells)."""
        waiting = sum(not cell.finished for cell in pending)
        if waiting:
            self._tell(
                f"{self.device.name}: pass {number} of {self.passes} done for {waiting} cell(s); "
                "each is stored after its last pass"
            )

    def _record(self, measurement: Measurement, done: int) -> None:
        self.store.record(self.campaign_id, measurement)
        with self.lock:
            self.result.measurements.append(measurement)
        try:
            self.progress(CellEvent(self.device.name, done, len(self.specs), measurement))
        except Exception as exc:  # noqa: BLE001 - a broken display must not stop the measurements
            print(f"fleetbench: progress display failed: {exc!r}", file=sys.stderr)

    def __call__(self) -> None:
        down: tuple[str, str] | None = None
        name = self.device.name
        done = 0
        try:
            if not self._take_turn(1):
                return
            pending: list[_Cell] = []
            for spec in self.specs:
                if self._stopped():
                    return
                if down is not None:
                    cell = _Cell(spec, self.clock(), 1, down[0], f"not tried: device failed earlier ({down[1]})")
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
            for number in range(2, self.passes + 1):
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
            for spec in self.cost_specs:
                if self._stopped():
                    return
                if down is not None:
                    continue  # the device is gone; its cells say why
                self._measure_round_cost(spec)
        finally:
            self._drop_transport()
            self.activity.device_finished(name)
            self.turns.finish(name, math.inf)


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
    announce : callable, optional
        Receives the isolation plan's lines before anything is measured (default: stderr).
    campaign_id : int, optional
        Add the cells to this stored campaign instead of starting one (`choose_widths`).
    round_cost : bool
        After a device's cells, measure its round cost (`harness.roundcost`) for every
        configuration of ``specs`` (`round_cost_specs`), in the device's turn; with
        ``resume``, only configurations without a stored successful one.
    data : path, optional
        The bench data of cells planned with it (``plan_cells(data=bench_data_label(data))``):
        an ``.npz`` shard deployed once per device; their steps, and the round-cost
        requests, train on it instead of random inputs.
    passes : int
        Passes each cell's time cap is split over (`_DeviceRun`; 1: one run per cell,
        in a process of its own). Cells of a fixed sample count (precision 0) take one.
    interleave : bool
        Devices that share cpus take turns pass by pass (`may_take_turn`; the default), so
        that a stretch in which the host is slow falls on one pass of a cell, not on all;
        False: each device runs all its passes in one turn.

    Returns
    -------
    CampaignResult

    Raises
    ------
    exporters.errors.InputError
        Before anything is measured, when cells name bench data that ``data`` is not, or
        the file does not fit their models (`check_bench_data`).
    """
    stop = stop or threading.Event()
    say = announce if announce is not None else (lambda line: print(line, file=sys.stderr, flush=True))
    data = _bench_data_for(specs, data)
    done_keys = store.measured_keys() if resume else set()
    todo = [s for s in specs if s.cell_key() not in done_keys]
    skipped = [s for s in specs if s.cell_key() in done_keys]
    from harness.store import git_commit, host_versions

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
        set_dirs = {sets[_set_key(s)] for s in [*todo, *cost_specs] if s.data}
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
    lock = threading.Lock()
    activity = _Activity()
    turns = _Turns(plan, by_device)
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
            plan=plan,
            activity=activity,
            turns=turns,
            cost_specs=costs_by_device.get(name, ()),
            scratch=Path(artifacts_dir) / ".roundcost",
            say=say,
            data=data,
            passes=passes,
            interleave=interleave,
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


def _bench_data_for(specs: Sequence[BenchSpec], data: Path | str | None) -> Path | None:
    """Return the bench data file of ``specs`` (None: random batches), checked against their labels."""
    from exporters.errors import InputError

    labels = {s.data for s in specs if s.data}
    if not labels:
        return None
    if data is None:
        raise InputError(f"cells train on bench data {sorted(labels)[0]}; give its file (--data)")
    path = Path(data)
    label = bench_data_label(path)
    if labels != {label}:
        raise InputError(f"--data {path} is {label}; the cells were planned with {', '.join(sorted(labels))}")
    return path


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
        One row per cell: median and p95 per-image latency (us), the half-width of the
        median's 95 % interval (%), peak memory (MB), status (``ok, imprecise`` for a cell
        that missed its precision).
    """
    import pandas as pd

    by_key = {}
    if len(cells):
        for row in cells.to_dict("records"):
            by_key[row["cell_key"]] = row
    header = (
        f"{'device':<16} {'width':>6} {'batch':>5} {'backend':<7} "
        f"{'median us':>10} {'+-%':>5} {'p95 us':>10} {'peak MB':>8}  status"
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
        if row is not None and bool(row.get("imprecise")):
            status += ", imprecise"
        achieved = None if row is None else row.get("precision_achieved")
        precision = "-" if achieved is None or bool(pd.isna(achieved)) else f"{100 * float(achieved):.1f}"
        lines.append(
            f"{spec.device:<16} {spec.width:>6.2f} {spec.batch:>5} {spec.backend:<7} "
            f"{num('median_us'):>10} {precision:>5} {num('p95_us'):>10} {num('peak_memory_bytes', 1e6):>8}  {status}"
        )
    return "\n".join(lines)


#: Widths ``--widths auto:N`` chooses from: multiples of 1/16 from 1/8 to 1.
AUTO_CANDIDATES: tuple[float, ...] = tuple(k / 16 for k in range(2, 17))


def parse_width_request(text: str) -> tuple[float, ...] | int:
    """Parse ``--widths``: a comma-separated list, or ``auto:N`` (the number of widths to choose).

    Parameters
    ----------
    text : str

    Returns
    -------
    tuple of float or int
        The widths, or N for ``auto:N``.

    Raises
    ------
    exporters.errors.InputError
        For ``auto:`` without a positive whole number, or a bad width list.
    """
    from exporters.arch import parse_widths
    from exporters.errors import InputError

    head, colon, tail = text.strip().partition(":")
    if colon and head.strip().lower() == "auto":
        try:
            n = int(tail)
        except ValueError:
            n = 0
        if n < 1:
            raise InputError(f"--widths {text!r}: auto:N needs a whole number N >= 1 of widths to measure")
        if n > len(AUTO_CANDIDATES):
            raise InputError(f"--widths {text!r}: at most {len(AUTO_CANDIDATES)} candidate widths (1/8 to 1 in 1/16)")
        return n
    return parse_widths(text)


@dataclass
class WidthChoice:
    """What `choose_widths` measured.

    Attributes
    ----------
    widths : list of float
        In the order they were measured.
    scores : list of float
        Per chosen width after the first round: the mean relative standard deviation of
        its predicted latency over the devices when it was chosen.
    results : list of CampaignResult
        One per round.
    """

    widths: list[float] = field(default_factory=list)
    scores: list[float] = field(default_factory=list)
    results: list[CampaignResult] = field(default_factory=list)

    @property
    def complete(self) -> bool:
        """Whether every round measured every cell."""
        return bool(self.results) and all(r.complete for r in self.results)


def choose_widths(
    fleet: Fleet,
    store: ProfileStore,
    n_widths: int,
    *,
    cells: Callable[[Sequence[float]], list[BenchSpec]],
    candidates: Sequence[float] = AUTO_CANDIDATES,
    say: Callable[[str], None] = lambda line: print(line, file=sys.stderr, flush=True),
    **campaign: Any,
) -> WidthChoice:
    """Measure the ``n_widths`` widths that most reduce the latency models' uncertainty (see the docstring).

    Parameters
    ----------
    fleet : Fleet
    store : harness.store.ProfileStore
    n_widths : int
        Widths to measure in all (the widest and narrowest candidates first).
    cells : callable
        ``cells(widths) -> specs`` (`plan_cells` for the request's model, batches, backends).
    candidates : sequence of float
        Widths to choose from.
    say : callable
        Receives one line per round.
    **campaign
        Passed to `run_campaign` (``artifacts_dir``, ``timeout``, ``resume``, ...);
        ``round_cost`` only to the first round, which measures the widest width.

    Returns
    -------
    WidthChoice
    """
    from harness.latency import choose_next_width, fit

    round_cost = bool(campaign.pop("round_cost", False))
    ordered = sorted(float(c) for c in candidates)
    first = [ordered[-1]] + ([ordered[0]] if n_widths > 1 else [])
    choice = WidthChoice()
    pending = first
    campaign_id: int | None = None
    while pending:
        say(f"measuring width{'s' if len(pending) > 1 else ''} {', '.join(f'{w:g}' for w in pending)}")
        specs = cells(pending)
        result = run_campaign(fleet, specs, store, campaign_id=campaign_id, round_cost=round_cost, **campaign)
        round_cost = False
        campaign_id = result.campaign_id
        choice.results.append(result)
        choice.widths.extend(pending)
        if result.interrupted or len(choice.widths) >= n_widths:
            break
        keys = {(s.model, s.batch, s.backend) for s in specs}
        models = []
        for device, dm in fit(store.latest_cells()).items():
            if any(s.device == device for s in specs):
                models += [dm.latency[k] for k in keys if k in dm.latency and dm.latency[k].zoo]
        nxt = choose_next_width(models, ordered, choice.widths)
        if nxt is None:
            break
        say(f"next width {nxt[0]:g}: its predicted latency is the most uncertain (+-{100 * nxt[1]:.0f} %, mean)")
        choice.scores.append(nxt[1])
        pending = [nxt[0]]
    return choice


def report_choices(choices: Sequence[BackendChoice], say: Callable[[str], None] | None = None) -> list[BackendChoice]:
    """Print the backend each device uses, or why it is skipped; return ``choices``.

    Parameters
    ----------
    choices : sequence of harness.backends.BackendChoice
    say : callable, optional
        Receives each line (default: stderr).

    Returns
    -------
    list of BackendChoice
    """
    from harness.backends import format_choices

    out = say or (lambda line: print(f"fleetbench: {line}", file=sys.stderr, flush=True))
    for line in format_choices(choices):
        out(f"backend of {line}")
    return list(choices)


def cmd_profile(args: argparse.Namespace) -> int:
    """``fleetbench profile``: run a campaign and print a summary table.

    Parameters
    ----------
    args : argparse.Namespace
        ``fleet, model, widths, batch, backend, steps, warmup, optimizer, precision, max_seconds,
        timeout, db, artifacts, resume, no_round_cost, data``.

    Returns
    -------
    int
        0 when every cell is measured, 1 otherwise (2 for bad input, via `InputError`).
    """
    from devices.fleetfile import load_fleet
    from exporters.errors import InputError
    from harness.backends import AUTO, check_override, usable_devices
    from harness.provision import fleet_backends
    from harness.store import ProfileStore

    request = parse_width_request(args.widths)
    batches = _split(args.batch, "batch size", _positive)
    backends = _split(args.backend, "backend", check_override)
    if AUTO in backends and len(backends) > 1:
        raise InputError(f"--backend {args.backend}: auto chooses one backend per device; name no others with it")
    if args.timeout <= 0:
        raise InputError(f"timeout {args.timeout:g} must be positive")
    if not 0 <= args.precision < 1:
        raise InputError(f"--precision {args.precision:g} must be a fraction in [0, 1) (0.02 is +-2 %)")
    if args.timeout <= args.max_seconds:
        raise InputError(
            f"--timeout {args.timeout:g} must exceed --max-seconds {args.max_seconds:g} (the runner's start-up and "
            "deployment come on top of its sampling)"
        )
    data_label = bench_data_label(args.data) if args.data else None
    fleet = load_fleet(args.fleet)
    plan: Sequence[str] | Mapping[str, str] = backends

    def cells(widths: Sequence[float]) -> list[BenchSpec]:
        return plan_cells(
            fleet, args.model, widths, batches, plan, args.steps, args.warmup, args.optimizer,
            precision=args.precision, max_seconds=args.max_seconds, data=data_label,
        )  # fmt: skip

    if backends == [AUTO]:
        plan_cells(fleet, args.model, [1.0], batches, [], args.steps, args.warmup)  # bad input fails first
        plan = usable_devices(report_choices(fleet_backends(fleet)))
    if not cells([1.0]):  # bad model or backend: refused before anything is measured
        print(f"no device of {args.fleet} can run a backend; see: fleetbench fleet provision {args.fleet}",
              file=sys.stderr)  # fmt: skip
        return EXIT_INCOMPLETE
    with ProfileStore(Path(args.db)) as store:
        run = {
            "artifacts_dir": Path(args.artifacts), "timeout": args.timeout, "resume": args.resume,
            "round_cost": not args.no_round_cost, "data": args.data, "passes": args.passes,
        }  # fmt: skip
        if isinstance(request, int):
            choice = choose_widths(fleet, store, request, cells=cells, **run)
            specs = cells(choice.widths)
            results = choice.results
            print(f"widths chosen: {', '.join(f'{w:g}' for w in sorted(choice.widths))}", file=sys.stderr)
        else:
            specs = cells(request)
            results = [run_campaign(fleet, specs, store, **run)]
        print(summary_table(store.latest_cells(), specs))
    for result in results:
        for reasons in result.round_cost_failures.values():
            for reason in reasons:
                print(f"round cost not measured: {reason}", file=sys.stderr)
    skipped = sum(len(r.skipped) for r in results)
    if skipped:
        print(f"{skipped} cell(s) were already measured and skipped (--resume).")
    interrupted = any(r.interrupted for r in results)
    if results and all(r.complete for r in results):
        return 0
    measured_now = sum(m.ok for r in results for m in r.measurements)
    missing = len(specs) - skipped - measured_now
    what = "interrupted: " if interrupted else ""
    resume = ["fleetbench", "profile", "--fleet", args.fleet, "--model", args.model, "--widths", args.widths]
    resume += ["--batch", args.batch, "--backend", args.backend, "--steps", str(args.steps)]
    resume += ["--warmup", str(args.warmup), "--optimizer", args.optimizer, "--precision", f"{args.precision:g}"]
    resume += ["--max-seconds", f"{args.max_seconds:g}", "--passes", str(args.passes)]
    resume += ["--timeout", f"{args.timeout:g}", "--db", args.db]
    resume += ["--artifacts", args.artifacts, "--resume"] + (["--no-round-cost"] if args.no_round_cost else [])
    resume += ["--data", args.data] if args.data else []
    print(
        f"{what}{missing} of {len(specs)} cell(s) not measured; every finished cell is stored. "
        f"Measure only the missing ones with:\n  {shlex.join(resume)}",
        file=sys.stderr,
    )
    return EXIT_INCOMPLETE
