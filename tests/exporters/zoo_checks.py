"""Checks shared by the per-paper zoo tests."""

from __future__ import annotations

import torch

from exporters.zoo import get_model


def check_half_width_shapes(name: str, expected: dict[str, tuple[int, ...]]) -> None:
    """Build ``name`` at width 0.5 and check parameter shapes, extraction and output shape."""
    model = get_model(name)
    torch.manual_seed(0)
    full = model.build()
    sub = model.static(0.5)
    module = model.build(sub.arch)
    shapes = {k: tuple(v.shape) for k, v in module.named_parameters()}
    for pname, shape in expected.items():
        assert shapes[pname] == shape, pname
    extracted = model.extract({k: v.detach().numpy() for k, v in full.named_parameters()}, sub)
    assert {k: v.shape for k, v in extracted.items()} == shapes
    x, _ = model.example_batch(3)
    assert tuple(module(x).shape) == (3, model.num_classes)
