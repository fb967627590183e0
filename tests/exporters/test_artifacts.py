"""ONNX Runtime training artifacts: export, training, PyTorch parity, flat order, cache.

Every test that exports shares the run's artifact root (`shared_artifacts`, the
same root as the step model's tests), so the same (model, width, batch,
optimizer) set is exported once and later tests hit the cache. Models are
parametrized from `exporters.zoo.model_names()`, so a model added to the zoo is
covered without editing this file; big ones are marked ``slow`` by their
analytic size (selection only: CI runs them too).
"""

from __future__ import annotations

import functools
import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch

from exporters import artifacts
from exporters.arch import DEFAULT_WIDTHS
from exporters.artifacts import export_artifacts
from exporters.errors import ExportError
from exporters.flops import count
from exporters.manifest import ARTIFACT_FILES, EXPORT_FORMAT_CHANGES, MANIFEST, load_valid_manifest
from exporters.ort_training import OrtTrainer
from exporters.torch_twin import torch_optimizer
from exporters.userinput import InputError
from exporters.zoo import ZooModel, get_model, model_names
from tests.conftest import SharedArtifacts

BATCH = 4

#: A (model, width) is "slow" to export + train when its estimated size exceeds these
#: (multiply-accumulates per example, or parameters; both scale about as width**2).
SLOW_MACS = 300_000_000
SLOW_PARAMS = 5_000_000


@functools.cache
def _full_counts(name: str) -> tuple[int, int]:
    model = get_model(name)
    counts = count(model, model.full_arch())
    return counts.macs, counts.params


def _is_slow(name: str, width: float) -> bool:
    macs, params = _full_counts(name)
    return macs * width**2 > SLOW_MACS or params * width**2 > SLOW_PARAMS


def _cases(widths: tuple[float, ...]) -> list:
    return [
        pytest.param(name, width, id=f"{name}-{width:g}", marks=[pytest.mark.slow] if _is_slow(name, width) else [])
        for name in model_names()
        for width in widths
    ]


@pytest.fixture
def root(shared_artifacts: SharedArtifacts) -> SharedArtifacts:
    """The run's artifact root, shared with the step model's tests (the same sets are exported once)."""
    return shared_artifacts


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _export(root: SharedArtifacts, name: str, width: float, optimizer: str = "adamw", batch: int = BATCH):
    model = get_model(name)
    return model, root.export(model, model.arch(width), batch=batch, optimizer=optimizer)


def _numpy_batch(model: ZooModel, batch: int = BATCH) -> tuple[np.ndarray, np.ndarray]:
    x, y = model.example_batch(batch, seed=1)
    return x.numpy(), y.numpy()


# --------------------------------------------------------------------------- every model, every width


@pytest.mark.parametrize(("name", "width"), _cases(DEFAULT_WIDTHS))
def test_exports_loads_and_trains(root: SharedArtifacts, name: str, width: float) -> None:
    model, result = _export(root, name, width)
    manifest = result.manifest
    arch = model.arch(width)

    assert sorted(p.name for p in result.directory.iterdir()) == sorted((*ARTIFACT_FILES, MANIFEST))
    assert manifest["model"] == name and manifest["arch"]["sizes"] == list(arch.sizes)
    assert manifest["arch"]["groups"] == list(model.group_names)
    assert manifest["batch"] == BATCH and manifest["optimizer"] == "adamw" and manifest["loss"] == "cross_entropy"
    assert manifest["inputs"] == [  # any batch size; `batch` is the one it was exported for
        {"name": "input", "shape": ["batch", *model.input_shape], "dtype": model.input_dtype},
        {"name": "labels", "shape": ["batch"], "dtype": "int64"},
    ]
    net = model.build(arch)
    assert {p["name"]: p["shape"] for p in manifest["parameters"]} == {
        n: list(t.shape) for n, t in net.named_parameters()
    }
    counts = count(model, arch)
    assert manifest["counts"]["params"] == counts.params == manifest["num_parameters"]
    assert manifest["counts"]["macs"] == counts.macs and manifest["counts"]["train_flops"] == counts.train_flops
    assert set(manifest["versions"]) >= {"torch", "onnx", "onnxruntime"}
    assert len(manifest["cache_key"]) == 64 and result.directory.name.endswith(manifest["cache_key"][:12])

    trainer = OrtTrainer(result.directory, lr=1e-4, evaluates=False)
    x, y = _numpy_batch(model)
    losses = [trainer.train_step(x, y) for _ in range(4)]  # the 4th loss sees 3 updates
    assert all(np.isfinite(losses))
    assert all(a > b for a, b in zip(losses, losses[1:], strict=False)), losses


