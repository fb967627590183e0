"""The on-device runner, run as a subprocess exactly as a device runs it.

Artifact sets are exported once per module into a temporary directory (small
widths, batch 4). Every test starts ``sys.executable runner.pyz ...`` (the archive
devices get, `harness.runner_archive.archive_path`) and checks the exit status and the
one JSON document on stdout.
"""

from __future__ import annotations

import ast
import glob
import json
import math
import os
import resource
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from exporters.artifacts import OPTIMIZER_DEFAULTS, export_artifacts
from exporters.ort_training import OrtTrainer
from exporters.torchscript import export_torchscript
from exporters.zoo import get_model
from harness.contract import RUNNER_EXIT_CODES
from harness.runner import protocol
from harness.runner_archive import SOURCE_DIR, archive_path
from tests.conftest import SmallFileSystems

RUNNER = archive_path()

#: Every key of the runner's document (train adds `TRAIN_KEYS`).
KEYS = {
    "mode",
    "status",
    "error",
    "missing",
    "backend",
    "batch",
    "warmup",
    "steps",
    "threads",
    "seed",
    "step_seconds",
    "loss",
    "peak_memory_bytes",
    "peak_memory_source",
    "cpu_freq_khz",
    "thermal_c",
    "throttled",
    "matmul_gflops",
    "versions",
}
TRAIN_KEYS = {"epochs", "lr", "examples", "step_examples", "num_parameters", "out"}
#: Keys only bench adds (`harness.runner.protocol.new_bench_keys`).
BENCH_KEYS = set(protocol.new_bench_keys())


def run_runner(
    *argv: str, env: dict[str, str] | None = None, preexec: Any = None, python: str = sys.executable
) -> tuple[int, dict[str, Any], str]:
    """Run the runner's archive in a fresh interpreter; return (rc, document, stderr)."""
    proc = subprocess.run(
        [python, str(RUNNER), *argv],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        preexec_fn=preexec,
        cwd=RUNNER.parent,  # not the repository root: the runner must not need fleetbench
    )
    lines = [line for line in proc.stdout.splitlines() if line.strip()]
    assert len(lines) == 1, f"stdout must be one JSON document, got {proc.stdout!r}; stderr {proc.stderr[-2000:]}"
    doc = json.loads(lines[0])
    assert KEYS <= set(doc), set(doc) ^ KEYS
    assert RUNNER_EXIT_CODES[proc.returncode] == doc["status"], (proc.returncode, doc, proc.stderr[-2000:])
    return proc.returncode, doc, proc.stderr


