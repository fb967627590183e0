"""The portable step model: default-domain ONNX only, and the same maths as the training build.

Tolerance (float32). From the same parameters, batch and learning rate, one step of the step
model, one step of the training build (`exporters.ort_training.OrtTrainer`) and one PyTorch step
(`exporters.torch_twin.torch_optimizer`) agree to

* the loss: within ``LOSS_RTOL`` = 1e-5 relative;
* every parameter element after the step: within ``PARAM_RTOL`` = 1e-5 of the largest
  magnitude in its tensor, plus for AdamW ``ADAMW_STEP_FRACTION`` = 5 % of the largest step
  AdamW takes on an element at t = 1 (``lr * sqrt(1 - beta2) / (1 - beta1)``): AdamW divides
  every gradient element by its own magnitude, so float32 rounding of a gradient element that
  is nearly zero (sums that cancel, in BatchNorm nets) moves that element's step by a fraction
  of the whole step;
* ten steps on the same batch: every loss of the curve within ``CURVE_RTOL`` = 1e-4 of the
  curve's largest loss (the losses fall towards zero on one batch, so each one's own magnitude
  is no scale).

Measured here (every model at two widths, both optimizers): losses within 3e-7, parameters
within 2.5e-6 (SGD) and 1.1 % of the AdamW step, ten-step curves within 5e-5. The ten-step
check compares with the training build *or* PyTorch: float32 training of the static-BatchNorm
ResNets branches where a ReLU input lies within rounding of zero, and such a branch point
splits the training build from PyTorch just as often (measured: loss curves 1e-2 apart after
ten steps for some widths and learning rates, in either pair); a correct step model follows one
of the two.

Widths and optimizers: two widths per model, small ones for the big ResNets and cfd-cnn; SGD
at the first, AdamW at the second. A graph's lowering does not depend on its width, so every
model's step is checked with both optimizers and at two widths without training all four
pairs (the LSTMs' unrolled export, 5-10 s each, would dominate this file's time); these are the
sets the artifact tests train too (the run shares one artifact root, `shared_artifacts`).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import onnxruntime
import pytest
import torch
from onnx import helper

from exporters.artifacts import OPTIMIZER_DEFAULTS
from exporters.manifest import ARTIFACT_FILES
from exporters.ort_training import OrtTrainer
from exporters.step_model import (
    INITIAL_PARAMETERS,
    STEP_MODEL,
    LoweringError,
    build_step_model,
    check_portable,
    mask_input,
)
from exporters.torch_twin import torch_optimizer
from exporters.zoo import ZooModel, get_model, model_names
from tests.conftest import SharedArtifacts
from tests.exporters.examples import DEPTHWISE, MOBILENET_V2, RESNET18, SMALL_CNN

BATCH = 4
LOSS_RTOL = 1e-5
PARAM_RTOL = 1e-5
ADAMW_STEP_FRACTION = 0.05
CURVE_RTOL = 1e-4
STEPS = 10
LR = {"sgd": 0.05, "adamw": 1e-3}

LSTMS = ("feddrop-lstm", "fjord-rnn", "fluid-lstm")
#: Widths per model (small ones where a step is expensive: the lowering of a graph does not depend
#: on its width, and every model trains at full width in `tests/exporters/test_artifacts.py`).
WIDTHS = {
    "cfd-cnn": (0.25, 0.5),
    "fjord-resnet18": (0.25, 0.5),
    "heterofl-resnet18": (0.25, 0.5),
    **{name: (0.25, 0.5) for name in LSTMS},
}
DEFAULT_WIDTHS = (0.5, 1.0)


def _cases() -> list:
    cases = []
    for name in model_names():
        first, second = WIDTHS.get(name, DEFAULT_WIDTHS)
        pairs = [(first, "sgd"), (second, "adamw")]
        cases += [pytest.param((name, w, opt), id=f"{name}-{w:g}-{opt}") for w, opt in pairs]
    # Users' models whose step is well conditioned: a BatchNorm CNN and a depthwise-separable one.
    for spec, label in ((SMALL_CNN, "small_cnn"), (DEPTHWISE, "depthwise")):
        cases += [pytest.param((spec, w, opt), id=f"{label}-{w:g}-{opt}") for w, opt in ((0.5, "adamw"), (1.0, "sgd"))]
    return cases


CASES = _cases()

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture
def root(shared_artifacts: SharedArtifacts) -> SharedArtifacts:
    """The run's artifact root, shared with the artifact tests (the same sets are exported once)."""
    return shared_artifacts


