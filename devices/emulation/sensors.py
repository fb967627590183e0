"""Emulated power sensors: a driver that keeps an emulated device's sensor files written from its cpu use.

A device whose ``emulate`` block has a ``power`` block (`devices.fleet.EmulatedPower`)
gets, from ``fleet up``, one driver process (``python -m devices.emulation.sensors``,
recorded in ``state.json`` as role ``power-sensor``, so ``fleet down`` stops it). Every
`PERIOD_S` it reads how much cpu time the device used since its last look, turns that into
busy cores and watts (``idle_w + busy_core_w * busy cores``, `model_watts`) and writes the
sensor's files in the real format below the device's power root
(`devices.fleet.Device.power_root`, ``<state_dir>/<name>/power``):

``ina3221-hwmon``  ``sys/bus/i2c/drivers/ina3221/1-0040/hwmon/hwmon1/``: ``VDD_IN`` (the whole
                   draw) and ``VDD_CPU_GPU_CV`` (what busy cores add) at 5 V, ``inN_input`` in mV,
                   ``currN_input`` in mA, ``update_interval`` in ms, as JetPack 5-6 lays them out.
``power-supply``   ``sys/class/power_supply/battery/`` discharging at 3.85 V (``current_now``
                   negative µA, ``voltage_now`` µV, ``status`` Discharging) and
                   ``sys/class/power_supply/usb/`` offline, as an Android phone on battery.
``rapl``           ``sys/class/powercap/intel-rapl:0/`` (``package-0``): ``energy_uj`` accumulates
                   the energy and wraps at ``max_energy_range_uj``.

The file `EMULATED_MARK` beside them says they are an emulated device's; the facts probe
and the runner's readers (`harness.runner.power`) mark such sensors emulated. Each file
is replaced whole (written beside it, then renamed), so a reader never sees half a value.

Where the device's cpu use comes from (`usage_source`): its cgroup (v2 ``cpu.stat``
``usage_usec``, v1 ``cpuacct.usage`` where the cpu hierarchy carries cpuacct); else the
cpu time of the device's processes, summed per process from ``/proc/PID/stat``: those its
cgroups list (``cgroup.procs``: a v1 cpu hierarchy without cpuacct), else those carrying
the device's marker (``FLEETBENCH_DEVICE=<unit>``, `devices.emulation.emulate.MARKER`).
The cgroups' list is a read of one file per period; finding the marked processes reads
the environment of every process on the machine. Both miss what a process used after
the driver's last look before it exited (at most one period of it); the driver's own
process is not counted.
"""

from __future__ import annotations

import argparse
import os
import signal
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path

from devices import processes
from devices.emulation import limits
from devices.files import atomic_write
from devices.fleet import POWER_FORMATS, EmulatedPower

#: Seconds between two updates of the files.
PERIOD_S = 0.1
#: The file that marks the sensors below a power root as an emulated device's.
EMULATED_MARK = "fleetbench-emulated"
#: Where each format's files lie below the power root.
HWMON_DIR = "sys/bus/i2c/drivers/ina3221/1-0040/hwmon/hwmon1"
SUPPLY_DIR = "sys/class/power_supply"
RAPL_DIR = "sys/class/powercap/intel-rapl:0"
#: The rail voltage of the emulated INA3221 (V) and of the emulated battery (V).
HWMON_VOLTS = 5.0
BATTERY_VOLTS = 3.85
#: Where the emulated RAPL counter wraps to 0 (µJ), the value of a common Intel package.
RAPL_RANGE_UJ = 262143328850


# ---------------------------------------------------------------------------- the model


def model_watts(power: EmulatedPower, busy_cores: float) -> float:
    """Return the device's draw with ``busy_cores`` cores busy.

    Parameters
    ----------
    power : EmulatedPower
    busy_cores : float
        Cpu seconds the device used per second (>= 0).

    Returns
    -------
    float
        ``idle_w + busy_core_w * busy_cores``.
    """
    return power.idle_w + power.busy_core_w * max(0.0, busy_cores)


