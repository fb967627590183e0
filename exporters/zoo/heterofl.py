"""HeteroFL / FedRolex: the pre-activation ResNet18 on CIFAR-10.

A PreResNet18 with hidden sizes ``ceil(rate * [64, 128, 256, 512])``, static
BatchNorm (affine, ``track_running_stats=False``: batch statistics in train and
eval) and HeteroFL's *scaler*, which divides activations by the model rate during
training and is the identity in eval. The order inside a block is HeteroFL's:
conv -> scaler -> BN -> ReLU -> conv, i.e. every BN is preceded by a scaler:

    block(x) = conv2(relu(bn2(s(conv1(a))))) + shortcut,  a = relu(bn1(s(x)))

where ``shortcut`` is ``x`` (identity) or ``conv1x1(a)`` (projection, first block
of stages 2-4), and the head is ``linear(avgpool(relu(bn(s(x)))))``.

The scaler's rate is derived from the built group sizes as ``size(layer1) / 64`` (the
stem's kept channels over its full size). At the paper's capacities
1, 1/2, 1/4, 1/8, 1/16 this is exactly the client rate; for a rate whose
``ceil(rate * 64)`` is not exact it is the realised fraction of the first layer.
The rate is relative to the full model this zoo entry describes, i.e. HeteroFL's
``client_rate / global_rate`` with the global model at rate 1.

HeteroFL's optional evaluation-time BN statistics (one pass over training data on
the server) are not part of this model: BN always uses the statistics of the
current batch.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch
from torch import nn

from exporters.arch import Dim, ParamLayout
from exporters.zoo import ZooModel
from exporters.zoo.fjord import ResNetSizes, block_plan, resnet_groups, static_bn

#: Full-width sizes of the CIFAR-10 PreResNet18.
PRERESNET18 = ResNetSizes()

#: Capacity levels of HeteroFL / FedRolex ('a' .. 'e').
HETEROFL_WIDTHS = (1.0, 1 / 2, 1 / 4, 1 / 8, 1 / 16)


class Scaler(nn.Module):
    """Divide by ``rate`` in training mode; identity in eval mode.

    Parameters
    ----------
    rate : float
        The sub-model's width relative to the global model, in (0, 1].
    """

    def __init__(self, rate: float) -> None:
        super().__init__()
        self.rate = rate

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Return ``x / rate`` while training, else ``x``."""
        return x / self.rate if self.training else x

    def extra_repr(self) -> str:
        """Show the rate in the module's repr."""
        return f"rate={self.rate}"


