"""Readings of the device around a run: cpu frequencies, thermal zones, memory, load, versions, matmul rate.

Standard library only at import; every reading degrades to empty or None where the
system does not expose it.

Decisions:

* throttled: true when, on any cpu, the frequency after the run is more than 5 %
  below the frequency before it, or when any thermal zone is at or above one of
  its ``passive`` trip points after the run. A heuristic: governors also lower
  the frequency of idle cpus, so read it with the raw frequencies.
* peak memory is the whole process's (interpreter, runtime, probe, data).
* the matmul probe (256 x 256 float32, repeated for about ``--matmul-seconds``, 0.2 s
  by default; 0 skips it, as a campaign's later passes of a cell do) runs after the
  timed steps and the "after" readings (`harness.runner.bench`).
"""

from __future__ import annotations

import glob
import os
import sys
import time

from .protocol import MATMUL_SECONDS

#: A frequency drop larger than this fraction between before and after counts as throttling.
THROTTLE_DROP = 0.05


def _read(path: str) -> str | None:
    try:
        with open(path) as handle:
            return handle.read().strip()
    except (OSError, ValueError):
        return None


def cpu_frequencies_khz() -> list:
    """Return the current frequency of every cpu in kHz (empty where not exposed).

    Returns
    -------
    list of int or None
        One entry per ``/sys/devices/system/cpu/cpuN``, in N order; ``None`` for
        a cpu without a readable ``scaling_cur_freq`` / ``cpuinfo_cur_freq``.
    """
    cpus = glob.glob("/sys/devices/system/cpu/cpu[0-9]*")
    cpus.sort(key=lambda p: int(os.path.basename(p)[3:]))
    out = []
    for cpu in cpus:
        value = None
        for name in ("scaling_cur_freq", "cpuinfo_cur_freq"):
            text = _read(os.path.join(cpu, "cpufreq", name))
            if text is not None and text.isdigit():
                value = int(text)
                break
        out.append(value)
    return out if any(v is not None for v in out) else []


def thermal_zones() -> tuple:
    """Read every thermal zone's temperature and passive trip points.

    Returns
    -------
    temps : dict of str to float
        Celsius by zone type (``type#N`` for a repeated type).
    passive : dict of str to list of float
        Passive trip points in Celsius by the same keys.
    """
    temps: dict = {}
    passive: dict = {}
    zones = glob.glob("/sys/class/thermal/thermal_zone[0-9]*")
    zones.sort(key=lambda p: int(os.path.basename(p)[len("thermal_zone") :]))
    for zone in zones:
        text = _read(os.path.join(zone, "temp"))
        try:
            celsius = int(text or "") / 1000.0
        except ValueError:
            continue
        kind = _read(os.path.join(zone, "type")) or os.path.basename(zone)
        key, n = kind, 1
        while key in temps:
            n += 1
            key = f"{kind}#{n}"
        temps[key] = celsius
        trips = []
        for trip_type in glob.glob(os.path.join(zone, "trip_point_*_type")):
            if _read(trip_type) == "passive":
                trip = _read(trip_type[: -len("type")] + "temp")
                if trip is not None and trip.lstrip("-").isdigit() and int(trip) > 0:
                    trips.append(int(trip) / 1000.0)
        passive[key] = trips
    return temps, passive


def throttled(freq_before: list, freq_after: list, temps_after: dict, passive: dict) -> bool:
    """Decide whether the device throttled during the run.

    Parameters
    ----------
    freq_before, freq_after : list of int or None
        Per-cpu kHz before and after.
    temps_after : dict of str to float
        Celsius per zone after the run.
    passive : dict of str to list of float
        Passive trip points per zone.

    Returns
    -------
    bool
        True when some cpu's frequency fell by more than `THROTTLE_DROP`, or a
        zone is at or above one of its passive trip points.
    """
    for before, after in zip(freq_before, freq_after):  # noqa: B905 - zip(strict=) needs Python 3.10
        if before and after is not None and after < (1.0 - THROTTLE_DROP) * before:
            return True
    for key, celsius in temps_after.items():
        if any(celsius >= trip for trip in passive.get(key, ())):
            return True
    return False


