"""A small CNN for 28x28 grey images in ten classes: the smallest model fleetbench can take.

Profile it with ``fleetbench profile --fleet FLEET --model docs/examples/models/small_cnn.py:small_cnn``.
"""

import torch
from torch import nn


class SmallCNN(nn.Module):
    """conv-BN-ReLU-pool twice, then a hidden dense layer and the classifier."""

    def __init__(self, num_classes: int = 10) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 16, 3, padding=1, bias=False),
            nn.BatchNorm2d(16),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 3, padding=1, bias=False),
            nn.BatchNorm2d(32),
            nn.ReLU(),
            nn.MaxPool2d(2),
        )
        self.hidden = nn.Linear(32 * 7 * 7, 64)
        self.classifier = nn.Linear(64, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Map images (N, 1, 28, 28) to logits (N, classes)."""
        x = torch.flatten(self.features(x), 1)
        return self.classifier(torch.relu(self.hidden(x)))


def small_cnn(num_classes: int = 10) -> nn.Module:
    """Return the model at full width; fleetbench derives every narrower width from it."""
    return SmallCNN(num_classes)


small_cnn.input_shape = (1, 28, 28)
