"""The portable step model: one whole training step in default-domain ONNX operators.

onnxruntime-training (the ``ort`` backend) ships x86_64 wheels only, and its training
graphs use kernels that only the training build has (``ConvGrad``, ``ReluGrad``,
``InPlaceAccumulatorV2``, ``AdamWOptimizer``, ...). `build_step_model` turns an artifact
set's training and optimizer graphs into ``step_model.onnx``: a single graph

    (input, labels, learning_rate, [step], parameters, optimizer state, [masks])
        -> (loss, updated parameters, updated optimizer state)

made of operators of the default ONNX domain that the plain ``onnxruntime`` package
(1.19) implements, so the same training step runs on aarch64 boards and phones.

Decisions
---------
* **Route: lower ORT's own graphs**, one standard-op subgraph per non-standard node,
  rather than building a backward pass per layer type from the forward graph. ORT's
  autodiff stays the single source of truth for the gradient, so the portable model
  trains exactly what the ``ort`` backend trains (same graph, same node order, same
  parameter order), and a model added to the zoo needs new code here only if its
  gradient graph uses an operator that no lowering covers yet (the error names it).
  A second autodiff would be a second place for gradient bugs.
* **Lowerings** (`LOWERINGS`; every non-standard operator of every zoo model, both
  optimizers; `check_portable` rejects anything else):

  ===============================  ==========================================================
  ``ConvGrad``                     dX: ``ConvTranspose`` (``output_padding`` recovers the
                                   input size); dW: ``Gemm`` of dY by an im2col of the padded
                                   input built from strided ``Slice`` windows, a chunk of
                                   kernel offsets per ``Gemm`` (`_conv_weight_grad`); dB:
                                   ``ReduceSum``
  ``ReluGrad``                     ``dY * Cast(X > 0)``
  ``MaxPoolGrad``                  ``ScatterElements`` of dY at the forward ``MaxPool``'s flat
                                   indices into zeros (``reduction=add`` when windows overlap)
  ``AveragePoolGrad``              ``ConvTranspose`` of dY (one channel) by a ``1/k`` kernel
  ``SoftmaxCrossEntropyLossGrad``  ``(Exp(log_prob) - OneHot(labels)) * dLoss / N``
  ``BatchNormInternal``            inference-mode ``BatchNormalization`` fed with the batch
                                   mean and biased variance that the exported static
                                   BatchNorm already computes (``ReduceMean`` nodes), plus
                                   ``1 / Sqrt(var + eps)`` for the gradient
  ``BatchNormalizationGrad``       the closed form ``scale * inv_std / M * (M dY - sum dY -
                                   xhat * sum(dY xhat))`` in element-wise ops and ``ReduceSum``
  ``Scale``                        ``Mul`` / ``Div`` by the scale
  ``SigmoidGrad``, ``TanhGrad``    ``dY * Y * (1 - Y)``, ``dY * (1 - Y * Y)``; in an unrolled
                                   recurrence the slopes of all time steps at once from the
                                   forward activations, then one ``Mul`` per step
                                   (`_fuse_activation_grads`)
  ``FusedMatMul``                  ``Gemm`` (2-D) or ``Transpose`` + ``MatMul``, times alpha
  ``ConcatTraining``               ``Concat`` (its lengths output becomes a constant)
  ``SplitTraining``                ``Split``
  ``GatherGrad``                   ``ScatterElements(reduction=add)`` into zeros; one constant
                                   position of a tensor with a variable batch: ``Pad`` of dY
  ``InPlaceAccumulatorV2``         dropped: the gradient goes straight to the optimizer
  ``SGDOptimizerV2``               ``p - lr * g``
  ``AdamWOptimizer``               ORT's kernel, spelled out (`_adamw_update`)
  ===============================  ==========================================================

* **Same rounding where it is free.** The optimizer lowerings repeat the kernels' float32
  operation order (AdamW: bias corrections from a float64 ``Pow`` of the float32 betas,
  cast to float32, as ``std::pow(float, int64)`` does), so SGD is bit-identical to the
  training build given the same gradient and AdamW agrees to the last bits. The gradient
  lowerings reorder float32 sums (a ``ConvTranspose`` instead of ``ConvGrad``'s col2im),
  so the step differs from the training build's by float32 rounding only.
* **Variable batch.** ``input`` and ``labels`` keep the training graph's named batch
  dimension, and no lowering builds the batch size into a constant: reshapes take ``-1``,
  and the counts and zero tensors that depend on it (the mean of the loss gradient, the
  BatchNorm gradient's ``M``, the pools' and gathers' scatter targets) are computed from
  the step's tensors (``Shape``, ``Size``, ``ConstantOfShape``) when they are not static.
  Tensors keep the batch dimension's name where ONNX shape inference can follow it (no
  ``Concat`` along the batch, no zeros shaped at run time on the LSTM's path): ONNX
  Runtime fuses ``MatMul`` + ``Add`` and ``Gemm`` + ``Sum`` only where the shapes match, and
  the step model optimises to the same compute nodes as with the batch fixed. The same
  lowerings replace the training build's `FIXED_SHAPE_KERNELS` in the training graph itself
  (`lower_fixed_shape_kernels`).
* **Interface.** Inputs are named after the training graph: ``input``, ``labels``, every
  parameter by its manifest name, ``learning_rate`` (float32 ``[1]``), and for AdamW
  ``step`` (int64 ``[1]``: steps already taken, 0 at the start; the update uses
  ``step + 1``, as ORT's ``Optimizer.step`` does) and ``<param>.exp_avg`` /
  ``<param>.exp_avg_sq`` (zeros at the start). Every carried input ``X`` has an output
  ``X.next`` of the same shape and dtype; `StepSignature.carry` pairs them, parameters
  first in manifest order, so a runner ping-pongs two sets of buffers without knowing the
  optimizer. The loss output is ``loss`` (float32 scalar).
* **Masks (FedDrop's SyncDrop).** ``mask_groups`` adds one float32 input ``mask.<group>``
  of the group's width per named neuron group: the multiplier ``d / p`` (0 for a dropped
  channel, ``1/p`` for a kept one) applied to the output of the conv / linear node that
  produces the group, exactly where `fl.strategies.feddrop`'s forward hook applies it; the
  backward pass multiplies that node's incoming gradient by the same mask. Only groups
  produced by a ``Conv`` or ``Gemm`` can be masked (an LSTM's hidden units are not: their
  mask also zeroes the cell state at every step). The exported set's step model has no
  masks; a masked variant is `build_step_model` with ``mask_groups``.
* **Initial parameters** travel as ``initial_parameters.npy`` (the flat float32 wire
  format of the runner, manifest order) because the plain runtime cannot read ORT's
  ``checkpoint``; keeping them out of the graph (no overridable initializers) keeps the
  device from holding the parameters twice.
* **Speed** (measured against the training build, see ``tests/bench``): where two spellings
  are exact, the faster one is used. ``ReluGrad`` as ``Greater``/``Cast``/``Mul`` runs 7x
  faster than ORT's own ``ReluGrad`` kernel and than ``Where`` (both take a slow
  broadcasting path); the weight gradient's chunked im2col GEMMs run at 1.0-1.6x
  ``ConvGrad``'s, where a ``Conv`` of transposed tensors ran at up to 4x; non-overlapping
  pools scatter without reduction; an LSTM step's gate gradients are one block. The
  optimizer update is element-wise ONNX operators (12 passes over the parameters for AdamW
  against the kernel's 3 fused loops), but they run on every intra-op thread where ORT's
  AdamW kernel is single-threaded.
* **Graph optimisation** is left to the runtime (``ORT_ENABLE_ALL`` in the runner): the
  training build's session optimises its training graph hardly at all (measured: only
  ``Identity`` and ``Shape`` removed), the step model gets the inference optimisations,
  and disabling them made it up to 1.6x slower. The graph is exported unoptimised so that
  it stays portable across ORT versions and execution providers; nodes that no output needs
  (running statistics, unused shapes) are removed here.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

#: File names inside an artifact set.
STEP_MODEL = "step_model.onnx"
INITIAL_PARAMETERS = "initial_parameters.npy"

#: ONNX opset and IR version of the step model (ScatterElements with reduction needs 16+;
#: onnxruntime 1.19 loads IR <= 10).
STEP_OPSET = 17
STEP_IR_VERSION = 8

#: Graph input / output names of the step model.
INPUT = "input"
LABELS = "labels"
LEARNING_RATE = "learning_rate"
STEP = "step"
LOSS = "loss"
NEXT_SUFFIX = ".next"
MASK_PREFIX = "mask."

#: Optimizer state per parameter, by optimizer (suffixes of the parameter name).
STATE_SLOTS: dict[str, tuple[str, ...]] = {"sgd": (), "adamw": (".exp_avg", ".exp_avg_sq")}

#: Target width of the im2col GEMMs of a conv's weight gradient (see `_conv_weight_grad`).
DW_GEMM_WIDTH = 32

#: Operator domains that count as the default ONNX domain.
DEFAULT_DOMAINS = ("", "ai.onnx")

_FLOAT = 1  # onnx.TensorProto.FLOAT
_INT64 = 7  # onnx.TensorProto.INT64
_DOUBLE = 11  # onnx.TensorProto.DOUBLE


class LoweringError(RuntimeError):
    """A training or optimizer graph holds something no lowering covers (a bug, not bad input)."""


#: A tensor's shape while lowering: a number per dimension, None where it is the batch's (or
#: otherwise known only when the step runs).
Shape = tuple[int | None, ...]


# --------------------------------------------------------------------------- interface


@dataclass(frozen=True)
class TensorSpec:
    """Name, shape and dtype of one graph input or output.

    Attributes
    ----------
    name : str
    shape : tuple of int or str
        A dimension is a number, or the name of a dimension whose size each run gives
        (the batch's, ``"batch"``, on the inputs ``input`` and ``labels``).
    dtype : str
        numpy dtype name (``"float32"``, ``"int64"``).
    """

    name: str
    shape: tuple[int | str, ...]
    dtype: str

    def to_json(self) -> dict[str, Any]:
        """Return the manifest form ``{"name", "shape", "dtype"}``."""
        return {"name": self.name, "shape": list(self.shape), "dtype": self.dtype}


@dataclass(frozen=True)
class StepSignature:
    """The inputs and outputs of a step model, and which output feeds which input next step.

    Attributes
    ----------
    optimizer : {"sgd", "adamw"}
    parameters : tuple of TensorSpec
        The trainable parameters in manifest (flat buffer) order.
    batch : tuple of TensorSpec
        ``input`` and ``labels``.
    masks : tuple of TensorSpec
        ``mask.<group>`` inputs (empty for the exported model).
    """

    optimizer: str
    parameters: tuple[TensorSpec, ...]
    batch: tuple[TensorSpec, ...]
    masks: tuple[TensorSpec, ...] = field(default=())

    @property
    def state(self) -> tuple[TensorSpec, ...]:
        """Optimizer state inputs: per-parameter slots in parameter order, then ``step``."""
        slots = STATE_SLOTS[self.optimizer]
        out = [TensorSpec(p.name + s, p.shape, "float32") for s in slots for p in self.parameters]
        if self.optimizer == "adamw":
            out.append(TensorSpec(STEP, (1,), "int64"))
        return tuple(out)

    @property
    def carried(self) -> tuple[TensorSpec, ...]:
        """Every input that the step updates: parameters, then optimizer state."""
        return (*self.parameters, *self.state)

    @property
    def carry(self) -> tuple[tuple[str, str], ...]:
        """``(input, output)`` name pairs: the output of one step is the input of the next."""
        return tuple((t.name, t.name + NEXT_SUFFIX) for t in self.carried)

    @property
    def inputs(self) -> tuple[TensorSpec, ...]:
        """Graph inputs in order: batch, learning rate, carried tensors, masks."""
        return (*self.batch, TensorSpec(LEARNING_RATE, (1,), "float32"), *self.carried, *self.masks)

    @property
    def outputs(self) -> tuple[TensorSpec, ...]:
        """Graph outputs in order: loss, then ``X.next`` for every carried ``X``."""
        return (
            TensorSpec(LOSS, (), "float32"),
            *(TensorSpec(t.name + NEXT_SUFFIX, t.shape, t.dtype) for t in self.carried),
        )

    def to_json(self) -> dict[str, Any]:
        """Return the manifest section describing this signature (read by the runner).

        Returns
        -------
        dict
            ``inputs`` and ``outputs`` (name, shape, dtype, in graph order), ``carry``
            (input/output pairs, parameters first), ``parameters`` (names), ``batch``,
            ``learning_rate``, ``loss`` and ``masks`` (input names).
        """
        return {
            "optimizer": self.optimizer,
            "inputs": [t.to_json() for t in self.inputs],
            "outputs": [t.to_json() for t in self.outputs],
            "carry": [list(pair) for pair in self.carry],
            "parameters": [p.name for p in self.parameters],
            "batch": [t.name for t in self.batch],
            "learning_rate": LEARNING_RATE,
            "loss": LOSS,
            "masks": [t.name for t in self.masks],
        }


def mask_input(group: str) -> str:
    """Return the graph input name of neuron group ``group``'s SyncDrop multiplier.

    Parameters
    ----------
    group : str

    Returns
    -------
    str
    """
    return MASK_PREFIX + group


# --------------------------------------------------------------------------- graph builder


class _Graph:
    """Collects the nodes and constants of the step graph while lowering."""

    def __init__(
        self,
        shapes: Mapping[str, Shape],
        producers: Mapping[str, Any],
        constants: Mapping[str, np.ndarray],
        initializers: Sequence[Any] = (),
    ) -> None:
        self.nodes: list[Any] = []
        self.constants = dict(constants)
        self.initializers: list[Any] = list(initializers)
        self.shapes = dict(shapes)
        self.producers = dict(producers)
        self._names: set[str] = set(shapes) | set(producers) | {i.name for i in initializers}
        self._counter = 0

    def fresh(self, hint: str) -> str:
        """Return a tensor name not used anywhere in the graph yet."""
        while True:
            self._counter += 1
            name = f"{hint}/step{self._counter}"
            if name not in self._names:
                self._names.add(name)
                return name

    def const(self, hint: str, value: np.ndarray, *, name: str | None = None) -> str:
        """Add an initializer (named ``name``, else a fresh name from ``hint``) and return its name."""
        from onnx import numpy_helper

        name = name or self.fresh(hint)
        self.initializers.append(numpy_helper.from_array(np.asarray(value), name))
        self.shapes[name] = tuple(np.asarray(value).shape)
        return name

    def op(
        self,
        op_type: str,
        inputs: Sequence[str],
        hint: str,
        *,
        outputs: Sequence[str] | None = None,
        count: int = 1,
        **attrs: Any,
    ) -> list[str]:
        """Append a default-domain node; return its output names (fresh ones unless given)."""
        from onnx import helper

        outs = list(outputs) if outputs is not None else [self.fresh(f"{hint}/{op_type}") for _ in range(count)]
        self.nodes.append(helper.make_node(op_type, list(inputs), outs, name=self.fresh(f"{hint}/{op_type}"), **attrs))
        return outs

    def one(self, op_type: str, inputs: Sequence[str], hint: str, *, output: str | None = None, **attrs: Any) -> str:
        """Append a single-output node and return its output name."""
        return self.op(op_type, inputs, hint, outputs=None if output is None else [output], **attrs)[0]

    def shape(self, name: str, node: Any) -> Shape:
        """Return the shape of ``name`` (None for a dimension known only when the step runs).

        A gradient ``T_grad`` (ORT's naming) has the shape of ``T`` where inference stopped
        at a non-standard node, or knew fewer of its dimensions. Fails naming the node that
        needs the shape when not even the rank is known.
        """
        own = self.shapes.get(name)
        forward = self.shapes.get(name[: -len("_grad")]) if name.endswith("_grad") else None
        if own is not None and forward is not None and len(own) == len(forward):
            return tuple(o if o is not None else f for o, f in zip(own, forward, strict=True))
        if own is not None or forward is not None:
            return own if own is not None else forward  # type: ignore[return-value]
        raise LoweringError(f"{node.op_type} {node.name!r}: no shape for {name!r}")

    def sizes(self, name: str, node: Any, axes: Iterable[int]) -> list[int]:
        """Return the sizes of ``name`` along ``axes``, which must be known before the step runs.

        Raises
        ------
        LoweringError
            When one of them varies from step to step (the batch), naming the node.
        """
        shape = self.shape(name, node)
        out = []
        for axis in axes:
            size = shape[axis]
            if size is None:
                raise LoweringError(f"{node.op_type} {node.name!r}: dimension {axis} of {name!r} is not static")
            out.append(size)
        return out


def _attrs(node: Any) -> dict[str, Any]:
    from onnx import helper

    out = {}
    for a in node.attribute:
        value = helper.get_attribute_value(a)
        out[a.name] = value.decode() if isinstance(value, bytes) else value
    return out


def _out(node: Any, index: int) -> str:
    """Return the node's output name at ``index``, or "" when absent."""
    return node.output[index] if len(node.output) > index else ""


# --------------------------------------------------------------------------- lowerings

Lowering = Callable[[_Graph, Any], None]


def _spatial(attrs: Mapping[str, Any], key: str, rank: int, default: int) -> list[int]:
    value = attrs.get(key)
    return [default] * rank if value is None else [int(v) for v in value]


def _conv_attrs(
    g: _Graph, node: Any, weight_shape: tuple[int, ...]
) -> tuple[list[int], list[int], list[int], list[int]]:
    attrs = _attrs(node)
    if attrs.get("auto_pad", "NOTSET") != "NOTSET":
        raise LoweringError(f"{node.op_type} {node.name!r}: auto_pad {attrs['auto_pad']!r} is not lowered")
    kernel = list(attrs.get("kernel_shape") or weight_shape[2:])
    rank = len(kernel)
    return (
        kernel,
        _spatial(attrs, "strides", rank, 1),
        _spatial(attrs, "pads", 2 * rank, 0),
        _spatial(attrs, "dilations", rank, 1),
    )


def _lower_conv_grad(g: _Graph, node: Any) -> None:
    d_y, x, w = node.input[:3]
    w_shape = tuple(g.sizes(w, node, range(len(g.shape(w, node)))))
    kernel, strides, pads, dilations = _conv_attrs(g, node, w_shape)
    group = int(_attrs(node).get("group", 1))
    rank = len(kernel)
    # Channels and spatial sizes, (C, *spatial); the batch (axis 0) may vary from step to step.
    x_shape = g.sizes(x, node, range(1, 2 + rank))
    y_shape = g.sizes(d_y, node, range(1, 2 + rank))
    hint = node.name
    d_x, d_w, d_b = _out(node, 0), _out(node, 1), _out(node, 2)
    if d_x:
        extra = [
            x_shape[1 + i]
            + pads[i]
            + pads[rank + i]
            - ((y_shape[1 + i] - 1) * strides[i] + (kernel[i] - 1) * dilations[i] + 1)
            for i in range(rank)
        ]
        g.op(
            "ConvTranspose",
            [d_y, w],
            hint,
            outputs=[d_x],
            strides=strides,
            pads=pads,
            dilations=dilations,
            group=group,
            kernel_shape=kernel,
            output_padding=extra,
        )
    if d_w and group != 1:
        _grouped_conv_weight_grad(g, hint, d_y, x, d_w, group, x_shape, y_shape, kernel, strides, pads, dilations)
    elif d_w:
        _conv_weight_grad(g, hint, d_y, x, d_w, x_shape, y_shape, kernel, strides, pads, dilations)
    if d_b:
        axes = g.const(hint + "/axes", np.asarray([0, *range(2, 2 + rank)], dtype=np.int64))
        g.op("ReduceSum", [d_y, axes], hint, outputs=[d_b], keepdims=0)


def _conv_weight_grad(
    g: _Graph,
    hint: str,
    d_y: str,
    x: str,
    d_w: str,
    x_shape: Sequence[int],
    y_shape: Sequence[int],
    kernel: Sequence[int],
    strides: Sequence[int],
    pads: Sequence[int],
    dilations: Sequence[int],
) -> None:
    """DW = dY (O, N*P) @ im2col(X) (C*K, N*P)^T, taken a chunk of kernel offsets at a time.

    The window that kernel offset ``k`` sees is a strided ``Slice`` of the padded,
    (C, N, H, W)-transposed input; the windows of a chunk of offsets are stacked into a
    (C * chunk, N*P) im2col block and multiplied by dY in one ``Gemm``. Chunks hold
    ``ceil(DW_GEMM_WIDTH / C)`` offsets, so a layer with few input channels still gets a
    GEMM at least that wide (its im2col is small), and a wide layer gets one ``Gemm`` per
    offset with no stacking copy and no kh*kw-times-larger buffer. Measured (20 images,
    1 thread) at 1.0-1.6x ORT's ``ConvGrad`` weight gradient, against 1.5-4x for a ``Conv``
    of the transposed tensors (whose GEMM is only kh*kw columns wide) and up to 9x for one
    ``Gemm`` per offset on a one-channel input. ``x_shape`` and ``y_shape`` are the
    (channels, *spatial) of X and dY; the batch N may vary from step to step.
    """
    rank = len(kernel)
    c = x_shape[0]
    out_channels = y_shape[0]
    count = -1  # N * P, whatever the step's N
    dy_t = g.one("Transpose", [d_y], hint, perm=[1, 0, *range(2, 2 + rank)])  # (O, N, *spatial_out)
    a = g.one("Reshape", [dy_t, _i64(g, hint, [out_channels, count])], hint)
    second = _i64(g, hint, [1])
    windows = _conv_windows(g, hint, x, y_shape[1:], kernel, strides, pads, dilations)  # each (C, N, *spatial_out)
    chunk = max(1, -(-DW_GEMM_WIDTH // c))
    blocks = []
    for _ in range(0, math.prod(kernel), chunk):
        part = list(itertools.islice(windows, chunk))
        size = len(part)
        if size > 1:
            stacked = g.one("Concat", [g.one("Unsqueeze", [w, second], hint) for w in part], hint, axis=1)
        else:
            stacked = part[0]  # (C, size, N, *spatial_out)
        columns = g.one("Reshape", [stacked, _i64(g, hint, [c * size, count])], hint)
        product = g.one("Gemm", [a, columns], hint, transB=1)  # (O, C * size)
        blocks.append(g.one("Reshape", [product, _i64(g, hint, [out_channels, c, size])], hint))
    joined = g.one("Concat", blocks, hint, axis=2) if len(blocks) > 1 else blocks[0]  # (O, C, prod(kernel))
    g.op("Reshape", [joined, _i64(g, hint, [out_channels, c, *kernel])], hint, outputs=[d_w])


def _conv_windows(
    g: _Graph,
    hint: str,
    x: str,
    y_spatial: Sequence[int],
    kernel: Sequence[int],
    strides: Sequence[int],
    pads: Sequence[int],
    dilations: Sequence[int],
) -> Iterator[str]:
    """Yield, per kernel offset, the (C, N, *spatial_out) window of X that the offset sees.

    Lazily: a caller that consumes a few windows at a time adds each window's ``Slice`` next
    to the product that reads it, so the windows need not all be alive at once.
    """
    rank = len(kernel)
    x_t = g.one("Transpose", [x], hint, perm=[1, 0, *range(2, 2 + rank)])  # (C, N, *spatial)
    if any(pads):
        padding = g.const(hint + "/pads", np.asarray([0, 0, *pads[:rank], 0, 0, *pads[rank:]], dtype=np.int64))
        x_t = g.one("Pad", [x_t, padding], hint)
    axes = _i64(g, hint, range(2, 2 + rank))
    steps = _i64(g, hint, strides)
    for offset in itertools.product(*(range(k) for k in kernel)):
        begin = [o * d for o, d in zip(offset, dilations, strict=True)]
        stop = [b + (y - 1) * s + 1 for b, y, s in zip(begin, y_spatial, strides, strict=True)]
        yield g.one("Slice", [x_t, _i64(g, hint, begin), _i64(g, hint, stop), axes, steps], hint)


def _grouped_conv_weight_grad(
    g: _Graph,
    hint: str,
    d_y: str,
    x: str,
    d_w: str,
    group: int,
    x_shape: Sequence[int],
    y_shape: Sequence[int],
    kernel: Sequence[int],
    strides: Sequence[int],
    pads: Sequence[int],
    dilations: Sequence[int],
) -> None:
    """DW of a grouped (or depthwise) conv: per kernel offset, one batched ``MatMul`` over the groups.

    With ``G`` groups of ``cg`` input and ``og`` output channels, offset ``k`` contributes
    ``DW[:, :, k] = window_k (G, cg, N*P) @ dY^T (G, N*P, og)``, a (G, cg, og) block; the
    blocks of all offsets are stacked and transposed once to (O, cg, *kernel).
    """
    rank = len(kernel)
    c, out_channels = x_shape[0], y_shape[0]
    cg, og = c // group, out_channels // group
    count = -1  # N * P, whatever the step's N
    dy_t = g.one("Transpose", [d_y], hint, perm=[1, 0, *range(2, 2 + rank)])  # (O, N, *spatial_out)
    dy_g = g.one("Reshape", [dy_t, _i64(g, hint, [group, og, count])], hint)
    dy_gt = g.one("Transpose", [dy_g], hint, perm=[0, 2, 1])  # (G, N*P, og)
    last = _i64(g, hint, [3])
    blocks = []
    for window in _conv_windows(g, hint, x, y_shape[1:], kernel, strides, pads, dilations):
        columns = g.one("Reshape", [window, _i64(g, hint, [group, cg, count])], hint)
        product = g.one("MatMul", [columns, dy_gt], hint)  # (G, cg, og)
        blocks.append(g.one("Unsqueeze", [product, last], hint))
    stacked = g.one("Concat", blocks, hint, axis=3) if len(blocks) > 1 else blocks[0]  # (G, cg, og, K)
    ordered = g.one("Transpose", [stacked], hint, perm=[0, 2, 1, 3])  # (G, og, cg, K)
    g.op("Reshape", [ordered, _i64(g, hint, [out_channels, cg, *kernel])], hint, outputs=[d_w])


def _i64(g: _Graph, hint: str, values: Iterable[int]) -> str:
    """Add a 1-D int64 constant and return its name."""
    return g.const(hint + "/i64", np.asarray(list(values), dtype=np.int64))


def _lower_relu_grad(g: _Graph, node: Any) -> None:
    # Greater + Cast + Mul: measured 7x faster than both ORT's own ReluGrad kernel and a
    # Where, whose CPU kernels take a slow broadcasting path (a 20x64x32x32 tensor, 1 thread).
    d_y, x = node.input[:2]
    zero = g.const(node.name + "/zero", np.zeros((), dtype=np.float32))
    positive = g.one("Cast", [g.one("Greater", [x, zero], node.name)], node.name, to=_FLOAT)
    g.op("Mul", [d_y, positive], node.name, outputs=[node.output[0]])


def _lower_dropout_grad(g: _Graph, node: Any) -> None:
    # dX = dY * mask / (1 - ratio), the forward Dropout's kept elements scaled back up.
    d_y, mask = node.input[:2]
    given = len(node.input) > 2 and node.input[2]
    ratio = node.input[2] if given else g.const(node.name + "/ratio", np.asarray(0.5, dtype=np.float32))
    one = g.const(node.name + "/one", np.ones((), dtype=np.float32))
    scale = g.one("Div", [one, g.one("Sub", [one, ratio], node.name)], node.name)
    kept = g.one("Mul", [d_y, g.one("Cast", [mask], node.name, to=_FLOAT)], node.name)
    g.op("Mul", [kept, scale], node.name, outputs=[node.output[0]])


def _forward_node(g: _Graph, node: Any, op_type: str, *, output: str, index: int = 0) -> Any:
    """Return the forward ``op_type`` node whose output ``index`` is ``output``."""
    producer = g.producers.get(output)
    if producer is None or producer.op_type != op_type or _out(producer, index) != output:
        raise LoweringError(f"{node.op_type} {node.name!r}: {output!r} is not output {index} of a forward {op_type}")
    return producer


def _check_pool_attrs(node: Any, forward: Any) -> None:
    mine, theirs = _attrs(node), _attrs(forward)
    for key in ("kernel_shape", "strides", "pads", "ceil_mode", "dilations", "storage_order", "count_include_pad"):
        if key in mine and key in theirs and mine[key] != theirs[key]:
            raise LoweringError(f"{node.op_type} {node.name!r}: {key} differs from its forward {forward.name!r}")


def _lower_max_pool_grad(g: _Graph, node: Any) -> None:
    d_y, indices = node.input[:2]
    forward = _forward_node(g, node, "MaxPool", output=indices, index=1)
    _check_pool_attrs(node, forward)
    hint = node.name
    flat = g.const(hint + "/flat", np.asarray([-1], dtype=np.int64))
    zeros, x_shape = _zeros_like(g, hint, forward.input[0], node)
    index = g.one("Reshape", [indices, flat], hint)  # MaxPool's indices are flat over the whole input
    update = g.one("Reshape", [d_y, flat], hint)
    attrs = _attrs(forward)
    kernel = [int(k) for k in attrs["kernel_shape"]]
    strides = _spatial(attrs, "strides", len(kernel), 1)
    dilations = _spatial(attrs, "dilations", len(kernel), 1)
    # Windows that cannot overlap have distinct argmax positions: a plain scatter is exact (and faster).
    apart = all((k - 1) * d + 1 <= s for k, s, d in zip(kernel, strides, dilations, strict=True))
    summed = g.one("ScatterElements", [zeros, index, update], hint, axis=0, reduction="none" if apart else "add")
    g.op("Reshape", [summed, x_shape], hint, outputs=[node.output[0]])


def _zeros_like(g: _Graph, hint: str, x: str, node: Any) -> tuple[str, str]:
    """Return a flat float32 zero tensor of ``x``'s size and a tensor holding ``x``'s shape.

    Constants when ``x``'s shape is static; else computed from ``x`` when the step runs
    (``Shape``, ``Size`` and ``ConstantOfShape``: a variable batch).
    """
    from onnx import numpy_helper

    shape = _static(g.shape(x, node))
    if shape is not None:
        zeros = g.const(hint + "/zeros", np.zeros(int(np.prod(shape, dtype=np.int64)), dtype=np.float32))
        return zeros, _shape_of(g, hint, x, node)
    size = g.one("Reshape", [g.one("Size", [x], hint), _i64(g, hint, [1])], hint)
    zero = numpy_helper.from_array(np.zeros(1, dtype=np.float32))
    return g.one("ConstantOfShape", [size], hint, value=zero), _shape_of(g, hint, x, node)


def _static(shape: Shape) -> tuple[int, ...] | None:
    """Return ``shape`` when every dimension is known, else None."""
    if any(d is None for d in shape):
        return None
    return tuple(int(d) for d in shape if d is not None)


def _shape_of(g: _Graph, hint: str, x: str, node: Any) -> str:
    """Return a 1-D int64 tensor of ``x``'s shape: a constant when static, else ``Shape(x)``."""
    shape = g.shape(x, node)
    if _static(shape) is not None:
        return g.const(hint + "/shape", np.asarray(shape, dtype=np.int64))
    return g.one("Shape", [x], hint)


def _lower_average_pool_grad(g: _Graph, node: Any) -> None:
    d_y = node.input[0]
    if not d_y.endswith("_grad"):
        raise LoweringError(f"AveragePoolGrad {node.name!r}: cannot find the forward pool of {d_y!r}")
    forward = _forward_node(g, node, "AveragePool", output=d_y[: -len("_grad")])
    _check_pool_attrs(node, forward)
    attrs = _attrs(node)
    kernel = [int(k) for k in attrs["kernel_shape"]]
    rank = len(kernel)
    x_spatial = g.sizes(forward.input[0], node, range(2, 2 + rank))
    y_spatial = g.sizes(d_y, node, range(2, 2 + rank))
    strides = _spatial(attrs, "strides", rank, 1)
    pads = _spatial(attrs, "pads", 2 * rank, 0)
    if attrs.get("ceil_mode", 0) or attrs.get("auto_pad", "NOTSET") != "NOTSET":
        raise LoweringError(f"AveragePoolGrad {node.name!r}: ceil_mode / auto_pad are not lowered")
    if any(pads) and not attrs.get("count_include_pad", 0):
        raise LoweringError(f"AveragePoolGrad {node.name!r}: padding excluded from the count is not lowered")
    hint = node.name
    # One plane per (n, c): a ConvTranspose by a 1/k kernel spreads each dY evenly over its window.
    flat_y = g.one("Reshape", [d_y, g.const(hint + "/shape", np.asarray([-1, 1, *y_spatial], dtype=np.int64))], hint)
    weight = g.const(hint + "/weight", np.full((1, 1, *kernel), 1.0 / float(np.prod(kernel)), dtype=np.float32))
    extra = [
        x_spatial[i] + pads[i] + pads[rank + i] - ((y_spatial[i] - 1) * strides[i] + kernel[i]) for i in range(rank)
    ]
    spread = g.one(
        "ConvTranspose", [flat_y, weight], hint, strides=strides, pads=pads, kernel_shape=kernel, output_padding=extra
    )
    g.op("Reshape", [spread, _shape_of(g, hint, forward.input[0], node)], hint, outputs=[node.output[0]])


def _lower_softmax_cross_entropy_loss_grad(g: _Graph, node: Any) -> None:
    d_loss, log_prob, labels = node.input[:3]
    attrs = _attrs(node)
    if len(node.input) > 3 and any(node.input[3:]):
        raise LoweringError(f"SoftmaxCrossEntropyLossGrad {node.name!r}: class weights are not lowered")
    if "ignore_index" in attrs:
        raise LoweringError(f"SoftmaxCrossEntropyLossGrad {node.name!r}: ignore_index is not lowered")
    shape = g.shape(log_prob, node)
    if len(shape) != 2:
        raise LoweringError(f"SoftmaxCrossEntropyLossGrad {node.name!r}: logits of rank {len(shape)} are not lowered")
    reduction = attrs.get("reduction", "mean")
    hint = node.name
    depth = g.const(hint + "/depth", np.asarray(g.sizes(log_prob, node, [1])[0], dtype=np.int64))
    values = g.const(hint + "/values", np.asarray([0.0, 1.0], dtype=np.float32))
    onehot = g.one("OneHot", [labels, depth, values], hint, axis=-1)
    diff = g.one("Sub", [g.one("Exp", [log_prob], hint), onehot], hint)
    if reduction == "mean":
        scale = g.one("Div", [d_loss, _count(g, hint, log_prob, node, [0])], hint)
    elif reduction == "sum":
        scale = d_loss
    elif reduction == "none":
        scale = g.one("Unsqueeze", [d_loss, g.const(hint + "/axes", np.asarray([1], dtype=np.int64))], hint)
    else:
        raise LoweringError(f"SoftmaxCrossEntropyLossGrad {node.name!r}: reduction {reduction!r} is not lowered")
    g.op("Mul", [diff, scale], hint, outputs=[node.output[0]])


def _count(g: _Graph, hint: str, x: str, node: Any, axes: Sequence[int]) -> str:
    """Return a float32 scalar: the product of ``x``'s sizes along ``axes``.

    A constant when they are static, else computed from ``x``'s shape when the step runs.
    """
    shape = g.shape(x, node)
    sizes = _static(tuple(shape[a] for a in axes))
    if sizes is not None:
        return g.const(hint + "/count", np.asarray(float(np.prod(sizes)), dtype=np.float32))
    picked = g.one("Gather", [g.one("Shape", [x], hint), _i64(g, hint, axes)], hint, axis=0)
    return g.one("Cast", [g.one("ReduceProd", [picked], hint, keepdims=0)], hint, to=_FLOAT)


def _channel_axes(rank: int) -> list[int]:
    return [0, *range(2, rank)]


def _lower_batch_norm_internal(g: _Graph, node: Any) -> None:
    x, scale, bias, mean, var = node.input[:5]
    attrs = _attrs(node)
    if int(attrs.get("training_mode", 1)) != 1:
        raise LoweringError(f"BatchNormInternal {node.name!r}: only training mode is lowered")
    # The zoo's static BatchNorm feeds the batch mean and biased variance (ReduceMean nodes) as
    # the "running" inputs; normalising with them in inference mode is the training-mode output.
    for stat in (mean, var):
        if stat not in g.producers or g.producers[stat].op_type != "ReduceMean":
            raise LoweringError(f"BatchNormInternal {node.name!r}: {stat!r} is not a batch statistic (ReduceMean)")
    eps = float(attrs.get("epsilon", 1e-5))
    g.op("BatchNormalization", [x, scale, bias, mean, var], node.name, outputs=[node.output[0]], epsilon=eps)
    saved_mean, saved_inv_std = _out(node, 3), _out(node, 4)
    if saved_mean:
        g.op("Identity", [mean], node.name, outputs=[saved_mean])
    if saved_inv_std:
        shifted = g.one("Add", [var, g.const(node.name + "/eps", np.asarray(eps, dtype=np.float32))], node.name)
        g.op("Reciprocal", [g.one("Sqrt", [shifted], node.name)], node.name, outputs=[saved_inv_std])
    for index in (1, 2):
        if _out(node, index):
            g.op("Identity", [mean if index == 1 else var], node.name, outputs=[_out(node, index)])


def _lower_batch_norm_grad(g: _Graph, node: Any) -> None:
    d_y, x, scale, mean, inv_std = node.input[:5]
    shape = g.shape(x, node)
    rank = len(shape)
    hint = node.name
    channels = g.sizes(x, node, [1])[0]
    axes = g.const(hint + "/axes", np.asarray(_channel_axes(rank), dtype=np.int64))
    per_channel = g.const(hint + "/channel", np.asarray([1, channels, *([1] * (rank - 2))], dtype=np.int64))

    def bcast(t: str) -> str:
        return g.one("Reshape", [t, per_channel], hint)

    inv_b = bcast(inv_std)
    x_hat = g.one("Mul", [g.one("Sub", [x, bcast(mean)], hint), inv_b], hint)
    d_bias = g.one("ReduceSum", [d_y, axes], hint, output=_out(node, 2) or None, keepdims=0)
    d_scale = g.one(
        "ReduceSum", [g.one("Mul", [x_hat, d_y], hint), axes], hint, output=_out(node, 1) or None, keepdims=0
    )
    if _out(node, 0):
        m = _count(g, hint, x, node, _channel_axes(rank))
        coef = g.one("Div", [g.one("Mul", [scale, inv_std], hint), m], hint)  # scale * inv_std / M
        centred = g.one("Sub", [g.one("Mul", [d_y, m], hint), bcast(d_bias)], hint)
        centred = g.one("Sub", [centred, g.one("Mul", [x_hat, bcast(d_scale)], hint)], hint)
        g.op("Mul", [centred, bcast(coef)], hint, outputs=[node.output[0]])


def _lower_scale(g: _Graph, node: Any) -> None:
    x, factor = node.input[:2]
    op = "Div" if int(_attrs(node).get("scale_down", 0)) else "Mul"
    producer = g.producers.get(factor)
    if producer is None and factor in g.constants:
        value = g.constants[factor].astype(np.float32)
        factor = g.const(node.name + "/scale", value)
    else:
        factor = g.one("Cast", [factor], node.name, to=_FLOAT)
    g.op(op, [x, factor], node.name, outputs=[node.output[0]])


def _lower_sigmoid_grad(g: _Graph, node: Any) -> None:
    d_y, y = node.input[:2]
    one = g.const(node.name + "/one", np.asarray(1.0, dtype=np.float32))
    slope = g.one("Mul", [y, g.one("Sub", [one, y], node.name)], node.name)
    g.op("Mul", [d_y, slope], node.name, outputs=[node.output[0]])


def _lower_tanh_grad(g: _Graph, node: Any) -> None:
    d_y, y = node.input[:2]
    one = g.const(node.name + "/one", np.asarray(1.0, dtype=np.float32))
    slope = g.one("Sub", [one, g.one("Mul", [y, y], node.name)], node.name)
    g.op("Mul", [d_y, slope], node.name, outputs=[node.output[0]])


def _lower_fused_matmul(g: _Graph, node: Any) -> None:
    a, b = node.input[:2]
    attrs = _attrs(node)
    if int(attrs.get("transBatchA", 0)) or int(attrs.get("transBatchB", 0)):
        raise LoweringError(f"FusedMatMul {node.name!r}: transBatchA / transBatchB are not lowered")
    trans_a, trans_b = int(attrs.get("transA", 0)), int(attrs.get("transB", 0))
    alpha = float(attrs.get("alpha", 1.0))
    if len(g.shape(a, node)) == 2 and len(g.shape(b, node)) == 2:
        g.op("Gemm", [a, b], node.name, outputs=[node.output[0]], transA=trans_a, transB=trans_b, alpha=alpha)
        return
    operands = []
    for name, trans in ((a, trans_a), (b, trans_b)):
        if trans:
            rank = len(g.shape(name, node))
            name = g.one("Transpose", [name], node.name, perm=[*range(rank - 2), rank - 1, rank - 2])
        operands.append(name)
    if alpha == 1.0:
        g.op("MatMul", operands, node.name, outputs=[node.output[0]])
    else:
        product = g.one("MatMul", operands, node.name)
        g.op(
            "Mul",
            [product, g.const(node.name + "/alpha", np.asarray(alpha, dtype=np.float32))],
            node.name,
            outputs=[node.output[0]],
        )


def _lower_concat_training(g: _Graph, node: Any) -> None:
    axis = int(_attrs(node).get("axis", 0))
    inputs = list(node.input)
    g.op("Concat", inputs, node.name, outputs=[node.output[0]], axis=axis)
    lengths = _out(node, 1)
    if lengths:
        sizes = []
        for name in inputs:
            shape = g.shape(name, node)
            sizes.append(shape[axis if axis >= 0 else len(shape) + axis])
        if any(size is None for size in sizes):  # along the batch: the lengths of the step's tensors
            rank = len(g.shape(inputs[0], node))
            at = axis if axis >= 0 else rank + axis
            parts = [g.one("Shape", [name], node.name, start=at, end=at + 1) for name in inputs]
            g.op("Concat", parts, node.name, outputs=[lengths], axis=0)
            return
        g.constants[lengths] = np.asarray(sizes, dtype=np.int64)
        g.const(lengths, g.constants[lengths], name=lengths)


def _lower_split_training(g: _Graph, node: Any) -> None:
    attrs = _attrs(node)
    axis = int(attrs.get("axis", 0))
    inputs = [node.input[0]]
    if len(node.input) > 1 and node.input[1]:
        inputs.append(node.input[1])
    g.op("Split", inputs, node.name, outputs=list(node.output), axis=axis)


def _lower_gather_grad(g: _Graph, node: Any) -> None:
    shape_in, indices, d_y = node.input[:3]
    axis = int(_attrs(node).get("axis", 0))
    producer = g.producers.get(shape_in)
    data_shape: Shape
    if shape_in in g.constants:
        data_shape = tuple(int(v) for v in g.constants[shape_in])
    elif (
        producer is not None
        and producer.op_type == "Shape"
        and not _attrs(producer).get("start", 0)
        and ("end" not in _attrs(producer))
    ):
        data_shape = g.shape(producer.input[0], node)
    else:
        data_shape = (None,) * g.sizes(shape_in, node, [0])[0]
    rank = len(data_shape)
    axis = axis if axis >= 0 else axis + rank
    hint = node.name
    known, picked, size = _static(data_shape), g.constants.get(indices), data_shape[axis]
    if known is None and picked is not None and np.ndim(picked) == 0 and size is not None:
        # One position of a static axis of a tensor with a variable batch (an LSTM's last step):
        # dY padded with zeros around it. A scatter needs zeros of the data's shape, which ONNX
        # Runtime's shape inference cannot relate to the batch, and that stops its Gemm fusions.
        at = int(picked) % size
        pads = [0] * (2 * rank)
        pads[axis], pads[rank + axis] = at, size - at - 1
        widened = g.one("Unsqueeze", [d_y, _i64(g, hint, [axis])], hint)
        g.op("Pad", [widened, _i64(g, hint, pads)], hint, outputs=[node.output[0]])
        return
    # Every index (as many as the step's batch holds) along the axis: -1 in the shapes.
    index = g.one("Reshape", [indices, _i64(g, hint, [1] * axis + [-1] + [1] * (rank - axis - 1))], hint)
    if known is not None:
        before, after = list(known[:axis]), list(known[axis + 1 :])
        full, flat = _i64(g, hint, [*before, 1, *after]), _i64(g, hint, [*before, -1, *after])
        zeros = g.const(hint + "/zeros", np.zeros(known, dtype=np.float32))
    else:  # the data's shape is known when the step runs (it depends on the batch)

        def around(middle: int) -> str:
            parts = [_i64(g, hint, [middle])]
            if axis > 0:
                parts.insert(0, g.one("Slice", [shape_in, _i64(g, hint, [0]), _i64(g, hint, [axis])], hint))
            if axis < rank - 1:
                parts.append(g.one("Slice", [shape_in, _i64(g, hint, [axis + 1]), _i64(g, hint, [rank])], hint))
            return g.one("Concat", parts, hint, axis=0) if len(parts) > 1 else parts[0]

        full, flat = around(1), around(-1)
        zeros = g.one("Expand", [g.const(hint + "/zero", np.zeros((), dtype=np.float32)), shape_in], hint)
    index = g.one("Expand", [index, full], hint)
    update = g.one("Reshape", [d_y, flat], hint)
    g.op("ScatterElements", [zeros, index, update], hint, outputs=[node.output[0]], axis=axis, reduction="add")


#: Standard-op subgraph per non-standard operator of the training graphs (see the module docstring).
LOWERINGS: dict[str, Lowering] = {
    "ConvGrad": _lower_conv_grad,
    "ReluGrad": _lower_relu_grad,
    "MaxPoolGrad": _lower_max_pool_grad,
    "AveragePoolGrad": _lower_average_pool_grad,
    "SoftmaxCrossEntropyLossGrad": _lower_softmax_cross_entropy_loss_grad,
    "BatchNormInternal": _lower_batch_norm_internal,
    "BatchNormalizationGrad": _lower_batch_norm_grad,
    "Scale": _lower_scale,
    "SigmoidGrad": _lower_sigmoid_grad,
    "TanhGrad": _lower_tanh_grad,
    "FusedMatMul": _lower_fused_matmul,
    "ConcatTraining": _lower_concat_training,
    "SplitTraining": _lower_split_training,
    "GatherGrad": _lower_gather_grad,
    "DropoutGrad": _lower_dropout_grad,
}

#: Forward operators among them, lowered first (see `build_step_model`).
FORWARD_LOWERINGS = {k: LOWERINGS[k] for k in ("BatchNormInternal", "ConcatTraining")}

#: Operators removed outright: their output is read back through the gradient mapping.
DROPPED = frozenset({"InPlaceAccumulatorV2"})

#: Optimizer operators of ORT's optimizer graphs that `build_step_model` spells out.
OPTIMIZER_OPS = {"SGDOptimizerV2": "sgd", "AdamWOptimizer": "adamw"}


def is_standard(node: Any) -> bool:
    """Tell whether a node is an operator of the default ONNX domain (a real ONNX operator).

    ORT's training kernels ``MaxPoolGrad`` and ``AveragePoolGrad`` sit in the default
    domain without being ONNX operators; the schema registry tells them apart.

    Parameters
    ----------
    node : onnx.NodeProto

    Returns
    -------
    bool
    """
    import onnx

    return node.domain in DEFAULT_DOMAINS and onnx.defs.has(node.op_type, "")


def check_portable(model: Any) -> list[str]:
    """List every node of a model that is not a default-domain ONNX operator.

    Parameters
    ----------
    model : onnx.ModelProto

    Returns
    -------
    list of str
        ``"domain:op_type node-name"`` per offending node (empty when portable); also
        opset imports of other domains.
    """
    bad = [f"{n.domain or 'ai.onnx'}:{n.op_type} {n.name}" for n in model.graph.node if not is_standard(n)]
    bad += [f"opset import {o.domain}" for o in model.opset_import if o.domain not in DEFAULT_DOMAINS]
    return bad


# --------------------------------------------------------------------------- optimizer updates


def _optimizer_node(optimizer_model: Any) -> tuple[str, dict[str, Any]]:
    found = [n for n in optimizer_model.graph.node if n.op_type in OPTIMIZER_OPS]
    if len(found) != 1:
        ops = sorted({n.op_type for n in optimizer_model.graph.node})
        raise LoweringError(f"optimizer graph holds {ops}; expected exactly one of {sorted(OPTIMIZER_OPS)}")
    return OPTIMIZER_OPS[found[0].op_type], _attrs(found[0])


def _sgd_update(g: _Graph, params: Sequence[str], grads: Mapping[str, str], lr: str) -> None:
    for p in params:
        # The kernel: w + (-lr * g); the same float32 result as w - g * lr.
        g.op("Sub", [p, g.one("Mul", [grads[p], lr], p)], p, outputs=[p + NEXT_SUFFIX])


def _adamw_update(
    g: _Graph, params: Sequence[str], grads: Mapping[str, str], lr: str, attrs: Mapping[str, Any]
) -> None:
    """AdamW as ORT's CPU kernel computes it (``adam_mode`` 1, Hugging Face; 0, PyTorch)."""
    alpha = np.float32(attrs.get("alpha", 0.9))
    beta = np.float32(attrs.get("beta", 0.999))
    eps = np.float32(attrs.get("epsilon", 1e-8))
    decay = np.float32(attrs.get("weight_decay", 0.0))
    mode = int(attrs.get("adam_mode", 0))
    correct = int(attrs.get("correct_bias", 1))
    if mode not in (0, 1):
        raise LoweringError(f"AdamWOptimizer adam_mode {mode} is not lowered")
    one = np.float32(1.0)
    c = "adamw"
    t = g.one("Add", [STEP, g.const(c + "/one", np.asarray([1], dtype=np.int64))], c, output=STEP + NEXT_SUFFIX)
    t_double = g.one("Cast", [t], c, to=_DOUBLE)
    f_one = g.const(c + "/fone", np.asarray(one))

    def correction(b: np.float32) -> str:
        # std::pow(float, int64_t) is a double power; the kernel casts it back to float.
        power = g.one("Pow", [g.const(c + "/base", np.asarray([float(b)], dtype=np.float64)), t_double], c)
        return g.one("Sub", [f_one, g.one("Cast", [power], c, to=_FLOAT)], c)

    bc1 = correction(alpha) if correct else None
    bc2 = correction(beta) if correct else None
    if mode == 1:
        step_lr = lr
        if bc1 is not None and bc2 is not None:
            step_lr = g.one("Mul", [lr, g.one("Div", [g.one("Sqrt", [bc2], c), bc1], c)], c)
    decay_lr = g.one("Mul", [lr, g.const(c + "/decay", np.asarray(decay))], c) if decay else None
    k_alpha, k_1_alpha = g.const(c + "/alpha", np.asarray(alpha)), g.const(c + "/1-alpha", np.asarray(one - alpha))
    k_beta, k_1_beta = g.const(c + "/beta", np.asarray(beta)), g.const(c + "/1-beta", np.asarray(one - beta))
    k_eps = g.const(c + "/eps", np.asarray(eps))
    for p in params:
        grad, m_in, v_in = grads[p], p + ".exp_avg", p + ".exp_avg_sq"
        m_out, v_out = m_in + NEXT_SUFFIX, v_in + NEXT_SUFFIX
        weight = p
        if mode == 0 and decay_lr is not None:
            weight = g.one("Sub", [p, g.one("Mul", [p, decay_lr], p)], p)
        g.op("Add", [g.one("Mul", [m_in, k_alpha], p), g.one("Mul", [grad, k_1_alpha], p)], p, outputs=[m_out])
        g_sq = g.one("Mul", [g.one("Mul", [grad, k_1_beta], p), grad], p)
        g.op("Add", [g.one("Mul", [v_in, k_beta], p), g_sq], p, outputs=[v_out])
        if mode == 1:
            denom = g.one("Add", [g.one("Sqrt", [v_out], p), k_eps], p)
            update = g.one("Div", [g.one("Mul", [m_out, step_lr], p), denom], p)
        else:
            assert bc1 is not None and bc2 is not None  # correct_bias is required in mode 0
            denom = g.one("Add", [g.one("Sqrt", [g.one("Div", [v_out, bc2], p)], p), k_eps], p)
            update = g.one("Div", [g.one("Mul", [m_out, lr], p), g.one("Mul", [denom, bc1], p)], p)
        if decay_lr is not None and mode == 1:  # Hugging Face: decay after the step
            stepped = g.one("Sub", [weight, update], p)
            g.op("Sub", [stepped, g.one("Mul", [stepped, decay_lr], p)], p, outputs=[p + NEXT_SUFFIX])
        else:
            g.op("Sub", [weight, update], p, outputs=[p + NEXT_SUFFIX])


# --------------------------------------------------------------------------- masks


def _mask_producers(training: Any, layouts: Mapping[str, Sequence[Any]], groups: Sequence[str]) -> dict[str, Any]:
    """Return, per masked group, the forward Conv / Gemm node whose output channels it indexes."""
    forward = []
    for node in training.graph.node:  # ORT appends the gradient graph after the loss
        forward.append(node)
        if node.op_type == "SoftmaxCrossEntropyLoss":
            break
    out: dict[str, Any] = {}
    for group in groups:
        found = []
        for node in forward:
            if node.op_type not in ("Conv", "Gemm") or len(node.input) < 2:
                continue
            layout = layouts.get(node.input[1])
            if not layout or layout[0] is None or getattr(layout[0], "group", None) != group:
                continue
            if getattr(layout[0], "blocks", 1) != 1 or (node.op_type == "Gemm" and not _attrs(node).get("transB", 0)):
                raise LoweringError(f"mask {group!r}: {node.name!r} does not keep its output units on axis 1")
            found.append(node)
        if len(found) != 1:
            raise LoweringError(f"mask {group!r}: {len(found)} conv / linear nodes produce it; masks need exactly one")
        out[group] = found[0]
    return out


def _apply_masks(
    nodes: list[Any], g: _Graph, producers: Mapping[str, Any], group_sizes: Mapping[str, int]
) -> tuple[list[Any], list[TensorSpec]]:
    """Scale each masked node's output (forward) and its incoming gradient (backward) by the mask.

    Every reader of the node's output ``Y`` reads ``Y * mask`` instead, and every reader of
    ``Y_grad`` (the gradient ORT computed for ``Y``, which the downstream nodes now give for
    ``Y * mask``) reads ``Y_grad * mask``: the chain rule through the multiplication.
    """
    from onnx import helper

    produced = {o for n in nodes for o in n.output}
    head: list[Any] = []
    after: dict[str, Any] = {}  # tensor -> the Mul inserted right after its producer
    rename: dict[str, str] = {}
    specs = []
    for group, node in producers.items():
        out = node.output[0]
        rank = len(g.shape(out, node))
        name = mask_input(group)
        specs.append(TensorSpec(name, (group_sizes[group],), "float32"))
        shape = g.const(name + "/shape", np.asarray([1, group_sizes[group], *([1] * (rank - 2))], dtype=np.int64))
        mask = g.fresh(name + "/bcast")
        head.append(helper.make_node("Reshape", [name, shape], [mask], name=g.fresh(name + "/Reshape")))
        for tensor in (out, out + "_grad"):
            if tensor not in produced:
                continue
            scaled = g.fresh(tensor + "/masked")
            after[tensor] = helper.make_node("Mul", [tensor, mask], [scaled], name=g.fresh(name + "/Mul"))
            rename[tensor] = scaled
    result = list(head)
    for node in nodes:
        for i, name in enumerate(node.input):
            if name in rename:
                node.input[i] = rename[name]
        result.append(node)
        result.extend(after[o] for o in node.output if o in after)
    return result, specs


# --------------------------------------------------------------------------- assembly


def _shapes(model: Any) -> dict[str, Shape]:
    """Return the shape ONNX inference gives each tensor whose rank it knows (None: a dimension it does not)."""
    import onnx

    inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False, data_prop=True)
    shapes: dict[str, Shape] = {}
    for info in (*inferred.graph.input, *inferred.graph.value_info, *inferred.graph.output):
        tensor = info.type.tensor_type
        if not tensor.HasField("shape"):
            continue
        shapes[info.name] = tuple(int(d.dim_value) if d.HasField("dim_value") else None for d in tensor.shape.dim)
    for init in model.graph.initializer:
        shapes[init.name] = tuple(int(d) for d in init.dims)
    return shapes


def _prune(nodes: list[Any], outputs: Iterable[str]) -> list[Any]:
    """Keep the nodes that some graph output depends on, in their order."""
    needed = set(outputs)
    kept = []
    for node in reversed(nodes):
        if any(o and o in needed for o in node.output):
            kept.append(node)
            needed.update(i for i in node.input if i)
    kept.reverse()
    return kept


def _gradients(training: Any, params: Sequence[str]) -> dict[str, str]:
    """Map every parameter to its gradient tensor: the input its accumulator adds."""
    grads: dict[str, str] = {}
    wanted = {f"{p}_grad.accumulation.buffer": p for p in params}
    for node in training.graph.node:
        if node.op_type == "InPlaceAccumulatorV2" and node.input[0] in wanted:
            grads[wanted[node.input[0]]] = node.input[1]
    missing = [p for p in params if p not in grads]
    if missing:
        raise LoweringError(f"training graph accumulates no gradient for {missing}")
    return grads


#: Activation gradients that `_fuse_activation_grads` computes on a concatenated block:
#: slope = Y * (c1 - Y) + c0 with per-column (c1, c0).
_SLOPES = {"SigmoidGrad": (1.0, 0.0), "TanhGrad": (0.0, 1.0)}


def _fuse_activation_grads(g: _Graph, nodes: Sequence[Any]) -> list[Any]:
    """Lower the ``SigmoidGrad`` / ``TanhGrad`` nodes of an unrolled recurrence together.

    An unrolled LSTM step's backward pass has a ``Concat`` of three ``SigmoidGrad`` and one
    ``TanhGrad`` (the gradient of its gate ``Split``) and one more ``TanhGrad`` (the cell's
    ``tanh``). Lowered one by one that is 15 element-wise nodes on (N, H) tensors per time
    step, and the steps are dominated by per-node dispatch (tensors of a few thousand
    values). A block (such a ``Concat`` of gradients, or one gradient node alone) is
    ``dY * S`` with the slope ``S = A * (c1 - A) + c0`` of its activations ``A`` and
    per-column constants (1, 0) for a sigmoid and (0, 1) for a tanh. The slopes depend on
    forward values only, so the blocks of one layout (every time step of a layer) get theirs
    from one ``Concat`` of all their activations, 2-3 element-wise nodes and one ``Split``,
    placed before the first block; each block then costs a ``Mul`` (and the ``Concat`` of
    its incoming gradients): 3 nodes per time step instead of 15. A gradient node inside a
    ``Concat`` block must feed only that ``Concat``.
    """
    uses: dict[str, int] = {}
    for node in nodes:
        for name in node.input:
            uses[name] = uses.get(name, 0) + 1
    producers = {o: n for n in nodes for o in n.output if o}
    position = {id(n): i for i, n in enumerate(nodes)}
    fused: set[int] = set()
    blocks: dict[int, list[Any]] = {}  # anchor (a Concat, or the gradient node itself) -> gradient nodes
    layouts: dict[tuple[Any, ...], list[Any]] = {}
    for node in nodes:
        if node.op_type != "Concat" or not is_standard(node) or len(node.input) < 2:
            continue
        found = [producers.get(name) for name in node.input]
        parts = [p for p in found if p is not None and p.op_type in _SLOPES and not is_standard(p)]
        if len(parts) != len(found) or any(uses.get(p.output[0]) != 1 for p in parts):
            continue
        blocks[id(node)] = parts
        fused.update(id(p) for p in parts)
        axis = int(_attrs(node).get("axis", 0)) % len(g.shape(parts[0].input[1], parts[0]))
        layout = ("concat", axis, tuple((p.op_type, g.shape(p.input[1], p)) for p in parts))
        layouts.setdefault(layout, []).append(node)
    for node in nodes:
        if node.op_type in _SLOPES and not is_standard(node) and id(node) not in fused:
            blocks[id(node)] = [node]
            shape = g.shape(node.input[1], node)
            # Joined along the last axis, not the batch's: a Concat along a variable batch has a
            # shape that ONNX Runtime cannot name, and its pieces would not match the tensors they
            # multiply, which stops its Gemm fusions downstream.
            layouts.setdefault(("alone", len(shape) - 1, ((node.op_type, shape),)), []).append(node)

    slopes: dict[int, str] = {}  # anchor -> its block's slope tensor
    preludes: dict[int, list[Any]] = {}  # anchor -> nodes to place right before it
    for (kind, axis, layout), members in layouts.items():
        first = position[id(members[0])]
        activations = [p.input[1] for m in members for p in blocks[id(m)]]
        if len(members) > 1 and all(position.get(id(producers.get(a)), -1) < first for a in activations):
            start = len(g.nodes)
            joined = _activation_slope(g, members[0].name + "/all", activations, layout * len(members), axis)
            # Equal parts (every member has the layout), so the sizes need not be known (a variable batch).
            pieces = g.op("Split", [joined], members[0].name, count=len(members), axis=axis)
            slopes.update({id(m): piece for m, piece in zip(members, pieces, strict=True)})
            preludes[id(members[0])] = g.nodes[start:]
            del g.nodes[start:]
        elif kind == "concat":
            for m in members:
                start = len(g.nodes)
                slopes[id(m)] = _activation_slope(g, m.name, [p.input[1] for p in blocks[id(m)]], layout, axis)
                preludes[id(m)] = g.nodes[start:]
                del g.nodes[start:]
        else:  # a lone gradient node without company: its own lowering
            for m in members:
                del blocks[id(m)]
    out: list[Any] = []
    for node in nodes:
        if id(node) in fused:
            continue
        out.extend(preludes.get(id(node), ()))
        if id(node) not in blocks:
            out.append(node)
            continue
        start = len(g.nodes)
        parts = blocks[id(node)]
        if node.op_type == "Concat":
            axis = int(_attrs(node).get("axis", 0))
            incoming = g.one("Concat", [p.input[0] for p in parts], node.name, axis=axis)
        else:
            incoming = node.input[0]
        g.op("Mul", [incoming, slopes[id(node)]], node.name, outputs=[node.output[0]])
        out.extend(g.nodes[start:])
        del g.nodes[start:]
    return out


def _activation_slope(
    g: _Graph, hint: str, activations: Sequence[str], layout: Sequence[tuple[str, Shape]], axis: int
) -> str:
    """Return ``A * (c1 - A) + c0`` of the activations concatenated along ``axis`` (see `_SLOPES`).

    One activation throughout: scalar constants (``axis`` may then be the batch's); a mix:
    per-column constants, which need the sizes along ``axis``.
    """
    dims = [1] * len(layout[0][1])
    c1: list[float] = []
    c0: list[float] = []
    if len({op_type for op_type, _ in layout}) == 1:
        c1, c0 = [_SLOPES[layout[0][0]][0]], [_SLOPES[layout[0][0]][1]]
    else:
        for op_type, shape in layout:
            size = shape[axis]
            if size is None:
                raise LoweringError(f"{hint}: activation gradients concatenated along a variable dimension")
            c1 += [_SLOPES[op_type][0]] * size
            c0 += [_SLOPES[op_type][1]] * size
        dims[axis] = len(c1)
    joined = g.one("Concat", list(activations), hint, axis=axis) if len(activations) > 1 else activations[0]
    k1 = g.const(hint + "/c1", np.asarray(c1, dtype=np.float32).reshape(dims))
    slope = g.one("Mul", [joined, g.one("Sub", [k1, joined], hint)], hint)
    if any(c0):
        slope = g.one("Add", [slope, g.const(hint + "/c0", np.asarray(c0, dtype=np.float32).reshape(dims))], hint)
    return slope


def _lower_pass(g: _Graph, nodes: Sequence[Any], lowerings: Mapping[str, Lowering]) -> list[Any]:
    """Replace every non-standard node that ``lowerings`` covers; keep the others in order."""
    g.producers = {o: n for n in nodes for o in n.output if o}
    out: list[Any] = []
    for node in nodes:
        lower = lowerings.get(node.op_type)
        if lower is None or is_standard(node):
            out.append(node)
            continue
        g.nodes = []
        lower(g, node)
        out.extend(g.nodes)
    return out


#: Training-build kernels that size their output by the shape the graph was built with, not by
#: their input: ``AveragePoolGrad`` allocates the exported input shape, whose variable batch is
#: 0 there (ORT died of SIGFPE). `lower_fixed_shape_kernels` swaps them for their lowering.
FIXED_SHAPE_KERNELS = ("AveragePoolGrad",)


def lower_fixed_shape_kernels(training: Any) -> int:
    """Replace every `FIXED_SHAPE_KERNELS` node of a training graph by its standard-op lowering (in place).

    The lowering sizes its output by its inputs, so the training build's step takes any batch;
    the other kernels stay the training build's own.

    Parameters
    ----------
    training : onnx.ModelProto
        ``training_model.onnx`` of a set (`onnxruntime.training.artifacts.generate_artifacts`).

    Returns
    -------
    int
        Nodes replaced.
    """
    import onnx

    found = [n for n in training.graph.node if n.op_type in FIXED_SHAPE_KERNELS and not is_standard(n)]
    if not found:
        return 0
    constants = {i.name: onnx.numpy_helper.to_array(i) for i in training.graph.initializer}
    g = _Graph(_shapes(training), {}, constants)
    nodes = _lower_pass(g, list(training.graph.node), {k: LOWERINGS[k] for k in FIXED_SHAPE_KERNELS})
    del training.graph.node[:]
    training.graph.node.extend(nodes)
    training.graph.initializer.extend(g.initializers)
    return len(found)


def build_step_model(
    training: Any,
    optimizer: Any,
    parameters: Sequence[tuple[str, Sequence[int]]],
    *,
    mask_groups: Sequence[str] = (),
    layouts: Mapping[str, Sequence[Any]] | None = None,
    group_sizes: Mapping[str, int] | None = None,
) -> tuple[Any, StepSignature]:
    """Lower an artifact set's training and optimizer graphs into one portable step graph.

    Parameters
    ----------
    training : onnx.ModelProto
        ``training_model.onnx`` of the set (ORT's forward, loss and gradient graph).
    optimizer : onnx.ModelProto
        ``optimizer_model.onnx`` (one ``SGDOptimizerV2`` or ``AdamWOptimizer`` node).
    parameters : sequence of (str, shape)
        Trainable parameters in manifest (flat buffer) order.
    mask_groups : sequence of str
        Neuron groups that get a SyncDrop multiplier input ``mask.<group>`` (see the
        module docstring); empty for the exported model.
    layouts : mapping, optional
        Parameter layouts of the zoo model (`exporters.zoo.ZooModel.layouts`), needed
        with ``mask_groups`` to find the node producing each group.
    group_sizes : mapping of str to int, optional
        Neurons of every masked group in this arch, needed with ``mask_groups``.

    Returns
    -------
    model : onnx.ModelProto
        Opset `STEP_OPSET`, IR `STEP_IR_VERSION`, default-domain operators only.
    signature : StepSignature

    Raises
    ------
    LoweringError
        If a node has no lowering, the graphs break an assumption the lowering relies
        on, or the result is not portable.
    """
    import onnx
    from onnx import helper

    names = [name for name, _ in parameters]
    kind, opt_attrs = _optimizer_node(optimizer)
    graph_inputs = {i.name: i for i in training.graph.input}
    batch = []
    for name in (INPUT, LABELS):
        if name not in graph_inputs:
            raise LoweringError(f"training graph has no input {name!r}")
        tensor = graph_inputs[name].type.tensor_type
        dtype = {_FLOAT: "float32", _INT64: "int64"}.get(tensor.elem_type)
        if dtype is None:
            raise LoweringError(f"training graph input {name!r} has element type {tensor.elem_type}")
        dims = tuple(int(d.dim_value) if d.HasField("dim_value") else str(d.dim_param) for d in tensor.shape.dim)
        batch.append(TensorSpec(name, dims, dtype))
    missing = [n for n in names if n not in graph_inputs]
    if missing:
        raise LoweringError(f"training graph has no parameter inputs {missing}")

    constants = {i.name: onnx.numpy_helper.to_array(i) for i in training.graph.initializer}
    grads = _gradients(training, names)
    masked = _mask_producers(training, layouts or {}, mask_groups) if mask_groups else {}
    # Pass 1 lowers the forward operators (their outputs stop shape inference of everything
    # downstream); pass 2 lowers the rest with the shapes of the then standard forward graph.
    nodes = [n for n in training.graph.node if n.op_type not in DROPPED]
    g = _Graph(_shapes(training), {}, constants)
    nodes = _lower_pass(g, nodes, FORWARD_LOWERINGS)
    staged = training.__class__()
    staged.CopyFrom(training)
    del staged.graph.node[:]
    staged.graph.node.extend(nodes)
    staged.graph.initializer.extend(g.initializers)
    g = _Graph(_shapes(staged), {}, g.constants, g.initializers)
    nodes = _fuse_activation_grads(g, nodes)
    nodes = _lower_pass(g, nodes, LOWERINGS)
    g.nodes = nodes
    bad = [n for n in nodes if not is_standard(n)]
    if bad:
        raise LoweringError(
            f"{bad[0].domain or 'ai.onnx'}:{bad[0].op_type} ({bad[0].name!r}) has no standard-op lowering"
        )

    loss = training.graph.output[0].name
    g.op("Identity", [loss], "loss", outputs=[LOSS])
    lr = LEARNING_RATE
    if kind == "sgd":
        _sgd_update(g, names, grads, lr)
    else:
        _adamw_update(g, names, grads, lr, opt_attrs)

    masks: list[TensorSpec] = []
    nodes = g.nodes
    if masked:
        if group_sizes is None:
            raise LoweringError("masks need the size of every masked group")
        nodes, masks = _apply_masks(nodes, g, masked, group_sizes)

    signature = StepSignature(
        optimizer=kind,
        parameters=tuple(TensorSpec(n, tuple(int(d) for d in s), "float32") for n, s in parameters),
        batch=tuple(batch),
        masks=tuple(masks),
    )
    out_names = [t.name for t in signature.outputs]
    nodes = _prune(nodes, out_names)
    used = {i for n in nodes for i in n.input} | set(out_names)
    initializers = [i for i in (*training.graph.initializer, *g.initializers) if i.name in used]
    elem = {"float32": _FLOAT, "int64": _INT64}
    graph = helper.make_graph(
        nodes,
        "fleetbench_step",
        [helper.make_tensor_value_info(t.name, elem[t.dtype], list(t.shape)) for t in signature.inputs],
        [helper.make_tensor_value_info(t.name, elem[t.dtype], list(t.shape)) for t in signature.outputs],
        initializer=initializers,
    )
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", STEP_OPSET)],
        producer_name="fleetbench",
        ir_version=STEP_IR_VERSION,
    )
    offending = check_portable(model)
    if offending:
        raise LoweringError(f"step model is not portable: {offending[:5]}")
    onnx.checker.check_model(model)
    return model, signature


def initial_flat(parameters: Sequence[Mapping[str, Any]], values: Mapping[str, np.ndarray]) -> np.ndarray:
    """Return the flat float32 parameter vector (the runner's wire format) in manifest order.

    Parameters
    ----------
    parameters : sequence of mapping
        The manifest's ``parameters`` entries (``name``, ``shape``).
    values : mapping of str to numpy.ndarray
        Every parameter by name.

    Returns
    -------
    numpy.ndarray
    """
    parts = []
    for p in parameters:
        value = np.asarray(values[p["name"]], dtype=np.float32)
        if list(value.shape) != list(p["shape"]):
            raise LoweringError(f"initial value of {p['name']!r} has shape {list(value.shape)}, not {p['shape']}")
        parts.append(value.reshape(-1))
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.float32)


def write_step_model(
    directory: Path,
    parameters: Sequence[Mapping[str, Any]],
    initial: Mapping[str, np.ndarray],
    *,
    mask_groups: Sequence[str] = (),
    layouts: Mapping[str, Sequence[Any]] | None = None,
    group_sizes: Mapping[str, int] | None = None,
) -> dict[str, Any]:
    """Write ``step_model.onnx`` and ``initial_parameters.npy`` into an artifact set being exported.

    Parameters
    ----------
    directory : pathlib.Path
        The set's (temporary) directory holding ``training_model.onnx`` and
        ``optimizer_model.onnx``.
    parameters : sequence of mapping
        The manifest's ``parameters`` entries, in flat buffer order.
    initial : mapping of str to numpy.ndarray
        The set's initial parameter values by name.
    mask_groups, layouts, group_sizes
        As for `build_step_model` (a masked variant; none for the exported set).

    Returns
    -------
    dict
        The manifest's ``step_model`` entry (`StepSignature.to_json`, plus ``opset``).
    """
    import onnx

    directory = Path(directory)
    training = onnx.load(str(directory / "training_model.onnx"), load_external_data=False)
    optimizer = onnx.load(str(directory / "optimizer_model.onnx"), load_external_data=False)
    model, signature = build_step_model(
        training,
        optimizer,
        [(p["name"], p["shape"]) for p in parameters],
        mask_groups=mask_groups,
        layouts=layouts,
        group_sizes=group_sizes,
    )
    onnx.save(model, str(directory / STEP_MODEL))
    with open(directory / INITIAL_PARAMETERS, "wb") as handle:
        np.save(handle, initial_flat(parameters, initial), allow_pickle=False)
    return {**signature.to_json(), "opset": STEP_OPSET}
