"""Export forms: the same maths, spelled so that ONNX Runtime trains it fast.

ONNX Runtime 1.19's CPU ``LSTMGrad`` kernel is slow: on the FedDrop Shakespeare
LSTM (batch 20, 80 steps, 128 hidden units, 2 threads) it took 90 % of a
training step, about 30 ms against 2 ms for the forward ``LSTMTraining`` kernel,
and made ORT 3-6x slower than PyTorch. `UnrolledLSTM` computes what
``torch.nn.LSTM`` computes with one matrix product for the input projection of
all time steps and, per step, one matrix product plus element-wise gates, so the
exported graph differentiates through ``MatMul``/``Gemm`` and element-wise
kernels instead.

`export_form(module)` returns a deep copy of a module with every ``nn.LSTM``
replaced by its `UnrolledLSTM` and every static BatchNorm by its
`BatchStatisticsNorm`; parameter names and values are unchanged, so the
artifacts' parameters are exactly the zoo module's. PyTorch training keeps the
native modules (the fused LSTM kernel is the fast path there).

Variable batch: the graphs are exported with a batch dimension that each step
gives, so an epoch's short last batch trains as in PyTorch. Both forms export
without the batch size: the LSTM's zero states are shaped from the input, and
`BatchStatisticsNorm` computes the batch mean and variance itself, where the
exporter's own static BatchNorm reshapes by a constant batch size.

`fuse_gradient_sums(model)` rewrites ORT's training graph where autodiff leaves
a weight used at every time step: the recurrent weight's gradient comes out as
one ``Gemm`` per step (``h_{t-1}^T @ dG_t``, an ``H x 4H`` product over the
batch) and a ``Sum`` of all of them, so 80 full-size products are written, kept
alive together and read back. The pass replaces them with one ``Gemm`` of the
time steps stacked along the batch axis (``Concat(h)^T @ Concat(dG)``), the same
sum in one product: on the zoo's LSTMs the unfused step took up to 1.34x the
fused one, more the wider the model (``tox -e bench -- --only fusion`` measures
it). What it removes grew faster than the square of the
width (likely: the 80 products no longer stay in cache between their writing and
the ``Sum``) and bent the latency curve up at the wide end.
"""

from __future__ import annotations

import copy
from collections import Counter
from typing import TYPE_CHECKING

import torch
from torch import nn

from exporters.userinput import InputError

if TYPE_CHECKING:
    import onnx


