"""FLuID: the three models of the paper's section 6 (FEMNIST CNN, CIFAR-10 VGG-9, Shakespeare LSTM).

The paper gives layer types and sizes but no parameter counts; padding, pooling placement and the
LSTM's input encoding follow the authors' TensorFlow reference (``tflite_convertor``):

* ``fluid-cnn`` (FEMNIST 1x28x28, 62 classes): conv 5x5 'same' (1 -> 16) -> ReLU -> maxpool 2
  -> conv 5x5 'same' (16 -> 64) -> ReLU -> maxpool 2 -> flatten (64 * 7 * 7 = 3136) -> dense 120
  -> ReLU -> dense 62. 410,022 parameters.
* ``fluid-vgg9`` (CIFAR-10 3x32x32): conv 3x3 'same' 32, 32, maxpool, 64, 64, maxpool, 128, 128,
  maxpool -> flatten (128 * 4 * 4 = 2048) -> dense 512 -> ReLU -> dense 256 -> ReLU -> dense 10.
  1,469,994 parameters.
* ``fluid-lstm`` (Shakespeare, 80 characters, sequences of 80): one-hot characters (no embedding,
  so no embedding neuron group) -> LSTM 128 -> LSTM 128 -> dense 80 on the last time step.
  249,936 parameters with PyTorch's two LSTM bias vectors; the Keras reference has one bias per
  gate row, 248,912 parameters (1,024 fewer).

Neurons are conv filters, dense units and LSTM hidden units (paper section 3), every hidden layer
is a group, the first layer keeps its full input and the classifier its full output. The flatten
is NCHW (channel-major), where Keras flattens NHWC: same parameters, permuted columns.
The reference builds a sub-model of size p with ``int(p * K)`` (floor) neurons per layer; this
project uses ``ceil(p * K)`` everywhere (`exporters.arch.size_at_width`; a layer never drops to
zero neurons), so e.g. p = 0.95 keeps 16 of 16 first-layer filters
here and 15 there. The softmax of the output layers is part of the loss, not of the modules.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F

from exporters.arch import Dim
from exporters.zoo import ZooModel
from exporters.zoo.common import TwoConvCNNSizes, layer_layouts, lstm_layouts, two_conv_cnn, vgg_groups_and_layouts

#: Sub-model sizes of Table 2 (all three models) plus full width.
PAPER_WIDTHS = (0.5, 0.65, 0.75, 0.85, 0.95, 1.0)

#: FEMNIST also runs r = 0.40 with 1000 clients (Table 5).
FEMNIST_PAPER_WIDTHS = (0.4, *PAPER_WIDTHS)


#: The FEMNIST CNN of section 6: 5x5 'same' convs with 16 and 64 filters, dense 120.
FEMNIST_CNN_SIZES = TwoConvCNNSizes(conv1=16, conv2=64, hidden=120, classes=62)


def fluid_cnn(sizes: TwoConvCNNSizes = FEMNIST_CNN_SIZES) -> ZooModel:
    """Return the FLuID FEMNIST CNN as a `ZooModel`."""
    return two_conv_cnn("fluid-cnn", "FLuID, section 6 (FEMNIST CNN)", sizes, FEMNIST_PAPER_WIDTHS)


@dataclass(frozen=True)
class FluidVGG9Sizes:
    """Full-width sizes of the FLuID VGG-9.

    Attributes
    ----------
    image : int
        Input height and width.
    in_channels : int
        Input channels.
    convs : tuple of int
        Output channels of the six 3x3 'same' convs; a 2x2 max pool follows every second one.
    hidden : tuple of int
        Units of the two hidden dense layers.
    classes : int
        Number of output logits.

    """

    image: int = 32
    in_channels: int = 3
    convs: tuple[int, ...] = (32, 32, 64, 64, 128, 128)
    hidden: tuple[int, ...] = (512, 256)
    classes: int = 10

    @property
    def pooled(self) -> int:
        """Side of the last conv's map after the three max pools (4)."""
        return self.image // 8


