"""PyTorch optimizers that update exactly like the exported ORT optimizer graphs.

ORT's AdamW graph is the Hugging Face form (see `exporters.artifacts`); ``torch.optim.AdamW``
differs from it (it scales ``eps`` by ``sqrt(1 - beta2**t)`` and forms ``1 - beta`` in
double precision), so `OrtAdamW` reimplements ORT's update. `torch_optimizer` builds
the twin of a set's optimizer at the manifest's hyper-parameters.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import numpy as np
import torch

from exporters.artifacts import OPTIMIZER_DEFAULTS, OPTIMIZERS
from exporters.userinput import InputError


class OrtAdamW(torch.optim.Optimizer):
    """PyTorch AdamW that updates exactly like ORT's default AdamW graph.

    ORT's ``AdamWOptimizer`` kernel in ``adam_mode=1`` (Hugging Face): with
    ``m, v`` the moment estimates at step ``t``,
    ``p -= lr * sqrt(1 - b2**t) / (1 - b1**t) * m / (sqrt(v) + eps)``, then
    ``p -= lr * weight_decay * p``.

    Parameters
    ----------
    params : iterable
        Parameters or parameter groups.
    lr : float
    betas : tuple of float
    eps : float
    weight_decay : float
    """

    def __init__(
        self,
        params: Iterable[Any],
        lr: float = OPTIMIZER_DEFAULTS["adamw"]["lr"],
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = OPTIMIZER_DEFAULTS["adamw"]["eps"],
        weight_decay: float = 0.0,
    ) -> None:
        super().__init__(params, {"lr": lr, "betas": betas, "eps": eps, "weight_decay": weight_decay})

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:  # type: ignore[override]
        """Apply one update to every parameter that has a gradient.

        Parameters
        ----------
        closure : callable, optional
            Re-evaluates the model and returns the loss.

        Returns
        -------
        float or None
            The closure's loss.
        """
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            # The kernel holds the betas as float32 attributes and forms 1 - beta in float32
            # (1 - 0.999f = 0.00099998713, not 0.001): a 6e-6 relative difference in the step.
            b1, b2 = (np.float32(b) for b in group["betas"])
            one = np.float32(1.0)
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    state["step"] = 0
                    state["m"] = torch.zeros_like(p)
                    state["v"] = torch.zeros_like(p)
                state["step"] += 1
                t = state["step"]
                m, v = state["m"], state["v"]
                m.mul_(float(b1)).add_(p.grad, alpha=float(one - b1))
                v.mul_(float(b2)).addcmul_(p.grad, p.grad, value=float(one - b2))
                # As the kernel: float32 corrections from a double power of the float32 betas.
                bc1 = float(one - np.float32(float(b1) ** t))
                bc2 = float(one - np.float32(float(b2) ** t))
                step_size = group["lr"] * (bc2**0.5) / bc1
                p.addcdiv_(m, v.sqrt().add_(group["eps"]), value=-step_size)
                if group["weight_decay"]:
                    p.mul_(1.0 - group["lr"] * group["weight_decay"])
        return loss


def torch_optimizer(optimizer: str, params: Iterable[Any], lr: float | None = None) -> torch.optim.Optimizer:
    """Return the PyTorch optimizer that trains like the exported ORT optimizer.

    Parameters
    ----------
    optimizer : {"adamw", "sgd"}
    params : iterable
        Module parameters.
    lr : float, optional
        Learning rate; ORT's default when ``None``.

    Returns
    -------
    torch.optim.Optimizer
    """
    if optimizer not in OPTIMIZERS:
        raise InputError(f"optimizer {optimizer!r} is not one of {', '.join(OPTIMIZERS)}")
    rate = OPTIMIZER_DEFAULTS[optimizer]["lr"] if lr is None else lr
    if optimizer == "sgd":
        return torch.optim.SGD(params, lr=rate)
    return OrtAdamW(params, lr=rate)
