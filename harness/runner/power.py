"""The device's power sensors: finding them and reading them, in the formats the devices print.

Standard library only (Python >= 3.8). Five kinds of sensor, each in the format the
device's own kernel or firmware prints:

``ina3221-hwmon``  Jetson (JetPack 5-6): ``sys/bus/i2c/drivers/ina3221/*/hwmon/hwmon*/`` with
                   ``inN_label`` (rail), ``inN_input`` (bus voltage, mV), ``currN_input`` (mA),
                   ``shuntN_resistor`` (µΩ) and ``update_interval`` (ms).
``ina3221-iio``    older JetPacks: ``sys/bus/i2c/drivers/ina3221x/*/iio:device*/`` with
                   ``rail_name_N`` and ``in_powerN_input`` (mW).
``pmic-adc``       Raspberry Pi 5: ``vcgencmd pmic_read_adc``, one line per rail and quantity
                   (``3V7_WL_SW_A current(0)=0.00390372A``, ``3V7_WL_SW_V volt(8)=3.70323000V``);
                   a rail's power is its current times its voltage.
``power-supply``   Android: ``sys/class/power_supply/<battery>/current_now`` (µA, the sign
                   varies by vendor) and ``voltage_now`` (µV); ``status`` of the battery and
                   ``online`` of the other supplies say whether external power is connected.
``rapl``           x86: ``sys/class/powercap/intel-rapl:*/energy_uj``, ``name`` and
                   ``max_energy_range_uj`` (where the counter wraps to 0).

Paths are taken below a root directory (``/`` on a device; another directory for tests
and for the sensors an emulated device's driver writes, `devices.emulation.sensors`).
The parsers are pure functions of a file's text or a command's printout; `discover`,
`read_power`, `read_energy` and `read_once` do the I/O. Every failure is a `PowerError`
naming the file, rail or command and why. The energy over a stretch of readings is
`harness.runner.metering`'s.

Decisions:

* a sensor's ``total`` rails are the ones whose sum is the device's own draw: an input
  rail of the INA3221 (a name ending ``_IN`` or starting ``VIN``) when one is present,
  else every rail; every PMIC rail; the battery; the top-level RAPL zones (``psys``
  alone where present: it holds the packages).
* ``resolution`` is the step of one reading: for a power sensor in W (one count of the
  current file at the rail's voltage when discovered, the largest over the rails; one
  count of the power file for ``ina3221-iio``), for a counter in J (one count).
* a battery on external power shows charging, not the device's draw: such a reading
  is flagged (``external_power``) and never passed off as measured.
"""

from __future__ import annotations

import glob
import math
import os
import re
import shutil
import subprocess
from dataclasses import dataclass, field, replace

#: The kinds of sensor, as `Sensor.kind` names them.
KINDS = ("ina3221-hwmon", "ina3221-iio", "pmic-adc", "power-supply", "rapl")
#: Kinds that count energy (J); the others read power (W).
COUNTER_KINDS = ("rapl",)

HWMON_GLOB = "sys/bus/i2c/drivers/ina3221/*/hwmon/hwmon*"
IIO_GLOB = "sys/bus/i2c/drivers/ina3221x/*/iio:device*"
POWER_SUPPLY_DIR = "sys/class/power_supply"
POWERCAP_GLOB = "sys/class/powercap/intel-rapl:*"
#: The command and argument that print the Raspberry Pi 5 PMIC's readings.
VCGENCMD = "vcgencmd"
PMIC_ARGUMENT = "pmic_read_adc"
#: INA3221 shunt-voltage step (V): one count of current is this over the shunt resistor.
INA3221_SHUNT_LSB_V = 40e-6
#: Battery statuses that mean a charger is connected.
EXTERNAL_STATUSES = ("Charging", "Full", "Not charging")
#: The file, in the root, that says the sensors below it are an emulated device's (`devices.emulation.sensors`).
EMULATED_MARK = "fleetbench-emulated"
#: Seconds `run_vcgencmd` waits for the command.
VCGENCMD_TIMEOUT_S = 5.0


