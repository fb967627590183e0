"""Selecting profile rows and the counts at a width (fl/scheduling/rows.py)."""

from __future__ import annotations

import math

import pytest

from exporters.flops import count
from exporters.userinput import InputError
from exporters.zoo import get_model
from fl.scheduling.rows import memory_counts, predicted_latency, predicted_peak, select, status_summary, width_flops
from tests.fl.scheduling.profiles import PARAMS, line_rows


def test_select_matches_every_given_field() -> None:
    rows = line_rows("A", 100.0, 1e-4) + line_rows("B", 1.0, 1.0, batch=8, backend="torch")
    assert len(select(rows, device="A")) == 4
    assert len(select(rows, batch=8)) == 4 and len(select(rows, batch=8, device="A")) == 0
    assert len(select(rows, backend="torch", model="m")) == 4
    assert len(select(rows)) == 8


def test_status_summary_counts_statuses() -> None:
    rows = [{"status": "timeout"}, {"status": "timeout"}, {"status": "ok"}, {"status": None}]
    assert status_summary(rows) == "2 x no latency, 2 x timeout"


def test_width_flops_prefers_the_measured_rows_then_the_zoo() -> None:
    rows = line_rows("A", 100.0, 1e-4)
    # two devices measured 0.5 with different counts: their median
    rows += [{**rows[1], "device": "B", "train_flops": 4e6}]
    assert width_flops("m", 0.5, rows) == pytest.approx(3e6)
    # a width read back with a rounding error still matches
    assert width_flops("m", 0.25 + 1e-12, rows) == pytest.approx(1e6)
    zoo = get_model("fjord-cnn")
    assert width_flops("fjord-cnn", 0.5, rows) == count(zoo, zoo.arch(0.5)).train_flops
    with pytest.raises(InputError, match="'m'"):
        width_flops("m", 0.6, rows)  # not measured, and "m" is no zoo model


def test_memory_counts_prefer_the_measured_rows_then_the_zoo() -> None:
    rows = line_rows("A", 100.0, 1e-4)  # activation_elements 0
    assert memory_counts("m", 0.5, rows) == (PARAMS[0.5], 0.0)
    zoo = get_model("fjord-cnn")
    counts = count(zoo, zoo.arch(0.5))
    activations = sum(math.prod(layer.output_shape) for layer in counts.layers)
    assert memory_counts("fjord-cnn", 0.5, rows) == (counts.params, activations)


def test_predictions_at_a_width_ask_the_device_models() -> None:
    from harness.latency import fit_device

    # a model outside the zoo: the line in training FLOPs, at an unmeasured width's measured FLOPs
    rows = line_rows("A", 100.0, 1e-4, memory=(50e6, 2.0))
    dm = fit_device(rows)
    lat, mem = dm.latency_model("m"), dm.memory_model("m")
    assert mem is not None
    assert predicted_latency(lat, "m", 0.75, rows).value * 1e6 == pytest.approx(100 + 1e-4 * 3e6, rel=1e-2)
    assert predicted_peak(mem, "m", 0.75, rows).value == pytest.approx(50e6 + 2.0 * 16 * PARAMS[0.75], rel=1e-2)
    # a zoo model: the architecture of the width
    zoo_rows = [{**r, "model": "fjord-cnn", "train_flops": None, "params": None} for r in rows]
    zoo_lat = fit_device(zoo_rows).latency_model("fjord-cnn")
    assert predicted_latency(zoo_lat, "fjord-cnn", 0.6).value == zoo_lat.predict(0.6).value