@pytest.mark.parametrize("name", [n for n in model_names() if "lstm" in n])
def test_a_recurrent_weight_gradient_is_one_product_over_all_time_steps(root: SharedArtifacts, name: str) -> None:
    """Autodiff's one product per time step and their Sum are stacked into one Gemm (`fuse_gradient_sums`)."""
    import onnx

    model, result = _export(root, name, 0.25)
    graph = onnx.load(str(result.directory / "training_model.onnx"), load_external_data=False).graph
    producer = {out: node for node in graph.node for out in node.output}
    long_sums = [n for n in graph.node if n.op_type == "Sum" and len(n.input) > 2]
    assert not [n.name for n in long_sums if all(producer[i].op_type == "Gemm" for i in n.input)]
    recurrent = [n for n, _ in model.build(model.arch(0.25)).named_parameters() if "weight_hh" in n]
    stacked = [n for n in graph.node if n.op_type == "Gemm" and n.name.endswith("_stacked")]
    assert recurrent and len(stacked) == len(recurrent)


# --------------------------------------------------------------------------- parity with PyTorch


def _torch_from(model: ZooModel, width: float, params: dict[str, np.ndarray]) -> torch.nn.Module:
    net = model.build(model.arch(width))
    net.load_state_dict({k: torch.from_numpy(v.copy()) for k, v in params.items()}, strict=True)
    return net


def _close(got: np.ndarray, want: np.ndarray, rel: float, what: str) -> None:
    """Element-wise within ``rel`` relative, with the tensor's largest magnitude as the scale floor."""
    scale = float(np.abs(want).max()) or 1.0
    np.testing.assert_allclose(got, want, rtol=rel, atol=rel * scale, err_msg=what)


def _parity_cases(cases: list[tuple[str, float]]) -> list:
    return [
        pytest.param(name, width, id=f"{name}-{width:g}", marks=[pytest.mark.slow] if _is_slow(name, width) else [])
        for name, width in cases
    ]


ALL_AT_HALF = _parity_cases([(name, 0.5) for name in model_names()])


@pytest.mark.parametrize(("name", "width"), ALL_AT_HALF)
def test_ort_loss_gradients_and_adamw_step_match_pytorch(root: SharedArtifacts, name: str, width: float) -> None:
    """Forward, backward and the AdamW update each match PyTorch from the same weights.

    The update is checked given the same gradients (ORT's): for deep BatchNorm nets,
    float32 gradients of the two backends differ in the last bits where sums cancel,
    and Adam maps even a tiny gradient to a step of about ``lr``, so an end-to-end
    element-wise comparison there measures rounding, not the optimizer (see the SGD
    test for the end-to-end step, and cfd-cnn for AdamW end to end).
    """
    model, result = _export(root, name, width, "adamw")
    trainer = OrtTrainer(result.directory)
    before = trainer.get_parameters()
    net = _torch_from(model, width, before)
    x, y = _numpy_batch(model)
    xt, yt = torch.from_numpy(x), torch.from_numpy(y)

    # Eval graph = PyTorch forward in eval mode (static BatchNorm uses batch statistics in both).
    net.eval()
    with torch.no_grad():
        eval_torch = torch.nn.functional.cross_entropy(net(xt), yt).item()
    assert trainer.eval_loss(x, y) == pytest.approx(eval_torch, rel=1e-5, abs=1e-6)

    net.train()
    loss_torch = torch.nn.functional.cross_entropy(net(xt), yt)
    loss_torch.backward()
    loss_ort = trainer.forward_backward(x, y)
    assert loss_ort == pytest.approx(loss_torch.item(), rel=1e-5, abs=1e-6)
    grads = trainer.gradients()
    for pname, tensor in net.named_parameters():
        assert tensor.grad is not None
        _close(grads[pname], tensor.grad.numpy(), 1e-4, f"gradient of {pname}")

    trainer.step()
    for pname, tensor in net.named_parameters():
        tensor.grad = torch.from_numpy(grads[pname].copy())
    torch_optimizer("adamw", net.parameters()).step()
    after = trainer.get_parameters()
    for pname, tensor in net.named_parameters():
        _close(after[pname], tensor.detach().numpy(), 1e-5, f"AdamW step of {pname}")
    assert any(not np.array_equal(after[k], before[k]) for k in after)


