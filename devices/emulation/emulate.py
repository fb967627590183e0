"""The emulated fleet: ``fleetbench fleet up | down | status FILE``.

Every device of a fleet file with an ``emulate:`` block is started (or, a local one,
confined) on this machine:

- an SSH device is an OpenSSH ``sshd`` (`devices.emulation.sshd`) on its loopback port, with its
  own host key (written to the fleet's known_hosts, so host-key verification stays on)
  and the fleet's user key (``<state_dir>/id_ed25519`` by default) authorised;
- an ADB device is ``python -m devices.emulation.adb_endpoint`` on the port of its
  ``HOST:PORT`` serial, attached to the adb server (``host:connect``) when ``adb``
  is installed (server port from ``ANDROID_ADB_SERVER_PORT``, default 5037);
- a local device has no server: ``up`` creates its limits and records them, and every
  command fleetbench runs on it (`devices.connect.connect` gives its `LocalTransport`
  `local_confinement`) starts inside them, as an SSH session starts inside its sshd's.
  Without cgroups each command gets a duty-cycle supervisor of its own; a device that
  is not up refuses commands. `write_local_fleet` writes the example fleet's fast, mid
  and slow as such devices (``devices/fleets/emulated-local.yaml``), for machines
  without sshd.

Each device's processes are held to its CPU share and memory limit (`devices.emulation.limits`:
cgroup when permitted, else a SIGSTOP/SIGCONT duty-cycle supervisor and RLIMIT_AS).
When the block asks for ``delay_ms`` / ``rate_kbit`` and we run as root, an SSH device's
sshd runs in its own network namespace behind a veth pair shaped by netem, and a small
forwarder (``python -m devices.emulation.emulate forward``) keeps the fleet file's address
(``host:port``) working: traffic crosses the shaped veth.

An SSH device with ``emulate: {arch: aarch64}`` is the same sshd chrooted into the cached
arm64 Debian tree (`devices.emulation.rootfs`) inside its own mount namespace, run through
qemu-user (`devices.emulation.qemu` says why so). Its system needs are checked first; a missing
one is one line naming the Debian package (or "needs root"), the device is reported as
not started with that reason, and the rest of the fleet still comes up. The first ``up``
builds the tree (about 10 minutes, with progress), later ones reuse it. The device's
mount namespace is recorded, and ``down`` stops every process left in it, so its mounts
end with it.

A device whose ``emulate`` block has a ``power`` block gets a power sensor: a driver
process (``python -m devices.emulation.sensors``, role ``power-sensor``) that keeps the
sensor's files written in their real format below the device's ``power_root`` from the
device's cpu use; ``up`` returns once the first files are there, ``down`` stops it and
removes them. A local device with such a block has its commands carry its marker
(`devices.connect.connect`), by which the driver counts their cpu time where no cgroup
says it.

Every started process is recorded in ``<state_dir>/state.json`` (written atomically)
with its pid and its start time from ``/proc/PID/stat``, so ``down`` never signals a
reused pid; cgroup directories and namespaces are recorded too. ``up`` twice is
harmless: a device whose processes live and answer is left alone, a stale entry is
cleaned first. ``down`` leaves no process, cgroup or namespace, and returns only once
every process it stopped has exited (`devices.processes.stop`: SIGTERM, a grace
period, SIGKILL, wait), so ``fleet down && fleet up`` on the same ports does not race.

A device's processes are its recorded processes, their descendants, the members of
its cgroups and every process whose environment holds ``FLEETBENCH_DEVICE=<unit>``
(`MARKER`): the marker is in the environment of everything ``up`` starts for the
device and of every SSH session (authorized_keys ``environment=``), so a command run
on the device that detached itself (``setsid``, ``nohup ... &``) still goes with it,
also where no cgroup holds the device.

The adb server belongs to whoever started it. ``up`` reuses a server that already
listens on the port and never stops it: ``down`` only detaches this fleet's phones
(``host:disconnect``). Requests go over the server's socket (`devices.adb.host_request`),
never through the ``adb`` client, whose version check would restart a server of
another version. Where no server listens, ``up`` starts one as its own child
(``adb nodaemon server``, so the recorded pid is the server's), and ``down`` stops it
by pid unless devices that are not this fleet's phones are attached to it by then
(someone else uses it now: it is left running, and ``down`` says so).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from devices import processes
from devices.emulation import limits, presets, qemu, sensors
from devices.errors import EmulationError, TransportError, Unreachable
from devices.files import atomic_write
from devices.fleet import POWER_DIR, Device, EmulatedPower, Emulation, Fleet
from devices.local import Confinement, LocalTransport
from devices.processes import ProcessRecord

#: State file name inside the fleet's state dir.
STATE_FILE = "state.json"
#: Repository / package root (for ``python -m devices.*`` children).
PACKAGE_ROOT = Path(__file__).resolve().parents[2]
#: Seconds a started server gets to accept connections.
START_TIMEOUT = 15.0
#: Environment variable that marks every process of an emulated device (value: its unit name).
MARKER = "FLEETBENCH_DEVICE"
#: The address ``state.json`` and ``fleet status`` give a local device.
LOCAL_ADDRESS = "this machine"
#: Seconds ``up`` gives a local device's first command under its limits.
LOCAL_CHECK_TIMEOUT = 30.0

Printer = Callable[[str], None]


# ---------------------------------------------------------------------------- records


@dataclass(frozen=True)
class DeviceState:
    """What ``up`` created for one device.

    Attributes
    ----------
    name, kind : str
    address : str
        ``host:port`` the fleet reaches it at.
    processes : tuple of ProcessRecord
    cgroups : tuple of str
        Cgroup directories.
    netns : str or None
        Network namespace (with ``host_if``, the host end of its veth).
    host_if : str or None
    cpu, memory : str
        Limit methods (`devices.emulation.limits.Plan`).
    cpu_share : float or None
    memory_mb : int or None
    shaping : str
        Network shaping, in words (empty when none).
    arch : str or None
        ``aarch64`` for a device run through qemu-user.
    mount_ns : str or None
        Its private mount namespace (``mnt:[N]``), where its mounts live.
    mounts : tuple of str
        The mount points made in that namespace (for ``status`` and ``down``'s check).
    cpuset : str
        How its cpus are pinned (`devices.emulation.limits.Plan.cpuset`): ``cgroup-v1``,
        ``cgroup-v2``, ``affinity`` or ``none``.
    cpus : str or None
        The cpu list it is pinned to (None: every cpu of this machine).
    """

    name: str
    kind: str
    address: str
    processes: tuple[ProcessRecord, ...] = ()
    cgroups: tuple[str, ...] = ()
    netns: str | None = None
    host_if: str | None = None
    cpu: str = "none"
    memory: str = "none"
    cpu_share: float | None = None
    memory_mb: int | None = None
    shaping: str = ""
    arch: str | None = None
    mount_ns: str | None = None
    mounts: tuple[str, ...] = ()
    cpuset: str = "none"
    cpus: str | None = None


@dataclass(frozen=True)
class FleetState:
    """Contents of ``state.json``.

    Attributes
    ----------
    devices : tuple of DeviceState
    adb_server : ProcessRecord or None
        An adb server ``up`` started (stopped by ``down``); None when none was started.
    adb_server_port : int or None
        Port of the adb server the phones were attached to (whoever started it).
    """

    devices: tuple[DeviceState, ...] = ()
    adb_server: ProcessRecord | None = None
    adb_server_port: int | None = None

    def get(self, name: str) -> DeviceState | None:
        """Return the state of device ``name`` (None if absent)."""
        return next((d for d in self.devices if d.name == name), None)

    def with_device(self, dev: DeviceState | None, drop: str | None = None) -> FleetState:
        """Return a copy with ``dev`` added or replaced (and ``drop`` removed)."""
        names = {drop} | ({dev.name} if dev else set())
        kept = tuple(d for d in self.devices if d.name not in names)
        return FleetState(kept + ((dev,) if dev else ()), self.adb_server, self.adb_server_port)


@dataclass(frozen=True)
class DeviceStatus:
    """One row of ``fleet status``.

    Attributes
    ----------
    name, kind, address : str
    up : bool
        Its recorded processes live.
    answers : bool
        It completed a round trip (SSH: ``true`` ran; ADB: CNXN handshake).
    detail : str
        Limits, or why it does not answer.
    """

    name: str
    kind: str
    address: str
    up: bool
    answers: bool
    detail: str = ""


def state_to_json(state: FleetState) -> str:
    """Serialise ``state`` as JSON text."""
    return json.dumps(asdict(state), indent=2, sort_keys=True) + "\n"


def state_from_json(text: str) -> FleetState:
    """Parse ``state.json`` text (see `state_to_json`)."""
    raw = json.loads(text)

    def proc(d: dict[str, object]) -> ProcessRecord:
        return ProcessRecord(str(d["role"]), int(d["pid"]), d.get("start_time"))  # type: ignore[call-overload,arg-type]

    devices = []
    for d in raw.get("devices", []):
        devices.append(
            DeviceState(
                name=d["name"],
                kind=d["kind"],
                address=d["address"],
                processes=tuple(proc(p) for p in d.get("processes", [])),
                cgroups=tuple(d.get("cgroups", [])),
                netns=d.get("netns"),
                host_if=d.get("host_if"),
                cpu=d.get("cpu", "none"),
                memory=d.get("memory", "none"),
                cpu_share=d.get("cpu_share"),
                memory_mb=d.get("memory_mb"),
                shaping=d.get("shaping", ""),
                arch=d.get("arch"),
                mount_ns=d.get("mount_ns"),
                mounts=tuple(d.get("mounts", [])),
                cpuset=d.get("cpuset", "none"),
                cpus=d.get("cpus"),
            )
        )
    server = raw.get("adb_server")
    return FleetState(tuple(devices), proc(server) if server else None, raw.get("adb_server_port"))


def load_state(state_dir: Path) -> FleetState:
    """Read ``<state_dir>/state.json`` (an empty state when absent or unreadable)."""
    try:
        return state_from_json((Path(state_dir) / STATE_FILE).read_text())
    except (OSError, ValueError, KeyError, TypeError):
        return FleetState()


def save_state(state_dir: Path, state: FleetState) -> None:
    """Write ``<state_dir>/state.json`` atomically (removed when ``state`` is empty)."""
    path = Path(state_dir) / STATE_FILE
    if not state.devices and state.adb_server is None:
        path.unlink(missing_ok=True)
        return
    atomic_write(path, state_to_json(state))


# ---------------------------------------------------------------------------- helpers


def emulated(fleet: Fleet) -> list[Device]:
    """Return the devices of ``fleet`` that have an ``emulate`` block."""
    return [d for d in fleet.devices if d.emulate is not None]


def address_of(device: Device) -> tuple[str, int]:
    """Return ``(host, port)`` where the fleet reaches emulated ``device``."""
    if device.kind == "adb":
        host, _, port = (device.serial or "").rpartition(":")
        return host or "127.0.0.1", int(port)
    return device.host or "127.0.0.1", int(device.port or 22)


def wants_netns(emulation: Emulation, device: Device, is_root: bool) -> bool:
    """Whether ``device`` gets a shaped network namespace (SSH, root, delay or rate asked)."""
    return device.kind == "ssh" and is_root and bool(emulation.delay_ms or emulation.rate_kbit)


def _wait_port(host: str, port: int, proc: subprocess.Popen[bytes] | None, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise EmulationError(f"{what} exited with status {proc.returncode}")
        try:
            with socket.create_connection((host, port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise EmulationError(f"{what} did not accept on {host}:{port} within {timeout:g} s")


def stop_device_processes(recs: Sequence[ProcessRecord], unit: str, cgroups: Sequence[str] = ()) -> list[int]:
    """Stop a device's processes (see the module docstring) and return once they have exited.

    Parameters
    ----------
    recs : sequence of ProcessRecord
        What ``up`` recorded for the device.
    unit : str
        The device's unit name (`devices.emulation.limits.unit_name`): its `MARKER` value.
    cgroups : sequence of str
        The device's cgroup directories.

    Returns
    -------
    list of int
        Pids that still run (empty on success).
    """
    supervisors = [rec for rec in recs if rec.role == "duty-cycle"]  # first: they stop the tree again
    left = processes.stop(supervisors)
    return left + processes.stop(recs, also=lambda: limits.cgroup_pids(cgroups) + processes.marked(MARKER, unit))


def _plan_for(unit: str, emulation: Emulation) -> limits.Plan:
    """Plan limits; create cgroups, falling back to duty cycle / rlimit / affinity when refused."""
    cpus = None
    if emulation.cpus is not None:
        cpus = limits.parse_cpu_list(emulation.cpus)
        available = frozenset(os.sched_getaffinity(0))
        if not cpus <= available:
            raise EmulationError(
                f"emulate.cpus {emulation.cpus}: this machine offers cpus {limits.format_cpu_list(available)}"
            )
    wanted = limits.plan(limits.detect(), unit, emulation.cpu_share, emulation.memory_mb, cpus)
    try:
        limits.apply_cgroups(wanted)
        return wanted
    except OSError:
        limits.remove_cgroups(wanted.cgroup_dirs)
        return limits.plan(limits.Support(), unit, emulation.cpu_share, emulation.memory_mb, cpus)


def _pinning(plan: limits.Plan) -> tuple[str, str | None]:
    """Return the ``(method, cpu list)`` a device's state records for its pinning."""
    return plan.cpuset, None if plan.cpus is None else limits.format_cpu_list(plan.cpus)


def _child_env(unit: str) -> dict[str, str]:
    env = dict(os.environ, **{MARKER: unit})
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(PACKAGE_ROOT), env.get("PYTHONPATH", "")) if p)
    return env


