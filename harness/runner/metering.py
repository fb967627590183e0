"""The energy of a mode's timed work: an idle window, then the sensor read in a thread while the steps run.

Also the energy of any stretch of readings (`integrate`, `sample`).

Standard library only. ``--power-root DIR`` asks for it (the host passes the device's
power root, `harness.runner.power`); ``--power-sensor KIND`` names the kind of sensor the
device's facts listed, so that one gone missing is said, not silently skipped. Without
``--power-root`` the document's ``energy`` is null, and so it is when no sensor is found
below the root and none was named.

Decisions:

* the sensor is the first `power.discover` finds (of ``--power-sensor``'s kind when
  given); its ``total`` rails are summed.
* a thread reads the sensor every `read_interval` seconds while the main thread steps:
  a training step holds the cpu for longer than any reading, and the runtimes release
  Python's lock while they compute. The first reading is taken in the main thread just
  before the first timed step, the last just after the last one.
* the window must span at least `MIN_UPDATES` updates of the sensor (its own update
  interval where it says one, else the reading interval): ``bench`` steps on past its
  timed samples until it does (within ``--max-seconds``; those steps are not latency
  samples, their images count), and an energy window still shorter is flagged
  ``sensor-slower-than-cell``, its joules kept.
* idle: the sensor is read over an idle window just before the timed steps, after one
  update interval of settling (a sensor averages over its interval, so its first
  reading still holds the last steps of the warm-up). The window lasts `IDLE_WINDOW_S`
  or `MIN_UPDATES` updates, whichever is longer: the timed steps' length is not known
  before they end (the precision rule stops them). ``idle_joules`` is the idle window's
  mean power times the timed window's seconds: the energy an idle window of the same
  length would hold.
* energy from power is the trapezoid integral of the readings; its uncertainty joins
  the standard error of the mean power (over the readings that are independent: one
  per sensor update interval at most) and half a resolution step per rail summed,
  times the duration. Energy from counters is the sum of the differences of consecutive
  readings (a wrap adds the counter's range); its uncertainty is one count per rail at
  each end.
* a battery on external power is flagged ``external-power``, its joules kept but never
  passed off as the device's draw (the host stores none).
* a sensor that cannot be read never fails the run: ``flag`` holds ``power: <reason>``
  (`power.PowerError`'s message) and the joules are null; latency is measured as always.
"""

from __future__ import annotations

import math
import os
import shutil
import threading
import time
from dataclasses import dataclass, field

from . import power

#: Seconds between readings of a sensor that does not say how often it updates.
READ_INTERVAL_S = 0.1
#: Seconds between readings of the Raspberry Pi 5's PMIC: each reading runs ``vcgencmd``.
PMIC_INTERVAL_S = 0.25
#: Fewest sensor updates an energy window must span.
MIN_UPDATES = 2
#: Least seconds of the idle window before the timed steps.
IDLE_WINDOW_S = 0.5
#: The flags of an energy object besides a reading's failure.
EXTERNAL_POWER = "external-power"
SENSOR_SLOWER = "sensor-slower-than-cell"


@dataclass(frozen=True)
class EnergySample:
    """The energy a sensor saw over a stretch of time (`sample`).

    Attributes
    ----------
    kind : str
        The sensor's kind.
    rails : tuple of str
        The rails summed into ``joules``.
    joules : float
    uncertainty_j : float
        See the module's decisions.
    seconds : float
        From the first reading to the last.
    readings : int
    per_rail_j : dict of str to float
        Every rail's energy.
    external_power : bool
        Some reading was taken on external power: ``joules`` is not the device's draw.
    emulated : bool
        The sensor is an emulated device's (`Sensor.emulated`): ``joules`` is a model's.
    """

    kind: str
    rails: tuple
    joules: float
    uncertainty_j: float
    seconds: float
    readings: int
    per_rail_j: dict = field(default_factory=dict)
    external_power: bool = False
    emulated: bool = False


# ---------------------------------------------------------------------------- pure parsers


def counter_delta(before: float, after: float, wrap: float | None) -> float:
    """Return the energy between two readings of a counter that wraps to 0 at ``wrap``.

    Parameters
    ----------
    before, after : float
        Counter values (J).
    wrap : float or None
        Where the counter wraps (``max_energy_range_uj`` in J); None: it never does.

    Returns
    -------
    float

    Raises
    ------
    power.PowerError
        The counter went back and no range says it wraps.
    """
    if after >= before:
        return after - before
    if not wrap:
        raise power.PowerError(f"counter went back from {before} to {after} J and has no wrap-around range")
    return wrap - before + after


