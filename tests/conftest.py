"""Shared pytest configuration."""

from __future__ import annotations

import pytest

from tests.devices.conftest import (  # noqa: F401 - fixtures offered to every test directory
    adb_path,
    adb_server,
    adb_transport,
    example_fleet_file,
    phone,
    sshd_path,
    sshd_server,
)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Say plainly when nothing was collected: CI treats exit status 5 as a failure."""
    if exitstatus == pytest.ExitCode.NO_TESTS_COLLECTED:
        print("\nfleetbench: no tests ran (pytest exit status 5); CI fails on this.")
