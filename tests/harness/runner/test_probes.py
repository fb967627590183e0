"""Readings of the device (`harness.runner.probes`)."""

from __future__ import annotations

from harness.runner.probes import throttled


def test_throttle_rule() -> None:
    assert throttled([1000, 1000], [1000, 940], {}, {})
    assert not throttled([1000, 1000], [960, 2000], {}, {})
    assert throttled([], [], {"cpu": 95.0}, {"cpu": [90.0]})
    assert not throttled([], [], {"cpu": 85.0}, {"cpu": [90.0]})