def trapezoid_j(times: list, watts: list) -> float:
    """Return the trapezoid integral of power readings over their times.

    Parameters
    ----------
    times : list of float
        Seconds, increasing.
    watts : list of float

    Returns
    -------
    float
        Joules.
    """
    return sum((t1 - t0) * (w0 + w1) / 2.0 for t0, t1, w0, w1 in zip(times, times[1:], watts, watts[1:]))  # noqa: B905 - zip(strict=) needs Python 3.10


def power_uncertainty_j(watts: list, seconds: float, interval: float, sensor: power.Sensor, rails: int) -> float:
    """Return the uncertainty of energy integrated from power readings (see the module's decisions).

    Parameters
    ----------
    watts : list of float
        The summed readings.
    seconds : float
        Their span.
    interval : float
        Seconds between readings.
    sensor : power.Sensor
        For its resolution and update interval.
    rails : int
        How many rails were summed.

    Returns
    -------
    float
        Joules.
    """
    n = len(watts)
    if n < 2 or seconds <= 0:
        return 0.0
    mean = sum(watts) / n
    spread = math.sqrt(sum((w - mean) ** 2 for w in watts) / (n - 1))
    step = max(interval, sensor.update_interval_s or 0.0)
    independent = max(1.0, min(float(n), seconds / step if step > 0 else float(n)))
    quantisation = sensor.resolution * rails / 2.0
    return seconds * math.sqrt((spread / math.sqrt(independent)) ** 2 + quantisation**2)


def sample(
    sensor: power.Sensor,
    seconds: float,
    interval: float,
    rails: tuple | None = None,
    clock=time.monotonic,  # noqa: ANN001 - injectable for tests
    sleep=time.sleep,  # noqa: ANN001
) -> EnergySample:
    """Measure the energy a sensor sees over ``seconds``, reading it every ``interval``.

    Power sensors are integrated over time (`trapezoid_j`); counters are differenced
    reading to reading, so a wrap between two readings is counted once (`counter_delta`).

    Parameters
    ----------
    sensor : power.Sensor
    seconds : float
        How long to sample (at least two readings are taken).
    interval : float
        Seconds between readings (> 0).
    rails : tuple of str, optional
        The rails to sum; the sensor's ``total`` when None.
    clock, sleep : callable
        Time source and sleep (`time.monotonic`, `time.sleep`).

    Returns
    -------
    EnergySample

    Raises
    ------
    power.PowerError
        A reading failed, or a rail is not the sensor's.
    """
    if interval <= 0:
        raise power.PowerError(f"sampling interval must be > 0 s, got {interval}")
    chosen = tuple(rails) if rails is not None else sensor.total
    for rail in chosen:
        sensor.channel(rail)
    times: list = []
    readings: list = []
    external = False
    start = clock()
    while True:
        now = clock()
        values, on_external = power.read_once(sensor)
        external = external or on_external
        readings.append(values)
        times.append(now)
        if len(times) >= 2 and now - start >= seconds:
            break
        remaining = start + seconds - now
        sleep(min(interval, remaining) if remaining > 0 else interval)
    return integrate(sensor, times, readings, chosen, interval, external)


def integrate(
    sensor: power.Sensor, times: list, readings: list, rails: tuple, interval: float, external: bool = False
) -> EnergySample:
    """Return the energy of a sensor's readings over their times (see the module's decisions).

    Parameters
    ----------
    sensor : power.Sensor
    times : list of float
        Seconds of each reading, increasing; at least two.
    readings : list of dict
        Per reading: ``{rail: watts}`` (`PowerReading.watts`) for a power sensor,
        ``{rail: (joules, wrap)}`` (`read_energy`) for a counter.
    rails : tuple of str
        The rails summed into ``joules``.
    interval : float
        Seconds between readings, as asked.
    external : bool
        Some reading was taken on external power.

    Returns
    -------
    EnergySample

    Raises
    ------
    power.PowerError
        Fewer than two readings, or a counter that went back without a wrap-around range.
    """
    if len(times) < 2:
        raise power.PowerError(f"{sensor.kind} {sensor.source}: {len(times)} reading(s); energy needs two")
    chosen = tuple(rails)
    span = times[-1] - times[0]
    per_rail: dict = {}
    if sensor.counter:
        for rail in sensor.rails:
            per_rail[rail] = sum(
                counter_delta(a[rail][0], b[rail][0], b[rail][1])
                for a, b in zip(readings, readings[1:])  # noqa: B905 - zip(strict=) needs Python 3.10
            )
        joules = sum(per_rail[r] for r in chosen)
        uncertainty = 2.0 * sensor.resolution * len(chosen)
    else:
        for rail in sensor.rails:
            per_rail[rail] = trapezoid_j(times, [r[rail] for r in readings])
        joules = sum(per_rail[r] for r in chosen)
        summed = [sum(r[rail] for rail in chosen) for r in readings]
        uncertainty = power_uncertainty_j(summed, span, interval, sensor, len(chosen))
    return EnergySample(sensor.kind, chosen, joules, uncertainty, span, len(times), per_rail, external, sensor.emulated)