@pytest.fixture(scope="module", params=CASES)
def case(request: pytest.FixtureRequest) -> tuple[str, float, str]:
    """One (model, width, optimizer); module-scoped, so a case's tests run together on one export."""
    name, width, optimizer = request.param
    return name, width, optimizer


def _session(path: Path) -> onnxruntime.InferenceSession:
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = 1
    options.log_severity_level = 3
    return onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


@functools.lru_cache(maxsize=2)
def _step_session(directory: Path) -> onnxruntime.InferenceSession:
    """A set's step model in a session; a case's tests share it (a session holds no step state)."""
    return _session(directory / STEP_MODEL)


@dataclass(frozen=True)
class Run:
    """Ten steps of the three implementations from the same start (see `_run`)."""

    manifest: dict
    directory: Path
    initial: dict[str, np.ndarray]
    losses: dict[str, list[float]]
    first: dict[str, dict[str, np.ndarray]]  # parameters after step 1, per implementation


class StepRunner:
    """Feeds a step model and carries its outputs into the next step's inputs."""

    def __init__(self, directory: Path, manifest: dict, params: dict[str, np.ndarray], lr: float) -> None:
        self.spec = manifest["step_model"]
        self.session = _step_session(directory)
        self.outputs = [o.name for o in self.session.get_outputs()]
        self.feeds: dict[str, np.ndarray] = {"learning_rate": np.asarray([lr], dtype=np.float32)}
        for t in self.spec["inputs"]:
            if t["name"] in params:
                self.feeds[t["name"]] = params[t["name"]]
            elif t["name"] not in self.spec["batch"] and t["name"] != "learning_rate":
                self.feeds[t["name"]] = np.zeros(t["shape"], dtype=t["dtype"])

    def step(self, x: np.ndarray, y: np.ndarray) -> dict[str, np.ndarray]:
        out = dict(zip(self.outputs, self.session.run(None, {**self.feeds, "input": x, "labels": y}), strict=True))
        for source, target in self.spec["carry"]:
            self.feeds[source] = out[target]
        return out


def _batch(model: ZooModel) -> tuple[torch.Tensor, torch.Tensor]:
    return model.example_batch(BATCH, seed=1)


@functools.cache
def _run(root: SharedArtifacts, name: str, width: float, optimizer: str) -> Run:
    model = get_model(name)
    result = root.export(model, model.arch(width), batch=BATCH, optimizer=optimizer)
    lr = LR[optimizer]
    trainer = OrtTrainer(result.directory, lr=lr, evaluates=False)
    initial = trainer.get_parameters()
    net = model.build(model.arch(width))
    net.load_state_dict({k: torch.from_numpy(v.copy()) for k, v in initial.items()}, strict=True)
    net.train()
    opt = torch_optimizer(optimizer, net.parameters(), lr=lr)
    stepper = StepRunner(result.directory, result.manifest, initial, lr)
    x, y = _batch(model)
    xn, yn = x.numpy(), y.numpy()
    losses: dict[str, list[float]] = {"step": [], "ort": [], "torch": []}
    first: dict[str, dict[str, np.ndarray]] = {}
    for k in range(STEPS):
        out = stepper.step(xn, yn)
        losses["step"].append(float(out["loss"]))
        losses["ort"].append(trainer.train_step(xn, yn))
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(net(x), y)
        loss.backward()
        opt.step()
        losses["torch"].append(loss.item())
        if k == 0:
            first = {
                "step": {p: out[p + ".next"] for p in initial},
                "ort": trainer.get_parameters(),
                "torch": {p: t.detach().numpy().copy() for p, t in net.named_parameters()},
            }
    return Run(result.manifest, result.directory, initial, losses, first)