def _spawn(argv: list[str], plan: limits.Plan, log: Path, unit: str) -> subprocess.Popen[bytes]:
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as out:
        return subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=limits.preexec(plan),
            env=_child_env(unit),
            cwd=str(PACKAGE_ROOT),
        )


def throttled_by_share(emulation: Emulation, plan: limits.Plan) -> bool:
    """Whether ``emulation``'s CPU share stops the device for part of every period.

    Parameters
    ----------
    emulation : Emulation
    plan : devices.emulation.limits.Plan

    Returns
    -------
    bool
        True when a share is enforced (a cgroup quota or the duty cycle) and is below
        the cpus the device may run on (its pinned cpus, else this process's).
    """
    if emulation.cpu_share is None or plan.cpu == "none":
        return False
    return emulation.cpu_share < len(plan.cpus if plan.cpus is not None else os.sched_getaffinity(0))


def _start_share_helpers(
    procs: list[ProcessRecord], root: int, emulation: Emulation, plan: limits.Plan, unit: str
) -> str:
    """Start the processes ``emulation``'s CPU share needs beside the device's process ``root``.

    The duty-cycle supervisor where no cgroup enforces the share; for a device the share
    stops for part of every period, the hold that keeps idle cpus polling
    (`devices.emulation.limits.start_latency_hold`). Each is appended to ``procs`` as it starts, so
    a failure after it still stops it. Returns the words the device's ``up`` line ends with.
    """
    if plan.cpu == "duty-cycle" and emulation.cpu_share:
        procs.append(processes.record("duty-cycle", limits.start_duty_cycle(root, emulation.cpu_share).pid))
    return _hold_idle_cpus(procs, emulation, plan, unit)


