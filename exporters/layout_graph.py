"""Neuron groups and parameter layouts of any PyTorch model, found by a dependency graph.

The zoo writes, per model, which neuron group indexes each dimension of each parameter
(`exporters.arch.ParamLayout`). A user's model has no such layout; this module derives
it. torch-pruning's ``DependencyGraph`` traces the model once and finds the coupled
channel groups: the channels a residual add ties together, a depthwise conv's inputs and
outputs, the BatchNorm after a conv, a flatten into a linear layer, a concatenation.
Each group is rooted at the layer whose outputs it names (a conv's output channels, a
linear layer's output units).

How a group indexes each parameter is read off torch-pruning's own pruning rather than
from a table per layer kind, so that every layer kind torch-pruning can slice is covered
and the layout says exactly what pruning does: a float64 copy of the model holds, in every
parameter, each element's flat position in the full tensor; the groups are pruned one
after another, each at a seeded random half of its neurons; a dimension whose surviving
positions change when group ``g`` is pruned is indexed by ``g``, and the `Dim` (blocks and
positions per neuron) is the one that reproduces the survivors exactly. A group whose
pruning no `Dim` describes (a reshape that mixes channels, a layer torch-pruning slices
inconsistently), whose pruning breaks the forward pass or changes the model's output
shape, cannot be sliced: it is refused, or, on request, kept at full width.

The model's input and the classifier's output stay full: the graph only ever prunes
layer outputs, and the layer that produces the model's output is excluded.

`prune_to_sizes` builds a sub-model: the same pruning, keeping the first ``w`` neurons
of every group (the prefix sub-model that `exporters.arch.static_submodel` names).
"""

from __future__ import annotations

import copy
import warnings
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import cast

import numpy as np
import torch
from torch import nn

from exporters.arch import Dim, ParamLayout, expand_indices
from exporters.userinput import InputError

#: What to do with a group the graph cannot slice: refuse the model, or keep the group full.
UNSLICEABLE_POLICIES = ("refuse", "keep")

#: Seed of the random neuron subsets the layouts are read from.
_PROBE_SEED = 20261127


@dataclass(frozen=True)
class GroupRoot:
    """Where a neuron group is rooted: the layer whose outputs are its neurons.

    Attributes
    ----------
    name : str
        Group name: the root layer's module name (``"features.3.conv.0.0"``).
    size : int
        Number of neurons ``K`` at full width.
    """

    name: str
    size: int


@dataclass(frozen=True)
class DerivedLayout:
    """The neuron groups and parameter layouts a dependency graph found in a model.

    Attributes
    ----------
    groups : tuple of GroupRoot
        Prunable groups, in the order their root layers run.
    layouts : mapping of str to ParamLayout
        Layout of every trainable parameter, by ``named_parameters`` name.
    kept_full : tuple of str
        One line per group that could not be sliced and stays at full width.
    """

    groups: tuple[GroupRoot, ...]
    layouts: Mapping[str, ParamLayout]
    kept_full: tuple[str, ...] = ()


class UnsliceableGroup(InputError):
    """A neuron group whose pruning no layout describes (see the module docstring)."""

    def __init__(self, root: str, reason: str) -> None:
        super().__init__(f"layer {root!r} cannot be sliced: {reason}")
        self.root = root


def _graph(model: nn.Module, example: torch.Tensor) -> object:
    import torch_pruning as tp

    with warnings.catch_warnings(), _quiet(), torch.enable_grad():  # the graph is traced through autograd
        warnings.simplefilter("ignore")
        try:
            return tp.DependencyGraph().build_dependency(
                model, example_inputs=example, verbose=False
            )
        except Exception as exc:  # the tracer raises anything a forward pass can
            raise InputError(f"the dependency graph cannot trace the model: {exc}") from exc


@contextmanager
def _quiet() -> Iterator[None]:
    import logging

    logger = logging.getLogger("torch_pruning")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def output_layer(model: nn.Module, example: torch.Tensor) -> nn.Module | None:
    """Return the leaf layer whose output is the model's output, if one is.

    Parameters
    ----------
    model : torch.nn.Module
    example : torch.Tensor
        A batch the model accepts.

    Returns
    -------
    torch.nn.Module or None
        The classifier (its output units stay full), or ``None`` when the output is made
        by a function rather than a layer.
    """
    outputs: dict[int, nn.Module] = {}
    hooks = [
        leaf.register_forward_hook(lambda m, _i, out: outputs.__setitem__(id(out), m))
        for leaf in model.modules()
        if not list(leaf.children())
    ]
    try:
        with torch.no_grad():
            result = model(example)
    finally:
        for hook in hooks:
            hook.remove()
    return outputs.get(id(result))


def _root_types() -> tuple[type, ...]:
    return (nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.Linear, nn.LSTM)