def _param_tolerance(optimizer: str, lr: float) -> float:
    if optimizer != "adamw":
        return 0.0
    b1, b2 = OPTIMIZER_DEFAULTS["adamw"]["betas"]
    return ADAMW_STEP_FRACTION * lr * (1.0 - b2) ** 0.5 / (1.0 - b1)


def _assert_params_close(got: dict[str, np.ndarray], want: dict[str, np.ndarray], atol: float, what: str) -> None:
    assert list(got) == list(want) or set(got) == set(want)
    for name, expected in want.items():
        scale = float(np.abs(expected).max()) or 1.0
        np.testing.assert_allclose(
            got[name], expected, rtol=0, atol=PARAM_RTOL * scale + atol, err_msg=f"{what}: {name}"
        )


# --------------------------------------------------------------------------- same maths


def test_one_step_equals_training_build_and_pytorch(root: SharedArtifacts, case: tuple[str, float, str]) -> None:
    name, width, optimizer = case
    run = _run(root, name, width, optimizer)
    atol = _param_tolerance(optimizer, LR[optimizer])
    for other in ("ort", "torch"):
        assert run.losses["step"][0] == pytest.approx(run.losses[other][0], rel=LOSS_RTOL, abs=1e-7), other
        _assert_params_close(run.first["step"], run.first[other], atol, f"one {optimizer} step vs {other}")
    moved = max(float(np.abs(run.first["step"][p] - run.initial[p]).max()) for p in run.initial)
    assert moved > 10 * PARAM_RTOL  # the step did something the tolerance cannot hide


def test_ten_steps_give_the_same_loss_curve(root: SharedArtifacts, case: tuple[str, float, str]) -> None:
    name, width, optimizer = case
    run = _run(root, name, width, optimizer)
    curve = np.asarray(run.losses["step"])
    assert len(curve) == STEPS and np.all(np.isfinite(curve))
    assert curve[-1] < curve[0]  # training, not standing still
    deviations = {
        other: float(np.max(np.abs(curve - np.asarray(run.losses[other]))) / np.max(np.abs(run.losses[other])))
        for other in ("ort", "torch")
    }
    assert min(deviations.values()) <= CURVE_RTOL, deviations


SHORT = 3  # an epoch's short last batch, on a set exported at BATCH


def test_a_short_batch_steps_as_the_training_build_and_pytorch(
    root: SharedArtifacts, case: tuple[str, float, str]
) -> None:
    name, width, optimizer = case
    run = _run(root, name, width, optimizer)
    spec = run.manifest["step_model"]
    assert [t["shape"][0] for t in spec["inputs"][:2]] == ["batch", "batch"]
    model, lr = get_model(name), LR[optimizer]
    x, y = model.example_batch(SHORT, seed=2)
    out = StepRunner(run.directory, run.manifest, run.initial, lr).step(x.numpy(), y.numpy())
    trainer = OrtTrainer(run.directory, lr=lr, evaluates=False)
    ort_loss = trainer.train_step(x.numpy(), y.numpy())
    net = model.build(model.arch(width))
    net.load_state_dict({k: torch.from_numpy(v.copy()) for k, v in run.initial.items()}, strict=True)
    net.train()
    opt = torch_optimizer(optimizer, net.parameters(), lr=lr)
    loss = torch.nn.functional.cross_entropy(net(x), y)
    loss.backward()
    opt.step()
    after = {"ort": trainer.get_parameters(), "torch": {p: t.detach().numpy() for p, t in net.named_parameters()}}
    atol = _param_tolerance(optimizer, lr)
    for other, other_loss in (("ort", ort_loss), ("torch", loss.item())):
        assert float(out["loss"]) == pytest.approx(other_loss, rel=LOSS_RTOL, abs=1e-7), other
        _assert_params_close({p: out[p + ".next"] for p in run.initial}, after[other], atol, f"batch {SHORT}: {other}")