class PowerError(Exception):
    """A sensor that cannot be read: the message names the file, rail or command and why."""


@dataclass(frozen=True)
class Sensor:
    """One power sensor of the device.

    Attributes
    ----------
    kind : str
        One of `KINDS`.
    source : str
        Its directory (sysfs kinds; ``power_supply`` for ``power-supply``, whose rails are
        its battery directories) or the path of ``vcgencmd``.
    rails : tuple of str
        Rail names (INA3221 labels, PMIC rails, the battery's directory name, RAPL zone names).
    channels : tuple of str
        Per rail, where it is read: the INA3221 channel number, the PMIC rail, the battery's
        directory, the RAPL zone's directory.
    total : tuple of str
        The rails whose sum is the device's own draw (see the module's decisions).
    resolution : float
        Step of one reading: W for a power sensor, J for a counter.
    update_interval_s : float or None
        How often the sensor updates its readings, where it says (hwmon ``update_interval``).
    emulated : bool
        Its files were written by an emulated device's driver (`EMULATED_MARK` in the root).
    """

    kind: str
    source: str
    rails: tuple = ()
    channels: tuple = ()
    total: tuple = ()
    resolution: float = 0.0
    update_interval_s: float | None = None
    emulated: bool = False

    @property
    def counter(self) -> bool:
        """Whether it counts energy (J) rather than reading power (W)."""
        return self.kind in COUNTER_KINDS

    def channel(self, rail: str) -> str:
        """Return where ``rail`` is read.

        Parameters
        ----------
        rail : str

        Returns
        -------
        str

        Raises
        ------
        PowerError
            The sensor has no such rail.
        """
        if rail not in self.rails:
            raise PowerError(f"{self.kind} {self.source}: rail {rail!r} not found (rails: {', '.join(self.rails)})")
        return self.channels[self.rails.index(rail)]


@dataclass(frozen=True)
class PowerReading:
    """One reading of a power sensor.

    Attributes
    ----------
    watts : dict of str to float
        Per rail.
    external_power : bool
        A charger is connected (``power-supply``): the battery's current is not the draw.
    """

    watts: dict = field(default_factory=dict)
    external_power: bool = False


def parse_number(text: str, where: str) -> float:
    """Parse one number as a sysfs file holds it.

    Parameters
    ----------
    text : str
        The file's text.
    where : str
        The file, for the message.

    Returns
    -------
    float

    Raises
    ------
    PowerError
        The text is not a number.
    """
    try:
        return float(int(text.strip()))
    except ValueError:
        pass
    try:
        value = float(text.strip())
    except ValueError:
        raise PowerError(f"{where}: not a number: {text.strip()[:40]!r}") from None
    if math.isnan(value) or math.isinf(value):
        raise PowerError(f"{where}: not a number: {text.strip()[:40]!r}")
    return value


def hwmon_power_w(millivolts: str, milliamps: str, where: str = "hwmon") -> float:
    """Return a hwmon INA3221 channel's power from its ``inN_input`` (mV) and ``currN_input`` (mA) texts.

    Parameters
    ----------
    millivolts, milliamps : str
    where : str
        The channel, for messages.

    Returns
    -------
    float
        Watts.
    """
    return parse_number(millivolts, f"{where} in_input") * parse_number(milliamps, f"{where} curr_input") / 1e6


def iio_power_w(milliwatts: str, where: str = "iio") -> float:
    """Return an iio INA3221 rail's power from its ``in_powerN_input`` text (mW).

    Parameters
    ----------
    milliwatts : str
    where : str

    Returns
    -------
    float
        Watts.
    """
    return parse_number(milliwatts, where) / 1e3


_PMIC_LINE = re.compile(r"^\s*(\S+)_([AV])\s+(current|volt)\(\d+\)=\s*([-+0-9.eE]+)\s*[AV]\s*$")


