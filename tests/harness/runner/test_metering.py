"""The energy of a stretch of sensor readings (`harness.runner.metering`): counters differenced, power integrated.

The sensor trees are the real formats of `tests.harness.runner.test_power`; time is a fake clock.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.runner.metering import counter_delta, sample
from harness.runner.power import PowerError, discover
from tests.harness.runner.test_power import FakeTime, jetpack_hwmon, no_vcgencmd, write


def test_counter_delta_wraps_only_with_a_range() -> None:
    assert counter_delta(10.0, 12.5, None) == 2.5
    assert counter_delta(90.0, 5.0, 100.0) == 15.0
    with pytest.raises(PowerError, match="went back"):
        counter_delta(90.0, 5.0, None)


def test_power_is_integrated_over_time_with_an_uncertainty(tmp_path: Path) -> None:
    hwmon = jetpack_hwmon(tmp_path)
    (sensor,) = discover(str(tmp_path), which=no_vcgencmd)

    def advance(elapsed: float) -> None:  # VDD_IN: 1000 mA, then 2000 mA, then 2000 mA at 5.072 V
        write(hwmon / "curr1_input", "1000" if elapsed < 0.25 else "2000")

    write(hwmon / "curr1_input", "1000")
    fake = FakeTime(advance)
    measured = sample(sensor, 1.0, 0.5, clock=fake.clock, sleep=fake.sleep)
    assert measured.readings == 3 and measured.seconds == pytest.approx(1.0)
    assert measured.rails == ("VDD_IN",)
    # readings at 0, 0.5, 1.0 s: 5.072, 10.144, 10.144 W; trapezoid: 0.5*(5.072+10.144)/2 + 0.5*10.144
    assert measured.joules == pytest.approx(8.876)
    # spread of (5.072, 10.144, 10.144): sd = 2.92832...; independent readings: 1 s / max(0.5, 0.14) = 2
    sd = 2.9283205653
    assert measured.uncertainty_j == pytest.approx(1.0 * ((sd / 2**0.5) ** 2 + (0.040576 / 2) ** 2) ** 0.5, rel=1e-6)


def test_a_steady_power_has_only_the_resolution_as_uncertainty(tmp_path: Path) -> None:
    jetpack_hwmon(tmp_path)
    (sensor,) = discover(str(tmp_path), which=no_vcgencmd)
    fake = FakeTime(lambda elapsed: None)
    measured = sample(sensor, 2.0, 0.5, rails=("VDD_IN", "VDD_SOC"), clock=fake.clock, sleep=fake.sleep)
    assert measured.readings == 5
    assert measured.joules == pytest.approx(2.0 * (7.263104 + 3.64608))
    assert measured.uncertainty_j == pytest.approx(2.0 * 2 * 0.040576 / 2)
