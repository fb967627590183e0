"""FjORD (Ordered Dropout): the three models of the paper's Table 1b.

* ``fjord-cnn``: FEMNIST CNN, two 3x3 valid convolutions (each ReLU + 2x2 max-pool)
  and a linear softmax layer over 62 classes.
* ``fjord-resnet18``: the "CIFAR" ResNet18 (3x3 stem, no max-pool, BasicBlocks,
  1x1 projection shortcuts, global average pool, linear 10).
* ``fjord-rnn``: Shakespeare next-character RNN, embedding (8, not pruned) ->
  LSTM 128 -> LSTM 128 -> linear over an 84-symbol vocabulary, reading the last
  time step.

Widths follow Ordered Dropout: a layer with ``K`` neurons keeps ``ceil(p * K)`` of
them; the first layer keeps its full input and the classifier its full output.

How Table 1b counts (checked in ``tests/exporters/test_zoo_fjord.py``; the table
rounds to the printed precision, "26K", "456K", "2M"):

* ResNet18: parameters **without** the BatchNorm affine parameters (455,638 at
  p = 0.2 prints as 456K; with them it is 457,578) and MACs = conv + linear
  multiply-accumulates per example (23.1M ... 555.4M).
* RNN: all parameters; MACs of **one time step** as ``ptflops`` counts an LSTM:
  per layer ``4h(in + h)`` multiply-accumulates plus ``18h`` (gate biases and
  element-wise cell updates), plus ``vocab * h`` for the classifier, nothing for
  the embedding. The embedding is not pruned: pruning it gives 11K / 39K
  parameters at p = 0.2 / 0.4 where the table says 12K / 40K. The vocabulary is
  not stated in the paper: with embedding 8 and 128 hidden units, 84 symbols
  (LEAF's 80 characters plus 4 reserved ids) reproduce every parameter and MAC
  cell; LEAF's bare 80 misses one cell (141.2K parameters at p = 0.8 against
  142K).
* CNN: the paper gives no layer sizes, and no conv -> conv -> linear network with
  ``ceil(p * K)`` sizes reproduces both rows exactly (searched: 3x3 / 5x5 kernels,
  same / valid padding, stride 1 / 2, max-pool or not, flatten or global pool, up to
  128 channels, MACs with or without bias, ReLU and pooling terms). The sizes here (20 and 15
  channels) give 4.9K, 9.9K, 15.1K, 20.6K, 26.2K parameters (table 5K, 10K, 15K,
  20K, 26K) and 42K, 110K, 205K, 325K, 472K conv + linear MACs (table 47K, 120K,
  218K, 342K, 491K: 4 to 11 % fewer).

BatchNorm in the ResNet is static (``nn.BatchNorm2d(track_running_stats=False)``:
batch statistics in train and eval), so that ONNX Runtime
training has no running-statistics buffers to update. FjORD itself keeps separate
running statistics per width with shared affine parameters; that bookkeeping belongs
to the FL layer (it can recompute them per width on the server), not to this builder.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch
from torch import nn

from exporters.arch import Dim, ParamLayout
from exporters.zoo import ZooModel
from exporters.zoo.common import chain_layouts, layer_layouts, lstm_layouts

#: FjORD's uniform-5 widths, as listed in Table 1b.
FJORD_WIDTHS = (0.2, 0.4, 0.6, 0.8, 1.0)


@dataclass(frozen=True)
class FjordCNNSizes:
    """Full-width sizes of the FEMNIST CNN."""

    image: int = 28
    in_channels: int = 1
    conv1: int = 20
    conv2: int = 15
    kernel: int = 3
    classes: int = 62

    @property
    def pooled(self) -> int:
        """Side of the last feature map: valid conv, pool 2, valid conv, pool 2."""
        side = (self.image - self.kernel + 1) // 2
        return (side - self.kernel + 1) // 2


class FjordCNN(nn.Module):
    """The FEMNIST CNN at the given group sizes.

    Parameters
    ----------
    sizes : FjordCNNSizes
        Full-width sizes.
    group_sizes : mapping of str to int
        Kept channels of ``"conv1"`` and ``"conv2"``.
    """

    def __init__(self, sizes: FjordCNNSizes, group_sizes: Mapping[str, int]) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(sizes.in_channels, group_sizes["conv1"], sizes.kernel)
        self.conv2 = nn.Conv2d(group_sizes["conv1"], group_sizes["conv2"], sizes.kernel)
        self.fc = nn.Linear(group_sizes["conv2"] * sizes.pooled**2, sizes.classes)
        self.pool = nn.MaxPool2d(2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Map images ``(N, 1, 28, 28)`` to logits ``(N, 62)``."""
        x = self.pool(torch.relu(self.conv1(x)))  # (N, c1, 13, 13)
        x = self.pool(torch.relu(self.conv2(x)))  # (N, c2, 5, 5)
        return self.fc(torch.flatten(x, 1))  # NCHW flatten: (N, c2 * 25)


