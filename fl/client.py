"""Local training and evaluation of one client in PyTorch (the ``inprocess`` path).

A *local trainer* turns a `TrainIns` plus the client's data into trained
parameters and metrics. Trainers are looked up by the name in
``TrainIns.config["trainer"]`` (default ``"plain"``); methods whose local step
differs (FjORD's per-step width sampling, FedDrop's SyncDrop masks) provide their
own trainer and name it in `TRAINERS` as ``"module:function"``, imported on first
use so that this module depends on no strategy.

Every trainer has the signature ``trainer(model, ins, x, y) -> (params, metrics)``
with ``metrics`` holding at least ``loss``, ``accuracy`` and ``steps``; it must be
deterministic given ``ins.config["seed"]``.
"""

from __future__ import annotations

import importlib
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import numpy as np
import torch
from torch import nn

from exporters.arch import Arch
from exporters.zoo import ZooModel
from fl.records import Params, TrainIns, TrainRes

#: A local trainer: ``(model, ins, x, y) -> (trained params, metrics)``.
LocalTrainer = Callable[[ZooModel, TrainIns, np.ndarray, np.ndarray], tuple[Params, dict[str, float]]]

#: Trainer names and where they live (``"module:function"``).
TRAINERS: dict[str, str] = {
    "plain": "fl.client:train_plain",
    "fjord": "fl.strategies.fjord:train_ordered",
    "syncdrop": "fl.strategies.feddrop:train_syncdrop",
}


def get_trainer(name: str) -> LocalTrainer:
    """Return the local trainer registered as ``name``.

    Raises
    ------
    KeyError
        If no trainer has that name.
    """
    module, _, func = TRAINERS[name].partition(":")
    trainer: LocalTrainer = getattr(importlib.import_module(module), func)
    return trainer


def build_module(model: ZooModel, arch: Arch, params: Mapping[str, np.ndarray]) -> nn.Module:
    """Build the torch module of ``arch`` and load ``params`` into it.

    Parameters
    ----------
    model : ZooModel
    arch : Arch
    params : mapping of str to numpy.ndarray
        Every parameter of the module, by name.

    Returns
    -------
    torch.nn.Module
    """
    module = model.build(arch)
    state = {k: torch.from_numpy(np.ascontiguousarray(v, dtype=np.float32)) for k, v in params.items()}
    module.load_state_dict(state, strict=True)
    return module


def module_params(module: nn.Module) -> Params:
    """Return a module's parameters as float32 numpy arrays in state_dict order."""
    return {k: v.detach().cpu().numpy().astype(np.float32, copy=True) for k, v in module.state_dict().items()}