class UnrolledLSTM(nn.Module):
    """A unidirectional, biased ``nn.LSTM`` unrolled over time, same parameters.

    Parameters
    ----------
    lstm : torch.nn.LSTM
        The module to mirror; its parameters are shared, not copied.

    Raises
    ------
    InputError
        For LSTM features the zoo does not use (bidirectional, projections,
        no bias, dropout between layers).
    """

    def __init__(self, lstm: nn.LSTM) -> None:
        super().__init__()
        if lstm.bidirectional or lstm.proj_size or not lstm.bias or lstm.dropout:
            raise InputError("UnrolledLSTM supports unidirectional LSTMs with biases, no projection, no dropout")
        self.hidden_size = lstm.hidden_size
        self.num_layers = lstm.num_layers
        self.batch_first = lstm.batch_first
        for name, param in lstm.named_parameters():
            self.register_parameter(name, param)

    def forward(
        self, x: torch.Tensor, hx: tuple[torch.Tensor, torch.Tensor] | None = None
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        """Run the LSTM from zero state; same outputs as ``nn.LSTM.forward``.

        Parameters
        ----------
        x : torch.Tensor
            ``(N, T, I)`` when ``batch_first`` else ``(T, N, I)``.
        hx : None
            Initial states are not supported (the zoo starts from zeros).

        Returns
        -------
        output : torch.Tensor
            Last layer's hidden states, ``(N, T, H)`` or ``(T, N, H)``.
        (h_n, c_n) : tuple of torch.Tensor
            Final hidden and cell states, ``(num_layers, N, H)`` each.
        """
        if hx is not None:
            raise InputError("UnrolledLSTM starts from zero state; hx is not supported")
        seq = x if self.batch_first else x.transpose(0, 1)  # (N, T, I)
        hidden = self.hidden_size
        finals_h, finals_c = [], []
        for layer in range(self.num_layers):
            w_ih = getattr(self, f"weight_ih_l{layer}")  # (4H, I), gate blocks i, f, g, o
            w_hh = getattr(self, f"weight_hh_l{layer}")  # (4H, H)
            bias = getattr(self, f"bias_ih_l{layer}") + getattr(self, f"bias_hh_l{layer}")
            projected = torch.matmul(seq, w_ih.t()) + bias  # (N, T, 4H), all steps at once
            w_hh_t = w_hh.t()  # (H, 4H)
            # The zero state is no tensor: the first step's gates are its input projection (adding
            # h0 @ W_hh = 0 gives the same floats) and its cell is f * 0 + i * g (f stays in the
            # graph: ORT's Split gradient cannot leave out an output nobody reads). So nothing is
            # shaped from the batch's size, and the exported shapes all carry the input's batch
            # dimension, which ONNX Runtime's MatMul + Add -> Gemm fusion must match on a variable
            # batch (measured: LSTM steps 1.1-1.25x slower without the fusion).
            h: torch.Tensor | None = None
            c: torch.Tensor | None = None
            outputs = []
            # unbind and split by a size export as one Split each, whose gradient is one Concat;
            # indexing and slicing would export as Slice per step, whose gradients are full-size
            # tensors (and chunk as Slices at positions computed from the batch's shape).
            for step_input in projected.unbind(1):  # T tensors of (N, 4H)
                gates = step_input if h is None else step_input + torch.matmul(h, w_hh_t)
                i, f, g, o = gates.split(hidden, 1)  # 4 x (N, H)
                cell = torch.sigmoid(i) * torch.tanh(g)
                c = torch.sigmoid(f) * (0.0 if c is None else c) + cell
                h = torch.sigmoid(o) * torch.tanh(c)
                outputs.append(h)
            assert h is not None and c is not None  # T >= 1
            seq = torch.stack(outputs, dim=1)  # (N, T, H)
            finals_h.append(h)
            finals_c.append(c)
        output = seq if self.batch_first else seq.transpose(0, 1)
        return output, (torch.stack(finals_h), torch.stack(finals_c))


class BatchStatisticsNorm(nn.Module):
    """A static BatchNorm (batch statistics, no running ones) that exports for any batch size.

    ``torch.onnx.export`` exports a BatchNorm without running statistics by reshaping its
    input to a constant ``(batch, channels, -1)`` to take the statistics, so the graph holds
    one batch size. This module takes the batch mean and biased variance itself
    (``ReduceMean`` nodes, as the exporter's) and gives them to a training-mode
    ``BatchNormalization`` as its running-statistics inputs: the node normalises with the
    batch's own statistics, whatever the batch size.

    Parameters
    ----------
    norm : torch.nn.modules.batchnorm._BatchNorm
        The module to mirror (``track_running_stats=False``); its affine parameters are
        shared, not copied.

    Raises
    ------
    InputError
        For a BatchNorm that keeps running statistics.
    """

    def __init__(self, norm: nn.modules.batchnorm._BatchNorm) -> None:
        super().__init__()
        if norm.track_running_stats:
            raise InputError("BatchStatisticsNorm mirrors BatchNorm without running statistics only")
        self.eps = norm.eps
        self.weight = norm.weight
        self.bias = norm.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Normalise ``x`` ``(N, C, ...)`` per channel with the batch's mean and biased variance."""
        axes = [0, *range(2, x.dim())]
        mean = x.mean(dim=axes)
        centred = x - mean.reshape([1, -1] + [1] * (x.dim() - 2))
        var = (centred * centred).mean(dim=axes)
        return nn.functional.batch_norm(
            x, mean.detach(), var.detach(), self.weight, self.bias, training=True, momentum=0.0, eps=self.eps
        )


def _export_module(child: nn.Module) -> nn.Module | None:
    """Return the export form of one module, or None when it exports as it is."""
    if isinstance(child, nn.LSTM):
        return UnrolledLSTM(child)
    if isinstance(child, nn.modules.batchnorm._BatchNorm) and not child.track_running_stats:
        return BatchStatisticsNorm(child)
    return None


def export_form(module: nn.Module) -> nn.Module:
    """Return a copy of ``module`` with every ``nn.LSTM`` and static BatchNorm in its export form.

    Parameters
    ----------
    module : torch.nn.Module
        A zoo module.

    Returns
    -------
    torch.nn.Module
        ``module`` itself when it holds neither, else a deep copy whose LSTMs are
        `UnrolledLSTM` and whose BatchNorms without running statistics are
        `BatchStatisticsNorm`; ``named_parameters()`` yields the same names and values.
    """
    if all(_export_module(m) is None for m in module.modules()):
        return module
    clone = copy.deepcopy(module)
    for parent in list(clone.modules()):
        for name, child in list(parent.named_children()):
            replacement = _export_module(child)
            if replacement is not None:
                setattr(parent, name, replacement)
    return clone


def _attributes(node: onnx.NodeProto) -> dict[str, object]:
    from onnx import helper

    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def _is_transposed_product(node: onnx.NodeProto | None) -> bool:
    """Whether ``node`` is ``Gemm(A, B)`` computing exactly ``A^T @ B`` (no scaling, no bias)."""
    if node is None or node.op_type != "Gemm" or len(node.input) != 2:
        return False
    attrs = _attributes(node)
    return (
        attrs.get("transA") == 1
        and attrs.get("transB", 0) == 0
        and attrs.get("alpha", 1.0) == 1.0
        and attrs.get("beta", 1.0) in (0.0, 1.0)  # beta scales C, and there is no C
    )


def _static_shapes(model: onnx.ModelProto) -> dict[str, tuple[int, ...]]:
    """Shapes of the tensors whose every dimension ONNX shape inference knows as a number."""
    from onnx import shape_inference

    inferred = shape_inference.infer_shapes(model)
    found: dict[str, tuple[int, ...]] = {}
    for value in (*inferred.graph.value_info, *inferred.graph.output, *inferred.graph.input):
        dims = value.type.tensor_type.shape.dim
        if value.type.tensor_type.HasField("shape") and all(d.HasField("dim_value") for d in dims):
            found[value.name] = tuple(d.dim_value for d in dims)
    return found


def fuse_gradient_sums(model: onnx.ModelProto, min_terms: int = 3) -> int:
    """Replace each ``Sum`` of ``A_i^T @ B_i`` products by one product of the stacked operands (in place).

    ``sum_i A_i^T B_i = [A_1; ...; A_n]^T [B_1; ...; B_n]`` when every ``A_i`` has
    the same columns and every ``B_i`` the same columns: a ``Concat`` of each side
    along axis 0 and one ``Gemm(transA=1)`` whose output keeps the ``Sum``'s name.
    Only products read by nothing but the ``Sum`` (and not graph outputs) are
    taken, so the rest of the graph sees the same tensors; a ``Sum`` whose terms
    ONNX shape inference does not give one static shape (it would broadcast) is left.

    Parameters
    ----------
    model : onnx.ModelProto
        A training graph (`onnxruntime.training.artifacts.generate_artifacts`).
    min_terms : int
        Fewest products a ``Sum`` must add to be rewritten.

    Returns
    -------
    int
        ``Sum`` nodes rewritten.
    """
    from onnx import helper

    graph = model.graph
    producer = {name: node for node in graph.node for name in node.output}
    readers = Counter(name for node in graph.node for name in node.input)
    outputs = {value.name for value in graph.output}
    shapes: dict[str, tuple[int, ...]] | None = None
    replaced: dict[int, list[onnx.NodeProto]] = {}
    dropped: set[int] = set()
    for node in graph.node:
        if node.op_type != "Sum" or len(node.input) < min_terms:
            continue
        terms = [producer.get(name) for name in node.input]
        if not all(
            _is_transposed_product(term) and readers[name] == 1 and name not in outputs
            for term, name in zip(terms, node.input, strict=True)
        ):
            continue
        if shapes is None:
            shapes = _static_shapes(model)
        # A Sum broadcasts; the stacked product needs every term of one known shape.
        if len({shapes.get(name) for name in node.input}) != 1 or node.input[0] not in shapes:
            continue
        total = node.output[0]
        stacked = [f"{total}_stacked_{side}" for side in ("a", "b")]
        replaced[id(node)] = [
            helper.make_node("Concat", [t.input[0] for t in terms if t], [stacked[0]], f"{total}_stack_a", axis=0),
            helper.make_node("Concat", [t.input[1] for t in terms if t], [stacked[1]], f"{total}_stack_b", axis=0),
            helper.make_node("Gemm", stacked, [total], f"{total}_stacked", transA=1),
        ]
        dropped.update(id(term) for term in terms)
    if not replaced:
        return 0
    # The Sum comes after every product and so after every operand: its place keeps the order topological.
    nodes = [new for node in graph.node if id(node) not in dropped for new in replaced.get(id(node), [node])]
    del graph.node[:]
    graph.node.extend(nodes)
    return len(replaced)
