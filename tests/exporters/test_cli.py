"""`fleetbench export`: bad input is one line and exit 2; an unchanged request writes nothing."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from fleetbench.cli import EXIT_USAGE, main

REPO = Path(__file__).resolve().parents[2]


def _bad_cases(tmp_path: Path) -> dict[str, tuple[list[str], str]]:
    regular = tmp_path / "a-file"
    regular.write_text("not a directory")
    out = ["--out", str(tmp_path / "out")]
    return {
        "unknown-model": (["export", "--model", "no-such-model", *out], "unknown model 'no-such-model'"),
        "width-above-1": (["export", "--model", "cfd-cnn", "--widths", "0.5,1.5", *out], "outside (0, 1]"),
        "width-zero": (["export", "--model", "cfd-cnn", "--widths", "0", *out], "outside (0, 1]"),
        "width-nan": (["export", "--model", "cfd-cnn", "--widths", "abc", *out], "not a number"),
        "batch-zero": (["export", "--model", "cfd-cnn", "--batch", "0", *out], "must be at least 1"),
        "optimizer": (["export", "--model", "cfd-cnn", "--optimizer", "adam", *out], "invalid choice"),
        "unwritable": (["export", "--model", "cfd-cnn", "--out", str(regular / "sub")], "cannot write artifacts"),
    }


BAD = ["unknown-model", "width-above-1", "width-zero", "width-nan", "batch-zero", "optimizer", "unwritable"]
#: The cases the command must also get right from a fresh interpreter.
BAD_SUBPROCESS = ["unknown-model", "width-above-1", "batch-zero", "unwritable"]


def _assert_one_line_error(rc: int, stderr: str, needle: str) -> None:
    assert rc == EXIT_USAGE
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    assert lines[0].startswith("fleetbench: error: ") and needle in lines[0]
    assert "Traceback" not in stderr


@pytest.mark.parametrize("case", BAD)
def test_bad_input_in_process(tmp_path: Path, capsys: pytest.CaptureFixture[str], case: str) -> None:
    argv, needle = _bad_cases(tmp_path)[case]
    rc = main(argv)
    captured = capsys.readouterr()
    _assert_one_line_error(rc, captured.err, needle)
    assert captured.out == ""
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def _run_cli(argv: list[str]) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    env.setdefault("OMP_NUM_THREADS", "1")
    return subprocess.run(
        [sys.executable, "-m", "fleetbench", *argv],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.parametrize("case", BAD_SUBPROCESS)
def test_bad_input_subprocess(tmp_path: Path, case: str) -> None:
    argv, needle = _bad_cases(tmp_path)[case]
    proc = _run_cli(argv)
    _assert_one_line_error(proc.returncode, proc.stderr, needle)


def _snapshot(root: Path) -> dict[str, tuple[int, int]]:
    out = {}
    for path in [root, *sorted(root.rglob("*"))]:
        stat = path.stat()
        out[str(path.relative_to(root))] = (stat.st_ino, stat.st_mtime_ns)
    return out


def test_second_identical_export_changes_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "artifacts"
    argv = ["export", "--model", "cfd-cnn", "--widths", "0.25,0.5", "--batch", "2", "--out", str(out)]
    assert main(argv) == 0
    first = capsys.readouterr()
    assert "Nothing changed" not in first.out
    sets = sorted(p.name for p in out.iterdir())
    assert len(sets) == 2 and all(name.startswith("cfd-cnn-w") for name in sets)
    before = _snapshot(out)

    assert main(argv) == 0
    second = capsys.readouterr()
    assert "Nothing changed" in second.out and second.out.count("cached") == 2
    assert _snapshot(out) == before

    # The cache key is stable across interpreters: a fresh process finds the same sets.
    proc = _run_cli(argv)
    assert proc.returncode == 0, proc.stderr
    assert "Nothing changed" in proc.stdout and "Traceback" not in proc.stderr
    assert _snapshot(out) == before


def test_changed_request_exports_only_what_is_missing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "artifacts"
    base = ["export", "--model", "cfd-cnn", "--batch", "2", "--optimizer", "sgd", "--out", str(out)]
    assert main([*base, "--widths", "0.25"]) == 0
    capsys.readouterr()
    before = _snapshot(out)
    assert main([*base, "--widths", "0.25,0.5"]) == 0
    captured = capsys.readouterr()
    assert "Nothing changed" not in captured.out and captured.out.count("cached") == 1
    after = _snapshot(out)
    assert {k: v for k, v in after.items() if k in before and k != "."} == {k: v for k, v in before.items() if k != "."}
    assert len([p for p in out.iterdir()]) == 2