def to_tensors(model: ZooModel, x: np.ndarray, y: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
    """Convert a data shard to tensors of the model's input dtype."""
    dtype = torch.int64 if model.input_dtype == "int64" else torch.float32
    return torch.as_tensor(x, dtype=dtype), torch.as_tensor(y, dtype=torch.int64)


def batches(n: int, batch_size: int, rng: np.random.Generator) -> Iterator[np.ndarray]:
    """Yield shuffled index batches covering ``range(n)`` once (last batch may be short)."""
    order = rng.permutation(n)
    for start in range(0, n, batch_size):
        yield order[start : start + batch_size]


def train_plain(model: ZooModel, ins: TrainIns, x: np.ndarray, y: np.ndarray) -> tuple[Params, dict[str, float]]:
    """Train the sub-model with SGD for ``epochs`` over the shard.

    Parameters
    ----------
    model : ZooModel
    ins : TrainIns
        ``config`` keys used: ``epochs``, ``batch_size``, ``lr``, ``seed``,
        optional ``momentum`` and ``weight_decay`` (both 0 by default).
    x, y : numpy.ndarray
        The client's examples and labels.

    Returns
    -------
    params : Params
    metrics : dict
        ``loss`` and ``accuracy`` over the last epoch, ``steps`` in total.
    """
    cfg = ins.config
    torch.manual_seed(int(cfg.get("seed", 0)))
    rng = np.random.default_rng(int(cfg.get("seed", 0)))
    module = build_module(model, ins.submodel.arch, ins.parameters)
    module.train()
    opt = torch.optim.SGD(
        module.parameters(),
        lr=float(cfg.get("lr", 0.05)),
        momentum=float(cfg.get("momentum", 0.0)),
        weight_decay=float(cfg.get("weight_decay", 0.0)),
    )
    xt, yt = to_tensors(model, x, y)
    metrics = sgd_epochs(module, opt, xt, yt, int(cfg.get("epochs", 1)), int(cfg.get("batch_size", 20)), rng)
    return module_params(module), metrics


def sgd_epochs(
    module: nn.Module,
    opt: torch.optim.Optimizer,
    xt: torch.Tensor,
    yt: torch.Tensor,
    epochs: int,
    batch_size: int,
    rng: np.random.Generator,
    before_step: Callable[[int, np.ndarray], None] | None = None,
) -> dict[str, float]:
    """Take one ``opt`` step of cross-entropy per shuffled batch (`batches`), ``epochs`` times over the data.

    Parameters
    ----------
    module : torch.nn.Module
        In training mode.
    opt : torch.optim.Optimizer
        Over ``module``'s parameters.
    xt, yt : torch.Tensor
        Examples and int64 labels.
    epochs, batch_size : int
    rng : numpy.random.Generator
        Shuffles every epoch.
    before_step : callable, optional
        Called as ``before_step(step, batch indices)`` before each step (``step`` counts from 0).

    Returns
    -------
    dict of str to float
        ``loss`` and ``accuracy`` over the last epoch, ``steps`` in total.
    """
    steps = 0
    loss_sum = correct = seen = 0.0
    for _ in range(epochs):
        loss_sum = correct = seen = 0.0
        for idx in batches(len(yt), batch_size, rng):
            if before_step is not None:
                before_step(steps, idx)
            opt.zero_grad(set_to_none=True)
            out = module(xt[idx])
            loss = nn.functional.cross_entropy(out, yt[idx])
            loss.backward()
            opt.step()
            steps += 1
            loss_sum += loss.item() * len(idx)
            correct += float((out.argmax(1) == yt[idx]).sum())
            seen += len(idx)
    seen = max(seen, 1.0)
    return {"loss": loss_sum / seen, "accuracy": correct / seen, "steps": float(steps)}


def run_local(
    model: ZooModel, ins: TrainIns, x: np.ndarray, y: np.ndarray, clock: Callable[[], float] = time.perf_counter
) -> TrainRes:
    """Run the trainer named in ``ins.config`` and time it.

    Parameters
    ----------
    model : ZooModel
    ins : TrainIns
    x, y : numpy.ndarray
        The client's shard.
    clock : callable
        Monotonic clock in seconds (injected for tests).

    Returns
    -------
    TrainRes
    """
    trainer = get_trainer(str(ins.config.get("trainer", "plain")))
    start = clock()
    params, metrics = trainer(model, ins, x, y)
    return TrainRes(
        cid=ins.cid,
        submodel=ins.submodel,
        parameters=params,
        num_examples=int(len(y)),
        compute_seconds=clock() - start,
        metrics=metrics,
    )


@torch.no_grad()
def evaluate(
    model: ZooModel, arch: Arch, params: Mapping[str, np.ndarray], x: np.ndarray, y: np.ndarray, batch_size: int = 256
) -> dict[str, float]:
    """Return ``{"loss", "accuracy"}`` of the sub-model ``arch`` with ``params`` on ``(x, y)``."""
    module = build_module(model, arch, params)
    module.eval()
    xt, yt = to_tensors(model, x, y)
    loss_sum = correct = 0.0
    for start in range(0, len(yt), batch_size):
        out = module(xt[start : start + batch_size])
        yb = yt[start : start + batch_size]
        loss_sum += float(nn.functional.cross_entropy(out, yb, reduction="sum"))
        correct += float((out.argmax(1) == yb).sum())
    n = max(len(yt), 1)
    return {"loss": loss_sum / n, "accuracy": correct / n}


def describe(config: Mapping[str, Any]) -> str:
    """Return a one-line summary of a local config (for progress output)."""
    return ", ".join(f"{k}={config[k]}" for k in ("trainer", "epochs", "batch_size", "lr") if k in config)
