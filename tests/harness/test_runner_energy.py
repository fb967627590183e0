"""The runner's energy (``--power-root``): bench and train over fake sensor trees in the real formats.

The runner runs as a device runs it (`tests.harness.test_runner.run_runner`); each test lays
out a sensor tree below a temporary power root and checks the document's ``energy`` against
numbers worked out by hand, or its flag, with the latency measured as always.
"""

from __future__ import annotations

import os
import stat
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from exporters.artifacts import export_artifacts
from exporters.ort_training import OrtTrainer
from exporters.zoo import get_model
from harness.document import parse_document
from harness.runner.metering import IDLE_WINDOW_S, MIN_UPDATES
from tests.harness.test_runner import bench_args, learnable_shard, run_runner, train_args

HWMON = "sys/bus/i2c/drivers/ina3221/1-0040/hwmon/hwmon1"
SUPPLY = "sys/class/power_supply"
RAPL = "sys/class/powercap/intel-rapl:0"


@pytest.fixture(scope="module")
def cnn(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """fjord-cnn at width 0.25, batch 4, SGD."""
    model = get_model("fjord-cnn")
    out = tmp_path_factory.mktemp("artifacts")
    return export_artifacts(model, model.arch(0.25), batch=4, optimizer="sgd", out_dir=out).directory


def write_tree(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text + "\n")
    return root


def hwmon(root: Path, *, millivolts: int = 5000, milliamps: int = 1000, interval_ms: int = 50) -> Path:
    """A JetPack 5 INA3221: VDD_IN at ``millivolts`` x ``milliamps`` and a CPU rail, updating every ``interval_ms``."""
    files = {
        "in1_label": "VDD_IN", "in1_input": str(millivolts), "curr1_input": str(milliamps),
        "in2_label": "VDD_CPU_GPU_CV", "in2_input": str(millivolts), "curr2_input": "200",
        "update_interval": str(interval_ms),
    }  # fmt: skip
    return write_tree(root, {f"{HWMON}/{name}": text for name, text in files.items()})


def battery(root: Path, *, current: bool = True, charging: bool = False) -> Path:
    """An Android phone's battery at 3.85 V drawing 520 mA (discharge counted negative), and its usb supply."""
    files = {
        f"{SUPPLY}/battery/type": "Battery", f"{SUPPLY}/battery/voltage_now": "3850000",
        f"{SUPPLY}/battery/status": "Charging" if charging else "Discharging",
        f"{SUPPLY}/usb/type": "USB", f"{SUPPLY}/usb/online": "1" if charging else "0",
    }  # fmt: skip
    if current:
        files[f"{SUPPLY}/battery/current_now"] = "-520000"
    return write_tree(root, files)


@pytest.fixture
def rapl(tmp_path: Path) -> Iterator[tuple[Path, float]]:
    """A RAPL package zone whose counter a thread advances at 3 W (replacing the file whole, as sysfs reads)."""
    watts = 3.0
    root = write_tree(tmp_path / "rapl", {f"{RAPL}/name": "package-0", f"{RAPL}/max_energy_range_uj": "262143328850"})
    counter = root / RAPL / "energy_uj"
    stop = threading.Event()
    began = time.monotonic()

    def advance() -> None:
        while not stop.is_set():
            tmp = counter.with_suffix(".tmp")
            tmp.write_text(f"{round((time.monotonic() - began) * watts * 1e6)}\n")
            os.replace(tmp, counter)
            stop.wait(0.001)

    counter.write_text("0\n")
    thread = threading.Thread(target=advance, daemon=True)
    thread.start()
    yield root, watts
    stop.set()
    thread.join()


def energy_of(*argv: str, env: dict[str, str] | None = None) -> dict:
    """Run the runner; return its document, checked as the host checks it (`harness.document.parse_document`)."""
    rc, doc, err = run_runner(*argv, env=env)
    assert rc == 0, (doc, err[-2000:])
    parse_document(doc, from_device=True)
    return doc


# --------------------------------------------------------------------------- measured


def test_bench_without_a_power_root_measures_no_energy(cnn: Path) -> None:
    doc = energy_of(*bench_args(cnn))
    assert doc["energy"] is None


def test_bench_with_no_sensor_below_the_root_measures_none(cnn: Path, tmp_path: Path) -> None:
    doc = energy_of(*bench_args(cnn), "--power-root", str(tmp_path))
    assert doc["energy"] is None and len(doc["step_seconds"]) == 5


def test_bench_integrates_the_ina3221_input_rail_over_the_timed_steps(cnn: Path, tmp_path: Path) -> None:
    root = hwmon(tmp_path, millivolts=5000, milliamps=1000, interval_ms=50)
    doc = energy_of(*bench_args(cnn), "--power-root", str(root))
    energy = doc["energy"]
    assert (energy["sensor"], energy["rails"], energy["emulated"], energy["flag"]) == (
        "ina3221-hwmon", ["VDD_IN"], False, None
    )  # fmt: skip
    seconds = energy["seconds"]
    # 5 V x 1 A, constant: 5 W over the window, idle the same; the window spans two 50 ms updates
    assert seconds >= MIN_UPDATES * 0.05
    assert energy["joules"] == pytest.approx(5.0 * seconds, rel=1e-9)
    assert energy["idle_joules"] == pytest.approx(5.0 * seconds, rel=1e-9)
    # no spread: half a step of one count (1 mA at 5 V) over the window
    assert energy["uncertainty_j"] == pytest.approx(seconds * 5e-3 / 2, rel=1e-6)
    # the steps past the samples that the sensor's updates asked for count their images too
    assert energy["images"] % 4 == 0 and energy["images"] >= 4 * sum(doc["steps_per_sample"])
    assert len(doc["step_seconds"]) == 5 and not energy["external_power"]
    reading = parse_document(doc).energy
    assert reading is not None and reading.measured
    assert reading.joules_per_image == pytest.approx(5.0 * seconds / energy["images"], rel=1e-9)
    assert reading.above_idle_per_image == pytest.approx(0.0, abs=1e-12)


def test_bench_differences_a_rapl_counter(cnn: Path, rapl: tuple[Path, float]) -> None:
    root, watts = rapl
    doc = energy_of(*bench_args(cnn, steps=20), "--power-root", str(root))
    energy = doc["energy"]
    assert (energy["sensor"], energy["rails"], energy["flag"]) == ("rapl", ["package-0"], None)
    # the counter advances at 3 W in steps of at most a few ms of a writer thread
    assert energy["joules"] == pytest.approx(watts * energy["seconds"], rel=0.15)
    assert energy["idle_joules"] == pytest.approx(watts * energy["seconds"], rel=0.15)
    assert energy["uncertainty_j"] == pytest.approx(2e-6)  # one count at each end


def test_an_emulated_sensor_is_marked_emulated(cnn: Path, tmp_path: Path) -> None:
    root = hwmon(tmp_path)
    (root / "fleetbench-emulated").write_text("devices.emulation.sensors\n")
    doc = energy_of(*bench_args(cnn), "--power-root", str(root))
    assert doc["energy"]["emulated"] is True and doc["energy"]["flag"] is None
    assert parse_document(doc).energy.emulated  # type: ignore[union-attr]


def test_bench_steps_on_until_a_slow_sensor_updated_twice(cnn: Path, tmp_path: Path) -> None:
    root = hwmon(tmp_path, interval_ms=400)
    doc = energy_of(*bench_args(cnn, steps=3), "--power-root", str(root))
    energy = doc["energy"]
    assert energy["flag"] is None and energy["seconds"] >= 0.8
    assert len(doc["step_seconds"]) == 3  # the added steps are not latency samples
    assert doc["timed_seconds"] < 0.8


def test_a_sensor_slower_than_the_cap_is_flagged_with_its_joules(cnn: Path, tmp_path: Path) -> None:
    root = hwmon(tmp_path, interval_ms=1000)
    doc = energy_of(*bench_args(cnn, steps=3), "--max-seconds", "0.5", "--power-root", str(root))
    energy = doc["energy"]
    assert energy["flag"] == "sensor-slower-than-cell"
    assert energy["joules"] == pytest.approx(5.0 * energy["seconds"], rel=1e-9)
    assert parse_document(doc).energy.joules_per_image is None  # type: ignore[union-attr]


def test_the_idle_window_leaves_the_sampling_budget_alone(cnn: Path, tmp_path: Path) -> None:
    root = hwmon(tmp_path, interval_ms=10)
    started = time.monotonic()
    doc = energy_of(*bench_args(cnn, steps=3), "--power-root", str(root))
    assert time.monotonic() - started >= IDLE_WINDOW_S
    assert doc["timed_seconds"] < IDLE_WINDOW_S  # the idle window is not timed


def test_train_measures_the_round(cnn: Path, tmp_path: Path) -> None:
    start = tmp_path / "start.npy"
    np.save(start, OrtTrainer(cnn).get_flat(), allow_pickle=False)
    shard = learnable_shard(tmp_path / "shard.npz", 64)
    root = hwmon(tmp_path / "power", millivolts=5000, milliamps=600, interval_ms=10)
    argv = train_args(cnn, start, shard, tmp_path / "out.npy", epochs=5)
    doc = energy_of(*argv, "--power-root", str(root))
    energy = doc["energy"]
    assert energy["flag"] is None and energy["images"] == doc["examples"] == 5 * 64
    assert energy["joules"] == pytest.approx(3.0 * energy["seconds"], rel=1e-9)
    assert energy["seconds"] == pytest.approx(doc["loop_seconds"], abs=0.05)
    reading = parse_document(doc).energy
    assert reading is not None and reading.joules_per_image == pytest.approx(3.0 * energy["seconds"] / 320, rel=1e-9)


def test_a_round_shorter_than_the_sensors_updates_is_flagged(cnn: Path, tmp_path: Path) -> None:
    start = tmp_path / "start.npy"
    np.save(start, OrtTrainer(cnn).get_flat(), allow_pickle=False)
    shard = learnable_shard(tmp_path / "shard.npz", 8)
    root = hwmon(tmp_path / "power", interval_ms=1000)
    doc = energy_of(*train_args(cnn, start, shard, tmp_path / "out.npy"), "--power-root", str(root))
    assert doc["energy"]["flag"] == "sensor-slower-than-cell" and doc["energy"]["images"] == 8


# --------------------------------------------------------------------------- flagged, latency kept


def test_a_missing_sensor_file_is_flagged_and_latency_measured(cnn: Path, tmp_path: Path) -> None:
    root = hwmon(tmp_path)
    (root / HWMON / "in1_input").unlink()
    doc = energy_of(*bench_args(cnn), "--power-root", str(root))
    energy = doc["energy"]
    assert energy["flag"] == f"power: {root / HWMON / 'in1_input'}: missing"
    assert energy["joules"] is None and energy["idle_joules"] is None and energy["uncertainty_j"] is None
    assert len(doc["step_seconds"]) == 5 and doc["status"] == "ok"


def fake_vcgencmd(directory: Path, rails_after_first: str) -> Path:
    """A ``vcgencmd`` printing the Pi 5 PMIC's lines: two rails on its first call, ``rails_after_first`` later."""
    directory.mkdir(parents=True, exist_ok=True)
    first = (
        "     3V7_WL_SW_A current(0)=0.10000000A\\n      3V7_WL_SW_V volt(8)=3.70000000V\\n"
        "      VDD_CORE_A current(7)=1.00000000A\\n       VDD_CORE_V volt(15)=0.80000000V\\n"
    )
    script = directory / "vcgencmd"
    script.write_text(
        "#!/bin/sh\n"
        f'calls="{directory}/calls"\n'
        'if [ -e "$calls" ]; then printf "' + rails_after_first + '"; else : > "$calls"; printf "' + first + '"; fi\n'
    )
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return directory


def test_a_rail_gone_from_the_pmic_printout_is_flagged(cnn: Path, tmp_path: Path) -> None:
    bin_dir = fake_vcgencmd(tmp_path / "bin", "      VDD_CORE_A current(7)=1.0A\\n       VDD_CORE_V volt(15)=0.8V\\n")
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"}
    doc = energy_of(*bench_args(cnn), "--power-root", str(tmp_path / "empty"), env=env)
    energy = doc["energy"]
    assert energy["sensor"] == "pmic-adc"
    assert energy["flag"] == "power: vcgencmd pmic_read_adc: rail '3V7_WL_SW' not found in the printout"
    assert energy["joules"] is None and len(doc["step_seconds"]) == 5


def test_no_vcgencmd_on_a_pi5_is_flagged(cnn: Path, tmp_path: Path) -> None:
    env = {**os.environ, "PATH": str(tmp_path / "nothing")}
    argv = (*bench_args(cnn), "--power-root", str(tmp_path), "--power-sensor", "pmic-adc")
    doc = energy_of(*argv, env=env)
    energy = doc["energy"]
    assert (energy["sensor"], energy["flag"]) == ("pmic-adc", "power: vcgencmd: not installed (not on PATH)")
    assert energy["joules"] is None and len(doc["step_seconds"]) == 5 and doc["status"] == "ok"


def test_a_battery_without_current_now_is_flagged(cnn: Path, tmp_path: Path) -> None:
    root = battery(tmp_path, current=False)
    doc = energy_of(*bench_args(cnn), "--power-root", str(root), "--power-sensor", "power-supply")
    energy = doc["energy"]
    current = root / SUPPLY / "battery" / "current_now"
    assert energy["flag"] == f"power: {current}: missing (no current_now: this battery reports no current)"
    assert energy["joules"] is None and len(doc["step_seconds"]) == 5


def test_a_battery_on_usb_power_is_flagged_external(cnn: Path, tmp_path: Path) -> None:
    root = battery(tmp_path, charging=True)
    doc = energy_of(*bench_args(cnn), "--power-root", str(root))
    energy = doc["energy"]
    assert (energy["flag"], energy["external_power"]) == ("external-power", True)
    # 3.85 V x 0.52 A, kept in the document but never per image
    assert energy["joules"] == pytest.approx(3.85 * 0.52 * energy["seconds"], rel=1e-9)
    assert parse_document(doc).energy.joules_per_image is None  # type: ignore[union-attr]


def test_a_battery_on_its_own_is_measured(cnn: Path, tmp_path: Path) -> None:
    root = battery(tmp_path)
    doc = energy_of(*bench_args(cnn), "--power-root", str(root))
    energy = doc["energy"]
    assert (energy["sensor"], energy["rails"], energy["flag"]) == ("power-supply", ["battery"], None)
    assert energy["joules"] == pytest.approx(3.85 * 0.52 * energy["seconds"], rel=1e-9)


def test_a_serve_request_carries_the_power_root(cnn: Path, tmp_path: Path) -> None:
    import json
    import subprocess

    from harness.contract import bench_request
    from harness.runner_archive import archive_path

    root = hwmon(tmp_path)
    request = bench_request(
        str(cnn), backend="ort", warmup=1, steps=3, threads=1, precision=0.0, power_root=str(root),
        power_sensor="ina3221-hwmon",
    )  # fmt: skip
    proc = subprocess.run(
        [sys.executable, str(archive_path()), "serve", "--backend", "ort"],
        input=json.dumps(request) + "\n",
        capture_output=True,
        text=True,
        timeout=120,
    )
    ready, reply = (json.loads(line) for line in proc.stdout.splitlines())
    assert ready["event"] == "ready" and reply["status"] == "ok", proc.stderr[-2000:]
    assert reply["energy"]["sensor"] == "ina3221-hwmon" and reply["energy"]["flag"] is None
    assert reply["energy"]["joules"] == pytest.approx(5.0 * reply["energy"]["seconds"], rel=1e-9)
