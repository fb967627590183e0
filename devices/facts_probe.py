"""The device-facts probe: one POSIX ``sh`` script, one round trip per device.

`PROBE_SCRIPT` runs as ``sh -c PROBE_SCRIPT fleetbench-probe PYTHON...``: the command
that starts the device's Python arrives as the script's arguments (a bare interpreter,
or `devices.site.python_argv`, the way the runner starts), so nothing is ever
interpolated into the script text and the ``python`` section reports what the runner
sees, provisioned packages included.
It prints one section per source, each opened by a line ``@@fleetbench@@ NAME`` and the
whole output closed by ``@@fleetbench@@ end`` (a missing end marker means the output was
cut short). Every probe step is guarded: a missing file or tool leaves its section empty
and never stops the script, so the same script serves a Raspberry Pi, a Jetson, an
Android shell (mksh + toybox) and any Linux box.

Sections
--------
``uname``            ``uname -m``
``online``           ``getconf _NPROCESSORS_ONLN`` (online CPUs)
``nproc``            ``nproc`` (CPUs this process may use: affinity / cpuset)
``cpuinfo``          ``/proc/cpuinfo``
``meminfo``          ``/proc/meminfo``
``cpufreq``          ``key=value`` lines from ``/sys/devices/system/cpu/cpu0/cpufreq/``
``thermal``          ``zone<TAB>type<TAB>temp`` per ``/sys/class/thermal/thermal_zone*``
``os-release``       ``/etc/os-release`` (else ``/usr/lib/os-release``)
``dt-model``         ``/proc/device-tree/model`` (board name on ARM boards)
``python``           ``python=``, ``numpy=``, ``onnxruntime=``, ``torch=`` lines
``vcgencmd``         ``vcgencmd get_throttled`` (Raspberry Pi)
``nvpmodel``         ``nvpmodel -q`` (Jetson)
``tegrastats``       first line of ``tegrastats --interval 500`` (Jetson, at most 2 s)
``getprop``          ``getprop`` (Android)
``dumpsys-meminfo``  the ``... RAM:`` summary lines of ``dumpsys meminfo`` (Android)
``thermalservice``   the ``Thermal Status`` line of ``dumpsys thermalservice`` (Android 10+)
``power``            ``path<TAB>first line`` per power-sensor file below the power root
                     (INA3221 hwmon and iio, ``power_supply``, RAPL; `POWER_FILES` says which
                     names), paths relative to that root; ``path<TAB><TAB>unreadable`` for a
                     file the probe may not read (RAPL's ``energy_uj`` is root's on recent
                     kernels); ``fleetbench-emulated`` when an emulated device's driver
                     wrote the files (`devices.emulation.sensors`)
``pmic``             ``vcgencmd pmic_read_adc`` (Raspberry Pi 5)
``exe``              ``readlink /proc/$$/exe``: the binary the kernel runs the probe's shell
                     with; under qemu-user (binfmt_misc) that is the qemu interpreter, not
                     the shell (a child reads it: qemu fakes only its own process's links)

``dumpsys meminfo`` prints its RAM summary *after* the per-process tables, so the
script keeps the lines containing ``RAM:`` rather than the first lines of the output.

Versions are read from installed package metadata (``importlib.metadata``) after
``importlib.util.find_spec`` says the module exists; a package is imported only when
its metadata is unavailable (Python < 3.8). Importing torch takes seconds on a
Raspberry Pi, which would eat most of a 20 s facts timeout.
"""

from __future__ import annotations

from collections.abc import Sequence

#: Line that opens a section; followed by one space and the section name.
MARKER = "@@fleetbench@@"

#: Every section name the probe prints, in order (``end`` closes the output).
SECTIONS = (
    "uname",
    "online",
    "nproc",
    "cpuinfo",
    "meminfo",
    "cpufreq",
    "thermal",
    "os-release",
    "dt-model",
    "python",
    "vcgencmd",
    "nvpmodel",
    "tegrastats",
    "getprop",
    "dumpsys-meminfo",
    "thermalservice",
    "power",
    "pmic",
    "exe",
    "end",
)

# Runs under the device's Python (3.6 or newer); no single quotes: it sits inside
# single quotes in the shell script.
_PYTHON_VERSIONS = """\
import platform
import importlib.util
try:
    from importlib.metadata import version as dist_version
except ImportError:
    dist_version = None
print("python=" + platform.python_version())
for name, dists in (("numpy", ("numpy",)),
                    ("onnxruntime", ("onnxruntime", "onnxruntime-training", "onnxruntime-gpu")),
                    ("torch", ("torch",))):
    found = "missing"
    try:
        if importlib.util.find_spec(name) is not None:
            found = ""
            for dist in dists:
                try:
                    found = dist_version(dist)
                    break
                except Exception:
                    pass
            if not found:
                try:
                    found = str(getattr(__import__(name), "__version__", "unknown"))
                except Exception:
                    found = "unimportable"
    except Exception:
        found = "missing"
    print(name + "=" + found)
"""

assert "'" not in _PYTHON_VERSIONS

#: The sysfs directories, below the power root, whose power-sensor files the probe lists.
POWER_GLOBS = (
    "sys/bus/i2c/drivers/ina3221/*/hwmon/hwmon*/*",
    "sys/bus/i2c/drivers/ina3221x/*/iio:device*/*",
    "sys/class/power_supply/*/*",
    "sys/class/powercap/intel-rapl:*/*",
)
#: The file names the probe lists from `POWER_GLOBS` (sh ``case`` patterns), and the emulation mark.
POWER_FILES = (
    "in*_label",
    "in*_input",
    "curr*_input",
    "shunt*_resistor",
    "update_interval",
    "rail_name_*",
    "type",
    "status",
    "online",
    "current_now",
    "voltage_now",
    "energy_uj",
    "max_energy_range_uj",
    "name",
    "fleetbench-emulated",
)

