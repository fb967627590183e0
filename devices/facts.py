"""Device facts: what a device is (CPU, memory, OS, Python stack, thermal and throttle state).

``fleetbench fleet facts FILE [--json] [--timeout S]`` runs one probe command per device
(`devices.facts_probe.PROBE_SCRIPT`), concurrently across the fleet, and parses its output
here. The parsers are pure functions of text, each tested on recorded outputs written from
the documented formats (``tests/devices/recorded/``); I/O happens only in `probe_device`,
`collect_facts` and `cmd_facts`.

Exit status of ``fleet facts``: 0 when every device answered, 1 when at least one device
failed (its kind and message are printed in the failures section, or under ``"failures"``
with ``--json``), 2 for a bad fleet file.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import TYPE_CHECKING, Any

from devices.errors import TransportError
from devices.facts_probe import probe_argv, split_sections
from devices.fleet import Device, Fleet
from devices.site import python_argv
from devices.transport import Transport

if TYPE_CHECKING:
    from devices.group import FleetResult

#: Values of ``platform``.
PLATFORMS = ("raspberry-pi", "jetson", "android", "linux")

# --------------------------------------------------------------------------------------
# /proc/cpuinfo
# --------------------------------------------------------------------------------------

# ARM "CPU implementer" / "CPU part" codes (MIDR_EL1 fields, printed by the arm64 kernel's
# arch/arm64/kernel/cpuinfo.c as "CPU implementer\t: 0x41" and "CPU part\t: 0xd08").
# Names as in the Arm Technical Reference Manuals' MIDR tables and util-linux lscpu-arm.c.
_ARM_IMPLEMENTERS = {0x41: "ARM", 0x4E: "NVIDIA", 0x51: "Qualcomm", 0x61: "Apple", 0x53: "Samsung"}
_ARM_PARTS = {
    (0x41, 0xB76): "ARM1176",
    (0x41, 0xC07): "Cortex-A7",
    (0x41, 0xC08): "Cortex-A8",
    (0x41, 0xC09): "Cortex-A9",
    (0x41, 0xC0F): "Cortex-A15",
    (0x41, 0xD03): "Cortex-A53",
    (0x41, 0xD04): "Cortex-A35",
    (0x41, 0xD05): "Cortex-A55",
    (0x41, 0xD07): "Cortex-A57",
    (0x41, 0xD08): "Cortex-A72",
    (0x41, 0xD09): "Cortex-A73",
    (0x41, 0xD0A): "Cortex-A75",
    (0x41, 0xD0B): "Cortex-A76",
    (0x41, 0xD0C): "Neoverse-N1",
    (0x41, 0xD0D): "Cortex-A77",
    (0x41, 0xD41): "Cortex-A78",
    (0x41, 0xD42): "Cortex-A78AE",
    (0x41, 0xD44): "Cortex-X1",
    (0x41, 0xD46): "Cortex-A510",
    (0x41, 0xD47): "Cortex-A710",
    (0x41, 0xD48): "Cortex-X2",
    (0x41, 0xD4D): "Cortex-A715",
    (0x41, 0xD4E): "Cortex-X3",
    (0x41, 0xD80): "Cortex-A520",
    (0x41, 0xD81): "Cortex-A720",
    (0x41, 0xD82): "Cortex-X4",
    (0x4E, 0x004): "Carmel",
}


@dataclass(frozen=True)
class CpuInfo:
    """What ``/proc/cpuinfo`` says.

    Attributes
    ----------
    model : str or None
        ``model name`` (x86, 32-bit ARM) when specific; otherwise the ARM core names
        decoded from ``CPU implementer`` / ``CPU part`` (``"ARM Cortex-A72"``, or
        ``"4x ARM Cortex-A55 + 4x ARM Cortex-A76"`` on big.LITTLE); otherwise ``Hardware``.
    processors : int
        Number of ``processor`` entries.
    hardware : str or None
        ``Hardware`` line (SoC name on Raspberry Pi and Android kernels).
    board : str or None
        ``Model`` line (board name printed by the Raspberry Pi kernel).
    mhz : float or None
        ``cpu MHz`` of the first processor (x86: current frequency).
    """

    model: str | None
    processors: int
    hardware: str | None = None
    board: str | None = None
    mhz: float | None = None


def _cpuinfo_blocks(text: str) -> tuple[list[dict[str, str]], dict[str, str]]:
    """Split cpuinfo into per-processor blocks and the trailing machine-wide fields."""
    processors: list[dict[str, str]] = []
    machine: dict[str, str] = {}
    current: dict[str, str] | None = None
    for line in text.splitlines():
        if ":" not in line:
            if not line.strip():
                current = None
            continue
        key, _, value = line.partition(":")
        key, value = key.strip(), value.strip()
        if key == "processor":
            current = {}
            processors.append(current)
            continue
        (current if current is not None else machine)[key] = value
    return processors, machine


def parse_cpuinfo(text: str) -> CpuInfo:
    """Parse ``/proc/cpuinfo`` (x86, arm64 and 32-bit ARM layouts).

    Format: ``key<TABs>: value`` lines, one blank-line-separated block per processor,
    written by the kernel's ``show_cpuinfo`` (arch/x86/kernel/cpu/proc.c,
    arch/arm64/kernel/cpuinfo.c, arch/arm/kernel/setup.c). arm64 kernels print no
    ``model name``; the Raspberry Pi kernel adds machine-wide ``Hardware``, ``Revision``,
    ``Serial`` and ``Model`` lines after the last processor.

    Parameters
    ----------
    text : str
        Contents of ``/proc/cpuinfo``.

    Returns
    -------
    CpuInfo
    """
    processors, machine = _cpuinfo_blocks(text)
    merged: dict[str, str] = {}
    for block in processors:
        for key, value in block.items():
            merged.setdefault(key, value)
    merged.update({k: v for k, v in machine.items() if k not in merged})
    hardware = merged.get("Hardware") or None
    board = merged.get("Model") or None
    mhz: float | None
    try:
        mhz = float(merged["cpu MHz"])
    except (KeyError, ValueError):
        mhz = None

    model = merged.get("model name") or None
    if model is None or model.startswith("ARMv"):  # "ARMv7 Processor rev 3 (v7l)" says little
        cores: list[str] = []
        for block in processors or [machine]:
            try:
                implementer = int(block["CPU implementer"], 16)
                part = int(block["CPU part"], 16)
            except (KeyError, ValueError):
                continue
            vendor = _ARM_IMPLEMENTERS.get(implementer, f"implementer 0x{implementer:02x}")
            name = _ARM_PARTS.get((implementer, part), f"part 0x{part:03x}")
            cores.append(f"{vendor} {name}")
        kinds = list(dict.fromkeys(cores))
        if len(kinds) == 1:
            model = kinds[0]
        elif kinds:
            model = " + ".join(f"{cores.count(kind)}x {kind}" for kind in kinds)
        elif model is None:
            model = hardware
    return CpuInfo(model=model, processors=len(processors), hardware=hardware, board=board, mhz=mhz)


# --------------------------------------------------------------------------------------
# /proc/meminfo
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class MemInfo:
    """Memory from ``/proc/meminfo``, in kB (the kernel's kB are KiB).

    Attributes
    ----------
    total_kb : int or None
        ``MemTotal``.
    available_kb : int or None
        ``MemAvailable`` (Linux >= 3.14); older kernels: ``MemFree + Buffers + Cached``.
    swap_total_kb : int or None
        ``SwapTotal``.
    """

    total_kb: int | None
    available_kb: int | None
    swap_total_kb: int | None = None


def parse_meminfo(text: str) -> MemInfo:
    """Parse ``/proc/meminfo``.

    Format (Documentation/filesystems/proc.rst, "meminfo"): one ``Name:  <value> kB``
    line per counter. ``MemAvailable`` estimates memory available for starting new
    applications without swapping; it appeared in Linux 3.14.

    Parameters
    ----------
    text : str
        Contents of ``/proc/meminfo``.

    Returns
    -------
    MemInfo
    """
    values: dict[str, int] = {}
    for line in text.splitlines():
        match = re.match(r"\s*([\w()]+):\s+(\d+)", line)
        if match:
            values[match.group(1)] = int(match.group(2))
    available = values.get("MemAvailable")
    if available is None and "MemFree" in values:
        available = values["MemFree"] + values.get("Buffers", 0) + values.get("Cached", 0)
    return MemInfo(total_kb=values.get("MemTotal"), available_kb=available, swap_total_kb=values.get("SwapTotal"))


# --------------------------------------------------------------------------------------
# cpufreq and thermal sysfs
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CpuFreq:
    """cpu0's cpufreq policy.

    Attributes
    ----------
    max_khz : int or None
        ``cpuinfo_max_freq`` (hardware maximum), else ``scaling_max_freq``.
    cur_khz : int or None
        ``scaling_cur_freq``.
    governor : str or None
        ``scaling_governor``.
    """

    max_khz: int | None
    cur_khz: int | None
    governor: str | None


def _int_or_none(text: str | None) -> int | None:
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


def parse_cpufreq(text: str) -> CpuFreq:
    """Parse the probe's ``cpufreq`` section (``name=value`` per sysfs file).

    Format: Documentation/admin-guide/pm/cpufreq.rst, "Policy Interface in sysfs":
    ``cpuinfo_max_freq``, ``scaling_max_freq`` and ``scaling_cur_freq`` hold integers
    in kHz, ``scaling_governor`` the governor's name.

    Parameters
    ----------
    text : str
        Lines ``cpuinfo_max_freq=1500000`` etc.

    Returns
    -------
    CpuFreq
    """
    values = dict(line.split("=", 1) for line in text.splitlines() if "=" in line)
    values = {key.strip(): value.strip() for key, value in values.items()}
    max_khz = _int_or_none(values.get("cpuinfo_max_freq"))
    if max_khz is None:
        max_khz = _int_or_none(values.get("scaling_max_freq"))
    return CpuFreq(
        max_khz=max_khz,
        cur_khz=_int_or_none(values.get("scaling_cur_freq")),
        governor=values.get("scaling_governor") or None,
    )


def parse_thermal(text: str) -> dict[str, float]:
    """Parse the probe's ``thermal`` section into ``{zone type: degrees Celsius}``.

    Format: Documentation/driver-api/thermal/sysfs-api.rst: ``thermal_zoneN/type`` is
    the zone's name, ``thermal_zoneN/temp`` its temperature in millidegrees Celsius.
    Zones whose ``temp`` cannot be read (empty, not a number) are left out; a type seen
    twice is keyed ``type/thermal_zoneN`` from its second zone on.

    Parameters
    ----------
    text : str
        Lines ``thermal_zone0<TAB>cpu-thermal<TAB>45277``.

    Returns
    -------
    dict of str to float
    """
    zones: dict[str, float] = {}
    for line in text.splitlines():
        parts = line.split("\t")
        if len(parts) != 3:
            continue
        zone, kind, temp = (part.strip() for part in parts)
        value = _int_or_none(temp)
        if value is None:
            continue
        key = kind or zone
        if key in zones:
            key = f"{key}/{zone}"
        zones[key] = value / 1000.0
    return zones


# --------------------------------------------------------------------------------------
# os-release, Python stack
# --------------------------------------------------------------------------------------


def parse_os_release(text: str) -> dict[str, str]:
    """Parse ``/etc/os-release`` into ``{KEY: value}``.

    Format: os-release(5) (freedesktop.org): newline-separated ``KEY=value``
    assignments, values optionally in double or single quotes with shell-style
    backslash escapes; ``#`` starts a comment line.

    Parameters
    ----------
    text : str
        Contents of the file.

    Returns
    -------
    dict of str to str
    """
    fields: dict[str, str] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#") or "=" not in line:
            continue
        key, _, value = line.partition("=")
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
            value = value[1:-1]
            if line.partition("=")[2][0] == '"':
                value = re.sub(r"\\([\\$\"`])", r"\1", value)
        fields[key.strip()] = value
    return fields


def os_name(fields: Mapping[str, str]) -> str | None:
    """Return ``PRETTY_NAME``, else ``NAME VERSION_ID``, else ``None``.

    Parameters
    ----------
    fields : mapping of str to str
        Output of `parse_os_release`.

    Returns
    -------
    str or None
    """
    if fields.get("PRETTY_NAME"):
        return fields["PRETTY_NAME"]
    name = " ".join(part for part in (fields.get("NAME"), fields.get("VERSION_ID")) if part)
    return name or None


def parse_versions(text: str) -> dict[str, str]:
    """Parse the probe's ``python`` section: ``name=version`` lines.

    Parameters
    ----------
    text : str
        E.g. ``python=3.11.7`` / ``numpy=1.26.4`` / ``torch=missing``.

    Returns
    -------
    dict of str to str
        Keys ``python``, ``numpy``, ``onnxruntime``, ``torch``; any not printed is
        ``"missing"`` (the interpreter itself: ``"missing"`` or ``"broken"``).
    """
    found = dict(line.split("=", 1) for line in text.splitlines() if "=" in line)
    return {
        name: found.get(name, "missing").strip() or "missing" for name in ("python", "numpy", "onnxruntime", "torch")
    }


# --------------------------------------------------------------------------------------
# Raspberry Pi: vcgencmd get_throttled
# --------------------------------------------------------------------------------------

# Raspberry Pi documentation, "vcgencmd" > "get_throttled": bits 0-3 are the current
# state, bits 16-19 are sticky "has occurred since boot" copies of the same conditions.
_THROTTLE_BITS = {
    0: "under_voltage",
    1: "arm_frequency_capped",
    2: "throttled",
    3: "soft_temperature_limit",
    16: "under_voltage_occurred",
    17: "arm_frequency_capped_occurred",
    18: "throttling_occurred",
    19: "soft_temperature_limit_occurred",
}


def decode_throttled(value: int) -> dict[str, bool]:
    """Decode a ``get_throttled`` bit field into named flags.

    Parameters
    ----------
    value : int
        The number after ``throttled=``.

    Returns
    -------
    dict of str to bool
        ``under_voltage``, ``arm_frequency_capped``, ``throttled``,
        ``soft_temperature_limit`` (now) and the same four with ``_occurred``
        (``throttling_occurred`` for bit 18) since boot.
    """
    return {name: bool(value >> bit & 1) for bit, name in _THROTTLE_BITS.items()}


def parse_vcgencmd_throttled(text: str) -> dict[str, Any] | None:
    """Parse ``vcgencmd get_throttled`` output (``throttled=0x50005``).

    Parameters
    ----------
    text : str
        The command's output.

    Returns
    -------
    dict or None
        ``{"source": "vcgencmd get_throttled", "raw": "0x50005", <flags>}``, or
        ``None`` when no ``throttled=`` value is present.
    """
    match = re.search(r"throttled=(0x[0-9a-fA-F]+|\d+)", text)
    if not match:
        return None
    value = int(match.group(1), 0)
    return {"source": "vcgencmd get_throttled", "raw": f"0x{value:x}", **decode_throttled(value)}


# --------------------------------------------------------------------------------------
# Jetson: tegrastats, nvpmodel
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TegraStats:
    """One ``tegrastats`` line.

    Attributes
    ----------
    ram_used_mb, ram_total_mb : int or None
        ``RAM X/YMB``.
    swap_used_mb, swap_total_mb : int or None
        ``SWAP X/YMB``.
    cpus : tuple
        Per core ``(load %, MHz)``, or ``None`` for a core reported ``off``.
    temperatures : dict of str to float
        ``NAME@T C`` readings; ``-256C`` (sensor absent/off) left out.
    """

    ram_used_mb: int | None
    ram_total_mb: int | None
    swap_used_mb: int | None
    swap_total_mb: int | None
    cpus: tuple[tuple[int, int | None] | None, ...]
    temperatures: dict[str, float] = field(default_factory=dict)


def parse_tegrastats(line: str) -> TegraStats:
    """Parse one ``tegrastats`` output line.

    Format: NVIDIA Jetson Linux Developer Guide, "tegrastats Utility" > "Reported
    Statistics": ``RAM X/YMB (lfb NxZMB)``, ``SWAP X/YMB (cached ZMB)``,
    ``CPU [X%@Z,Y%@Z,...]`` (load in percent at frequency Z MHz, or ``off`` for a
    powered-down core; older releases print ``CPU [X%,Y%]@Z``), then ``NAME@TC``
    temperatures. Newer releases prefix a date and time, which is ignored.

    Parameters
    ----------
    line : str
        One line of tegrastats output.

    Returns
    -------
    TegraStats
    """
    ram = re.search(r"\bRAM (\d+)/(\d+)MB", line)
    swap = re.search(r"\bSWAP (\d+)/(\d+)MB", line)
    cpus: list[tuple[int, int | None] | None] = []
    cpu = re.search(r"\bCPU \[([^\]]*)\](?:@(\d+))?", line)
    if cpu:
        shared = int(cpu.group(2)) if cpu.group(2) else None
        for item in cpu.group(1).split(","):
            item = item.strip()
            core = re.fullmatch(r"(\d+)%(?:@(\d+))?", item)
            if core:
                cpus.append((int(core.group(1)), int(core.group(2)) if core.group(2) else shared))
            elif item == "off":
                cpus.append(None)
    temperatures = {
        name: float(value)
        for name, value in re.findall(r"(?<![\w%])([A-Za-z][\w-]*)@(-?\d+(?:\.\d+)?)C\b", line)
        if float(value) > -256.0
    }
    return TegraStats(
        ram_used_mb=int(ram.group(1)) if ram else None,
        ram_total_mb=int(ram.group(2)) if ram else None,
        swap_used_mb=int(swap.group(1)) if swap else None,
        swap_total_mb=int(swap.group(2)) if swap else None,
        cpus=tuple(cpus),
        temperatures=temperatures,
    )


@dataclass(frozen=True)
class PowerMode:
    """``nvpmodel -q``: the active Jetson power mode.

    Attributes
    ----------
    name : str
        E.g. ``MAXN`` or ``5W``.
    mode_id : int or None
        Its id in /etc/nvpmodel.conf (the number printed on the next line).
    """

    name: str
    mode_id: int | None


def parse_nvpmodel(text: str) -> PowerMode | None:
    """Parse ``nvpmodel -q`` output.

    Format: NVIDIA Jetson Linux Developer Guide, "Power Management" > "nvpmodel":
    ``-q`` prints ``NV Power Mode: <NAME>`` followed by a line holding the mode id;
    warning lines (``NVPM WARN ...``) and a fan-mode line may come before.

    Parameters
    ----------
    text : str
        The command's output.

    Returns
    -------
    PowerMode or None
        ``None`` when no ``NV Power Mode:`` line is present.
    """
    lines = [line.strip() for line in text.splitlines()]
    for index, line in enumerate(lines):
        match = re.match(r"NV Power Mode\s*:\s*(.+)", line)
        if match:
            following = lines[index + 1] if index + 1 < len(lines) else ""
            return PowerMode(name=match.group(1).strip(), mode_id=_int_or_none(following))
    return None


# --------------------------------------------------------------------------------------
# Android: getprop, dumpsys meminfo, dumpsys thermalservice
# --------------------------------------------------------------------------------------


def parse_getprop(text: str) -> dict[str, str]:
    """Parse Android ``getprop`` output (``[key]: [value]`` per line).

    Parameters
    ----------
    text : str
        The command's output.

    Returns
    -------
    dict of str to str
    """
    return dict(re.findall(r"^\[([^\]]+)\]: \[(.*)\]\s*$", text, flags=re.MULTILINE))


def parse_dumpsys_meminfo(text: str) -> dict[str, int]:
    """Parse the RAM summary of Android ``dumpsys meminfo``.

    Format (frameworks/base ActivityManagerService ``dumpApplicationMemoryUsage``):
    ``Total RAM: 3,720,812K (status normal)``, ``Free RAM: 1,863,136K (...)``,
    ``Used RAM: ...``, ``Lost RAM: ...``; values in KiB with thousands separators
    (Android before 7 prints ``Total RAM: 1857480 kB``).

    Parameters
    ----------
    text : str
        The command's output (whole, or its ``RAM:`` lines).

    Returns
    -------
    dict of str to int
        Subset of ``total_kb``, ``free_kb``, ``used_kb``, ``lost_kb``.
    """
    out: dict[str, int] = {}
    for name in ("Total", "Free", "Used", "Lost"):
        match = re.search(rf"^\s*{name} RAM:\s*([\d,]+)\s*(?:K|kB)\b", text, flags=re.MULTILINE)
        if match:
            out[f"{name.lower()}_kb"] = int(match.group(1).replace(",", ""))
    return out


# android.os.PowerManager THERMAL_STATUS_* constants (API level 29).
_THERMAL_STATUS = ("none", "light", "moderate", "severe", "critical", "emergency", "shutdown")


def parse_thermal_status(text: str) -> dict[str, Any] | None:
    """Parse ``Thermal Status: N`` from Android ``dumpsys thermalservice``.

    Parameters
    ----------
    text : str
        The command's output.

    Returns
    -------
    dict or None
        ``{"source": "dumpsys thermalservice", "thermal_status": N, "status": name}``
        with the name of ``PowerManager.THERMAL_STATUS_*``; ``None`` if absent.
    """
    match = re.search(r"Thermal Status:\s*(\d+)", text)
    if not match:
        return None
    status = int(match.group(1))
    name = _THERMAL_STATUS[status] if status < len(_THERMAL_STATUS) else "unknown"
    return {"source": "dumpsys thermalservice", "thermal_status": status, "status": name}


# --------------------------------------------------------------------------------------
# Power sensors: the probe's listing of sensor files, vcgencmd pmic_read_adc
# --------------------------------------------------------------------------------------

# The device reads these sensors itself (`harness.runner.power`, which the layers keep out
# of reach of this package); the host only lists what is there from the probe's listing.

_HWMON_FILE = re.compile(r"/sys/bus/i2c/drivers/ina3221/[^/]+/hwmon/hwmon\d+/(?P<file>[^/]+)$")
_IIO_FILE = re.compile(r"/sys/bus/i2c/drivers/ina3221x/[^/]+/iio:device\d+/(?P<file>[^/]+)$")
_SUPPLY_FILE = re.compile(r"/sys/class/power_supply/(?P<supply>[^/]+)/(?P<file>[^/]+)$")
_RAPL_FILE = re.compile(r"/sys/class/powercap/(?P<zone>intel-rapl:[\d:]+)/(?P<file>[^/]+)$")
_PMIC_LINE = re.compile(r"^\s*(\S+)_([AV])\s+(current|volt)\(\d+\)=\s*([-+0-9.eE]+)\s*[AV]\s*$")
#: INA3221 shunt-voltage step (V): one count of current is this over the shunt resistor.
_INA3221_SHUNT_LSB_V = 40e-6
#: The file an emulated device's sensor driver writes beside the sensors (`devices.emulation.sensors`).
EMULATED_MARK = "fleetbench-emulated"


@dataclass(frozen=True)
class PowerSensor:
    """One power sensor a device has, as the probe lists it.

    Attributes
    ----------
    kind : {"ina3221-hwmon", "ina3221-iio", "pmic-adc", "power-supply", "rapl"}
        The format, as `harness.runner.power` reads it.
    rails : tuple of str
        Rail names (INA3221 labels, PMIC rails, the battery, RAPL zone names).
    resolution : float or None
        Step of one reading: W for a power sensor (one count of current at the rail's
        voltage, the largest over its rails; one count of the power file for
        ``ina3221-iio``), J for a counter (``rapl``). None where the listing cannot say.
    unit : {"W", "J"}
        What it reads: power or an energy counter.
    update_interval_ms : int or None
        How often it updates (hwmon ``update_interval``), where it says.
    emulated : bool
        Written by an emulated device's driver, not a device's sensor.
    note : str
        What keeps it from being read (e.g. a RAPL counter only root may read).
    """

    kind: str
    rails: tuple[str, ...]
    resolution: float | None
    unit: str = "W"
    update_interval_ms: int | None = None
    emulated: bool = False
    note: str = ""


def _float_or_none(text: str | None) -> float | None:
    try:
        return float(text) if text is not None else None
    except ValueError:
        return None


def _listing(text: str) -> tuple[dict[str, str], set[str]]:
    """Split the probe's ``power`` section into ``{path: first line}`` and the unreadable paths."""
    values: dict[str, str] = {}
    unreadable: set[str] = set()
    for line in text.splitlines():
        path, _, rest = line.partition("\t")
        value, _, flag = rest.partition("\t")
        if not path:
            continue
        if flag.strip() == "unreadable":
            unreadable.add(path)
        else:
            values[path] = value.strip()
    return values, unreadable


def _grouped(values: Mapping[str, str], pattern: re.Pattern[str], key: str) -> dict[str, dict[str, str]]:
    groups: dict[str, dict[str, str]] = {}
    for path, value in values.items():
        match = pattern.search(path)
        if match:
            group = path[: match.start("file")] if key == "dir" else match.group(key)
            groups.setdefault(group, {})[match.group("file")] = value
    return dict(sorted(groups.items()))


def _channel_order(name: str) -> int:
    digits = re.findall(r"\d+", name)
    return int(digits[0]) if digits else 0


def parse_pmic_adc(text: str) -> dict[str, tuple[float, float]]:
    """Parse ``vcgencmd pmic_read_adc`` into ``{rail: (amperes, volts)}`` (Raspberry Pi 5).

    Format: one line per rail and quantity, ``3V7_WL_SW_A current(0)=0.00390372A`` (a
    rail's current) and ``3V7_WL_SW_V volt(8)=3.70323000V`` (its voltage); a rail with
    only a voltage line (``EXT5V_V``, ``BATT_V``) is left out.

    Parameters
    ----------
    text : str
        The command's output.

    Returns
    -------
    dict of str to tuple of float
    """
    amps: dict[str, float] = {}
    volts: dict[str, float] = {}
    for line in text.splitlines():
        match = _PMIC_LINE.match(line)
        if match:
            name, _, quantity, value = match.groups()
            (amps if quantity == "current" else volts)[name] = float(value)
    return {rail: (current, volts[rail]) for rail, current in amps.items() if rail in volts}


def parse_power(listing: str, pmic: str = "") -> tuple[PowerSensor, ...]:
    """Parse the probe's ``power`` and ``pmic`` sections into the device's power sensors (pure).

    Formats: INA3221 under hwmon (JetPack 5-6: ``inN_label``, ``inN_input`` mV,
    ``currN_input`` mA, ``shuntN_resistor`` µΩ, ``update_interval`` ms) and under iio (older
    JetPacks: ``rail_name_N``, ``in_powerN_input`` mW); ``power_supply`` batteries
    (``type``, ``current_now`` µA, ``voltage_now`` µV); powercap RAPL zones (``name``,
    ``energy_uj``); ``vcgencmd pmic_read_adc`` (`parse_pmic_adc`). An unlabelled INA3221
    channel, or one labelled ``NC``, and a battery without ``current_now`` are no sensor.

    Parameters
    ----------
    listing : str
        ``path<TAB>first line`` lines (``path<TAB><TAB>unreadable`` for a file the probe
        could not read).
    pmic : str
        The ``pmic_read_adc`` printout (empty where there is none).

    Returns
    -------
    tuple of PowerSensor
        In the order hwmon, iio, PMIC, battery, RAPL; empty: no power sensor.
    """
    values, unreadable = _listing(listing)
    emulated = any(path.rstrip("/").endswith("/" + EMULATED_MARK) for path in values)
    sensors: list[PowerSensor] = []
    for files in _grouped(values, _HWMON_FILE, "dir").values():
        rails: list[str] = []
        resolution = 0.0
        labels = sorted((f for f in files if re.fullmatch(r"in\d+_label", f)), key=_channel_order)
        for label_file in labels:
            channel = label_file[2 : -len("_label")]
            label = files[label_file]
            if not label or label == "NC" or f"curr{channel}_input" not in files:
                continue
            rails.append(label)
            volts = (_float_or_none(files.get(f"in{channel}_input")) or 0.0) / 1e3
            shunt = _int_or_none(files.get(f"shunt{channel}_resistor"))
            amps_step = max(1e-3, _INA3221_SHUNT_LSB_V / (shunt / 1e6)) if shunt else 1e-3
            resolution = max(resolution, amps_step * volts)
        if rails:
            interval = _int_or_none(files.get("update_interval"))
            sensors.append(PowerSensor("ina3221-hwmon", tuple(rails), resolution, "W", interval, emulated))
    for files in _grouped(values, _IIO_FILE, "dir").values():
        names = sorted((f for f in files if f.startswith("rail_name_")), key=_channel_order)
        rails = [files[n] for n in names if files[n] and f"in_power{n.rsplit('_', 1)[1]}_input" in files]
        if rails:
            sensors.append(PowerSensor("ina3221-iio", tuple(rails), 1e-3, "W", None, emulated))
    rails_pmic = parse_pmic_adc(pmic)
    if rails_pmic:
        decimals = max((len(d) for d in re.findall(r"current\(\d+\)=\s*[-+]?\d*\.(\d+)A", pmic)), default=0)
        step = 10.0**-decimals * max(volts for _, volts in rails_pmic.values())
        sensors.append(PowerSensor("pmic-adc", tuple(rails_pmic), step, "W"))
    batteries: list[str] = []
    resolution = 0.0
    for supply, files in _grouped(values, _SUPPLY_FILE, "supply").items():
        if (files.get("type") == "Battery" or supply == "battery") and "current_now" in files:
            batteries.append(supply)
            resolution = max(resolution, 1e-6 * abs(_float_or_none(files.get("voltage_now")) or 0.0) / 1e6)
    if batteries:
        sensors.append(PowerSensor("power-supply", tuple(batteries), resolution, "W", None, emulated))
    zones = _grouped({**values, **dict.fromkeys(unreadable, "")}, _RAPL_FILE, "zone")
    zones = {zone: files for zone, files in zones.items() if "energy_uj" in files}
    if zones:
        order = sorted(zones, key=lambda z: [int(n) for n in re.findall(r"\d+", z)])
        locked = [z for z in order if any(p.endswith(f"/{z}/energy_uj") for p in unreadable)]
        note = "energy_uj readable by root only" if locked else ""
        rails = [zones[z].get("name") or z for z in order]
        sensors.append(PowerSensor("rapl", tuple(rails), 1e-6, "J", None, emulated, note))
    return tuple(sensors)


def describe_power(sensors: Sequence[PowerSensor]) -> str:
    """Say in one line what power sensors a device has (``no power sensor`` when none).

    Parameters
    ----------
    sensors : sequence of PowerSensor

    Returns
    -------
    str
        ``kind: rails, step X W|J[, every N ms][ (emulated)][ (note)]`` per sensor, joined by ``; ``.
    """
    if not sensors:
        return "no power sensor"
    parts = []
    for sensor in sensors:
        text = f"{sensor.kind}: {', '.join(sensor.rails)}"
        if sensor.resolution is not None:
            text += f", step {sensor.resolution:.3g} {sensor.unit}"
        if sensor.update_interval_ms is not None:
            text += f", every {sensor.update_interval_ms} ms"
        text += " (emulated)" if sensor.emulated else ""
        text += f" ({sensor.note})" if sensor.note else ""
        parts.append(text)
    return "; ".join(parts)


# --------------------------------------------------------------------------------------
# Facts
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DeviceFacts:
    """What one device is, from one probe.

    Attributes
    ----------
    arch : str
        ``uname -m`` (``x86_64``, ``aarch64``, ``armv7l``).
    platform : {"raspberry-pi", "jetson", "android", "linux"}
    board : str or None
        Board / phone name (device-tree model, cpuinfo ``Model``, Android manufacturer
        and model).
    cpu_model : str or None
        See `CpuInfo.model`.
    cores : int or None
        Online CPUs (``getconf _NPROCESSORS_ONLN``, else cpuinfo processors).
    usable_cores : int or None
        ``nproc``: CPUs the probe's process may run on (affinity, cpuset).
    max_freq_khz, cur_freq_khz : int or None
        cpu0's cpufreq maximum and current frequency; without cpufreq, the current
        frequency falls back to cpuinfo ``cpu MHz`` (x86).
    governor : str or None
        cpu0's cpufreq governor.
    mem_total_mb, mem_available_mb : int or None
        ``/proc/meminfo`` MemTotal / MemAvailable in MiB (Android ``dumpsys meminfo``
        total / free RAM when /proc/meminfo is unreadable).
    os : str or None
        os-release ``PRETTY_NAME``, or ``Android <release> (SDK <n>)``.
    python, numpy, onnxruntime, torch : str
        Versions, ``"missing"`` when not installed.
    thermal : dict of str to float
        Thermal zone type -> degrees Celsius.
    throttle : dict
        Decoded throttle state: vcgencmd flags (Raspberry Pi), power mode (Jetson),
        thermal status (Android); empty when the device has no such source.
    details : dict
        Platform extras: ``tegrastats`` snapshot, selected Android properties.
    emulated_isa : bool
        The device's instructions are translated by an emulator (qemu-user), so its
        timings are not those of a device of its architecture (`emulated_isa`).
    power : tuple of PowerSensor
        Its power sensors (`parse_power`); empty: no power sensor.
    """

    arch: str
    platform: str
    board: str | None
    cpu_model: str | None
    cores: int | None
    usable_cores: int | None
    max_freq_khz: int | None
    cur_freq_khz: int | None
    governor: str | None
    mem_total_mb: int | None
    mem_available_mb: int | None
    os: str | None
    python: str
    numpy: str
    onnxruntime: str
    torch: str
    thermal: dict[str, float] = field(default_factory=dict)
    throttle: dict[str, Any] = field(default_factory=dict)
    details: dict[str, Any] = field(default_factory=dict)
    emulated_isa: bool = False
    power: tuple[PowerSensor, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """Return the facts as a JSON-ready dict (field order kept).

        Returns
        -------
        dict
        """
        return json.loads(json.dumps(asdict(self)))


class ProbeError(TransportError):
    """The probe ran but its output cannot be used (kind ``runner error``)."""


_ANDROID_PROPS = (
    "ro.product.manufacturer",
    "ro.product.model",
    "ro.build.version.release",
    "ro.build.version.sdk",
    "ro.product.cpu.abi",
    "ro.board.platform",
    "ro.hardware",
    "ro.soc.model",
)


def isa_family(arch: str) -> str | None:
    """Return the instruction-set family of a ``uname -m`` value (``x86``, ``arm``, ``riscv``), None if unknown."""
    if arch in ("x86_64", "amd64") or (len(arch) == 4 and arch[0] == "i" and arch.endswith("86")):
        return "x86"
    if arch.startswith(("aarch64", "arm")):
        return "arm"
    if arch.startswith("riscv"):
        return "riscv"
    return None


def cpuinfo_family(text: str) -> str | None:
    """Return the instruction-set family a ``/proc/cpuinfo`` text describes, None if it does not say."""
    keys = {line.partition(":")[0].strip() for line in text.splitlines() if ":" in line}
    if "vendor_id" in keys and "flags" in keys:
        return "x86"
    if "CPU implementer" in keys or "Features" in keys:
        return "arm"
    if "isa" in keys and "mmu" in keys:
        return "riscv"
    return None


def emulated_isa(arch: str, cpuinfo: str, shell_exe: str) -> bool:
    """Whether a probe ran under an instruction-set emulator such as qemu-user (pure).

    Two independent signs, either suffices: the kernel runs the probe's shell through a
    qemu interpreter (binfmt_misc), or ``uname -m`` (which qemu-user answers for
    the guest) names another instruction-set family than the kernel's ``/proc/cpuinfo``.

    Parameters
    ----------
    arch : str
        ``uname -m``.
    cpuinfo : str
        ``/proc/cpuinfo``.
    shell_exe : str
        ``readlink /proc/$$/exe`` of the probe's shell.

    Returns
    -------
    bool
    """
    if "qemu" in shell_exe:  # qemu-aarch64-static, or Debian's /usr/libexec/qemu-binfmt/ links to it
        return True
    guest, host = isa_family(arch), cpuinfo_family(cpuinfo)
    return guest is not None and host is not None and guest != host


def _mib(kb: int | None) -> int | None:
    return kb // 1024 if kb is not None else None


def facts_from_probe(text: str) -> DeviceFacts:
    """Build `DeviceFacts` from the probe's standard output (pure).

    Parameters
    ----------
    text : str
        Output of `devices.facts_probe.PROBE_SCRIPT`.

    Returns
    -------
    DeviceFacts

    Raises
    ------
    ProbeError
        If the output is cut short (no end marker) or says nothing about the machine.
    """
    sections = split_sections(text)
    if "end" not in sections:
        raise ProbeError("probe output is incomplete (no end marker): " + (text.strip()[-200:] or "empty output"))
    arch = sections.get("uname", "").strip()
    if not arch:
        raise ProbeError("probe output has no architecture (uname -m printed nothing)")

    cpu = parse_cpuinfo(sections.get("cpuinfo", ""))
    mem = parse_meminfo(sections.get("meminfo", ""))
    freq = parse_cpufreq(sections.get("cpufreq", ""))
    versions = parse_versions(sections.get("python", ""))
    props = parse_getprop(sections.get("getprop", ""))
    dt_model = sections.get("dt-model", "").strip().strip("\x00") or None
    tegra_line = sections.get("tegrastats", "").strip()
    power_mode = parse_nvpmodel(sections.get("nvpmodel", ""))
    throttled = parse_vcgencmd_throttled(sections.get("vcgencmd", ""))

    details: dict[str, Any] = {}
    throttle: dict[str, Any] = {}
    board = dt_model or cpu.board
    os_text = os_name(parse_os_release(sections.get("os-release", "")))
    mem_total, mem_available = _mib(mem.total_kb), _mib(mem.available_kb)

    if props.get("ro.build.version.sdk") or props.get("ro.build.version.release"):
        platform = "android"
        details["android"] = {key: props[key] for key in _ANDROID_PROPS if key in props}
        phone = " ".join(props[k] for k in ("ro.product.manufacturer", "ro.product.model") if props.get(k))
        board = phone or board
        os_text = f"Android {props.get('ro.build.version.release', '?')} (SDK {props.get('ro.build.version.sdk', '?')})"
        ram = parse_dumpsys_meminfo(sections.get("dumpsys-meminfo", ""))
        if ram:
            details["dumpsys_meminfo"] = ram
        if mem_total is None:
            mem_total, mem_available = _mib(ram.get("total_kb")), _mib(ram.get("free_kb"))
        throttle = parse_thermal_status(sections.get("thermalservice", "")) or {}
    elif power_mode is not None or tegra_line or "jetson" in (board or "").lower():
        platform = "jetson"
        if power_mode is not None:
            throttle = {"source": "nvpmodel -q", "power_mode": power_mode.name, "power_mode_id": power_mode.mode_id}
        if tegra_line:
            stats = parse_tegrastats(tegra_line)
            details["tegrastats"] = {
                "ram_used_mb": stats.ram_used_mb,
                "ram_total_mb": stats.ram_total_mb,
                "cpus": [list(core) if core is not None else "off" for core in stats.cpus],
                "temperatures": stats.temperatures,
            }
            if mem_total is None:
                mem_total = stats.ram_total_mb
    elif throttled is not None or (board or "").startswith("Raspberry Pi"):
        platform = "raspberry-pi"
        throttle = throttled or {}
    else:
        platform = "linux"

    cores = _int_or_none(sections.get("online", "").strip()) or (cpu.processors or None)
    cur_khz = freq.cur_khz
    if cur_khz is None and cpu.mhz is not None:
        cur_khz = round(cpu.mhz * 1000)
    return DeviceFacts(
        arch=arch,
        platform=platform,
        board=board,
        cpu_model=cpu.model,
        cores=cores,
        usable_cores=_int_or_none(sections.get("nproc", "").strip()),
        max_freq_khz=freq.max_khz,
        cur_freq_khz=cur_khz,
        governor=freq.governor,
        mem_total_mb=mem_total,
        mem_available_mb=mem_available,
        os=os_text,
        python=versions["python"],
        numpy=versions["numpy"],
        onnxruntime=versions["onnxruntime"],
        torch=versions["torch"],
        thermal=parse_thermal(sections.get("thermal", "")),
        throttle=throttle,
        details=details,
        emulated_isa=emulated_isa(arch, sections.get("cpuinfo", ""), sections.get("exe", "")),
        power=parse_power(sections.get("power", ""), sections.get("pmic", "")),
    )


# --------------------------------------------------------------------------------------
# I/O: probing devices
# --------------------------------------------------------------------------------------


def probe_device(
    transport: Transport, python: str | Sequence[str] = "python3", timeout: float = 20.0, power_root: str = "/"
) -> DeviceFacts:
    """Run the probe on one device (one command) and parse its output.

    Parameters
    ----------
    transport : Transport
        An open transport to the device.
    python : str or sequence of str
        The device's Python interpreter (``Device.python``), or the command that starts
        the runner's Python (`devices.site.python_argv`, a runtime bundle's loader): the
        probe then reports the packages that Python sees.
    timeout : float
        Seconds the probe may take.
    power_root : str
        Where the device's power-sensor files lie (``Device.power_root``).

    Returns
    -------
    DeviceFacts

    Raises
    ------
    TransportError
        From the transport (e.g. `CommandTimeout`), or `ProbeError` when the probe's
        output is unusable.
    """
    result = transport.run(probe_argv(python, power_root), timeout=timeout)
    try:
        return facts_from_probe(result.stdout)
    except ProbeError as exc:
        detail = f" (exit status {result.rc}; stderr: {result.stderr.strip()[-200:]})" if not result.ok else ""
        raise ProbeError(f"{exc}{detail}") from None


#: Seconds allowed per device beyond the probe timeout (connect timeout 10 s plus slack).
_CONNECT_MARGIN_S = 15.0


def _default_connect(device: Device) -> Transport:
    from devices.connect import connect

    return connect(device)


def collect_facts(
    fleet: Fleet,
    connect: Callable[[Device], Transport] | None = None,
    timeout: float = 20.0,
    max_workers: int = 8,
    python: Callable[[Transport, Device], Sequence[str]] | None = None,
) -> FleetResult[DeviceFacts]:
    """Probe every device of ``fleet`` concurrently.

    Parameters
    ----------
    fleet : Fleet
        The devices to probe.
    connect : callable, optional
        ``Device -> Transport``; `devices.connect.connect` when ``None``.
    timeout : float
        Seconds the probe command may run on each device (connecting has the
        transport's own connect timeout).
    max_workers : int
        Devices probed at once.
    python : callable, optional
        ``(transport, device) -> argv`` that starts the device's Python the way its runner
        starts (default `devices.site.python_argv`: its own interpreter with the
        provisioned site), so the versions reported are the ones the runner imports.

    Returns
    -------
    FleetResult
        ``successes``: device name -> `DeviceFacts`; ``failures``: device name ->
        ``DeviceFailure(kind, message)`` with kind ``unreachable``, ``authentication
        failed``, ``host key rejected``, ``timeout``, ``connection lost`` or ``runner
        error``. One failing device never stops the others.
    """
    from devices.group import run_on_fleet

    opener = connect or _default_connect
    starter = python or (lambda _transport, device: python_argv(device.python, device.workdir))

    def action(device: Device) -> DeviceFacts:
        transport = opener(device)
        try:
            facts = probe_device(transport, starter(transport, device), timeout, device.power_root)
        finally:
            transport.close()
        if device.emulate is not None and device.emulate.arch is not None and not facts.emulated_isa:
            facts = replace(facts, emulated_isa=True)  # the fleet file says so even if the probe cannot tell
        if device.emulate is not None and device.emulate.power is not None:
            facts = replace(facts, power=tuple(replace(sensor, emulated=True) for sensor in facts.power))
        return facts

    # Backstop for a device that hangs outside the probe's own timeout (connecting,
    # closing): each wave of ``max_workers`` devices gets the probe timeout plus
    # _CONNECT_MARGIN_S; devices still running then are recorded as ``timeout``.
    waves = -(-len(fleet.devices) // max(1, max_workers))
    return run_on_fleet(
        fleet.devices, action, max_workers=max_workers, timeout=max(1, waves) * (timeout + _CONNECT_MARGIN_S)
    )


# --------------------------------------------------------------------------------------
# CLI
# --------------------------------------------------------------------------------------


def _mhz(khz: int | None) -> str:
    return f"{khz / 1000:.0f} MHz" if khz is not None else "-"


def _text(value: object) -> str:
    return "-" if value is None or value == {} else str(value)


def format_facts(name: str, facts: DeviceFacts) -> str:
    """Return a human-readable block for one device's facts.

    Parameters
    ----------
    name : str
        Device name.
    facts : DeviceFacts

    Returns
    -------
    str
        Lines ``  key  value`` under a ``name (platform)`` heading.
    """
    mem = f"{_text(facts.mem_available_mb)} / {_text(facts.mem_total_mb)} MiB available"
    cores = _text(facts.cores) + (
        f" ({facts.usable_cores} usable)" if facts.usable_cores not in (None, facts.cores) else ""
    )
    thermal = ", ".join(f"{zone} {celsius:.1f}C" for zone, celsius in facts.thermal.items())
    throttle = ", ".join(
        f"{key}={value}" for key, value in facts.throttle.items() if key != "source" and value is not False
    )
    if facts.throttle and not throttle.replace(f"raw={facts.throttle.get('raw')}", "").strip(", "):
        throttle += " (no flags set)"
    rows = [
        ("arch", facts.arch + (" (emulated ISA: timings are not a device's)" if facts.emulated_isa else "")),
        ("board", _text(facts.board)),
        ("cpu", _text(facts.cpu_model)),
        ("cores", cores),
        ("frequency", f"max {_mhz(facts.max_freq_khz)}, now {_mhz(facts.cur_freq_khz)}, {_text(facts.governor)}"),
        ("memory", mem),
        ("os", _text(facts.os)),
        ("python", facts.python),
        ("numpy", facts.numpy),
        ("onnxruntime", facts.onnxruntime),
        ("torch", facts.torch),
        ("thermal", thermal or "-"),
        ("throttle", f"{facts.throttle['source']}: {throttle}" if facts.throttle else "-"),
        ("power", describe_power(facts.power)),
    ]
    return "\n".join([f"{name} ({facts.platform})"] + [f"  {key:<12} {value}" for key, value in rows])


def cmd_facts(args: argparse.Namespace, python: Callable[[Transport, Device], Sequence[str]] | None = None) -> int:
    """Handle ``fleetbench fleet facts FILE [--json] [--timeout S]``.

    Parameters
    ----------
    args : argparse.Namespace
        ``file``, ``json``, ``timeout``.
    python : callable, optional
        How each device starts its Python (`collect_facts`).

    Returns
    -------
    int
        0 when every device answered, 1 when any device failed (a bad fleet file
        raises `FleetFileError`, which the CLI turns into exit status 2).
    """
    from devices.fleetfile import load_fleet

    fleet = load_fleet(args.file)
    result = collect_facts(fleet, timeout=args.timeout, python=python)
    order = [device.name for device in fleet.devices]
    successes = {name: result.successes[name] for name in order if name in result.successes}
    failures = {name: result.failures[name] for name in order if name in result.failures}
    if args.json:
        document = {
            "facts": {name: facts.to_dict() for name, facts in successes.items()},
            "failures": {name: {"kind": f.kind, "message": f.message} for name, f in failures.items()},
        }
        print(json.dumps(document, indent=2))
    else:
        for name, facts in successes.items():
            print(format_facts(name, facts))
            print()
        if failures:
            print("failures:")
            width = max(len(name) for name in failures)
            for name, failure in failures.items():
                print(f"  {name:<{width}}  {failure.kind}: {failure.message}")
        print(f"{len(successes)} of {len(order)} devices answered", file=sys.stderr)
    return 0 if not failures else 1
