"""``fleetbench report``: files written, headline printed, bad input is exit status 2."""

from __future__ import annotations

from pathlib import Path

import pytest

from fleetbench.cli import main
from tests.reports.fixtures import build_store


def test_report_command_writes_and_prints_the_headline(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = build_store(tmp_path / "fleetbench.db", widths=(0.5, 1.0), fl=False)
    out = tmp_path / "rep"
    assert main(["report", "--db", str(db), "--out", str(out), "--log-scale"]) == 0
    captured = capsys.readouterr()
    lines = captured.out.splitlines()
    assert lines[0].split() == [
        "device",
        "model",
        "batch",
        "backend",
        "w=0.5",
        "us",
        "w=1",
        "us",
        "speedup",
        "theory",
        "fixed_share",
        "failed",
    ]
    pi4 = next(line for line in lines if line.split()[0] == "pi4").split()
    # pi4: 300 us at 0.5, 900 us at 1; speed-up 3.00x for a 4.00x FLOPs ratio.
    assert pi4[4:8] == ["300.0", "900.0", "3.00x", "4.00x"]
    assert (out / "report.html").is_file() and (out / "headline.csv").is_file()
    assert "wrote" in captured.err


def test_missing_store_is_a_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "nope.db"
    assert main(["report", "--db", str(missing), "--out", str(tmp_path / "rep")]) == 2
    err = capsys.readouterr().err
    assert "no profile store at" in err and str(missing) in err
    assert not missing.exists() and not (tmp_path / "rep").exists()


def test_unusable_output_directory_is_a_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = build_store(tmp_path / "fleetbench.db", widths=(1.0,), fl=False, failures=False)
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert main(["report", "--db", str(db), "--out", str(blocker / "rep")]) == 2
    assert "cannot create output directory" in capsys.readouterr().err
