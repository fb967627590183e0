"""Coded Federated Dropout: the EMNIST-62 CNN of the paper's Table 5.

conv 5x5 'same' (1 -> 32) -> ReLU -> maxpool 2 -> conv 5x5 'same' (32 -> 64) -> ReLU
-> maxpool 2 -> flatten (64 * 7 * 7 = 3136) -> dense 2048 -> ReLU -> dense 62.
6,603,710 parameters at full width. Neurons are dropped on every layer except the
first layer's input and the last layer's output (paper section 6.5).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch
from torch import nn

from exporters.arch import Dim
from exporters.zoo import ZooModel


@dataclass(frozen=True)
class CodedCNNSizes:
    """Full-width sizes of the EMNIST CNN (Table 5)."""

    image: int = 28
    in_channels: int = 1
    conv1: int = 32
    conv2: int = 64
    hidden: int = 2048
    classes: int = 62
    kernel: int = 5


class CodedCNN(nn.Module):
    """The Table 5 CNN at the given widths."""

    def __init__(self, sizes: CodedCNNSizes, widths: Mapping[str, int]) -> None:
        super().__init__()
        pad = sizes.kernel // 2
        self.conv1 = nn.Conv2d(sizes.in_channels, widths["conv1"], sizes.kernel, padding=pad)
        self.conv2 = nn.Conv2d(widths["conv1"], widths["conv2"], sizes.kernel, padding=pad)
        pooled = sizes.image // 4
        self.fc1 = nn.Linear(widths["conv2"] * pooled * pooled, widths["fc1"])
        self.fc2 = nn.Linear(widths["fc1"], sizes.classes)
        self.pool = nn.MaxPool2d(2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Return logits (N, classes) for images (N, 1, 28, 28)."""
        x = self.pool(torch.relu(self.conv1(x)))  # (N, c1, 14, 14)
        x = self.pool(torch.relu(self.conv2(x)))  # (N, c2, 7, 7)
        x = torch.relu(self.fc1(torch.flatten(x, 1)))  # NCHW flatten: (N, c2 * 49)
        return self.fc2(x)


def coded_cnn(sizes: CodedCNNSizes = CodedCNNSizes()) -> ZooModel:
    """Return the Coded-FD EMNIST CNN as a `ZooModel`."""
    hw = (sizes.image // 4) ** 2
    layouts = {
        "conv1.weight": (Dim("conv1"), None, None, None),
        "conv1.bias": (Dim("conv1"),),
        "conv2.weight": (Dim("conv2"), Dim("conv1"), None, None),
        "conv2.bias": (Dim("conv2"),),
        "fc1.weight": (Dim("fc1"), Dim("conv2", inner=hw)),
        "fc1.bias": (Dim("fc1"),),
        "fc2.weight": (None, Dim("fc1")),
        "fc2.bias": (None,),
    }
    return ZooModel(
        name="cfd-cnn",
        paper="Coded Federated Dropout, Table 5 (EMNIST-62 CNN)",
        groups=(("conv1", sizes.conv1), ("conv2", sizes.conv2), ("fc1", sizes.hidden)),
        builder=lambda widths: CodedCNN(sizes, widths),
        layouts=layouts,
        input_shape=(sizes.in_channels, sizes.image, sizes.image),
        input_dtype="float32",
        num_classes=sizes.classes,
    )


MODELS = {"cfd-cnn": coded_cnn}
