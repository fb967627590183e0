"""The cells view: a stored cell's row, its derived statistics, and the frame's schema."""

from __future__ import annotations

import json
import math

import pytest

from harness.cell_view import cell_cpu_seconds, cell_frame, model_memory, view_record
from harness.records import Measurement
from harness.store_schema import CELL_COLUMNS, CELL_DTYPES, ENERGY_COLUMNS
from tests.harness.test_store import failed, measurement, spec

NO_ENERGY = {name: None for name in ENERGY_COLUMNS}


def _row(m: Measurement, **kw: object) -> dict[str, object]:
    args: dict[str, object] = {
        "cell_key": "k",
        "campaign_id": 3,
        "campaign_versions": {"onnxruntime": "1.19.2", "export_format": 4},
        "campaign_git_commit": "c" * 40,
        "energy": NO_ENERGY,
    }
    args.update(kw)
    return view_record(m, **args)  # type: ignore[arg-type]


def test_a_row_has_every_column_and_hand_computed_statistics() -> None:
    # five samples of 20 images: sorted 0.010 .. 0.050, median 0.012 s per step -> 600 us per image
    row = _row(measurement(spec()))
    assert set(row) == set(CELL_COLUMNS)
    assert row["median_us"] == pytest.approx(0.012 / 20 * 1e6)
    assert row["pass_mean_us"] == row["median_us"]  # one pass: the median itself
    assert math.isnan(row["cpu_median_us"])  # the runner measured no CPU time
    assert row["train_flops"] == 4_000_000 and row["arch_sizes"] == "8,16"


def test_a_cell_without_provenance_falls_back_to_its_campaigns() -> None:
    row = _row(measurement(spec(), versions={}, git_commit=None))
    assert row["git_commit"] == "c" * 40
    assert json.loads(row["versions"]) == {"export_format": 4, "onnxruntime": "1.19.2"}
    assert row["export_format"] == "4"
    own = _row(measurement(spec()))
    assert own["git_commit"] == "a" * 40 and own["export_format"] == ""


def test_a_failed_cell_has_nan_statistics_and_no_sample_count() -> None:
    row = _row(failed(spec()))
    assert all(math.isnan(row[name]) for name in ("median_us", "p95_us", "cv", "pass_mean_us", "cpu_median_us"))
    assert row["n"] is None and row["noisy"] is None


def test_cpu_seconds_keep_only_the_undisturbed_samples_of_an_ok_cell() -> None:
    steps = (0.021, 0.031, 0.041)
    cpu = [0.02, 0.03, 0.04]
    runner = {"mode": "bench", "step_seconds": list(steps), "cpu_step_seconds": cpu, "disturbed": [1, 0, 0]}
    m = measurement(spec(), steps=steps, runner=runner)
    assert cell_cpu_seconds(m) == [0.03, 0.04]
    assert _row(m)["cpu_median_us"] == pytest.approx(0.035 / 20 * 1e6)  # median of 0.03 and 0.04
    # CPU times that are not one per sample are not trusted
    short = measurement(spec(), steps=steps, runner={**runner, "step_seconds": [0.021, 0.031]})
    assert cell_cpu_seconds(short) == []
    assert cell_cpu_seconds(failed(spec())) == []


def test_the_models_memory_is_the_peak_less_the_runtimes() -> None:
    runner = {"mode": "bench", "runtime_memory_bytes": 100_000_000}
    row = _row(measurement(spec(), runner=runner))  # peak 123_456_789
    assert row["runtime_memory_bytes"] == 100_000_000 and row["model_memory_bytes"] == 23_456_789
    older = _row(measurement(spec()))  # a runner that did not read it
    assert older["runtime_memory_bytes"] is None and older["model_memory_bytes"] is None
    assert model_memory(None, 5) is None and model_memory(5, None) is None
    assert model_memory(90, 100) == 0  # a peak read on another scale never goes below nothing
    frame = cell_frame([row, older])
    assert frame["model_memory_bytes"].tolist()[0] == 23_456_789 and frame["model_memory_bytes"].isna().tolist()[1]


def test_an_empty_frame_still_has_the_schema() -> None:
    frame = cell_frame([])
    assert list(frame.columns) == list(CELL_COLUMNS)
    assert {name: str(frame[name].dtype) for name in CELL_DTYPES} == CELL_DTYPES
    full = cell_frame([_row(measurement(spec()), energy={**NO_ENERGY, "energy_j_per_image": 0.002})])
    assert full.loc[0, "energy_j_per_image"] == 0.002 and full["energy_emulated"].isna().all()