def _hold_idle_cpus(procs: list[ProcessRecord], emulation: Emulation, plan: limits.Plan, unit: str) -> str:
    """Start the hold that keeps idle cpus polling for a device its share throttles (see `_start_share_helpers`)."""
    if not throttled_by_share(emulation, plan):
        return ""
    proc, reason = limits.start_latency_hold(_child_env(unit))
    if proc is None:
        return f"; idle cpus may halt between its throttled periods, so its steps' CPU time varies more ({reason})"
    procs.append(processes.record("latency-hold", proc.pid))
    return f"; idle cpus poll while it is up (pid {proc.pid})"


def _known_hosts_entry(host: str, port: int, host_pub: Path) -> str:
    key_type, blob = host_pub.read_text().split()[:2]
    name = host if port == 22 else f"[{host}]:{port}"
    return f"{name} {key_type} {blob}"


# ---------------------------------------------------------------------------- one device


def _aarch64_root(fleet: Fleet, device: Device, say: Printer) -> qemu.DeviceRoot:
    """Check the system needs of an aarch64 device and return its root (building the tree once)."""
    from devices.emulation import rootfs

    tree = _aarch64_tree(device, say)
    if problem := rootfs.chroot_problem(tree):
        raise EmulationError(problem)
    return qemu.DeviceRoot(tree, fleet.state_dir / device.name / "rootfs")


def _aarch64_tree(device: Device, say: Printer) -> Path:
    """Check what an aarch64 device needs and return the arm64 tree (built once).

    A phone's shell is the tree's arm64 ``sh`` run through binfmt_misc
    (`devices.emulation.adb_endpoint`): no chroot, so root is needed only to register the binfmt
    entry and build the tree once. An SSH device chroots into it (`_aarch64_root`).
    """
    from devices.emulation import rootfs

    missing = rootfs.check_system(need_debootstrap=rootfs.read_stamp(rootfs.tree_path()) is None)
    for line in missing:
        say(f"{device.name}: {line}")
    if missing:
        raise EmulationError("; ".join(missing))
    try:
        rootfs.ensure_binfmt(say)
        return rootfs.ensure_tree(say=say)
    except rootfs.RootfsError as exc:
        raise EmulationError(str(exc)) from None


def _start_ssh(
    fleet: Fleet,
    device: Device,
    emulation: Emulation,
    plan: limits.Plan,
    say: Printer,
    root: qemu.DeviceRoot | None = None,
) -> DeviceState:
    from devices.emulation import sshd

    host, port = address_of(device)
    unit = limits.unit_name(device.name, fleet.state_dir)
    key_file = device.key_file or fleet.state_dir / "id_ed25519"
    known_hosts = device.known_hosts or fleet.state_dir / "known_hosts"
    sshd.generate_key(Path(key_file), f"fleetbench-{fleet.path.stem}")
    procs: list[ProcessRecord] = []
    netns = host_if = None
    listen_host = host
    shaping: limits.Shaping | None = None
    if wants_netns(emulation, device, os.geteuid() == 0):
        shaping = limits.netns_up(unit, emulation.delay_ms, emulation.rate_kbit)
        netns, listen_host, host_if = shaping.netns, shaping.address, shaping.host_if
    try:
        inst = sshd.prepare(
            fleet.state_dir, device.name, port, chroot=root.tree if root else None,
            session_env={MARKER: unit, **({"QEMU_CPU": qemu.GUEST_CPU} if root else {})},
        )
        sshd.authorize(inst, Path(str(key_file) + ".pub").read_text())
        config = inst.config.read_text().replace(f"ListenAddress {sshd.LOOPBACK}", f"ListenAddress {listen_host}")
        inst.config.write_text(config)
        if os.geteuid() == 0:
            Path("/run/sshd").mkdir(mode=0o755, parents=True, exist_ok=True)
        argv = [sshd.sshd_binary(), "-D", "-f", str(inst.config), "-E", str(inst.log_file)]
        if root is not None:
            argv = qemu.enter_argv(root.tree, root.layer, argv, chroot=False)  # unshare, mount, exec: same pid
        else:
            argv = sshd.without_startup_files(argv, Path.home())
        if netns:
            argv = ["ip", "netns", "exec", netns, *argv]  # ip execs sshd: same pid
        proc = _spawn(argv, plan, inst.directory / "stdout.log", unit)
        procs.append(processes.record("sshd", proc.pid))
        try:
            if netns:
                # the namespace's address is reachable from here through the veth pair
                _wait_port(listen_host, port, proc, START_TIMEOUT, f"sshd of {device.name}")
                delay = shaping.userspace_delay_ms if shaping is not None else None
                fwd = subprocess.Popen(
                    [
                        sys.executable,
                        "-m",
                        "devices.emulation.emulate",
                        "forward",
                        host,
                        str(port),
                        listen_host,
                        str(port),
                        "--delay-ms",
                        repr(float(delay or 0.0)),
                    ],
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                    start_new_session=True,
                    env=_child_env(unit),
                    cwd=str(PACKAGE_ROOT),
                )
                procs.append(processes.record("forwarder", fwd.pid))
                _wait_port(host, port, fwd, START_TIMEOUT, f"forwarder of {device.name}")
            else:
                _wait_port(host, port, proc, START_TIMEOUT, f"sshd of {device.name}")
        except EmulationError as exc:
            raise EmulationError(f"{exc}; log: {inst.log_file}") from None
        idle = _start_share_helpers(procs, proc.pid, emulation, plan, unit)
        entries = [_known_hosts_entry(host, port, inst.host_key.with_name(inst.host_key.name + ".pub"))]
        sshd.write_known_hosts(Path(known_hosts), entries)
        mount_ns = qemu.mount_namespace(proc.pid) if root is not None else None
    except BaseException:
        stop_device_processes(procs, unit, tuple(map(str, plan.cgroup_dirs)))
        if netns:
            limits.netns_down(netns, host_if)
        raise
    isa = f", {emulation.arch} userland {root.tree} through qemu-user" if root is not None else ""
    limited = _limits_text(plan, shaping, emulation) + idle
    say(f"{device.name}: sshd on {host}:{port} (pid {procs[0].pid}{isa}); {limited}")
    return DeviceState(
        device.name,
        "ssh",
        f"{host}:{port}",
        tuple(procs),
        tuple(map(str, plan.cgroup_dirs)),
        netns,
        host_if,
        plan.cpu,
        plan.memory,
        emulation.cpu_share,
        emulation.memory_mb,
        _shaping_text(shaping, emulation),
        emulation.arch,
        mount_ns,
        tuple(m.target for m in qemu.mount_plan(root.tree, root.layer, qemu.host_network_files())) if root else (),
        *_pinning(plan),
    )


