"""Fixtures for device tests: system tools are required in CI, skipped only elsewhere."""

from __future__ import annotations

import os
import shutil

import pytest


def require_tool(name: str) -> str:
    """Return the path of system tool ``name``; fail under CI, skip elsewhere, when it is missing.

    ``.ci/run`` installs every tool the tests need, so a missing one in CI is a broken
    CI setup and must not pass silently as a skip.
    """
    path = shutil.which(name) or (f"/usr/sbin/{name}" if os.access(f"/usr/sbin/{name}", os.X_OK) else None)
    if path is None:
        message = f"{name} is not installed (Debian: see .ci/run for the package)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return path


@pytest.fixture(scope="session")
def sshd_path() -> str:
    """Path of OpenSSH's sshd."""
    return require_tool("sshd")


@pytest.fixture(scope="session")
def adb_path() -> str:
    """Path of the real adb client/server binary."""
    return require_tool("adb")
