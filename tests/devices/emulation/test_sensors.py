"""Emulated power sensors (`devices.emulation.sensors`): the model, the files, and a device brought up with one.

The files are read back through the runner's own readers (`harness.runner.power`), the
ones a device uses; expected numbers are worked out by hand from the model
``idle_w + busy_core_w * busy cores``.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from devices import processes
from devices.connect import connect
from devices.emulation import emulate, sensors
from devices.emulation.sensors import (
    HWMON_DIR,
    cgroup_usage_usec,
    drive,
    model_watts,
    process_usage_delta,
    sensor_files,
    usage_source,
)
from devices.facts import probe_device
from devices.fleet import EmulatedPower, Fleet
from devices.fleetfile import load_fleet
from harness.runner.metering import EnergySample, sample
from harness.runner.power import discover, read_energy, read_power

#: Burns about ARGV[1] seconds of cpu in one thread and prints the cpu seconds this process used.
BUSY = (
    "import sys, time\n"
    "end = time.process_time() + float(sys.argv[1])\n"
    "while time.process_time() < end: pass\n"
    "print(time.process_time())\n"
)


def no_vcgencmd(name: str) -> None:
    return None


# ---------------------------------------------------------------------------- model and files


def test_the_model_adds_each_busy_cores_watts_to_idle() -> None:
    power = EmulatedPower("rapl", 2.0, 1.5)
    assert model_watts(power, 0.0) == 2.0
    assert model_watts(power, 2.5) == 5.75
    assert model_watts(power, -0.1) == 2.0  # a counter read out of step never lowers the draw below idle


def test_hwmon_files_are_jetpacks_layout(tmp_path: Path) -> None:
    files = sensor_files(EmulatedPower("ina3221-hwmon", 2.0, 1.5), 5.0, 0.0)
    hwmon = "sys/bus/i2c/drivers/ina3221/1-0040/hwmon/hwmon1"
    assert files[f"{hwmon}/in1_label"] == "VDD_IN\n" and files[f"{hwmon}/in1_input"] == "5000\n"
    assert files[f"{hwmon}/curr1_input"] == "1000\n"  # 5 W at 5 V
    assert files[f"{hwmon}/in2_label"] == "VDD_CPU_GPU_CV\n" and files[f"{hwmon}/curr2_input"] == "600\n"  # 3 W
    sensors.write_files(tmp_path, files)
    (sensor,) = discover(str(tmp_path), which=no_vcgencmd)
    assert (sensor.kind, sensor.rails, sensor.total, sensor.emulated) == (
        "ina3221-hwmon",
        ("VDD_IN", "VDD_CPU_GPU_CV"),
        ("VDD_IN",),
        True,
    )
    assert sensor.update_interval_s == pytest.approx(0.1)
    assert read_power(sensor).watts == {"VDD_IN": pytest.approx(5.0), "VDD_CPU_GPU_CV": pytest.approx(3.0)}


def test_battery_files_are_a_phone_discharging(tmp_path: Path) -> None:
    files = sensor_files(EmulatedPower("power-supply", 1.0, 0.5), 1.925, 0.0)
    assert files["sys/class/power_supply/battery/current_now"] == "-500000\n"  # 1.925 W at 3.85 V, discharging
    assert files["sys/class/power_supply/usb/online"] == "0\n"
    sensors.write_files(tmp_path, files)
    (sensor,) = discover(str(tmp_path), which=no_vcgencmd)
    reading = read_power(sensor)
    assert reading.watts == {"battery": pytest.approx(1.925)} and not reading.external_power


def test_rapl_counter_accumulates_and_wraps(tmp_path: Path) -> None:
    power = EmulatedPower("rapl", 2.0, 1.5)
    assert sensor_files(power, 2.0, 3.5)["sys/class/powercap/intel-rapl:0/energy_uj"] == "3500000\n"
    wrapped = sensor_files(power, 2.0, 262143.32885 + 1.0)["sys/class/powercap/intel-rapl:0/energy_uj"]
    assert wrapped == "1000000\n"


@pytest.mark.parametrize("fmt", ["ina3221-hwmon", "power-supply", "rapl"])
def test_the_emulated_mark_is_written_after_the_sensor_s_files(fmt: str) -> None:
    # fleet up returns once the mark exists: a probe right after it must find the whole sensor
    files = list(sensor_files(EmulatedPower(fmt, 2.0, 1.5), 3.0, 1.0))
    assert files[-1] == sensors.EMULATED_MARK and files.count(sensors.EMULATED_MARK) == 1 and len(files) > 1


def test_cgroup_usage_from_v2_and_v1_files() -> None:
    assert cgroup_usage_usec({"cpu.stat": "usage_usec 1234567\nuser_usec 1000000\n"}) == 1234567
    assert cgroup_usage_usec({"cpuacct.usage": "2500000000\n"}) == 2500000
    assert cgroup_usage_usec({"cpu.stat": "nr_periods 5\nnr_throttled 1\nthrottled_time 9\n"}) is None
    assert cgroup_usage_usec({}) is None


def test_process_usage_counts_new_processes_whole_and_gone_ones_no_more() -> None:
    before = {(10, 1): 100, (11, 1): 50}
    now = {(10, 1): 130, (12, 7): 20}  # 11 exited, 12 started
    assert process_usage_delta(before, now) == 30 + 20
    assert process_usage_delta(before, {(10, 2): 5}) == 5  # pid 10 reused by another process


def test_a_cgroup_without_a_usage_counter_is_measured_by_the_processes_it_lists(tmp_path: Path) -> None:
    """A v1 cpu hierarchy without cpuacct: the cgroup's own list of processes, not the marker."""
    busy = subprocess.Popen([sys.executable, "-c", "import time\nend = time.process_time() + 0.4\n"
                             "while time.process_time() < end: pass\ntime.sleep(30)"])  # fmt: skip
    try:
        (tmp_path / "cgroup.procs").write_text(f"{busy.pid}\n")
        usage = usage_source([tmp_path], "FLEETBENCH_DEVICE", f"nobody-{uuid.uuid4().hex}")  # no process carries it
        start = usage()
        deadline = time.monotonic() + 20
        while usage() - start < 0.3 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert 0.3 <= usage() - start <= 0.6
    finally:
        busy.kill()
        busy.wait()


