"""Shared pytest configuration."""

from __future__ import annotations

import pytest


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Say plainly when nothing was collected: CI treats exit status 5 as a failure."""
    if exitstatus == pytest.ExitCode.NO_TESTS_COLLECTED:
        print("\nfleetbench: no tests ran (pytest exit status 5); CI fails on this.")
