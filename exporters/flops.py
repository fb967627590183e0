"""Analytic parameter, MAC and FLOP counts per layer, for a forward pass and a training step.

`count` builds the module of an `Arch`, runs it once **in training mode** on a zero batch
of one example to discover the shapes every operation sees (a `TorchFunctionMode` records
the functional calls, forward hooks name them after the module that made them and treat
``nn.LSTM`` as one layer), and then applies the small formulas of this module to those
shapes. Nothing is measured and no third-party counter is used; ``tests/exporters/
test_flops.py`` cross-checks the results against thop and fvcore and the papers' tables.

Every count is **per example** (one image, or one character sequence of the model's
``input_shape``), for the module as run in training mode (so HeteroFL's scaler and
dropout count; they are identities in eval mode). The loss is not counted.

Convention
----------
MACs (multiply-accumulates) are those of the matrix products only:

* ``Conv1d`` / ``Conv2d`` / ``Conv3d``: ``out_elements * (C_in / groups) * prod(kernel)``
  (a depthwise conv: one input channel per output);
* ``Linear``: ``out_elements * in_features`` (``out_elements`` includes sequence positions);
* ``LSTM``: per time step and layer ``4H(I + H)`` for the four gate matmuls (``I`` the
  layer's input size, ``H`` the hidden size), times the sequence length (times 2 when
  bidirectional);
* ``Embedding``, normalisation, activations, pooling and additions: 0 MACs.

FLOPs of a forward pass = ``2 * MACs`` plus these elementwise operations, each counted as
one FLOP per element (so a sigmoid or tanh is one FLOP):

* bias adds of conv / linear: one per output element; LSTM: ``8H`` per step and layer
  (``b_ih`` and ``b_hh``, as PyTorch adds both);
* LSTM cell: ``5H`` gate nonlinearities (3 sigmoid, tanh of g, tanh of c), ``3H`` for
  ``c' = f*c + i*g`` and ``H`` for ``h' = o * tanh(c')``, i.e. ``9H`` per step and layer;
* BatchNorm (batch statistics, as the zoo's static BN): 2 per element for the statistics
  (sum and sum of squares), 2 to normalise (subtract the mean, multiply by 1/std) and 2 for
  the affine transform when ``affine=True``; per-channel work (sqrt, ...) is neglected;
* ReLU, sigmoid, tanh and the other activations (ReLU6 / hardtanh, hardswish, hardsigmoid,
  SiLU, GELU, leaky ReLU, ELU, softplus, Mish), dropout (mask multiply, training mode),
  residual / other additions,
  products and the scaler's multiplication or division: 1 per output element;
* max pooling: ``k_h*k_w - 1`` comparisons per output element; average pooling: ``k_h*k_w``
  (``k_h*k_w - 1`` adds and one division) per output element; adaptive average pooling: the
  exact window size per output element (equals the input elements when the sizes divide);
* ``Embedding`` lookup, flatten, view, reshape, indexing and tensor creation: 0.

Training-step FLOPs = forward FLOPs + backward FLOPs, where the backward is:

* matrix products (conv, linear, LSTM gates): ``2 * MACs`` for the gradient w.r.t. the
  weights plus ``2 * MACs`` for the gradient w.r.t. the input, except that the first
  layer with parameters (in execution order) computes no gradient w.r.t. its input (for an
  LSTM that is first, only layer 0's input-to-hidden product is spared; the recurrent
  ``H x H`` product always is back-propagated);
* bias gradients: one add per output element (as in the forward);
* every other operation: the same FLOPs as its forward (one multiply by the local
  derivative per element, or the reduction back); an ``Embedding``'s weight gradient is a
  scatter-add of its output gradient: one FLOP per output element;
* operations executed before the first layer with parameters are not back-propagated.

The optimizer update is **not** included in ``train_flops`` (it runs once per batch, not
per example); `optimizer_flops` gives it per step (e.g. AdamW: 14 FLOPs per parameter).

Params are the trainable parameters of the built module (``sum(p.numel())`` over the
parameters with ``requires_grad``); per layer, each parameter tensor is attributed to the
first layer that uses it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

from exporters.arch import Arch
from exporters.userinput import InputError
from exporters.zoo import ZooModel

#: FLOPs per parameter of one optimizer step (see `optimizer_flops`).
OPTIMIZER_FLOPS_PER_PARAM: Mapping[str, int] = {
    "sgd": 2,  # w -= lr * g
    "sgd-momentum": 4,  # b = mu*b + g ; w -= lr * b
    "adam": 12,  # m (3), v (4), update sqrt/add eps/div/mul lr/sub (5)
    "adamw": 14,  # adam + decoupled weight decay w -= lr*wd*w (2)
}

#: Functions that only move or create data: counted as 0 and not listed as layers.
_ZERO_COST = frozenset(
    {
        "flatten",
        "view",
        "reshape",
        "__getitem__",
        "contiguous",
        "permute",
        "transpose",
        "t",
        "squeeze",
        "unsqueeze",
        "expand",
        "expand_as",
        "cat",
        "stack",
        "split",
        "chunk",
        "select",
        "narrow",
        "clone",
        "detach",
        "to",
        "float",
        "double",
        "long",
        "int",
        "type",
        "zeros",
        "ones",
        "empty",
        "full",
        "zeros_like",
        "ones_like",
        "empty_like",
        "arange",
        "identity",
        "__setitem__",
        "unbind",
        "view_as",
        "reshape_as",
        "masked_fill",
        "fill_",
        "zero_",
        "copy_",
        "new_zeros",
        "new_ones",
        "new_empty",
        "new_full",
        "tensor",
        "as_tensor",
        "numel",
        "cpu",
        "repeat",
        "tile",
        "movedim",
        "one_hot",
    }
)

#: Elementwise functions: 1 FLOP per output element, by kind.
_ELEMENTWISE: Mapping[str, str] = {
    "relu": "relu",
    "relu_": "relu",
    "sigmoid": "activation",
    "sigmoid_": "activation",
    "tanh": "activation",
    "tanh_": "activation",
    "hardtanh": "activation",
    "hardtanh_": "activation",
    "relu6": "activation",
    "hardswish": "activation",
    "hardswish_": "activation",
    "hardsigmoid": "activation",
    "hardsigmoid_": "activation",
    "silu": "activation",
    "silu_": "activation",
    "gelu": "activation",
    "leaky_relu": "activation",
    "leaky_relu_": "activation",
    "elu": "activation",
    "elu_": "activation",
    "softplus": "activation",
    "mish": "activation",
    "add": "add",
    "add_": "add",
    "__add__": "add",
    "__radd__": "add",
    "__iadd__": "add",
    "sub": "add",
    "sub_": "add",
    "__sub__": "add",
    "__rsub__": "add",
    "__isub__": "add",
    "mul": "mul",
    "mul_": "mul",
    "__mul__": "mul",
    "__rmul__": "mul",
    "__imul__": "mul",
    "div": "mul",
    "div_": "mul",
    "__truediv__": "mul",
    "__itruediv__": "mul",
}


@dataclass(frozen=True)
class LayerCount:
    """Counts of one executed operation ("layer"), per example.

    Attributes
    ----------
    name : str
        Qualified name of the module that ran it (``"conv1"``, ``"layer1.0.add"``; a
        ``#k`` suffix marks the k-th call of the same module or operation).
    kind : str
        ``conv``, ``linear``, ``lstm``, ``embedding``, ``batchnorm``, ``relu``,
        ``activation``, ``maxpool``, ``avgpool``, ``add``, ``mul``, ``scale``,
        ``dropout`` or ``untracked`` (an operation this module has no formula for,
        counted as 0).
    params : int
        Trainable parameters first used by this layer.
    macs : int
        Multiply-accumulates of the forward pass.
    flops : int
        FLOPs of the forward pass.
    train_flops : int
        Forward plus backward FLOPs.
    output_shape : tuple of int
        Output shape of one example (batch dimension removed).

    """

    name: str
    kind: str
    params: int
    macs: int
    flops: int
    train_flops: int
    output_shape: tuple[int, ...]


@dataclass(frozen=True)
class Counts:
    """Totals for one example, with the per-layer breakdown.

    Attributes
    ----------
    params : int
        Trainable parameters of the built module.
    macs : int
        Forward multiply-accumulates.
    flops : int
        Forward FLOPs.
    train_flops : int
        Forward plus backward FLOPs of one training step (optimizer excluded).
    layers : tuple of LayerCount
        Per executed operation, in execution order.

    """

    params: int
    macs: int
    flops: int
    train_flops: int
    layers: tuple[LayerCount, ...]


@dataclass(frozen=True)
class _Cost:
    """Forward cost of one operation, split the way the backward needs it."""

    macs: int = 0
    #: MACs whose input gradient is optional (spared in the first parametrised layer).
    input_grad_macs: int = 0
    bias: int = 0  # bias adds (forward) = bias-gradient adds (backward)
    elementwise: int = 0  # other forward FLOPs; backward = the same
    weight_scatter: int = 0  # backward-only FLOPs (embedding weight gradient)

    @property
    def flops(self) -> int:
        return 2 * self.macs + self.bias + self.elementwise

    def train_flops(self, needs_input_grad: bool, backprop: bool) -> int:
        """Forward plus backward FLOPs (see the module docstring)."""
        if not backprop:
            return self.flops
        grad_macs = self.macs + (self.macs if needs_input_grad else self.macs - self.input_grad_macs)
        return self.flops + 2 * grad_macs + self.bias + self.elementwise + self.weight_scatter


# --------------------------------------------------------------------------- formulas


def conv2d_cost(out_elements: int, weight_shape: Sequence[int], bias: bool) -> _Cost:
    """Cost of a 2-d convolution.

    Parameters
    ----------
    out_elements : int
        Output elements of one example (``C_out * H_out * W_out``).
    weight_shape : sequence of int
        ``(C_out, C_in / groups, k_h, k_w)``.
    bias : bool
        Whether a bias is added.

    Returns
    -------
    _Cost
        ``macs = out_elements * C_in/groups * k_h * k_w``; one bias add per output.

    """
    per_output = math.prod(weight_shape[1:])
    macs = out_elements * per_output
    return _Cost(macs=macs, input_grad_macs=macs, bias=out_elements if bias else 0)


def linear_cost(out_elements: int, in_features: int, bias: bool) -> _Cost:
    """Cost of a linear layer: ``out_elements * in_features`` MACs plus bias adds.

    Parameters
    ----------
    out_elements : int
        Output elements of one example (``out_features`` times any leading positions).
    in_features : int
        Inputs per output element.
    bias : bool
        Whether a bias is added.

    Returns
    -------
    _Cost

    """
    macs = out_elements * in_features
    return _Cost(macs=macs, input_grad_macs=macs, bias=out_elements if bias else 0)


def lstm_cost(
    input_size: int, hidden_size: int, num_layers: int, steps: int, bias: bool, bidirectional: bool
) -> _Cost:
    """Cost of a (multi-layer) LSTM over ``steps`` time steps.

    Parameters
    ----------
    input_size, hidden_size, num_layers : int
        As in ``nn.LSTM``.
    steps : int
        Sequence length.
    bias : bool
        Whether ``b_ih`` and ``b_hh`` are added (``8H`` per step and layer).
    bidirectional : bool
        Whether each layer runs in both directions (everything doubles).

    Returns
    -------
    _Cost
        Per step and layer: ``4H(I + H)`` MACs, ``8H`` bias adds, ``9H`` cell FLOPs
        (see the module docstring); only layer 0's ``4H*I`` product has an optional input
        gradient.

    """
    dirs = 2 if bidirectional else 1
    h = hidden_size
    macs = 0
    for layer in range(num_layers):
        i = input_size if layer == 0 else h * dirs
        macs += dirs * 4 * h * (i + h)
    return _Cost(
        macs=macs * steps,
        input_grad_macs=dirs * 4 * h * input_size * steps,
        bias=(dirs * num_layers * 8 * h * steps) if bias else 0,
        elementwise=dirs * num_layers * 9 * h * steps,
    )


def embedding_cost(out_elements: int) -> _Cost:
    """Cost of an embedding lookup: 0 forward; a scatter-add of ``out_elements`` backward."""
    return _Cost(weight_scatter=out_elements)


def batchnorm_cost(elements: int, affine: bool) -> _Cost:
    """Cost of BatchNorm with batch statistics: 4 (6 when affine) FLOPs per element."""
    return _Cost(elementwise=elements * (6 if affine else 4))


def elementwise_cost(elements: int) -> _Cost:
    """Cost of an elementwise operation: one FLOP per output element."""
    return _Cost(elementwise=elements)


def maxpool_cost(out_elements: int, kernel: Sequence[int]) -> _Cost:
    """Cost of max pooling: ``prod(kernel) - 1`` comparisons per output element."""
    return _Cost(elementwise=out_elements * (math.prod(kernel) - 1))


def avgpool_cost(out_elements: int, kernel: Sequence[int]) -> _Cost:
    """Cost of average pooling: ``prod(kernel)`` FLOPs per output element."""
    return _Cost(elementwise=out_elements * math.prod(kernel))


def adaptive_window_total(in_size: int, out_size: int) -> int:
    """Sum of the adaptive-pooling window lengths along one dimension.

    Parameters
    ----------
    in_size, out_size : int
        Input and output length; window ``i`` spans
        ``[floor(i*in/out), ceil((i+1)*in/out))`` as in PyTorch.

    Returns
    -------
    int

    """
    return sum(-(-((i + 1) * in_size) // out_size) - (i * in_size) // out_size for i in range(out_size))


def adaptive_avgpool_cost(channels: int, in_hw: Sequence[int], out_hw: Sequence[int]) -> _Cost:
    """Cost of adaptive average pooling: the window size per output element.

    Parameters
    ----------
    channels : int
        Channels of one example.
    in_hw, out_hw : sequence of int
        Spatial input and output sizes.

    Returns
    -------
    _Cost

    """
    total = channels
    for i, o in zip(in_hw, out_hw, strict=True):
        total *= adaptive_window_total(i, o)
    return _Cost(elementwise=total)


def optimizer_flops(params: int, optimizer: str = "adamw") -> int:
    """FLOPs of one optimizer step over ``params`` parameters (not in ``train_flops``).

    Parameters
    ----------
    params : int
        Trainable parameters.
    optimizer : str
        A key of `OPTIMIZER_FLOPS_PER_PARAM`.

    Returns
    -------
    int

    Raises
    ------
    InputError
        For an unknown optimizer.

    """
    if optimizer not in OPTIMIZER_FLOPS_PER_PARAM:
        raise InputError(f"unknown optimizer {optimizer!r}; known: {', '.join(OPTIMIZER_FLOPS_PER_PARAM)}")
    return params * OPTIMIZER_FLOPS_PER_PARAM[optimizer]


# --------------------------------------------------------------------------- shape discovery


@dataclass(frozen=True)
class _Op:
    """One executed operation: what the formulas need from the trace."""

    name: str
    kind: str
    cost: _Cost
    params: int
    output_shape: tuple[int, ...]


def _pair(value: Any) -> tuple[int, int]:
    if isinstance(value, int):
        return (value, value)
    seq = tuple(value)
    return (int(seq[0]), int(seq[-1])) if len(seq) else (1, 1)


def _arg(args: Sequence[Any], kwargs: Mapping[str, Any], index: int, name: str, default: Any = None) -> Any:
    if len(args) > index:
        return args[index]
    return kwargs.get(name, default)


def _per_example(tensor: torch.Tensor, batch: int) -> int:
    return tensor.numel() // batch


class _Tracer(TorchFunctionMode):
    """Records every costly functional call made outside an ``nn.LSTM``."""

    def __init__(self, batch: int) -> None:
        super().__init__()
        self.batch = batch
        self.stack: list[tuple[str, bool]] = []  # (qualified name, is leaf)
        self.opaque = 0  # depth inside modules counted as one layer (LSTM)
        self.ops: list[_Op] = []
        self.seen_params: set[int] = set()
        self.calls: dict[str, int] = {}

    # naming ---------------------------------------------------------------
    def op_name(self, op: str) -> str:
        path, leaf = self.stack[-1] if self.stack else ("", False)
        base = path if leaf and path else (f"{path}.{op}" if path else op)
        n = self.calls.get(base, 0) + 1
        self.calls[base] = n
        return base if n == 1 else f"{base}#{n}"

    def new_params(self, tensors: Sequence[Any]) -> int:
        total = 0
        for t in tensors:
            if isinstance(t, nn.Parameter) and t.requires_grad and id(t) not in self.seen_params:
                self.seen_params.add(id(t))
                total += t.numel()
        return total

    def add(
        self, op: str, kind: str, cost: _Cost, params: int, out: torch.Tensor, batch_dim: int = 0
    ) -> None:
        shape = tuple(out.shape[:batch_dim]) + tuple(out.shape[batch_dim + 1 :])
        self.ops.append(_Op(self.op_name(op), kind, cost, params, tuple(int(s) for s in shape)))

    # interception ---------------------------------------------------------
    def __torch_function__(
        self,
        func: Callable[..., Any],
        types: Any,
        args: Sequence[Any] = (),
        kwargs: Mapping[str, Any] | None = None,
    ) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if self.opaque == 0 and isinstance(out, torch.Tensor):
            self.record(getattr(func, "__name__", str(func)), args, kwargs, out)
        return out

    def record(self, op: str, args: Sequence[Any], kwargs: Mapping[str, Any], out: torch.Tensor) -> None:
        if op in _ZERO_COST:
            return
        n = _per_example(out, self.batch)
        params = self.new_params([*args, *kwargs.values()])
        if op in ("conv1d", "conv2d", "conv3d"):
            weight = _arg(args, kwargs, 1, "weight")
            bias = _arg(args, kwargs, 2, "bias")
            self.add(op, "conv", conv2d_cost(n, tuple(weight.shape), bias is not None), params, out)
        elif op == "linear":
            weight = _arg(args, kwargs, 1, "weight")
            bias = _arg(args, kwargs, 2, "bias")
            self.add(op, "linear", linear_cost(n, int(weight.shape[1]), bias is not None), params, out)
        elif op == "embedding":
            self.add(op, "embedding", embedding_cost(n), params, out)
        elif op == "batch_norm":
            affine = _arg(args, kwargs, 3, "weight") is not None
            self.add(op, "batchnorm", batchnorm_cost(n, affine), params, out)
        elif op in ("max_pool2d", "_max_pool2d"):
            self.add(op, "maxpool", maxpool_cost(n, _pair(_arg(args, kwargs, 1, "kernel_size"))), params, out)
        elif op == "avg_pool2d":
            self.add(op, "avgpool", avgpool_cost(n, _pair(_arg(args, kwargs, 1, "kernel_size"))), params, out)
        elif op == "adaptive_avg_pool2d":
            x = args[0]
            channels = math.prod(x.shape[:-2]) // self.batch
            cost = adaptive_avgpool_cost(channels, tuple(x.shape[-2:]), tuple(out.shape[-2:]))
            self.add(op, "avgpool", cost, params, out)
        elif op in ("dropout", "dropout1d", "dropout2d", "feature_dropout", "alpha_dropout"):
            training = bool(_arg(args, kwargs, 2, "training", True))
            p = float(_arg(args, kwargs, 1, "p", 0.5))
            if training and p > 0.0:
                self.add(op, "dropout", elementwise_cost(n), params, out)
        elif op in _ELEMENTWISE:
            kind = _ELEMENTWISE[op]
            if kind == "mul" and not all(isinstance(a, torch.Tensor) for a in args[:2]):
                kind = "scale"
            self.add(op, kind, elementwise_cost(n), params, out)
        else:
            self.add(op, "untracked", _Cost(), params, out)

    # module hooks ---------------------------------------------------------
    def pre_hook(self, name: str, leaf: bool, opaque: bool) -> Callable[..., None]:
        def hook(module: nn.Module, inputs: Any) -> None:
            self.stack.append((name, leaf))
            if opaque:
                self.opaque += 1

        return hook

    def post_hook(self, name: str, opaque: bool) -> Callable[..., None]:
        def hook(module: nn.Module, inputs: Any, output: Any) -> None:
            if opaque:
                self.opaque -= 1
                if self.opaque == 0:
                    self.record_lstm(module, inputs, output)
            self.stack.pop()

        return hook

    def record_lstm(self, module: nn.Module, inputs: Any, output: Any) -> None:
        assert isinstance(module, nn.LSTM)
        if module.proj_size:
            raise InputError("LSTM with proj_size is not supported by the FLOPs counter")
        x = inputs[0]
        out = output[0]
        step_dim = 1 if module.batch_first else 0
        steps = int(x.shape[step_dim]) if x.dim() == 3 else 1
        cost = lstm_cost(
            module.input_size,
            module.hidden_size,
            module.num_layers,
            steps,
            bool(module.bias),
            module.bidirectional,
        )
        batch_dim = 0 if (module.batch_first or x.dim() == 2) else 1
        self.add("lstm", "lstm", cost, self.new_params(list(module.parameters())), out, batch_dim)


@contextmanager
def _hooked(module: nn.Module, tracer: _Tracer) -> Iterator[None]:
    handles = []
    for name, sub in module.named_modules():
        opaque = isinstance(sub, nn.LSTM)
        leaf = opaque or not any(True for _ in sub.children())
        handles.append(sub.register_forward_pre_hook(tracer.pre_hook(name, leaf, opaque)))
        handles.append(sub.register_forward_hook(tracer.post_hook(name, opaque)))
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def _trace(module: nn.Module, model: ZooModel) -> list[_Op]:
    """Run ``module`` once in training mode on zeros and return the executed operations."""
    dtype = torch.int64 if model.input_dtype == "int64" else torch.float32
    module.train()
    last_error: Exception | None = None
    for batch in (1, 2):  # BatchNorm1d in training mode needs 2 examples
        tracer = _Tracer(batch)
        x = torch.zeros((batch, *model.input_shape), dtype=dtype)
        try:
            with torch.no_grad(), _hooked(module, tracer), tracer:
                module(x)
        except ValueError as error:
            last_error = error
            continue
        return tracer.ops
    raise InputError(f"{model.name}: shape discovery failed: {last_error}")


# --------------------------------------------------------------------------- public API


def count_module(module: nn.Module, model: ZooModel) -> Counts:
    """Count an already built module of ``model`` (see `count`).

    Parameters
    ----------
    module : torch.nn.Module
        A module built by ``model.build``.
    model : ZooModel
        Supplies the input shape and dtype.

    Returns
    -------
    Counts

    """
    ops = _trace(module, model)
    layers = []
    seen_params = False
    for op in ops:
        needs_input_grad = seen_params  # gradient flows into this op only below a parameter
        train = op.cost.train_flops(needs_input_grad=needs_input_grad, backprop=seen_params or op.params > 0)
        layers.append(
            LayerCount(op.name, op.kind, op.params, op.cost.macs, op.cost.flops, train, op.output_shape)
        )
        seen_params = seen_params or op.params > 0
    params = sum(p.numel() for p in module.parameters() if p.requires_grad)
    return Counts(
        params=params,
        macs=sum(layer.macs for layer in layers),
        flops=sum(layer.flops for layer in layers),
        train_flops=sum(layer.train_flops for layer in layers),
        layers=tuple(layers),
    )


def count(model: ZooModel, arch: Arch) -> Counts:
    """Count params, MACs, forward FLOPs and training-step FLOPs of one example.

    Parameters
    ----------
    model : ZooModel
        The zoo model.
    arch : Arch
        One width per neuron group of ``model``.

    Returns
    -------
    Counts
        Totals and the per-layer breakdown; the convention is in the module docstring.

    Raises
    ------
    InputError
        If ``arch`` does not fit ``model``.

    """
    return count_module(model.build(arch), model)
