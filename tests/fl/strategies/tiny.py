"""A tiny width-scalable MLP and separable data for fast strategy tests (not a test module)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import numpy as np
import torch
from torch import nn

from exporters.arch import Dim, ParamLayout
from exporters.zoo import ZooModel
from fl.client import evaluate, module_params, run_local
from fl.records import ClientSpec, Params
from fl.strategies.base import Strategy

FEATURES = 6
CLASSES = 3


class TinyMLP(nn.Module):
    """x (6) -> fc1 (h1) -> ReLU -> fc2 (h2) -> ReLU -> fc3 (3)."""

    def __init__(self, group_sizes: Mapping[str, int]) -> None:
        super().__init__()
        self.fc1 = nn.Linear(FEATURES, group_sizes["h1"])
        self.fc2 = nn.Linear(group_sizes["h1"], group_sizes["h2"])
        self.fc3 = nn.Linear(group_sizes["h2"], CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc3(torch.relu(self.fc2(torch.relu(self.fc1(x)))))


def tiny_model(h1: int = 10, h2: int = 8) -> ZooModel:
    layouts: dict[str, ParamLayout] = {
        "fc1.weight": (Dim("h1"), None),
        "fc1.bias": (Dim("h1"),),
        "fc2.weight": (Dim("h2"), Dim("h1")),
        "fc2.bias": (Dim("h2"),),
        "fc3.weight": (None, Dim("h2")),
        "fc3.bias": (None,),
    }
    return ZooModel(
        name="tiny-mlp",
        paper="test",
        groups=(("h1", h1), ("h2", h2)),
        builder=TinyMLP,
        layouts=layouts,
        input_shape=(FEATURES,),
        input_dtype="float32",
        num_classes=CLASSES,
    )


def initial_params(model: ZooModel, seed: int = 0) -> Params:
    torch.manual_seed(seed)
    return module_params(model.build())


def blobs(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Three well separated Gaussian blobs (same centres for every seed)."""
    centres = np.random.default_rng(123).normal(size=(CLASSES, FEATURES)).astype(np.float32) * 3.0
    rng = np.random.default_rng(seed)
    y = rng.integers(0, CLASSES, n)
    x = centres[y] + rng.normal(size=(n, FEATURES)).astype(np.float32) * 0.7
    return x.astype(np.float32), y.astype(np.int64)


def run_rounds(
    strategy: Strategy,
    clients: Sequence[ClientSpec],
    rounds: int,
    data: Mapping[str, tuple[np.ndarray, np.ndarray]],
    on_round: Callable[[int], None] | None = None,
    start: int = 0,
) -> list[dict[str, float]]:
    """Run rounds ``start .. start + rounds - 1`` in process; return each round's metrics."""
    history = []
    for rnd in range(start, start + rounds):
        ins = strategy.configure_round(rnd, clients)
        results = [run_local(strategy.model, i, *data[cid]) for cid, i in ins.items()]
        _, metrics = strategy.aggregate_round(rnd, results, [])
        history.append(metrics)
        if on_round:
            on_round(rnd)
    return history


def learn_blobs(strategy: Strategy, clients: Sequence[ClientSpec], rounds: int) -> tuple[np.ndarray, np.ndarray]:
    """Train on one 30-example blob shard per client, check the training loss fell, return a 150-example test set."""
    data = {c.cid: blobs(30, seed=i) for i, c in enumerate(clients)}
    history = run_rounds(strategy, clients, rounds, data)
    assert history[-1]["train_loss"] < history[0]["train_loss"]
    return blobs(150, seed=99)


def accuracy(strategy: Strategy, x: np.ndarray, y: np.ndarray, width: float = 1.0) -> float:
    sub = strategy.model.static(width)
    return evaluate(strategy.model, sub.arch, strategy.model.extract(strategy.global_state, sub), x, y)["accuracy"]
