"""Power sensors (`harness.runner.power`): each real format written in its real layout under a temp root.

Expected numbers are worked out by hand from the sample files (product of the file
values in their units), never read back from the code under test.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from harness.runner.metering import sample
from harness.runner.power import (
    PowerError,
    Sensor,
    discover,
    parse_pmic_adc,
    read_energy,
    read_power,
    run_vcgencmd,
)

#: A Raspberry Pi 5's ``vcgencmd pmic_read_adc`` (12 rails with current and voltage, 2 voltage-only lines).
PI5_PMIC = """\
     3V7_WL_SW_A current(0)=0.00390372A
       3V3_SYS_A current(1)=0.05660399A
       1V8_SYS_A current(2)=0.17326020A
      DDR_VDD2_A current(3)=0.02049336A
      DDR_VDDQ_A current(4)=0.00000000A
       1V1_SYS_A current(5)=0.18737150A
       0V8_SYS_A current(6)=0.34156560A
      VDD_CORE_A current(7)=0.73770000A
       3V3_DAC_A current(17)=0.00048840A
       3V3_ADC_A current(18)=0.00042330A
       0V8_AON_A current(16)=0.00305280A
          HDMI_A current(22)=0.02491416A
     3V7_WL_SW_V volt(8)=3.70323000V
       3V3_SYS_V volt(9)=3.30512800V
       1V8_SYS_V volt(10)=1.79939200V
      DDR_VDD2_V volt(11)=1.11086400V
      DDR_VDDQ_V volt(12)=0.60615600V
       1V1_SYS_V volt(13)=1.10622400V
       0V8_SYS_V volt(14)=0.80023860V
      VDD_CORE_V volt(15)=0.88182000V
       3V3_DAC_V volt(20)=3.30622400V
       3V3_ADC_V volt(21)=3.30512800V
       0V8_AON_V volt(19)=0.80059850V
          HDMI_V volt(23)=5.14956000V
         EXT5V_V volt(24)=5.14956000V
          BATT_V volt(25)=0.00000000V
"""


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text + "\n")


def jetpack_hwmon(root: Path) -> Path:
    """A Jetson Orin's INA3221 as JetPack 5-6 lays it out (hwmon driver ``ina3221``)."""
    hwmon = root / "sys/bus/i2c/drivers/ina3221/1-0040/hwmon/hwmon1"
    files = {
        "name": "ina3221",
        "in1_label": "VDD_IN",
        "in1_input": "5072",
        "curr1_input": "1432",
        "shunt1_resistor": "5000",
        "in2_label": "VDD_CPU_GPU_CV",
        "in2_input": "5064",
        "curr2_input": "392",
        "in3_label": "VDD_SOC",
        "in3_input": "5064",
        "curr3_input": "720",
        "in4_input": "7",
        "in7_label": "sum of shunt voltages",
        "in7_input": "12",
        "update_interval": "140",
    }
    for name, text in files.items():
        write(hwmon / name, text)
    return hwmon


def android_battery(root: Path, on_usb: bool) -> Path:
    supplies = root / "sys/class/power_supply"
    write(supplies / "battery/type", "Battery")
    write(supplies / "battery/status", "Charging" if on_usb else "Discharging")
    write(supplies / "battery/current_now", "1200000" if on_usb else "-431250")
    write(supplies / "battery/voltage_now", "3861000")
    write(supplies / "usb/type", "USB")
    write(supplies / "usb/online", "1" if on_usb else "0")
    write(supplies / "ac/type", "Mains")
    write(supplies / "ac/online", "0")
    return supplies


def rapl_tree(root: Path, package_uj: int, core_uj: int) -> None:
    """Powercap as the kernel lays it out: class entries are links into devices/virtual/powercap."""
    devices = root / "sys/devices/virtual/powercap/intel-rapl"
    klass = root / "sys/class/powercap"
    klass.mkdir(parents=True, exist_ok=True)
    for zone, name, value, top in (
        ("intel-rapl:0", "package-0", package_uj, True),
        ("intel-rapl:0:0", "core", core_uj, False),
    ):
        where = devices / zone if top else devices / "intel-rapl:0" / zone
        write(where / "name", name)
        write(where / "energy_uj", str(value))
        write(where / "max_energy_range_uj", "262143328850")
        link = klass / zone
        if not link.exists():
            link.symlink_to(os.path.relpath(where, klass))