SGD_CASES = _parity_cases([(name, 0.5) for name in model_names()])
ADAMW_END_TO_END = _parity_cases([("cfd-cnn", 0.5), ("cfd-cnn", 1.0)])


def _one_step_end_to_end(
    trainer: OrtTrainer, model: ZooModel, width: float, optimizer: str, batch: int = BATCH, *, eval_first: bool = False
) -> None:
    """One training step of ``trainer`` (at its set's initial parameters) against PyTorch; with
    ``eval_first``, the eval loss first (the eval graph does not touch the parameters the step
    starts from)."""
    before = trainer.get_parameters()
    net = _torch_from(model, width, before)
    x, y = _numpy_batch(model, batch)
    if eval_first:
        net.eval()
        with torch.no_grad():
            eval_torch = torch.nn.functional.cross_entropy(net(torch.from_numpy(x)), torch.from_numpy(y)).item()
        assert trainer.eval_loss(x, y) == pytest.approx(eval_torch, rel=1e-5, abs=1e-6)
        net.train()
        assert trainer.get_parameters().keys() == before.keys()
        for pname, value in trainer.get_parameters().items():
            np.testing.assert_array_equal(value, before[pname])
    opt = torch_optimizer(optimizer, net.parameters())
    opt.zero_grad()
    loss_torch = torch.nn.functional.cross_entropy(net(torch.from_numpy(x)), torch.from_numpy(y))
    loss_torch.backward()
    opt.step()
    assert trainer.train_step(x, y) == pytest.approx(loss_torch.item(), rel=1e-5, abs=1e-6)
    after = trainer.get_parameters()
    for pname, tensor in net.named_parameters():
        _close(after[pname], tensor.detach().numpy(), 1e-4, f"{optimizer} step of {pname}")
    assert any(not np.array_equal(after[k], before[k]) for k in after)


@pytest.mark.parametrize(("name", "width"), SGD_CASES)
def test_one_ort_sgd_step_matches_one_pytorch_step_at_its_batch_and_smaller_ones(
    root: SharedArtifacts, name: str, width: float
) -> None:
    """The graphs take any batch size: one SGD step on the set's own batch, then on an epoch's
    short last batch (a set of batch 4 on 3 and 1 examples, with its eval loss), each from the
    set's initial parameters as PyTorch. SGD keeps no state, so one trainer set back to those
    parameters serves every batch."""
    model, result = _export(root, name, width, "sgd")
    trainer = OrtTrainer(result.directory)
    initial = trainer.get_parameters()
    for batch in (BATCH, BATCH - 1, 1):
        trainer.set_parameters(initial)
        _one_step_end_to_end(trainer, model, width, "sgd", batch, eval_first=batch < BATCH)


@pytest.mark.parametrize(("name", "width"), ADAMW_END_TO_END)
def test_one_ort_adamw_step_matches_one_pytorch_step(root: SharedArtifacts, name: str, width: float) -> None:
    model, result = _export(root, name, width, "adamw")
    _one_step_end_to_end(OrtTrainer(result.directory), model, width, "adamw")


def test_ort_adamw_differs_from_torch_adamw_as_documented() -> None:
    """ORT's AdamW is the Hugging Face form: eps is not scaled by sqrt(1 - beta2**t)."""
    grad = torch.tensor([1e-5, 1.0])
    results = []
    for make in (lambda p: torch_optimizer("adamw", [p]), lambda p: torch.optim.AdamW([p], lr=1e-3, eps=1e-6)):
        p = torch.zeros(2, requires_grad=True)
        p.grad = grad.clone()
        make(p).step()
        results.append(p.detach().clone())
    ours, stock = results
    # t = 1: ORT step = lr * sqrt(1 - b2) / (1 - b1) * m / (sqrt(v) + eps), m = 0.1 g, v = 0.001 g^2.
    g = grad.double()
    expected = -1e-3 * (0.001**0.5) / 0.1 * (0.1 * g) / ((0.001 * g * g).sqrt() + 1e-6)
    np.testing.assert_allclose(ours.numpy(), expected.numpy(), rtol=1e-5)
    assert not torch.allclose(ours[0], stock[0], rtol=1e-3)  # small gradients differ
    assert torch.allclose(ours[1], stock[1], rtol=1e-4)  # large ones agree (to eps / sqrt(v))


