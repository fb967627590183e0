"""MobileNetV2 for 32x32 colour images: inverted residual blocks of depthwise convolutions.

The blocks follow the MobileNetV2 paper (expansion factor t, output channels c, n repeats,
first stride s), with the strides of the first stages set to 1 for a 32x32 input, as the
CIFAR variants of the network do. ``width`` scales every layer but the classifier.
"""

import torch
from torch import nn

#: (expansion t, channels c, repeats n, first stride s) per stage.
STAGES = ((1, 16, 1, 1), (6, 24, 2, 1), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2), (6, 320, 1, 1))


def conv_bn(cin: int, cout: int, kernel: int, stride: int = 1, groups: int = 1, act: bool = True) -> nn.Sequential:
    """Conv (no bias), BatchNorm and, unless ``act`` is false, ReLU6."""
    layers = [nn.Conv2d(cin, cout, kernel, stride, kernel // 2, groups=groups, bias=False), nn.BatchNorm2d(cout)]
    if act:
        layers.append(nn.ReLU6())
    return nn.Sequential(*layers)


class InvertedResidual(nn.Module):
    """1x1 expansion, 3x3 depthwise, 1x1 linear projection; a residual add when shapes agree."""

    def __init__(self, cin: int, cout: int, stride: int, expansion: int) -> None:
        super().__init__()
        hidden = cin * expansion
        layers = [conv_bn(cin, hidden, 1)] if expansion != 1 else []
        layers += [conv_bn(hidden, hidden, 3, stride, groups=hidden), conv_bn(hidden, cout, 1, act=False)]
        self.conv = nn.Sequential(*layers)
        self.residual = stride == 1 and cin == cout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Apply the block."""
        return x + self.conv(x) if self.residual else self.conv(x)


class MobileNetV2(nn.Module):
    """MobileNetV2 at a width multiplier, for small images."""

    def __init__(self, num_classes: int = 10, width: float = 0.5, last: int = 640) -> None:
        super().__init__()
        channels = max(8, int(32 * width))
        blocks: list[nn.Module] = [conv_bn(3, channels, 3)]
        for t, c, n, s in STAGES:
            out = max(8, int(c * width))
            for i in range(n):
                blocks.append(InvertedResidual(channels, out, s if i == 0 else 1, t))
                channels = out
        blocks.append(conv_bn(channels, last, 1))
        self.features = nn.Sequential(*blocks)
        self.classifier = nn.Linear(last, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Map images (N, 3, 32, 32) to logits (N, classes)."""
        x = nn.functional.adaptive_avg_pool2d(self.features(x), 1)
        return self.classifier(torch.flatten(x, 1))


def mobilenet_v2(num_classes: int = 10) -> nn.Module:
    """Return MobileNetV2 x0.5 for 32x32 images."""
    return MobileNetV2(num_classes)


mobilenet_v2.input_shape = (3, 32, 32)