def fake_vcgencmd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, printout: str | None) -> Path:
    """Put a ``vcgencmd`` on PATH that prints ``printout`` for ``pmic_read_adc`` (None: errors like a Pi 4's)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    script = bin_dir / "vcgencmd"
    if printout is None:
        body = "echo 'error=1 error_msg=\"Command not registered\"' >&2\nexit 255\n"
    else:
        body = f'[ "$1" = pmic_read_adc ] || exit 2\ncat <<"EOF"\n{printout}EOF\n'
    script.write_text("#!/bin/sh\n" + body)
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}")
    return script


def no_vcgencmd(name: str) -> str | None:
    return None


class FakeTime:
    """A clock that advances only when slept, calling ``on_sleep(now)`` to change the files."""

    def __init__(self, on_sleep) -> None:  # noqa: ANN001
        self.now = 100.0
        self.on_sleep = on_sleep

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds
        self.on_sleep(self.now - 100.0)


# ---------------------------------------------------------------------------- discovery


def test_jetpack_hwmon_rails_resolution_and_update_interval(tmp_path: Path) -> None:
    hwmon = jetpack_hwmon(tmp_path)
    (sensor,) = discover(str(tmp_path), which=no_vcgencmd)
    assert sensor.kind == "ina3221-hwmon" and sensor.source == str(hwmon)
    assert sensor.rails == ("VDD_IN", "VDD_CPU_GPU_CV", "VDD_SOC")  # in7 has no current: not a rail
    assert sensor.channels == ("1", "2", "3")
    assert sensor.total == ("VDD_IN",)
    assert sensor.update_interval_s == pytest.approx(0.140)
    # VDD_IN: 40 uV over 5 mOhm = 8 mA per count, at 5.072 V = 40.576 mW
    assert sensor.resolution == pytest.approx(0.040576)
    reading = read_power(sensor)
    assert reading.watts == pytest.approx({"VDD_IN": 7.263104, "VDD_CPU_GPU_CV": 1.985088, "VDD_SOC": 3.64608})
    assert not reading.external_power


def test_older_jetpack_iio_rails(tmp_path: Path) -> None:
    iio = tmp_path / "sys/bus/i2c/drivers/ina3221x/6-0040/iio:device0"
    for n, (rail, mw) in enumerate((("POM_5V_IN", "1962"), ("POM_5V_GPU", "78"), ("POM_5V_CPU", "396"))):
        write(iio / f"rail_name_{n}", rail)
        write(iio / f"in_power{n}_input", mw)
        write(iio / f"in_current{n}_input", "1")
    (sensor,) = discover(str(tmp_path), which=no_vcgencmd)
    assert (sensor.kind, sensor.rails, sensor.total) == (
        "ina3221-iio",
        ("POM_5V_IN", "POM_5V_GPU", "POM_5V_CPU"),
        ("POM_5V_IN",),
    )
    assert sensor.resolution == pytest.approx(0.001)
    assert sensor.update_interval_s is None
    assert read_power(sensor).watts == pytest.approx({"POM_5V_IN": 1.962, "POM_5V_GPU": 0.078, "POM_5V_CPU": 0.396})


def test_raspberry_pi_5_pmic_printout_through_vcgencmd_on_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    script = fake_vcgencmd(tmp_path, monkeypatch, PI5_PMIC)
    (sensor,) = discover(str(tmp_path / "empty"))
    assert sensor.kind == "pmic-adc" and sensor.source == str(script)
    assert len(sensor.rails) == 12 and "EXT5V" not in sensor.rails and "BATT" not in sensor.rails
    assert sensor.rails[:2] == ("3V7_WL_SW", "3V3_SYS") and sensor.total == sensor.rails
    assert sensor.resolution == pytest.approx(1e-8 * 5.14956)  # 8 decimals of A, at HDMI's 5.14956 V
    watts = read_power(sensor).watts
    assert watts["VDD_CORE"] == pytest.approx(0.7377 * 0.88182)  # 0.650518614 W
    assert watts["DDR_VDDQ"] == 0.0
    assert sum(watts.values()) == pytest.approx(1.80095045, rel=1e-8)


def test_pmic_lines_without_a_partner_are_left_out() -> None:
    assert parse_pmic_adc("  A_A current(0)=0.5A\n  A_V volt(1)=2.0V\n  B_V volt(2)=1.0V\ngarbage\n") == {
        "A": (0.5, 2.0)
    }


def test_android_battery_on_battery_and_on_usb(tmp_path: Path) -> None:
    supplies = android_battery(tmp_path / "battery", on_usb=False)
    (sensor,) = discover(str(tmp_path / "battery"), which=no_vcgencmd)
    assert (sensor.kind, sensor.source, sensor.rails, sensor.total) == (
        "power-supply",
        str(supplies),
        ("battery",),
        ("battery",),
    )
    assert sensor.resolution == pytest.approx(3.861e-6)  # 1 uA at 3.861 V
    reading = read_power(sensor)
    assert reading.watts == {"battery": pytest.approx(0.43125 * 3.861)}  # 1.66505625 W, sign dropped
    assert not reading.external_power

    android_battery(tmp_path / "usb", on_usb=True)
    (charging,) = discover(str(tmp_path / "usb"), which=no_vcgencmd)
    reading = read_power(charging)
    assert reading.external_power and reading.watts == {"battery": pytest.approx(1.2 * 3.861)}
    measured = sample(charging, 0.2, 0.1)
    assert measured.external_power  # flagged: the battery is charging, not the device's draw


def test_android_usb_online_alone_flags_external_power(tmp_path: Path) -> None:
    supplies = android_battery(tmp_path, on_usb=False)
    write(supplies / "usb/online", "1")  # "Discharging" but a cable in (a vendor that reports so)
    (sensor,) = discover(str(tmp_path), which=no_vcgencmd)
    assert read_power(sensor).external_power


def test_rapl_zones_and_a_wrap_around_between_two_readings(tmp_path: Path) -> None:
    rapl_tree(tmp_path, 262143000000, 1000)
    (sensor,) = discover(str(tmp_path), which=no_vcgencmd)
    assert (sensor.kind, sensor.rails, sensor.total) == ("rapl", ("package-0", "core"), ("package-0",))
    assert sensor.channels == ("intel-rapl:0", "intel-rapl:0:0") and sensor.counter
    assert read_energy(sensor) == {
        "package-0": (pytest.approx(262143.0), pytest.approx(262143.32885)),
        "core": (pytest.approx(0.001), pytest.approx(262143.32885)),
    }

    def advance(elapsed: float) -> None:
        rapl_tree(tmp_path, 500000, 2001000)  # package wrapped; core went up 2 J

    fake = FakeTime(advance)
    measured = sample(sensor, 1.0, 1.0, clock=fake.clock, sleep=fake.sleep)
    # 262143328850 - 262143000000 + 500000 uJ = 828850 uJ
    assert measured.joules == pytest.approx(0.82885)
    assert measured.per_rail_j == {"package-0": pytest.approx(0.82885), "core": pytest.approx(2.0)}
    assert (measured.readings, measured.seconds, measured.uncertainty_j) == (2, 1.0, pytest.approx(2e-6))


def test_nothing_found_under_an_empty_root_and_on_a_pi_4(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "sys/class/power_supply").mkdir(parents=True)
    assert discover(str(tmp_path), which=no_vcgencmd) == ()
    fake_vcgencmd(tmp_path, monkeypatch, None)  # a Pi 4: the command errors
    assert discover(str(tmp_path)) == ()
    fake_vcgencmd(tmp_path, monkeypatch, "")  # prints nothing useful
    assert discover(str(tmp_path)) == ()


# ---------------------------------------------------------------------------- sampling


# ---------------------------------------------------------------------------- bad input


def test_a_missing_file_is_named(tmp_path: Path) -> None:
    hwmon = jetpack_hwmon(tmp_path)
    (sensor,) = discover(str(tmp_path), which=no_vcgencmd)
    (hwmon / "curr2_input").unlink()
    with pytest.raises(PowerError, match=rf"^{hwmon}/curr2_input: missing$"):
        read_power(sensor)


def test_an_unreadable_file_is_named_with_the_reason(tmp_path: Path) -> None:
    rapl_tree(tmp_path, 5, 6)
    (sensor,) = discover(str(tmp_path), which=no_vcgencmd)
    energy = tmp_path / "sys/devices/virtual/powercap/intel-rapl/intel-rapl:0/energy_uj"
    energy.unlink()
    energy.mkdir()  # unreadable as a file whoever we are (root reads a mode-000 file)
    with pytest.raises(PowerError, match=r"intel-rapl:0/energy_uj: unreadable \(Is a directory\)"):
        read_energy(sensor)


def test_a_file_that_is_not_a_number_is_named(tmp_path: Path) -> None:
    iio = tmp_path / "sys/bus/i2c/drivers/ina3221x/6-0040/iio:device0"
    write(iio / "rail_name_0", "VDD_IN")
    write(iio / "in_power0_input", "n/a")
    (sensor,) = discover(str(tmp_path), which=no_vcgencmd)
    with pytest.raises(PowerError, match=r"in_power0_input: not a number: 'n/a'"):
        read_power(sensor)


def test_an_unknown_rail_is_refused(tmp_path: Path) -> None:
    jetpack_hwmon(tmp_path)
    (sensor,) = discover(str(tmp_path), which=no_vcgencmd)
    with pytest.raises(PowerError, match=r"rail 'VDD_GPU' not found \(rails: VDD_IN, VDD_CPU_GPU_CV, VDD_SOC\)"):
        sample(sensor, 0.1, 0.05, rails=("VDD_GPU",))


def test_a_rail_gone_from_the_pmic_printout(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_vcgencmd(tmp_path, monkeypatch, PI5_PMIC)
    (sensor,) = discover(str(tmp_path))
    fake_vcgencmd(tmp_path, monkeypatch, PI5_PMIC.replace("HDMI_A", "HDMX_A"))
    with pytest.raises(PowerError, match="vcgencmd pmic_read_adc: rail 'HDMI' not found in the printout"):
        read_power(sensor)


def test_no_vcgencmd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(PowerError, match=r"^vcgencmd: not installed \(not on PATH\)$"):
        run_vcgencmd(None)
    monkeypatch.setenv("PATH", str(tmp_path))
    gone = Sensor("pmic-adc", str(tmp_path / "bin/vcgencmd"), ("VDD_CORE",), ("VDD_CORE",), ("VDD_CORE",), 1e-8)
    with pytest.raises(PowerError, match="vcgencmd: not installed"):
        read_power(gone)


def test_vcgencmd_that_fails_is_named_with_its_status(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    script = fake_vcgencmd(tmp_path, monkeypatch, None)
    with pytest.raises(PowerError, match=rf"^{script} pmic_read_adc: exit status 255: .*Command not registered"):
        run_vcgencmd(str(script))


def test_a_battery_without_current_now(tmp_path: Path) -> None:
    supplies = android_battery(tmp_path, on_usb=False)
    (sensor,) = discover(str(tmp_path), which=no_vcgencmd)
    (supplies / "battery/current_now").unlink()
    with pytest.raises(PowerError, match=r"battery/current_now: missing \(no current_now"):
        read_power(sensor)
    assert discover(str(tmp_path), which=no_vcgencmd) == ()  # a battery that reports no current is no sensor


def test_a_counter_is_not_read_as_power_nor_power_as_a_counter(tmp_path: Path) -> None:
    rapl_tree(tmp_path / "rapl", 1, 1)
    jetpack_hwmon(tmp_path / "jetson")
    (rapl,) = discover(str(tmp_path / "rapl"), which=no_vcgencmd)
    (hwmon,) = discover(str(tmp_path / "jetson"), which=no_vcgencmd)
    with pytest.raises(PowerError, match="read it with read_energy"):
        read_power(rapl)
    with pytest.raises(PowerError, match="read it with read_power"):
        read_energy(hwmon)


def test_sensors_below_an_emulated_devices_root_are_marked(tmp_path: Path) -> None:
    rapl_tree(tmp_path, 1, 1)
    assert [s.emulated for s in discover(str(tmp_path), which=no_vcgencmd)] == [False]
    write(tmp_path / "fleetbench-emulated", "rapl idle_w=2 busy_core_w=1.5")
    (sensor,) = discover(str(tmp_path), which=no_vcgencmd)
    assert sensor.emulated and sample(sensor, 0.02, 0.01).emulated