def fjord_cnn(sizes: FjordCNNSizes = FjordCNNSizes()) -> ZooModel:
    """Return FjORD's FEMNIST CNN as a `ZooModel`."""
    hw = sizes.pooled**2
    layouts = chain_layouts([("conv1", "conv1"), ("conv2", "conv2")], [("fc", None)], hw)
    return ZooModel(
        name="fjord-cnn",
        paper="FjORD, Table 1b (FEMNIST CNN)",
        groups=(("conv1", sizes.conv1), ("conv2", sizes.conv2)),
        builder=lambda group_sizes: FjordCNN(sizes, group_sizes),
        layouts=layouts,
        input_shape=(sizes.in_channels, sizes.image, sizes.image),
        input_dtype="float32",
        num_classes=sizes.classes,
        paper_widths=FJORD_WIDTHS,
    )


@dataclass(frozen=True)
class ResNetSizes:
    """Full-width sizes of a CIFAR ResNet18 (post- or pre-activation)."""

    image: int = 32
    in_channels: int = 3
    classes: int = 10
    stages: tuple[int, ...] = (64, 128, 256, 512)
    blocks: tuple[int, ...] = (2, 2, 2, 2)


def resnet_groups(sizes: ResNetSizes) -> tuple[tuple[str, int], ...]:
    """Return the neuron groups of a ResNet: per stage its stream, then its blocks.

    ``"layerS"`` is stage ``S``'s residual stream (the channels that identity and
    projection shortcuts add; for stage 1 also the stem's output) and
    ``"layerS.B"`` the inner channels of block ``B`` (its first conv's output).

    Parameters
    ----------
    sizes : ResNetSizes

    Returns
    -------
    tuple of (str, int)
    """
    groups: list[tuple[str, int]] = []
    for s, (planes, blocks) in enumerate(zip(sizes.stages, sizes.blocks, strict=True), start=1):
        groups.append((f"layer{s}", planes))
        groups.extend((f"layer{s}.{b}", planes) for b in range(blocks))
    return tuple(groups)


def block_plan(sizes: ResNetSizes) -> list[tuple[str, str, str, int]]:
    """List every block as (name, input stream group, output stream group, stride).

    Parameters
    ----------
    sizes : ResNetSizes

    Returns
    -------
    list of (str, str, str, int)
        Block name ``"layerS.B"`` (also its inner group), the group of its input
        and of its output; a block whose two groups differ has a projection shortcut.
    """
    plan = []
    prev = "layer1"
    for s, blocks in enumerate(sizes.blocks, start=1):
        for b in range(blocks):
            stride = 2 if s > 1 and b == 0 else 1
            plan.append((f"layer{s}.{b}", prev, f"layer{s}", stride))
            prev = f"layer{s}"
    return plan


def static_bn(channels: int) -> nn.BatchNorm2d:
    """Return an affine BatchNorm with batch statistics in train and eval (no buffers).

    It is exported as `exporters.export_forms.BatchStatisticsNorm`, which takes the batch
    statistics for any batch size; `exporters.artifacts` removes the unused
    running-statistics outputs from the eval model ORT generates.
    """
    return nn.BatchNorm2d(channels, track_running_stats=False)