def _group_roots(graph: object, classifier: nn.Module | None, order: Mapping[int, int]) -> list[tuple[nn.Module, int]]:
    # Each group is rooted at its earliest layer (in module order) whose outputs it prunes,
    # so that a group is named after the layer that makes its channels.
    roots = []
    for group in graph.get_all_groups(root_module_types=_root_types()):  # type: ignore[attr-defined]
        dep, idxs = group[0]
        if dep.target.module is classifier:
            continue
        members: list[nn.Module] = [
            cast(nn.Module, d.target.module)
            for d, _ in group
            if isinstance(d.target.module, _root_types()) and graph.is_out_channel_pruning_fn(d.handler)  # type: ignore[attr-defined]
        ]
        roots.append((min(members, key=lambda m: order.get(id(m), 1 << 30)), len(idxs)))
    return roots


def _prune(graph: object, module: nn.Module, remove: Sequence[int]) -> None:
    pruner = graph.get_pruner_of_module(module)  # type: ignore[attr-defined]
    with warnings.catch_warnings(), _quiet():
        warnings.simplefilter("ignore")
        graph.get_pruning_group(module, pruner.prune_out_channels, list(remove)).prune()  # type: ignore[attr-defined]


#: Largest parameter whose element positions float32 markers hold exactly.
MAX_MARKED = 2**24


def _survivors(tensor: torch.Tensor, full_shape: Sequence[int], axis: int) -> np.ndarray:
    # Every element holds its flat position in the full tensor. The positions along one
    # line through ``axis`` give the full tensor's coordinates that survive on that axis.
    line = tensor.detach()
    for other in reversed(range(line.dim())):
        if other != axis:
            line = line.select(other, 0)
    flat = line.numpy().astype(np.int64)
    return np.unravel_index(flat, tuple(full_shape))[axis]