@pytest.fixture(scope="module")
def sets(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Artifact sets: cnn (fjord-cnn sgd + model.pt), cnn-adamw (cfd-cnn), rnn (fjord-rnn, int64 inputs)."""
    root = tmp_path_factory.mktemp("artifacts")
    out = {}
    for key, name, optimizer in (("cnn", "fjord-cnn", "sgd"), ("cfd", "cfd-cnn", "adamw"), ("rnn", "fjord-rnn", "sgd")):
        model = get_model(name)
        arch = model.arch(0.25)
        result = export_artifacts(model, arch, batch=4, optimizer=optimizer, out_dir=root)
        export_torchscript(model, arch, result.directory)
        out[key] = result.directory
    return out


@pytest.fixture(scope="module")
def start(sets: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The fjord-cnn set's checkpoint parameters as a flat .npy."""
    path = tmp_path_factory.mktemp("params") / "start.npy"
    np.save(path, OrtTrainer(sets["cnn"]).get_flat(), allow_pickle=False)
    return path


def learnable_shard(path: Path, n: int, seed: int = 0) -> Path:
    """Write an easy 4-class fjord-cnn shard: a fixed template per class plus noise."""
    rng = np.random.default_rng(seed)
    templates = rng.standard_normal((4, 1, 28, 28)).astype(np.float32)
    y = rng.integers(0, 4, size=n).astype(np.int64)
    x = (templates[y] + 0.3 * rng.standard_normal((n, 1, 28, 28))).astype(np.float32)
    np.savez(path, x=x, y=y)
    return path


def train_args(
    artifacts: Path, params: Path, data: Path, out: Path, *, backend: str = "ort", epochs: int = 1, lr: float = 0.1
) -> list[str]:
    return [
        "train",
        "--artifacts",
        str(artifacts),
        "--backend",
        backend,
        "--params",
        str(params),
        "--data",
        str(data),
        "--epochs",
        str(epochs),
        "--lr",
        str(lr),
        "--threads",
        "1",
        "--out",
        str(out),
    ]


def bench_args(
    artifacts: Path, backend: str = "ort", warmup: int = 2, steps: int = 5, precision: float = 0.0
) -> list[str]:
    """A bench command line; precision 0 (the default here) takes exactly ``steps`` samples."""
    return [
        "bench",
        "--artifacts",
        str(artifacts),
        "--backend",
        backend,
        "--warmup",
        str(warmup),
        "--steps",
        str(steps),
        "--threads",
        "1",
        "--precision",
        str(precision),
    ]


# --------------------------------------------------------------------------- bench


@pytest.mark.parametrize(("key", "backend"), [("cfd", "ort"), ("rnn", "ort"), ("cnn", "torch")])
def test_bench_reports_timed_steps_memory_probe_and_versions(sets: dict[str, Path], key: str, backend: str) -> None:
    rc, doc, err = run_runner(*bench_args(sets[key], backend, warmup=3, steps=4))
    assert rc == 0, (doc, err[-2000:])
    assert doc["mode"] == "bench" and doc["status"] == "ok" and doc["error"] is None
    assert BENCH_KEYS <= set(doc)
    assert doc["backend"] == backend and doc["batch"] == 4 and doc["threads"] == 1
    assert doc["warmup"] == 3 and doc["steps"] == 4
    assert len(doc["step_seconds"]) == 4 and all(s > 0 for s in doc["step_seconds"])  # warm-up excluded
    assert 1 <= doc["warmup_steps"] == len(doc["warmup_seconds"]) <= 3
    assert doc["stop_reason"] == "steps" and doc["samples"] == 4 and not doc["imprecise"]
    assert doc["cpus_available"] >= 1 and len(doc["loadavg"]["before"]) == 3
    assert len(doc["loss"]) == 4 and all(np.isfinite(doc["loss"]))
    assert doc["peak_memory_bytes"] > 10 * 2**20
    assert doc["peak_memory_source"] in ("VmHWM", "ru_maxrss")
    # read once the runtime is imported, before the model opens: torch's import alone is over 150 MiB
    runtime = doc["runtime_memory_bytes"]
    assert 10 * 2**20 < runtime < doc["peak_memory_bytes"]
    assert (runtime > 150 * 2**20) == (backend == "torch"), runtime
    assert doc["matmul_gflops"] > 0
    assert set(doc["cpu_freq_khz"]) == {"before", "after"} and set(doc["thermal_c"]) == {"before", "after"}
    assert isinstance(doc["throttled"], bool)
    versions = doc["versions"]
    assert versions["python"] == ".".join(map(str, sys.version_info[:3]))
    assert versions["numpy"] == np.__version__
    assert versions["onnxruntime"] and (backend != "torch" or versions["torch"])


def test_bench_samples_span_at_least_the_requested_seconds(sets: dict[str, Path]) -> None:
    rc, doc, err = run_runner(*bench_args(sets["cnn"], warmup=1, steps=3), "--sample-seconds", "0.05")
    assert rc == 0, (doc, err[-2000:])
    assert len(doc["step_seconds"]) == 3 and len(doc["steps_per_sample"]) == 3
    # each sample is a block of whole steps lasting at least 0.05 s, recorded per step
    assert all(t * k >= 0.05 for t, k in zip(doc["step_seconds"], doc["steps_per_sample"], strict=True))
    assert all(k > 1 for k in doc["steps_per_sample"])  # a 4-image cnn step is far below 50 ms
    rc, doc, _ = run_runner(*bench_args(sets["cnn"], warmup=1, steps=3))
    assert doc["steps_per_sample"] == [1, 1, 1]
    rc, doc, _ = run_runner(*bench_args(sets["cnn"]), "--sample-seconds", "-1")
    assert rc == 2 and "--sample-seconds" in doc["error"]


def test_bench_samples_until_the_median_is_precise_or_the_cap(sets: dict[str, Path]) -> None:
    rc, doc, err = run_runner(
        *bench_args(sets["cnn"], warmup=20, steps=6, precision=0.05), "--max-seconds", "20"
    )
    assert rc == 0, (doc, err[-2000:])
    assert doc["precision"] == 0.05 and doc["max_seconds"] == 20.0
    # the process's CPU time per step of every sample: positive, and at most the wall time with one thread.
    # The CPU clock is read just outside each sample's wall-clock window (so that reading it costs the
    # timed steps nothing): a sample's CPU time may exceed its wall time by those reads, a few
    # microseconds each, which on a sample of one 0.1 ms step is several per cent; 100 us per sample covers them.
    cpu, wall, counts = doc["cpu_step_seconds"], doc["step_seconds"], doc["steps_per_sample"]
    assert len(cpu) == len(wall) == len(counts)
    assert all(0 < c * n <= 1.05 * w * n + 1e-4 for c, w, n in zip(cpu, wall, counts, strict=True)), (cpu, wall)
    # one thread: samples whose CPU time per step rose over 10 % above the run's low quantile are disturbed
    flags = doc["disturbed"]
    assert len(flags) == len(cpu) and set(flags) <= {0, 1}
    base = sorted(cpu)[int(0.1 * (len(cpu) - 1))] if len(cpu) >= 10 else math.inf
    assert all(flag == (c > 1.1 * base) for c, flag in zip(cpu, flags, strict=True))
    half = doc["precision_achieved"]
    low, high = doc["median_ci_seconds"]
    ordered = sorted(w for w, flag in zip(wall, flags, strict=True) if not flag)
    median = float(np.median(ordered))
    assert low <= median <= high and half == pytest.approx(max(median - low, high - median) / median)
    if doc["stop_reason"] == "precision":
        assert half <= 0.05 and not doc["imprecise"]
    else:  # a busy machine: the cap, flagged
        assert doc["stop_reason"] == "time cap" and doc["imprecise"] and doc["timed_seconds"] >= 20
    # a cap shorter than six samples leaves no interval: imprecise, stopped by the cap
    rc, doc, _ = run_runner(
        *bench_args(sets["cnn"], warmup=1, steps=6, precision=0.01), "--max-seconds", "0.05", "--sample-seconds", "0.02"
    )
    assert rc == 0 and doc["stop_reason"] == "time cap" and doc["imprecise"]
    assert doc["samples"] < 6 and doc["precision_achieved"] is None and doc["median_ci_seconds"] is None
    # the matmul probe runs by default and is skipped at 0 s (a campaign's later passes)
    assert doc["matmul_gflops"] > 0
    rc, doc, _ = run_runner(*bench_args(sets["cnn"], warmup=0, steps=2, precision=0.0), "--matmul-seconds", "0")
    assert rc == 0 and doc["matmul_gflops"] is None and doc["samples"] == 2
    for flag, value in (
        ("--precision", "1.5"), ("--max-seconds", "0"), ("--precision", "nan"), ("--matmul-seconds", "-1"),
    ):  # fmt: skip
        rc, doc, _ = run_runner(*bench_args(sets["cnn"]), flag, value)
        assert rc == 2 and flag in doc["error"], doc


def test_bench_losses_agree_between_backends_on_the_same_random_batch(sets: dict[str, Path]) -> None:
    # Same seeded weights (checkpoint vs model.pt) and the same seeded batch: SGD steps agree.
    _, ort, _ = run_runner(*bench_args(sets["cnn"], "ort", warmup=0, steps=3))
    _, torch, _ = run_runner(*bench_args(sets["cnn"], "torch", warmup=0, steps=3))
    np.testing.assert_allclose(ort["loss"], torch["loss"], rtol=1e-5)


# --------------------------------------------------------------------------- sampling (pure)


# --------------------------------------------------------------------------- train


def test_train_changes_parameters_and_loss_decreases(sets: dict[str, Path], start: Path, tmp_path: Path) -> None:
    data = learnable_shard(tmp_path / "shard.npz", n=18)  # 4 batches of 4 per epoch and a short one of 2
    out = tmp_path / "out.npy"
    rc, doc, err = run_runner(*train_args(sets["cnn"], start, data, out, epochs=3, lr=0.05))
    assert rc == 0, (doc, err[-2000:])
    assert TRAIN_KEYS <= set(doc)
    assert doc["mode"] == "train" and doc["epochs"] == 3 and doc["lr"] == 0.05
    assert doc["steps"] == 15 and len(doc["step_seconds"]) == 15 and len(doc["loss"]) == 15
    assert doc["step_examples"] == [4, 4, 4, 4, 2] * 3 and doc["batch"] == 4
    assert doc["examples"] == 54 and doc["out"] == str(out)
    # the step loop's wall time holds every step; its CPU time (one thread) stays within it
    assert sum(doc["step_seconds"]) <= doc["loop_seconds"]
    assert 0 < doc["loop_cpu_seconds"] <= doc["loop_seconds"] + 1e-3
    before = np.load(start)
    after = np.load(out, allow_pickle=False)
    assert after.dtype == np.float32 and after.shape == before.shape == (doc["num_parameters"],)
    assert not np.allclose(after, before)
    losses = np.asarray(doc["loss"])
    assert losses[-5:].mean() < 0.8 * losses[:5].mean(), losses


def test_train_ort_and_torch_agree_from_the_same_start(sets: dict[str, Path], start: Path, tmp_path: Path) -> None:
    # SGD: ORT's graph and torch.optim.SGD make the same update; 2 steps over different batches.
    data = learnable_shard(tmp_path / "shard.npz", n=8)
    docs, outs = {}, {}
    for backend in ("ort", "torch"):
        outs[backend] = tmp_path / f"{backend}.npy"
        rc, docs[backend], err = run_runner(
            *train_args(sets["cnn"], start, data, outs[backend], backend=backend, lr=0.05)
        )
        assert rc == 0, (docs[backend], err[-2000:])
    np.testing.assert_allclose(docs["ort"]["loss"], docs["torch"]["loss"], rtol=1e-4)
    assert len(docs["ort"]["loss"]) == 2 and docs["ort"]["loss"][0] != docs["ort"]["loss"][1]
    begin = np.load(start)
    ort_delta = np.load(outs["ort"]) - begin
    torch_delta = np.load(outs["torch"]) - begin
    assert np.linalg.norm(ort_delta) > 0
    assert np.linalg.norm(ort_delta - torch_delta) <= 1e-4 * np.linalg.norm(begin + ort_delta)
    assert np.linalg.norm(ort_delta - torch_delta) <= 1e-3 * np.linalg.norm(ort_delta)


# --------------------------------------------------------------------------- failures


def test_bad_arguments_exit_2(sets: dict[str, Path], tmp_path: Path) -> None:
    cases = [
        ["bench", "--backend", "ort", "--warmup", "1", "--steps", "2", "--threads", "1"],  # no --artifacts
        bench_args(tmp_path / "nonexistent"),
        bench_args(sets["cnn"], steps=0),
        [],
    ]
    for argv in cases:
        rc, doc, _ = run_runner(*argv)
        assert rc == 2 and doc["status"] == "bad arguments" and doc["error"], (argv, doc)
        assert doc["peak_memory_bytes"] and doc["step_seconds"] == []


def test_train_bad_arguments(sets: dict[str, Path], start: Path, tmp_path: Path) -> None:
    short = tmp_path / "short.npy"
    np.save(short, np.zeros(3, dtype=np.float32))
    data = learnable_shard(tmp_path / "shard.npz", n=8)
    empty = learnable_shard(tmp_path / "empty.npz", n=0)
    out = tmp_path / "out.npy"
    for argv, word in (
        (train_args(sets["cnn"], short, data, out), "--params"),
        (train_args(sets["cnn"], start, empty, out), "no examples"),
        (train_args(sets["cnn"], start, data, out) + ["--batch", "8"], "--batch"),
        (train_args(sets["cnn"], start, data, out, epochs=0), "--epochs"),
    ):
        rc, doc, _ = run_runner(*argv)
        assert rc == 2 and word in doc["error"], doc
    assert not out.exists()


def _fake_package(root: Path, name: str) -> None:
    package = root / name
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(f"raise ImportError('{name} hidden by the test')\n")


@pytest.mark.parametrize(
    ("backend", "module", "missing"), [("ort", "onnxruntime", "onnxruntime.training"), ("torch", "torch", "torch")]
)
def test_missing_runtime_exit_3(sets: dict[str, Path], tmp_path: Path, backend: str, module: str, missing: str) -> None:
    # A package earlier on sys.path that fails to import stands for an uninstalled runtime.
    _fake_package(tmp_path / "hide", module)
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "hide")}
    rc, doc, _ = run_runner(*bench_args(sets["cnn"], backend), env=env)
    assert rc == 3 and doc["status"] == "missing runtime", doc
    assert doc["missing"] == missing and "hidden by the test" in doc["error"]