class BasicBlock(nn.Module):
    """Post-activation BasicBlock: conv-BN-ReLU-conv-BN, plus shortcut, then ReLU.

    Parameters
    ----------
    in_planes, inner, out_planes : int
        Input channels, inner channels (first conv's output) and output channels.
    stride : int
        Stride of the first conv and of the projection shortcut.
    project : bool
        Whether the shortcut is a 1x1 conv + BN (the block changes stage).
    """

    def __init__(self, in_planes: int, inner: int, out_planes: int, stride: int, project: bool) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_planes, inner, 3, stride, 1, bias=False)
        self.bn1 = static_bn(inner)
        self.conv2 = nn.Conv2d(inner, out_planes, 3, 1, 1, bias=False)
        self.bn2 = static_bn(out_planes)
        self.shortcut: nn.Module = nn.Identity()
        if project:
            self.shortcut = nn.Sequential(
                nn.Conv2d(in_planes, out_planes, 1, stride, bias=False), static_bn(out_planes)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Apply the block to ``(N, in_planes, H, W)``."""
        out = torch.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return torch.relu(out + self.shortcut(x))


class FjordResNet(nn.Module):
    """The CIFAR ResNet18 at the given group sizes (see `resnet_groups` for the names).

    Parameters
    ----------
    sizes : ResNetSizes
    group_sizes : mapping of str to int
        Kept channels per group.
    """

    def __init__(self, sizes: ResNetSizes, group_sizes: Mapping[str, int]) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(sizes.in_channels, group_sizes["layer1"], 3, 1, 1, bias=False)
        self.bn1 = static_bn(group_sizes["layer1"])
        stages: dict[str, list[nn.Module]] = {}
        for name, src, dst, stride in block_plan(sizes):
            block = BasicBlock(group_sizes[src], group_sizes[name], group_sizes[dst], stride, src != dst)
            stages.setdefault(dst, []).append(block)
        for stage, blocks in stages.items():
            self.add_module(stage, nn.Sequential(*blocks))
        self.stage_names = tuple(stages)
        self.linear = nn.Linear(group_sizes[self.stage_names[-1]], sizes.classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Map images ``(N, 3, 32, 32)`` to logits ``(N, classes)``."""
        out = torch.relu(self.bn1(self.conv1(x)))
        for stage in self.stage_names:
            out = getattr(self, stage)(out)
        out = torch.flatten(nn.functional.adaptive_avg_pool2d(out, 1), 1)  # (N, c4)
        return self.linear(out)


def fjord_resnet_layouts(sizes: ResNetSizes) -> dict[str, ParamLayout]:
    """Return the layout of every parameter of `FjordResNet`."""
    layouts: dict[str, ParamLayout] = {
        "conv1.weight": (Dim("layer1"), None, None, None),
        "bn1.weight": (Dim("layer1"),),
        "bn1.bias": (Dim("layer1"),),
    }
    for name, src, dst, _ in block_plan(sizes):
        layouts[f"{name}.conv1.weight"] = (Dim(name), Dim(src), None, None)
        layouts[f"{name}.bn1.weight"] = (Dim(name),)
        layouts[f"{name}.bn1.bias"] = (Dim(name),)
        layouts[f"{name}.conv2.weight"] = (Dim(dst), Dim(name), None, None)
        layouts[f"{name}.bn2.weight"] = (Dim(dst),)
        layouts[f"{name}.bn2.bias"] = (Dim(dst),)
        if src != dst:
            layouts[f"{name}.shortcut.0.weight"] = (Dim(dst), Dim(src), None, None)
            layouts[f"{name}.shortcut.1.weight"] = (Dim(dst),)
            layouts[f"{name}.shortcut.1.bias"] = (Dim(dst),)
    last = f"layer{len(sizes.stages)}"
    layouts["linear.weight"] = (None, Dim(last))
    layouts["linear.bias"] = (None,)
    return layouts


def fjord_resnet18(sizes: ResNetSizes = ResNetSizes()) -> ZooModel:
    """Return FjORD's CIFAR-10 ResNet18 as a `ZooModel`."""
    return ZooModel(
        name="fjord-resnet18",
        paper="FjORD, Table 1b (CIFAR-10 ResNet18, CIFAR version)",
        groups=resnet_groups(sizes),
        builder=lambda group_sizes: FjordResNet(sizes, group_sizes),
        layouts=fjord_resnet_layouts(sizes),
        input_shape=(sizes.in_channels, sizes.image, sizes.image),
        input_dtype="float32",
        num_classes=sizes.classes,
        paper_widths=FJORD_WIDTHS,
    )


@dataclass(frozen=True)
class FjordRNNSizes:
    """Full-width sizes of the Shakespeare RNN (see the module docstring for ``vocab``)."""

    vocab: int = 84
    embed: int = 8
    hidden1: int = 128
    hidden2: int = 128
    seq_len: int = 80


class FjordRNN(nn.Module):
    """Embedding -> LSTM -> LSTM -> linear over the next character.

    Parameters
    ----------
    sizes : FjordRNNSizes
    group_sizes : mapping of str to int
        Kept hidden units of ``"lstm1"`` and ``"lstm2"``.
    """

    def __init__(self, sizes: FjordRNNSizes, group_sizes: Mapping[str, int]) -> None:
        super().__init__()
        self.embed = nn.Embedding(sizes.vocab, sizes.embed)
        self.lstm1 = nn.LSTM(sizes.embed, group_sizes["lstm1"], batch_first=True)
        self.lstm2 = nn.LSTM(group_sizes["lstm1"], group_sizes["lstm2"], batch_first=True)
        self.fc = nn.Linear(group_sizes["lstm2"], sizes.vocab)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Map character ids ``(N, T)`` to next-character logits ``(N, vocab)``."""
        out, _ = self.lstm1(self.embed(x))  # (N, T, h1)
        out, _ = self.lstm2(out)  # (N, T, h2)
        return self.fc(out[:, -1])  # last time step: (N, h2)


def fjord_rnn(sizes: FjordRNNSizes = FjordRNNSizes()) -> ZooModel:
    """Return FjORD's Shakespeare RNN as a `ZooModel` (input: int64 ids ``(N, seq_len)``)."""
    layouts: dict[str, ParamLayout] = {
        "embed.weight": (None, None),
        **lstm_layouts("lstm1", "lstm1", None),
        **lstm_layouts("lstm2", "lstm2", Dim("lstm1")),
        **layer_layouts("fc", None, Dim("lstm2"), conv=False),
    }
    return ZooModel(
        name="fjord-rnn",
        paper="FjORD, Table 1b (Shakespeare RNN)",
        groups=(("lstm1", sizes.hidden1), ("lstm2", sizes.hidden2)),
        builder=lambda group_sizes: FjordRNN(sizes, group_sizes),
        layouts=layouts,
        input_shape=(sizes.seq_len,),
        input_dtype="int64",
        num_classes=sizes.vocab,
        paper_widths=FJORD_WIDTHS,
    )


MODELS: dict[str, Callable[[], ZooModel]] = {
    "fjord-cnn": fjord_cnn,
    "fjord-resnet18": fjord_resnet18,
    "fjord-rnn": fjord_rnn,
}
