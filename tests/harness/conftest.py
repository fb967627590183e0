"""Fixtures of the campaign tests: the example fleet up for the module, and the module's artifact cache."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="module")
def fleet_file(example_fleet_file: Path) -> Path:
    return example_fleet_file


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("artifacts")
