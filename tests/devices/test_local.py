"""LocalTransport: subprocess without a shell, process-group timeouts, atomic copies."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from devices.errors import CommandTimeout, OutOfSpace, TransportError
from devices.local import LocalTransport
from devices.transport import Transport
from tests.conftest import SmallFileSystems
from tests.devices.conftest import cmdline_running, wait_for


def test_is_a_transport() -> None:
    assert isinstance(LocalTransport(), Transport)


def test_run_rc_stdout_stderr_and_workdir(tmp_path: Path) -> None:
    t = LocalTransport(workdir=tmp_path / "wd")
    r = t.run(["sh", "-c", "pwd; echo err >&2; exit 4"], timeout=10)
    assert (r.rc, r.stdout, r.stderr) == (4, f"{tmp_path / 'wd'}\n", "err\n")
    assert r.seconds >= 0


def test_missing_program_is_transport_error() -> None:
    with pytest.raises(TransportError, match="cannot start"):
        LocalTransport().run(["/nonexistent/program"], timeout=5)


def test_timeout_kills_whole_process_group() -> None:
    marker = f"{1000 + time.time() % 1000:.6f}"
    start = time.monotonic()
    with pytest.raises(CommandTimeout):
        LocalTransport().run(["sh", "-c", f"sleep {marker}1 & sleep {marker}2; wait"], timeout=0.5)
    assert time.monotonic() - start < 10  # stopped at its timeout, not after the sleeps (slack for a loaded host)
    # the killed sleeps leave /proc when reaped
    wait_for(lambda: not cmdline_running(f"{marker}1") and not cmdline_running(f"{marker}2"))


def test_put_get_atomic_with_parent_dirs(tmp_path: Path) -> None:
    src = tmp_path / "src.bin"
    src.write_bytes(os.urandom(4096))
    src.chmod(0o750)
    t = LocalTransport(workdir=tmp_path / "device")
    t.put(src, "a/b/dst.bin")
    dst = tmp_path / "device" / "a" / "b" / "dst.bin"
    assert dst.read_bytes() == src.read_bytes()
    assert dst.stat().st_mode & 0o777 == 0o750
    assert [p.name for p in dst.parent.iterdir()] == ["dst.bin"]
    t.get("a/b/dst.bin", tmp_path / "back" / "x.bin")
    assert (tmp_path / "back" / "x.bin").read_bytes() == src.read_bytes()
    with pytest.raises(FileNotFoundError):
        t.get("absent", tmp_path / "y")
    assert not (tmp_path / "y").exists()
    t.close()


def test_put_onto_a_full_file_system_is_out_of_space_and_leaves_nothing(
    tmp_path: Path, small_fs: SmallFileSystems
) -> None:
    src = tmp_path / "big.bin"
    src.write_bytes(os.urandom(64 * 1024))
    workdir = small_fs.mount("device", "16k")
    with pytest.raises(OutOfSpace) as caught:
        LocalTransport(workdir=workdir).put(src, "cas/big.bin")
    message = str(caught.value)
    assert caught.value.kind == "out of space" and "\n" not in message
    assert str(workdir / "cas" / "big.bin") in message and "65536 bytes to write" in message and "free" in message
    assert list((workdir / "cas").iterdir()) == []  # no half-written file, no temporary file
