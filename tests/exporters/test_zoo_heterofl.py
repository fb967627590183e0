"""The HeteroFL / FedRolex PreResNet18: parameters per capacity, channels and the scaler.

Parameter counts are all trainable parameters (BN affine included), as FedRolex
Table 7 reports them in millions: 11.1722 for the largest model, 0.04451 for the
smallest (capacity 1/16).
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from exporters.zoo import get_model
from exporters.zoo.heterofl import HETEROFL_WIDTHS, PRERESNET18, Scaler, scaler_rate


def params_at(rate: float) -> int:
    model = get_model("heterofl-resnet18")
    return sum(p.numel() for p in model.build(model.arch(rate)).parameters())


def test_paper_widths_are_the_five_capacities() -> None:
    assert get_model("heterofl-resnet18").paper_widths == HETEROFL_WIDTHS == (1, 1 / 2, 1 / 4, 1 / 8, 1 / 16)


def test_parameters_match_fedrolex_table_7() -> None:
    assert round(params_at(1.0) / 1e6, 4) == 11.1722
    assert round(params_at(1 / 16) / 1e6, 5) == 0.04451


@pytest.mark.parametrize(
    ("rate", "expected"),
    [(1.0, 11_172_170), (1 / 2, 2_796_714), (1 / 4, 701_018), (1 / 8, 176_178), (1 / 16, 44_510)],
)
def test_exact_parameter_counts(rate: float, expected: int) -> None:
    assert params_at(rate) == expected


def test_channels_at_quarter_width() -> None:
    model = get_model("heterofl-resnet18")
    arch = model.arch(0.25)
    group_sizes = dict(zip(model.group_names, arch.sizes, strict=True))
    assert [group_sizes[f"layer{s}"] for s in range(1, 5)] == [16, 32, 64, 128]
    assert all(group_sizes[f"layer{s}.{b}"] == group_sizes[f"layer{s}"] for s in range(1, 5) for b in range(2))
    shapes = {name: tuple(p.shape) for name, p in model.build(arch).named_parameters()}
    assert shapes["conv1.weight"] == (16, 3, 3, 3)
    assert shapes["layer1.0.n1.weight"] == (16,)
    assert shapes["layer2.0.n1.weight"] == (16,)  # pre-activation: normalises the block's input
    assert shapes["layer2.0.conv1.weight"] == (32, 16, 3, 3)
    assert shapes["layer2.0.shortcut.weight"] == (32, 16, 1, 1)
    assert shapes["layer4.1.conv2.weight"] == (128, 128, 3, 3)
    assert shapes["n4.weight"] == (128,)
    assert shapes["linear.weight"] == (10, 128)


def test_scaler_divides_in_train_mode_and_is_identity_in_eval() -> None:
    scaler = Scaler(0.25)
    x = torch.randn(2, 3, 4, 4)
    torch.testing.assert_close(scaler.train()(x), x * 4)
    torch.testing.assert_close(scaler.eval()(x), x)


def test_built_model_scales_before_every_batchnorm_in_training_only() -> None:
    model = get_model("heterofl-resnet18")
    module = model.build(model.arch(0.25))
    scalers = [m for m in module.modules() if isinstance(m, Scaler)]
    assert scalers and all(s.rate == 0.25 for s in scalers)
    assert list(module.buffers()) == []

    seen: list[torch.Tensor] = []
    bn: nn.Module = module.get_submodule("layer1.0.n1")
    handle = bn.register_forward_pre_hook(lambda _m, args: seen.append(args[0].detach().clone()))
    x, _ = model.example_batch(2)
    with torch.no_grad():
        module.train()(x)
        module.eval()(x)
    handle.remove()
    train_in, eval_in = seen
    torch.testing.assert_close(train_in, eval_in / 0.25)


@pytest.mark.parametrize(("rate", "expected"), [(1.0, 1.0), (1 / 16, 0.0625), (0.3, 20 / 64)])
def test_scaler_rate_is_the_realised_fraction_of_the_stem(rate: float, expected: float) -> None:
    model = get_model("heterofl-resnet18")
    group_sizes = dict(zip(model.group_names, model.arch(rate).sizes, strict=True))
    assert scaler_rate(PRERESNET18, group_sizes) == expected
