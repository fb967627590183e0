"""Fleet records: what a fleet file describes, validated and frozen.

`devices.fleetfile.load_fleet` turns a YAML fleet file into these records; every
other part of fleetbench takes them as given.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

#: Kinds of device a fleet file may list.
DeviceKind = Literal["local", "ssh", "adb"]


#: The directory, under an emulated device's ``<state_dir>/<name>/``, of its power sensor's files.
POWER_DIR = "power"
#: Formats an emulated power sensor may be written in (`devices.emulation.sensors`).
POWER_FORMATS = ("ina3221-hwmon", "power-supply", "rapl")


@dataclass(frozen=True)
class EmulatedPower:
    """An emulated device's power sensor (``emulate: {power: ...}``).

    Attributes
    ----------
    format : {"ina3221-hwmon", "power-supply", "rapl"}
        The real format its files are written in (`POWER_FORMATS`).
    idle_w : float
        Watts the device draws with no busy cpu.
    busy_core_w : float
        Watts each fully busy core adds: the device draws ``idle_w + busy_core_w * busy cores``.
    """

    format: str
    idle_w: float
    busy_core_w: float


@dataclass(frozen=True)
class Emulation:
    """How an emulated device is held back on this machine (``emulate:`` block).

    Attributes
    ----------
    preset : str or None
        ``pi3``, ``pi4``, ``jetson-nano`` or ``phone-midrange``; its values fill the
        fields the block leaves out.
    cpu_share : float or None
        Fraction of one CPU core the device's processes may use (0 < share <= cores).
    memory_mb : int or None
        Memory limit of the device's processes.
    delay_ms : float or None
        One-way network delay (tc netem, root only).
    rate_kbit : int or None
        Network rate limit in kbit/s (tc netem, root only).
    arch : str or None
        ``aarch64``: the device runs an arm64 Debian userland through qemu-user
        (`devices.emulation.qemu`); None: the host's own architecture.
    cpus : str or None
        The host cpus the device's processes are pinned to, as a Linux cpu list
        (``"0"``, ``"2-3"``, ``"0,2"``; normalised by `devices.emulation.limits.format_cpu_list`):
        a cpuset cgroup when permitted, else the processes' cpu affinity. Devices pinned
        to disjoint cpus may be measured at the same time; None: every cpu of the host.
    power : EmulatedPower or None
        A power sensor whose files ``fleet up`` keeps written from the device's cpu use
        (`devices.emulation.sensors`); None: the device has no emulated sensor.
    """

    preset: str | None = None
    cpu_share: float | None = None
    memory_mb: int | None = None
    delay_ms: float | None = None
    rate_kbit: int | None = None
    arch: str | None = None
    cpus: str | None = None
    power: EmulatedPower | None = None


@dataclass(frozen=True)
class Device:
    """One device of a fleet.

    Attributes
    ----------
    name : str
        Unique name within the fleet; safe as a file name on this machine
        (`devices.fleetfile.check_name`).
    kind : {"local", "ssh", "adb"}
    host, port, user : str, int, str or None
        SSH connection (``host`` may be an alias from the user's ssh config).
    key_file : pathlib.Path or None
        Private key for SSH key authentication.
    known_hosts : pathlib.Path or None
        known_hosts file that SSH host keys are verified against (``~/.ssh/known_hosts``
        when ``None``).
    trust_on_first_use : bool
        Accept and record an unknown host key (a changed key is still refused).
    serial : str or None
        ADB serial (``host:port`` for a network device).
    workdir : str
        Directory on the device where fleetbench keeps its files (may hold spaces and
        quotes; never a ``..`` component, `devices.fleetfile.check_workdir`).
    python : str
        Python interpreter (or runner) path on the device.
    threads : int
        Threads the device's runner may use.
    tags : tuple of str
        Free-form labels, e.g. tier hints.
    emulate : Emulation or None
        Present when ``fleetbench fleet up`` should start (an SSH or ADB device) or
        confine (a local device) this device here.
    line : int
        Line of the device's entry in the fleet file (for messages).
    state_dir : pathlib.Path or None
        The fleet's state dir for a device with an ``emulate`` block (where ``fleet up``
        records what it applied, `devices.emulation.emulate`); None for other devices.
    power_root : str
        The directory, on the device, below which its power-sensor files lie (sysfs paths
        such as ``sys/class/powercap/...``): ``/`` on a real device; for a device with an
        emulated power sensor (``emulate: {power: ...}``) the directory its driver writes
        (`devices.emulation.sensors`).
    """

    name: str
    kind: DeviceKind
    host: str | None = None
    port: int | None = None
    user: str | None = None
    key_file: Path | None = None
    known_hosts: Path | None = None
    trust_on_first_use: bool = False
    serial: str | None = None
    workdir: str = "~/.fleetbench"
    python: str = "python3"
    threads: int = 1
    tags: tuple[str, ...] = ()
    emulate: Emulation | None = None
    line: int = 0
    state_dir: Path | None = None
    power_root: str = "/"


@dataclass(frozen=True)
class Fleet:
    """A validated fleet file.

    Attributes
    ----------
    path : pathlib.Path
        The file it was read from.
    devices : tuple of Device
        In file order; names are unique.
    state_dir : pathlib.Path
        Where ``fleet up`` keeps keys, known_hosts, pids and sandboxes of emulated
        devices (default: ``.fleetbench/<fleet file stem>`` beside the current directory).
    """

    path: Path
    devices: tuple[Device, ...] = field(default=())
    state_dir: Path = Path(".fleetbench")

    def device(self, name: str) -> Device:
        """Return the device called ``name`` (KeyError if absent)."""
        for device in self.devices:
            if device.name == name:
                return device
        raise KeyError(name)
