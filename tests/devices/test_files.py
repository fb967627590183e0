"""Atomic writes: the target is the old file or the whole new one, with the permission bits asked for."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from devices.files import DEFAULT_MODE, atomic_copy, atomic_open, atomic_path, atomic_write


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_a_write_lands_whole_with_the_mode_open_would_give(tmp_path: Path) -> None:
    target = tmp_path / "deep" / "state.json"
    atomic_write(target, "{}\n")
    assert target.read_text() == "{}\n" and _mode(target) == DEFAULT_MODE
    mask = os.umask(0)
    os.umask(mask)
    assert DEFAULT_MODE == 0o666 & ~mask
    atomic_write(target, b"\x00\x01", mode=0o600)
    assert target.read_bytes() == b"\x00\x01" and _mode(target) == 0o600
    assert sorted(p.name for p in target.parent.iterdir()) == ["state.json"]  # no temporary file left


def test_a_failed_write_keeps_the_old_file_and_leaves_nothing_beside_it(tmp_path: Path) -> None:
    target = tmp_path / "report.html"
    target.write_text("old")
    with pytest.raises(RuntimeError), atomic_open(target) as out:
        out.write("half of the new")
        raise RuntimeError("the writer failed")
    with pytest.raises(KeyboardInterrupt), atomic_path(target) as path:
        path.write_text("new")
        raise KeyboardInterrupt
    assert target.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["report.html"]


def test_a_path_for_writers_that_want_one_and_a_copy_with_the_sources_mode(tmp_path: Path) -> None:
    with atomic_path(tmp_path / "cells.csv") as path:
        assert path.parent == tmp_path and path.name.startswith(".cells.csv.tmp-")
        assert not (tmp_path / "cells.csv").exists()  # nothing in place until the block succeeds
        path.write_text("a,b\n")
    assert (tmp_path / "cells.csv").read_text() == "a,b\n"
    script = tmp_path / "runner.py"
    script.write_text("print(1)\n")
    script.chmod(0o750)
    atomic_copy(script, tmp_path / "remote" / "runner.py")
    copied = tmp_path / "remote" / "runner.py"
    assert copied.read_text() == "print(1)\n" and _mode(copied) == 0o750
