"""Sub-model algebra: architectures, index sets and extraction.

A *neuron* is a conv output channel, a linear output unit or an LSTM hidden unit
(its four gate rows move together). A model of the zoo names its prunable layers
("neuron groups") and, for every parameter tensor, which group indexes each of
its dimensions (`Dim`). Everything else follows generically:

* an `Arch` is a model name plus one width (number of kept neurons) per group;
* a `SubModel` is an `Arch` plus, per group, the sorted global indices it keeps;
* `extract` slices every global tensor along its indexed dimensions.

Coupling rules are encoded in the layouts, not here: the first layer's input and
the classifier's output dimensions carry no group (always full), a layer's input
dimension names the previous layer's group, a conv -> linear flatten is a `Dim`
with ``inner = H*W`` (NCHW order: channel ``c`` owns columns ``c*H*W .. c*H*W+H*W-1``),
tensors added by an identity shortcut name the same group, and LSTM gate blocks
are a `Dim` with ``blocks = 4``.

All functions here are pure: no I/O, no global state.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from exporters.userinput import InputError

#: Widths every model is listed and exported at by default (here, not in the zoo, so that
#: the command line can offer them without importing PyTorch).
DEFAULT_WIDTHS = (0.25, 0.5, 0.75, 1.0)

#: The model the quickstart and the demo use.
DEFAULT_MODEL = "fjord-cnn"

#: Tolerance used when turning a width into a size, so that e.g. 0.6 * 5 (which is
#: 3.0000000000000004 in binary floating point) gives 3 neurons, not 4.
WIDTH_EPSILON = 1e-9


@dataclass(frozen=True)
class Dim:
    """How one tensor dimension is indexed by a neuron group.

    The global dimension has length ``blocks * K * inner`` where ``K`` is the
    group's full size; neuron ``i`` of block ``b`` owns the ``inner`` consecutive
    positions starting at ``(b * K + i) * inner``.

    Attributes
    ----------
    group : str
        Name of the neuron group.
    blocks : int
        Number of stacked copies of the group along the dimension (4 for the
        i, f, g, o gate blocks of an LSTM).
    inner : int
        Positions per neuron (``H * W`` for a conv -> linear flatten).
    """

    group: str
    blocks: int = 1
    inner: int = 1


#: Layout of one parameter: per dimension, the `Dim` indexing it or ``None`` (kept whole).
ParamLayout = tuple[Dim | None, ...]


@dataclass(frozen=True)
class Arch:
    """A model name plus the size of every neuron group.

    A width is a fraction of the full model; a size is a count of neurons. An
    architecture holds sizes: the width ``w`` of a group of ``K`` neurons is the size
    ``size_at_width(w, K)``.

    Attributes
    ----------
    model : str
        Zoo name of the model.
    sizes : tuple of int
        Number of kept neurons per neuron group, in the model's group order.
    """

    model: str
    sizes: tuple[int, ...]

    def key(self) -> str:
        """Return a stable string key, e.g. ``"cfd-cnn[16,32,1024]"``."""
        return f"{self.model}[{','.join(str(n) for n in self.sizes)}]"


@dataclass(frozen=True, eq=False)
class SubModel:
    """An `Arch` plus, per neuron group, the global indices it keeps.

    Attributes
    ----------
    arch : Arch
        The architecture; ``len(indices[g]) == arch.sizes[g]``.
    indices : tuple of numpy.ndarray
        Sorted, unique int64 global neuron indices per group.
    """

    arch: Arch
    indices: tuple[np.ndarray, ...]


def size_at_width(width: float, size: int) -> int:
    """Return the size ``ceil(width * size)`` of a group of ``size`` neurons kept at ``width``, never 0.

    Parameters
    ----------
    width : float
        Kept fraction in (0, 1].
    size : int
        Full number of neurons of the group.

    Returns
    -------
    int
        Number of kept neurons, between 1 and ``size``.

    Raises
    ------
    InputError
        If ``width`` is outside (0, 1].
    """
    if not (0.0 < width <= 1.0) or math.isnan(width):
        raise InputError(f"width {width!r} is outside (0, 1]")
    return max(1, min(size, math.ceil(width * size - WIDTH_EPSILON)))


def arch_at_width(model: str, group_sizes: Sequence[int], width: float) -> Arch:
    """Return the `Arch` keeping ``ceil(width * K)`` neurons of every group.

    Parameters
    ----------
    model : str
        Zoo name of the model.
    group_sizes : sequence of int
        Full size ``K`` of every neuron group, in group order.
    width : float
        Kept fraction in (0, 1].

    Returns
    -------
    Arch
    """
    return Arch(model, tuple(size_at_width(width, k) for k in group_sizes))


def static_submodel(arch: Arch) -> SubModel:
    """Return the prefix sub-model ``0 .. size-1`` per group (HeteroFL, FjORD).

    Parameters
    ----------
    arch : Arch

    Returns
    -------
    SubModel
    """
    return SubModel(arch, tuple(np.arange(w, dtype=np.int64) for w in arch.sizes))


def make_submodel(arch: Arch, group_sizes: Sequence[int], indices: Sequence[Sequence[int]]) -> SubModel:
    """Validate index sets against an `Arch` and build the `SubModel`.

    Parameters
    ----------
    arch : Arch
    group_sizes : sequence of int
        Full size of every group.
    indices : sequence of sequences of int
        Global indices kept per group (any order; sorted here).

    Returns
    -------
    SubModel

    Raises
    ------
    InputError
        If a set has the wrong length, repeats an index or leaves ``[0, K)``.
    """
    if len(indices) != len(group_sizes) or len(arch.sizes) != len(group_sizes):
        raise InputError(
            f"{arch.model}: expected {len(group_sizes)} index sets, got {len(indices)}"
        )
    kept = []
    for g, (idx, size, width) in enumerate(zip(indices, group_sizes, arch.sizes, strict=True)):
        arr = np.unique(np.asarray(idx, dtype=np.int64))
        if arr.size != len(idx) or arr.size != width:
            raise InputError(
                f"{arch.model}: group {g} needs {width} distinct indices, got {len(idx)}"
            )
        if arr.size and (arr[0] < 0 or arr[-1] >= size):
            raise InputError(f"{arch.model}: group {g} index outside [0, {size})")
        kept.append(arr)
    return SubModel(arch, tuple(kept))


def expand_indices(neurons: np.ndarray, dim: Dim, group_size: int) -> np.ndarray:
    """Map neuron indices to tensor positions along one dimension.

    Parameters
    ----------
    neurons : numpy.ndarray
        Sorted neuron indices of the group.
    dim : Dim
        How the dimension is laid out.
    group_size : int
        Full size ``K`` of the group.

    Returns
    -------
    numpy.ndarray
        Positions in block-major, then neuron, then inner order; length
        ``blocks * len(neurons) * inner``.
    """
    blocks = np.arange(dim.blocks, dtype=np.int64)[:, None, None] * group_size
    inner = np.arange(dim.inner, dtype=np.int64)[None, None, :]
    starts = (blocks + neurons.astype(np.int64)[None, :, None]) * dim.inner
    return (starts + inner).reshape(-1)


def tensor_index(
    layout: ParamLayout, submodel: SubModel, group_order: Mapping[str, int], group_sizes: Sequence[int]
) -> tuple[np.ndarray | slice, ...]:
    """Return, per dimension of one parameter, the positions a sub-model keeps.

    Parameters
    ----------
    layout : ParamLayout
        The parameter's layout.
    submodel : SubModel
    group_order : mapping of str to int
        Position of each group name in the model's group order.
    group_sizes : sequence of int
        Full size of every group.

    Returns
    -------
    tuple
        A ``slice(None)`` for whole dimensions, else an int64 position array.
    """
    out: list[np.ndarray | slice] = []
    for dim in layout:
        if dim is None:
            out.append(slice(None))
        else:
            g = group_order[dim.group]
            out.append(expand_indices(submodel.indices[g], dim, group_sizes[g]))
    return tuple(out)


def take(tensor: np.ndarray, index: tuple[np.ndarray | slice, ...]) -> np.ndarray:
    """Slice ``tensor`` by one position array (or slice) per dimension.

    Parameters
    ----------
    tensor : numpy.ndarray
    index : tuple
        As returned by `tensor_index`.

    Returns
    -------
    numpy.ndarray
        A new contiguous array.
    """
    out = tensor
    for axis, pos in enumerate(index):
        if not isinstance(pos, slice):
            out = np.take(out, pos, axis=axis)
    return np.ascontiguousarray(out)


def extract(
    global_state: Mapping[str, np.ndarray],
    submodel: SubModel,
    layouts: Mapping[str, ParamLayout],
    group_names: Sequence[str],
    group_sizes: Sequence[int],
) -> dict[str, np.ndarray]:
    """Slice the global model's tensors down to a sub-model's tensors.

    Parameters
    ----------
    global_state : mapping of str to numpy.ndarray
        Full-width parameters by name.
    submodel : SubModel
    layouts : mapping of str to ParamLayout
        Layout of every parameter; names missing here are an error.
    group_names, group_sizes : sequences
        The model's neuron groups in order.

    Returns
    -------
    dict of str to numpy.ndarray
        Sub-model parameters, same names and order as ``global_state``.

    Raises
    ------
    InputError
        If a parameter has no layout or a rank that disagrees with it.
    """
    order = {name: i for i, name in enumerate(group_names)}
    out: dict[str, np.ndarray] = {}
    for name, tensor in global_state.items():
        if name not in layouts:
            raise InputError(f"{submodel.arch.model}: no layout for parameter {name!r}")
        layout = layouts[name]
        if len(layout) != np.ndim(tensor):
            raise InputError(
                f"{submodel.arch.model}: {name!r} has rank {np.ndim(tensor)}, layout {len(layout)}"
            )
        out[name] = take(np.asarray(tensor), tensor_index(layout, submodel, order, group_sizes))
    return out


def parse_widths(text: str) -> tuple[float, ...]:
    """Parse ``"0.25,0.5,1"`` into widths, each in (0, 1].

    Parameters
    ----------
    text : str
        Comma-separated widths.

    Returns
    -------
    tuple of float
        The widths in the order given, duplicates removed.

    Raises
    ------
    InputError
        If an item is not a number or lies outside (0, 1].
    """
    widths: list[float] = []
    for item in text.split(","):
        try:
            value = float(item)
        except ValueError:
            raise InputError(f"width {item.strip()!r} is not a number") from None
        if not 0.0 < value <= 1.0:
            raise InputError(f"width {value:g} is outside (0, 1]")
        if value not in widths:
            widths.append(value)
    return tuple(widths)