def _fit_dim(group: str, size: int, length: int, kept: np.ndarray, survivors: np.ndarray) -> Dim | None:
    if length % size:
        return None
    per_neuron = length // size
    for blocks in range(1, per_neuron + 1):
        if per_neuron % blocks:
            continue
        dim = Dim(group, blocks=blocks, inner=per_neuron // blocks)
        if np.array_equal(expand_indices(kept, dim, size), survivors):
            return dim
    return None


def _marked(model: nn.Module) -> tuple[nn.Module, dict[str, tuple[int, ...]]]:
    probe = copy.deepcopy(model)
    shapes = {}
    with torch.no_grad():
        for name, param in probe.named_parameters():
            if param.numel() > MAX_MARKED:
                raise InputError(f"parameter {name} has {param.numel():,} elements, more than {MAX_MARKED:,}")
            shapes[name] = tuple(param.shape)
            param.copy_(torch.arange(param.numel(), dtype=torch.float32).reshape(param.shape).to(param.dtype))
    return probe, shapes


def _probe(
    model: nn.Module, example: torch.Tensor, classifier: str | None, skip: set[str]
) -> tuple[list[GroupRoot], dict[str, list[Dim | None]]]:
    probe, shapes = _marked(model)
    modules = dict(probe.named_modules())
    names = {id(m): n for n, m in modules.items()}
    graph = _graph(probe, example)
    with torch.no_grad():
        out_shape = tuple(probe(example).shape)
    rng = np.random.default_rng(_PROBE_SEED)
    layouts: dict[str, list[Dim | None]] = {n: [None] * len(s) for n, s in shapes.items()}
    roots: list[GroupRoot] = []
    order = {id(m): i for i, m in enumerate(modules.values())}
    for module, size in _group_roots(graph, None if classifier is None else modules[classifier], order):
        root = names[id(module)]
        if size < 2 or root in skip:
            continue
        before = dict(probe.named_parameters())
        kept = np.sort(rng.choice(size, size=max(1, size // 2), replace=False)).astype(np.int64)
        try:
            _prune(graph, module, sorted(set(range(size)) - set(kept.tolist())))
            with torch.no_grad():
                shape = tuple(probe(example).shape)
        except Exception as exc:  # a failed prune or forward is what makes a group unsliceable
            raise UnsliceableGroup(root, f"pruning it breaks the model ({type(exc).__name__}: {exc})") from exc
        if shape != out_shape:
            raise UnsliceableGroup(root, f"its channels reach the model's output {out_shape}")
        touched = False
        for name, param in probe.named_parameters():
            old = before[name]
            for axis in range(param.dim()):
                if param.shape[axis] == old.shape[axis]:
                    continue
                _refuse_grouped(root, name, modules)
                if layouts[name][axis] is not None or old.shape[axis] != shapes[name][axis]:
                    raise UnsliceableGroup(root, f"dimension {axis} of {name} is cut by two groups")
                dim = _fit_dim(root, size, shapes[name][axis], kept, _survivors(param, shapes[name], axis))
                if dim is None:
                    raise UnsliceableGroup(root, f"no channel layout describes how {name} (dimension {axis}) is cut")
                layouts[name][axis] = dim
                touched = True
        if touched:
            roots.append(GroupRoot(root, size))
    position = {name: i for i, name in enumerate(modules)}
    return sorted(roots, key=lambda g: position[g.name]), layouts


def _refuse_grouped(root: str, param: str, modules: Mapping[str, nn.Module]) -> None:
    # A grouped (not depthwise) convolution can only lose channels in multiples of its
    # groups, which no single width rule keeps.
    owner = param.rpartition(".")[0]
    layer = modules.get(owner)
    if isinstance(layer, nn.modules.conv._ConvNd) and layer.groups > 1 and layer.groups != layer.out_channels:
        raise UnsliceableGroup(
            root,
            f"its channels meet {owner}, a grouped convolution (groups {layer.groups}), cut only in multiples of those",
        )


def _name_in(model: nn.Module, module: nn.Module) -> str:
    for name, candidate in model.named_modules():
        if candidate is module:
            return name
    return ""


def derive_layout(model: nn.Module, example: torch.Tensor, *, unsliceable: str = "refuse") -> DerivedLayout:
    """Find a model's neuron groups and every parameter's layout.

    Parameters
    ----------
    model : torch.nn.Module
        The model at full width (not modified).
    example : torch.Tensor
        A batch of at least two examples of the model's input.
    unsliceable : {"refuse", "keep"}
        What to do with a group that cannot be sliced: raise, or keep it at full width
        and say so in `DerivedLayout.kept_full`.

    Returns
    -------
    DerivedLayout

    Raises
    ------
    InputError
        If the graph cannot trace the model, if a group cannot be sliced and
        ``unsliceable`` is ``"refuse"`` (`UnsliceableGroup`, naming the layer), or if
        no group can be sliced at all.
    """
    if unsliceable not in UNSLICEABLE_POLICIES:
        raise InputError(f"unsliceable {unsliceable!r} is not one of {', '.join(UNSLICEABLE_POLICIES)}")
    model = model.eval()
    layer = output_layer(model, example)
    classifier = None if layer is None else _name_in(model, layer)
    skip: set[str] = set()
    kept_full: list[str] = []
    while True:
        try:
            roots, layouts = _probe(model, example, classifier, skip)
        except UnsliceableGroup as exc:
            if unsliceable == "refuse" or exc.root in skip:
                raise
            skip.add(exc.root)
            kept_full.append(f"{exc}; kept at full width")
            continue
        break
    if not roots:
        why = "; ".join(kept_full) or "no conv, linear or LSTM output can be sliced"
        raise InputError(f"the model has no prunable channel group ({why})")
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    return DerivedLayout(
        groups=tuple(roots),
        layouts={n: tuple(dims) for n, dims in layouts.items() if n in trainable},
        kept_full=tuple(kept_full),
    )


def prune_to_sizes(
    model: nn.Module, example: torch.Tensor, groups: Sequence[GroupRoot], group_sizes: Mapping[str, int]
) -> nn.Module:
    """Prune a full-width model in place to the prefix sub-model of ``group_sizes``.

    Parameters
    ----------
    model : torch.nn.Module
        A fresh full-width model; modified and returned.
    example : torch.Tensor
        A batch the model accepts (for the trace).
    groups : sequence of GroupRoot
        The groups of `derive_layout`.
    group_sizes : mapping of str to int
        Kept neurons per group name; each group keeps neurons ``0 .. w-1``.

    Returns
    -------
    torch.nn.Module
        ``model``, pruned.
    """
    if all(group_sizes[g.name] == g.size for g in groups):
        return model
    modules = dict(model.named_modules())
    graph = _graph(model, example)
    for group in groups:
        if group_sizes[group.name] < group.size:
            _prune(graph, modules[group.name], range(group_sizes[group.name], group.size))
    return model


def make_static_batchnorm(model: nn.Module) -> list[str]:
    """Switch every BatchNorm of ``model`` to batch statistics, dropping running statistics.

    The ONNX Runtime training build cannot update running-statistics buffers, so a user's
    BatchNorm trains as the zoo's does: batch statistics in training and evaluation.

    Parameters
    ----------
    model : torch.nn.Module
        Modified in place.

    Returns
    -------
    list of str
        Names of the BatchNorm layers changed.
    """
    changed = []
    for name, module in model.named_modules():
        if isinstance(module, nn.modules.batchnorm._BatchNorm) and module.track_running_stats:
            module.track_running_stats = False
            module.running_mean = None
            module.running_var = None
            module.num_batches_tracked = None
            changed.append(name)
    return changed