#: Operators that do a step's arithmetic (shape computations aside).
COMPUTE_OPS = ("Conv", "ConvTranspose", "Gemm", "MatMul", "FusedMatMul", "Sum", "Add", "Concat", "Split", "Transpose")


def _optimised_ops(path: Path, batch: int | None, tmp_path: Path) -> dict[str, int]:
    options = onnxruntime.SessionOptions()
    options.log_severity_level = 3
    options.optimized_model_filepath = str(tmp_path / "optimised.onnx")
    if batch is not None:
        options.add_free_dimension_override_by_name("batch", batch)
    onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    nodes = onnx.load(str(tmp_path / "optimised.onnx")).graph.node
    return {op: sum(n.op_type == op for n in nodes) for op in COMPUTE_OPS}


@pytest.mark.parametrize("name", model_names())
def test_a_variable_batch_costs_the_runtime_no_fusion(root: SharedArtifacts, name: str, tmp_path: Path) -> None:
    """ONNX Runtime optimises the step model as it does with the batch fixed (its Gemm fusions match shapes)."""
    model = get_model(name)
    width = WIDTHS.get(name, DEFAULT_WIDTHS)[0]
    result = root.export(model, model.arch(width), batch=BATCH, optimizer="sgd")
    path = result.directory / STEP_MODEL
    assert _optimised_ops(path, None, tmp_path) == _optimised_ops(path, BATCH, tmp_path)


# --------------------------------------------------------------------------- portability


def test_step_model_holds_only_default_domain_operators(root: SharedArtifacts, case: tuple[str, float, str]) -> None:
    name, width, optimizer = case
    run = _run(root, name, width, optimizer)
    model = onnx.load(str(run.directory / STEP_MODEL))
    assert {o.domain for o in model.opset_import} <= {"", "ai.onnx"}
    for node in model.graph.node:
        assert node.domain in ("", "ai.onnx"), (node.op_type, node.domain)
        assert onnx.defs.has(node.op_type, ""), node.op_type  # an ONNX operator, not an ORT kernel
    assert check_portable(model) == []
    session = _step_session(run.directory)  # loads on the CPU provider alone
    assert [i.name for i in session.get_inputs()] == [t["name"] for t in run.manifest["step_model"]["inputs"]]


def test_check_portable_names_training_kernels() -> None:
    nodes = [
        helper.make_node("ConvGrad", ["dy", "x", "w"], ["dx"], domain="com.microsoft", name="a"),
        helper.make_node("MaxPoolGrad", ["dy", "i"], ["dx2"], name="b"),  # default domain, not ONNX
        helper.make_node("Relu", ["x"], ["r"], name="c"),
    ]
    graph = helper.make_graph(nodes, "g", [], [])
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    )
    found = check_portable(model)
    assert any("ConvGrad" in f for f in found) and any("MaxPoolGrad" in f for f in found)
    assert not any("Relu" in f for f in found) and any("com.microsoft" in f for f in found)


def test_manifest_lists_the_step_model_and_initial_parameters(root: SharedArtifacts) -> None:
    run = _run(root, "fjord-cnn", 0.5, "adamw")
    files = run.manifest["files"]
    assert STEP_MODEL in ARTIFACT_FILES and INITIAL_PARAMETERS in ARTIFACT_FILES
    assert set(files) == set(ARTIFACT_FILES)
    spec = run.manifest["step_model"]
    names = [p["name"] for p in run.manifest["parameters"]]
    assert spec["parameters"] == names and [a for a, _ in spec["carry"][: len(names)]] == names
    assert [b for _, b in spec["carry"]] == [a + ".next" for a, _ in spec["carry"]]
    state = [a for a, _ in spec["carry"][len(names) :]]
    assert state == [n + ".exp_avg" for n in names] + [n + ".exp_avg_sq" for n in names] + ["step"]
    flat = np.load(run.directory / INITIAL_PARAMETERS, allow_pickle=False)
    fresh = OrtTrainer(run.directory, evaluates=False).get_flat()
    np.testing.assert_array_equal(flat, fresh)  # the checkpoint's values, in the flat order