def _shaping_text(shaping: limits.Shaping | None, emulation: Emulation) -> str:
    if shaping is None:
        if emulation.delay_ms or emulation.rate_kbit:
            return "network shaping skipped (needs root and an SSH device)"
        return ""
    parts = []
    if emulation.delay_ms:
        where = "forwarder, no netem in kernel" if shaping.userspace_delay_ms else shaping.qdisc
        parts.append(f"delay {emulation.delay_ms:g} ms each way ({where})")
    if emulation.rate_kbit:
        parts.append(f"rate {emulation.rate_kbit} kbit/s ({shaping.qdisc})")
    return f"netns {shaping.netns} at {shaping.address}: " + ", ".join(parts)


def _limits_text(plan: limits.Plan, shaping: limits.Shaping | None, emulation: Emulation) -> str:
    parts = []
    if plan.cpu_share is not None:
        parts.append(f"cpu {plan.cpu_share:g} core ({plan.cpu})")
    if plan.memory_mb is not None:
        parts.append(f"memory {plan.memory_mb} MB ({plan.memory})")
    if plan.cpus is not None:
        parts.append(f"pinned to cpus {limits.format_cpu_list(plan.cpus)} ({plan.cpuset})")
    if text := _shaping_text(shaping, emulation):
        parts.append(text)
    return ", ".join(parts) or "no limits"


def adb_server_port() -> int:
    """Return the adb server port this process uses (``ANDROID_ADB_SERVER_PORT``, else 5037)."""
    try:
        return int(os.environ.get("ANDROID_ADB_SERVER_PORT", "5037"))
    except ValueError:
        return 5037


def _listening(port: int, host: str = "127.0.0.1") -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


def start_adb_server(port: int, log: Path) -> ProcessRecord:
    """Start an adb server on 127.0.0.1:``port`` as a child of this process and wait until it listens.

    ``adb nodaemon server`` stays in the foreground, so the recorded pid is the server's
    own (``adb start-server`` forks it off and leaves its pid unknown).

    Parameters
    ----------
    port : int
        A port no server listens on.
    log : pathlib.Path
        The server's log (appended to).

    Returns
    -------
    devices.processes.ProcessRecord
        Role ``adb-server``; stop it with `devices.processes.stop`.

    Raises
    ------
    EmulationError
        If it exits (e.g. the port was taken meanwhile) or does not listen in time.
    """
    adb = shutil.which("adb")
    if adb is None:
        raise EmulationError("adb is not installed (Debian: apt-get install adb)")
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            [adb, "-P", str(port), "nodaemon", "server"],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env=dict(os.environ, ANDROID_ADB_SERVER_PORT=str(port)),
        )
    rec = processes.record("adb-server", proc.pid)
    try:
        _wait_port("127.0.0.1", port, proc, START_TIMEOUT, f"adb server on port {port}")
    except EmulationError as exc:
        processes.stop([rec])
        raise EmulationError(f"{exc}; log: {log}") from None
    return rec


def _ensure_adb_server(state: FleetState, state_dir: Path, say: Printer) -> FleetState:
    """Reuse the adb server on our port, or start one (recorded as ours); return the updated state."""
    if state.adb_server is not None and processes.running(state.adb_server):
        return state  # ours, from an earlier `up` (its port may differ from today's environment)
    port = adb_server_port()
    if not _listening(port):
        try:
            rec = start_adb_server(port, state_dir / "adb-server.log")
        except EmulationError:
            if not _listening(port):  # else another server won the race for the port: reuse it
                raise
        else:
            say(f"adb server started on port {port} (pid {rec.pid})")
            return FleetState(state.devices, rec, port)
    if state.adb_server_port != port:
        say(f"adb server on port {port}: not started by fleetbench, reused and left running")
    return FleetState(state.devices, None, port)


def _start_adb(
    fleet: Fleet, device: Device, emulation: Emulation, plan: limits.Plan, say: Printer, tree: Path | None = None
) -> DeviceState:
    host, port = address_of(device)
    unit = limits.unit_name(device.name, fleet.state_dir)
    directory = fleet.state_dir / device.name
    sandbox = directory / "sandbox"
    sandbox.mkdir(parents=True, exist_ok=True)
    argv = [
        sys.executable,
        "-m",
        "devices.emulation.adb_endpoint",
        "--port",
        str(port),
        "--sandbox",
        str(sandbox),
        "--pidfile",
        str(directory / "endpoint.pid"),
    ]
    if tree is not None and emulation.arch:
        argv += ["--arch", emulation.arch, "--tree", str(tree)]
    proc = _spawn(argv, plan, directory / "endpoint.log", unit)
    procs = [processes.record("adb-endpoint", proc.pid)]
    try:
        try:
            _wait_port(host, port, proc, START_TIMEOUT, f"adb endpoint of {device.name}")
        except EmulationError as exc:
            raise EmulationError(f"{exc}; log: {directory / 'endpoint.log'}") from None
        idle = _start_share_helpers(procs, proc.pid, emulation, plan, unit)
    except BaseException:
        stop_device_processes(procs, unit, tuple(map(str, plan.cgroup_dirs)))
        raise
    isa = f", {emulation.arch} shell from {tree} through qemu-user" if tree is not None else ""
    limited = _limits_text(plan, None, emulation) + idle
    say(f"{device.name}: adb endpoint on {host}:{port} (pid {proc.pid}{isa}); {limited}")
    cpuset, cpus = _pinning(plan)
    return DeviceState(
        device.name,
        "adb",
        f"{host}:{port}",
        tuple(procs),
        tuple(map(str, plan.cgroup_dirs)),
        None,
        None,
        plan.cpu,
        plan.memory,
        emulation.cpu_share,
        emulation.memory_mb,
        "",
        emulation.arch if tree is not None else None,
        cpuset=cpuset,
        cpus=cpus,
    )


