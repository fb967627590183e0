"""CPU, memory and network limits of emulated devices: cgroups when permitted, else fallbacks.

Decisions (pure functions, tested on fake trees) are kept apart from the few I/O calls.
A device's cgroups are ``<parent>/fleetbench/<unit>`` and its namespace ``fb-<unit>``,
where ``unit`` (`unit_name`) is the device name plus a hash of the fleet's state dir, so
two fleets with a device of the same name never share them.

- `detect` reads a cgroup mount tree and ``/proc/self/cgroup`` text and says, per
  controller, where a device's cgroup can be created: cgroup v1 (``cpu`` /
  ``memory`` hierarchies) or cgroup v2 (a subtree of the caller's own cgroup whose
  ``cgroup.controllers`` lists the controller). v1 is preferred per controller when
  mounted (hybrid machines keep ``cpu`` there).
- CPU share: cgroup quota (v1 ``cpu.cfs_quota_us`` / ``cpu.cfs_period_us``, v2
  ``cpu.max``) or, where no cgroup is permitted, a duty-cycle supervisor
  (``python -m devices.emulation.limits duty``) that every period P sends SIGCONT for ``share*P``
  and SIGSTOP for ``(1-share)*P`` to the device's whole process tree (found by
  walking the parent pids in ``/proc``). The duty cycle is exact for one busy thread;
  a multi-threaded tree gets ``share`` of the time on every core it uses.
- Memory: cgroup (v1 ``memory.limit_in_bytes``, v2 ``memory.max``), else RLIMIT_AS.
- CPU pinning (``emulate: {cpus: ...}``): a cpuset cgroup (v1 ``cpuset.cpus`` and
  ``cpuset.mems``, also on the shared ``fleetbench`` parent, which v1 requires before a
  child may hold cpus; v2 ``cpuset.cpus`` with ``+cpuset`` in ``subtree_control``), else the
  started process's cpu affinity (``sched_setaffinity``), which its children inherit.
  The method is recorded (``Plan.cpuset``) so that a campaign knows which devices really
  have disjoint cpus (`harness.isolation.plan_isolation`).
- Idle cpus (`start_latency_hold`): a quota stops a throttled device for most of every
  period, and the cpu it ran on goes idle. A virtual machine's idle cpu halts its vCPU,
  and the host then runs other work on that core: the device's next steps find cold
  caches and cost it more CPU time, by an amount that changes with the host's load, so
  the device's steps would vary with work that is not its own. While a throttled device is up, a
  small process (``python -m devices.emulation.limits hold-latency``) holds a 0 µs request on the
  kernel's CPU latency QoS device (``/dev/cpu_dma_latency``; root only): idle cpus then
  poll instead of halting. The request ends when that process exits, however it exits.
- Network (root only): a namespace ``fb-<name>`` with a veth pair on a private /30 and
  a netem qdisc (delay, rate) on both ends.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
import resource
import signal
import struct
import subprocess
import sys
import time
import zlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, NoReturn

from devices import processes

#: Default cgroup mount point.
CGROUP_ROOT = Path("/sys/fs/cgroup")
#: Directory (below the caller's own cgroup) that holds the devices' cgroups.
GROUP = "fleetbench"
#: CFS period in microseconds for cgroup quotas. Short, because a training step of a
#: few milliseconds runs unthrottled until a period's quota is spent and then stalls:
#: at share 0.25, a 100 ms period runs 2 ms steps at full speed for 25 ms and then
#: stalls one of them for 75 ms, so the median step shows no slow-down and a few steps
#: carry all of it; a 10 ms period spreads the slow-down over the steps, as a slower
#: cpu would. The kernel's smallest quota is 1 ms, so shares below 0.1 are raised to
#: 0.1 at this period.
PERIOD_US = 10_000
#: Duty-cycle period in seconds. The fallback stops and resumes whole process trees with
#: signals; at 20 ms it broke SSH logins (sshd stopped mid-handshake), so it keeps
#: 100 ms and with it the coarse per-step behaviour described for ``PERIOD_US``.
DUTY_PERIOD_S = 0.1

CpuMethod = Literal["cgroup-v1", "cgroup-v2", "duty-cycle", "none"]
MemoryMethod = Literal["cgroup-v1", "cgroup-v2", "rlimit", "none"]
CpusetMethod = Literal["cgroup-v1", "cgroup-v2", "affinity", "none"]


@dataclass(frozen=True)
class Support:
    """What this machine permits, per controller.

    Attributes
    ----------
    cpu_version, memory_version, cpuset_version : int
        1 or 2 when a cgroup of that version can hold the controller, 0 otherwise.
    cpu_parent, memory_parent, cpuset_parent : pathlib.Path or None
        Directory under which ``fleetbench/<name>`` is created.
    reason : str
        Why a controller is unavailable (empty when both are available).
    cpuset_cpus, cpuset_mems : str
        The cpuset parent's own ``cpuset.cpus`` / ``cpuset.mems`` (cgroup v1 copies them
        onto the ``fleetbench`` directory; v2 needs neither).
    """

    cpu_version: int = 0
    memory_version: int = 0
    cpu_parent: Path | None = None
    memory_parent: Path | None = None
    reason: str = ""
    cpuset_version: int = 0
    cpuset_parent: Path | None = None
    cpuset_cpus: str = ""
    cpuset_mems: str = ""


@dataclass(frozen=True)
class Plan:
    """How one device is limited.

    Attributes
    ----------
    cpu : str
        ``cgroup-v1``, ``cgroup-v2``, ``duty-cycle`` or ``none``.
    memory : str
        ``cgroup-v1``, ``cgroup-v2``, ``rlimit`` or ``none``.
    cpu_share : float or None
    memory_mb : int or None
    cgroup_dirs : tuple of pathlib.Path
        Cgroup directories to create (and add the device's processes to).
    writes : tuple of (pathlib.Path, str)
        Files to write, in order, after creating the directories.
    cpuset : str
        ``cgroup-v1``, ``cgroup-v2``, ``affinity`` or ``none`` (no pinning asked for).
    cpus : frozenset of int or None
        The cpus the device is pinned to (None: not pinned).
    """

    cpu: CpuMethod
    memory: MemoryMethod
    cpu_share: float | None
    memory_mb: int | None
    cgroup_dirs: tuple[Path, ...] = ()
    writes: tuple[tuple[Path, str], ...] = ()
    cpuset: CpusetMethod = "none"
    cpus: frozenset[int] | None = None


# ---------------------------------------------------------------------------- pure logic


def parse_proc_cgroup(text: str) -> dict[str, str]:
    """Map controller name to the caller's cgroup path from ``/proc/self/cgroup`` text.

    Parameters
    ----------
    text : str
        Lines ``ID:CONTROLLERS:PATH``; the v2 line (``0::PATH``) maps to key ``""``.

    Returns
    -------
    dict of str to str
    """
    out: dict[str, str] = {}
    for line in text.splitlines():
        parts = line.strip().split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        if controllers == "":
            out[""] = path
        for controller in controllers.split(","):
            if controller:
                out[controller] = path
    return out


def parse_cpu_list(text: str) -> frozenset[int]:
    """Parse a Linux cpu list (``"0"``, ``"0-3"``, ``"0,2-3"``) into cpu numbers.

    Parameters
    ----------
    text : str
        Comma-separated cpu numbers and inclusive ranges ``a-b``; blanks around items are
        ignored.

    Returns
    -------
    frozenset of int
        At least one cpu.

    Raises
    ------
    ValueError
        For an empty list, an item that is not a number or a range, or a range whose end
        is below its start.
    """
    cpus: set[int] = set()
    for item in str(text).split(","):
        item = item.strip()
        low, dash, high = item.partition("-")
        if not low.strip().isdigit() or (dash and not high.strip().isdigit()):
            raise ValueError(f"{item!r} is not a cpu number or a range a-b")
        start, end = int(low), int(high) if dash else int(low)
        if end < start:
            raise ValueError(f"range {item!r} ends below its start")
        cpus.update(range(start, end + 1))
    if not cpus:
        raise ValueError("empty cpu list")
    return frozenset(cpus)


def format_cpu_list(cpus: Iterable[int]) -> str:
    """Write cpu numbers as the shortest Linux cpu list (``{0, 1, 2, 5}`` -> ``"0-2,5"``).

    Parameters
    ----------
    cpus : iterable of int

    Returns
    -------
    str
    """
    ordered = sorted(set(cpus))
    parts: list[str] = []
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        parts.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ",".join(parts)


def _join(root: Path, path: str) -> Path:
    return root / path.lstrip("/") if path.strip("/") else root


def detect(
    root: Path = CGROUP_ROOT,
    proc_cgroup: str | None = None,
    writable: Callable[[Path], bool] | None = None,
) -> Support:
    """Say where this machine lets fleetbench create CPU and memory cgroups.

    Parameters
    ----------
    root : pathlib.Path
        cgroup mount point (``/sys/fs/cgroup``; a fake tree in tests).
    proc_cgroup : str, optional
        Contents of ``/proc/self/cgroup`` (read when ``None``).
    writable : callable, optional
        ``writable(dir) -> bool`` (default: ``os.access(dir, os.W_OK)``).

    Returns
    -------
    Support
        cgroup v1 is used for a controller when its hierarchy is mounted at
        ``root/<controller>`` (or ``root/cpu,cpuacct``); else cgroup v2 when ``root``
        or ``root/unified`` is a v2 mount whose caller cgroup lists the controller in
        ``cgroup.controllers``.
    """
    if proc_cgroup is None:
        try:
            proc_cgroup = Path("/proc/self/cgroup").read_text()
        except OSError:
            proc_cgroup = ""
    can_write = writable or (lambda p: os.access(p, os.W_OK))
    own = parse_proc_cgroup(proc_cgroup)
    reasons: list[str] = []
    found: dict[str, tuple[int, Path]] = {}
    v1_files = {"cpu": "cpu.cfs_quota_us", "memory": "memory.limit_in_bytes", "cpuset": "cpuset.cpus"}
    v2_root = next((r for r in (root, root / "unified") if (r / "cgroup.controllers").is_file()), None)
    for controller, knob in v1_files.items():
        mounts = [root / controller] + ([root / "cpu,cpuacct", root / "cpuacct,cpu"] if controller == "cpu" else [])
        mount = next((m for m in mounts if (m / knob).is_file()), None)
        if mount is not None:
            parent = _join(mount, own.get(controller, "/"))
            if not parent.is_dir():
                parent = mount
            if can_write(parent):
                found[controller] = (1, parent)
            else:
                reasons.append(f"{controller}: {parent} is not writable")
            continue
        if v2_root is not None:
            chosen = _v2_parent(v2_root, own.get("", "/"), controller, can_write)
            if chosen is None:
                reasons.append(
                    f"{controller}: not delegated to a writable cgroup on the way to "
                    f"{_join(v2_root, own.get('', '/'))} (cgroup v2)"
                )
            else:
                found[controller] = (2, chosen)
            continue
        reasons.append(f"{controller}: no cgroup hierarchy mounted at {root}")
    cpu = found.get("cpu", (0, None))
    mem = found.get("memory", (0, None))
    cpuset = found.get("cpuset", (0, None))
    cpus = mems = ""
    if cpuset[1] is not None:
        for name in ("cpus", "mems"):
            with contextlib.suppress(OSError):
                text = (cpuset[1] / f"cpuset.{name}").read_text().strip()
                text = text or (cpuset[1] / f"cpuset.effective_{name}").read_text().strip()
                cpus, mems = (text, mems) if name == "cpus" else (cpus, text)
    return Support(cpu[0], mem[0], cpu[1], mem[1], "; ".join(reasons), cpuset[0], cpuset[1], cpus, mems)


def _v2_parent(v2_root: Path, own: str, controller: str, can_write: Callable[[Path], bool]) -> Path | None:
    """Highest cgroup on the path from the v2 root to ``own`` that we may write and that has ``controller``.

    cgroup v2 forbids processes in a cgroup whose children get controllers (except in
    the root), so the caller's own cgroup rarely works; root may use the root cgroup,
    an unprivileged user the top of the subtree systemd delegated (``user@UID.service``).
    """
    parts = [p for p in own.strip("/").split("/") if p]
    for depth in range(len(parts) + 1):
        candidate = v2_root.joinpath(*parts[:depth])
        try:
            available = (candidate / "cgroup.controllers").read_text().split()
        except OSError:
            continue
        if controller in available and can_write(candidate):
            return candidate
    return None


def cpu_knobs(version: int, share: float, period_us: int = PERIOD_US) -> dict[str, str]:
    """Return the cgroup files that hold a process tree to ``share`` of one core.

    Parameters
    ----------
    version : {1, 2}
        cgroup version.
    share : float
        Fraction of one core (may exceed 1 on a multi-core machine).
    period_us : int
        CFS period.

    Returns
    -------
    dict of str to str
        v1: ``cpu.cfs_period_us`` then ``cpu.cfs_quota_us``; v2: ``cpu.max``.
    """
    if share <= 0:
        raise ValueError(f"cpu share must be positive, got {share}")
    quota = max(1000, int(round(share * period_us)))
    if version == 1:
        return {"cpu.cfs_period_us": str(period_us), "cpu.cfs_quota_us": str(quota)}
    return {"cpu.max": f"{quota} {period_us}"}


def memory_knobs(version: int, memory_mb: int) -> dict[str, str]:
    """Return the cgroup files that cap a process tree's memory at ``memory_mb`` MiB.

    Parameters
    ----------
    version : {1, 2}
    memory_mb : int

    Returns
    -------
    dict of str to str
        v1: ``memory.limit_in_bytes``; v2: ``memory.max``.
    """
    value = str(int(memory_mb) * 1024 * 1024)
    return {"memory.limit_in_bytes": value} if version == 1 else {"memory.max": value}


def cpuset_knobs(version: int, cpus: Iterable[int], mems: str) -> dict[str, str]:
    """Return the cgroup files that pin a process tree to ``cpus``.

    Parameters
    ----------
    version : {1, 2}
    cpus : iterable of int
    mems : str
        Memory nodes (cgroup v1 refuses tasks in a cpuset without them).

    Returns
    -------
    dict of str to str
        v1: ``cpuset.cpus`` then ``cpuset.mems``; v2: ``cpuset.cpus``.
    """
    knobs = {"cpuset.cpus": format_cpu_list(cpus)}
    if version == 1:
        knobs["cpuset.mems"] = mems or "0"
    return knobs


def plan(
    support: Support,
    name: str,
    cpu_share: float | None,
    memory_mb: int | None,
    cpus: frozenset[int] | None = None,
) -> Plan:
    """Decide how device ``name`` is limited on a machine with ``support``.

    Parameters
    ----------
    support : Support
        From `detect`.
    name : str
        Device name (cgroup directory ``fleetbench/<name>``).
    cpu_share : float or None
        Fraction of one core; ``None``: no CPU limit.
    memory_mb : int or None
        Memory cap; ``None``: no memory limit.
    cpus : frozenset of int or None
        Cpus to pin the device to; ``None``: not pinned.

    Returns
    -------
    Plan
        Pinning is a cpuset cgroup when ``support`` has one, else ``affinity``.
    """
    dirs: list[Path] = []
    writes: list[tuple[Path, str]] = []
    cpu: CpuMethod = "none"
    memory: MemoryMethod = "none"
    cpuset: CpusetMethod = "none"
    v2_dirs: set[Path] = set()

    def group_under(parent: Path, version: int) -> Path:
        group = parent / GROUP / name
        if group not in dirs:
            dirs.append(group)
        if version == 2:
            v2_dirs.add(parent)
        return group

    if cpu_share is not None:
        if support.cpu_version and support.cpu_parent is not None:
            cpu = "cgroup-v1" if support.cpu_version == 1 else "cgroup-v2"
            group = group_under(support.cpu_parent, support.cpu_version)
            writes.extend((group / k, v) for k, v in cpu_knobs(support.cpu_version, cpu_share).items())
        else:
            cpu = "duty-cycle"
    if memory_mb is not None:
        if support.memory_version and support.memory_parent is not None:
            memory = "cgroup-v1" if support.memory_version == 1 else "cgroup-v2"
            group = group_under(support.memory_parent, support.memory_version)
            writes.extend((group / k, v) for k, v in memory_knobs(support.memory_version, memory_mb).items())
        else:
            memory = "rlimit"
    if cpus is not None:
        if support.cpuset_version and support.cpuset_parent is not None:
            cpuset = "cgroup-v1" if support.cpuset_version == 1 else "cgroup-v2"
            group = group_under(support.cpuset_parent, support.cpuset_version)
            if support.cpuset_version == 1:  # the shared parent needs cpus and mems before any child may hold them
                parent = support.cpuset_parent / GROUP
                writes.append((parent / "cpuset.cpus", support.cpuset_cpus or format_cpu_list(cpus)))
                writes.append((parent / "cpuset.mems", support.cpuset_mems or "0"))
            writes.extend(
                (group / k, v) for k, v in cpuset_knobs(support.cpuset_version, cpus, support.cpuset_mems).items()
            )
        else:
            cpuset = "affinity"
    # cgroup v2: the controllers must be enabled in subtree_control on the way down.
    enable: list[tuple[Path, str]] = []
    wanted = {
        "cpu": (support.cpu_version, support.cpu_parent, cpu_share is not None),
        "memory": (support.memory_version, support.memory_parent, bool(memory_mb)),
        "cpuset": (support.cpuset_version, support.cpuset_parent, cpus is not None),
    }
    for parent in sorted(v2_dirs):
        controllers = " ".join(f"+{c}" for c, (v, p, asked) in wanted.items() if v == 2 and p == parent and asked)
        enable.append((parent / "cgroup.subtree_control", controllers))
        enable.append((parent / GROUP / "cgroup.subtree_control", controllers))
    return Plan(cpu, memory, cpu_share, memory_mb, tuple(dirs), tuple(enable + writes), cpuset, cpus)


def duty_schedule(share: float, period: float = DUTY_PERIOD_S) -> tuple[float, float]:
    """Return ``(run_seconds, stop_seconds)`` of one duty-cycle period.

    Parameters
    ----------
    share : float
        Fraction of time the tree runs (clipped to 1).
    period : float
        Period in seconds.

    Returns
    -------
    tuple of float
    """
    if share <= 0:
        raise ValueError(f"cpu share must be positive, got {share}")
    run = min(1.0, share) * period
    return run, period - run


def netns_addresses(index: int) -> tuple[str, str]:
    """Return ``(host_side, device_side)`` addresses of device ``index``'s private /30.

    Addresses come from 10.213.0.0/16 (one /30 per device, index 0..16383); they exist
    only on the veth pair between this machine and the device's own namespace.
    """
    if not 0 <= index < 16384:
        raise ValueError("device index out of range")
    base = index * 4
    prefix = f"10.213.{base // 256}."
    return f"{prefix}{base % 256 + 1}", f"{prefix}{base % 256 + 2}"


def netem_args(delay_ms: float | None, rate_kbit: int | None) -> list[str]:
    """Return the ``netem`` arguments of a tc qdisc for ``delay_ms`` and ``rate_kbit``."""
    args = ["netem"]
    if delay_ms:
        args += ["delay", f"{delay_ms:g}ms"]
    if rate_kbit:
        args += ["rate", f"{int(rate_kbit)}kbit"]
    return args


# ---------------------------------------------------------------------------- I/O


def apply_cgroups(p: Plan) -> None:
    """Create ``p``'s cgroup directories and write its limits.

    Raises
    ------
    OSError
        If a directory or file cannot be written (the caller falls back).
    """
    for directory in p.cgroup_dirs:
        directory.mkdir(parents=True, exist_ok=True)
    for path, value in p.writes:
        if path.name == "cgroup.subtree_control":
            path.parent.mkdir(parents=True, exist_ok=True)
            if not value:
                continue
        path.write_text(value)


def add_pid(p: Plan, pid: int) -> None:
    """Move process ``pid`` into every cgroup of ``p`` (its future children follow)."""
    for directory in p.cgroup_dirs:
        (directory / "cgroup.procs").write_text(str(pid))


def preexec(p: Plan) -> Callable[[], None]:
    """Return a ``preexec_fn`` that puts the new process under ``p`` before it execs.

    The child joins the cgroups and, when the plan says so, sets RLIMIT_AS (``rlimit``) and
    its cpu affinity (``affinity``).
    """
    dirs = [str(d / "cgroup.procs") for d in p.cgroup_dirs]
    limit = p.memory_mb * 1024 * 1024 if p.memory == "rlimit" and p.memory_mb else None
    affinity = sorted(p.cpus) if p.cpuset == "affinity" and p.cpus else None

    def hook() -> None:
        pid = str(os.getpid()).encode()
        for path in dirs:
            fd = os.open(path, os.O_WRONLY)
            try:
                os.write(fd, pid)
            finally:
                os.close(fd)
        if limit is not None:
            resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
        if affinity is not None:
            os.sched_setaffinity(0, affinity)

    return hook


def set_rlimit_as(pid: int, memory_mb: int) -> None:
    """Set RLIMIT_AS of running process ``pid`` (its later children inherit it)."""
    limit = memory_mb * 1024 * 1024
    resource.prlimit(pid, resource.RLIMIT_AS, (limit, limit))


def cgroup_pids(dirs: Iterable[Path | str]) -> list[int]:
    """Return the pids in the cgroups ``dirs`` (missing directories hold none)."""
    pids: list[int] = []
    for directory in dirs:
        with contextlib.suppress(OSError, ValueError):
            pids += [int(x) for x in (Path(directory) / "cgroup.procs").read_text().split()]
    return pids


def remove_cgroups(dirs: Iterable[Path | str], timeout: float = 5.0) -> list[str]:
    """Stop every process left in ``dirs`` (`devices.processes.stop`) and remove the directories.

    Parameters
    ----------
    dirs : iterable of path
        Device cgroups (``.../fleetbench/<name>``); their ``fleetbench`` parent goes too when empty.
    timeout : float
        Seconds to wait for the directories to empty.

    Returns
    -------
    list of str
        Directories that could not be removed (with the reason).
    """
    failed: list[str] = []
    for raw in dirs:
        directory = Path(raw)
        if not directory.is_dir():
            continue
        deadline = time.monotonic() + timeout
        while True:
            processes.stop((), also=functools.partial(cgroup_pids, [directory]), grace=1.0)
            try:
                directory.rmdir()
                break
            except OSError as exc:
                if time.monotonic() > deadline:
                    failed.append(f"{directory}: {exc}")
                    break
                time.sleep(0.05)
        parent = directory.parent
        if parent.name == GROUP:
            with contextlib.suppress(OSError):
                parent.rmdir()
    return failed


def _run(argv: list[str], check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(argv, capture_output=True, text=True, stdin=subprocess.DEVNULL)
    if check and proc.returncode != 0:
        raise OSError(f"{' '.join(argv)}: {(proc.stderr or proc.stdout).strip()}")
    return proc


def netns_name(name: str) -> str:
    """Return the network namespace name of device ``name`` (``fb-<name>``)."""
    return f"fb-{name}"


def unit_name(device: str, state_dir: Path | str) -> str:
    """Return the name of a device's cgroups and namespace: ``<device>-<hash of state_dir>``.

    Two fleets may both have a device called ``pi4``; the hash of the fleet's state
    directory keeps their cgroups and namespaces apart.
    """
    return f"{device}-{zlib.crc32(str(Path(state_dir).absolute()).encode()):08x}"


def tbf_args(rate_kbit: int) -> list[str]:
    """Return the ``tbf`` arguments of a tc qdisc limiting to ``rate_kbit`` (when netem is missing)."""
    burst = max(1600, int(rate_kbit) * 1000 // 8 // 100)  # bytes: 10 ms worth, at least one MTU
    return ["tbf", "rate", f"{int(rate_kbit)}kbit", "burst", str(burst), "latency", "100ms"]


@dataclass(frozen=True)
class Shaping:
    """How a device's namespace link is shaped.

    Attributes
    ----------
    netns : str
        Namespace name.
    address : str
        The device's address inside it.
    host_if : str
        Host end of the veth pair.
    qdisc : str
        ``netem``, ``tbf`` (rate only; the kernel lacks netem) or ``none``.
    userspace_delay_ms : float or None
        One-way delay the forwarder must add because the kernel lacks netem.
    """

    netns: str
    address: str
    host_if: str
    qdisc: str
    userspace_delay_ms: float | None = None


def free_subnet_index(used: Iterable[str]) -> int:
    """Return the first /30 index of 10.213.0.0/16 none of whose addresses is in ``used``.

    Parameters
    ----------
    used : iterable of str
        IPv4 addresses configured on this machine's interfaces.

    Returns
    -------
    int

    Raises
    ------
    OSError
        If all 16384 subnets are taken.
    """
    taken = set(used)
    for index in range(16384):
        if not taken & set(netns_addresses(index)):
            return index
    raise OSError("no free /30 left in 10.213.0.0/16")


def used_addresses() -> list[str]:
    """Return the IPv4 addresses configured on this machine's interfaces (``ip -o -4 addr``)."""
    out = _run(["ip", "-o", "-4", "addr", "show"], check=False).stdout
    return [
        word.split("/")[0]
        for line in out.splitlines()
        for i, word in enumerate(line.split())
        if i > 0 and line.split()[i - 1] == "inet"
    ]


def netns_up(name: str, delay_ms: float | None, rate_kbit: int | None) -> Shaping:
    """Create device ``name``'s namespace, veth pair and qdiscs (root only).

    netem (delay and rate) is put on both veth ends. Where the kernel has no netem
    (``sch_netem`` missing), rate is enforced by ``tbf`` and the delay is left to the
    caller's userspace forwarder (`Shaping.userspace_delay_ms`).

    Parameters
    ----------
    name : str
        Device name.
    delay_ms, rate_kbit : float or int or None
        One-way delay and rate, applied in each direction.

    Returns
    -------
    Shaping

    Raises
    ------
    OSError
        If an ``ip`` or ``tc`` command fails (what was created is removed).
    """
    ns = netns_name(name)
    tag = f"{zlib.crc32(name.encode()):08x}"
    host_if, dev_if = f"fbh{tag}", f"fbd{tag}"  # interface names: at most 15 characters
    netns_down(ns, host_if)
    host_ip, dev_ip = netns_addresses(free_subnet_index(used_addresses()))
    qdisc, user_delay = "none", None
    try:
        _run(["ip", "netns", "add", ns])
        _run(["ip", "link", "add", host_if, "type", "veth", "peer", "name", dev_if])
        _run(["ip", "link", "set", dev_if, "netns", ns])
        _run(["ip", "addr", "add", f"{host_ip}/30", "dev", host_if])
        _run(["ip", "link", "set", host_if, "up"])
        _run(["ip", "netns", "exec", ns, "ip", "addr", "add", f"{dev_ip}/30", "dev", dev_if])
        _run(["ip", "netns", "exec", ns, "ip", "link", "set", dev_if, "up"])
        _run(["ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up"])
        if delay_ms or rate_kbit:
            ends = (
                ["tc", "qdisc", "add", "dev", host_if, "root"],
                ["ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", dev_if, "root"],
            )
            probe = _run([*ends[0], *netem_args(delay_ms, rate_kbit)], check=False)
            if probe.returncode == 0:
                _run([*ends[1], *netem_args(delay_ms, rate_kbit)])
                qdisc = "netem"
            elif "unknown" in (probe.stderr + probe.stdout).lower():
                user_delay = delay_ms or None
                if rate_kbit:
                    for end in ends:
                        _run([*end, *tbf_args(rate_kbit)])
                    qdisc = "tbf"
            else:
                raise OSError(f"tc netem on {host_if}: {(probe.stderr or probe.stdout).strip()}")
    except OSError:
        netns_down(ns, host_if)
        raise
    return Shaping(ns, dev_ip, host_if, qdisc, user_delay)


def netns_down(ns: str, host_if: str | None = None) -> None:
    """Remove namespace ``ns`` (its veth end goes with it) and the host end ``host_if``."""
    _run(["ip", "netns", "del", ns], check=False)
    if host_if:
        _run(["ip", "link", "del", host_if], check=False)


def netns_exists(ns: str) -> bool:
    """Whether network namespace ``ns`` exists."""
    return Path("/run/netns", ns).exists()


# ---------------------------------------------------------------------------- duty cycle


def duty_cycle(root: int, share: float, period: float = DUTY_PERIOD_S) -> None:
    """Hold process ``root`` and its descendants to ``share`` of the time until ``root`` exits.

    Every ``period`` seconds the tree gets SIGCONT for ``share * period`` and SIGSTOP for
    the rest. SIGTERM / SIGINT end the loop with the tree running (SIGCONT).
    """
    run_s, stop_s = duty_schedule(share, period)
    stopping = {"flag": False}
    tree: list[int] = [root]

    def finish(signum: int, frame: object) -> None:
        stopping["flag"] = True

    signal.signal(signal.SIGTERM, finish)
    signal.signal(signal.SIGINT, finish)

    def send(sig: int) -> None:
        for pid in tree:
            try:
                os.kill(pid, sig)
            except (ProcessLookupError, PermissionError):
                pass

    start = processes.start_time(root)
    me = os.getpid()
    try:
        next_period = time.monotonic()
        while not stopping["flag"] and not processes.exited(root, start):
            send(signal.SIGCONT)
            if stop_s <= 0:
                time.sleep(period)
                continue
            _sleep_until(next_period + run_s)
            send(signal.SIGSTOP)
            # rescan while the tree is stopped, so the scan never lengthens the run window
            fresh = [pid for pid in processes.descendants(root, processes.process_parents()) if pid != me]
            new = set(fresh) - set(tree)
            tree = fresh
            for pid in new:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGSTOP)
            next_period += period
            if next_period < time.monotonic():  # fell behind (machine busy): restart the grid
                next_period = time.monotonic()
            _sleep_until(next_period)
    finally:
        tree = processes.descendants(root, processes.process_parents())
        send(signal.SIGCONT)


