"""FedDrop: the four models of the paper's Appendix E (Tables 6-9).

* ``feddrop-lenet`` (Table 6, Fashion-MNIST 1x28x28): conv 5x5 pad 2 (1 -> 32) -> ReLU -> maxpool 2
  -> conv 5x5 pad 2 (32 -> 64) -> ReLU -> maxpool 2 -> conv 3x3 (64 -> 64) -> ReLU (5x5)
  -> average pool to 2x2 -> flatten (256) -> dense 512 -> ReLU -> dense 10. 225,738 parameters.
* ``feddrop-svhn`` (Table 7, SVHN 3x32x32): the same layers without padding (28, 14, 10, 5, 3, then
  2x2). 227,338 parameters.
* ``feddrop-vgg9`` (Table 8, CIFAR-10 3x32x32): conv 3x3 pad 1 32, 64, maxpool, 128, 128, maxpool,
  256, 256 -> global average pool (8x8) -> dense 512 -> dense 512 -> dense 10. 1,525,450 parameters.
* ``feddrop-lstm`` (Table 9, Shakespeare): embedding 80 x 8 -> one LSTM layer of 256 units -> dense
  80 on the last time step. 293,584 parameters (PyTorch LSTM: two bias vectors, which every row of
  Table 9 needs; its printed total, 293 k, disagrees with its rows, which sum to 294 k).

Neuron groups: every conv's output channels, every hidden dense layer's units and the LSTM's hidden
units (the paper: "sparsity for the LSTM model were introduced for the hidden state and memory
cell neurons"; the 8-dim embedding output is therefore *not* a group and is always kept whole).
The first layer keeps its full input and the classifier its full output.

The paper's reference code pools the LeNets with ``AdaptiveAvgPool2d(2)``; on the 5x5 (Fashion) and
3x3 (SVHN) maps that equals ``AvgPool2d`` with kernel ``ceil(s / 2)`` and stride ``s - ceil(s / 2)``
(3/2 and 2/1), which is what is built here because torch.onnx cannot export adaptive pooling
with a non-dividing output size. (onnxruntime-training 1.19.2's AveragePool gradient kernel sizes
its output by the exported shape and crashes with SIGFPE on the artifacts' variable batch
dimension; `exporters.step_model.lower_fixed_shape_kernels` replaces it in the training graph.)
Table 6 lists that pool as "2x2, stride 1", which cannot give its own 64x2x2 output from 5x5;
the output shape (and the 132k parameters of the next layer) is what is reproduced. Table 8's VGG-9
average-pools the 8x8 map of the last conv (no third max pool, unlike configuration "O" of the
reference code, whose parameter count is identical); the table is followed.

The dropout layers of the reference models (``Dropout(0.5)`` before the LeNets' first dense layer,
``Dropout(0.1)`` after VGG-9's hidden dense layers) and the SyncDrop layers are not part of these
modules: sub-model extraction replaces them.

Table FLOPs convention (checked against every row): per conv / dense layer ``MACs + one add per
output element`` (the bias), per pooling layer one op per *input* element, ReLU not counted (the
"Conv+ReLU" rows carry the conv's count only), totals are sums of the rounded rows. Two printed
rows are off: Table 6's second max pool reads 125 k for 64x14x14 = 12,544 inputs (the 11.8 M total
only adds up with 12.5 k) and Table 7's third conv reads 333 k for 332,352. This is
``flops(f) / 2`` of Appendix B eq. 10 plus the pools, i.e. ptflops' conv/linear/pool hooks. The LSTM
row counts one time step only (the reference counter reads the sequence-first input as
batch-first); a sequence of 80 characters costs 80 times as much.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import torch
from torch import nn

from exporters.arch import Dim
from exporters.userinput import InputError
from exporters.zoo import ZooModel
from exporters.zoo.common import chain_layouts, layer_layouts, lstm_layouts, vgg_groups_and_layouts

#: Widths for FLOPs budget ratios r = 0.25, 0.5, 1.0 (Table 10): the uniform keep probability p
#: with g(p) = 0 under Appendix B eq. 10 when every neuron group is kept at the same ratio
#: (pools excluded), rounded to two decimals.
LENET_PAPER_WIDTHS = (0.49, 0.70, 1.0)
SVHN_PAPER_WIDTHS = (0.43, 0.67, 1.0)
VGG9_PAPER_WIDTHS = (0.50, 0.71, 1.0)
LSTM_PAPER_WIDTHS = (0.47, 0.69, 1.0)


@dataclass(frozen=True)
class LeNetSizes:
    """Full-width sizes of the FedDrop LeNets (Table 6 defaults; Table 7 via `SVHN_SIZES`).

    Attributes
    ----------
    image : int
        Input height and width.
    in_channels : int
        Input channels.
    conv1, conv2, conv3 : int
        Output channels of the three convs (5x5, 5x5, 3x3).
    hidden : int
        Units of the hidden dense layer.
    classes : int
        Number of output logits.
    padding : int
        Zero padding of the two 5x5 convs (2 keeps the map size, 0 shrinks it by 4).
    pooled : int
        Side of the average-pooled map fed to the dense layers.

    """

    image: int = 28
    in_channels: int = 1
    conv1: int = 32
    conv2: int = 64
    conv3: int = 64
    hidden: int = 512
    classes: int = 10
    padding: int = 2
    pooled: int = 2

    @property
    def conv3_side(self) -> int:
        """Side of conv3's output map (5 for Fashion-MNIST, 3 for SVHN)."""
        side = (self.image + 2 * self.padding - 4) // 2
        side = (side + 2 * self.padding - 4) // 2
        return side - 2