# --------------------------------------------------------------------------- flat parameter order


def test_the_export_s_order_check_refuses_a_layout_ort_does_not_hold(root: SharedArtifacts) -> None:
    """The check every export runs (`_verify_flat_order`) fails on a swapped pair and on a wrong total."""
    _, result = _export(root, "fjord-cnn", 0.25)
    params, total = result.manifest["parameters"], result.manifest["num_parameters"]
    artifacts._verify_flat_order(result.directory, params, total)  # the set's own layout holds
    first, second = params[0], params[2]  # two weights of different sizes, their places swapped
    swapped = [dict(p) for p in params]
    swapped[0] = {**first, "offset": second["offset"] + second["size"] - first["size"]}
    swapped[2] = {**second, "offset": first["offset"]}
    with pytest.raises(ExportError, match="flat buffer order disagrees"):
        artifacts._verify_flat_order(result.directory, swapped, total)
    with pytest.raises(ExportError, match=f"ORT holds {total} trainable values, the module {total + 1}"):
        artifacts._verify_flat_order(result.directory, params, total + 1)


@pytest.mark.parametrize("name", model_names())
def test_manifest_order_round_trips_through_ort_flat_buffer(root: SharedArtifacts, name: str) -> None:
    model, result = _export(root, name, 0.25)
    manifest = result.manifest
    trainer = OrtTrainer(result.directory, evaluates=False)
    params = manifest["parameters"]

    offset = 0
    for p in params:
        assert p["offset"] == offset and p["size"] == int(np.prod(p["shape"]))
        offset += p["size"]
    assert offset == manifest["num_parameters"] == trainer.module.get_parameters_size(trainable_only=True)

    probe = (np.arange(offset, dtype=np.float32) % 65521) / 7.0
    trainer.set_flat(probe)
    np.testing.assert_array_equal(trainer.get_flat(), probe)
    state = dict(trainer.state.parameters)
    for p in params:  # ORT's own name -> tensor view agrees with the manifest slices
        got = np.asarray(state[p["name"]].data)
        assert list(got.shape) == p["shape"]
        np.testing.assert_array_equal(got.reshape(-1), probe[p["offset"] : p["offset"] + p["size"]])

    named = {n: np.full(p["shape"], i, dtype=np.float32) for i, (n, p) in enumerate((q["name"], q) for q in params)}
    trainer.set_parameters(named)
    back = trainer.get_parameters()
    assert list(back) == [p["name"] for p in params]
    for n, value in named.items():
        np.testing.assert_array_equal(back[n], value)
    with pytest.raises(InputError):
        trainer.set_flat(probe[:-1])


# --------------------------------------------------------------------------- cache


def _snapshot(directory: Path) -> dict[str, tuple[int, int]]:
    entries = {".": os.stat(directory)}
    entries.update({p.name: os.stat(p) for p in directory.iterdir()})
    return {k: (s.st_ino, s.st_mtime_ns) for k, s in entries.items()}


def test_cache_hit_writes_nothing_and_changes_reexport(tmp_path: Path) -> None:
    model = get_model("cfd-cnn")
    arch = model.arch(0.25)
    first = export_artifacts(model, arch, batch=2, optimizer="adamw", out_dir=tmp_path)
    assert not first.cached
    before = _snapshot(first.directory)
    root_before = (sorted(os.listdir(tmp_path)), os.stat(tmp_path).st_mtime_ns)

    again = export_artifacts(model, arch, batch=2, optimizer="adamw", out_dir=tmp_path)
    assert again.cached and again.directory == first.directory and again.manifest == first.manifest
    assert _snapshot(first.directory) == before
    assert (sorted(os.listdir(tmp_path)), os.stat(tmp_path).st_mtime_ns) == root_before

    variants = [
        export_artifacts(model, model.arch(0.5), batch=2, optimizer="adamw", out_dir=tmp_path),
        export_artifacts(model, arch, batch=3, optimizer="adamw", out_dir=tmp_path),
        export_artifacts(model, arch, batch=2, optimizer="sgd", out_dir=tmp_path),
    ]
    other = [name for name in model_names() if name != "cfd-cnn"]
    if other:
        m2 = get_model(other[0])
        variants.append(export_artifacts(m2, m2.arch(0.25), batch=2, optimizer="adamw", out_dir=tmp_path))
    keys = {first.manifest["cache_key"]} | {v.manifest["cache_key"] for v in variants}
    assert len(keys) == 1 + len(variants)
    assert all(not v.cached for v in variants)
    assert len({v.directory for v in variants} | {first.directory}) == 1 + len(variants)
    assert _snapshot(first.directory) == before
    assert not [p for p in os.listdir(tmp_path) if p.startswith(".")]  # no temporary leftovers