def test_the_driver_turns_cpu_use_into_energy(tmp_path: Path) -> None:
    power = EmulatedPower("rapl", 2.0, 1.5)
    now = {"t": 0.0, "cpu": 0.0, "ticks": 0}

    def sleep(seconds: float) -> None:  # 2 busy cores in the first second, idle in the second
        now["t"] += seconds
        now["cpu"] += 2 * seconds if now["t"] <= 1.0 + 1e-9 else 0.0
        now["ticks"] += 1

    joules = drive(tmp_path, power, lambda: now["cpu"], 0.5, lambda: now["t"], sleep, running=lambda: now["ticks"] < 4)
    assert joules == pytest.approx(1.0 * (2.0 + 1.5 * 2) + 1.0 * 2.0)  # 5 J, then 2 J
    (sensor,) = discover(str(tmp_path), which=no_vcgencmd)
    assert read_energy(sensor)["package-0"][0] == pytest.approx(7.0)


def test_the_driver_rewrites_only_the_files_whose_value_changed(tmp_path: Path) -> None:
    power = EmulatedPower("ina3221-hwmon", 2.0, 3.0)
    now = {"t": 0.0, "cpu": 0.0, "ticks": 0}
    inodes: list[dict[str, int]] = []

    def sleep(seconds: float) -> None:  # one busy core, then idle; the files are looked at before each update
        inodes.append({p.name: p.stat().st_ino for p in tmp_path.rglob("*") if p.is_file()})
        now["t"] += seconds
        now["cpu"] += seconds if now["ticks"] == 0 else 0.0
        now["ticks"] += 1

    drive(tmp_path, power, lambda: now["cpu"], 0.5, lambda: now["t"], sleep, running=lambda: now["ticks"] < 3)
    inodes.append({p.name: p.stat().st_ino for p in tmp_path.rglob("*") if p.is_file()})
    first, busy, idle, last = inodes
    replaced = {name for name in first if busy[name] != idle[name]}  # the update from busy to idle
    assert replaced == {"curr1_input", "curr2_input"}  # the draw; the labels, voltages and mark stay
    assert all(last[name] == idle[name] for name in first)  # idle again: nothing changed, nothing written
    assert (tmp_path / HWMON_DIR / "curr1_input").read_text() == "400\n"  # 2 W at 5 V


