"""The model zoo: every model of the five papers, width-scalable.

Each paper has one module here (``cfd``, ``fjord``, ``heterofl``, ``feddrop``,
``fluid``) exposing ``MODELS``: a mapping from zoo name to a zero-argument
factory returning a `ZooModel`. A `ZooModel` couples a model's neuron groups
with a builder and the per-parameter layouts that `exporters.arch.extract`
needs, so one generic algebra serves every model.

Conventions shared by every model:

* ``builder(group_sizes)`` returns a ``torch.nn.Module`` whose ``forward(x)`` returns
  logits of shape ``(N, num_classes)``; the loss is cross-entropy against int64
  labels of shape ``(N,)``.
* parameter names are those of ``module.named_parameters()`` and are identical
  for every width; buffers are not parameters and there are none that training
  must update (BatchNorm is static: batch statistics in train and eval).
* the input of one example has shape ``input_shape`` and dtype ``input_dtype``
  (``float32`` images in NCHW, ``int64`` character ids for text models).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import cache

import numpy as np
import torch
from torch import nn

from exporters.arch import Arch, ParamLayout, SubModel, arch_at_width, extract, static_submodel
from exporters.userinput import InputError

_PAPER_MODULES = ("cfd", "fjord", "heterofl", "feddrop", "fluid")


@dataclass(frozen=True)
class ZooModel:
    """A width-scalable model: its neuron groups, builder and parameter layouts.

    Attributes
    ----------
    name : str
        Zoo name, e.g. ``"fjord-cnn"``.
    paper : str
        Which paper (and table) the model comes from.
    groups : tuple of (str, int)
        Prunable neuron groups in order: name and full size ``K``.
    builder : callable
        Maps ``{group name: size}`` (the neurons each group keeps) to a ``torch.nn.Module``.
    layouts : mapping of str to ParamLayout
        Layout of every parameter of the built module.
    input_shape : tuple of int
        Shape of one example (no batch dimension).
    input_dtype : str
        ``"float32"`` or ``"int64"``.
    num_classes : int
        Number of output logits.
    paper_widths : tuple of float
        Widths the paper itself reports (listed by ``fleetbench models``).
    source : str
        Where a user's model is defined (``file.py:factory``); empty for the zoo.
    digest : str
        sha256 of a user's model's definition (`exporters.user_model.definition_digest`).
    notes : tuple of str
        What a listing should say about the model: layers kept at full width, BatchNorm
        layers made static.
    """

    name: str
    paper: str
    groups: tuple[tuple[str, int], ...]
    builder: Callable[[Mapping[str, int]], nn.Module]
    layouts: Mapping[str, ParamLayout]
    input_shape: tuple[int, ...]
    input_dtype: str
    num_classes: int
    paper_widths: tuple[float, ...] = field(default=())
    source: str = ""
    digest: str = ""
    notes: tuple[str, ...] = ()

    @property
    def group_names(self) -> tuple[str, ...]:
        """Names of the neuron groups, in order."""
        return tuple(name for name, _ in self.groups)

    @property
    def group_sizes(self) -> tuple[int, ...]:
        """Full size of every neuron group, in order."""
        return tuple(size for _, size in self.groups)

    def full_arch(self) -> Arch:
        """Return the full-width `Arch`."""
        return Arch(self.name, self.group_sizes)

    def arch(self, width: float) -> Arch:
        """Return the `Arch` keeping ``ceil(width * K)`` neurons of every group."""
        return arch_at_width(self.name, self.group_sizes, width)

    def build(self, arch: Arch | None = None) -> nn.Module:
        """Build the torch module for ``arch`` (full width when ``None``)."""
        arch = arch or self.full_arch()
        self._check(arch)
        return self.builder(dict(zip(self.group_names, arch.sizes, strict=True)))

    def extract(self, global_state: Mapping[str, np.ndarray], submodel: SubModel) -> dict[str, np.ndarray]:
        """Slice full-width parameters to ``submodel``'s (see `exporters.arch.extract`)."""
        self._check(submodel.arch)
        return extract(global_state, submodel, self.layouts, self.group_names, self.group_sizes)

    def static(self, width: float) -> SubModel:
        """Return the prefix sub-model at ``width`` (HeteroFL static / FjORD ordered)."""
        return static_submodel(self.arch(width))

    def example_batch(self, batch: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        """Return a deterministic ``(inputs, labels)`` batch of random data."""
        gen = torch.Generator().manual_seed(seed)
        shape = (batch, *self.input_shape)
        if self.input_dtype == "int64":
            x = torch.randint(0, self._vocab(), shape, generator=gen, dtype=torch.int64)
        else:
            x = torch.randn(shape, generator=gen, dtype=torch.float32)
        y = torch.randint(0, self.num_classes, (batch,), generator=gen, dtype=torch.int64)
        return x, y

    def _vocab(self) -> int:
        return self.num_classes

    def _check(self, arch: Arch) -> None:
        if arch.model != self.name:
            raise InputError(f"arch is for {arch.model!r}, not {self.name!r}")
        if len(arch.sizes) != len(self.groups):
            raise InputError(f"{self.name}: arch has {len(arch.sizes)} sizes, model {len(self.groups)} groups")
        for kept, (group, size) in zip(arch.sizes, self.groups, strict=True):
            if not 1 <= kept <= size:
                raise InputError(f"{self.name}: {kept} neurons of {group!r} outside [1, {size}]")


@cache
def _factories() -> dict[str, Callable[[], ZooModel]]:
    found: dict[str, Callable[[], ZooModel]] = {}
    for module_name in _PAPER_MODULES:
        module = importlib.import_module(f"exporters.zoo.{module_name}")
        found.update(module.MODELS)
    return found


def model_names() -> tuple[str, ...]:
    """Return every zoo model name, sorted."""
    return tuple(sorted(_factories()))


@cache
def get_model(name: str) -> ZooModel:
    """Return the zoo model called ``name``, or the user's model it names.

    A name that is not the zoo's is resolved by `exporters.user_model.user_model`:
    ``file.py:factory``, ``module:factory``, an entry point, or ``factory@digest``.

    Raises
    ------
    InputError
        If no model has that name (the message lists the known names).
    """
    factories = _factories()
    if name in factories:
        return factories[name]()
    from exporters.user_model import is_user_spec, registered_entry, user_model

    if not is_user_spec(name) and registered_entry(name) is None:
        raise InputError(
            f"unknown model {name!r}; known models: {', '.join(sorted(factories))}; "
            f"or your own: FILE.py:FACTORY or MODULE:FACTORY"
        )
    return user_model(name)