class FluidVGG9(nn.Module):
    """The FLuID VGG-9 at the given group sizes."""

    def __init__(self, sizes: FluidVGG9Sizes, group_sizes: Mapping[str, int]) -> None:
        super().__init__()
        c = [sizes.in_channels] + [group_sizes[f"conv{i + 1}"] for i in range(len(sizes.convs))]
        self.convs = nn.ModuleList(nn.Conv2d(c[i], c[i + 1], 3, padding=1) for i in range(len(c) - 1))
        self.fc1 = nn.Linear(c[-1] * sizes.pooled**2, group_sizes["fc1"])
        self.fc2 = nn.Linear(group_sizes["fc1"], group_sizes["fc2"])
        self.fc3 = nn.Linear(group_sizes["fc2"], sizes.classes)
        self.pool = nn.MaxPool2d(2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Map images ``(N, 3, 32, 32)`` to logits ``(N, classes)``."""
        for i, conv in enumerate(self.convs):
            x = torch.relu(conv(x))
            if i % 2 == 1:
                x = self.pool(x)  # (N, c2, 16, 16), (N, c4, 8, 8), (N, c6, 4, 4)
        x = torch.relu(self.fc1(torch.flatten(x, 1)))  # NCHW flatten: (N, c6 * 16)
        x = torch.relu(self.fc2(x))
        return self.fc3(x)


def fluid_vgg9(sizes: FluidVGG9Sizes = FluidVGG9Sizes()) -> ZooModel:
    """Return the FLuID CIFAR-10 VGG-9 as a `ZooModel`."""
    groups, layouts = vgg_groups_and_layouts(sizes.convs, sizes.hidden, sizes.pooled**2)
    return ZooModel(
        name="fluid-vgg9",
        paper="FLuID, section 6 (CIFAR-10 VGG-9)",
        groups=groups,
        builder=lambda group_sizes: FluidVGG9(sizes, group_sizes),
        layouts=layouts,
        input_shape=(sizes.in_channels, sizes.image, sizes.image),
        input_dtype="float32",
        num_classes=sizes.classes,
        paper_widths=PAPER_WIDTHS,
    )


@dataclass(frozen=True)
class FluidLSTMSizes:
    """Full-width sizes of the FLuID Shakespeare LSTM.

    Attributes
    ----------
    vocab : int
        Number of characters (one-hot input width and output logits).
    hidden : tuple of int
        Hidden units of the two stacked LSTM layers.
    seq_len : int
        Characters per example.

    """

    vocab: int = 80
    hidden: tuple[int, ...] = (128, 128)
    seq_len: int = 80


class FluidLSTM(nn.Module):
    """Two stacked LSTMs on one-hot characters: next character from the last time step.

    The layers are separate ``nn.LSTM`` modules so that each can have its own width.
    """

    def __init__(self, sizes: FluidLSTMSizes, group_sizes: Mapping[str, int]) -> None:
        super().__init__()
        self.vocab = sizes.vocab
        self.lstm1 = nn.LSTM(sizes.vocab, group_sizes["lstm1"], batch_first=True)
        self.lstm2 = nn.LSTM(group_sizes["lstm1"], group_sizes["lstm2"], batch_first=True)
        self.fc = nn.Linear(group_sizes["lstm2"], sizes.vocab)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Map int64 character ids ``(N, L)`` to logits ``(N, vocab)``."""
        onehot = F.one_hot(x, self.vocab).to(torch.float32)  # (N, L, vocab)
        out, _ = self.lstm1(onehot)  # (N, L, H1)
        out, _ = self.lstm2(out)  # (N, L, H2)
        return self.fc(out[:, -1])  # last step: (N, H2)


def fluid_lstm(sizes: FluidLSTMSizes = FluidLSTMSizes()) -> ZooModel:
    """Return the FLuID Shakespeare LSTM as a `ZooModel`."""
    layouts = {
        **lstm_layouts("lstm1", "lstm1", None),
        **lstm_layouts("lstm2", "lstm2", Dim("lstm1")),
        **layer_layouts("fc", None, Dim("lstm2"), conv=False),
    }
    return ZooModel(
        name="fluid-lstm",
        paper="FLuID, section 6 (Shakespeare two-layer LSTM)",
        groups=(("lstm1", sizes.hidden[0]), ("lstm2", sizes.hidden[1])),
        builder=lambda group_sizes: FluidLSTM(sizes, group_sizes),
        layouts=layouts,
        input_shape=(sizes.seq_len,),
        input_dtype="int64",
        num_classes=sizes.vocab,
        paper_widths=PAPER_WIDTHS,
    )


MODELS = {
    "fluid-cnn": fluid_cnn,
    "fluid-vgg9": fluid_vgg9,
    "fluid-lstm": fluid_lstm,
}