def test_unknown_operator_is_named(root: SharedArtifacts) -> None:
    run = _run(root, "fjord-cnn", 0.5, "sgd")
    training = onnx.load(str(run.directory / "training_model.onnx"))
    optimizer = onnx.load(str(run.directory / "optimizer_model.onnx"))
    training.graph.node.append(helper.make_node("FancyGrad", ["logits"], ["fancy"], domain="com.microsoft", name="f"))
    params = [(p["name"], p["shape"]) for p in run.manifest["parameters"]]
    with pytest.raises(LoweringError, match="FancyGrad"):
        build_step_model(training, optimizer, params)


# --------------------------------------------------------------------------- SyncDrop masks


def _masked_torch_step(model: ZooModel, width: float, params: dict, masks: dict, lr: float, steps: int) -> list[float]:
    net = model.build(model.arch(width))
    net.load_state_dict({k: torch.from_numpy(v.copy()) for k, v in params.items()}, strict=True)
    net.train()
    for group, scale in masks.items():
        # As fl.strategies.feddrop's SyncDrop: the producing module's output times d / p per channel.
        def hook(mod: torch.nn.Module, inputs: object, output: torch.Tensor, s: np.ndarray = scale) -> torch.Tensor:
            return output * torch.from_numpy(s).view((1, -1) + (1,) * (output.dim() - 2))

        net.get_submodule(group).register_forward_hook(hook)
    opt = torch_optimizer("sgd", net.parameters(), lr=lr)
    x, y = _batch(model)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(net(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def test_syncdrop_masks_train_as_pytorch_hooks(root: SharedArtifacts) -> None:
    name, width = "feddrop-lenet", 0.5
    model = get_model(name)
    run = _run(root, name, width, "sgd")
    arch = model.arch(width)
    group_sizes = dict(zip(model.group_names, arch.sizes, strict=True))
    training = onnx.load(str(run.directory / "training_model.onnx"))
    optimizer = onnx.load(str(run.directory / "optimizer_model.onnx"))
    params = [(p["name"], p["shape"]) for p in run.manifest["parameters"]]
    groups = list(model.group_names)  # conv1..conv3 and fc1
    masked, signature = build_step_model(
        training, optimizer, params, mask_groups=groups, layouts=model.layouts, group_sizes=group_sizes
    )
    assert check_portable(masked) == []
    assert [t.name for t in signature.masks] == [mask_input(g) for g in groups]
    rng = np.random.default_rng(3)
    keep = 0.6
    masks = {g: np.where(rng.random(group_sizes[g]) < keep, 1.0 / keep, 0.0).astype(np.float32) for g in groups}
    session = onnxruntime.InferenceSession(masked.SerializeToString(), providers=["CPUExecutionProvider"])
    outputs = [o.name for o in session.get_outputs()]
    lr = LR["sgd"]
    x, y = _batch(model)
    feeds = {"input": x.numpy(), "labels": y.numpy(), "learning_rate": np.asarray([lr], np.float32)}
    feeds.update(run.initial)
    feeds.update({mask_input(g): m for g, m in masks.items()})
    losses = []
    for _ in range(3):
        out = dict(zip(outputs, session.run(None, feeds), strict=True))
        losses.append(float(out["loss"]))
        for a, b in signature.carry:
            feeds[a] = out[b]
    expected = _masked_torch_step(model, width, run.initial, masks, lr, 3)
    np.testing.assert_allclose(losses, expected, rtol=CURVE_RTOL)
    assert abs(losses[0] - run.losses["step"][0]) > 1e-3  # the masks changed the forward pass
    # All-ones masks are the unmasked model.
    feeds.update(run.initial)
    feeds.update({mask_input(g): np.ones(group_sizes[g], np.float32) for g in groups})
    out = dict(zip(outputs, session.run(None, feeds), strict=True))
    assert float(out["loss"]) == pytest.approx(run.losses["step"][0], rel=LOSS_RTOL)
    _assert_params_close({p: out[p + ".next"] for p in run.initial}, run.first["step"], 0.0, "all-ones masks")


def test_masks_need_a_conv_or_linear_producer(root: SharedArtifacts) -> None:
    model = get_model("fjord-rnn")
    width = WIDTHS.get("fjord-rnn", DEFAULT_WIDTHS)[0]
    run = _run(root, "fjord-rnn", width, "sgd")
    training = onnx.load(str(run.directory / "training_model.onnx"))
    optimizer = onnx.load(str(run.directory / "optimizer_model.onnx"))
    params = [(p["name"], p["shape"]) for p in run.manifest["parameters"]]
    group_sizes = dict(zip(model.group_names, model.arch(width).sizes, strict=True))
    with pytest.raises(LoweringError, match="lstm1"):
        build_step_model(
            training, optimizer, params, mask_groups=["lstm1"], layouts=model.layouts, group_sizes=group_sizes
        )


# --------------------------------------------------------------------------- users' deep BatchNorm models


#: Deep BatchNorm networks: every parameter after one SGD step within this fraction of the
#: largest step any parameter takes.
DEEP_STEP_FRACTION = 0.02


@pytest.mark.parametrize(("spec", "width"), [(MOBILENET_V2, 0.5), (RESNET18, 0.25)], ids=["mobilenet_v2", "resnet18"])
def test_a_deep_batchnorm_model_steps_as_the_training_build(root: SharedArtifacts, spec: str, width: float) -> None:
    """A channel that a ReLU6 leaves at zero for the whole batch has zero variance, and its
    BatchNorm gradient multiplies float32 rounding by ``1 / sqrt(eps)`` (about 316); MobileNetV2
    has such channels from its first step. So the parameters of one SGD step are compared
    against the largest step (``DEEP_STEP_FRACTION``), not element by element as the zoo's are
    (measured: within 0.5 % for MobileNetV2 x0.5 at width 0.5, 0.2 % for ResNet18 at 0.25).
    AdamW is left out: it divides every gradient element by its own magnitude, so an element
    whose gradient rounds to the other sign steps the other way."""
    run = _run(root, spec, width, "sgd")
    assert run.losses["step"][0] == pytest.approx(run.losses["ort"][0], rel=LOSS_RTOL)
    largest = max(float(np.abs(run.first["ort"][p] - run.initial[p]).max()) for p in run.initial)
    assert largest > 10 * PARAM_RTOL
    for name, ort in run.first["ort"].items():
        assert float(np.abs(run.first["step"][name] - ort).max()) <= DEEP_STEP_FRACTION * largest, name


def test_dropout_gradient_lowering_equals_the_training_kernel() -> None:
    from exporters.step_model import _Graph, _lower_dropout_grad

    rng = np.random.default_rng(3)
    feeds = {
        "dy": rng.standard_normal((4, 6)).astype(np.float32),
        "mask": rng.random((4, 6)) > 0.3,
        "ratio": np.asarray(0.3, dtype=np.float32),
    }
    inputs = [
        helper.make_tensor_value_info("dy", onnx.TensorProto.FLOAT, [4, 6]),
        helper.make_tensor_value_info("mask", onnx.TensorProto.BOOL, [4, 6]),
        helper.make_tensor_value_info("ratio", onnx.TensorProto.FLOAT, []),
    ]
    output = [helper.make_tensor_value_info("dx", onnx.TensorProto.FLOAT, [4, 6])]
    node = helper.make_node("DropoutGrad", ["dy", "mask", "ratio"], ["dx"], domain="com.microsoft", name="d")
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    kernel = helper.make_model(helper.make_graph([node], "k", inputs, output), opset_imports=opsets)
    g = _Graph({}, {}, {})
    _lower_dropout_grad(g, node)
    lowered = helper.make_model(
        helper.make_graph(g.nodes, "l", inputs, output, g.initializers), opset_imports=opsets[:1]
    )
    assert check_portable(lowered) == []
    want, got = (
        onnxruntime.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
        for m in (kernel, lowered)
    )
    np.testing.assert_allclose(got, want, rtol=1e-6)
    np.testing.assert_allclose(got, feeds["dy"] * feeds["mask"] / 0.7, rtol=1e-6)