def sensor_files(power: EmulatedPower, watts: float, joules: float) -> dict[str, str]:
    """Return the files of ``power``'s format for a draw of ``watts`` and ``joules`` used so far.

    Parameters
    ----------
    power : EmulatedPower
    watts : float
        The draw now.
    joules : float
        Energy used since the driver started (the RAPL counter).

    Returns
    -------
    dict of str to str
        Path below the power root -> text (with its newline), `EMULATED_MARK` last: written in
        this order (`write_files`), the mark's presence says the sensor's files are all there,
        which is what ``fleet up`` waits for.
    """
    files: dict[str, str] = {}
    if power.format == "ina3221-hwmon":
        busy = max(0.0, watts - power.idle_w)
        millivolts = str(round(HWMON_VOLTS * 1000))
        rails = (("VDD_IN", watts), ("VDD_CPU_GPU_CV", busy))
        files[f"{HWMON_DIR}/name"] = "ina3221\n"
        files[f"{HWMON_DIR}/update_interval"] = f"{round(PERIOD_S * 1000)}\n"
        for channel, (label, rail_watts) in enumerate(rails, start=1):
            files[f"{HWMON_DIR}/in{channel}_label"] = label + "\n"
            files[f"{HWMON_DIR}/in{channel}_input"] = millivolts + "\n"
            files[f"{HWMON_DIR}/curr{channel}_input"] = f"{round(rail_watts / HWMON_VOLTS * 1000)}\n"
    elif power.format == "power-supply":
        battery, usb = f"{SUPPLY_DIR}/battery", f"{SUPPLY_DIR}/usb"
        files[f"{battery}/type"] = "Battery\n"
        files[f"{battery}/status"] = "Discharging\n"
        files[f"{battery}/voltage_now"] = f"{round(BATTERY_VOLTS * 1e6)}\n"
        files[f"{battery}/current_now"] = f"{-round(watts / BATTERY_VOLTS * 1e6)}\n"
        files[f"{usb}/type"] = "USB\n"
        files[f"{usb}/online"] = "0\n"
    elif power.format == "rapl":
        files[f"{RAPL_DIR}/name"] = "package-0\n"
        files[f"{RAPL_DIR}/energy_uj"] = f"{round(joules * 1e6) % RAPL_RANGE_UJ}\n"
        files[f"{RAPL_DIR}/max_energy_range_uj"] = f"{RAPL_RANGE_UJ}\n"
    else:
        raise ValueError(f"power format {power.format!r} is none of {', '.join(POWER_FORMATS)}")
    files[EMULATED_MARK] = f"{power.format} idle_w={power.idle_w:g} busy_core_w={power.busy_core_w:g}\n"
    return files


def cgroup_usage_usec(files: Mapping[str, str]) -> int | None:
    """Return a cgroup's cpu use in µs from its files' texts (None when they do not say).

    Parameters
    ----------
    files : mapping of str to str
        ``cpu.stat`` (cgroup v2: a ``usage_usec N`` line) and/or ``cpuacct.usage`` (cgroup
        v1: nanoseconds), by name; a missing one left out.

    Returns
    -------
    int or None
    """
    for line in files.get("cpu.stat", "").splitlines():
        key, _, value = line.partition(" ")
        if key == "usage_usec" and value.strip().isdigit():
            return int(value)
    nanoseconds = files.get("cpuacct.usage", "").strip()
    return int(nanoseconds) // 1000 if nanoseconds.isdigit() else None


def process_usage_delta(before: Mapping[tuple[int, int], int], now: Mapping[tuple[int, int], int]) -> int:
    """Return the cpu ticks processes used between two looks (pure).

    Parameters
    ----------
    before, now : mapping of (pid, start time) to int
        Cpu ticks per process at the last look and now. A process seen only now
        started since the last look: all its ticks count. One gone since counts nothing
        more.

    Returns
    -------
    int
    """
    return sum(ticks - before.get(key, 0) for key, ticks in now.items() if ticks >= before.get(key, 0))


# ---------------------------------------------------------------------------- cpu use (I/O)


class CgroupUsage:
    """A device's cpu use read from its cgroups (`cgroup_usage_usec`)."""

    def __init__(self, dirs: Sequence[Path]) -> None:
        self.dirs = list(dirs)

    def seconds(self) -> float | None:
        """Return the cpu seconds the cgroups have used, None where none of them says."""
        for directory in self.dirs:
            texts = {}
            for name in ("cpu.stat", "cpuacct.usage"):
                try:
                    texts[name] = (directory / name).read_text()
                except OSError:
                    continue
            usec = cgroup_usage_usec(texts)
            if usec is not None:
                return usec / 1e6
        return None


class ProcessUsage:
    """A device's cpu use summed over its processes, as ``pids()`` lists them (see the module docstring)."""

    def __init__(self, pids: Callable[[], Iterable[int]], ignore: Iterable[int] = ()) -> None:
        self.pids, self.ignore = pids, set(ignore)
        self.ticks_per_s = float(os.sysconf("SC_CLK_TCK"))
        self.last = self._look()
        self.total = 0

    def _look(self) -> dict[tuple[int, int], int]:
        seen = {}
        for pid in self.pids():
            if pid in self.ignore:
                continue
            stat = processes.read_stat(pid)
            if stat is not None:
                seen[(pid, stat.start_time)] = stat.cpu_ticks
        return seen

    def seconds(self) -> float:
        """Return the cpu seconds the device's processes have used since this object was made."""
        now = self._look()
        self.total += process_usage_delta(self.last, now)
        self.last = now
        return self.total / self.ticks_per_s


