"""``fleetbench profile`` end to end (`harness.profile_cli`): the table, Ctrl-C and resume, backends, bench data."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

import harness
from devices.emulation import emulate
from harness.bench_data import bench_data_label
from harness.store import ProfileStore
from harness.widths import AUTO_CANDIDATES
from tests.conftest import SmallFileSystems
from tests.harness.campaigns import BATCH, MODEL, STEPS, TIMEOUT, WARMUP, load, local_fleet_file
from tests.harness.test_runner_onnx import plain_python  # noqa: F401, F811 - a fixture, used as an argument


def test_cli_profile_prints_table(
    fleet_file: Path, artifacts: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from fleetbench.cli import main

    fleet = load(fleet_file)
    assert emulate.up(fleet, say=lambda line: None).ok  # whatever the previous test left
    db = tmp_path / "cli.db"
    argv = ["profile", "--fleet", str(fleet_file), "--model", MODEL, "--widths", "0.25,0.5", "--batch", str(BATCH)]
    argv += ["--steps", str(STEPS), "--warmup", str(WARMUP), "--db", str(db), "--artifacts", str(artifacts)]
    argv += ["--timeout", str(TIMEOUT), "--precision", "0", "--passes", "1", "--no-round-cost"]
    assert main(argv) == 0
    captured = capsys.readouterr()
    names = {d.name for d in fleet.devices}
    lines = [line for line in captured.out.splitlines() if line.split() and line.split()[0] in names]
    assert len(lines) == 2 * len(fleet.devices) and all(line.rstrip().endswith("ok") for line in lines), captured.out
    assert "us/img" in captured.err  # progress lines

    assert main([*argv, "--resume"]) == 0  # nothing left to measure
    assert "already measured" in capsys.readouterr().out

    assert main(["profile", "--fleet", str(fleet_file), "--model", "nope", "--db", str(db)]) == 2
    assert main(["profile", "--fleet", str(fleet_file), "--backend", "tflite", "--db", str(db)]) == 2
    assert main(["profile", "--fleet", str(fleet_file), "--precision", "2", "--db", str(db)]) == 2
    assert main(["profile", "--fleet", str(fleet_file), "--max-seconds", "60", "--timeout", "30", "--db", str(db)]) == 2
    assert main(["profile", "--fleet", str(fleet_file), "--widths", "auto:0", "--db", str(db)]) == 2
    err = capsys.readouterr().err
    assert "--precision 2" in err and "must exceed --max-seconds" in err and "auto:N" in err


def test_ctrl_c_stops_cleanly_and_prints_resume(fleet_file: Path, artifacts: Path, tmp_path: Path) -> None:
    fleet = load(fleet_file)
    assert emulate.up(fleet, say=lambda line: None).ok
    db = tmp_path / "int.db"
    argv = [sys.executable, "-m", "fleetbench", "profile", "--fleet", str(fleet_file), "--model", MODEL]
    argv += ["--widths", "0.25,0.5", "--batch", str(BATCH), "--steps", str(STEPS), "--warmup", str(WARMUP)]
    argv += ["--db", str(db), "--artifacts", str(artifacts), "--timeout", str(TIMEOUT), "--precision", "0"]
    env = {**os.environ, "PYTHONPATH": str(Path(harness.__file__).resolve().parents[1])}
    # A shell starting the tests in the background (``cmd &`` without job control) leaves
    # SIGINT ignored, and a Python started with it ignored never raises KeyboardInterrupt.
    proc = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )  # fmt: skip
    assert proc.stderr is not None
    first = proc.stderr.readline()
    while first.startswith(("isolation plan", "  ", "fleetbench: backend of")):  # backends and the plan first
        first = proc.stderr.readline()
    # the first finished cell
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=TIMEOUT)
    assert "us/img" in first, first + err
    assert proc.returncode == 1, err
    assert "--resume" in err and "Traceback" not in err
    stored = ProfileStore(db).measured_keys()
    assert 1 <= len(stored) < 2 * len(fleet.devices)
    assert "not run" in out


def test_cli_profile_auto_widths_on_a_local_device(
    artifacts: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from fleetbench.cli import main

    fleet_file = local_fleet_file(tmp_path)
    db = tmp_path / "auto.db"
    argv = ["profile", "--fleet", str(fleet_file), "--model", MODEL, "--widths", "auto:3", "--batch", str(BATCH)]
    argv += ["--steps", "3", "--warmup", "1", "--precision", "0", "--db", str(db), "--artifacts", str(artifacts)]
    assert main(argv) == 0
    captured = capsys.readouterr()
    with ProfileStore(db) as store:
        widths = sorted(store.latest_cells()["width"])
    assert len(widths) == 3 and widths[0] == AUTO_CANDIDATES[0] and widths[-1] == 1.0
    assert f"widths chosen: {', '.join(f'{w:g}' for w in widths)}" in captured.err
    assert "most uncertain" in captured.err and "isolation plan" in captured.err
    assert len([line for line in captured.out.splitlines() if line.startswith("here")]) == 3


def test_profile_measures_each_device_with_its_best_backend_and_skips_one_without(
    plain_python: str,  # noqa: F811 - the imported fixture
    artifacts: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from fleetbench.cli import main

    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(
        "devices:\n"
        f"  - {{name: full, kind: local, python: {sys.executable}, workdir: {tmp_path / 'full'}}}\n"
        f"  - {{name: plain, kind: local, python: {plain_python}, workdir: {tmp_path / 'plain'}}}\n"
        f"  - {{name: nopy, kind: local, python: /nonexistent/python3, workdir: {tmp_path / 'nopy'}}}\n"
    )
    db = tmp_path / "p.db"
    argv = ["profile", "--fleet", str(fleet), "--model", MODEL, "--widths", "0.25", "--batch", str(BATCH)]
    argv += ["--steps", "2", "--warmup", "1", "--precision", "0", "--db", str(db), "--artifacts", str(artifacts)]
    assert main(argv) == 0
    captured = capsys.readouterr()
    assert "backend of full: ort (best available)" in captured.err
    assert "backend of plain: onnx (best available (ort: onnxruntime-training is not installed" in captured.err
    assert "backend of nopy: skipped: no usable backend" in captured.err
    with ProfileStore(db) as store:
        cells = store.latest_cells()
    assert sorted(zip(cells.device, cells.backend, cells.status, strict=True)) == [
        ("full", "ort", "ok"),
        ("plain", "onnx", "ok"),
    ]
    # an explicit backend is measured on every device, unasked
    assert main([*argv, "--backend", "onnx"]) == 1  # nopy cannot run it: recorded as failed
    with ProfileStore(db) as store:
        cells = store.latest_cells()
    onnx = cells[cells.backend == "onnx"].set_index("device").status.to_dict()
    assert onnx["full"] == "ok" and onnx["plain"] == "ok" and onnx["nopy"] != "ok"
    assert main([*argv, "--backend", "auto,ort"]) == 2


def test_cells_and_round_costs_train_on_the_bench_data_they_name(
    artifacts: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import sqlite3

    import numpy as np

    from fleetbench.cli import main

    fleet_file = local_fleet_file(tmp_path)
    data = tmp_path / "mnist.npz"
    assert main(["fl", "data", "--out", str(data), "--model", MODEL, "--examples", "40"]) == 0
    with np.load(data) as shard:
        assert shard["x"].shape == (40, 1, 28, 28) and len(set(shard["y"][:BATCH].tolist())) > 1  # classes mixed
    db = tmp_path / "data.db"
    argv = ["profile", "--fleet", str(fleet_file), "--model", MODEL, "--widths", "0.25", "--batch", str(BATCH)]
    argv += ["--steps", "3", "--warmup", "1", "--precision", "0", "--db", str(db), "--artifacts", str(artifacts)]
    assert main([*argv, "--data", str(data)]) == 0
    label = bench_data_label(data)
    assert label.startswith("mnist.npz@")
    with ProfileStore(db) as store:
        cells = store.latest_cells()
        assert list(cells["data"]) == [label] and cells["cell_key"].iloc[0].endswith(f"|d{label}")
        assert len(store.round_costs()) == 1  # measured on the data too
    with sqlite3.connect(db) as conn:
        (doc,) = conn.execute("SELECT runner FROM cells").fetchone()
    assert json.loads(doc)["bench_data"] == "shard"

    # the same cells on random inputs are other cells: --resume measures them
    assert main([*argv, "--resume", "--no-round-cost"]) == 0
    with ProfileStore(db) as store:
        cells = store.latest_cells()
        assert sorted(cells["data"].fillna("random")) == sorted([label, "random"])
        campaigns = len(store.campaigns())
    capsys.readouterr()

    # bad data is refused before a campaign is stored, naming the file and what does not fit
    wrong = tmp_path / "wrong.npz"
    np.savez(wrong, x=np.zeros((8, 3, 32, 32), np.float32), y=np.zeros(8, np.int64))
    few = tmp_path / "few.npz"
    np.savez(few, x=np.zeros((2, 1, 28, 28), np.float32), y=np.zeros(2, np.int64))
    assert main([*argv, "--data", str(wrong)]) == 2
    assert main([*argv, "--data", str(few)]) == 2
    assert main([*argv, "--data", str(tmp_path / "absent.npz")]) == 2
    err = capsys.readouterr().err
    assert f"--data {wrong}: examples of shape (3, 32, 32), {MODEL} takes (1, 28, 28)" in err
    assert f"--data {few}: 2 examples, fewer than one batch of {BATCH}" in err
    assert "absent.npz" in err
    with ProfileStore(db) as store:
        assert len(store.campaigns()) == campaigns


def _cheap_profile(fleet_file: Path, db: Path, artifacts: Path, widths: str) -> list[str]:
    """``fleetbench profile`` of the cheapest cells: ort, two steps, one pass, no round cost."""
    argv = ["profile", "--fleet", str(fleet_file), "--model", MODEL, "--widths", widths, "--batch", str(BATCH)]
    argv += ["--backend", "ort", "--steps", "2", "--warmup", "1", "--precision", "0", "--passes", "1"]
    return [*argv, "--no-round-cost", "--db", str(db), "--artifacts", str(artifacts)]


def test_a_full_artifact_cache_is_one_line_and_resume_completes_once_there_is_room(
    tmp_path: Path, small_fs: SmallFileSystems, capsys: pytest.CaptureFixture[str]
) -> None:
    from fleetbench.cli import main

    cache = small_fs.mount("artifacts", "40k")
    argv = _cheap_profile(local_fleet_file(tmp_path), tmp_path / "p.db", cache, "0.25")
    assert main(argv) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("fleetbench: error: no room for the artifact set "), err
    assert f" in {cache}: it needs about " in err and "bytes are free" in err
    assert list(cache.iterdir()) == []  # nothing half-written
    with ProfileStore(tmp_path / "p.db") as store:
        assert store._conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"

    small_fs.resize(cache, "8m")
    assert main([*argv, "--resume"]) == 0
    with ProfileStore(tmp_path / "p.db") as store:
        assert list(store.latest_cells().status) == ["ok"]


def test_a_device_out_of_space_records_its_cells_and_the_others_measure(
    artifacts: Path, tmp_path: Path, small_fs: SmallFileSystems, capsys: pytest.CaptureFixture[str]
) -> None:
    from fleetbench.cli import main

    tiny = small_fs.mount("tiny", "16k")
    fleet_file = tmp_path / "fleet.yaml"
    fleet_file.write_text(
        "devices:\n"
        f"  - {{name: roomy, kind: local, workdir: {tmp_path / 'roomy'}}}\n"
        f"  - {{name: tiny, kind: local, workdir: {tiny}}}\n"
    )
    db = tmp_path / "p.db"
    assert main(_cheap_profile(fleet_file, db, artifacts, "0.25,0.5")) == 1  # not every cell measured
    out = capsys.readouterr().out
    assert len([line for line in out.splitlines() if line.startswith("tiny") and "out of space" in line]) == 2, out
    with ProfileStore(db) as store:
        cells = store.latest_cells()
    by_device = {d: sorted(cells[cells.device == d].status) for d in ("roomy", "tiny")}
    assert by_device == {"roomy": ["ok", "ok"], "tiny": ["out of space", "out of space"]}
    for message in cells[cells.device == "tiny"].message:
        assert message.startswith("tiny: pushing ") and f"to {tiny}/cas needs " in message, message
