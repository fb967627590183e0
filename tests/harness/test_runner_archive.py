"""The runner's archive (`harness.runner_archive`): stable bytes, and a device's Python runs it alone."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import zipfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from exporters.artifacts import export_artifacts
from exporters.zoo import get_model
from harness.contract import RUNNER_EXIT_CODES
from harness.runner_archive import (
    ARCHIVE_NAME,
    PACKAGE,
    RUNNER_DIR_ENV,
    SOURCE_DIR,
    archive_bytes,
    archive_path,
    build_archive,
    source_files,
)

#: Every key of a bench document, as the single-file runner wrote it.
BENCH_DOCUMENT_KEYS = {
    "backend", "batch", "bench_data", "cpu_freq_khz", "cpu_step_seconds", "cpus_available", "disturbed", "energy",
    "error", "flush_denormals", "imprecise", "loadavg", "loss", "matmul_gflops", "max_seconds", "median_ci_seconds",
    "missing", "mode", "peak_memory_bytes", "peak_memory_scope", "peak_memory_source", "precision",
    "precision_achieved", "runtime_memory_bytes", "sample_seconds", "samples", "seed", "status", "step_seconds",
    "steps", "steps_per_sample", "stop_reason", "thermal_c", "threads", "throttled", "timed_seconds", "versions",
    "warmup", "warmup_seconds", "warmup_settled", "warmup_steps",
}  # fmt: skip
#: Every key of a train document that failed before training, as the single-file runner wrote it.
TRAIN_DOCUMENT_KEYS = {
    "backend", "batch", "cpu_freq_khz", "energy", "epochs", "error", "examples", "flush_denormals", "loss", "lr",
    "matmul_gflops", "missing", "mode", "num_parameters", "out", "peak_memory_bytes", "peak_memory_scope",
    "peak_memory_source", "seed", "status", "step_examples", "step_seconds", "steps", "thermal_c", "threads",
    "throttled", "versions", "warmup",
}  # fmt: skip


def test_the_archive_holds_the_package_and_its_bytes_depend_on_the_sources_only(tmp_path: Path) -> None:
    first = build_archive(tmp_path / "a")
    second = build_archive(tmp_path / "b")
    assert first.name == second.name == ARCHIVE_NAME
    assert hashlib.sha256(first.read_bytes()).digest() == hashlib.sha256(second.read_bytes()).digest()
    assert archive_path().read_bytes() == first.read_bytes() == archive_bytes(source_files())
    with zipfile.ZipFile(first) as archive:
        names = archive.namelist()
        assert {info.date_time for info in archive.infolist()} == {(1980, 1, 1, 0, 0, 0)}
    assert names == ["__main__.py", *sorted(f"{PACKAGE}/{path.name}" for path in SOURCE_DIR.glob("*.py"))]
    # another source gives another archive (a device then gets a new content-addressed directory)
    changed = tmp_path / "protocol.py"
    changed.write_text((SOURCE_DIR / "protocol.py").read_text() + "\n# changed\n")
    files = [changed if path.name == "protocol.py" else path for path in source_files()]
    assert archive_bytes(files) != first.read_bytes()


def _bare_python(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """Run this interpreter as a device's: numpy on the path, fleetbench not (no site, so no editable install)."""
    site = str(Path(np.__file__).resolve().parents[1])
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": site}
    return subprocess.run([sys.executable, "-S", *args], capture_output=True, text=True, timeout=120, env=env, cwd=cwd)


@pytest.fixture(scope="module")
def cnn_set(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fjord-cnn artifact set (width 0.25, batch 4, SGD)."""
    model = get_model("fjord-cnn")
    out = tmp_path_factory.mktemp("artifacts")
    return export_artifacts(model, model.arch(0.25), batch=4, optimizer="sgd", out_dir=out).directory


def test_a_device_python_runs_the_archive_alone_with_the_documents_keys(cnn_set: Path, tmp_path: Path) -> None:
    alone = _bare_python(tmp_path, "-c", "import numpy, importlib.util as u; print(u.find_spec('harness'))")
    assert alone.returncode == 0 and alone.stdout.strip() == "None", alone  # numpy, and no fleetbench
    runner = str(archive_path())
    bench = [runner, "bench", "--artifacts", str(cnn_set), "--backend", "ort", "--warmup", "1", "--steps", "3",
             "--threads", "1", "--precision", "0", "--matmul-seconds", "0"]  # fmt: skip
    done = _bare_python(tmp_path, *bench)
    lines = [line for line in done.stdout.splitlines() if line.strip()]
    assert done.returncode == 0 and len(lines) == 1, (done.stdout, done.stderr[-2000:])
    doc = json.loads(lines[0])
    assert doc["status"] == "ok" and len(doc["step_seconds"]) == 3 and doc["bench_data"] == "random"
    assert set(doc) == BENCH_DOCUMENT_KEYS
    train = [runner, "train", "--artifacts", str(tmp_path / "absent"), "--backend", "ort", "--data", "x.npz",
             "--epochs", "1", "--lr", "0.1", "--threads", "1", "--params", "p.npy", "--out", "o.npy"]  # fmt: skip
    done = _bare_python(tmp_path, *train)
    doc = json.loads(done.stdout)
    assert RUNNER_EXIT_CODES[done.returncode] == doc["status"] == "bad arguments"
    assert set(doc) == TRAIN_DOCUMENT_KEYS


def test_devices_deployed_concurrently_share_the_processs_one_archive() -> None:
    with ThreadPoolExecutor(max_workers=4) as pool:
        paths = set(pool.map(lambda _: archive_path(), range(8)))
    assert len(paths) == 1 and next(iter(paths)).is_file()


#: A process that prints its archive's path and is then killed, as a campaign killed with SIGKILL is.
_KILLED = "import os, signal\nfrom harness.runner_archive import archive_path\nprint(archive_path(), flush=True)\n" \
    "os.kill(os.getpid(), signal.SIGKILL)\n"


def _archive_of_a_killed_process(cache: Path) -> Path:
    env = {**os.environ, RUNNER_DIR_ENV: str(cache)}
    run = subprocess.run([sys.executable, "-c", _KILLED], capture_output=True, text=True, env=env, timeout=120)
    assert run.returncode == -9, run.stderr
    return Path(run.stdout.strip())


def test_the_host_keeps_the_archive_by_content_so_a_killed_process_leaves_nothing_behind(tmp_path: Path) -> None:
    data = archive_bytes(source_files())
    first = _archive_of_a_killed_process(tmp_path / "cache")
    assert first == tmp_path / "cache" / hashlib.sha256(data).hexdigest()[:16] / ARCHIVE_NAME
    assert first.read_bytes() == data
    assert [p.name for p in first.parent.iterdir()] == [ARCHIVE_NAME]  # no temporary file left
    written = first.stat().st_mtime_ns
    assert _archive_of_a_killed_process(tmp_path / "cache") == first  # found, not written again
    assert first.stat().st_mtime_ns == written
    first.write_bytes(b"damaged")  # a damaged copy is replaced
    assert _archive_of_a_killed_process(tmp_path / "cache") == first and first.read_bytes() == data


def test_where_the_cache_cannot_be_written_the_archive_lives_as_long_as_its_process(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    code = "from harness.runner_archive import archive_path\nprint(archive_path())\n"
    env = {**os.environ, RUNNER_DIR_ENV: str(blocker / "cache")}
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120, check=True)
    private = Path(run.stdout.strip())
    assert private.name == ARCHIVE_NAME and private.parent.name.startswith("fleetbench-runner-")
    assert not private.parent.exists()  # removed when the process ended
