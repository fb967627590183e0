import numpy as np
import pytest
import torch

from exporters.userinput import InputError
from exporters.zoo import get_model
from exporters.zoo.fjord import ResNetSizes, block_plan, fjord_resnet18
from exporters.zoo.heterofl import heterofl_resnet18
from fl.client import module_params
from fl.maths.submodels import (
    random_indices,
    random_submodel,
    rolling_indices,
    rolling_submodel,
    static_indices,
    static_submodel,
)


def test_static_indices_are_the_prefix():
    assert static_indices(8, 3).tolist() == [0, 1, 2]
    assert static_indices(8, 8).tolist() == list(range(8))


@pytest.mark.parametrize(
    ("rnd", "expected"),
    [
        (0, [0, 1, 2]),
        (1, [1, 2, 3]),
        (2, [2, 3, 4]),
        (3, [3, 4, 5]),
        (5, [5, 6, 7]),
        (6, [0, 6, 7]),
        (7, [0, 1, 7]),
        (8, [0, 1, 2]),
        (14, [0, 6, 7]),
    ],
)
def test_rolling_window_eq4_k8_rate_3_8(rnd, expected):
    # K = 8, beta = 3/8: window of 3 starting at j mod 8, wrapping around
    assert rolling_indices(rnd, 8, 3).tolist() == expected


def test_rolling_round0_is_static_and_full_width_is_everything():
    assert rolling_indices(0, 10, 4).tolist() == [0, 1, 2, 3]
    assert rolling_indices(7, 10, 10).tolist() == list(range(10))


@pytest.mark.parametrize("bad", [(0, 8, 0), (0, 8, 9), (-1, 8, 3)])
def test_rolling_rejects_bad_input(bad):
    with pytest.raises(InputError):
        rolling_indices(*bad)


def test_rolling_submodel_per_layer_size():
    model = get_model("fjord-cnn")  # conv1: 20, conv2: 15
    sub = rolling_submodel(model, 0.25, 17)
    assert sub.arch.sizes == (5, 4)  # ceil(5.0), ceil(3.75)
    assert sub.indices[0].tolist() == [0, 1, 17, 18, 19]  # start 17 mod 20 = 17
    assert sub.indices[1].tolist() == [2, 3, 4, 5]  # start 17 mod 15 = 2


def test_rolling_equal_sizes_equal_windows_and_smaller_is_prefix_of_larger():
    model = get_model("heterofl-resnet18")
    small = rolling_submodel(model, 1 / 4, 70)
    large = rolling_submodel(model, 1 / 2, 70)
    by_size: dict[int, list[np.ndarray]] = {}
    for (_name, size), idx in zip(model.groups, small.indices, strict=True):
        by_size.setdefault(size, []).append(idx)
    for same in by_size.values():
        for idx in same[1:]:
            assert idx.tolist() == same[0].tolist()
    # 64 channels, width 16 at 1/4 and 32 at 1/2, start 70 mod 64 = 6
    assert small.indices[0].tolist() == list(range(6, 22))
    assert large.indices[0].tolist() == list(range(6, 38))
    # 512 channels: start 70, widths 128 / 256
    last = model.group_names.index("layer4")
    assert small.indices[last].tolist() == list(range(70, 198))
    for s, lg in zip(small.indices, large.indices, strict=True):
        assert set(s.tolist()) <= set(lg.tolist())


def test_random_indices_sorted_unique_and_nested_for_equal_seeds():
    a = random_indices(np.random.default_rng(4), 50, 10)
    b = random_indices(np.random.default_rng(4), 50, 30)
    assert a.size == 10 and len(set(a.tolist())) == 10 and np.all(np.diff(a) > 0)
    assert set(a.tolist()) <= set(b.tolist())
    c = random_indices(np.random.default_rng(5), 50, 10)
    assert c.tolist() != a.tolist()
    assert a.min() >= 0 and b.max() < 50


def test_random_indices_are_roughly_uniform():
    hits = np.zeros(10)
    rng = np.random.default_rng(0)
    for _ in range(2000):
        hits[random_indices(rng, 10, 3)] += 1
    assert np.allclose(hits / 2000, 0.3, atol=0.05)


def test_static_submodel_is_prefix():
    model = get_model("fjord-cnn")
    sub = static_submodel(model, 0.5)
    assert sub.arch.sizes == (10, 8)
    assert sub.indices[1].tolist() == list(range(8))


@pytest.mark.parametrize("name", ["heterofl-resnet18", "fjord-resnet18"])
def test_shortcut_added_tensors_share_one_group(name):
    """Coupling is expressed by group names: what a shortcut adds is indexed by one group."""
    model = get_model(name)
    for block, src, dst, _ in block_plan(ResNetSizes()):
        out_group = model.layouts[f"{block}.conv2.weight"][0].group
        assert out_group == dst
        shortcut = [k for k in model.layouts if k.startswith(f"{block}.shortcut") and k.endswith("weight")]
        if src == dst:
            assert not shortcut  # identity: adds the block input, indexed by src == dst
        else:
            assert model.layouts[shortcut[0]][0].group == dst


def _zero_dropped(model, state, sub):
    """Full-width parameters with every dropped neuron's outgoing weights, BN scale and shift zeroed."""
    out = {}
    order = {g: i for i, g in enumerate(model.group_names)}
    for name, tensor in state.items():
        t = tensor.copy()
        first = model.layouts[name][0]
        if first is not None:
            keep = np.zeros(t.shape[0], dtype=bool)
            keep[sub.indices[order[first.group]]] = True
            t[~keep] = 0.0
        out[name] = t
    return out


SMALL = ResNetSizes(stages=(8, 12, 16, 20))


@pytest.mark.parametrize("factory", [heterofl_resnet18, fjord_resnet18])
def test_random_submodel_on_resnets_equals_full_model_with_dropped_channels_zeroed(factory):
    """One draw per group keeps residual additions aligned: the sub-model computes exactly
    what the full model computes when the dropped channels are zeroed (eval mode). The
    ResNet18 layouts at reduced channel counts, to stay fast."""
    model = factory(SMALL)
    torch.manual_seed(0)
    full = model.build()
    state = module_params(full)
    sub = random_submodel(model, 0.5, np.random.default_rng(3))
    assert any(idx.tolist() != list(range(idx.size)) for idx in sub.indices)
    small = model.build(sub.arch)
    small.load_state_dict({k: torch.from_numpy(v) for k, v in model.extract(state, sub).items()})
    full.load_state_dict({k: torch.from_numpy(v) for k, v in _zero_dropped(model, state, sub).items()})
    full.eval()
    small.eval()
    x = torch.randn(3, 3, 8, 8, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(small(x), full(x), atol=1e-4, rtol=1e-4)