def read_interval(sensor: power.Sensor) -> float:
    """Return the seconds between readings of ``sensor``.

    Parameters
    ----------
    sensor : power.Sensor

    Returns
    -------
    float
        Its own update interval where it says one (reading faster only repeats values),
        `PMIC_INTERVAL_S` for the PMIC, else `READ_INTERVAL_S`; also the length of one
        update where the sensor does not say it.
    """
    if sensor.update_interval_s:
        return sensor.update_interval_s
    return PMIC_INTERVAL_S if sensor.kind == "pmic-adc" else READ_INTERVAL_S


def energy_object(
    sensor: str | None,
    rails: tuple = (),
    emulated: bool = False,
    joules: float | None = None,
    idle_joules: float | None = None,
    uncertainty_j: float | None = None,
    seconds: float | None = None,
    images: int = 0,
    external_power: bool = False,
    flag: str | None = None,
) -> dict:
    """Return the document's ``energy`` object (keys in `harness.runner.protocol`).

    Parameters
    ----------
    sensor : str or None
        The sensor's kind.
    rails : tuple of str
        The rails summed.
    emulated : bool
    joules, idle_joules, uncertainty_j, seconds : float or None
    images : int
        Examples the timed steps trained on.
    external_power : bool
    flag : str or None

    Returns
    -------
    dict
    """
    return {
        "sensor": sensor,
        "rails": list(rails),
        "emulated": bool(emulated),
        "joules": joules,
        "idle_joules": idle_joules,
        "uncertainty_j": uncertainty_j,
        "seconds": seconds,
        "images": int(images),
        "external_power": bool(external_power),
        "flag": flag,
    }


class Recording:
    """A sensor read every ``interval`` seconds in a thread of its own, from `start` to `stop`.

    Parameters
    ----------
    sensor : power.Sensor
    interval : float
    clock : callable
        Seconds (`time.perf_counter`).
    """

    def __init__(self, sensor: power.Sensor, interval: float, clock=time.perf_counter) -> None:  # noqa: ANN001
        self.sensor, self.interval, self.clock = sensor, interval, clock
        self.times: list = []
        self.readings: list = []
        self.external = False
        self.error: power.PowerError | None = None
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def _read(self) -> None:
        try:
            values, external = power.read_once(self.sensor)
        except power.PowerError as exc:
            self.error = self.error or exc
            self._stop.set()
            return
        with self._lock:
            self.times.append(self.clock())
            self.readings.append(values)
            self.external = self.external or external

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self._read()

    def start(self) -> None:
        """Take the first reading here, then read in a thread until `stop`."""
        self._read()
        self._thread = threading.Thread(target=self._loop, name="power-sensor", daemon=True)
        self._thread.start()

    def elapsed(self) -> float:
        """Seconds since the first reading (0 before it)."""
        with self._lock:
            return self.clock() - self.times[0] if self.times else 0.0

    def stop(self) -> EnergySample:
        """Stop the thread, take the last reading here and return the energy of the readings.

        Returns
        -------
        EnergySample

        Raises
        ------
        power.PowerError
            A reading failed (the first failure), or fewer than two readings.
        """
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if self.error is None:
            self._read()
        if self.error is not None:
            raise self.error
        return integrate(self.sensor, self.times, self.readings, self.sensor.total, self.interval, self.external)