#: The probe (POSIX sh). An optional first argument ``--power-root=DIR`` names where the
#: power-sensor files lie (default ``/``); the rest starts the device's Python (``~/``
#: expanded; status 127: none).
PROBE_SCRIPT = (
    """\
r=
case "${1:-}" in --power-root=*) r="${1#--power-root=}"; r="${r%/}"; shift ;; esac
[ $# -gt 0 ] || set -- python3
case "$1" in "~/"*) p="$HOME/${1#??}"; shift; set -- "$p" "$@" ;; esac
has() { command -v "$1" >/dev/null 2>&1; }
m() { printf '\\n%s %s\\n' '"""
    + MARKER
    + """' "$1"; }
m uname; uname -m 2>/dev/null
m online; getconf _NPROCESSORS_ONLN 2>/dev/null
m nproc; has nproc && nproc 2>/dev/null
m cpuinfo; cat /proc/cpuinfo 2>/dev/null
m meminfo; cat /proc/meminfo 2>/dev/null
m cpufreq
d=/sys/devices/system/cpu/cpu0/cpufreq
for f in cpuinfo_max_freq scaling_max_freq scaling_cur_freq scaling_governor; do
  if [ -r "$d/$f" ]; then printf '%s=%s\\n' "$f" "$(cat "$d/$f" 2>/dev/null)"; fi
done
m thermal
for z in /sys/class/thermal/thermal_zone*; do
  [ -d "$z" ] || continue
  printf '%s\\t%s\\t%s\\n' "${z##*/}" "$(cat "$z/type" 2>/dev/null)" "$(cat "$z/temp" 2>/dev/null)"
done
m os-release; cat /etc/os-release 2>/dev/null || cat /usr/lib/os-release 2>/dev/null
m dt-model; [ -r /proc/device-tree/model ] && tr -d '\\000' </proc/device-tree/model 2>/dev/null
m python
if has "$1"; then "$@" -c '"""
    + _PYTHON_VERSIONS
    + """' 2>/dev/null; rc=$?
  if [ $rc -eq 127 ]; then echo "python=missing"; elif [ $rc -ne 0 ]; then echo "python=broken"; fi
else echo "python=missing"; fi
m vcgencmd; has vcgencmd && vcgencmd get_throttled 2>&1
m nvpmodel; has nvpmodel && nvpmodel -q 2>&1
m tegrastats; has tegrastats && has timeout && timeout 2 tegrastats --interval 500 2>/dev/null | head -n 1
m getprop; has getprop && getprop 2>/dev/null
m dumpsys-meminfo; has dumpsys && dumpsys meminfo 2>/dev/null | grep 'RAM:'
m thermalservice; has dumpsys && dumpsys thermalservice 2>/dev/null | grep 'Thermal Status'
m power
for f in """
    + " ".join(f'"$r"/{pattern}' for pattern in POWER_GLOBS)
    + """ "$r"/fleetbench-emulated; do
  case "${f##*/}" in """
    + "|".join(POWER_FILES)
    + """) ;; *) continue ;; esac
  [ -f "$f" ] || continue
  if [ -r "$f" ]; then l=; IFS= read -r l <"$f" 2>/dev/null; printf '%s\\t%s\\n' "${f#"$r"}" "$l"
  else printf '%s\\t\\tunreadable\\n' "${f#"$r"}"; fi
done
m pmic; has vcgencmd && vcgencmd pmic_read_adc 2>/dev/null
m exe; readlink "/proc/$$/exe" 2>/dev/null
m end
exit 0
"""
)


def probe_argv(python: str | Sequence[str], power_root: str = "/") -> list[str]:
    """Return the argv that runs the probe with the device's Python.

    Parameters
    ----------
    python : str or sequence of str
        Interpreter path or name on the device (``Device.python``), or the whole command
        that starts it (`devices.site.python_argv`); passed as arguments, never pasted
        into the script.
    power_root : str
        Where the device's power-sensor files lie (``Device.power_root``): ``/`` on a
        real device.

    Returns
    -------
    list of str
        ``["sh", "-c", PROBE_SCRIPT, "fleetbench-probe", *python]``, with
        ``--power-root=DIR`` before the Python command when ``power_root`` is not ``/``.
    """
    start = [python] if isinstance(python, str) else list(python)
    root = [] if power_root.rstrip("/") == "" else [f"--power-root={power_root}"]
    return ["sh", "-c", PROBE_SCRIPT, "fleetbench-probe", *root, *start]


def split_sections(text: str) -> dict[str, str]:
    """Split probe output into ``{section name: text}``.

    Parameters
    ----------
    text : str
        Standard output of the probe.

    Returns
    -------
    dict of str to str
        Section text with surrounding blank lines stripped; a section that appears
        twice keeps its first occurrence. Text before the first marker is dropped.
        The ``end`` section is present (empty) only when the output was complete.
    """
    sections: dict[str, str] = {}
    name: str | None = None
    lines: list[str] = []
    prefix = MARKER + " "
    for line in text.splitlines():
        if line.startswith(prefix):
            if name is not None and name not in sections:
                sections[name] = "\n".join(lines).strip("\n")
            name, lines = line[len(prefix) :].strip(), []
        else:
            lines.append(line)
    if name is not None and name not in sections:
        sections[name] = "\n".join(lines).strip("\n")
    return sections
