"""Bench data files: their labels and the checks against the cells (`harness.bench_data`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from devices.fleet import Device
from exporters.userinput import InputError
from harness.bench_data import bench_data_file, bench_data_label, check_bench_data
from harness.cells import plan_cells
from tests.harness.campaigns import BATCH, MODEL, STEPS, WARMUP


def test_cells_planned_with_bench_data_need_that_file(tmp_path: Path) -> None:
    import numpy as np

    fleet = [Device("here", "local", workdir="/tmp/x")]
    specs = plan_cells(fleet, MODEL, [0.5], [BATCH], ["ort"], STEPS, WARMUP, data="a.npz@0123456789ab")
    assert all(s.data == "a.npz@0123456789ab" and s.cell_key().endswith("|da.npz@0123456789ab") for s in specs)
    with pytest.raises(InputError, match="give its file"):
        bench_data_file(specs, None)
    other = tmp_path / "a.npz"
    np.savez(other, x=np.zeros((4, 1, 28, 28), np.float32), y=np.zeros(4, np.int64))
    with pytest.raises(InputError, match=r"is a\.npz@\w{12}; the cells were planned with a\.npz@0123456789ab"):
        bench_data_file(specs, other)
    (tmp_path / "junk.npz").write_bytes(b"not a zip")
    with pytest.raises(InputError, match="junk.npz: not a readable .npz"):
        bench_data_label(tmp_path / "junk.npz")
    np.savez(tmp_path / "no-y.npz", x=np.zeros((4, 1, 28, 28), np.float32))
    for read in (bench_data_label, lambda path: check_bench_data(path, [])):
        with pytest.raises(InputError, match=r"no-y\.npz: needs arrays x and y, has \['x'\]$"):
            read(tmp_path / "no-y.npz")
    assert bench_data_file(plan_cells(fleet, MODEL, [0.5], [BATCH], ["ort"], STEPS, WARMUP), None) is None