# ---------------------------------------------------------------------------- a device brought up with one


@pytest.fixture
def brought_down() -> Iterator[list[Fleet]]:
    """Fleets a test brought up; each is brought down after it, whatever the test left."""
    fleets: list[Fleet] = []
    yield fleets
    for fleet in fleets:
        emulate.down(fleet, say=lambda line: None)


def _up(tmp_path: Path, power: str, brought_down: list[Fleet]) -> Fleet:
    name = f"watts-{uuid.uuid4().hex[:6]}"
    path = tmp_path / "fleet.yaml"
    path.write_text(f"state_dir: state\ndevices:\n  - name: {name}\n    kind: local\n    emulate: {{power: {power}}}\n")
    fleet = load_fleet(path)
    brought_down.append(fleet)
    result = emulate.up(fleet, say=lambda line: None)
    assert result.ok, result.failed
    return fleet


def _busy(fleet: Fleet, seconds: float) -> float:
    """Run BUSY on the fleet's device; return the cpu seconds it used."""
    device = fleet.devices[0]
    result = connect(device).run([device.python, "-c", BUSY, str(seconds)], timeout=120)
    assert result.ok, result.stderr
    return float(result.stdout)


@pytest.mark.parametrize("fmt", ["rapl", "ina3221-hwmon"])
def test_a_busy_command_costs_about_busy_core_w_per_cpu_second_above_idle(
    tmp_path: Path, fmt: str, brought_down: list[Fleet]
) -> None:
    fleet = _up(tmp_path, f"{{format: {fmt}, idle_w: 2.0, busy_core_w: 1.5}}", brought_down)
    device = fleet.devices[0]
    state = emulate.load_state(fleet.state_dir).get(device.name)
    assert state is not None and [rec.role for rec in state.processes] == ["power-sensor"]
    (sensor,) = discover(device.power_root, which=no_vcgencmd)
    assert (sensor.kind, sensor.emulated) == (fmt, True)
    facts = probe_device(connect(device), python=device.python, timeout=60, power_root=device.power_root)
    assert [(s.kind, s.emulated) for s in facts.power] == [(fmt, True)]

    measured: list[EnergySample] = []
    window = 5.0
    sampler = threading.Thread(target=lambda: measured.append(sample(sensor, window, 0.05)))
    sampler.start()
    time.sleep(0.3)
    cpu = _busy(fleet, 2.0)
    sampler.join()
    (energy,) = measured
    idle = 2.0 * energy.seconds
    excess = energy.joules - idle
    # 1.5 W for each cpu second the command used, within a generous tolerance (the driver
    # updates every 0.1 s; the machine is shared)
    assert 0.6 * 1.5 * cpu < excess < 1.4 * 1.5 * cpu, (energy, cpu)
    assert energy.emulated and not energy.external_power

    assert emulate.down(fleet, say=lambda line: None) == []
    assert not Path(device.power_root).exists()
    assert all(not processes.running(rec) for rec in state.processes)


def test_a_device_up_before_its_power_block_was_written_is_told_how_to_get_its_sensor(
    tmp_path: Path, brought_down: list[Fleet]
) -> None:
    name = f"late-{uuid.uuid4().hex[:6]}"
    path = tmp_path / "fleet.yaml"
    path.write_text(f"state_dir: state\ndevices:\n  - name: {name}\n    kind: local\n    emulate: {{}}\n")
    fleet = load_fleet(path)
    brought_down.append(fleet)
    assert emulate.up(fleet, say=lambda line: None).ok
    path.write_text(
        path.read_text().replace("emulate: {}", "emulate: {power: {format: rapl, idle_w: 1, busy_core_w: 1}}")
    )
    said: list[str] = []
    result = emulate.up(load_fleet(path), say=said.append)
    assert result.already_up == (name,)
    assert said[-1] == f"  {name}: up without its power sensor; `fleet down` and `fleet up` start it"
