"""A depthwise-separable CNN without BatchNorm: its step is well conditioned, so the step model's
grouped-conv weight gradient is checked at the zoo's tolerance."""

import torch
from torch import nn


class Depthwise(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 12, 3, padding=1)
        self.depthwise = nn.Conv2d(12, 12, 3, stride=2, padding=1, groups=12)
        self.pointwise = nn.Conv2d(12, 24, 1)
        self.fc = nn.Linear(24, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.stem(x))
        x = nn.functional.relu6(self.depthwise(x))
        x = torch.relu(self.pointwise(x))
        return self.fc(torch.flatten(nn.functional.adaptive_avg_pool2d(x, 1), 1))


def depthwise() -> nn.Module:
    return Depthwise()


depthwise.input_shape = (3, 16, 16)