class Meter:
    """The energy of one run's timed work (see the module's decisions).

    Parameters
    ----------
    sensor : power.Sensor or None
        None: ``failure`` says why there is none.
    failure : str or None
        The flag of a sensor that could not be found or read.
    kind : str or None
        The sensor's kind (the named one when it was not found).
    emulated : bool
        The power root holds the emulated mark.
    clock, sleep : callable
        `time.perf_counter` and `time.sleep`.
    """

    def __init__(
        self,
        sensor: power.Sensor | None,
        failure: str | None = None,
        kind: str | None = None,
        emulated: bool = False,
        clock=time.perf_counter,  # noqa: ANN001
        sleep=time.sleep,  # noqa: ANN001
    ) -> None:
        self.sensor, self.failure = sensor, failure
        self.kind = sensor.kind if sensor is not None else kind
        self.emulated = sensor.emulated if sensor is not None else emulated
        self.clock, self.sleep = clock, sleep
        self.idle_watts: float | None = None
        self.recording: Recording | None = None

    @property
    def need_seconds(self) -> float:
        """Least seconds of an energy window: `MIN_UPDATES` updates of the sensor (0 without one)."""
        return MIN_UPDATES * read_interval(self.sensor) if self.sensor is not None else 0.0

    def _fail(self, exc: power.PowerError) -> None:
        self.failure = self.failure or f"power: {exc}"

    def idle(self) -> float:
        """Read the sensor over an idle window (after one update of settling); return the seconds it took.

        Returns
        -------
        float
            Wall seconds spent (0 without a sensor or after a failure).
        """
        if self.sensor is None or self.failure is not None:
            return 0.0
        began = self.clock()
        interval = read_interval(self.sensor)
        self.sleep(interval)
        try:
            window = sample(self.sensor, max(IDLE_WINDOW_S, self.need_seconds), interval, None, self.clock, self.sleep)
        except power.PowerError as exc:
            self._fail(exc)
        else:
            self.idle_watts = window.joules / window.seconds if window.seconds > 0 else None
        return self.clock() - began

    def start(self) -> None:
        """Start reading the sensor: the timed steps begin now."""
        if self.sensor is None or self.failure is not None:
            return
        self.recording = Recording(self.sensor, read_interval(self.sensor), self.clock)
        self.recording.start()

    def short(self) -> bool:
        """Whether the window so far spans fewer seconds than `need_seconds` (False when not reading)."""
        recording = self.recording
        return recording is not None and recording.error is None and recording.elapsed() < self.need_seconds

    def finish(self, images: int) -> dict:
        """Stop reading: the timed steps ended. Return the document's ``energy`` object.

        Parameters
        ----------
        images : int
            Examples the timed steps (and any steps added for the sensor) trained on.

        Returns
        -------
        dict
            `energy_object`; its joules null and ``flag`` ``power: <reason>`` where the
            sensor failed.
        """
        rails = self.sensor.total if self.sensor is not None else ()
        sample = None
        if self.recording is not None:
            try:
                sample = self.recording.stop()
            except power.PowerError as exc:
                self._fail(exc)
        if sample is None or self.failure is not None:
            failure = self.failure or "power: the sensor was not read"
            return energy_object(self.kind, rails, self.emulated, images=images, flag=failure)
        flag = None
        if sample.external_power:
            flag = EXTERNAL_POWER
        elif sample.seconds < self.need_seconds:
            flag = SENSOR_SLOWER
        idle = self.idle_watts * sample.seconds if self.idle_watts is not None else None
        return energy_object(
            sample.kind, sample.rails, sample.emulated, sample.joules, idle, sample.uncertainty_j, sample.seconds,
            images, sample.external_power, flag,
        )  # fmt: skip


def open_meter(power_root: str | None, power_sensor: str | None = None, which=shutil.which) -> Meter | None:  # noqa: ANN001
    """Return the meter of ``--power-root`` and ``--power-sensor`` (None: energy was not asked for or has no sensor).

    Parameters
    ----------
    power_root : str or None
        Where the device's sensor files lie; None: energy is not measured.
    power_sensor : str or None
        The kind of sensor expected (the device's facts); one not found is a flagged meter.
    which : callable
        ``name -> path or None`` (`shutil.which`), for ``vcgencmd``.

    Returns
    -------
    Meter or None
        None without ``power_root``, or when no sensor is found and none was named.
    """
    if power_root is None:
        return None
    emulated = os.path.isfile(os.path.join(power_root, power.EMULATED_MARK))
    try:
        found = [s for s in power.discover(power_root, which) if power_sensor in (None, s.kind)]
    except power.PowerError as exc:
        return Meter(None, f"power: {exc}", power_sensor, emulated)
    if found:
        return Meter(found[0])
    if power_sensor is None:
        return None
    return Meter(None, f"power: {power.missing_reason(power_root, power_sensor, which)}", power_sensor, emulated)