def _start_local(fleet: Fleet, device: Device, emulation: Emulation, plan: limits.Plan, say: Printer) -> DeviceState:
    """Put a local device's limits in place (``plan``'s cgroups exist already) and check a command enters them.

    Nothing runs for the device between its commands but the hold that keeps idle cpus
    polling where its share throttles it; each command enters the limits as it starts
    (`local_confinement`).
    """
    unit = limits.unit_name(device.name, fleet.state_dir)
    procs: list[ProcessRecord] = []
    try:
        idle = _hold_idle_cpus(procs, emulation, plan, unit)
        check = LocalTransport(confine=lambda: Confinement(plan, {MARKER: unit}))
        try:
            result = check.run(["true"], timeout=LOCAL_CHECK_TIMEOUT)
        except TransportError as exc:
            raise EmulationError(f"a command cannot start under its limits: {exc}") from None
        if not result.ok:
            raise EmulationError(f"`true` under its limits exited with status {result.rc}: {result.stderr.strip()}")
    except BaseException:
        stop_device_processes(procs, unit, tuple(map(str, plan.cgroup_dirs)))
        raise
    say(f"{device.name}: local device, its commands start under {_limits_text(plan, None, emulation)}{idle}")
    cpuset, cpus = _pinning(plan)
    return DeviceState(
        device.name,
        "local",
        LOCAL_ADDRESS,
        tuple(procs),
        tuple(map(str, plan.cgroup_dirs)),
        cpu=plan.cpu,
        memory=plan.memory,
        cpu_share=emulation.cpu_share,
        memory_mb=emulation.memory_mb,
        cpuset=cpuset,
        cpus=cpus,
    )


def _start_sensor(fleet: Fleet, device: Device, power: EmulatedPower, dev: DeviceState, say: Printer) -> DeviceState:
    """Start the driver of ``device``'s emulated power sensor (`devices.emulation.sensors`) and record it in ``dev``.

    Returns once the driver has written the sensor's files (below ``device.power_root``), so
    a probe right after ``up`` finds them. The driver runs beside the device, outside its
    limits, and carries its marker (so ``down`` finds it whatever the state file says).
    """
    unit = limits.unit_name(device.name, fleet.state_dir)
    root = Path(device.power_root)
    shutil.rmtree(root, ignore_errors=True)  # values an earlier driver left
    log = fleet.state_dir / device.name / "power-sensor.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, "-m", "devices.emulation.sensors"]
    argv += sensors.driver_argv(root, power, MARKER, unit, dev.cgroups)
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env=_child_env(unit),
            cwd=str(PACKAGE_ROOT),
        )
    rec = processes.record("power-sensor", proc.pid)
    deadline = time.monotonic() + START_TIMEOUT
    while not (root / sensors.EMULATED_MARK).is_file():
        if proc.poll() is not None or time.monotonic() > deadline:
            processes.stop([rec])
            raise EmulationError(f"its power sensor's driver wrote no files within {START_TIMEOUT:g} s; log: {log}")
        time.sleep(0.05)
    say(
        f"  {device.name}: emulated {power.format} power sensor in {root} (pid {proc.pid}): "
        f"{power.idle_w:g} W idle + {power.busy_core_w:g} W per busy core"
    )
    return replace(dev, processes=(*dev.processes, rec))


def _local_limits_live(dev: DeviceState) -> bool:
    """Whether a local device's recorded limits are all in place (cgroups present, helpers running)."""
    return all(Path(d).is_dir() for d in dev.cgroups) and all(processes.running(r) for r in dev.processes)


def local_confinement(device: Device) -> Confinement:
    """Return the limits every command of local ``device`` starts under, as ``fleet up`` applied them.

    Read from the fleet's state each time, so a command never starts under limits that
    are gone or that the fleet file no longer asks for.

    Parameters
    ----------
    device : Device
        A ``local`` device with an ``emulate`` block (and so a ``state_dir``).

    Returns
    -------
    devices.local.Confinement
        Its cgroups, memory and cpu methods, and the device's `MARKER` for the
        command's environment.

    Raises
    ------
    devices.errors.Unreachable
        If the device is not up (``fleet up`` recorded nothing, or its cgroups are
        gone) or was brought up with other limits than its ``emulate`` block now asks.
    ValueError
        If ``device`` is not a local device with an ``emulate`` block.
    """
    if device.kind != "local" or device.emulate is None or device.state_dir is None:
        raise ValueError(f"device {device.name!r} is not a local device with an emulate block")
    dev = load_state(device.state_dir).get(device.name)
    up_hint = "run `fleetbench fleet up` on its fleet file"
    if dev is None or dev.kind != "local":
        raise Unreachable(
            f"local device {device.name!r} is not up: its limits are not in place "
            f"(no entry in {device.state_dir / STATE_FILE}); {up_hint}"
        )
    gone = [d for d in dev.cgroups if not Path(d).is_dir()]
    if gone:
        raise Unreachable(f"local device {device.name!r}: its cgroup {gone[0]} is gone; {up_hint} again")
    wanted = presets.resolve(device.emulate)
    applied = (dev.cpu_share, dev.memory_mb, dev.cpus)
    asked = (wanted.cpu_share, wanted.memory_mb, wanted.cpus)
    if applied != asked:
        raise Unreachable(
            f"local device {device.name!r} was brought up with cpu share, memory, cpus {applied}, "
            f"its emulate block now asks {asked}; run `fleetbench fleet down` and `fleet up` on its fleet file"
        )
    plan = limits.Plan(
        cpu=dev.cpu,  # type: ignore[arg-type]
        memory=dev.memory,  # type: ignore[arg-type]
        cpu_share=dev.cpu_share,
        memory_mb=dev.memory_mb,
        cgroup_dirs=tuple(Path(d) for d in dev.cgroups),
        cpuset=dev.cpuset,  # type: ignore[arg-type]
        cpus=limits.parse_cpu_list(dev.cpus) if dev.cpus else None,
    )
    return Confinement(plan, {MARKER: limits.unit_name(device.name, device.state_dir)})