def test_missing_numpy_exit_3(sets: dict[str, Path], tmp_path: Path) -> None:
    _fake_package(tmp_path / "hide", "numpy")
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "hide")}
    rc, doc, _ = run_runner(*bench_args(sets["cnn"]), env=env)
    assert rc == 3 and doc["missing"] == "numpy" and doc["versions"]["python"]


def _huge_shard(path: Path) -> Path:
    """An .npz whose x header claims 2**30 images (3.4 TB of float32); the data is absent."""
    with zipfile.ZipFile(path, "w") as archive:
        with archive.open("x.npy", "w") as handle:
            header = {"descr": "<f4", "fortran_order": False, "shape": (2**30, 1, 28, 28)}
            np.lib.format.write_array_header_1_0(handle, header)
        with archive.open("y.npy", "w") as handle:
            np.lib.format.write_array(handle, np.zeros(4, dtype=np.int64))
    return path


def _limit_address_space() -> None:
    limit = 4 * 2**30
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def test_out_of_memory_exit_4(sets: dict[str, Path], start: Path, tmp_path: Path) -> None:
    data = _huge_shard(tmp_path / "huge.npz")
    rc, doc, _ = run_runner(*train_args(sets["cnn"], start, data, tmp_path / "out.npy"), preexec=_limit_address_space)
    assert rc == 4 and doc["status"] == "out of memory", doc
    assert "allocate" in doc["error"]


