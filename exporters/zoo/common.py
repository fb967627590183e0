"""Building blocks shared by the zoo.

Parameter layouts of common layers, and the two-conv CNN that the Coded-FD and FLuID
papers both use (with different sizes).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from exporters.arch import Dim, ParamLayout
from exporters.zoo import ZooModel


def layer_layouts(prefix: str, group: str | None, input_dim: Dim | None, *, conv: bool) -> dict[str, ParamLayout]:
    """Return the layouts of one biased conv or linear layer.

    Parameters
    ----------
    prefix : str
        Module name, e.g. ``"fc1"`` or ``"convs.0"``.
    group : str or None
        Neuron group of its outputs; ``None`` for the classifier (outputs kept whole).
    input_dim : Dim or None
        How its inputs are indexed; ``None`` for the first layer (input kept whole).
    conv : bool
        Whether the weight is ``(out, in, kh, kw)`` rather than ``(out, in)``.

    Returns
    -------
    dict of str to ParamLayout
    """
    out = None if group is None else Dim(group)
    kernel: tuple[None, ...] = (None, None) if conv else ()
    return {f"{prefix}.weight": (out, input_dim, *kernel), f"{prefix}.bias": (out,)}


def chain_layouts(
    convs: Sequence[tuple[str, str]], linears: Sequence[tuple[str, str | None]], flat: int
) -> dict[str, ParamLayout]:
    """Return the layouts of a plain feed-forward chain: convs, flatten, linear layers.

    Each layer's input is indexed by the previous layer's group; the first linear layer
    after the flatten sees channel ``c`` as columns ``c*flat .. c*flat + flat - 1`` (NCHW).

    Parameters
    ----------
    convs : sequence of (prefix, group)
        The conv layers in order (may be empty).
    linears : sequence of (prefix, group or None)
        The linear layers in order; the last one's group is ``None`` (the classifier).
    flat : int
        Positions per channel at the flatten (``H * W`` of the last conv's map).

    Returns
    -------
    dict of str to ParamLayout
    """
    layouts: dict[str, ParamLayout] = {}
    previous: Dim | None = None
    for prefix, group in convs:
        layouts.update(layer_layouts(prefix, group, previous, conv=True))
        previous = Dim(group)
    if previous is not None:
        previous = Dim(previous.group, inner=flat)
    for prefix, maybe_group in linears:
        layouts.update(layer_layouts(prefix, maybe_group, previous, conv=False))
        previous = None if maybe_group is None else Dim(maybe_group)
    return layouts


def vgg_groups_and_layouts(
    convs: Sequence[int], hidden: Sequence[int], flat: int
) -> tuple[tuple[tuple[str, int], ...], dict[str, ParamLayout]]:
    """Return the groups and layouts of a VGG: ``convs.{i}`` layers, then ``fc1 ..``.

    Parameters
    ----------
    convs : sequence of int
        Output channels of the conv layers (groups ``conv1 ..``, modules ``convs.0 ..``).
    hidden : sequence of int
        Units of the hidden dense layers (groups and modules ``fc1 ..``); a classifier
        ``fc{len(hidden) + 1}`` follows.
    flat : int
        Positions per channel at the flatten.

    Returns
    -------
    groups : tuple of (str, int)
    layouts : dict of str to ParamLayout
    """
    conv_names = [f"conv{i + 1}" for i in range(len(convs))]
    fc_names = [f"fc{i + 1}" for i in range(len(hidden))]
    layouts = chain_layouts(
        [(f"convs.{i}", name) for i, name in enumerate(conv_names)],
        [*((name, name) for name in fc_names), (f"fc{len(hidden) + 1}", None)],
        flat,
    )
    groups = (*zip(conv_names, convs, strict=True), *zip(fc_names, hidden, strict=True))
    return groups, layouts


def lstm_layouts(prefix: str, group: str, input_dim: Dim | None) -> dict[str, ParamLayout]:
    """Return the layouts of one single-layer ``nn.LSTM`` whose hidden units are ``group``.

    Parameters
    ----------
    prefix : str
        Module name, e.g. ``"lstm1"``.
    group : str
        Neuron group of its hidden units; the i, f, g, o row blocks move together.
    input_dim : Dim or None
        How its input features are indexed (``None``: kept whole).

    Returns
    -------
    dict of str to ParamLayout
    """
    gates = Dim(group, blocks=4)
    return {
        f"{prefix}.weight_ih_l0": (gates, input_dim),
        f"{prefix}.weight_hh_l0": (gates, Dim(group)),
        f"{prefix}.bias_ih_l0": (gates,),
        f"{prefix}.bias_hh_l0": (gates,),
    }


@dataclass(frozen=True)
class TwoConvCNNSizes:
    """Full-width sizes of a two-conv CNN: 'same' convs, 2x2 max pools, two dense layers.

    Attributes
    ----------
    conv1, conv2 : int
        Output channels of the two convs.
    hidden : int
        Units of the hidden dense layer.
    classes : int
        Number of output logits.
    image : int
        Input height and width (divisible by 4).
    in_channels : int
        Input channels.
    kernel : int
        Conv kernel size (odd).
    """

    conv1: int
    conv2: int
    hidden: int
    classes: int
    image: int = 28
    in_channels: int = 1
    kernel: int = 5

    @property
    def flat(self) -> int:
        """Positions per channel at the flatten (``(image / 4) ** 2``)."""
        return (self.image // 4) ** 2

    def groups(self) -> tuple[tuple[str, int], ...]:
        """Return the neuron groups: both convs and the hidden dense layer."""
        return (("conv1", self.conv1), ("conv2", self.conv2), ("fc1", self.hidden))

    def layouts(self) -> dict[str, ParamLayout]:
        """Return the layouts of every parameter of `TwoConvCNN`."""
        return chain_layouts([("conv1", "conv1"), ("conv2", "conv2")], [("fc1", "fc1"), ("fc2", None)], self.flat)


def two_conv_cnn(name: str, paper: str, sizes: TwoConvCNNSizes, paper_widths: tuple[float, ...] = ()) -> ZooModel:
    """Return a `TwoConvCNN` of the given sizes as a `ZooModel`.

    Parameters
    ----------
    name, paper : str
        Zoo name and source of the model.
    sizes : TwoConvCNNSizes
    paper_widths : tuple of float
        Widths the paper reports.

    Returns
    -------
    ZooModel
    """
    return ZooModel(
        name=name,
        paper=paper,
        groups=sizes.groups(),
        builder=lambda group_sizes: TwoConvCNN(sizes, group_sizes),
        layouts=sizes.layouts(),
        input_shape=(sizes.in_channels, sizes.image, sizes.image),
        input_dtype="float32",
        num_classes=sizes.classes,
        paper_widths=paper_widths,
    )


class TwoConvCNN(nn.Module):
    """A two-conv CNN at the given group sizes.

    conv 'same' -> ReLU -> maxpool 2 -> conv 'same' -> ReLU -> maxpool 2 -> flatten
    -> dense -> ReLU -> dense.
    """

    def __init__(self, sizes: TwoConvCNNSizes, group_sizes: Mapping[str, int]) -> None:
        super().__init__()
        pad = sizes.kernel // 2
        self.conv1 = nn.Conv2d(sizes.in_channels, group_sizes["conv1"], sizes.kernel, padding=pad)
        self.conv2 = nn.Conv2d(group_sizes["conv1"], group_sizes["conv2"], sizes.kernel, padding=pad)
        self.fc1 = nn.Linear(group_sizes["conv2"] * sizes.flat, group_sizes["fc1"])
        self.fc2 = nn.Linear(group_sizes["fc1"], sizes.classes)
        self.pool = nn.MaxPool2d(2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Return logits ``(N, classes)`` for images ``(N, C, H, W)``."""
        x = self.pool(torch.relu(self.conv1(x)))  # (N, c1, H/2, W/2)
        x = self.pool(torch.relu(self.conv2(x)))  # (N, c2, H/4, W/4)
        x = torch.relu(self.fc1(torch.flatten(x, 1)))  # NCHW flatten: (N, c2 * H/4 * W/4)
        return self.fc2(x)
