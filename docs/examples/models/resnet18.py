"""ResNet18 for 32x32 colour images: BasicBlocks with identity and projection shortcuts.

The layers are named as in torchvision's ResNet (``conv1``, ``bn1``, ``layer1`` ..
``layer4`` of two BasicBlocks, ``downsample``, ``fc``); the stem is a 3x3 convolution
without max-pooling, as ResNets for 32x32 inputs have it.
"""

import torch
from torch import nn


class BasicBlock(nn.Module):
    """conv-BN-ReLU-conv-BN plus the shortcut, then ReLU."""

    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.downsample = None
        if stride != 1 or cin != cout:
            self.downsample = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Apply the block."""
        out = torch.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        shortcut = x if self.downsample is None else self.downsample(x)
        return torch.relu(out + shortcut)


class ResNet18(nn.Module):
    """ResNet18: a 3x3 stem, four stages of two BasicBlocks, global average pooling, fc."""

    def __init__(self, num_classes: int = 10, planes: tuple = (64, 128, 256, 512)) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, planes[0], 3, 1, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes[0])
        cin = planes[0]
        for i, cout in enumerate(planes, start=1):
            stride = 1 if i == 1 else 2
            self.add_module(f"layer{i}", nn.Sequential(BasicBlock(cin, cout, stride), BasicBlock(cout, cout, 1)))
            cin = cout
        self.fc = nn.Linear(cin, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Map images (N, 3, 32, 32) to logits (N, classes)."""
        x = torch.relu(self.bn1(self.conv1(x)))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(nn.functional.adaptive_avg_pool2d(x, 1), 1))


def resnet18(num_classes: int = 10) -> nn.Module:
    """Return ResNet18 for 32x32 images."""
    return ResNet18(num_classes)


resnet18.input_shape = (3, 32, 32)
