"""A full host disk (`exporters.host_disk`): the check before an export, ENOSPC at its writes, nothing left behind."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest

from exporters.artifacts import EXPORT_FIXED_BYTES, export_artifacts, export_bytes
from exporters.host_disk import DiskFull, check_room, disk_full, free_bytes, is_disk_full
from exporters.manifest import load_valid_manifest
from exporters.zoo import get_model
from tests.conftest import SmallFileSystems


def test_free_bytes_looks_through_missing_directories(tmp_path: Path) -> None:
    free = free_bytes(tmp_path / "not" / "yet")
    assert free is not None and free > 0


def test_check_room_refuses_in_one_line_naming_the_path_and_both_numbers(tmp_path: Path) -> None:
    free = check_room(tmp_path, 1, "a file")
    assert free is not None
    with pytest.raises(DiskFull) as caught:
        check_room(tmp_path, free * 2 + 10**12, "the artifact set s")
    message = str(caught.value)
    assert "\n" not in message and str(tmp_path) in message and "the artifact set s" in message
    assert f"needs about {free * 2 + 10**12} bytes" in message
    assert caught.value.errno == errno.ENOSPC and isinstance(caught.value, OSError)


def test_what_counts_as_a_full_disk(tmp_path: Path) -> None:
    assert is_disk_full(OSError(errno.ENOSPC, "No space left on device"))
    assert is_disk_full(OSError(errno.EDQUOT, "Disk quota exceeded"))
    assert is_disk_full(RuntimeError("onnx save failed: No space left on device"))
    assert not is_disk_full(OSError(errno.EACCES, "Permission denied"))
    assert not is_disk_full(OSError("6496 requested and 5088 written"), tmp_path)  # room left: not a full disk
    full = disk_full(tmp_path, "the set s", OSError(errno.ENOSPC, "No space left on device"), free_before=5)
    expected = f"no room for the set s in {tmp_path}: the file system is full (5 bytes were free before writing)"
    assert str(full) == expected
    assert disk_full(tmp_path, "x", full) is full


def test_export_bytes_is_a_lower_bound_of_a_real_set(tmp_path: Path) -> None:
    model = get_model("fjord-cnn")
    result = export_artifacts(model, model.arch(0.25), batch=4, optimizer="sgd", out_dir=tmp_path)
    size = sum(p.stat().st_size for p in result.directory.iterdir())
    assert export_bytes(result.manifest["num_parameters"]) <= size
    assert export_bytes(0) == EXPORT_FIXED_BYTES


def test_an_export_into_a_full_cache_is_refused_then_succeeds_once_there_is_room(small_fs: SmallFileSystems) -> None:
    model = get_model("fjord-cnn")
    arch = model.arch(0.25)
    cache = small_fs.mount("cache", "40k")
    with pytest.raises(DiskFull) as before:  # the check: less than the set's lower bound is free
        export_artifacts(model, arch, batch=4, optimizer="adamw", out_dir=cache)
    assert str(cache) in str(before.value) and "needs about" in str(before.value)
    assert list(cache.iterdir()) == []

    small_fs.resize(cache, "100k")  # passes the check, fills up while writing
    with pytest.raises(DiskFull) as during:
        export_artifacts(model, arch, batch=4, optimizer="adamw", out_dir=cache)
    message = str(during.value)
    assert "\n" not in message and str(cache) in message and "the file system is full" in message
    assert list(cache.iterdir()) == []  # no half-written set, no work directory

    small_fs.resize(cache, "4m")
    result = export_artifacts(model, arch, batch=4, optimizer="adamw", out_dir=cache)
    assert not result.cached and load_valid_manifest(result.directory, result.manifest["cache_key"]) is not None
    assert [p.name for p in cache.iterdir()] == [result.directory.name]
