"""Server optimisers: how the mean client update moves the global model (pure maths).

Coded FD (Verardo et al., section 2) aggregates a round into a mean update
``Delta_t`` (per weight, the average of ``theta_k - theta_t`` over the clients whose
sub-model held the weight; 0 where nobody held it) and applies it with a server
optimiser:

* **FedAvg** with server learning rate ``eta`` (paper eq. 3-4):
  ``theta_{t+1} = theta_t + eta * Delta_t``; ``eta = 1`` is McMahan et al.'s FedAvg.
* **FedAdam** (Reddi et al. 2020, Algorithm 2, the paper's eq. 5-7)::

      m_t = beta1 * m_{t-1} + (1 - beta1) * Delta_t
      v_t = beta2 * v_{t-1} + (1 - beta2) * Delta_t ** 2
      theta_{t+1} = theta_t + eta * m_t / (sqrt(v_t) + tau)

  with ``m_{-1} = 0`` and ``v_{-1} = tau ** 2`` (Reddi et al. require
  ``v_{-1} >= tau^2``; this takes the bound) and no bias correction, as in
  Reddi et al. Defaults are the paper's Table 3: ``beta1 = 0.9``,
  ``beta2 = 0.99``, ``tau = 1e-3``.

A weight no client held gets ``Delta = 0``: FedAvg leaves it, FedAdam still moves
it by its momentum ``m`` (the optimiser sees a zero pseudo-gradient there).

`ServerOptimizer` is the thin stateful wrapper a strategy keeps; its `state`
holds only numpy arrays and numbers so that a checkpoint can store it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from exporters.userinput import InputError
from fl.records import Params

#: Names accepted by `ServerOptimizer`.
SERVER_OPTIMIZERS = ("fedavg", "fedadam")


@dataclass(frozen=True, eq=False)
class AdamMoments:
    """FedAdam's memory between rounds.

    Attributes
    ----------
    m, v : Params
        First and second moment estimates, one array per parameter.
    step : int
        Number of updates applied so far.
    """

    m: Params
    v: Params
    step: int = 0


def mean_update(global_state: Mapping[str, np.ndarray], averaged: Mapping[str, np.ndarray]) -> Params:
    """Return ``Delta = averaged - global`` per parameter (float32).

    Parameters
    ----------
    global_state : mapping of str to numpy.ndarray
        The model the clients started from.
    averaged : mapping of str to numpy.ndarray
        The per-weight average of the clients' trained parameters
        (`fl.maths.aggregate.selective_average`), equal to ``global_state`` where no
        client held a weight.

    Returns
    -------
    Params
    """
    return {
        name: (np.asarray(averaged[name], dtype=np.float64) - np.asarray(g, dtype=np.float64)).astype(np.float32)
        for name, g in global_state.items()
    }


def fedavg_step(global_state: Mapping[str, np.ndarray], update: Mapping[str, np.ndarray], lr: float) -> Params:
    """Return ``theta + lr * Delta`` per parameter (paper eq. 3-4).

    Parameters
    ----------
    global_state : mapping of str to numpy.ndarray
    update : mapping of str to numpy.ndarray
        The mean update ``Delta``.
    lr : float
        Server learning rate ``eta``.

    Returns
    -------
    Params
    """
    return {
        name: (np.asarray(g, dtype=np.float64) + lr * np.asarray(update[name], dtype=np.float64)).astype(np.float32)
        for name, g in global_state.items()
    }


def fedadam_init(global_state: Mapping[str, np.ndarray], tau: float = 1e-3) -> AdamMoments:
    """Return FedAdam's initial moments: ``m = 0``, ``v = tau^2`` (Reddi et al., Algorithm 2)."""
    return AdamMoments(
        m={name: np.zeros(np.shape(g), dtype=np.float32) for name, g in global_state.items()},
        v={name: np.full(np.shape(g), tau * tau, dtype=np.float32) for name, g in global_state.items()},
        step=0,
    )


