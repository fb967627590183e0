"""FedDrop (papers/000): SyncDrop training with trajectory-weighted keep probabilities.

Clients hold and train the **full** model with SyncDrop after every dropout site (conv + ReLU
channels, hidden dense units and LSTM hidden units: the zoo model's neuron groups); savings are in
expected FLOPs, reported per client. The server averages with data weights (FedAvg, eq. 2), then
optimises next round's keep probabilities (eq. 7-8, Algorithm 1) in `fl.maths.feddrop`.

Modes (option ``mode``):

* ``"feddrop"``: keep probabilities start uniform with ``g(p) = 0`` and are optimised every round;
* ``"unidrop"``: the uniform keep probability throughout (no optimisation);
* ``"caldas"``: Federated Dropout (Caldas et al.) as the FedDrop paper compares it: per round and
  client a fixed random sub-model keeping ``ceil(p K)`` neurons of every dropout site, no scaling,
  trained by the plain trainer and averaged per weight over its holders.

Decisions: the mask thresholds of a local step come from ``numpy.random.default_rng((sync_seed,
step))`` with ``sync_seed`` drawn from ``(run seed, round)``, so every client of a round draws the
same ``t``; multiplying a conv's output by ``d / p`` before the ReLU equals doing it after (``d / p
>= 0``), so the mask is a forward hook on the conv / linear module. An LSTM's hidden units are
dropped for the whole sequence: ``h`` is scaled by ``d / p`` and ``c`` zeroed for dropped units at
every step (the recurrence is unrolled while training). Evaluation runs the dense model (no
dropout, as the paper evaluates). Modified He init (Theorem 1, option ``he_init``) re-initialises
the layers producing a dropout site with the initial uniform ``p``. Partial participation: the
budget constraint couples the clients of one round (eq. 5); clients keep their last ``p``.

Per-device budgets (option ``budgets``, fleetbench issue 8): a mapping client id -> ``r_c`` (e.g.
from `fl.plan`, ``fleetbench plan`` and ``fl run --plan``); clients missing from it use ``budget``. With it, every
sampled client's own expected FLOPs must stay within its own ``r_c`` (`fl.maths.feddrop.optimise_keep`
with a budget vector), UniDrop and Caldas give each client its own uniform ``p`` (``g_c = 0``), and
a client's first keep vector is its own uniform ``p``. Without it the paper's mean constraint holds.
Round metrics report ``flops_ratio`` (per client id: expected FLOPs of the keep probabilities it
holds after the round, over dense, in the constraint's FLOPs model), ``budget`` (per client id) and
``max_budget_excess`` (max over the round's clients of ratio minus budget; <= 0 up to rounding
whenever every client's constraint holds, positive when the mean constraint lets one exceed).

On a device the masks enter the step model as inputs (`fl.executors.devices`, onnx backend); that trains
correctly but saves no time without sparse kernels, so the reported FLOPs are *expected* (and
sampled) FLOPs, never measured time.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch import nn

from exporters.arch import Arch, SubModel, make_submodel, size_at_width
from exporters.userinput import InputError
from exporters.zoo import ZooModel
from fl.client import build_module, module_params, sgd_epochs, to_tensors
from fl.maths.aggregate import selective_average
from fl.maths.feddrop import (
    DEFAULT_MIN_KEEP,
    DEFAULT_MU,
    FlopsModel,
    budget_gap,
    channel_gram,
    client_gaps,
    flops_model,
    inverted_scales,
    keep_masks,
    make_psd,
    modified_he_init,
    neuron_vectors,
    optimise_keep,
    similarity,
    split_channels,
    sync_thresholds,
    uniform_keep,
)
from fl.records import ClientFailure, ClientSpec, Params, RoundMetrics, TrainIns, TrainRes
from fl.strategies.base import Profiles, Strategy
from fl.strategies.fedavg import parse_bool

MODES = ("feddrop", "unidrop", "caldas")

_CONVENTIONS = ("paper", "training")

_FLOPS_CACHE: dict[tuple[int, str], tuple[ZooModel, FlopsModel]] = {}


def cached_flops_model(model: ZooModel, convention: str) -> FlopsModel:
    """Return `fl.maths.feddrop.flops_model` of ``model``, computed once per model object."""
    key = (id(model), convention)
    if key not in _FLOPS_CACHE or _FLOPS_CACHE[key][0] is not model:
        _FLOPS_CACHE[key] = (model, flops_model(model, convention))
    return _FLOPS_CACHE[key][1]


def site_module(model: ZooModel, group: str) -> tuple[str, bool]:
    """Return the module path producing ``group`` and whether it is an LSTM (gate blocks).

    Raises
    ------
    InputError
        If no weight's first dimension is indexed by ``group``.
    """
    for name, layout in model.layouts.items():
        dim = layout[0] if layout else None
        if dim is not None and dim.group == group and "weight" in name.rsplit(".", 1)[-1]:
            prefix = name.rsplit(".", 1)[0]
            return prefix, dim.blocks == 4
    raise InputError(f"{model.name}: no layer produces group {group!r}")


def dense_sites(model: ZooModel, drop_dense: bool) -> np.ndarray:
    """Return, per group, whether it is a dropout site (hidden dense groups only if ``drop_dense``)."""
    sites = []
    for group in model.group_names:
        prefix, is_lstm = site_module(model, group)
        is_linear = not is_lstm and len(model.layouts[f"{prefix}.weight"]) == 2
        sites.append(drop_dense or not is_linear)
    return np.asarray(sites, dtype=bool)


def keep_lists(model: ZooModel, keep: Mapping[str, Any]) -> list[np.ndarray]:
    """Return the keep probabilities of every group in model order (missing groups: all ones).

    Parameters
    ----------
    model : ZooModel
    keep : mapping of str to sequence of float
        ``{group: one probability per neuron}`` (``TrainIns.config["keep"]``).

    Returns
    -------
    list of numpy.ndarray

    Raises
    ------
    InputError
        If a group's values are not its size or not in (0, 1].
    """
    out = []
    for group, size in model.groups:
        values = np.asarray(keep.get(group, np.ones(size)), dtype=np.float64).reshape(-1)
        if values.shape != (size,) or not np.all((values > 0) & (values <= 1)):
            raise InputError(f"{model.name}: keep probabilities of {group!r} must be {size} values in (0, 1]")
        out.append(values)
    return out


class _SyncDrop:
    """Holds the current per-group multipliers and applies them through hooks."""

    def __init__(self, module: nn.Module, model: ZooModel, active: Sequence[bool]) -> None:
        self.scales: list[torch.Tensor | None] = [None] * len(model.groups)
        self.handles: list[Any] = []
        for g, group in enumerate(model.group_names):
            if not active[g]:
                continue
            prefix, is_lstm = site_module(model, group)
            sub = module.get_submodule(prefix)
            if is_lstm:
                if not isinstance(sub, nn.LSTM) or sub.num_layers != 1 or not sub.batch_first or sub.bidirectional:
                    raise InputError(f"{model.name}: SyncDrop supports one-layer batch-first LSTMs only")
                sub.forward = self._lstm_forward(sub, g)  # type: ignore[method-assign]
            else:
                self.handles.append(sub.register_forward_hook(self._hook(g)))

    def _hook(self, g: int) -> Callable[..., torch.Tensor | None]:
        def hook(mod: nn.Module, inputs: Any, output: torch.Tensor) -> torch.Tensor | None:
            scale = self.scales[g]
            if scale is None or not mod.training:
                return None
            shape = (1, -1) + (1,) * (output.dim() - 2)  # channels on dim 1 (NCHW or (N, units))
            return output * scale.view(shape)

        return hook

    def _lstm_forward(self, lstm: nn.LSTM, g: int) -> Callable[..., Any]:
        dense = lstm.forward

        def forward(x: torch.Tensor, hx: Any = None) -> Any:
            scale = self.scales[g]
            if scale is None or not lstm.training or hx is not None:
                return dense(x, hx)
            kept = (scale > 0).to(x.dtype)
            names = ("weight_ih_l0", "weight_hh_l0", "bias_ih_l0", "bias_hh_l0")
            w_ih, w_hh, b_ih, b_hh = (lstm.get_parameter(n) for n in names)
            h = x.new_zeros(x.shape[0], lstm.hidden_size)
            c = x.new_zeros(x.shape[0], lstm.hidden_size)
            outs = []
            for t in range(x.shape[1]):
                gates = x[:, t] @ w_ih.T + b_ih + h @ w_hh.T + b_hh
                i, f, gg, o = gates.chunk(4, dim=1)
                c = (torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(gg)) * kept
                h = torch.sigmoid(o) * torch.tanh(c) * scale
                outs.append(h)
            return torch.stack(outs, dim=1), (h.unsqueeze(0), c.unsqueeze(0))

        return forward

    def set(self, scales: Sequence[np.ndarray]) -> None:
        """Use ``scales`` (one ``d / p`` array per group) for the next forward passes."""
        self.scales = [torch.as_tensor(s, dtype=torch.float32) for s in scales]

    def clear(self) -> None:
        """Stop dropping (dense forward)."""
        self.scales = [None] * len(self.scales)


def train_syncdrop(model: ZooModel, ins: TrainIns, x: np.ndarray, y: np.ndarray) -> tuple[Params, dict[str, float]]:
    """Train the full model with SyncDrop masks drawn per mini-batch (Section 3.3).

    Parameters
    ----------
    model : ZooModel
    ins : TrainIns
        Full-width sub-model. ``config`` keys: ``keep`` (``{group: K keep probabilities}``; missing
        groups keep everything), ``sync_seed`` (int, shared by the round's clients), ``scale``
        (bool, inverted scaling ``1/p``; default true), and `fl.client.train_plain`'s keys.
    x, y : numpy.ndarray
        The client's shard.

    Returns
    -------
    params : Params
    metrics : dict
        ``loss``, ``accuracy`` (last epoch), ``steps``; per example: ``expected_train_flops``
        (Appendix B with the mean keep probabilities), ``sampled_train_flops`` (with the drawn
        masks, averaged over the examples trained), ``dense_train_flops``; ``train_flops`` (sampled,
        summed over every example trained) and ``kept_fraction`` (mean over steps and channels).

    Raises
    ------
    InputError
        If the sub-model is not the full model or the keep probabilities are malformed.
    """
    cfg = ins.config
    if ins.submodel.arch != model.full_arch():
        raise InputError(f"{model.name}: SyncDrop trains the full model, got {ins.submodel.arch.key()}")
    keep = keep_lists(model, cfg.get("keep", {}))
    sync_seed = int(cfg.get("sync_seed", 0))
    scaled = bool(cfg.get("scale", True))
    seed = int(cfg.get("seed", 0))
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    module = build_module(model, ins.submodel.arch, ins.parameters)
    module.train()
    active = [bool(np.any(p < 1.0)) for p in keep]
    drop = _SyncDrop(module, model, active)
    train_flops = cached_flops_model(model, "training")
    expected = float(train_flops.flops(np.array([p.mean() for p in keep])))
    opt = torch.optim.SGD(
        module.parameters(),
        lr=float(cfg.get("lr", 0.05)),
        momentum=float(cfg.get("momentum", 0.0)),
        weight_decay=float(cfg.get("weight_decay", 0.0)),
    )
    xt, yt = to_tensors(model, x, y)
    sizes = model.group_sizes
    tally = {"sampled": 0.0, "kept": 0.0, "examples": 0.0}

    def draw_masks(step: int, idx: np.ndarray) -> None:
        masks = keep_masks(sync_thresholds(sync_seed, step, sizes), keep)
        drop.set(inverted_scales(masks, keep) if scaled else [m.astype(np.float64) for m in masks])
        tally["sampled"] += float(train_flops.flops(np.array([m.mean() for m in masks]))) * len(idx)
        tally["kept"] += float(np.concatenate(masks).mean())
        tally["examples"] += len(idx)

    fit = sgd_epochs(
        module, opt, xt, yt, int(cfg.get("epochs", 1)), int(cfg.get("batch_size", 20)), rng, before_step=draw_masks
    )
    drop.clear()
    return module_params(module), {
        **fit,
        "expected_train_flops": expected,
        "sampled_train_flops": tally["sampled"] / max(tally["examples"], 1.0),
        "dense_train_flops": train_flops.dense,
        "train_flops": tally["sampled"],
        "kept_fraction": tally["kept"] / max(fit["steps"], 1.0),
    }


def parse_budgets(value: Mapping[str, Any] | str | None) -> dict[str, float]:
    """Return per-client FLOPs budget ratios from a mapping or its JSON text.

    Parameters
    ----------
    value : mapping of str to float, str or None
        ``{client id: r_c}``, or the same as JSON (``'{"c0": 0.8, "c1": 0.4}'``); None or ``""``
        for none.

    Returns
    -------
    dict of str to float

    Raises
    ------
    InputError
        If the text is not a JSON object or a ratio is not a number in (0, 1].
    """
    if value is None or (isinstance(value, str) and not value.strip()):
        return {}
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as err:
            raise InputError(f"budgets {value!r} is not valid JSON: {err.msg}") from None
    if not isinstance(value, Mapping):
        raise InputError(f"budgets must map client ids to FLOPs budget ratios, got {value!r}")
    out: dict[str, float] = {}
    for cid, ratio in value.items():
        try:
            r = float(ratio)
        except (TypeError, ValueError):
            raise InputError(f"budget of client {cid!r} is not a number: {ratio!r}") from None
        if not 0.0 < r <= 1.0 or math.isnan(r):
            raise InputError(f"budget of client {cid!r} is {ratio!r}, outside (0, 1]")
        out[str(cid)] = r
    return out


class FedDrop(Strategy):
    """FedDrop, UniDrop and Caldas et al. (see the module docstring).

    Parameters
    ----------
    model, initial, seed, local
        As `fl.strategies.base.Strategy`.
    mode : str
        ``"feddrop"``, ``"unidrop"`` or ``"caldas"``.
    budget : float
        FLOPs budget ratio ``r`` in (0, 1] (eq. 5).
    mu : float
        Interior-point weight of eq. 8.
    iterations : int
        Most optimiser steps per round.
    tol : float
        Early-exit tolerance of the optimiser (relative objective decrease).
    min_keep : float
        Floor of optimised keep probabilities.
    he_init : bool
        Re-initialise the initial global parameters with the modified He init (Theorem 1).
    drop_dense : bool
        Whether hidden dense layers are dropout sites too (convs and LSTMs always are).
    budgets : mapping of str to float or str, optional
        Per-client FLOPs budget ratios (or their JSON text); clients missing use ``budget``. When
        given, every client's own FLOPs are constrained (module docstring).
    convention : str
        FLOPs model of the budget constraint: ``"paper"`` (eq. 10, default) or ``"training"``
        (forward plus backward FLOPs, closer to budgets derived from measured training latency).
    """

    name = "feddrop"

    def __init__(
        self,
        model: ZooModel,
        initial: Params,
        seed: int = 0,
        local: Mapping[str, Any] | None = None,
        *,
        mode: str = "feddrop",
        budget: float = 0.5,
        mu: float = DEFAULT_MU,
        iterations: int = 10_000,
        tol: float = 1e-10,
        min_keep: float = DEFAULT_MIN_KEEP,
        he_init: bool | str = True,
        drop_dense: bool | str = True,
        budgets: Mapping[str, Any] | str | None = None,
        convention: str = "paper",
    ) -> None:
        super().__init__(model, initial, seed, local)
        if mode not in MODES:
            raise InputError(f"unknown FedDrop mode {mode!r}; known: {', '.join(MODES)}")
        self.mode = mode
        self.budget = float(budget)
        self.mu = float(mu)
        self.iterations = int(iterations)
        self.tol = float(tol)
        self.min_keep = float(min_keep)
        if convention not in _CONVENTIONS:
            raise InputError(f"unknown FLOPs convention {convention!r}; known: {', '.join(_CONVENTIONS)}")
        self.budgets = parse_budgets(budgets)
        self.flops = cached_flops_model(model, convention)
        self.train_flops = cached_flops_model(model, "training")
        self.sites = dense_sites(model, parse_bool(drop_dense, "drop_dense"))
        site_list = [bool(s) for s in self.sites]
        self.initial_keep = uniform_keep(self.flops, self.budget, site_list)
        cids = sorted(self.budgets)
        roots = uniform_keep(self.flops, np.array([self.budgets[c] for c in cids]), site_list) if cids else np.zeros(0)
        self.client_initial_keep: dict[str, float] = {c: float(p) for c, p in zip(cids, roots, strict=True)}
        self.channel_free = np.repeat(self.sites, model.group_sizes)
        self.keep: dict[str, np.ndarray] = {}
        self._issued: dict[str, np.ndarray] = {}
        if parse_bool(he_init, "he_init") and mode != "caldas":
            per_group = {g: self.initial_keep for g, site in zip(model.group_names, self.sites, strict=True) if site}
            he_rng = np.random.default_rng((seed, 0x4E))
            self.global_state = modified_he_init(model, self.global_state, per_group, he_rng)

    # ---------------------------------------------------------------- keep probabilities
    def client_budget(self, cid: str) -> float:
        """Return client ``cid``'s FLOPs budget ratio (its entry of ``budgets``, else ``budget``)."""
        return self.budgets.get(cid, self.budget)

    def uniform_for(self, cid: str | None) -> float:
        """Return the uniform keep probability of client ``cid`` (its own ``g_c = 0`` root)."""
        return self.initial_keep if cid is None else self.client_initial_keep.get(cid, self.initial_keep)

    def start_keep(self, cid: str | None = None) -> np.ndarray:
        """Return the initial channel keep vector: the (client's) uniform ``p`` at every site, 1 elsewhere."""
        return np.where(self.channel_free, self.uniform_for(cid), 1.0)

    def client_keep(self, cid: str) -> np.ndarray:
        """Return the keep probabilities client ``cid`` trains with next (channels ``(N,)``)."""
        if self.mode == "feddrop" and cid in self.keep:
            return self.keep[cid].copy()
        return self.start_keep(cid)

    def sync_seed(self, rnd: int) -> int:
        """Return the SyncDrop seed shared by every client of round ``rnd``."""
        return int(np.random.default_rng((self.seed, rnd, 0x5D)).integers(2**31 - 1))

    # ---------------------------------------------------------------- round
    def configure_round(
        self, rnd: int, clients: Sequence[ClientSpec], profiles: Profiles | None = None
    ) -> dict[str, TrainIns]:
        """Send every client the full model and its keep probabilities (or a Caldas sub-model)."""
        out: dict[str, TrainIns] = {}
        self._issued = {}
        full = self.model.static(1.0)
        sync_seed = self.sync_seed(rnd)
        for client in clients:
            keep = self.client_keep(client.cid)
            self._issued[client.cid] = keep
            if self.mode == "caldas":
                config = self.client_config(rnd, client.cid, trainer="plain")
                submodel = self._random_submodel(int(config["seed"]), self.uniform_for(client.cid))
            else:
                groups = split_channels(keep, self.model.group_sizes)
                config = self.client_config(
                    rnd,
                    client.cid,
                    trainer="syncdrop",
                    sync_seed=sync_seed,
                    keep={g: [float(v) for v in k] for g, k in zip(self.model.group_names, groups, strict=True)},
                )
                submodel = full
            params = self.model.extract(self.global_state, submodel)
            out[client.cid] = TrainIns(client.cid, submodel, params, config)
        return out

    def _random_submodel(self, seed: int, keep: float) -> SubModel:
        rng = np.random.default_rng((seed, 0xCA))
        sizes = []
        indices: list[list[int]] = []
        for (_, size), site in zip(self.model.groups, self.sites, strict=True):
            kept = size_at_width(keep, size) if site else size
            sizes.append(kept)
            indices.append([int(i) for i in rng.choice(size, size=kept, replace=False)])
        return make_submodel(Arch(self.model.name, tuple(sizes)), self.model.group_sizes, indices)

    def aggregate_round(
        self, rnd: int, results: Sequence[TrainRes], failures: Sequence[ClientFailure]
    ) -> tuple[Params, RoundMetrics]:
        """FedAvg with data weights, then (``feddrop``) optimise next round's keep probabilities."""
        metrics: dict[str, float | dict[str, float]] = {
            "clients": float(len(results)),
            "failures": float(len(failures)),
        }
        if not results:
            return self.global_state, metrics
        counts = np.array([r.num_examples for r in results], dtype=np.float64)
        weights = counts / counts.sum()
        old = self.global_state
        if self.mode == "caldas":
            self.global_state = selective_average(
                self.model, old, [(r.submodel, r.parameters, float(r.num_examples)) for r in results]
            )
        else:
            self.global_state = {}
            for name, tensor in old.items():
                acc = np.zeros(tensor.shape, dtype=np.float64)
                for w, r in zip(weights, results, strict=True):
                    acc += w * np.asarray(r.parameters[name], dtype=np.float64)
                self.global_state[name] = acc.astype(np.float32)
        metrics.update(self._flops_metrics(results))
        if self.mode == "feddrop":
            metrics.update(self._optimise(rnd, results, weights, old))
        metrics.update(self._budget_metrics(results))
        return self.global_state, metrics

    def _budget_metrics(self, results: Sequence[TrainRes]) -> dict[str, float | dict[str, float]]:
        ratios: dict[str, float] = {}
        budgets: dict[str, float] = {}
        excess = -math.inf
        for r in results:
            if self.mode == "caldas":  # the sub-model it trained (next round's is drawn afresh)
                means = np.array(r.submodel.arch.sizes, dtype=np.float64) / np.array(self.model.group_sizes)
            else:
                means = self.flops.channel_means(self.client_keep(r.cid))
            ratio = float(self.flops.flops(means)) / self.flops.dense
            budget = self.client_budget(r.cid)
            ratios[r.cid] = ratio
            budgets[r.cid] = budget
            excess = max(excess, ratio - budget)
        return {"flops_ratio": ratios, "budget": budgets, "max_budget_excess": excess}

    def _flops_metrics(self, results: Sequence[TrainRes]) -> dict[str, float]:
        epochs = float(self.local.get("epochs", 1))
        expected = sampled = 0.0
        for r in results:
            if self.mode == "caldas":
                means = np.array(r.submodel.arch.sizes, dtype=np.float64) / np.array(self.model.group_sizes)
            else:
                means = self.flops.channel_means(self._issued.get(r.cid, self.start_keep(r.cid)))
            per_example = float(self.train_flops.flops(means))
            expected += per_example * r.num_examples * epochs
            sampled += float(r.metrics.get("train_flops", per_example * r.num_examples * epochs))
        return {
            "expected_train_flops": expected,
            "train_flops": sampled,
            "dense_train_flops": self.train_flops.dense * sum(r.num_examples for r in results) * epochs,
        }

    def _optimise(
        self, rnd: int, results: Sequence[TrainRes], weights: np.ndarray, old: Params
    ) -> dict[str, float]:
        deltas = []
        for group in self.model.group_names:
            base = neuron_vectors(self.model, old, group)
            deltas.append(np.stack([base - neuron_vectors(self.model, r.parameters, group) for r in results]))
        keep = np.stack([self._issued.get(r.cid, self.start_keep(r.cid)) for r in results])  # (C, N)
        s = make_psd(similarity(channel_gram(deltas), weights, keep))
        priority = np.random.default_rng((self.seed, rnd, 0x7A)).permutation(len(results))
        budget: float | np.ndarray = self.budget
        if self.budgets:  # every client its own constraint g_c
            budget = np.array([self.client_budget(r.cid) for r in results])
        found = optimise_keep(
            s,
            keep,
            self.flops,
            budget,
            mu=self.mu,
            iterations=self.iterations,
            tol=self.tol,
            min_keep=self.min_keep,
            free=self.channel_free,
            priority=priority,
        )
        for r, q in zip(results, found.keep, strict=True):
            self.keep[r.cid] = q
        gaps = client_gaps(self.flops, found.keep, budget)
        return {
            "objective_start": float(found.objective[0]),
            "objective_end": float(found.objective[-1]),
            "optimiser_iterations": float(found.iterations),
            "budget_gap": float(gaps.min()) if self.budgets else budget_gap(self.flops, found.keep, self.budget),
            "mean_keep": float(found.keep[:, self.channel_free].mean()) if self.channel_free.any() else 1.0,
        }

    def eval_submodels(self, clients: Sequence[ClientSpec]) -> dict[float, SubModel]:
        """Evaluate the dense global model only (no dropout at inference)."""
        return {1.0: self.model.static(1.0)}

    # ---------------------------------------------------------------- checkpoint
    def state(self) -> dict[str, Any]:
        """Return the global parameters and every client's keep probabilities."""
        cids = sorted(self.keep)
        n = int(sum(self.model.group_sizes))
        keep = np.stack([self.keep[c] for c in cids]) if cids else np.zeros((0, n))
        return {"global": self.global_state, "keep_clients": cids, "keep": keep}

    def load_state(self, state: Mapping[str, Any]) -> None:
        """Restore what `state` returned."""
        super().load_state(state)
        cids = [str(c) for c in state.get("keep_clients", [])]
        keep = np.asarray(state.get("keep", np.zeros((0, 0))), dtype=np.float64)
        if len(cids) != len(keep):
            raise InputError(f"FedDrop state: {len(cids)} clients but {len(keep)} keep vectors")
        self.keep = {c: keep[i].copy() for i, c in enumerate(cids)}