def parse_pmic_adc(text: str) -> dict:
    """Parse ``vcgencmd pmic_read_adc`` into ``{rail: (amperes, volts)}``.

    Lines ``NAME_A current(N)=XA`` carry a rail's current, ``NAME_V volt(N)=YV`` its
    voltage; a rail with only one of them (``EXT5V_V``, ``BATT_V``) is left out.

    Parameters
    ----------
    text : str
        The command's printout.

    Returns
    -------
    dict of str to tuple of float
        In the printout's order of the current lines.
    """
    amps: dict = {}
    volts: dict = {}
    for line in text.splitlines():
        match = _PMIC_LINE.match(line)
        if match:
            name, _, quantity, value = match.groups()
            (amps if quantity == "current" else volts)[name] = float(value)
    return {rail: (current, volts[rail]) for rail, current in amps.items() if rail in volts}


def pmic_decimals(text: str) -> int:
    """Return the most decimals a ``pmic_read_adc`` current is printed with (its step is 10**-decimals A).

    Parameters
    ----------
    text : str

    Returns
    -------
    int
    """
    found = re.findall(r"current\(\d+\)=\s*[-+]?\d*\.(\d+)A", text)
    return max((len(digits) for digits in found), default=0)


def power_supply_power_w(microamps: str, microvolts: str, where: str = "battery") -> float:
    """Return a battery's power from ``current_now`` (µA) and ``voltage_now`` (µV) texts.

    The sign of ``current_now`` differs between vendors (some count discharge as
    negative, some as positive); the magnitude is taken.

    Parameters
    ----------
    microamps, microvolts : str
    where : str

    Returns
    -------
    float
        Watts (>= 0).
    """
    current = parse_number(microamps, f"{where}/current_now")
    voltage = parse_number(microvolts, f"{where}/voltage_now")
    return abs(current) * voltage / 1e12


def on_external_power(status: str | None, online: list) -> bool:
    """Whether a battery's counters show charging rather than the device's draw.

    Parameters
    ----------
    status : str or None
        The battery's ``status`` text (Charging, Discharging, Full, Not charging).
    online : list of str
        The ``online`` texts of the other supplies (``usb``, ``ac``, ...).

    Returns
    -------
    bool
        A supply is online, or the status is not ``Discharging``.
    """
    if any(text.strip() == "1" for text in online):
        return True
    return status is not None and status.strip() in EXTERNAL_STATUSES


def total_rails(kind: str, rails: list, top_level: list | None = None) -> tuple:
    """Return the rails whose sum is the device's own draw (see the module's decisions).

    Parameters
    ----------
    kind : str
    rails : list of str
    top_level : list of bool, optional
        RAPL: per rail, whether its zone is a top-level one.

    Returns
    -------
    tuple of str
    """
    if kind in ("ina3221-hwmon", "ina3221-iio"):
        inputs = [r for r in rails if r.upper().endswith("_IN") or r.upper().startswith("VIN")]
        return tuple(inputs[:1] or rails)
    if kind == "rapl" and top_level is not None:
        tops = [r for r, top in zip(rails, top_level) if top]  # noqa: B905 - zip(strict=) needs Python 3.10
        return tuple([r for r in tops if r == "psys"] or tops)
    return tuple(rails)


# ---------------------------------------------------------------------------- I/O


def read_text(path: str) -> str:
    """Read a sensor file.

    Parameters
    ----------
    path : str

    Returns
    -------
    str
        Its text, stripped.

    Raises
    ------
    PowerError
        ``PATH: missing`` or ``PATH: unreadable (reason)``.
    """
    try:
        with open(path) as handle:
            return handle.read().strip()
    except FileNotFoundError:
        raise PowerError(f"{path}: missing") from None
    except (OSError, UnicodeDecodeError) as exc:
        reason = getattr(exc, "strerror", None) or str(exc)
        raise PowerError(f"{path}: unreadable ({reason})") from None


def _optional(path: str) -> str | None:
    try:
        return read_text(path)
    except PowerError:
        return None


