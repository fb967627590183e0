"""Coded Federated Dropout: the EMNIST-62 CNN of the paper's Table 5.

conv 5x5 'same' (1 -> 32) -> ReLU -> maxpool 2 -> conv 5x5 'same' (32 -> 64) -> ReLU
-> maxpool 2 -> flatten (64 * 7 * 7 = 3136) -> dense 2048 -> ReLU -> dense 62.
6,603,710 parameters at full width. Neurons are dropped on every layer except the
first layer's input and the last layer's output (paper section 6.5).
"""

from __future__ import annotations

from exporters.zoo import ZooModel
from exporters.zoo.common import TwoConvCNNSizes, two_conv_cnn

#: Table 5 of the paper.
CODED_CNN_SIZES = TwoConvCNNSizes(conv1=32, conv2=64, hidden=2048, classes=62)


def coded_cnn(sizes: TwoConvCNNSizes = CODED_CNN_SIZES) -> ZooModel:
    """Return the Coded-FD EMNIST CNN as a `ZooModel`."""
    return two_conv_cnn("cfd-cnn", "Coded Federated Dropout, Table 5 (EMNIST-62 CNN)", sizes)


MODELS = {"cfd-cnn": coded_cnn}
