"""Layouts derived by the dependency graph (`exporters.layout_graph`) against the zoo's hand-written ones.

For every zoo model the graph can slice, the derived groups are the hand-written groups
(matched by the parameter dimensions they index, since the graph names a group after its
first layer), the pruned module has the zoo builder's parameter shapes at every width, and
`extract` through the derived layouts gives the same tensors as through the hand layouts for
random index sets. The LSTMs are the models the graph cannot slice: their hand layouts stay.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch
from torch import nn

from exporters.arch import DEFAULT_WIDTHS, Arch, SubModel, extract, make_submodel
from exporters.layout_graph import (
    DerivedLayout,
    UnsliceableGroup,
    derive_layout,
    make_static_batchnorm,
    output_layer,
    prune_to_sizes,
)
from exporters.userinput import InputError
from exporters.zoo import ZooModel, get_model, model_names

LSTMS = ("feddrop-lstm", "fjord-rnn", "fluid-lstm")
DERIVABLE = tuple(name for name in model_names() if name not in LSTMS)


def _derive(model: ZooModel) -> DerivedLayout:
    x, _ = model.example_batch(2)
    return derive_layout(model.build(), x)


def _signature(layouts: dict, group: str) -> frozenset:
    return frozenset(
        (param, axis, dim.blocks, dim.inner)
        for param, layout in layouts.items()
        for axis, dim in enumerate(layout)
        if dim is not None and dim.group == group
    )


def _matching(model: ZooModel, derived: DerivedLayout) -> dict[str, str]:
    """Hand group name -> derived group name, matched by what they index."""
    hand = {_signature(dict(model.layouts), g): g for g in model.group_names}
    found = {_signature(dict(derived.layouts), g.name): g.name for g in derived.groups}
    assert set(hand) == set(found), f"{model.name}: groups differ"
    return {hand[sig]: found[sig] for sig in hand}


@functools.cache
def _derived(name: str) -> DerivedLayout:
    """A zoo model's derived layout, derived once (by the first test that asks) and shared."""
    return _derive(get_model(name))


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.mark.parametrize("name", DERIVABLE)
def test_derived_groups_are_the_hand_written_groups(name: str) -> None:
    model = get_model(name)
    layout = _derived(name)
    pairs = _matching(model, layout)
    sizes = {g.name: g.size for g in layout.groups}
    assert {pairs[g]: k for g, k in model.groups} == sizes
    # Every parameter dimension either layout leaves whole, the other does too.
    for param, hand in model.layouts.items():
        got = layout.layouts[param]
        assert [d is None for d in got] == [d is None for d in hand], param
    assert layout.kept_full == ()


@pytest.mark.parametrize("name", DERIVABLE)
def test_pruned_module_has_the_builders_shapes_at_every_width(name: str) -> None:
    model = get_model(name)
    layout = _derived(name)
    pairs = _matching(model, layout)
    x, _ = model.example_batch(2)
    for rate in sorted(set(DEFAULT_WIDTHS) | set(model.paper_widths) | {0.1, 0.3}):
        arch = model.arch(rate)
        group_sizes = {pairs[g]: w for g, w in zip(model.group_names, arch.sizes, strict=True)}
        pruned = prune_to_sizes(model.build(), x, layout.groups, group_sizes)
        built = model.build(arch)
        assert {n: p.shape for n, p in pruned.named_parameters()} == {n: p.shape for n, p in built.named_parameters()}
        assert pruned(x).shape == (2, model.num_classes)


@pytest.mark.parametrize("name", DERIVABLE)
def test_extract_through_derived_layouts_equals_hand_layouts(name: str) -> None:
    model = get_model(name)
    layout = _derived(name)
    pairs = _matching(model, layout)
    order = [g.name for g in layout.groups]
    rng = np.random.default_rng(7)
    state = {n: rng.standard_normal(tuple(p.shape)).astype(np.float32) for n, p in model.build().named_parameters()}
    for rate in (0.3, 0.5, 0.8):
        arch = model.arch(rate)
        indices = [
            np.sort(rng.choice(k, size=w, replace=False)) for (_, k), w in zip(model.groups, arch.sizes, strict=True)
        ]
        hand = model.extract(state, make_submodel(arch, model.group_sizes, indices))
        by_derived = {pairs[g]: idx for g, idx in zip(model.group_names, indices, strict=True)}
        sizes = {g.name: g.size for g in layout.groups}
        derived_arch = Arch(model.name, tuple(len(by_derived[g]) for g in order))
        sub = SubModel(derived_arch, tuple(by_derived[g] for g in order))
        got = extract(state, sub, layout.layouts, order, [sizes[g] for g in order])
        assert list(got) == list(hand)
        for param in hand:
            np.testing.assert_array_equal(got[param], hand[param], err_msg=param)