def peak_memory() -> tuple:
    """Return the process's peak resident set and where it came from.

    Returns
    -------
    bytes : int or None
    source : {"VmHWM", "ru_maxrss"} or None
    """
    text = _read("/proc/self/status")
    if text:
        for line in text.splitlines():
            if line.startswith("VmHWM:"):
                parts = line.split()
                if len(parts) >= 2 and parts[1].isdigit():
                    return int(parts[1]) * 1024, "VmHWM"
    try:
        import resource

        maxrss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    except (ImportError, OSError, AttributeError):
        return None, None
    # Linux reports kilobytes, macOS bytes.
    return int(maxrss) * (1 if sys.platform == "darwin" else 1024), "ru_maxrss"


def reset_peak_memory() -> bool:
    """Reset the process's peak resident set (VmHWM) to its current size.

    Writes ``5`` to ``/proc/self/clear_refs`` (Linux 4.0+); VmHWM then measures from now.

    Returns
    -------
    bool
        Whether the reset worked (else VmHWM is the peak since the process started).
    """
    try:
        with open("/proc/self/clear_refs", "w") as handle:
            handle.write("5")
        return True
    except OSError:
        return False


def _dist_version(*names: str) -> str | None:
    try:
        from importlib import metadata
    except ImportError:  # pragma: no cover - Python < 3.8
        return None
    for name in names:
        try:
            return metadata.version(name)
        except Exception:  # noqa: BLE001 - any metadata problem means "unknown"
            continue
    return None


def versions(result: dict) -> None:
    """Fill ``result["versions"]`` without importing runtimes that are not loaded yet.

    Parameters
    ----------
    result : dict
    """
    v = result["versions"]
    for key, module, dists in (
        ("numpy", "numpy", ("numpy",)),
        ("onnxruntime", "onnxruntime", ("onnxruntime-training", "onnxruntime")),
        ("torch", "torch", ("torch",)),
    ):
        loaded = sys.modules.get(module)
        version = getattr(loaded, "__version__", None) if loaded is not None else None
        v[key] = str(version) if version else _dist_version(*dists)


def matmul_gflops(np, seconds: float = MATMUL_SECONDS, n: int = 256) -> float:
    """Measure numpy's achievable float32 matmul rate.

    Parameters
    ----------
    np : module
        numpy.
    seconds : float
        Approximate probe duration.
    n : int
        Matrix size.

    Returns
    -------
    float
        GFLOP/s (``2 n**3`` per product).
    """
    rng = np.random.default_rng(0)
    a = rng.standard_normal((n, n), dtype=np.float32)
    b = rng.standard_normal((n, n), dtype=np.float32)
    c = np.empty((n, n), dtype=np.float32)
    np.matmul(a, b, out=c)  # warm the BLAS up
    reps = 0
    start = time.perf_counter()
    elapsed = 0.0
    while elapsed < seconds:
        for _ in range(4):
            np.matmul(a, b, out=c)
        reps += 4
        elapsed = time.perf_counter() - start
    return 2.0 * n**3 * reps / elapsed / 1e9


def cpus_available() -> int | None:
    """Return how many cpus this process may run on (its affinity mask, else the cpu count).

    Returns
    -------
    int or None
    """
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count()


def load_average() -> list:
    """Return the 1, 5 and 15 minute load averages (empty where the system has none).

    Returns
    -------
    list of float
    """
    try:
        return [round(v, 2) for v in os.getloadavg()]
    except (AttributeError, OSError):
        return []


def readings_before(result: dict) -> dict:
    """Read cpu frequencies and temperatures before a run into ``result``.

    Parameters
    ----------
    result : dict

    Returns
    -------
    dict
        The passive trip points per thermal zone (for `readings_after`).
    """
    freq = cpu_frequencies_khz()
    temps, passive = thermal_zones()
    result["cpu_freq_khz"]["before"] = freq
    result["thermal_c"]["before"] = temps
    return passive


def readings_after(result: dict, passive: dict) -> None:
    """Read cpu frequencies and temperatures after a run into ``result`` and judge `throttled`.

    Parameters
    ----------
    result : dict
    passive : dict
        `readings_before`'s trip points.
    """
    freq = cpu_frequencies_khz()
    temps, passive_now = thermal_zones()
    result["cpu_freq_khz"]["after"] = freq
    result["thermal_c"]["after"] = temps
    for key, trips in passive_now.items():
        passive.setdefault(key, trips)
    result["throttled"] = throttled(result["cpu_freq_khz"]["before"], freq, temps, passive)
