"""The profile store's errors (harness/store_errors.py): which SQLite errors are the environment's, and their words."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from harness.store_errors import StoreError, StoreUnavailable, environmental, unavailable


def _error(code: int, message: str = "database or disk is full") -> sqlite3.OperationalError:
    exc = sqlite3.OperationalError(message)
    exc.sqlite_errorcode = code  # type: ignore[attr-defined]
    return exc


@pytest.mark.parametrize(("code", "expected"), [(5, True), (13, True), (8, True), (10 | (3 << 8), True), (1, False),
                                                (11, False), (26, False)])  # fmt: skip
def test_environmental_is_the_lock_permission_and_disk_codes_extended_ones_by_their_low_byte(
    code: int, expected: bool
) -> None:
    assert environmental(_error(code)) is expected


def test_a_full_file_system_says_so_with_the_bytes_free_there(tmp_path: Path) -> None:
    store = tmp_path / "fleetbench.db"
    full = unavailable(store, _error(13), doing="cannot record a cell in ")
    assert isinstance(full, StoreUnavailable)
    message = str(full)
    assert message.startswith(f"cannot record a cell in profile store {store}: its file system is full (")
    assert " bytes free): database or disk is full" in message and "\n" not in message
    locked = str(unavailable(store, _error(5, "database is locked")))
    assert locked == f"profile store {store}: database is locked"


def test_a_store_error_is_an_input_error() -> None:
    from exporters.userinput import InputError

    assert issubclass(StoreError, InputError) and not issubclass(StoreUnavailable, InputError)