def _sleep_until(deadline: float) -> None:
    delay = deadline - time.monotonic()
    if delay > 0:
        time.sleep(delay)


#: The kernel's CPU latency QoS device: while a process holds it open with a request of
#: 0 µs, idle cpus poll instead of entering idle states (see the module docstring).
CPU_LATENCY_QOS = Path("/dev/cpu_dma_latency")


def hold_cpu_latency(path: Path = CPU_LATENCY_QOS) -> NoReturn:
    """Hold a 0 µs CPU latency request on ``path`` until this process is stopped.

    Prints ``held`` once the request is in place (`start_latency_hold` waits for it).

    Parameters
    ----------
    path : pathlib.Path
        The CPU latency QoS device.
    """
    fd = os.open(path, os.O_WRONLY)
    os.write(fd, struct.pack("=i", 0))  # a binary s32 in microseconds; the request lives as long as fd
    print("held", flush=True)
    while True:
        signal.pause()


def start_latency_hold(env: dict[str, str], path: Path = CPU_LATENCY_QOS) -> tuple[subprocess.Popen[bytes] | None, str]:
    """Start the process that keeps idle cpus polling (`hold_cpu_latency`), and wait until it holds.

    Parameters
    ----------
    env : dict
        Its environment (a device's marker, so that ``down`` finds it).
    path : pathlib.Path
        The CPU latency QoS device.

    Returns
    -------
    tuple
        ``(process, "")`` once the request is held (stop it with SIGTERM), or
        ``(None, reason)`` when it cannot be (no such device, no permission).
    """
    if not path.exists():
        return None, f"{path} does not exist"
    if not os.access(path, os.W_OK):
        return None, f"no permission to write {path} (root only)"
    proc = _start_helper(["hold-latency", "--path", str(path)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    assert proc.stdout is not None and proc.stderr is not None
    with proc.stdout, proc.stderr:
        if proc.stdout.readline().strip() == b"held":
            return proc, ""
        proc.wait()
        error = proc.stderr.read().decode(errors="replace").strip().splitlines()
    return None, f"holding {path} failed: {error[-1] if error else f'exit status {proc.returncode}'}"


def start_duty_cycle(root: int, share: float, period: float = DUTY_PERIOD_S) -> subprocess.Popen[bytes]:
    """Start the duty-cycle supervisor of ``root`` as a separate process.

    Returns
    -------
    subprocess.Popen
        The supervisor (stop it with SIGTERM; it resumes the tree before exiting).
    """
    return _start_helper(
        ["duty", "--pid", str(root), "--share", repr(share), "--period", repr(period)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def _start_helper(args: list[str], **popen: Any) -> subprocess.Popen[bytes]:
    """Start ``python -m devices.emulation.limits ARGS`` from the package root, in a session of its own."""
    return subprocess.Popen(
        [sys.executable, "-m", "devices.emulation.limits", *args],
        stdin=subprocess.DEVNULL,
        start_new_session=True,
        cwd=str(Path(__file__).resolve().parents[2]),
        **popen,
    )


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m devices.emulation.limits duty --pid P --share S [--period T]``, ``hold-latency``."""
    parser = argparse.ArgumentParser(prog="python -m devices.emulation.limits")
    sub = parser.add_subparsers(dest="command", required=True)
    duty = sub.add_parser("duty", help="SIGSTOP/SIGCONT duty cycling of a process tree")
    duty.add_argument("--pid", type=int, required=True)
    duty.add_argument("--share", type=float, required=True)
    duty.add_argument("--period", type=float, default=DUTY_PERIOD_S)
    hold = sub.add_parser("hold-latency", help="keep idle cpus polling until stopped")
    hold.add_argument("--path", type=Path, default=CPU_LATENCY_QOS)
    args = parser.parse_args(argv)
    if args.command == "hold-latency":
        hold_cpu_latency(args.path)
    else:
        duty_cycle(args.pid, args.share, args.period)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