def test_a_set_of_an_older_export_format_is_exported_again(tmp_path: Path, monkeypatch) -> None:
    model = get_model("cfd-cnn")
    arch = model.arch(0.25)
    older = artifacts.EXPORT_FORMAT_VERSION - 1
    with monkeypatch.context() as patch:  # a set written by the format before, with its manifest's old keys
        patch.setattr(artifacts, "EXPORT_FORMAT_VERSION", older)
        old = export_artifacts(model, arch, batch=2, optimizer="adamw", out_dir=tmp_path)
    manifest = json.loads((old.directory / MANIFEST).read_text())
    manifest["arch"]["widths"] = manifest["arch"].pop("sizes")
    (old.directory / MANIFEST).write_text(json.dumps(manifest))
    assert load_valid_manifest(old.directory) is not None  # intact, but of the older format

    new = export_artifacts(model, arch, batch=2, optimizer="adamw", out_dir=tmp_path)
    assert not new.cached and new.directory != old.directory
    assert new.manifest["format_version"] == artifacts.EXPORT_FORMAT_VERSION
    assert new.manifest["arch"]["sizes"] == list(arch.sizes) and "widths" not in new.manifest["arch"]
    assert "sizes" in EXPORT_FORMAT_CHANGES[artifacts.EXPORT_FORMAT_VERSION]


@pytest.mark.parametrize("victim", ["checkpoint", "training_model.onnx", "manifest.json"])
def test_corrupted_set_is_reexported(tmp_path: Path, victim: str) -> None:
    model = get_model("cfd-cnn")
    arch = model.arch(0.25)
    first = export_artifacts(model, arch, batch=2, optimizer="sgd", out_dir=tmp_path)
    path = first.directory / victim
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    assert load_valid_manifest(first.directory, first.manifest["cache_key"]) is None

    second = export_artifacts(model, arch, batch=2, optimizer="sgd", out_dir=tmp_path)
    assert not second.cached and second.directory == first.directory
    assert second.manifest["files"] == first.manifest["files"]  # byte-for-byte reproducible export
    assert load_valid_manifest(second.directory, first.manifest["cache_key"]) is not None
    assert export_artifacts(model, arch, batch=2, optimizer="sgd", out_dir=tmp_path).cached
    assert not [p for p in os.listdir(tmp_path) if p.startswith(".")]


def test_crash_during_export_leaves_no_valid_looking_directory(tmp_path: Path, monkeypatch) -> None:
    model = get_model("cfd-cnn")
    arch = model.arch(0.25)

    def boom(directory: Path, *args, **kwargs) -> None:
        (directory / "checkpoint").write_bytes(b"half")
        raise KeyboardInterrupt

    monkeypatch.setattr(artifacts, "_verify_flat_order", boom)
    with pytest.raises(KeyboardInterrupt):
        export_artifacts(model, arch, batch=2, optimizer="sgd", out_dir=tmp_path)
    assert os.listdir(tmp_path) == []
    monkeypatch.undo()
    result = export_artifacts(model, arch, batch=2, optimizer="sgd", out_dir=tmp_path)
    assert not result.cached and os.listdir(tmp_path) == [result.directory.name]

    # A work directory of an export killed long ago (SIGKILL: no finally) is removed by the next export.
    abandoned = tmp_path / f".tmp-{result.directory.name}-killed"
    recent = tmp_path / f".tmp-{result.directory.name}-running"
    abandoned.mkdir()
    recent.mkdir()
    old = abandoned.stat().st_mtime - 2 * artifacts.ABANDONED_AFTER_S
    os.utime(abandoned, (old, old))
    (result.directory / "checkpoint").unlink()
    assert not export_artifacts(model, arch, batch=2, optimizer="sgd", out_dir=tmp_path).cached
    assert sorted(os.listdir(tmp_path)) == sorted([result.directory.name, recent.name])