def usage_source(cgroups: Sequence[Path], marker: str, unit: str) -> Callable[[], float]:
    """Return a function giving the device's cpu seconds used so far (see the module docstring).

    Parameters
    ----------
    cgroups : sequence of pathlib.Path
        The device's cgroup directories.
    marker, unit : str
        The environment variable and value every process of the device carries.

    Returns
    -------
    callable
        ``() -> float``, increasing.
    """
    cgroup = CgroupUsage(cgroups)
    if cgroup.seconds() is not None:
        return lambda: cgroup.seconds() or 0.0
    if any((Path(directory) / "cgroup.procs").is_file() for directory in cgroups):
        return ProcessUsage(lambda: limits.cgroup_pids(cgroups), ignore=(os.getpid(),)).seconds
    return ProcessUsage(lambda: processes.marked(marker, unit), ignore=(os.getpid(),)).seconds


# ---------------------------------------------------------------------------- the driver


def write_files(root: Path, files: Mapping[str, str]) -> None:
    """Write ``files`` below ``root``, each replaced whole.

    Parameters
    ----------
    root : pathlib.Path
    files : mapping of str to str
    """
    for relative, text in files.items():
        atomic_write(root / relative, text)


def drive(
    root: Path,
    power: EmulatedPower,
    usage: Callable[[], float],
    period: float = PERIOD_S,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    running: Callable[[], bool] = lambda: True,
) -> float:
    """Keep ``power``'s files below ``root`` written from the device's cpu use until ``running()`` is false.

    Parameters
    ----------
    root : pathlib.Path
        The device's power root.
    power : EmulatedPower
    usage : callable
        ``() -> cpu seconds used so far`` (`usage_source`).
    period : float
        Seconds between updates.
    clock, sleep, running : callable
        Time source, sleep, and whether to go on.

    Returns
    -------
    float
        The energy (J) accounted when it stopped.

    Notes
    -----
    Only the files whose text changed since the last update are written again: the
    labels, voltages and the mark stay as first written, so a period costs the driver a
    rename or two, not one per file.
    """
    joules = 0.0
    written: dict[str, str] = {}

    def update(files: Mapping[str, str]) -> None:
        changed = {relative: text for relative, text in files.items() if written.get(relative) != text}
        write_files(root, changed)
        written.update(changed)

    last_t, last_cpu = clock(), usage()
    update(sensor_files(power, model_watts(power, 0.0), joules))
    while running():
        sleep(period)
        now, cpu = clock(), usage()
        elapsed = now - last_t
        if elapsed <= 0:
            continue
        watts = model_watts(power, (cpu - last_cpu) / elapsed)
        joules += watts * elapsed
        update(sensor_files(power, watts, joules))
        last_t, last_cpu = now, cpu
    return joules


def driver_argv(root: Path, power: EmulatedPower, marker: str, unit: str, cgroups: Sequence[str]) -> list[str]:
    """Return the arguments of ``python -m devices.emulation.sensors`` for one device.

    Parameters
    ----------
    root : pathlib.Path
    power : EmulatedPower
    marker, unit : str
    cgroups : sequence of str

    Returns
    -------
    list of str
        Everything after ``-m devices.emulation.sensors``.
    """
    argv = ["--root", str(root), "--format", power.format, "--idle-w", repr(power.idle_w)]
    argv += ["--busy-core-w", repr(power.busy_core_w), "--marker", marker, "--unit", unit]
    for cgroup in cgroups:
        argv += ["--cgroup", cgroup]
    return argv


def main(argv: list[str] | None = None) -> int:
    """``python -m devices.emulation.sensors --root DIR --format F --idle-w W --busy-core-w W --marker M --unit U``."""
    parser = argparse.ArgumentParser(prog="python -m devices.emulation.sensors")
    parser.add_argument("--root", type=Path, required=True, help="the device's power root")
    parser.add_argument("--format", choices=POWER_FORMATS, required=True)
    parser.add_argument("--idle-w", type=float, required=True)
    parser.add_argument("--busy-core-w", type=float, required=True)
    parser.add_argument("--marker", required=True, help="environment variable every process of the device carries")
    parser.add_argument("--unit", required=True, help="its value for this device")
    parser.add_argument("--cgroup", type=Path, action="append", default=[], help="a cgroup directory of the device")
    parser.add_argument("--period", type=float, default=PERIOD_S)
    args = parser.parse_args(argv)
    stop = {"now": False}
    signal.signal(signal.SIGTERM, lambda *_: stop.update(now=True))
    power = EmulatedPower(args.format, args.idle_w, args.busy_core_w)
    usage = usage_source(args.cgroup, args.marker, args.unit)
    drive(args.root, power, usage, args.period, running=lambda: not stop["now"])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