def test_out_of_space_exit_6_names_the_file_and_leaves_nothing(
    sets: dict[str, Path], start: Path, tmp_path: Path, small_fs: SmallFileSystems
) -> None:
    data = learnable_shard(tmp_path / "shard.npz", 8)
    full = small_fs.mount("out", "8k")  # the fjord-cnn set's parameters take 26 KB
    rc, doc, _ = run_runner(*train_args(sets["cnn"], start, data, full / "out.npy"))
    assert rc == 6 and doc["status"] == "out of space", doc
    assert doc["error"] == f"writing {full / 'out.npy'}: No space left on device"
    assert list(full.iterdir()) == []


def _limit_address_space_1g() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (2**30, 2**30))


def test_ort_allocation_failure_exit_4(tmp_path: Path) -> None:
    # A real ORT arena failure: this set needs about 2 GB for one step; ORT's import and
    # session need under 300 MB of address space; the step is held to 1 GiB.
    model = get_model("cfd-cnn")
    big = export_artifacts(model, model.arch(0.25), batch=16384, optimizer="sgd", out_dir=tmp_path).directory
    rc, doc, _ = run_runner(*bench_args(big, warmup=0, steps=1), preexec=_limit_address_space_1g)
    assert rc == 4 and doc["status"] == "out of memory", doc
    error = doc["error"].lower()
    assert "allocate" in error or "bad_alloc" in error  # ORT's arena message or the C++ allocator's