def fedadam_step(
    global_state: Mapping[str, np.ndarray],
    update: Mapping[str, np.ndarray],
    moments: AdamMoments,
    lr: float,
    beta1: float = 0.9,
    beta2: float = 0.99,
    tau: float = 1e-3,
) -> tuple[Params, AdamMoments]:
    """Apply one FedAdam server step (Reddi et al., Algorithm 2; paper eq. 5-7).

    Parameters
    ----------
    global_state : mapping of str to numpy.ndarray
    update : mapping of str to numpy.ndarray
        The mean update ``Delta_t``.
    moments : AdamMoments
        ``m_{t-1}`` and ``v_{t-1}``.
    lr : float
        Server learning rate ``eta``.
    beta1, beta2 : float
        Moment decay rates.
    tau : float
        Degree of adaptivity.

    Returns
    -------
    new_state : Params
        ``theta_t + eta * m_t / (sqrt(v_t) + tau)``.
    moments : AdamMoments
        ``m_t``, ``v_t`` and the step count plus one.
    """
    new: Params = {}
    m_out: Params = {}
    v_out: Params = {}
    for name, g in global_state.items():
        delta = np.asarray(update[name], dtype=np.float64)
        m = beta1 * np.asarray(moments.m[name], dtype=np.float64) + (1.0 - beta1) * delta
        v = beta2 * np.asarray(moments.v[name], dtype=np.float64) + (1.0 - beta2) * delta * delta
        new[name] = (np.asarray(g, dtype=np.float64) + lr * m / (np.sqrt(v) + tau)).astype(np.float32)
        m_out[name] = m.astype(np.float32)
        v_out[name] = v.astype(np.float32)
    return new, AdamMoments(m=m_out, v=v_out, step=moments.step + 1)


class ServerOptimizer:
    """A server optimiser with its memory: FedAvg (stateless) or FedAdam.

    Parameters
    ----------
    name : str
        ``"fedavg"`` or ``"fedadam"``.
    lr : float
        Server learning rate ``eta`` (> 0).
    beta1, beta2, tau : float
        FedAdam's hyper-parameters (ignored by FedAvg).
    """

    def __init__(self, name: str, lr: float, beta1: float = 0.9, beta2: float = 0.99, tau: float = 1e-3) -> None:
        if name not in SERVER_OPTIMIZERS:
            raise InputError(f"unknown server optimiser {name!r}; known: {', '.join(SERVER_OPTIMIZERS)}")
        if not lr > 0:
            raise InputError(f"server learning rate {lr!r} must be positive")
        if not (0 <= beta1 < 1 and 0 <= beta2 < 1):
            raise InputError(f"FedAdam decay rates ({beta1!r}, {beta2!r}) must lie in [0, 1)")
        if not tau > 0:
            raise InputError(f"FedAdam tau {tau!r} must be positive")
        self.name, self.lr, self.beta1, self.beta2, self.tau = name, float(lr), float(beta1), float(beta2), float(tau)
        self.moments: AdamMoments | None = None

    def step(self, global_state: Mapping[str, np.ndarray], update: Mapping[str, np.ndarray]) -> Params:
        """Return the new global state after applying the mean update ``update``."""
        if self.name == "fedavg":
            return fedavg_step(global_state, update, self.lr)
        moments = self.moments or fedadam_init(global_state, self.tau)
        new, self.moments = fedadam_step(global_state, update, moments, self.lr, self.beta1, self.beta2, self.tau)
        return new

    def state(self) -> dict[str, Any]:
        """Return the optimiser memory (``{}`` for FedAvg or before the first FedAdam step)."""
        if self.moments is None:
            return {}
        return {"m": self.moments.m, "v": self.moments.v, "step": self.moments.step}

    def load_state(self, state: Mapping[str, Any]) -> None:
        """Restore what `state` returned."""
        if not state:
            self.moments = None
            return
        self.moments = AdamMoments(
            m={k: np.array(v, dtype=np.float32, copy=True) for k, v in state["m"].items()},
            v={k: np.array(v, dtype=np.float32, copy=True) for k, v in state["v"].items()},
            step=int(state["step"]),
        )
