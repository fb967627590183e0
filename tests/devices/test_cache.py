"""The host's cache directories (`devices.cache`)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from devices.cache import fleetbench_cache
from harness import provision, runner_archive, wheels


def test_the_variable_names_the_directory_then_xdg_then_the_home() -> None:
    env = {"FLEETBENCH_X_DIR": "/srv/x", "XDG_CACHE_HOME": "/c", "HOME": "/home/u"}
    assert fleetbench_cache("FLEETBENCH_X_DIR", "x", env) == Path("/srv/x")
    del env["FLEETBENCH_X_DIR"]
    assert fleetbench_cache("FLEETBENCH_X_DIR", "x", env) == Path("/c/fleetbench/x")
    assert fleetbench_cache("FLEETBENCH_X_DIR", "x", {"XDG_CACHE_HOME": ""}) == (
        Path.home() / ".cache" / "fleetbench" / "x"
    )


def test_a_relative_or_tilde_path_becomes_absolute(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert fleetbench_cache("V", "x", {"V": "here"}) == tmp_path / "here"
    assert fleetbench_cache("V", "x", {"XDG_CACHE_HOME": "rel"}) == tmp_path / "rel" / "fleetbench" / "x"
    assert fleetbench_cache("V", "x", {"V": "~/c"}) == Path(os.path.expanduser("~/c"))


def test_every_host_cache_follows_xdg_cache_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for variable in (wheels.WHEELS_ENV, provision.CHECK_SETS_ENV, runner_archive.RUNNER_DIR_ENV):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert wheels.cache_dir() == tmp_path / "fleetbench" / "wheels"
    assert provision.check_set_cache() == tmp_path / "fleetbench" / "check-sets"
    monkeypatch.setenv(wheels.WHEELS_ENV, str(tmp_path / "w"))
    assert wheels.cache_dir() == tmp_path / "w"
