"""The example models of ``docs/examples/models``, as ``--model`` values."""

from __future__ import annotations

from pathlib import Path

EXAMPLES = Path(__file__).resolve().parents[2] / "docs" / "examples" / "models"

SMALL_CNN = f"{EXAMPLES / 'small_cnn.py'}:small_cnn"
MOBILENET_V2 = f"{EXAMPLES / 'mobilenet_v2.py'}:mobilenet_v2"
RESNET18 = f"{EXAMPLES / 'resnet18.py'}:resnet18"
ALL = (SMALL_CNN, MOBILENET_V2, RESNET18)

#: A depthwise-separable CNN without BatchNorm (tests/exporters/models/depthwise.py).
DEPTHWISE = f"{Path(__file__).resolve().parent / 'models' / 'depthwise.py'}:depthwise"
