"""Emulation presets: CPU share and memory of typical edge devices, relative to this machine.

A preset fills the fields an ``emulate:`` block leaves out. ``cpu_share`` is a fraction
of ONE core of the machine running the emulated fleet (a cgroup quota of
``share * period``); only the RATIOS between presets carry meaning, and they follow
published relative CPU benchmark figures.

Figures used (Geekbench 5, CPU multi-core score, 64-bit OS, all boards quad-core or
more, so the multi-core score is the capacity of the whole device that a multi-threaded
training step can use):

================  =================================  ======  ===================================
preset            SoC / CPU                          GB5 MC  source
================  =================================  ======  ===================================
pi3               BCM2837, 4x Cortex-A53 @ 1.2 GHz     340   Geekbench Browser, "Raspberry Pi 3
                                                             Model B" (aarch64) results
pi4               BCM2711, 4x Cortex-A72 @ 1.5 GHz     690   Geekbench Browser, "Raspberry Pi 4
                                                             Model B" (aarch64) results
jetson-nano       Tegra X1, 4x Cortex-A57 @ 1.43 GHz   630   Geekbench Browser, "NVIDIA Jetson
                                                             Nano Developer Kit" results
phone-midrange    Snapdragon 778G, 1+3x A78 + 4x A55  2827   nanoreview.net, "Snapdragon 778G"
                                                             (average Geekbench 5 multi-core)
================  =================================  ======  ===================================

The board figures are typical Geekbench Browser results as commonly reported (results
vary by some 10 % with OS, cooling and clock, so treat them as +-15 %); the phone figure
is nanoreview.net's average (single-core 777). Cross-check on a second benchmark:
sysbench 1.0.20 cpu, 4 threads (leoncode.co.uk/articles/raspberry-pi-benchmarks): Pi 4
5900.85 vs Pi 3B+ 2459.22 events/s, a ratio of 2.4 (about 2.8 against the 1.2 GHz Pi
3B); Geekbench's broader mix gives 690 / 340 = 2.0, the ratio used here. Derivation: the
fastest preset (the phone) gets ``FASTEST_SHARE`` = 1.2 cores, so that an emulated fleet
holding it runs on a host of two cpus with room for the emulator's own processes; every
other preset gets ``FASTEST_SHARE * score / 2827``, rounded to 0.01 (pi3 0.14, pi4 0.29,
jetson-nano 0.27, phone-midrange 1.2). The resulting slow-down ratios (phone : pi4 :
jetson-nano : pi3 = 1 : 4.1 : 4.4 : 8.6) are what the emulation reproduces; absolute
latencies are the host's divided by the share. Memory limits are the RAM of the common
board variant (pi3 1 GB, pi4 2 GB, jetson-nano 4 GB, a mid-range phone 6 GB of which an
app can use about 3 GB).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from devices.fleet import Emulation


@dataclass(frozen=True)
class PresetSource:
    """A published benchmark figure a preset derives from.

    Attributes
    ----------
    device : str
        The reference device.
    geekbench5_multi : int
        Its Geekbench 5 multi-core score.
    memory_mb : int
        Memory limit of the emulated device.
    """

    device: str
    geekbench5_multi: int
    memory_mb: int


#: Share of one core given to the fastest preset.
FASTEST_SHARE = 1.2

#: Benchmark figures (see the module docstring for sources).
SOURCES: dict[str, PresetSource] = {
    "pi3": PresetSource("Raspberry Pi 3 Model B (4x Cortex-A53 1.2 GHz)", 340, 1024),
    "pi4": PresetSource("Raspberry Pi 4 Model B (4x Cortex-A72 1.5 GHz)", 690, 2048),
    "jetson-nano": PresetSource("NVIDIA Jetson Nano (4x Cortex-A57 1.43 GHz)", 630, 4096),
    "phone-midrange": PresetSource("Snapdragon 778G phone (1+3x A78, 4x A55)", 2827, 3072),
}


def share_from_score(score: int, sources: dict[str, PresetSource] | None = None) -> float:
    """Return the CPU share (fraction of one core here) for a benchmark ``score``.

    Parameters
    ----------
    score : int
        Geekbench 5 multi-core score of the device to emulate.
    sources : dict, optional
        Reference figures; the fastest of them maps to `FASTEST_SHARE` (default `SOURCES`).

    Returns
    -------
    float
        ``FASTEST_SHARE * score / fastest score``, rounded to 0.01 (at least 0.01).
    """
    table = SOURCES if sources is None else sources
    fastest = max(src.geekbench5_multi for src in table.values())
    return max(0.01, round(FASTEST_SHARE * score / fastest, 2))


#: The presets, derived from `SOURCES`.
PRESETS: dict[str, Emulation] = {
    name: Emulation(preset=name, cpu_share=share_from_score(src.geekbench5_multi), memory_mb=src.memory_mb)
    for name, src in SOURCES.items()
}


def resolve(emulation: Emulation) -> Emulation:
    """Fill the fields ``emulation`` leaves out from its preset.

    Parameters
    ----------
    emulation : Emulation
        An ``emulate:`` block; explicit fields win over the preset.

    Returns
    -------
    Emulation

    Raises
    ------
    KeyError
        If the preset is unknown.
    """
    if emulation.preset is None:
        return emulation
    base = PRESETS[emulation.preset]
    return replace(
        emulation,
        cpu_share=emulation.cpu_share if emulation.cpu_share is not None else base.cpu_share,
        memory_mb=emulation.memory_mb if emulation.memory_mb is not None else base.memory_mb,
        delay_ms=emulation.delay_ms if emulation.delay_ms is not None else base.delay_ms,
        rate_kbit=emulation.rate_kbit if emulation.rate_kbit is not None else base.rate_kbit,
    )