def run_vcgencmd(command: str | None) -> str:
    """Run ``vcgencmd pmic_read_adc`` and return its printout.

    Parameters
    ----------
    command : str or None
        The path of ``vcgencmd`` (None: it is not installed).

    Returns
    -------
    str

    Raises
    ------
    PowerError
        Not installed, failed to start, timed out, or a non-zero exit status.
    """
    if command is None:
        raise PowerError(f"{VCGENCMD}: not installed (not on PATH)")
    try:
        done = subprocess.run(
            [command, PMIC_ARGUMENT],
            capture_output=True,
            text=True,
            timeout=VCGENCMD_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        raise PowerError(f"{command} {PMIC_ARGUMENT}: cannot run ({exc})") from None
    if done.returncode != 0:
        said = (done.stderr or done.stdout).strip()[-200:]
        raise PowerError(f"{command} {PMIC_ARGUMENT}: exit status {done.returncode}: {said}")
    return done.stdout


def _numeric_suffix(path: str) -> int:
    digits = re.findall(r"\d+", os.path.basename(path))
    return int(digits[-1]) if digits else 0


def _discover_hwmon(root: str) -> list:
    sensors = []
    for directory in sorted(glob.glob(os.path.join(root, HWMON_GLOB))):
        rails, channels = [], []
        resolution = 0.0
        for label_path in sorted(glob.glob(os.path.join(directory, "in*_label")), key=_numeric_suffix):
            channel = os.path.basename(label_path)[2 : -len("_label")]
            label = _optional(label_path)
            if not label or label == "NC" or not os.path.exists(os.path.join(directory, f"curr{channel}_input")):
                continue
            rails.append(label)
            channels.append(channel)
            volts = parse_number(_optional(os.path.join(directory, f"in{channel}_input")) or "0", label_path) / 1e3
            shunt = _optional(os.path.join(directory, f"shunt{channel}_resistor"))
            amps_step = 1e-3
            if shunt and shunt.isdigit() and int(shunt) > 0:
                amps_step = max(amps_step, INA3221_SHUNT_LSB_V / (int(shunt) / 1e6))
            resolution = max(resolution, amps_step * volts)
        if not rails:
            continue
        interval = _optional(os.path.join(directory, "update_interval"))
        sensors.append(
            Sensor(
                "ina3221-hwmon",
                directory,
                tuple(rails),
                tuple(channels),
                total_rails("ina3221-hwmon", rails),
                resolution,
                int(interval) / 1e3 if interval and interval.isdigit() else None,
            )
        )
    return sensors


def _discover_iio(root: str) -> list:
    sensors = []
    for directory in sorted(glob.glob(os.path.join(root, IIO_GLOB))):
        rails, channels = [], []
        for name_path in sorted(glob.glob(os.path.join(directory, "rail_name_*")), key=_numeric_suffix):
            channel = name_path.rsplit("_", 1)[1]
            name = _optional(name_path)
            if name and os.path.exists(os.path.join(directory, f"in_power{channel}_input")):
                rails.append(name)
                channels.append(channel)
        if rails:
            sensors.append(
                Sensor("ina3221-iio", directory, tuple(rails), tuple(channels), total_rails("ina3221-iio", rails), 1e-3)
            )
    return sensors


def _discover_pmic(which) -> list:  # noqa: ANN001 - shutil.which or a test's stand-in
    command = which(VCGENCMD)
    if command is None:
        return []
    try:
        text = run_vcgencmd(command)
    except PowerError:
        return []  # a Raspberry Pi 4's vcgencmd knows no pmic_read_adc
    rails = parse_pmic_adc(text)
    if not rails:
        return []
    names = list(rails)
    step = 10.0 ** -pmic_decimals(text)
    resolution = max(step * volts for _, volts in rails.values())
    return [Sensor("pmic-adc", command, tuple(names), tuple(names), tuple(names), resolution)]


def _supplies(directory: str) -> list:
    try:
        return sorted(os.listdir(directory))
    except OSError:
        return []


def _discover_power_supply(root: str) -> list:
    directory = os.path.join(root, POWER_SUPPLY_DIR)
    batteries = []
    for name in _supplies(directory):
        supply = os.path.join(directory, name)
        kind = _optional(os.path.join(supply, "type"))
        if (kind == "Battery" or name == "battery") and os.path.exists(os.path.join(supply, "current_now")):
            batteries.append(name)
    if not batteries:
        return []
    resolution = 0.0
    for name in batteries:
        microvolts = _optional(os.path.join(directory, name, "voltage_now")) or "0"
        resolution = max(resolution, 1e-6 * abs(parse_number(microvolts, f"{name}/voltage_now")) / 1e6)
    rails = tuple(batteries)
    return [Sensor("power-supply", directory, rails, rails, rails, resolution)]


def _discover_rapl(root: str) -> list:
    zones = [z for z in glob.glob(os.path.join(root, POWERCAP_GLOB)) if os.path.exists(os.path.join(z, "energy_uj"))]
    zones.sort(key=lambda z: [int(n) for n in re.findall(r"\d+", os.path.basename(z))])
    if not zones:
        return []
    names = [_optional(os.path.join(z, "name")) or os.path.basename(z) for z in zones]
    rails = [n if names.count(n) == 1 else f"{n}/{os.path.basename(z)}" for n, z in zip(names, zones)]  # noqa: B905 - zip(strict=) needs Python 3.10
    top = [os.path.basename(z).count(":") == 1 for z in zones]
    source = os.path.dirname(zones[0])
    channels = tuple(os.path.basename(z) for z in zones)
    return [Sensor("rapl", source, tuple(rails), channels, total_rails("rapl", rails, top), 1e-6)]


def discover(root: str = "/", which=shutil.which) -> tuple:  # noqa: ANN001 - shutil.which or a stand-in
    """Find the power sensors present under ``root`` and ``vcgencmd`` on PATH.

    Parameters
    ----------
    root : str
        The directory sysfs paths are taken below (``/`` on a device).
    which : callable
        ``name -> path or None`` (`shutil.which`): where ``vcgencmd`` is.

    Returns
    -------
    tuple of Sensor
        In the order of `KINDS`; empty where the device has none. Those below a root
        holding `EMULATED_MARK` are marked emulated (not the PMIC: it is a command's).
    """
    emulated = os.path.isfile(os.path.join(root, EMULATED_MARK))
    files = _discover_hwmon(root) + _discover_iio(root)
    files_after = _discover_power_supply(root) + _discover_rapl(root)
    return tuple(
        [replace(s, emulated=emulated) for s in files]
        + _discover_pmic(which)
        + [replace(s, emulated=emulated) for s in files_after]
    )


def read_power(sensor: Sensor) -> PowerReading:
    """Read every rail of a power sensor.

    Parameters
    ----------
    sensor : Sensor
        Not a counter.

    Returns
    -------
    PowerReading

    Raises
    ------
    PowerError
        A file missing or unreadable, a rail gone from the printout, ``vcgencmd`` not
        installed or failing, a battery without ``current_now``; or a counter.
    """
    watts: dict = {}
    external = False
    if sensor.kind == "ina3221-hwmon":
        for rail, channel in zip(sensor.rails, sensor.channels):  # noqa: B905 - zip(strict=) needs Python 3.10
            base = os.path.join(sensor.source, "{}" + channel + "_input")
            watts[rail] = hwmon_power_w(read_text(base.format("in")), read_text(base.format("curr")), rail)
    elif sensor.kind == "ina3221-iio":
        for rail, channel in zip(sensor.rails, sensor.channels):  # noqa: B905 - zip(strict=) needs Python 3.10
            path = os.path.join(sensor.source, f"in_power{channel}_input")
            watts[rail] = iio_power_w(read_text(path), path)
    elif sensor.kind == "pmic-adc":
        command = sensor.source if os.path.exists(sensor.source) else shutil.which(VCGENCMD)
        found = parse_pmic_adc(run_vcgencmd(command))
        for rail in sensor.rails:
            if rail not in found:
                raise PowerError(f"{VCGENCMD} {PMIC_ARGUMENT}: rail {rail!r} not found in the printout")
            amps, volts = found[rail]
            watts[rail] = abs(amps) * volts
    elif sensor.kind == "power-supply":
        online = []
        for name in _supplies(sensor.source):
            if name not in sensor.channels:
                text = _optional(os.path.join(sensor.source, name, "online"))
                online.append(text or "0")
        for rail, channel in zip(sensor.rails, sensor.channels):  # noqa: B905 - zip(strict=) needs Python 3.10
            directory = os.path.join(sensor.source, channel)
            current = os.path.join(directory, "current_now")
            if not os.path.exists(current):
                raise PowerError(f"{current}: missing (no current_now: this battery reports no current)")
            watts[rail] = power_supply_power_w(
                read_text(current), read_text(os.path.join(directory, "voltage_now")), directory
            )
            external = external or on_external_power(_optional(os.path.join(directory, "status")), online)
    elif sensor.kind in COUNTER_KINDS:
        raise PowerError(f"{sensor.kind} {sensor.source}: counts energy; read it with read_energy")
    else:
        raise PowerError(f"unknown sensor kind {sensor.kind!r}")
    return PowerReading(watts, external)


def read_energy(sensor: Sensor) -> dict:
    """Read every rail of an energy counter.

    Parameters
    ----------
    sensor : Sensor
        A counter (``rapl``).

    Returns
    -------
    dict of str to tuple of (float, float or None)
        Per rail, the counter (J) and where it wraps (J; None when not given).

    Raises
    ------
    PowerError
        A file missing or unreadable; or a power sensor.
    """
    if not sensor.counter:
        raise PowerError(f"{sensor.kind} {sensor.source}: reads power; read it with read_power")
    out = {}
    for rail, channel in zip(sensor.rails, sensor.channels):  # noqa: B905 - zip(strict=) needs Python 3.10
        zone = os.path.join(sensor.source, channel)
        path = os.path.join(zone, "energy_uj")
        energy = parse_number(read_text(path), path) / 1e6
        wrap_text = _optional(os.path.join(zone, "max_energy_range_uj"))
        wrap = parse_number(wrap_text, zone) / 1e6 if wrap_text else None
        out[rail] = (energy, wrap)
    return out


def read_once(sensor: Sensor) -> tuple:
    """Read every rail of a sensor once, whatever its kind.

    Parameters
    ----------
    sensor : Sensor

    Returns
    -------
    values : dict
        ``{rail: watts}`` for a power sensor (`read_power`), ``{rail: (joules, wrap)}`` for
        a counter (`read_energy`): what `integrate` takes.
    external_power : bool
        A charger is connected (`PowerReading.external_power`).

    Raises
    ------
    PowerError
        As `read_power` and `read_energy`.
    """
    if sensor.counter:
        return read_energy(sensor), False
    reading = read_power(sensor)
    return reading.watts, reading.external_power


def missing_reason(root: str, kind: str, which=shutil.which) -> str:  # noqa: ANN001 - shutil.which or a stand-in
    """Say why `discover` found no sensor of ``kind`` below ``root``.

    Parameters
    ----------
    root : str
    kind : str
        One of `KINDS`: the sensor the device was expected to have.
    which : callable
        As for `discover`.

    Returns
    -------
    str
        ``vcgencmd``'s own failure (not installed, no ``pmic_read_adc``, no rails); a
        battery without ``current_now`` named by its file; else which directory holds none.
    """
    if kind not in KINDS:
        return f"unknown sensor kind {kind!r} (kinds: {', '.join(KINDS)})"
    if kind == "pmic-adc":
        try:
            run_vcgencmd(which(VCGENCMD))
        except PowerError as exc:
            return str(exc)
        return f"{VCGENCMD} {PMIC_ARGUMENT}: no rail with both a current and a voltage in its printout"
    if kind == "power-supply":
        directory = os.path.join(root, POWER_SUPPLY_DIR)
        for name in _supplies(directory):
            supply = os.path.join(directory, name)
            if _optional(os.path.join(supply, "type")) == "Battery" or name == "battery":
                current = os.path.join(supply, "current_now")
                return f"{current}: missing (no current_now: this battery reports no current)"
        return f"{directory}: no battery"
    where = {"ina3221-hwmon": HWMON_GLOB, "ina3221-iio": IIO_GLOB, "rapl": POWERCAP_GLOB}[kind]
    return f"{os.path.join(root, where)}: no {kind} sensor"


