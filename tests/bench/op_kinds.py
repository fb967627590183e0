"""Operator kinds shared by ONNX Runtime's and PyTorch's profiles, so their step times compare kind by kind.

An ONNX operator type (from ORT's trace) and a PyTorch operator (``aten::...`` from
``torch.profiler``'s key averages) map to one of `KINDS`. The mapping is by name only:
the step model's optimizer update is element-wise ONNX operators, so for ``onnx`` it counts
under ``elementwise``, where PyTorch's fused ``_foreach`` / ``adamw`` kernels count under
``optimizer``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

#: Kinds in the order the profile table prints them.
KINDS = ("conv", "conv-grad", "matmul", "pool", "norm", "elementwise", "optimizer", "layout", "other")

_ONNX = {
    "conv": ("Conv",),
    "conv-grad": ("ConvTranspose", "ConvGrad"),
    "matmul": ("Gemm", "MatMul", "FusedMatMul", "FusedGemm"),
    "pool": ("MaxPool", "AveragePool", "GlobalAveragePool", "ScatterElements", "MaxPoolGrad", "AveragePoolGrad"),
    "norm": ("BatchNormalization", "ReduceMean", "ReduceSum", "BatchNormInternal", "BatchNormalizationGrad"),
    "optimizer": ("AdamWOptimizer", "SGDOptimizerV2", "InPlaceAccumulatorV2"),
    "layout": (
        "Slice", "Concat", "Transpose", "Reshape", "Pad", "Unsqueeze", "Squeeze", "Split", "Gather", "Expand",
        "Flatten", "Identity", "ConstantOfShape", "Shape", "Size", "ConcatTraining", "SplitTraining", "GatherGrad",
    ),
}  # fmt: skip

_TORCH = {
    "conv-grad": ("convolution_backward",),
    "conv": ("convolution", "conv2d", "conv1d"),
    "matmul": ("addmm", "mm", "bmm", "matmul", "linear", "lstm", "_thnn_fused"),
    "pool": ("pool",),
    "norm": ("batch_norm", "layer_norm", "sum", "mean"),
    "optimizer": ("_foreach", "adam", "lerp", "addcdiv", "addcmul"),
    "layout": (
        "copy_", "cat", "clone", "contiguous", "transpose", "permute", "view", "reshape", "t", "fill_", "zero_",
        "index", "slice", "select", "stack", "split", "narrow", "as_strided", "empty",
    ),
}  # fmt: skip


def onnx_kind(op_type: str) -> str:
    """Return the kind of an ONNX operator type (``elementwise`` unless listed elsewhere).

    Parameters
    ----------
    op_type : str

    Returns
    -------
    str
        One of `KINDS`.
    """
    for kind, ops in _ONNX.items():
        if op_type in ops:
            return kind
    return "elementwise"


def torch_kind(op: str) -> str:
    """Return the kind of a PyTorch profiler key (``aten::name``; ``other`` when not an aten operator).

    The first kind whose fragments appear in the operator's name wins, in the order of the
    table (a convolution's backward is ``conv-grad``, not ``conv``); an aten operator matching
    none is ``elementwise``.

    Parameters
    ----------
    op : str

    Returns
    -------
    str
        One of `KINDS`.
    """
    if not op.startswith("aten::"):
        return "other"
    name = op.removeprefix("aten::")
    for kind, fragments in _TORCH.items():
        if any(name == f or name.startswith(f + "_") or f in name and len(f) > 3 for f in fragments):
            return kind
    return "elementwise"


def by_kind(totals: Mapping[str, float], kind_of: Callable[[str], str]) -> dict[str, float]:
    """Sum per-operator times into per-kind times.

    Parameters
    ----------
    totals : mapping of str to float
        Time per operator.
    kind_of : callable
        `onnx_kind` or `torch_kind`.

    Returns
    -------
    dict of str to float
        Time per kind, every one of `KINDS` present (0 when none).
    """
    out = dict.fromkeys(KINDS, 0.0)
    for op, value in totals.items():
        out[kind_of(op)] += value
    return out