#: Table 7: SVHN input, unpadded 5x5 convs.
SVHN_SIZES = LeNetSizes(image=32, in_channels=3, padding=0)


def adaptive_avg_pool(side: int, out: int) -> nn.AvgPool2d:
    """Return the fixed `AvgPool2d` equal to ``AdaptiveAvgPool2d(out)`` on a ``side x side`` map.

    Parameters
    ----------
    side : int
        Input height and width.
    out : int
        Output height and width.

    Returns
    -------
    torch.nn.AvgPool2d

    Raises
    ------
    InputError
        If the adaptive bins are not one kernel at a constant stride.

    """
    bins = [((i * side) // out, math.ceil((i + 1) * side / out)) for i in range(out)]
    kernel = bins[0][1] - bins[0][0]
    stride = bins[1][0] - bins[0][0] if out > 1 else side
    if bins != [(i * stride, i * stride + kernel) for i in range(out)]:
        raise InputError(f"adaptive pooling {side} -> {out} is not a fixed-kernel pool")
    return nn.AvgPool2d(kernel, stride)


class LeNet(nn.Module):
    """The Table 6 / Table 7 LeNet at the given group sizes (no dropout, see module docstring)."""

    def __init__(self, sizes: LeNetSizes, group_sizes: Mapping[str, int]) -> None:
        super().__init__()
        pad = sizes.padding
        self.conv1 = nn.Conv2d(sizes.in_channels, group_sizes["conv1"], 5, padding=pad)
        self.conv2 = nn.Conv2d(group_sizes["conv1"], group_sizes["conv2"], 5, padding=pad)
        self.conv3 = nn.Conv2d(group_sizes["conv2"], group_sizes["conv3"], 3)
        self.fc1 = nn.Linear(group_sizes["conv3"] * sizes.pooled**2, group_sizes["fc1"])
        self.fc2 = nn.Linear(group_sizes["fc1"], sizes.classes)
        self.pool = nn.MaxPool2d(2)
        self.avgpool = adaptive_avg_pool(sizes.conv3_side, sizes.pooled)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Map images ``(N, C, H, W)`` to logits ``(N, classes)``."""
        x = self.pool(torch.relu(self.conv1(x)))  # (N, c1, 14, 14)
        x = self.pool(torch.relu(self.conv2(x)))  # (N, c2, 7, 7) Fashion / (N, c2, 5, 5) SVHN
        x = self.avgpool(torch.relu(self.conv3(x)))  # (N, c3, 2, 2)
        x = torch.relu(self.fc1(torch.flatten(x, 1)))  # NCHW flatten: (N, c3 * 4)
        return self.fc2(x)


def _lenet(name: str, paper: str, sizes: LeNetSizes, paper_widths: tuple[float, ...]) -> ZooModel:
    hw = sizes.pooled**2
    layouts = chain_layouts(
        [("conv1", "conv1"), ("conv2", "conv2"), ("conv3", "conv3")], [("fc1", "fc1"), ("fc2", None)], hw
    )
    return ZooModel(
        name=name,
        paper=paper,
        groups=(
            ("conv1", sizes.conv1),
            ("conv2", sizes.conv2),
            ("conv3", sizes.conv3),
            ("fc1", sizes.hidden),
        ),
        builder=lambda group_sizes: LeNet(sizes, group_sizes),
        layouts=layouts,
        input_shape=(sizes.in_channels, sizes.image, sizes.image),
        input_dtype="float32",
        num_classes=sizes.classes,
        paper_widths=paper_widths,
    )


def feddrop_lenet(sizes: LeNetSizes = LeNetSizes()) -> ZooModel:
    """Return the FedDrop Fashion-MNIST LeNet (Table 6) as a `ZooModel`."""
    return _lenet("feddrop-lenet", "FedDrop, Table 6 (Fashion-MNIST LeNet)", sizes, LENET_PAPER_WIDTHS)


def feddrop_svhn(sizes: LeNetSizes = SVHN_SIZES) -> ZooModel:
    """Return the FedDrop SVHN model (Table 7) as a `ZooModel`."""
    return _lenet("feddrop-svhn", "FedDrop, Table 7 (SVHN LeNet)", sizes, SVHN_PAPER_WIDTHS)


@dataclass(frozen=True)
class VGG9Sizes:
    """Full-width sizes of the FedDrop VGG-9 (Table 8).

    Attributes
    ----------
    image : int
        Input height and width.
    in_channels : int
        Input channels.
    convs : tuple of int
        Output channels of the six 3x3 convs; a 2x2 max pool follows the 2nd and the 4th.
    hidden : tuple of int
        Units of the two hidden dense layers.
    classes : int
        Number of output logits.

    """

    image: int = 32
    in_channels: int = 3
    convs: tuple[int, ...] = (32, 64, 128, 128, 256, 256)
    hidden: tuple[int, ...] = (512, 512)
    classes: int = 10


class FedDropVGG9(nn.Module):
    """The Table 8 VGG-9 at the given group sizes (no dropout, see module docstring)."""

    def __init__(self, sizes: VGG9Sizes, group_sizes: Mapping[str, int]) -> None:
        super().__init__()
        c = [sizes.in_channels] + [group_sizes[f"conv{i + 1}"] for i in range(len(sizes.convs))]
        self.convs = nn.ModuleList(nn.Conv2d(c[i], c[i + 1], 3, padding=1) for i in range(len(c) - 1))
        self.fc1 = nn.Linear(c[-1], group_sizes["fc1"])
        self.fc2 = nn.Linear(group_sizes["fc1"], group_sizes["fc2"])
        self.fc3 = nn.Linear(group_sizes["fc2"], sizes.classes)
        self.pool = nn.MaxPool2d(2)
        self.avgpool = nn.AdaptiveAvgPool2d(1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Map images ``(N, 3, 32, 32)`` to logits ``(N, classes)``."""
        for i, conv in enumerate(self.convs):
            x = torch.relu(conv(x))
            if i in (1, 3):
                x = self.pool(x)  # (N, c2, 16, 16), then (N, c4, 8, 8)
        x = torch.flatten(self.avgpool(x), 1)  # (N, c6, 8, 8) -> (N, c6)
        x = torch.relu(self.fc1(x))
        x = torch.relu(self.fc2(x))
        return self.fc3(x)


def feddrop_vgg9(sizes: VGG9Sizes = VGG9Sizes()) -> ZooModel:
    """Return the FedDrop CIFAR-10 VGG-9 (Table 8) as a `ZooModel`."""
    # The last conv map is average-pooled to 1x1 before the flatten (Table 8).
    groups, layouts = vgg_groups_and_layouts(sizes.convs, sizes.hidden, 1)
    return ZooModel(
        name="feddrop-vgg9",
        paper="FedDrop, Table 8 (CIFAR-10 VGG-9)",
        groups=groups,
        builder=lambda group_sizes: FedDropVGG9(sizes, group_sizes),
        layouts=layouts,
        input_shape=(sizes.in_channels, sizes.image, sizes.image),
        input_dtype="float32",
        num_classes=sizes.classes,
        paper_widths=VGG9_PAPER_WIDTHS,
    )


@dataclass(frozen=True)
class CharLSTMSizes:
    """Full-width sizes of the FedDrop Shakespeare LSTM (Table 9).

    Attributes
    ----------
    vocab : int
        Number of characters (embedding rows and output logits).
    embedding : int
        Embedding dimension (not a neuron group).
    hidden : int
        LSTM hidden units.
    seq_len : int
        Characters per example (LEAF Shakespeare).

    """

    vocab: int = 80
    embedding: int = 8
    hidden: int = 256
    seq_len: int = 80


class CharLSTM(nn.Module):
    """The Table 9 LSTM at the given width: next character from the last time step."""

    def __init__(self, sizes: CharLSTMSizes, group_sizes: Mapping[str, int]) -> None:
        super().__init__()
        self.encoder = nn.Embedding(sizes.vocab, sizes.embedding)
        self.lstm = nn.LSTM(sizes.embedding, group_sizes["lstm"], batch_first=True)
        self.decoder = nn.Linear(group_sizes["lstm"], sizes.vocab)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Map int64 character ids ``(N, L)`` to logits ``(N, vocab)``."""
        out, _ = self.lstm(self.encoder(x))  # (N, L, 8) -> (N, L, H)
        return self.decoder(out[:, -1])  # last step: (N, H)


def feddrop_lstm(sizes: CharLSTMSizes = CharLSTMSizes()) -> ZooModel:
    """Return the FedDrop Shakespeare LSTM (Table 9) as a `ZooModel`."""
    layouts = {
        "encoder.weight": (None, None),
        **lstm_layouts("lstm", "lstm", None),
        **layer_layouts("decoder", None, Dim("lstm"), conv=False),
    }
    return ZooModel(
        name="feddrop-lstm",
        paper="FedDrop, Table 9 (Shakespeare LSTM)",
        groups=(("lstm", sizes.hidden),),
        builder=lambda group_sizes: CharLSTM(sizes, group_sizes),
        layouts=layouts,
        input_shape=(sizes.seq_len,),
        input_dtype="int64",
        num_classes=sizes.vocab,
        paper_widths=LSTM_PAPER_WIDTHS,
    )


MODELS = {
    "feddrop-lenet": feddrop_lenet,
    "feddrop-svhn": feddrop_svhn,
    "feddrop-vgg9": feddrop_vgg9,
    "feddrop-lstm": feddrop_lstm,
}