class PreActBlock(nn.Module):
    """HeteroFL's pre-activation BasicBlock (see the module docstring for the order).

    Parameters
    ----------
    in_planes, inner, out_planes : int
        Input channels, inner channels (first conv's output) and output channels.
    stride : int
        Stride of the first conv and of the projection shortcut.
    project : bool
        Whether the shortcut is a 1x1 conv on the activated input.
    rate : float
        The scaler's rate.
    """

    def __init__(self, in_planes: int, inner: int, out_planes: int, stride: int, project: bool, rate: float) -> None:
        super().__init__()
        self.scaler = Scaler(rate)
        self.n1 = static_bn(in_planes)
        self.conv1 = nn.Conv2d(in_planes, inner, 3, stride, 1, bias=False)
        self.n2 = static_bn(inner)
        self.conv2 = nn.Conv2d(inner, out_planes, 3, 1, 1, bias=False)
        self.shortcut: nn.Module | None = None
        if project:
            self.shortcut = nn.Conv2d(in_planes, out_planes, 1, stride, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Apply the block to ``(N, in_planes, H, W)``."""
        a = torch.relu(self.n1(self.scaler(x)))
        shortcut = x if self.shortcut is None else self.shortcut(a)
        out = self.conv1(a)
        out = self.conv2(torch.relu(self.n2(self.scaler(out))))
        return out + shortcut


class HeteroResNet(nn.Module):
    """The pre-activation ResNet18 at the given group sizes (groups as `resnet_groups`).

    Parameters
    ----------
    sizes : ResNetSizes
    group_sizes : mapping of str to int
        Kept channels per group.
    """

    def __init__(self, sizes: ResNetSizes, group_sizes: Mapping[str, int]) -> None:
        super().__init__()
        rate = scaler_rate(sizes, group_sizes)
        self.conv1 = nn.Conv2d(sizes.in_channels, group_sizes["layer1"], 3, 1, 1, bias=False)
        stages: dict[str, list[nn.Module]] = {}
        for name, src, dst, stride in block_plan(sizes):
            block = PreActBlock(group_sizes[src], group_sizes[name], group_sizes[dst], stride, src != dst, rate)
            stages.setdefault(dst, []).append(block)
        for stage, blocks in stages.items():
            self.add_module(stage, nn.Sequential(*blocks))
        self.stage_names = tuple(stages)
        last = group_sizes[self.stage_names[-1]]
        self.scaler = Scaler(rate)
        self.n4 = static_bn(last)
        self.linear = nn.Linear(last, sizes.classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Map images ``(N, 3, 32, 32)`` to logits ``(N, classes)``."""
        out = self.conv1(x)
        for stage in self.stage_names:
            out = getattr(self, stage)(out)
        out = torch.relu(self.n4(self.scaler(out)))
        out = torch.flatten(nn.functional.adaptive_avg_pool2d(out, 1), 1)  # (N, c4)
        return self.linear(out)


def scaler_rate(sizes: ResNetSizes, group_sizes: Mapping[str, int]) -> float:
    """Return the scaler's rate for built group sizes: kept stem channels over full stem channels.

    Parameters
    ----------
    sizes : ResNetSizes
    group_sizes : mapping of str to int

    Returns
    -------
    float
        ``group_sizes["layer1"] / sizes.stages[0]``.
    """
    return group_sizes["layer1"] / sizes.stages[0]


def hetero_resnet_layouts(sizes: ResNetSizes) -> dict[str, ParamLayout]:
    """Return the layout of every parameter of `HeteroResNet`."""
    layouts: dict[str, ParamLayout] = {"conv1.weight": (Dim("layer1"), None, None, None)}
    for name, src, dst, _ in block_plan(sizes):
        layouts[f"{name}.n1.weight"] = (Dim(src),)
        layouts[f"{name}.n1.bias"] = (Dim(src),)
        layouts[f"{name}.conv1.weight"] = (Dim(name), Dim(src), None, None)
        layouts[f"{name}.n2.weight"] = (Dim(name),)
        layouts[f"{name}.n2.bias"] = (Dim(name),)
        layouts[f"{name}.conv2.weight"] = (Dim(dst), Dim(name), None, None)
        if src != dst:
            layouts[f"{name}.shortcut.weight"] = (Dim(dst), Dim(src), None, None)
    last = f"layer{len(sizes.stages)}"
    layouts["n4.weight"] = (Dim(last),)
    layouts["n4.bias"] = (Dim(last),)
    layouts["linear.weight"] = (None, Dim(last))
    layouts["linear.bias"] = (None,)
    return layouts


def heterofl_resnet18(sizes: ResNetSizes = PRERESNET18) -> ZooModel:
    """Return the HeteroFL / FedRolex PreResNet18 (CIFAR-10) as a `ZooModel`."""
    return ZooModel(
        name="heterofl-resnet18",
        paper="HeteroFL / FedRolex, section 4 (PreResNet18, static BN, scaler; CIFAR-10)",
        groups=resnet_groups(sizes),
        builder=lambda group_sizes: HeteroResNet(sizes, group_sizes),
        layouts=hetero_resnet_layouts(sizes),
        input_shape=(sizes.in_channels, sizes.image, sizes.image),
        input_dtype="float32",
        num_classes=sizes.classes,
        paper_widths=HETEROFL_WIDTHS,
    )


MODELS: dict[str, Callable[[], ZooModel]] = {"heterofl-resnet18": heterofl_resnet18}