# --------------------------------------------------------------------------- self-containment


def _imports(tree: ast.AST) -> Iterator[tuple[str, bool]]:
    """Yield (top-level module name, imported at module top) for every import."""
    top = set(id(node) for node in getattr(tree, "body", []))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name.split(".")[0], id(node) in top
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            yield node.module.split(".")[0], id(node) in top
        elif isinstance(node, ast.ImportFrom) and node.level:
            yield ".", id(node) in top


@pytest.mark.parametrize("path", sorted(SOURCE_DIR.glob("*.py")), ids=lambda path: path.name)
def test_runner_is_self_contained_and_python38_syntax(path: Path) -> None:
    source = path.read_text()
    tree = ast.parse(source, feature_version=(3, 8))
    imports = list(_imports(tree))
    names = {name for name, _ in imports}
    # the package's own modules only relatively ("."), so the archive's top-level package finds them
    assert not names & {"fleetbench", "exporters", "harness", "devices", "fl", "reports"}, names
    at_top = {name for name, top in imports if top}
    assert at_top <= set(sys.stdlib_module_names) | {"__future__", "."}, at_top - set(sys.stdlib_module_names)
    assert "from __future__ import annotations" in source or not imports  # annotations of 3.10 syntax run on 3.8


def test_ort_backend_never_loads_torch(sets: dict[str, Path], tmp_path: Path) -> None:
    # onnxruntime-training imports torch by itself; the runner blocks it (start-up, memory, thread
    # contention, devices without torch). A torch that explodes on import must not matter.
    package = tmp_path / "explode" / "torch"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("raise RuntimeError('torch was imported')\n")
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "explode")}
    rc, doc, err = run_runner(*bench_args(sets["cfd"], "ort"), env=env)
    assert rc == 0, (doc, err[-2000:])
    assert doc["peak_memory_bytes"] < 200 * 2**20  # with torch loaded it is about 300 MB


