"""The runner trains every example of its shard, as in-process training does: the short last batch.

Artifact sets take a batch of any size (their graphs name the batch dimension), so ``train``
steps through each epoch in batches of the set's ``batch``, the last one short, as
`fl.client.train_plain` batches it. From the same seed and parameters the update of every
backend (``ort``; ``onnx`` on the plain onnxruntime package, as a device without the training
build runs it; ``torch``) equals the in-process one within float32 rounding, for a shard smaller
than one batch (7 examples, batch 20) and one that is not a whole number of batches (45), and
the document counts every example trained (the FedAvg weight). ``bench`` keeps stepping on
batches of the set's own size.

heterofl-resnet18 (static BatchNorm: the statistics of the 7 examples, not of a padded batch)
takes one step: its float32 training is chaotic across implementations (the training build's
first full step already differs from PyTorch's by 1e-5 on some elements, with the fixed-batch
sets as well, and later steps amplify that), so one step is what compares implementations.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

from exporters.artifacts import export_artifacts
from exporters.manifest import flatten, unflatten
from exporters.ort_training import OrtTrainer
from exporters.torchscript import export_torchscript
from exporters.zoo import get_model
from fl.client import train_plain
from fl.records import TrainIns
from tests.harness.test_runner import bench_args, run_runner, train_args
from tests.harness.test_runner_onnx import plain_python  # noqa: F401 - the fixture

BATCH = 20
LR = 0.05
SEED = 3
#: |device - in process| <= RTOL * the largest change a parameter made (float32 rounding of the
#: step's sums; in-process PyTorch and ORT agree to about 1e-6 of it here).
RTOL = 1e-4

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def sets(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """SGD sets of batch 20 with ``model.pt``: fjord-cnn, and heterofl-resnet18 (static BatchNorm)."""
    root = tmp_path_factory.mktemp("batch-artifacts")
    out = {}
    for name in ("fjord-cnn", "heterofl-resnet18"):
        model = get_model(name)
        arch = model.arch(0.25)
        result = export_artifacts(model, arch, batch=BATCH, optimizer="sgd", out_dir=root)
        export_torchscript(model, arch, result.directory)
        out[name] = result.directory
    return out


def _shard(path: Path, name: str, n: int) -> tuple[np.ndarray, np.ndarray]:
    model = get_model(name)
    rng = np.random.default_rng(n)
    x = rng.standard_normal((n, *model.input_shape)).astype(np.float32)
    y = rng.integers(0, model.num_classes, n).astype(np.int64)
    np.savez(path, x=x, y=y)
    return x, y


def _in_process(
    name: str, manifest: dict, start: np.ndarray, x: np.ndarray, y: np.ndarray, epochs: int
) -> tuple[np.ndarray, dict]:
    model = get_model(name)
    config = {"epochs": epochs, "lr": LR, "seed": SEED, "batch_size": BATCH}
    params, metrics = train_plain(model, TrainIns("c0", model.static(0.25), unflatten(manifest, start), config), x, y)
    return flatten(manifest, params), metrics


CASES = [
    pytest.param(name, backend, n, epochs, id=f"{name}-{backend}-{n}x{epochs}")
    for name, n, epochs in (("fjord-cnn", 7, 2), ("fjord-cnn", 45, 2), ("heterofl-resnet18", 7, 1))
    for backend in ("ort", "onnx", "torch")
]


@pytest.mark.parametrize(("name", "backend", "n", "epochs"), CASES)
def test_a_short_last_batch_trains_on_the_device_as_in_process(
    sets: dict[str, Path], tmp_path: Path, request: pytest.FixtureRequest, name: str, backend: str, n: int, epochs: int
) -> None:
    directory = sets[name]
    manifest = json.loads((directory / "manifest.json").read_text())
    start = OrtTrainer(directory).get_flat()
    np.save(tmp_path / "start.npy", start, allow_pickle=False)
    x, y = _shard(tmp_path / "shard.npz", name, n)
    want, metrics = _in_process(name, manifest, start, x, y, epochs)

    python = request.getfixturevalue("plain_python") if backend == "onnx" else sys.executable
    argv = train_args(directory, tmp_path / "start.npy", tmp_path / "shard.npz", tmp_path / "out.npy",
                      backend=backend, epochs=epochs, lr=LR)  # fmt: skip
    rc, doc, err = run_runner(*argv, "--seed", str(SEED), python=python)
    assert rc == 0, (doc, err[-2000:])
    sizes = [BATCH] * (n // BATCH) + ([n % BATCH] if n % BATCH else [])
    assert doc["step_examples"] == sizes * epochs
    assert doc["steps"] == len(doc["loss"]) == metrics["steps"] == len(sizes) * epochs
    assert doc["examples"] == n * epochs and doc["batch"] == BATCH
    got = np.load(tmp_path / "out.npy")
    moved = float(np.abs(want - start).max())
    assert moved > 1e-3
    assert float(np.abs(got - want).max()) <= RTOL * moved
    last = np.dot(doc["loss"][-len(sizes) :], sizes) / n  # the last epoch's loss per example, as in process
    assert last == pytest.approx(metrics["loss"], rel=1e-4)


def test_bench_steps_on_the_batch_the_set_was_exported_for(sets: dict[str, Path], tmp_path: Path) -> None:
    directory = sets["fjord-cnn"]
    rc, doc, _ = run_runner(*bench_args(directory, warmup=1, steps=3))
    assert rc == 0 and doc["batch"] == BATCH and doc["bench_data"] == "random", doc
    _shard(tmp_path / "short.npz", "fjord-cnn", 7)
    rc, doc, _ = run_runner(*bench_args(directory), "--data", str(tmp_path / "short.npz"))
    assert rc == 2 and f"fewer than one batch of {BATCH}" in doc["error"]


def test_an_empty_shard_is_refused(sets: dict[str, Path], tmp_path: Path) -> None:
    directory = sets["fjord-cnn"]
    np.save(tmp_path / "start.npy", OrtTrainer(directory).get_flat(), allow_pickle=False)
    _shard(tmp_path / "empty.npz", "fjord-cnn", 0)
    rc, doc, _ = run_runner(*train_args(directory, tmp_path / "start.npy", tmp_path / "empty.npz", tmp_path / "o.npy"))
    assert rc == 2 and "no examples" in doc["error"], doc
    assert not (tmp_path / "o.npy").exists()


def test_a_set_with_a_fixed_batch_still_skips_the_short_batch(sets: dict[str, Path], tmp_path: Path) -> None:
    # A set exported before the graphs took any batch: its manifest gives the batch as a number.
    fixed = tmp_path / "fixed"
    shutil.copytree(sets["fjord-cnn"], fixed)
    manifest = json.loads((fixed / "manifest.json").read_text())
    for spec in manifest["inputs"]:
        spec["shape"][0] = BATCH
    (fixed / "manifest.json").write_text(json.dumps(manifest))
    np.save(tmp_path / "start.npy", OrtTrainer(fixed).get_flat(), allow_pickle=False)
    _shard(tmp_path / "shard.npz", "fjord-cnn", 45)
    rc, doc, err = run_runner(*train_args(fixed, tmp_path / "start.npy", tmp_path / "shard.npz", tmp_path / "o.npy"))
    assert rc == 0, (doc, err[-2000:])
    assert doc["step_examples"] == [BATCH, BATCH] and doc["examples"] == 2 * BATCH
    _shard(tmp_path / "short.npz", "fjord-cnn", 7)
    rc, doc, _ = run_runner(*train_args(fixed, tmp_path / "start.npy", tmp_path / "short.npz", tmp_path / "o.npy"))
    assert rc == 2 and f"fewer than one batch of {BATCH}" in doc["error"]
