"""Property tests: a sub-model built from extracted weights computes what the
global model computes with every other neuron zeroed, for every zoo model."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from exporters.arch import Arch, expand_indices, make_submodel, size_at_width, tensor_index
from exporters.userinput import InputError
from exporters.zoo import ZooModel, get_model, model_names


def zeroed_state(model: ZooModel, state: dict[str, np.ndarray], submodel) -> dict[str, np.ndarray]:
    """Global state with every element outside the sub-model's index sets set to 0."""
    order = {name: i for i, name in enumerate(model.group_names)}
    out = {}
    for name, tensor in state.items():
        index = tensor_index(model.layouts[name], submodel, order, model.group_sizes)
        keep = np.ones(tensor.shape, dtype=bool)
        for axis, pos in enumerate(index):
            if isinstance(pos, slice):
                continue
            mask = np.zeros(tensor.shape[axis], dtype=bool)
            mask[pos] = True
            shape = [1] * tensor.ndim
            shape[axis] = -1
            keep &= mask.reshape(shape)
        out[name] = np.where(keep, tensor, 0).astype(tensor.dtype)
    return out


def numpy_state(module: torch.nn.Module) -> dict[str, np.ndarray]:
    return {k: v.detach().numpy().copy() for k, v in module.named_parameters()}


def load(module: torch.nn.Module, state: dict[str, np.ndarray]) -> None:
    with torch.no_grad():
        for name, param in module.named_parameters():
            assert tuple(param.shape) == state[name].shape, name
            param.copy_(torch.from_numpy(state[name]))


@st.composite
def index_sets(draw, model: ZooModel):
    widths, sets = [], []
    for _, size in model.groups:
        width = draw(st.integers(1, size))
        seed = draw(st.integers(0, 2**31 - 1))
        sets.append(np.sort(np.random.default_rng(seed).choice(size, width, replace=False)))
        widths.append(width)
    return make_submodel(Arch(model.name, tuple(widths)), model.group_sizes, sets)


@pytest.fixture(scope="module", params=model_names())
def zoo_model(request) -> ZooModel:
    return get_model(request.param)


def test_every_model_has_a_layout_for_every_parameter(zoo_model: ZooModel) -> None:
    module = zoo_model.build()
    assert set(numpy_state(module)) == set(zoo_model.layouts)


def test_extracted_submodel_equals_zeroed_global_model(zoo_model: ZooModel) -> None:
    torch.manual_seed(0)
    global_module = zoo_model.build().eval()
    state = numpy_state(global_module)
    x, _ = zoo_model.example_batch(3, seed=1)

    @settings(max_examples=8, deadline=None, suppress_health_check=list(HealthCheck))
    @given(submodel=index_sets(zoo_model))
    def check(submodel) -> None:
        sub_module = zoo_model.build(submodel.arch).eval()
        load(sub_module, zoo_model.extract(state, submodel))
        load(global_module, zeroed_state(zoo_model, state, submodel))
        with torch.no_grad():
            expected = global_module(x)
            got = sub_module(x)
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5)

    check()


def test_static_submodel_is_a_prefix(zoo_model: ZooModel) -> None:
    sub = zoo_model.static(0.5)
    for idx, size in zip(sub.indices, zoo_model.group_sizes, strict=True):
        assert idx.tolist() == list(range(size_at_width(0.5, size)))


@pytest.mark.parametrize(
    ("width", "size", "kept"), [(0.6, 5, 3), (0.2, 5, 1), (0.01, 10, 1), (1.0, 7, 7), (0.25, 64, 16), (0.3, 10, 3)]
)
def test_size_at_width_is_ceil_without_float_noise(width: float, size: int, kept: int) -> None:
    assert size_at_width(width, size) == kept


@pytest.mark.parametrize("width", [0.0, -0.5, 1.5, float("nan")])
def test_size_at_width_rejects_widths_outside_the_unit_interval(width: float) -> None:
    with pytest.raises(InputError):
        size_at_width(width, 10)


def test_expand_indices_covers_gate_blocks_and_flatten_columns() -> None:
    from exporters.arch import Dim

    # LSTM: 4 gate blocks of K=3 hidden units; keep units 0 and 2.
    assert expand_indices(np.array([0, 2]), Dim("h", blocks=4), 3).tolist() == [0, 2, 3, 5, 6, 8, 9, 11]
    # Flatten of 3 channels of 2x2: channel 1 owns columns 4..7.
    assert expand_indices(np.array([1]), Dim("c", inner=4), 3).tolist() == [4, 5, 6, 7]


def test_make_submodel_rejects_bad_index_sets() -> None:
    model = get_model("cfd-cnn")
    arch = Arch(model.name, (2, 2, 2))
    with pytest.raises(InputError):
        make_submodel(arch, model.group_sizes, [[0, 0], [0, 1], [0, 1]])
    with pytest.raises(InputError):
        make_submodel(arch, model.group_sizes, [[0, 32], [0, 1], [0, 1]])
    with pytest.raises(InputError):
        make_submodel(arch, model.group_sizes, [[0], [0, 1], [0, 1]])


def test_cfd_cnn_has_the_papers_parameter_count() -> None:
    module = get_model("cfd-cnn").build()
    assert sum(p.numel() for p in module.parameters()) == 6_603_710