def _python38() -> str | None:
    """A working Python 3.8 interpreter (pyenv shims without a 3.8 do not count), else None."""
    candidates = sorted(glob.glob(os.path.expanduser("~/.pyenv/versions/3.8*/bin/python")))
    candidates += [c for c in (shutil.which("python3.8"),) if c]
    for candidate in candidates:
        check = "import sys; assert sys.version_info[:2] == (3, 8)"
        if subprocess.run([candidate, "-c", check], capture_output=True, timeout=30).returncode == 0:
            return candidate
    return None


PYTHON38 = _python38()


@pytest.mark.skipif(PYTHON38 is None, reason="no Python 3.8 interpreter here")
def test_runner_runs_on_python38(tmp_path: Path) -> None:
    # Devices run old Pythons: the argument, failure and JSON paths must work there (numpy may be absent).
    python = PYTHON38
    assert python is not None
    rc, doc, _ = run_runner(*bench_args(tmp_path / "nonexistent"), python=python)
    assert rc == 2 and doc["versions"]["python"].startswith("3.8")
    rc, doc, _ = run_runner("--help", python=python)
    assert rc == 0 and doc["mode"] == "help"


def test_bench_on_data_steps_through_its_batches_as_train_does(
    sets: dict[str, Path], start: Path, tmp_path: Path
) -> None:
    shard = learnable_shard(tmp_path / "shard.npz", 5 * 4 + 2)  # five batches of 4 and a short last one per epoch
    lr = OPTIMIZER_DEFAULTS["sgd"]["lr"]  # bench steps at the set's own rate
    rc, trained, _ = run_runner(*train_args(sets["cnn"], start, shard, tmp_path / "o.npy", epochs=3, lr=lr))
    assert rc == 0 and trained["step_examples"] == [4, 4, 4, 4, 4, 2] * 3, trained
    rc, bench, _ = run_runner(*bench_args(sets["cnn"], warmup=2, steps=3), "--data", str(shard))
    assert rc == 0 and bench["bench_data"] == "shard" and bench["batch"] == 4, bench
    # warm-up steps take their batches too: the timed steps are train's next ones, batch by batch (bench
    # steps on whole batches only: up to an epoch's short last batch, which train trains and bench skips)
    first = bench["warmup_steps"]
    np.testing.assert_allclose(bench["loss"], trained["loss"][first : first + 3], rtol=1e-5)
    _, noise, _ = run_runner(*bench_args(sets["cnn"], warmup=0, steps=3))
    assert noise["bench_data"] == "random"
    assert not np.allclose(noise["loss"], trained["loss"][:3], rtol=1e-3)
    one_batch = learnable_shard(tmp_path / "one.npz", 4)  # a shard of one batch: every step sees it
    rc, once, _ = run_runner(*train_args(sets["cnn"], start, one_batch, tmp_path / "o.npy", epochs=3, lr=lr))
    rc, bench, _ = run_runner(*bench_args(sets["cnn"], warmup=0, steps=3), "--data", str(one_batch))
    np.testing.assert_allclose(bench["loss"], once["loss"], rtol=1e-5)

    few = tmp_path / "few.npz"
    np.savez(few, x=np.zeros((3, 1, 28, 28), np.float32), y=np.zeros(3, np.int64))
    rc, doc, _ = run_runner(*bench_args(sets["cnn"]), "--data", str(few))
    assert rc == 2 and doc["status"] == "bad arguments" and "fewer than one batch of 4" in doc["error"]
    rc, doc, _ = run_runner(*bench_args(sets["rnn"]), "--data", str(one_batch))
    assert rc == 2 and "do not fit inputs" in doc["error"]


def test_the_runner_flushes_denormals_in_its_thread(sets: dict[str, Path]) -> None:
    # In a fresh interpreter (the flags are per thread and would leak into this one): a product
    # below float32's smallest normal is a denormal before, zero after.
    probe = (
        "import sys, numpy as np; sys.path.insert(0, sys.argv[1]); from runner import runtimes; "
        "tiny = lambda: float(np.array([1e-30], np.float32)[0] * np.array([1e-10], np.float32)[0]); "
        "before = tiny(); ok = runtimes.flush_denormals(); print(before > 0, ok, tiny() == 0.0)"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe, str(RUNNER)], capture_output=True, text=True, check=True, cwd=RUNNER.parent
    )
    assert out.stdout.split() == ["True", "True", "True"], out
    rc, doc, _ = run_runner(*bench_args(sets["cnn"], warmup=0, steps=2))
    assert rc == 0 and doc["flush_denormals"] is True
