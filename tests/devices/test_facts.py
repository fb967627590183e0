"""Device facts: parsers on recorded outputs, the probe on this machine, fleet collection, CLI.

Expected values are written from the documented formats (see recorded/README.md), not
read back from the code under test.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest

from devices.emulation.sshd import free_port
from devices.errors import CommandTimeout
from devices.facts import (
    DeviceFacts,
    PowerSensor,
    ProbeError,
    collect_facts,
    decode_throttled,
    describe_power,
    emulated_isa,
    facts_from_probe,
    format_facts,
    parse_cpufreq,
    parse_cpuinfo,
    parse_dumpsys_meminfo,
    parse_getprop,
    parse_meminfo,
    parse_nvpmodel,
    parse_os_release,
    parse_power,
    parse_tegrastats,
    parse_thermal,
    parse_thermal_status,
    parse_vcgencmd_throttled,
    parse_versions,
    probe_device,
)
from devices.facts_probe import MARKER, PROBE_SCRIPT, SECTIONS, probe_argv, split_sections
from devices.fleet import Device, EmulatedPower, Emulation, Fleet
from devices.local import LocalTransport
from devices.transport import RunResult

RECORDED = Path(__file__).parent / "recorded"


def recorded(name: str) -> str:
    return (RECORDED / name).read_text(encoding="utf-8")


def probe_output(**sections: str) -> str:
    """Compose probe output the way PROBE_SCRIPT prints it (``os_release`` -> ``os-release``)."""
    parts = []
    for name in SECTIONS:
        parts.append(f"\n{MARKER} {name}\n")
        text = sections.get(name.replace("-", "_"), "")
        if text:
            parts.append(text if text.endswith("\n") else text + "\n")
    return "".join(parts)


# ----------------------------------------------------------------------------- /proc/cpuinfo


def test_cpuinfo_pi4_aarch64_has_no_model_name_and_decodes_cortex_a72() -> None:
    info = parse_cpuinfo(recorded("cpuinfo_pi4_aarch64.txt"))
    # BCM2711: 4x Cortex-A72 = implementer 0x41 (ARM), part 0xd08
    assert info.model == "ARM Cortex-A72"
    assert info.processors == 4
    assert info.hardware == "BCM2835"
    assert info.board == "Raspberry Pi 4 Model B Rev 1.4"
    assert info.mhz is None


def test_cpuinfo_pi3_armv7_generic_model_name_is_replaced_by_core_name() -> None:
    info = parse_cpuinfo(recorded("cpuinfo_pi3_armv7.txt"))
    assert info.model == "ARM Cortex-A53"  # part 0xd03; "ARMv7 Processor rev 4 (v7l)" says less
    assert info.processors == 4
    assert info.board == "Raspberry Pi 3 Model B Rev 1.2"


def test_cpuinfo_x86_64_model_name_and_mhz() -> None:
    info = parse_cpuinfo(recorded("cpuinfo_x86_64.txt"))
    assert info.model == "12th Gen Intel(R) Core(TM) i7-1260P"
    assert info.processors == 2
    assert info.mhz == pytest.approx(2495.998)
    assert info.hardware is None and info.board is None


def test_cpuinfo_big_little_lists_both_core_kinds() -> None:
    info = parse_cpuinfo(recorded("cpuinfo_android_mt6833.txt"))
    assert info.model == "6x ARM Cortex-A55 + 2x ARM Cortex-A76"
    assert info.processors == 8
    assert info.hardware == "MT6833"


def test_cpuinfo_unknown_part_and_empty_input() -> None:
    text = "processor\t: 0\nCPU implementer\t: 0x42\nCPU part\t: 0x516\n\nHardware\t: Some SoC\n"
    assert parse_cpuinfo(text).model == "implementer 0x42 part 0x516"
    empty = parse_cpuinfo("")
    assert empty.model is None and empty.processors == 0


# ----------------------------------------------------------------------------- /proc/meminfo


def test_meminfo_total_and_available() -> None:
    mem = parse_meminfo(recorded("meminfo_pi4.txt"))
    assert mem.total_kb == 7999784
    assert mem.available_kb == 7421156
    assert mem.swap_total_kb == 102396


def test_meminfo_before_linux_3_14_estimates_available_from_free_buffers_cached() -> None:
    text = "MemTotal:  1000 kB\nMemFree:  100 kB\nBuffers:  20 kB\nCached:  300 kB\nSwapCached: 5 kB\n"
    mem = parse_meminfo(text)
    assert mem.total_kb == 1000
    assert mem.available_kb == 100 + 20 + 300


# ----------------------------------------------------------------------------- sysfs


def test_cpufreq_values_in_khz() -> None:
    text = "cpuinfo_max_freq=1800000\nscaling_max_freq=1500000\nscaling_cur_freq=600000\nscaling_governor=ondemand\n"
    freq = parse_cpufreq(text)
    assert (freq.max_khz, freq.cur_khz, freq.governor) == (1800000, 600000, "ondemand")
    fallback = parse_cpufreq("scaling_max_freq=1500000\n")
    assert (fallback.max_khz, fallback.cur_khz, fallback.governor) == (1500000, None, None)
    assert parse_cpufreq("") == parse_cpufreq("garbage")


def test_thermal_millidegrees_unreadable_zone_and_duplicate_types() -> None:
    text = (
        "thermal_zone0\tCPU-therm\t32500\n"
        "thermal_zone1\tGPU-therm\t30500\n"
        "thermal_zone2\tPMIC-Die\t\n"  # temp unreadable
        "thermal_zone3\tacpitz\t27800\n"
        "thermal_zone4\tacpitz\t-1000\n"
    )
    assert parse_thermal(text) == {
        "CPU-therm": 32.5,
        "GPU-therm": 30.5,
        "acpitz": 27.8,
        "acpitz/thermal_zone4": -1.0,
    }


# ----------------------------------------------------------------------------- os-release, versions


def test_os_release_quoting() -> None:
    fields = parse_os_release(recorded("os_release_jetson_ubuntu.txt"))
    assert fields["PRETTY_NAME"] == "Ubuntu 18.04.6 LTS"
    assert fields["VERSION_ID"] == "18.04"
    assert fields["ID"] == "ubuntu"
    escaped = parse_os_release('# comment\nNAME="A \\"quoted\\" \\$name"\nID=\'x\'\n')
    assert escaped == {"NAME": 'A "quoted" $name', "ID": "x"}


def test_versions_missing_defaults() -> None:
    assert parse_versions("python=3.9.2\nnumpy=1.19.5\n") == {
        "python": "3.9.2",
        "numpy": "1.19.5",
        "onnxruntime": "missing",
        "torch": "missing",
    }


# ----------------------------------------------------------------------------- vcgencmd


# Raspberry Pi documentation, vcgencmd get_throttled: bit 0 under-voltage detected, 1 arm
# frequency capped, 2 currently throttled, 3 soft temperature limit active; bits 16-19 the
# same four conditions "has occurred" since boot.
NOTHING = {
    "under_voltage": False,
    "arm_frequency_capped": False,
    "throttled": False,
    "soft_temperature_limit": False,
    "under_voltage_occurred": False,
    "arm_frequency_capped_occurred": False,
    "throttling_occurred": False,
    "soft_temperature_limit_occurred": False,
}


@pytest.mark.parametrize(
    ("output", "set_flags"),
    [
        ("throttled=0x0\n", set()),
        # 0x50005 = bits 0, 2, 16, 18
        ("throttled=0x50005\n", {"under_voltage", "throttled", "under_voltage_occurred", "throttling_occurred"}),
        # 0x80008 = bits 3 and 19
        ("throttled=0x80008\n", {"soft_temperature_limit", "soft_temperature_limit_occurred"}),
        # 0x20000 = bit 17 only: capping happened earlier, not now
        ("throttled=0x20000\n", {"arm_frequency_capped_occurred"}),
    ],
)
def test_vcgencmd_get_throttled_bits(output: str, set_flags: set[str]) -> None:
    parsed = parse_vcgencmd_throttled(output)
    assert parsed is not None
    expected = {name: name in set_flags for name in NOTHING}
    assert {k: v for k, v in parsed.items() if k in NOTHING} == expected
    assert parsed["raw"] == output.strip().split("=")[1]
    assert parsed["source"] == "vcgencmd get_throttled"


def test_vcgencmd_absent_or_failing() -> None:
    assert parse_vcgencmd_throttled("") is None
    assert parse_vcgencmd_throttled("VCHI initialization failed\n") is None
    assert decode_throttled(0) == NOTHING


# ----------------------------------------------------------------------------- Jetson


def test_tegrastats_nano_line() -> None:
    stats = parse_tegrastats(recorded("tegrastats_nano.txt"))
    assert (stats.ram_used_mb, stats.ram_total_mb) == (1545, 3956)
    assert (stats.swap_used_mb, stats.swap_total_mb) == (0, 1978)
    assert stats.cpus == ((12, 1479), (5, 1479), None, None)  # two cores "off"
    assert stats.temperatures == {
        "PLL": 30.0,
        "CPU": 32.5,
        "PMIC": 100.0,
        "GPU": 30.5,
        "AO": 38.5,
        "thermal": 31.5,
    }


def test_tegrastats_orin_line_with_date_and_sensors_off() -> None:
    stats = parse_tegrastats(recorded("tegrastats_orin.txt"))
    assert (stats.ram_used_mb, stats.ram_total_mb) == (2448, 7620)
    assert stats.cpus == ((1, 729), (0, 729), (3, 729), (0, 729), (0, 729), (0, 729))
    # CV0/CV1/CV2/GPU report -256C: sensor off, left out
    assert stats.temperatures == {"CPU": 46.5, "SOC2": 43.5, "SOC0": 44.062, "tj": 46.5, "SOC1": 43.531}


def test_tegrastats_old_shared_frequency_form() -> None:
    stats = parse_tegrastats("RAM 980/1980MB (lfb 12x4MB) CPU [10%,5%,off,off]@1734 EMC 4%@1600 AO@31C")
    assert stats.cpus == ((10, 1734), (5, 1734), None, None)
    assert stats.swap_total_mb is None
    assert stats.temperatures == {"AO": 31.0}


def test_nvpmodel_query() -> None:
    nano = parse_nvpmodel(recorded("nvpmodel_nano.txt"))
    assert nano is not None and (nano.name, nano.mode_id) == ("MAXN", 0)
    orin = parse_nvpmodel(recorded("nvpmodel_orin.txt"))
    assert orin is not None and (orin.name, orin.mode_id) == ("7W", 1)
    assert parse_nvpmodel("") is None


# ----------------------------------------------------------------------------- Android


def test_getprop() -> None:
    props = parse_getprop(recorded("getprop_android.txt"))
    assert props["ro.product.model"] == "Redmi Note 10 5G"
    assert props["ro.build.version.sdk"] == "33"
    assert props["ro.product.cpu.abilist"] == "arm64-v8a,armeabi-v7a,armeabi"
    assert props["ro.vendor.empty"] == ""
    assert len(props) == 14


def test_dumpsys_meminfo_summary_at_the_end() -> None:
    ram = parse_dumpsys_meminfo(recorded("dumpsys_meminfo_android.txt"))
    assert ram == {"total_kb": 3720812, "free_kb": 1863136, "used_kb": 1734243, "lost_kb": 123433}
    old = parse_dumpsys_meminfo("Total RAM: 1857480 kB\n Free RAM: 912332 kB\n")  # Android 4.x
    assert old == {"total_kb": 1857480, "free_kb": 912332}


def test_thermal_status() -> None:
    # android.os.PowerManager: THERMAL_STATUS_NONE = 0, LIGHT = 1, MODERATE = 2
    assert parse_thermal_status("Thermal Status: 2\n") == {
        "source": "dumpsys thermalservice",
        "thermal_status": 2,
        "status": "moderate",
    }
    assert parse_thermal_status("") is None


# ----------------------------------------------------------------------------- whole probe, recorded


def test_facts_raspberry_pi_4() -> None:
    text = probe_output(
        uname="aarch64",
        online="4",
        nproc="4",
        cpuinfo=recorded("cpuinfo_pi4_aarch64.txt"),
        meminfo=recorded("meminfo_pi4.txt"),
        cpufreq="cpuinfo_max_freq=1800000\nscaling_max_freq=1800000\nscaling_cur_freq=600000\nscaling_governor=ondemand",
        thermal="thermal_zone0\tcpu-thermal\t45277",
        os_release=recorded("os_release_raspios.txt"),
        dt_model="Raspberry Pi 4 Model B Rev 1.4",
        python="python=3.11.2\nnumpy=1.24.2\nonnxruntime=1.16.3\ntorch=missing",
        vcgencmd="throttled=0x50005",
    )
    facts = facts_from_probe(text)
    assert facts.platform == "raspberry-pi"
    assert facts.arch == "aarch64"
    assert facts.board == "Raspberry Pi 4 Model B Rev 1.4"
    assert facts.cpu_model == "ARM Cortex-A72"
    assert (facts.cores, facts.usable_cores) == (4, 4)
    assert (facts.max_freq_khz, facts.cur_freq_khz, facts.governor) == (1800000, 600000, "ondemand")
    assert (facts.mem_total_mb, facts.mem_available_mb) == (7999784 // 1024, 7421156 // 1024)
    assert facts.os == "Debian GNU/Linux 12 (bookworm)"
    assert (facts.python, facts.numpy, facts.onnxruntime, facts.torch) == ("3.11.2", "1.24.2", "1.16.3", "missing")
    assert facts.thermal == {"cpu-thermal": pytest.approx(45.277)}
    assert facts.throttle["under_voltage"] is True and facts.throttle["throttling_occurred"] is True
    assert facts.throttle["soft_temperature_limit"] is False
    block = format_facts("pi4", facts)
    assert "pi4 (raspberry-pi)" in block and "under_voltage=True" in block and "1800 MHz" in block


def test_facts_jetson_nano() -> None:
    text = probe_output(
        uname="aarch64",
        online="4",
        nproc="4",
        cpuinfo="processor\t: 0\nCPU implementer\t: 0x41\nCPU part\t: 0xd07\n\n",
        meminfo="MemTotal:  4051048 kB\nMemAvailable:  2519828 kB\n",
        thermal="thermal_zone0\tAO-therm\t38500\nthermal_zone1\tCPU-therm\t32500",
        os_release=recorded("os_release_jetson_ubuntu.txt"),
        dt_model="NVIDIA Jetson Nano Developer Kit",
        python="python=3.6.9\nnumpy=1.13.3\nonnxruntime=missing\ntorch=1.10.0",
        nvpmodel=recorded("nvpmodel_nano.txt"),
        tegrastats=recorded("tegrastats_nano.txt"),
    )
    facts = facts_from_probe(text)
    assert facts.platform == "jetson"
    assert facts.cpu_model == "ARM Cortex-A57"
    assert facts.os == "Ubuntu 18.04.6 LTS"
    assert facts.throttle == {"source": "nvpmodel -q", "power_mode": "MAXN", "power_mode_id": 0}
    assert facts.details["tegrastats"]["cpus"] == [[12, 1479], [5, 1479], "off", "off"]
    assert facts.details["tegrastats"]["temperatures"]["CPU"] == 32.5
    assert facts.thermal == {"AO-therm": 38.5, "CPU-therm": 32.5}
    json.dumps(facts.to_dict())  # JSON-ready


def test_facts_android_phone() -> None:
    text = probe_output(
        uname="aarch64",
        online="8",
        nproc="8",
        cpuinfo=recorded("cpuinfo_android_mt6833.txt"),
        python="python=missing",
        getprop=recorded("getprop_android.txt"),
        dumpsys_meminfo="Total RAM: 3,720,812K (status normal)\n Free RAM: 1,863,136K (x)\n Used RAM: 1,734,243K (y)",
        thermalservice="Thermal Status: 0",
    )
    facts = facts_from_probe(text)
    assert facts.platform == "android"
    assert facts.board == "Xiaomi Redmi Note 10 5G"
    assert facts.os == "Android 13 (SDK 33)"
    assert facts.cpu_model == "6x ARM Cortex-A55 + 2x ARM Cortex-A76"
    # /proc/meminfo unreadable here: dumpsys totals are used
    assert (facts.mem_total_mb, facts.mem_available_mb) == (3720812 // 1024, 1863136 // 1024)
    assert facts.python == "missing" and facts.torch == "missing"
    assert facts.throttle == {"source": "dumpsys thermalservice", "thermal_status": 0, "status": "none"}
    assert facts.details["android"]["ro.product.cpu.abi"] == "arm64-v8a"


def test_facts_x86_without_cpufreq_uses_cpuinfo_mhz() -> None:
    text = probe_output(uname="x86_64", online="2", cpuinfo=recorded("cpuinfo_x86_64.txt"))
    facts = facts_from_probe(text)
    assert facts.platform == "linux"
    assert facts.cur_freq_khz == 2495998 and facts.max_freq_khz is None
    assert facts.usable_cores is None


def test_truncated_or_empty_probe_output_is_an_error() -> None:
    complete = probe_output(uname="x86_64")
    with pytest.raises(ProbeError, match="incomplete"):
        facts_from_probe(complete.split(f"{MARKER} end")[0])
    with pytest.raises(ProbeError, match="incomplete"):
        facts_from_probe("")
    with pytest.raises(ProbeError, match="architecture"):
        facts_from_probe(probe_output())


def test_split_sections_ignores_noise_before_first_marker() -> None:
    text = f"motd line\n{MARKER} uname\nx86_64\n\n{MARKER} end\n"
    assert split_sections(text) == {"uname": "x86_64", "end": ""}


# ----------------------------------------------------------------------------- probe on this machine


def test_probe_script_is_posix_sh() -> None:
    dash = "/bin/dash" if os.path.exists("/bin/dash") else None
    if dash is None:
        pytest.skip("dash not installed")
    result = subprocess.run([dash, "-n", "-c", PROBE_SCRIPT], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr


def test_probe_on_this_machine_through_local_transport() -> None:
    facts = probe_device(LocalTransport(), python=sys.executable, timeout=60)
    assert facts.arch == platform.machine() == "x86_64"
    assert facts.cores == os.cpu_count()
    meminfo = Path("/proc/meminfo").read_text()
    total_kb = int(next(line.split()[1] for line in meminfo.splitlines() if line.startswith("MemTotal:")))
    assert facts.mem_total_mb == total_kb // 1024
    assert facts.mem_available_mb is not None and 0 < facts.mem_available_mb <= facts.mem_total_mb
    assert facts.python == platform.python_version()
    import numpy

    assert facts.numpy == numpy.__version__
    assert facts.platform == "linux"


def test_probe_with_a_missing_interpreter_reports_missing() -> None:
    facts = probe_device(LocalTransport(), python="/nonexistent/python3", timeout=60)
    assert (facts.python, facts.numpy, facts.onnxruntime, facts.torch) == ("missing",) * 4


def test_probe_passes_python_as_an_argument_not_as_script_text() -> None:
    argv = probe_argv("/opt/py thon/$(touch x)/python3")
    assert argv[:3] == ["sh", "-c", PROBE_SCRIPT] and argv[-1] == "/opt/py thon/$(touch x)/python3"


class _Scripted:
    """A fake transport that returns one result or raises one exception."""

    def __init__(self, result: RunResult | Exception) -> None:
        self.result, self.closed = result, False

    def run(self, argv: Sequence[str], timeout: float) -> RunResult:
        if isinstance(self.result, Exception):
            raise self.result
        return self.result

    def put(self, local: Path, remote: str) -> None:
        raise NotImplementedError

    def get(self, remote: str, local: Path) -> None:
        raise NotImplementedError

    def close(self) -> None:
        self.closed = True


def test_collect_facts_with_fake_transports_separates_failures() -> None:
    good = probe_output(uname="aarch64", online="4", vcgencmd="throttled=0x0")
    fleet = Fleet(
        path=Path("fleet.yaml"),
        devices=(
            Device(name="ok", kind="ssh", host="a"),
            Device(name="slow", kind="ssh", host="b"),
            Device(name="garbled", kind="ssh", host="c"),
        ),
    )
    transports = {
        "ok": _Scripted(RunResult(0, good, "", 0.1)),
        "slow": _Scripted(CommandTimeout("did not finish within 1 s")),
        "garbled": _Scripted(RunResult(127, "", "sh: not found", 0.1)),
    }
    result = collect_facts(fleet, connect=lambda device: transports[device.name], timeout=1)
    assert list(result.successes) == ["ok"]
    assert isinstance(result.successes["ok"], DeviceFacts)
    assert result.successes["ok"].platform == "raspberry-pi"
    assert {name: f.kind for name, f in result.failures.items()} == {"slow": "timeout", "garbled": "runner error"}
    assert "sh: not found" in result.failures["garbled"].message
    assert all(t.closed for t in transports.values())


# ----------------------------------------------------------------------------- local + unreachable ssh


def test_collect_facts_local_and_unreachable_ssh(tmp_path: Path) -> None:
    fleet = Fleet(
        path=tmp_path / "fleet.yaml",
        devices=(
            Device(name="here", kind="local", python=sys.executable),
            Device(
                name="gone",
                kind="ssh",
                host="127.0.0.1",
                port=free_port(),
                known_hosts=tmp_path / "known_hosts",
            ),
        ),
    )
    result = collect_facts(fleet, timeout=60)
    assert list(result.successes) == ["here"]
    assert result.successes["here"].arch == platform.machine()
    assert list(result.failures) == ["gone"]
    assert result.failures["gone"].kind == "unreachable"


def test_cli_fleet_facts_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from fleetbench.cli import main

    monkeypatch.setenv("FLEETBENCH_SSH_CONFIG", str(tmp_path / "no-ssh-config"))
    monkeypatch.chdir(tmp_path)
    fleet_file = tmp_path / "fleet.yaml"
    fleet_file.write_text(
        "devices:\n"
        "  - name: here\n"
        "    kind: local\n"
        "  - name: gone\n"
        "    kind: ssh\n"
        "    host: 127.0.0.1\n"
        f"    port: {free_port()}\n"
        f"    known_hosts: {tmp_path / 'known_hosts'}\n",
        encoding="utf-8",
    )
    rc = main(["fleet", "facts", str(fleet_file), "--json", "--timeout", "60"])
    out, err = capsys.readouterr()
    assert rc == 1, err  # one device failed
    document = json.loads(out)
    assert set(document) == {"facts", "failures"}
    assert list(document["facts"]) == ["here"]
    here = document["facts"]["here"]
    assert here["arch"] == platform.machine()
    assert here["cores"] == os.cpu_count()
    assert here["python"] == platform.python_version()
    assert document["failures"] == {"gone": {"kind": "unreachable", "message": document["failures"]["gone"]["message"]}}
    assert document["failures"]["gone"]["message"]

    # the table form: facts block, then a failures section; exit 0 once every device answers
    rc = main(["fleet", "facts", str(fleet_file)])
    out, _ = capsys.readouterr()
    assert rc == 1
    assert "here (linux)" in out and "failures:" in out and "gone" in out and "unreachable" in out
    fleet_file.write_text("devices:\n  - name: here\n    kind: local\n", encoding="utf-8")
    assert main(["fleet", "facts", str(fleet_file), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["failures"] == {}


def test_cli_fleet_facts_bad_file_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from fleetbench.cli import main

    assert main(["fleet", "facts", str(tmp_path / "missing.yaml")]) == 2
    assert "missing.yaml" in capsys.readouterr().err


# ----------------------------------------------------------------------------- real sshd and real adb


def test_probe_through_a_real_sshd(sshd_path: str, tmp_path: Path) -> None:
    from tests.devices.sshd_server import Server

    server = Server.launch(tmp_path)
    try:
        facts = probe_device(server.transport(), python=sys.executable, timeout=60)
    finally:
        server.shutdown()
    assert facts.arch == platform.machine()
    assert facts.cores == os.cpu_count()
    assert facts.python == platform.python_version()


def test_probe_through_real_adb_to_the_emulated_phone(adb_server: tuple[str, int], tmp_path: Path) -> None:
    from devices.adb import ADBTransport
    from devices.emulation.adb_endpoint import AdbEndpoint

    endpoint = AdbEndpoint(0, tmp_path / "phone").start()
    try:
        transport = ADBTransport(f"127.0.0.1:{endpoint.port}", server_port=adb_server[1])
        try:
            facts = probe_device(transport, python=sys.executable, timeout=60)
        finally:
            transport.close()
    finally:
        endpoint.stop()
    assert facts.arch == platform.machine()
    assert facts.cores == os.cpu_count()
    assert facts.python == platform.python_version()


def test_the_emulated_phone_lists_a_battery_below_its_power_root(adb_server: tuple[str, int], tmp_path: Path) -> None:
    from devices.adb import ADBTransport
    from devices.emulation.adb_endpoint import AdbEndpoint
    from tests.harness.runner.test_power import android_battery

    root = tmp_path / "power"  # a host path: the phone's shell sees this machine's files
    android_battery(root, on_usb=False)
    endpoint = AdbEndpoint(0, tmp_path / "phone").start()
    try:
        transport = ADBTransport(f"127.0.0.1:{endpoint.port}", server_port=adb_server[1])
        try:
            facts = probe_device(transport, python=sys.executable, timeout=60, power_root=str(root))
        finally:
            transport.close()
    finally:
        endpoint.stop()
    assert facts.power == (PowerSensor("power-supply", ("battery",), pytest.approx(3.861e-6), "W"),)


# ----------------------------------------------------------------------------- emulated ISA


@pytest.mark.parametrize(
    ("arch", "cpuinfo", "exe", "expected"),
    [
        # qemu-user answers uname for the guest, the kernel's cpuinfo stays the host's
        ("aarch64", "cpuinfo_x86_64.txt", "", True),
        # binfmt_misc runs the shell through the qemu interpreter
        ("aarch64", "", "/usr/libexec/qemu-binfmt/aarch64-binfmt-P", True),
        ("aarch64", "", "/usr/bin/qemu-aarch64-static", True),
        ("x86_64", "cpuinfo_pi4_aarch64.txt", "/usr/bin/bash", True),
        # native machines
        ("aarch64", "cpuinfo_pi4_aarch64.txt", "/usr/bin/dash", False),
        ("armv7l", "cpuinfo_pi3_armv7.txt", "/bin/busybox", False),
        ("aarch64", "cpuinfo_android_mt6833.txt", "/system/bin/sh", False),
        ("x86_64", "cpuinfo_x86_64.txt", "/usr/bin/dash", False),
        # nothing to compare: not flagged
        ("aarch64", "", "", False),
        ("mips64", "cpuinfo_x86_64.txt", "", False),
    ],
)
def test_emulated_isa_signs(arch: str, cpuinfo: str, exe: str, expected: bool) -> None:
    assert emulated_isa(arch, recorded(cpuinfo) if cpuinfo else "", exe) is expected


def test_facts_of_an_aarch64_probe_on_an_x86_kernel_are_marked_emulated() -> None:
    text = probe_output(uname="aarch64", cpuinfo=recorded("cpuinfo_x86_64.txt"), python="python=3.11.2")
    facts = facts_from_probe(text)
    assert facts.arch == "aarch64" and facts.emulated_isa is True
    assert facts.to_dict()["emulated_isa"] is True
    assert "aarch64 (emulated ISA" in format_facts("pi", facts)
    native = facts_from_probe(probe_output(uname="aarch64", cpuinfo=recorded("cpuinfo_pi4_aarch64.txt")))
    assert native.emulated_isa is False and "emulated" not in format_facts("pi4", native)


def test_collect_facts_marks_a_fleet_file_aarch64_device_even_when_the_probe_cannot_tell() -> None:
    silent = probe_output(uname="aarch64", online="4")  # no cpuinfo, no exe: the probe cannot tell
    fleet = Fleet(
        path=Path("fleet.yaml"),
        devices=(
            Device(name="pi", kind="ssh", host="a", emulate=Emulation(arch="aarch64")),
            Device(name="board", kind="ssh", host="b"),
        ),
    )
    transports = {name: _Scripted(RunResult(0, silent, "", 0.1)) for name in ("pi", "board")}
    result = collect_facts(fleet, connect=lambda device: transports[device.name], timeout=1)
    assert result.successes["pi"].emulated_isa is True
    assert result.successes["board"].emulated_isa is False


# ----------------------------------------------------------------------------- power sensors


def test_power_listing_of_a_jetson_hwmon_tree_and_an_older_iio_one() -> None:
    listing = "\n".join(
        [
            "/sys/bus/i2c/drivers/ina3221/1-0040/hwmon/hwmon1/name\tina3221",
            "/sys/bus/i2c/drivers/ina3221/1-0040/hwmon/hwmon1/in1_label\tVDD_IN",
            "/sys/bus/i2c/drivers/ina3221/1-0040/hwmon/hwmon1/in1_input\t5072",
            "/sys/bus/i2c/drivers/ina3221/1-0040/hwmon/hwmon1/curr1_input\t1432",
            "/sys/bus/i2c/drivers/ina3221/1-0040/hwmon/hwmon1/shunt1_resistor\t5000",
            "/sys/bus/i2c/drivers/ina3221/1-0040/hwmon/hwmon1/in2_label\tNC",
            "/sys/bus/i2c/drivers/ina3221/1-0040/hwmon/hwmon1/curr2_input\t0",
            "/sys/bus/i2c/drivers/ina3221/1-0040/hwmon/hwmon1/in10_label\tVDD_SOC",
            "/sys/bus/i2c/drivers/ina3221/1-0040/hwmon/hwmon1/in10_input\t5000",
            "/sys/bus/i2c/drivers/ina3221/1-0040/hwmon/hwmon1/curr10_input\t700",
            "/sys/bus/i2c/drivers/ina3221/1-0040/hwmon/hwmon1/in7_label\tsum of shunt voltages",
            "/sys/bus/i2c/drivers/ina3221/1-0040/hwmon/hwmon1/update_interval\t140",
            "/sys/bus/i2c/drivers/ina3221x/6-0040/iio:device0/rail_name_0\tPOM_5V_IN",
            "/sys/bus/i2c/drivers/ina3221x/6-0040/iio:device0/in_power0_input\t1962",
            "/sys/bus/i2c/drivers/ina3221x/6-0040/iio:device0/rail_name_1\tPOM_5V_GPU",
        ]
    )
    hwmon, iio = parse_power(listing)
    # 8 mA per count (40 uV over 5 mOhm) at 5.072 V; VDD_SOC: 1 mA at 5 V
    assert hwmon == PowerSensor("ina3221-hwmon", ("VDD_IN", "VDD_SOC"), pytest.approx(0.040576), "W", 140)
    assert iio == PowerSensor("ina3221-iio", ("POM_5V_IN",), 0.001, "W")  # rail 1 has no power file


def test_power_listing_of_a_battery_a_locked_rapl_and_a_pi_5_pmic() -> None:
    listing = "\n".join(
        [
            "/sys/class/power_supply/battery/type\tBattery",
            "/sys/class/power_supply/battery/current_now\t-431250",
            "/sys/class/power_supply/battery/voltage_now\t3861000",
            "/sys/class/power_supply/usb/type\tUSB",
            "/sys/class/power_supply/usb/online\t0",
            "/sys/class/power_supply/BAT1/type\tBattery",  # a laptop battery without current_now
            "/sys/class/power_supply/BAT1/voltage_now\t12000000",
            "/sys/class/powercap/intel-rapl:0/name\tpackage-0",
            "/sys/class/powercap/intel-rapl:0/energy_uj\t\tunreadable",
            "/sys/class/powercap/intel-rapl:0:0/name\tcore",
            "/sys/class/powercap/intel-rapl:0:0/energy_uj\t\tunreadable",
        ]
    )
    pmic = "  VDD_CORE_A current(7)=0.73770000A\n  VDD_CORE_V volt(15)=0.88182000V\n  EXT5V_V volt(24)=5.14956000V\n"
    pmic_sensor, battery, rapl = parse_power(listing, pmic)
    assert pmic_sensor == PowerSensor("pmic-adc", ("VDD_CORE",), pytest.approx(0.88182e-8), "W")
    assert battery == PowerSensor("power-supply", ("battery",), pytest.approx(3.861e-6), "W")
    assert rapl == PowerSensor("rapl", ("package-0", "core"), 1e-6, "J", note="energy_uj readable by root only")
    assert describe_power([rapl]) == "rapl: package-0, core, step 1e-06 J (energy_uj readable by root only)"


def test_no_power_sensor() -> None:
    assert parse_power("") == () and parse_power("/sys/class/power_supply/usb/online\t1") == ()
    facts = facts_from_probe(probe_output(uname="x86_64"))
    assert facts.power == () and facts.to_dict()["power"] == []
    assert "  power        no power sensor" in format_facts("box", facts)


def test_facts_list_the_power_sensors_and_mark_emulated_ones() -> None:
    listing = (
        "/sys/class/powercap/intel-rapl:0/name\tpackage-0\n"
        "/sys/class/powercap/intel-rapl:0/energy_uj\t123\n"
        "/fleetbench-emulated\trapl idle_w=2 busy_core_w=1.5\n"
    )
    facts = facts_from_probe(probe_output(uname="x86_64", power=listing))
    assert facts.power == (PowerSensor("rapl", ("package-0",), 1e-6, "J", None, emulated=True),)
    assert facts.to_dict()["power"] == [
        {
            "kind": "rapl",
            "rails": ["package-0"],
            "resolution": 1e-6,
            "unit": "J",
            "update_interval_ms": None,
            "emulated": True,
            "note": "",
        }
    ]
    assert "  power        rapl: package-0, step 1e-06 J (emulated)" in format_facts("box", facts)


def test_the_probe_lists_sensor_files_below_its_power_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.harness.runner.test_power import PI5_PMIC, android_battery, fake_vcgencmd, jetpack_hwmon, rapl_tree

    root = tmp_path / "power root"  # a space: the root is an argument, never script text
    jetpack_hwmon(root)
    android_battery(root, on_usb=False)
    rapl_tree(root, 262143000000, 1000)
    fake_vcgencmd(tmp_path, monkeypatch, PI5_PMIC)
    argv = probe_argv(sys.executable, str(root))
    assert argv[4] == f"--power-root={root}" and argv[5] == sys.executable
    facts = probe_device(LocalTransport(), python=sys.executable, timeout=60, power_root=str(root))
    assert facts.python == platform.python_version()  # the root argument did not become the interpreter
    kinds = {sensor.kind: sensor for sensor in facts.power}
    assert list(kinds) == ["ina3221-hwmon", "pmic-adc", "power-supply", "rapl"]
    assert kinds["ina3221-hwmon"].rails == ("VDD_IN", "VDD_CPU_GPU_CV", "VDD_SOC")
    assert kinds["ina3221-hwmon"].update_interval_ms == 140
    assert len(kinds["pmic-adc"].rails) == 12
    assert kinds["power-supply"].rails == ("battery",)
    assert kinds["rapl"].rails == ("package-0", "core")
    assert not any(sensor.emulated for sensor in facts.power)


def test_collect_facts_marks_the_sensors_of_a_device_with_an_emulated_power_block() -> None:
    listing = "/sys/class/powercap/intel-rapl:0/name\tpackage-0\n/sys/class/powercap/intel-rapl:0/energy_uj\t1\n"
    text = probe_output(uname="x86_64", power=listing)
    power = EmulatedPower("rapl", 2.0, 1.5)
    fleet = Fleet(
        path=Path("fleet.yaml"),
        devices=(
            Device(name="emulated", kind="ssh", host="a", emulate=Emulation(power=power)),
            Device(name="board", kind="ssh", host="b"),
        ),
    )
    transports = {name: _Scripted(RunResult(0, text, "", 0.1)) for name in ("emulated", "board")}
    result = collect_facts(fleet, connect=lambda device: transports[device.name], timeout=1)
    assert [s.emulated for s in result.successes["emulated"].power] == [True]
    assert [s.emulated for s in result.successes["board"].power] == [False]
