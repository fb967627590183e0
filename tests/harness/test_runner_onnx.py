"""The runner's ``onnx`` backend: the portable step model on the plain ``onnxruntime`` package.

The runner runs from a virtual environment holding only numpy and ``onnxruntime==1.19.2``
(neither onnxruntime-training nor torch), built once and cached under
``~/.cache/fleetbench/`` (see `plain_python`), exactly as a device without the training
build would run it; its results are compared with the ``ort`` backend's, run from this
environment. Tolerance: the float32 one of ``tests/exporters/test_step_model.py``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest

from exporters.artifacts import export_artifacts
from exporters.ort_training import OrtTrainer
from exporters.step_model import INITIAL_PARAMETERS, STEP_MODEL
from exporters.zoo import get_model
from harness.runner.artifacts import load_manifest, random_batch
from harness.runner.backends import OnnxBackend
from tests.harness.test_runner import bench_args, learnable_shard, run_runner, train_args

#: What the plain environment holds (numpy at this environment's version).
ONNXRUNTIME = "onnxruntime==1.19.2"
CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "fleetbench"

#: Tolerances (float32; see tests/exporters/test_step_model.py).
LOSS_RTOL = 1e-5
PARAM_RTOL = 1e-5


def _env_dir() -> Path:
    tag = f"{ONNXRUNTIME}-numpy{np.__version__}-py{sys.version_info[0]}{sys.version_info[1]}".replace("==", "")
    return CACHE / f"venv-{tag}"


def _usable(python: Path) -> bool:
    check = "import onnxruntime, numpy, sys; assert onnxruntime.__version__ == '1.19.2'"
    return python.exists() and subprocess.run([str(python), "-c", check], capture_output=True).returncode == 0


def _build_env(target: Path) -> None:
    """Create the venv in a scratch directory next to ``target`` and rename it into place."""
    target.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}-"))
    try:
        subprocess.run([sys.executable, "-m", "venv", str(scratch)], check=True, capture_output=True)
        done = subprocess.run(
            [str(scratch / "bin" / "python"), "-m", "pip", "install", "-q", f"numpy=={np.__version__}", ONNXRUNTIME],
            capture_output=True,
            text=True,
            timeout=900,
        )
        if done.returncode != 0:
            raise RuntimeError(f"pip install {ONNXRUNTIME} failed: {done.stderr.strip()[-500:]}")
        scratch.chmod(0o755)
        try:
            os.replace(scratch, target)  # a venv's interpreter finds its pyvenv.cfg relative to itself
        except OSError:
            if not _usable(target / "bin" / "python"):  # another session put one there first
                raise
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


@pytest.fixture(scope="session")
def plain_python() -> str:
    """A Python with numpy and plain onnxruntime 1.19.2 only (built once, then cached)."""
    target = _env_dir()
    python = target / "bin" / "python"
    if not _usable(python):
        shutil.rmtree(target, ignore_errors=True)
        try:
            _build_env(target)
        except (RuntimeError, subprocess.SubprocessError, OSError) as exc:
            if os.environ.get("CI") == "true":
                raise
            pytest.skip(f"cannot build the plain onnxruntime environment: {exc}")
    assert _usable(python)
    return str(python)


@pytest.fixture(scope="module")
def sets(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """cnn: fjord-cnn SGD; cfd: cfd-cnn AdamW; rnn: fjord-rnn SGD (int64 inputs); resnet: static BatchNorm."""
    root = tmp_path_factory.mktemp("onnx-artifacts")
    out = {}
    for key, name, width, optimizer in (
        ("cnn", "fjord-cnn", 0.25, "sgd"),
        ("cfd", "cfd-cnn", 0.25, "adamw"),
        ("rnn", "fjord-rnn", 0.25, "sgd"),
        ("resnet", "heterofl-resnet18", 0.25, "adamw"),
    ):
        model = get_model(name)
        out[key] = export_artifacts(model, model.arch(width), batch=4, optimizer=optimizer, out_dir=root).directory
    return out


def test_plain_environment_has_neither_the_training_build_nor_torch(plain_python: str) -> None:
    probe = (
        "import importlib.util as u, onnxruntime, json;"
        "print(json.dumps([onnxruntime.__version__, u.find_spec('torch') is None,"
        " u.find_spec('onnxruntime.training') is None, onnxruntime.get_available_providers()]))"
    )
    out = subprocess.run([plain_python, "-c", probe], capture_output=True, text=True, check=True).stdout
    version, no_torch, no_training, providers = json.loads(out)
    assert version == "1.19.2" and no_torch and no_training and "CPUExecutionProvider" in providers


@pytest.mark.parametrize("key", ["cnn", "cfd", "rnn", "resnet"])
def test_bench_onnx_runs_without_the_training_build_and_matches_ort(
    sets: dict[str, Path], plain_python: str, key: str
) -> None:
    rc, onnx_doc, err = run_runner(*bench_args(sets[key], "onnx", warmup=0, steps=4), python=plain_python)
    assert rc == 0, (onnx_doc, err[-2000:])
    assert onnx_doc["backend"] == "onnx" and onnx_doc["batch"] == 4 and len(onnx_doc["step_seconds"]) == 4
    assert onnx_doc["versions"]["onnxruntime"] == "1.19.2" and onnx_doc["versions"]["torch"] is None
    assert onnx_doc["peak_memory_bytes"] > 0 and onnx_doc["matmul_gflops"] > 0
    # The same seeded batch from the same initial parameters: the ort backend's loss curve.
    rc, ort_doc, err = run_runner(*bench_args(sets[key], "ort", warmup=0, steps=4))
    assert rc == 0, (ort_doc, err[-2000:])
    scale = max(ort_doc["loss"])
    np.testing.assert_allclose(onnx_doc["loss"], ort_doc["loss"], rtol=0, atol=1e-4 * scale)
    assert onnx_doc["loss"][-1] != onnx_doc["loss"][0]  # state carried from step to step


@pytest.mark.parametrize(("key", "lr"), [("cnn", 0.05), ("cfd", 1e-3)])
def test_train_onnx_equals_train_ort(
    sets: dict[str, Path], plain_python: str, tmp_path: Path, key: str, lr: float
) -> None:
    manifest = json.loads((sets[key] / "manifest.json").read_text())
    start = tmp_path / "start.npy"
    rng = np.random.default_rng(5)
    flat = OrtTrainer(sets[key]).get_flat()
    np.save(start, (flat + 0.01 * rng.standard_normal(flat.shape)).astype(np.float32), allow_pickle=False)
    data = learnable_shard(tmp_path / "shard.npz", n=14)  # three batches of four per epoch and a short one of two
    docs, outs = {}, {}
    for backend, python in (("onnx", plain_python), ("ort", sys.executable)):
        outs[backend] = tmp_path / f"{backend}.npy"
        argv = train_args(sets[key], start, data, outs[backend], backend=backend, epochs=2, lr=lr)
        rc, docs[backend], err = run_runner(*argv, python=python)
        assert rc == 0, (docs[backend], err[-2000:])
    assert docs["onnx"]["steps"] == docs["ort"]["steps"] == 8 and docs["onnx"]["examples"] == 28
    np.testing.assert_allclose(docs["onnx"]["loss"], docs["ort"]["loss"], rtol=LOSS_RTOL)
    got, want, begin = np.load(outs["onnx"]), np.load(outs["ort"]), np.load(start)
    assert got.dtype == np.float32 and got.shape == want.shape
    assert np.abs(want - begin).max() > 100 * PARAM_RTOL * np.abs(want).max()  # training moved the parameters
    b1, b2 = manifest["optimizer_defaults"].get("betas", [0.9, 0.999])
    adamw_step = lr * (1 - b2) ** 0.5 / (1 - b1) if manifest["optimizer"] == "adamw" else 0.0
    for p in manifest["parameters"]:
        part = slice(p["offset"], p["offset"] + p["size"])
        scale = float(np.abs(want[part]).max())
        np.testing.assert_allclose(got[part], want[part], rtol=0, atol=PARAM_RTOL * scale + 0.05 * adamw_step)


# --------------------------------------------------------------------------- the manifest is checked


def _copy_set(directory: Path, tmp_path: Path) -> Path:
    copy = tmp_path / directory.name
    shutil.copytree(directory, copy)
    return copy


def test_step_model_that_does_not_match_its_manifest_exits_2(
    sets: dict[str, Path], plain_python: str, tmp_path: Path
) -> None:
    # A different step model (sha256): another set's.
    alien = _copy_set(sets["cnn"], tmp_path / "alien")
    shutil.copy(sets["cfd"] / STEP_MODEL, alien / STEP_MODEL)
    rc, doc, _ = run_runner(*bench_args(alien, "onnx"), python=plain_python)
    assert rc == 2 and doc["status"] == "bad arguments" and "sha256" in doc["error"] and STEP_MODEL in doc["error"]

    # The manifest's inputs disagree with the graph (the file itself is intact).
    edited = _copy_set(sets["cnn"], tmp_path / "edited")
    manifest = json.loads((edited / "manifest.json").read_text())
    manifest["step_model"]["inputs"][0]["shape"][0] = 8
    (edited / "manifest.json").write_text(json.dumps(manifest))
    rc, doc, _ = run_runner(*bench_args(edited, "onnx"), python=plain_python)
    assert rc == 2 and "inputs do not match the manifest" in doc["error"] and "input" in doc["error"]

    # A set exported before the step model existed.
    old = _copy_set(sets["cnn"], tmp_path / "old")
    manifest = json.loads((old / "manifest.json").read_text())
    del manifest["step_model"]
    (old / "manifest.json").write_text(json.dumps(manifest))
    rc, doc, _ = run_runner(*bench_args(old, "onnx"), python=plain_python)
    assert rc == 2 and "step_model" in doc["error"]

    # Initial parameters that are not the set's.
    swapped = _copy_set(sets["cnn"], tmp_path / "swapped")
    np.save(swapped / INITIAL_PARAMETERS, np.zeros(3, dtype=np.float32))
    rc, doc, _ = run_runner(*bench_args(swapped, "onnx"), python=plain_python)
    assert rc == 2 and INITIAL_PARAMETERS in doc["error"]


def test_onnx_backend_without_onnxruntime_exits_3(sets: dict[str, Path], tmp_path: Path) -> None:
    package = tmp_path / "hide" / "onnxruntime"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("raise ImportError('onnxruntime hidden by the test')\n")
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "hide")}
    rc, doc, _ = run_runner(*bench_args(sets["cnn"], "onnx"), env=env)
    assert rc == 3 and doc["missing"] == "onnxruntime" and "hidden by the test" in doc["error"]


# --------------------------------------------------------------------------- state stays in OrtValues


def test_parameters_and_state_stay_in_ortvalues_between_steps(sets: dict[str, Path], monkeypatch) -> None:
    import onnxruntime

    directory = str(sets["cfd"])
    manifest = load_manifest(directory, "onnx")
    backend = OnnxBackend(directory, manifest, 1)
    x, y = random_batch(np, manifest, 0)
    backend.bind(x, y)
    buffers = {**{("a", k): v for k, v in backend.a.items()}, **{("b", k): v for k, v in backend.b.items()}}
    pointers = {k: v.data_ptr() for k, v in buffers.items()}
    assert len(set(pointers.values())) == len(pointers)  # two distinct sets of buffers

    def no_host_copy(self: object) -> None:
        raise AssertionError("a step copied an OrtValue to the host")

    monkeypatch.setattr(onnxruntime.OrtValue, "numpy", no_host_copy)
    runs = []
    original = backend.session.run_with_iobinding
    monkeypatch.setattr(
        backend.session, "run_with_iobinding", lambda binding: runs.append(binding) or original(binding)
    )
    for _ in range(4):
        backend.step()
    monkeypatch.undo()
    assert runs == backend.bindings * 2  # the two bindings made once, alternated
    assert {k: v.data_ptr() for k, v in buffers.items()} == pointers  # written in place, never reallocated
    # After an even number of steps the parameters are back in set A and equal the training build's.
    trainer = OrtTrainer(sets["cfd"])
    for _ in range(4):
        trainer.train_step(x, y)
    want = trainer.get_flat()
    got = backend.get_flat(np)
    adamw_step = manifest["optimizer_defaults"]["lr"] * (1 - 0.999) ** 0.5 / (1 - 0.9)
    np.testing.assert_allclose(got, want, rtol=0, atol=PARAM_RTOL * np.abs(want).max() + 0.05 * adamw_step)