def _adb_connect(address: str, port: int, say: Printer) -> None:
    from devices.adb import host_request
    from devices.errors import TransportError

    try:
        text = host_request(port, f"host:connect:{address}", timeout=20.0).strip()
    except TransportError as exc:
        raise EmulationError(f"adb connect {address}: {exc}") from None
    if "connected" not in text or "cannot" in text or "failed" in text:
        raise EmulationError(f"adb connect {address}: {text}")
    say(f"  adb connect {address}: {text}")


def _adb_disconnect(address: str, port: int) -> None:
    from devices.adb import host_request
    from devices.errors import TransportError

    if _listening(port):
        with contextlib.suppress(TransportError):  # not attached (any more): nothing to undo
            host_request(port, f"host:disconnect:{address}")


def _cleanup_device(dev: DeviceState, state_dir: Path, adb_port: int | None) -> list[str]:
    """Stop ``dev``'s processes and remove its cgroups and namespace; return problems."""
    if dev.kind == "adb" and adb_port is not None:
        _adb_disconnect(dev.address, adb_port)
    left = stop_device_processes(dev.processes, limits.unit_name(dev.name, state_dir), dev.cgroups)
    problems = [f"pid {pid} still runs" for pid in left]
    if dev.mount_ns:
        problems += [f"pid {pid} still runs in {dev.mount_ns}" for pid in qemu.stop_namespace(dev.mount_ns)]
        problems += [f"mount {m} is visible here" for m in dev.mounts if m in qemu.host_mounts_under(Path(m))]
    problems += limits.remove_cgroups(dev.cgroups)
    if any(rec.role == "power-sensor" for rec in dev.processes):
        shutil.rmtree(Path(state_dir) / dev.name / POWER_DIR, ignore_errors=True)  # no stale readings after it
    if dev.netns:
        limits.netns_down(dev.netns, dev.host_if)
        if limits.netns_exists(dev.netns):
            problems.append(f"namespace {dev.netns} remains")
    return problems


def _stop_adb_server(state: FleetState, fleet: Fleet, say: Printer) -> list[str]:
    """Stop the adb server ``up`` started, unless devices other than this fleet's phones are attached."""
    from devices.adb import attached
    from devices.errors import TransportError

    rec, port = state.adb_server, state.adb_server_port or adb_server_port()
    if rec is None or not processes.running(rec):
        return []
    ours = {f"{host}:{p}" for host, p in (address_of(d) for d in emulated(fleet) if d.kind == "adb")}
    try:
        others = sorted(set(attached(port)) - ours)
    except TransportError:
        others = []
    if others:
        say(f"adb server on port {port} (pid {rec.pid}) left running: {', '.join(others)} attached")
        return []
    left = processes.stop([rec])
    say(f"adb server on port {port}: stopped")
    return [f"adb server pid {pid} still runs" for pid in left]


def _answers(device: Device, timeout: float = 10.0) -> tuple[bool, str]:
    """Whether emulated ``device`` completes a round trip (SSH or local ``true``, under its limits; ADB CNXN)."""
    if device.kind == "local":
        try:
            result = LocalTransport(confine=lambda: local_confinement(device)).run(["true"], timeout=timeout)
        except TransportError as exc:
            return False, str(exc)
        return result.ok, "" if result.ok else f"true exited {result.rc}"
    host, port = address_of(device)
    if device.kind == "ssh":
        from devices.ssh import SSHTransport

        transport = SSHTransport(device, connect_timeout=timeout)
        try:
            result = transport.run(["true"], timeout=timeout)
            return result.ok, "" if result.ok else f"true exited {result.rc}"
        except Exception as exc:  # any transport failure means "does not answer"
            return False, f"{type(exc).__name__}: {exc}"
        finally:
            transport.close()
    return adb_handshake(host, port, timeout)


def adb_handshake(host: str, port: int, timeout: float = 5.0) -> tuple[bool, str]:
    """Send an ADB ``CNXN`` to ``host:port`` and say whether a ``CNXN`` (or ``AUTH``) comes back.

    Returns
    -------
    tuple of (bool, str)
        Success, and the device banner or the failure.
    """
    cnxn, auth = 0x4E584E43, 0x48545541
    payload = b"host::fleetbench\0"
    header = struct.pack(
        "<6I", cnxn, 0x01000000, 256 * 1024, len(payload), sum(payload) & 0xFFFFFFFF, cnxn ^ 0xFFFFFFFF
    )
    try:
        with socket.create_connection((host, port), timeout=timeout) as sock:
            sock.settimeout(timeout)
            sock.sendall(header + payload)
            reply = b""
            while len(reply) < 24:
                chunk = sock.recv(24 - len(reply))
                if not chunk:
                    return False, "connection closed before CNXN"
                reply += chunk
            command, _, _, length, _, _ = struct.unpack("<6I", reply)
            banner = b""
            while len(banner) < min(length, 4096):
                chunk = sock.recv(length - len(banner))
                if not chunk:
                    break
                banner += chunk
    except OSError as exc:
        return False, str(exc)
    if command in (cnxn, auth):
        return True, banner.decode("utf-8", "replace").rstrip("\0")
    return False, f"unexpected reply 0x{command:08x}"


# ---------------------------------------------------------------------------- fleet


@dataclass(frozen=True)
class UpResult:
    """Outcome of `up`: started, already running and failed devices.

    Attributes
    ----------
    started, already_up : tuple of str
    failed : dict of str to str
        Device name -> reason.
    """

    started: tuple[str, ...] = ()
    already_up: tuple[str, ...] = ()
    failed: dict[str, str] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        """Whether every emulated device is up."""
        return not self.failed


#: The shipped example fleet: fast / mid / slow SSH devices and a phone.
EXAMPLE_FLEET = Path(__file__).resolve().parents[1] / "fleets" / "emulated.yaml"


def write_example_fleet(directory: Path, port_for: Callable[[], int]) -> Path:
    """Write the example emulated fleet into ``directory`` with its own ports and state dir.

    Parameters
    ----------
    directory : pathlib.Path
        Where ``fleet.yaml`` and the fleet's ``state/`` directory go.
    port_for : callable
        Returns a free loopback port (`devices.emulation.sshd.free_port`); called until each device
        has its own port, none of them the adb server's (`adb_server_port`; see
        `devices.emulation.sshd.distinct_port`).

    Returns
    -------
    pathlib.Path
        The written fleet file. A ``cpus:`` pin naming a cpu this machine does not offer
        is left out (the device then shares every cpu and is measured alone), so the
        example runs on a single-cpu machine too.

    Raises
    ------
    EmulationError
        ``port_for`` kept returning ports already given out.
    """
    from devices.emulation.sshd import distinct_port

    text = EXAMPLE_FLEET.read_text()
    taken = {adb_server_port()}

    def fresh_port() -> int:
        try:
            return distinct_port(port_for, taken)
        except OSError as exc:
            raise EmulationError(f"no port for the example fleet: {exc}") from None

    text = _drop_unavailable_pins(text)
    text = re.sub(r"port: \d+", lambda _: f"port: {fresh_port()}", text)
    text = re.sub(r"serial: 127\.0\.0\.1:\d+", lambda _: f"serial: 127.0.0.1:{fresh_port()}", text)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "fleet.yaml"
    path.write_text(f"state_dir: {directory / 'state'}\n" + text)
    return path


