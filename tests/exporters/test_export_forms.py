"""Export forms compute exactly what the zoo modules compute, with the same parameters."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime
import pytest
import torch
from onnx import TensorProto, helper
from torch import nn

from exporters.export_forms import BatchStatisticsNorm, UnrolledLSTM, export_form, fuse_gradient_sums
from exporters.userinput import InputError
from exporters.zoo import get_model, model_names


@pytest.mark.parametrize("batch_first", [True, False])
@pytest.mark.parametrize("layers", [1, 2])
def test_unrolled_lstm_matches_nn_lstm_outputs_states_and_gradients(batch_first: bool, layers: int) -> None:
    torch.manual_seed(0)
    lstm = nn.LSTM(5, 7, num_layers=layers, batch_first=batch_first)
    unrolled = UnrolledLSTM(lstm)
    x = torch.randn((3, 6, 5) if batch_first else (6, 3, 5))
    out, (h, c) = lstm(x)
    out_u, (h_u, c_u) = unrolled(x)
    torch.testing.assert_close(out_u, out, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(h_u, h, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(c_u, c, rtol=1e-5, atol=1e-6)
    grads = torch.autograd.grad(out.square().sum(), list(lstm.parameters()))
    grads_u = torch.autograd.grad(out_u.square().sum(), list(unrolled.parameters()))
    for g, g_u in zip(grads, grads_u, strict=True):
        torch.testing.assert_close(g_u, g, rtol=1e-4, atol=1e-6)


def test_unrolled_lstm_shares_parameters_rather_than_copying() -> None:
    lstm = nn.LSTM(4, 3)
    unrolled = UnrolledLSTM(lstm)
    assert [n for n, _ in unrolled.named_parameters()] == [n for n, _ in lstm.named_parameters()]
    assert all(a is b for a, b in zip(unrolled.parameters(), lstm.parameters(), strict=True))


@pytest.mark.parametrize("kwargs", [{"bidirectional": True}, {"proj_size": 2}, {"bias": False}])
def test_unrolled_lstm_refuses_features_it_does_not_implement(kwargs: dict) -> None:
    with pytest.raises(InputError):
        UnrolledLSTM(nn.LSTM(4, 3, **kwargs))


@pytest.mark.parametrize("name", [n for n in model_names() if "lstm" in n or "rnn" in n])
def test_export_form_of_text_models_keeps_names_values_and_outputs(name: str) -> None:
    model = get_model(name)
    net = model.build(model.arch(0.5)).eval()
    form = export_form(net)
    assert form is not net
    assert not any(isinstance(m, nn.LSTM) for m in form.modules())
    assert [(n, p.shape) for n, p in form.named_parameters()] == [(n, p.shape) for n, p in net.named_parameters()]
    x, _ = model.example_batch(4)
    with torch.no_grad():
        torch.testing.assert_close(form(x), net(x), rtol=1e-5, atol=1e-6)


def test_export_form_of_a_model_without_lstm_is_the_module_itself() -> None:
    net = get_model("cfd-cnn").build()
    assert export_form(net) is net


# --------------------------------------------------------------------------- static BatchNorm


@pytest.mark.parametrize(("norm", "shape"), [(nn.BatchNorm2d, (3, 4, 5, 5)), (nn.BatchNorm1d, (3, 4))])
def test_batch_statistics_norm_is_static_batchnorm_with_its_gradients(norm: type, shape: tuple) -> None:
    torch.manual_seed(0)
    bn = norm(4, track_running_stats=False)
    with torch.no_grad():
        bn.weight.uniform_(0.5, 1.5)
        bn.bias.uniform_(-1.0, 1.0)
    form = BatchStatisticsNorm(bn)
    assert [(n, p) for n, p in form.named_parameters()] == [(n, p) for n, p in bn.named_parameters()]
    x = torch.randn(shape, requires_grad=True)
    y, y_form = bn(x), form(x)
    torch.testing.assert_close(y_form, y, rtol=0, atol=0)
    grads = torch.autograd.grad((y * y).sum(), [x, bn.weight, bn.bias])
    grads_form = torch.autograd.grad((y_form * y_form).sum(), [x, bn.weight, bn.bias])
    for g, g_form in zip(grads, grads_form, strict=True):
        torch.testing.assert_close(g_form, g, rtol=0, atol=0)


def test_batch_statistics_norm_refuses_running_statistics() -> None:
    with pytest.raises(InputError, match="running statistics"):
        BatchStatisticsNorm(nn.BatchNorm2d(4))


@pytest.mark.parametrize("name", ["fjord-resnet18", "heterofl-resnet18"])
def test_export_form_of_static_batchnorm_nets_keeps_names_values_and_outputs(name: str) -> None:
    model = get_model(name)
    net = model.build(model.arch(0.25)).train()
    form = export_form(net)
    assert form is not net
    assert not any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in form.modules())
    assert any(isinstance(m, BatchStatisticsNorm) for m in form.modules())
    assert [(n, p.shape) for n, p in form.named_parameters()] == [(n, p.shape) for n, p in net.named_parameters()]
    x, _ = model.example_batch(3)
    with torch.no_grad():
        torch.testing.assert_close(form(x), net(x), rtol=1e-5, atol=1e-6)


# --------------------------------------------------------------------------- fuse_gradient_sums


def _sum_of_products(
    terms: int, *, trans_a: int = 1, also_output: bool = False, first_b: list[int | str] | None = None
) -> onnx.ModelProto:
    """``Sum_i Gemm(A_i, B_i, transA)`` over ``(5, 3)`` and ``(5, 4)`` inputs, as autodiff writes it.

    ``first_b`` gives ``B_0`` another shape (one that broadcasts, or a symbolic one).
    """
    inputs, nodes = [], []
    for i in range(terms):
        inputs += [
            helper.make_tensor_value_info(f"a{i}", TensorProto.FLOAT, [5, 3] if trans_a else [3, 5]),
            helper.make_tensor_value_info(f"b{i}", TensorProto.FLOAT, first_b if first_b and i == 0 else [5, 4]),
        ]
        nodes.append(helper.make_node("Gemm", [f"a{i}", f"b{i}"], [f"p{i}"], f"gemm{i}", transA=trans_a, beta=0.0))
    nodes.append(helper.make_node("Sum", [f"p{i}" for i in range(terms)], ["total"], "sum"))
    outputs = [helper.make_tensor_value_info("total", TensorProto.FLOAT, [3, 4])]
    if also_output:
        outputs.append(helper.make_tensor_value_info("p0", TensorProto.FLOAT, [3, 4]))
    graph = helper.make_graph(nodes, "g", inputs, outputs)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _run(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> np.ndarray:
    session = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(["total"], feeds)[0]


def test_fuse_gradient_sums_computes_the_same_sum_with_one_product() -> None:
    model = _sum_of_products(6)
    rng = np.random.default_rng(0)
    feeds = {
        value.name: rng.standard_normal((5, 3) if value.name[0] == "a" else (5, 4)).astype(np.float32)
        for value in model.graph.input
    }
    want = _run(model, feeds)
    assert fuse_gradient_sums(model) == 1
    onnx.checker.check_model(model, full_check=True)
    assert [n.op_type for n in model.graph.node] == ["Concat", "Concat", "Gemm"]
    np.testing.assert_allclose(_run(model, feeds), want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(want, sum(feeds[f"a{i}"].T @ feeds[f"b{i}"] for i in range(6)), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    ("model", "why"),
    [
        (_sum_of_products(6, trans_a=0), "products without transA do not stack along the batch"),
        (_sum_of_products(6, also_output=True), "a product read elsewhere must stay"),
        (_sum_of_products(2), "two terms: fewer than min_terms"),
        (_sum_of_products(6, first_b=[5, 1]), "a (3, 1) term broadcasts in the Sum: no stacking"),
        (_sum_of_products(6, first_b=[5, "n"]), "a term of unknown shape might broadcast"),
    ],
)
def test_fuse_gradient_sums_leaves_what_it_cannot_rewrite(model: onnx.ModelProto, why: str) -> None:
    before = [n.op_type for n in model.graph.node]
    assert fuse_gradient_sums(model) == 0, why
    assert [n.op_type for n in model.graph.node] == before