def test_pruning_keeps_the_prefix_of_every_group() -> None:
    model = get_model("fjord-resnet18")
    x, _ = model.example_batch(2)
    layout = _derived(model.name)
    torch.manual_seed(5)
    full = model.build()
    state = {n: p.detach().clone() for n, p in full.named_parameters()}
    group_sizes = {g.name: max(1, g.size // 3) for g in layout.groups}
    pruned = prune_to_sizes(full, x, layout.groups, group_sizes)
    conv = pruned.get_parameter("layer2.0.conv1.weight")
    want = state["layer2.0.conv1.weight"][: conv.shape[0], : conv.shape[1]]
    np.testing.assert_array_equal(conv.detach().numpy(), want.numpy())


@pytest.mark.parametrize("name", LSTMS)
def test_lstm_layers_are_refused_by_name(name: str) -> None:
    model = get_model(name)
    x, _ = model.example_batch(2)
    with pytest.raises(UnsliceableGroup, match=r"layer '(lstm|lstm1|lstm2)' cannot be sliced"):
        derive_layout(model.build(), x)


class _Grouped(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, padding=1)
        self.wide = nn.Conv2d(8, 16, 3, padding=1)
        self.grouped = nn.Conv2d(16, 16, 3, padding=1, groups=4)
        self.fc = nn.Linear(16, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.wide(torch.relu(self.stem(x))))
        return self.fc(torch.relu(self.grouped(x)).mean((2, 3)))


def test_a_grouped_convolution_is_refused_or_kept_full() -> None:
    x = torch.randn(2, 3, 8, 8)
    with pytest.raises(UnsliceableGroup, match="grouped convolution"):
        derive_layout(_Grouped(), x)
    layout = derive_layout(_Grouped(), x, unsliceable="keep")
    assert [g.name for g in layout.groups] == ["stem"]
    assert len(layout.kept_full) == 2 and all("kept at full width" in line for line in layout.kept_full)
    assert all(d is None for d in layout.layouts["grouped.weight"])


class _Shuffle(nn.Module):
    """A channel shuffle: the reshape mixes channels across groups (then a 2x2 pool and a flatten:
    the dependency graph's index mapping of a flatten grows with the features it flattens)."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Conv2d(3, 8, 3, padding=1)
        self.b = nn.Conv2d(8, 8, 3, padding=1)
        self.fc = nn.Linear(8 * 4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.b(torch.relu(self.a(x)))
        n, c, h, w = x.shape
        x = x.view(n, 2, c // 2, h, w).transpose(1, 2).reshape(n, c, h, w)
        return self.fc(torch.flatten(nn.functional.adaptive_avg_pool2d(x, 2), 1))


def test_a_reshape_that_mixes_channels_is_refused() -> None:
    with pytest.raises(UnsliceableGroup, match="layer 'b' cannot be sliced"):
        derive_layout(_Shuffle(), torch.randn(2, 3, 8, 8))


def test_the_classifier_output_and_the_input_stay_full() -> None:
    model = get_model("fluid-vgg9")
    x, _ = model.example_batch(2)
    net = model.build()
    assert output_layer(net, x) is net.fc3
    layout = derive_layout(net, x)
    assert layout.layouts["fc3.weight"][0] is None and layout.layouts["fc3.bias"] == (None,)
    assert layout.layouts["convs.0.weight"][1] is None


def test_a_model_without_a_prunable_group_is_refused() -> None:
    with pytest.raises(InputError, match="no prunable channel group"):
        derive_layout(nn.Sequential(nn.Flatten(), nn.Linear(12, 3)), torch.randn(2, 3, 2, 2))


def test_static_batchnorm_drops_running_statistics() -> None:
    net = nn.Sequential(nn.Conv2d(1, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.BatchNorm2d(4, track_running_stats=False))
    assert make_static_batchnorm(net) == ["1"]
    assert not net[1].track_running_stats and net[1].running_mean is None
    assert [name for name, _ in net.named_buffers()] == []
    x = torch.randn(3, 1, 5, 5)
    net.eval()
    y = net[1](net[0](x))
    assert torch.allclose(y.mean((0, 2, 3)), torch.zeros(4), atol=1e-5)  # batch statistics in eval too