def _drop_unavailable_pins(text: str) -> str:
    """Remove the ``cpus: "..."`` lines of a fleet text that name a cpu this machine does not offer."""
    available = frozenset(os.sched_getaffinity(0))

    def pin(match: re.Match[str]) -> str:
        return match.group(0) if limits.parse_cpu_list(match.group(2)) <= available else ""

    return re.sub(r'(\n\s+cpus: "([^"]+)")', pin, text)


#: The shipped local fleet: the example fleet's fast / mid / slow as local devices.
LOCAL_FLEET = EXAMPLE_FLEET.with_name("emulated-local.yaml")


def write_local_fleet(directory: Path) -> Path:
    """Write the local fleet (`LOCAL_FLEET`) into ``directory`` with its own state dir.

    Its devices ``fast``, ``mid`` and ``slow`` are local (no sshd) with the CPU shares,
    memory limits and cpu pins of the example fleet's devices of those names, so they
    differ as those do once ``fleet up`` has put the limits in place (`up`; `down`
    removes them).

    Parameters
    ----------
    directory : pathlib.Path
        Where ``fleet.yaml`` and the fleet's ``state/`` directory go (the devices'
        workdirs lie under ``state/``).

    Returns
    -------
    pathlib.Path
        The written fleet file. A ``cpus:`` pin naming a cpu this machine does not offer
        is left out, as in `write_example_fleet`.
    """
    text = _drop_unavailable_pins(LOCAL_FLEET.read_text())
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "fleet.yaml"
    path.write_text("state_dir: state  # beside this file\n" + text)
    return path


def up(fleet: Fleet, say: Printer = print) -> UpResult:
    """Start every emulated device of ``fleet`` (devices already up and answering are kept).

    Parameters
    ----------
    fleet : Fleet
    say : callable
        Receives one progress line per step.

    Returns
    -------
    UpResult
        One failing device never stops the others.
    """
    fleet.state_dir.mkdir(parents=True, exist_ok=True)
    state = load_state(fleet.state_dir)
    started: list[str] = []
    already: list[str] = []
    failed: dict[str, str] = {}
    for device in fleet.devices:
        if device.emulate is None:
            continue
        old = state.get(device.name)
        if old is not None:
            if all(processes.running(r) for r in old.processes):
                # A device whose processes all run is kept even when it is too busy to answer
                # at once: a campaign or FL round may be running on it, under its CPU share.
                answers, why = _answers(device, 5.0)
                say(f"{device.name}: already up at {old.address}"
                    + ("" if answers else f" (busy: no answer within 5 s: {why}; `fleet down` stops it)"))
                if device.emulate.power is not None and all(r.role != "power-sensor" for r in old.processes):
                    say(f"  {device.name}: up without its power sensor; `fleet down` and `fleet up` start it")
                already.append(device.name)
                continue
            say(f"{device.name}: cleaning a stale entry")
            _cleanup_device(old, fleet.state_dir, state.adb_server_port)
            state = state.with_device(None, drop=device.name)
            save_state(fleet.state_dir, state)
        try:
            if device.kind != "local":
                host, port = address_of(device)
                if _listening(port, host):
                    raise EmulationError(f"{host}:{port} is already in use by a process this fleet did not start")
            emulation = presets.resolve(device.emulate)
            plan = _plan_for(limits.unit_name(device.name, fleet.state_dir), emulation)
            try:
                if device.kind == "local":
                    dev = _start_local(fleet, device, emulation, plan, say)
                elif device.kind == "ssh":
                    root = _aarch64_root(fleet, device, say) if emulation.arch else None
                    dev = _start_ssh(fleet, device, emulation, plan, say, root)
                elif device.kind == "adb":
                    tree = _aarch64_tree(device, say) if emulation.arch else None
                    dev = _start_adb(fleet, device, emulation, plan, say, tree)
                else:
                    raise EmulationError(f"kind {device.kind!r} cannot be emulated")
            except BaseException:
                limits.remove_cgroups(plan.cgroup_dirs)
                raise
            if emulation.power is not None:
                try:
                    dev = _start_sensor(fleet, device, emulation.power, dev, say)
                except BaseException:
                    _cleanup_device(dev, fleet.state_dir, state.adb_server_port)
                    raise
            state = state.with_device(dev)
            save_state(fleet.state_dir, state)
            if device.kind == "adb" and shutil.which("adb"):
                state = _ensure_adb_server(state, fleet.state_dir, say)
                save_state(fleet.state_dir, state)
                _adb_connect(dev.address, state.adb_server_port or adb_server_port(), say)
            elif device.kind == "adb":
                say(f"  adb is not installed: {dev.address} is not attached to an adb server")
            started.append(device.name)
        except Exception as exc:
            failed[device.name] = str(exc)
            say(f"{device.name}: FAILED: {exc}")
    return UpResult(tuple(started), tuple(already), failed)


def down(fleet: Fleet, say: Printer = print) -> list[str]:
    """Stop every device ``up`` recorded for ``fleet`` and remove what it created.

    Returns once every stopped process has exited. Also removes leftovers of a crashed
    ``up`` that never reached the state file (processes carrying a device's `MARKER`,
    ``fleetbench/<name>`` cgroups, ``fb-<name>`` namespaces of the fleet's devices). The
    adb server ``up`` started is stopped unless other devices are attached to it.

    Returns
    -------
    list of str
        Problems (empty when everything is gone).
    """
    state = load_state(fleet.state_dir)
    problems: list[str] = []
    for dev in state.devices:
        found = _cleanup_device(dev, fleet.state_dir, state.adb_server_port)
        problems += [f"{dev.name}: {p}" for p in found]
        say(f"{dev.name}: down" + (f" ({'; '.join(found)})" if found else ""))
    support = limits.detect()
    for device in emulated(fleet):
        unit = limits.unit_name(device.name, fleet.state_dir)
        left = stop_device_processes((), unit)
        problems += [f"{device.name}: pid {pid} still runs" for pid in left]
        parents = (support.cpu_parent, support.memory_parent, support.cpuset_parent)
        leftovers = [p / limits.GROUP / unit for p in parents if p]
        problems += limits.remove_cgroups(leftovers)
        ns = limits.netns_name(unit)
        if limits.netns_exists(ns):
            limits.netns_down(ns)
    problems += _stop_adb_server(state, fleet, say)
    save_state(fleet.state_dir, FleetState())
    return problems


