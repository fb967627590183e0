"""What a campaign tells its user (`harness.progress`): a line per finished cell, a table at the end."""

from __future__ import annotations

import pandas as pd

from devices.fleet import Device
from harness.cells import plan_cells
from harness.document import EMPTY_DOCUMENT, parse_document
from harness.passes import measurement_from_doc
from harness.progress import CellEvent, format_event, per_image_us, summary_table
from tests.harness.campaigns import BATCH, MODEL


def test_a_progress_line_says_the_cells_latency_precision_and_neighbours() -> None:
    spec = plan_cells([Device("d", "local")], MODEL, [0.5], [BATCH], ["ort"], 6, 20)[0]
    doc = parse_document({"step_seconds": [0.004] * 9, "precision_achieved": 0.012})
    measured = measurement_from_doc(
        spec, "ok", "", doc, facts={}, started_at=0.0, finished_at=1.0, versions={}, git_commit=None,
        isolation={"alone": False, "concurrent_with": ["pi"]},
    )  # fmt: skip
    assert per_image_us(measured) == 1000.0
    line = format_event(CellEvent("d", 2, 4, measured))
    assert line == "[d] 2/4 w0.50 b4 ort ok 1000 us/img +-1.2 % (concurrent with pi)"
    failed = measurement_from_doc(
        spec, "timeout", "took too long", EMPTY_DOCUMENT, facts={}, started_at=0, finished_at=1, versions={},
        git_commit=None,
    )  # fmt: skip
    assert per_image_us(failed) is None
    assert format_event(CellEvent("d", 3, 4, failed)) == "[d] 3/4 w0.50 b4 ort timeout: took too long"


def test_the_summary_table_has_a_row_per_planned_cell() -> None:
    specs = plan_cells([Device("d", "local")], MODEL, [0.5, 1.0], [BATCH], ["ort"], 6, 20)
    cells = pd.DataFrame(
        [{"cell_key": specs[0].cell_key(), "status": "ok", "imprecise": True, "precision_achieved": 0.034,
          "median_us": 812.4, "p95_us": 900.0, "peak_memory_bytes": 80e6}]
    )  # fmt: skip
    header, measured, missing = summary_table(cells, specs).splitlines()
    assert header.split() == ["device", "width", "batch", "backend", "median", "us", "+-%", "p95", "us", "peak", "MB",
                              "status"]  # fmt: skip
    assert measured.split() == ["d", "0.50", "4", "ort", "812", "3.4", "900", "80", "ok,", "imprecise"]
    assert missing.split() == ["d", "1.00", "4", "ort", "-", "-", "-", "-", "not", "run"]


def test_the_summary_table_prints_energy_per_image_beside_latency() -> None:
    specs = plan_cells([Device("d", "local")], MODEL, [0.25, 0.5, 1.0], [BATCH], ["ort"], 6, 20)
    cells = pd.DataFrame(
        [{"cell_key": specs[0].cell_key(), "status": "ok", "median_us": 812.4, "p95_us": 900.0,
          "peak_memory_bytes": 80e6, "energy_j_per_image": 0.00123, "energy_emulated": True, "energy_flag": None},
         {"cell_key": specs[1].cell_key(), "status": "ok", "median_us": 1500.0, "p95_us": 1600.0,
          "peak_memory_bytes": 90e6, "energy_j_per_image": float("nan"), "energy_emulated": None,
          "energy_flag": "external-power"}]
    )  # fmt: skip
    header, emulated, flagged, missing = summary_table(cells, specs).splitlines()
    assert header.split()[4:8] == ["median", "us", "mJ/img", "+-%"]
    assert emulated.split() == ["d", "0.25", "4", "ort", "812", "1.23", "(emulated)", "-", "900", "80", "ok"]
    assert flagged.split() == ["d", "0.50", "4", "ort", "1500", "-", "-", "1600", "90", "ok,", "energy:",
                               "external-power"]  # fmt: skip
    assert missing.split()[4:6] == ["-", "-"]