def test_export_is_reproducible_across_roots(tmp_path: Path) -> None:
    model = get_model("cfd-cnn")
    arch = model.arch(0.25)
    a = export_artifacts(model, arch, batch=2, optimizer="adamw", out_dir=tmp_path / "a")
    b = export_artifacts(model, arch, batch=2, optimizer="adamw", out_dir=tmp_path / "b")
    assert a.directory.name == b.directory.name and not b.cached
    assert a.manifest["files"] == b.manifest["files"]
    state = torch.get_rng_state()
    export_artifacts(model, model.arch(0.5), batch=2, optimizer="adamw", out_dir=tmp_path / "a")
    assert torch.equal(state, torch.get_rng_state())  # seeding does not touch the caller's RNG


def test_manifest_is_plain_json_with_key_inputs(root: Path) -> None:
    _, result = _export(root, "cfd-cnn", 0.25)
    manifest = json.loads((result.directory / MANIFEST).read_text())
    assert manifest == result.manifest
    inputs = manifest["cache_key_inputs"]
    assert artifacts.cache_key(inputs) == manifest["cache_key"]
    assert inputs["format_version"] == artifacts.EXPORT_FORMAT_VERSION
    # the key's tool versions, read from the installed metadata, are the versions the modules report
    import onnx
    import onnxruntime

    versions = {"torch": torch.__version__, "onnx": onnx.__version__, "onnxruntime": onnxruntime.__version__}
    assert inputs["versions"] == versions
    assert manifest["optimizer_defaults"] == {
        "lr": 1e-3,
        "betas": [0.9, 0.999],
        "eps": 1e-6,
        "weight_decay": 0.0,
        "bias_correction": True,
        "mode": "huggingface",
    }


# --------------------------------------------------------------------------- bad input


def test_check_writable(tmp_path: Path) -> None:
    nested = tmp_path / "a" / "b"
    assert artifacts.check_writable(nested) == nested and nested.is_dir()
    regular = tmp_path / "file"
    regular.write_text("x")
    for bad in (regular, regular / "sub"):
        with pytest.raises(InputError, match="cannot write artifacts to") as info:
            artifacts.check_writable(bad)
        assert "\n" not in str(info.value)


def test_export_rejects_bad_requests(tmp_path: Path) -> None:
    model = get_model("cfd-cnn")
    arch = model.arch(0.25)
    for kwargs in ({"batch": 0, "optimizer": "adamw"}, {"batch": 2, "optimizer": "adam"}):
        with pytest.raises(InputError):
            export_artifacts(model, arch, out_dir=tmp_path, **kwargs)  # type: ignore[arg-type]
    other = [name for name in model_names() if name != "cfd-cnn"]
    if other:
        with pytest.raises(InputError):
            export_artifacts(get_model(other[0]), arch, batch=2, optimizer="adamw", out_dir=tmp_path)
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("width", [0.25, 0.5, 0.75, 1.0])
def test_set_name_shows_the_requested_width_even_when_ceil_is_uneven(width: float) -> None:
    from exporters.artifacts import set_name

    model = get_model("fjord-cnn")  # groups of 20 and 15: 0.25 keeps (5, 4), not a uniform fraction
    assert set_name(model, model.arch(width), 20, "adamw", "ab" * 32).startswith(f"fjord-cnn-w{width:g}-b20-adamw-abab")


def test_set_name_lists_layer_widths_of_a_non_uniform_arch() -> None:
    from exporters.arch import Arch
    from exporters.artifacts import set_name

    model = get_model("fjord-cnn")
    assert set_name(model, Arch("fjord-cnn", (1, 15)), 4, "sgd", "0" * 64) == "fjord-cnn-w1.15-b4-sgd-000000000000"


def test_exports_in_threads_at_once_all_succeed(tmp_path: Path) -> None:
    """Provisioning exports its check set from one thread per device; the torch exporter's globals are shared."""
    import threading

    model = get_model("fjord-cnn")
    errors: list[str] = []
    results: list[Path] = []

    def export(width: float) -> None:
        try:
            result = export_artifacts(model, model.arch(width), batch=2, optimizer="sgd", out_dir=tmp_path)
            results.append(result.directory)
        except Exception as exc:  # noqa: BLE001 - the test reports every thread's failure
            errors.append(repr(exc))

    threads = [threading.Thread(target=export, args=(w,)) for w in (0.25, 0.5, 0.25, 0.75)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert len(results) == 4 and all(load_valid_manifest(d) is not None for d in set(results))