def status(fleet: Fleet, timeout: float = 10.0) -> list[DeviceStatus]:
    """Say, per emulated device of ``fleet``, whether it is up and answers.

    Returns
    -------
    list of DeviceStatus
    """
    state = load_state(fleet.state_dir)
    rows = []
    for device in emulated(fleet):
        dev = state.get(device.name)
        if device.kind == "local":
            address = LOCAL_ADDRESS
            is_up = dev is not None and _local_limits_live(dev)
        else:
            host, port = address_of(device)
            address = f"{host}:{port}"
            is_up = dev is not None and bool(dev.processes) and all(processes.running(r) for r in dev.processes)
        answers, why = _answers(device, timeout)
        if answers and dev is not None:
            cpu = f"cpu {dev.cpu_share:g} ({dev.cpu})" if dev.cpu_share is not None else "cpu unlimited"
            mem = f"memory {dev.memory_mb} MB ({dev.memory})" if dev.memory_mb is not None else "memory unlimited"
            detail = f"{cpu}, {mem}" + (f"; {dev.shaping}" if dev.shaping else "")
            detail += f"; cpus {dev.cpus} ({dev.cpuset})" if dev.cpus else ""
            detail += f"; {dev.arch} under qemu-user (emulated ISA)" if dev.arch else ""
        else:
            detail = why if answers is False else ""
        rows.append(DeviceStatus(device.name, device.kind, address, is_up, answers, detail))
    return rows


def format_status(rows: list[DeviceStatus]) -> str:
    """Return ``rows`` as a fixed-width text table."""
    head = ("DEVICE", "KIND", "ADDRESS", "STATE", "ANSWERS", "DETAIL")
    body = [(r.name, r.kind, r.address, "up" if r.up else "down", "yes" if r.answers else "no", r.detail) for r in rows]
    widths = [max(len(str(row[i])) for row in [head, *body]) for i in range(len(head) - 1)]
    lines = []
    for row in [head, *body]:
        lines.append("  ".join(str(v).ljust(w) for v, w in zip(row[:-1], widths, strict=True)) + "  " + row[-1])
    return "\n".join(line.rstrip() for line in lines)


# ---------------------------------------------------------------------------- CLI


def _sshd_missing(fleet: Fleet) -> bool:
    from devices.emulation import sshd

    if not any(d.kind == "ssh" for d in emulated(fleet)):
        return False
    try:
        sshd.sshd_binary()
        return False
    except sshd.SshdError:
        return True


def _load(args: argparse.Namespace) -> Fleet:
    from devices.fleetfile import load_fleet

    return load_fleet(args.file)


def cmd_up(args: argparse.Namespace) -> int:
    """``fleetbench fleet up FILE``: start the emulated devices; exit 1 if any failed."""
    fleet = _load(args)
    if not emulated(fleet):
        print(f"{args.file}: no device has an emulate block; nothing to start")
        return 0
    if _sshd_missing(fleet):
        print(
            "sshd is not installed (Debian: apt-get install openssh-server): the emulated SSH devices "
            "cannot start; use local devices instead (e.g. devices/fleets/local.yaml)",
            file=sys.stderr,
        )
        return 1
    result = up(fleet, say=lambda line: print(line, flush=True))
    print(
        f"{len(result.started)} started, {len(result.already_up)} already up, {len(result.failed)} failed "
        f"(state: {fleet.state_dir / STATE_FILE})"
    )
    return 0 if result.ok else 1


def cmd_down(args: argparse.Namespace) -> int:
    """``fleetbench fleet down FILE``: stop the emulated devices; exit 1 if anything remains."""
    fleet = _load(args)
    problems = down(fleet, say=lambda line: print(line, flush=True))
    for problem in problems:
        print(f"left behind: {problem}", file=sys.stderr)
    return 1 if problems else 0


def cmd_status(args: argparse.Namespace) -> int:
    """``fleetbench fleet status FILE``: print the table; exit 0 when every device answers."""
    fleet = _load(args)
    rows = status(fleet)
    print(format_status(rows))
    return 0 if rows and all(r.answers for r in rows) else 1


# ---------------------------------------------------------------------------- forwarder


def _pump(src: socket.socket, dst: socket.socket, delay: float) -> None:
    """Copy ``src`` to ``dst``; with ``delay`` > 0 every chunk leaves ``delay`` seconds after it came."""
    line: list[tuple[float, bytes]] = []
    cond = threading.Condition()
    done = {"eof": False}

    def sender() -> None:
        try:
            while True:
                with cond:
                    while not line and not done["eof"]:
                        cond.wait()
                    if not line:
                        break
                    due, data = line.pop(0)
                wait = due - time.monotonic()
                if wait > 0:
                    time.sleep(wait)
                dst.sendall(data)
        except OSError:
            pass
        finally:
            with contextlib.suppress(OSError):
                dst.shutdown(socket.SHUT_WR)

    out = threading.Thread(target=sender, daemon=True)
    out.start()
    try:
        while True:
            data = src.recv(65536)
            if not data:
                break
            with cond:
                line.append((time.monotonic() + delay, data))
                cond.notify()
    except OSError:
        pass
    finally:
        with cond:
            done["eof"] = True
            cond.notify()


def forward(listen_host: str, listen_port: int, to_host: str, to_port: int, delay_ms: float = 0.0) -> None:
    """Accept on ``listen_host:listen_port`` and relay each connection to ``to_host:to_port``.

    Parameters
    ----------
    listen_host, listen_port : str, int
        Where the fleet reaches the device.
    to_host, to_port : str, int
        The device inside its namespace.
    delay_ms : float
        One-way delay added in each direction (a delay line; throughput is not cut),
        for kernels without the netem qdisc.
    """
    server = socket.create_server((listen_host, listen_port))
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    delay = max(0.0, delay_ms) / 1000.0
    while True:
        client, _ = server.accept()
        try:
            upstream = socket.create_connection((to_host, to_port), timeout=10)
            upstream.settimeout(None)
        except OSError:
            client.close()
            continue
        for a, b in ((client, upstream), (upstream, client)):
            threading.Thread(target=_pump, args=(a, b, delay), daemon=True).start()


def main(argv: list[str] | None = None) -> int:
    """``python -m devices.emulation.emulate forward LISTEN_HOST LISTEN_PORT TO_HOST TO_PORT``."""
    parser = argparse.ArgumentParser(prog="python -m devices.emulation.emulate")
    sub = parser.add_subparsers(dest="command", required=True)
    fwd = sub.add_parser("forward", help="relay TCP connections (into a device's namespace)")
    fwd.add_argument("listen_host")
    fwd.add_argument("listen_port", type=int)
    fwd.add_argument("to_host")
    fwd.add_argument("to_port", type=int)
    fwd.add_argument("--delay-ms", type=float, default=0.0, help="one-way delay added in each direction")
    args = parser.parse_args(argv)
    forward(args.listen_host, args.listen_port, args.to_host, args.to_port, args.delay_ms)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
