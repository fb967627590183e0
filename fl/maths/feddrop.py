"""FedDrop maths: SyncDrop masks, the FLOPs model, modified He init and keep-probability optimisation.

Pure functions over numpy arrays (the paper: FedDrop, papers/000, Sections 3.3-3.6, Appendices B-D).

Neuron groups and channels
    The dropout sites are neuron groups of the zoo model (every conv's output channels, hidden dense
    units, LSTM hidden units). Keep probabilities of one client are one vector over all *channels*:
    the groups' neurons concatenated in group order (``N = sum K_g``).

FLOPs model (Appendix B, eq. 10)
    A `FlopsModel` is a sum of terms ``coefficient * prod_g mean(p^g) ** exponent_g``: eq. 10's
    ``2 C^l mean(p^l) (K^2 C^(l-1) mean(p^(l-1)) + 1) H W`` is one term for the product (exponent 1 on
    the output and the input group) and one for the ``+1`` (output group only); a dense input or
    classifier output has no group (``p = 1``). `flops_model` derives the terms from
    `exporters.flops.count` of the full model: ``convention="paper"`` is eq. 10 exactly
    (``2 * (MACs + output elements)``; pools and activations are not counted), ``"training"`` the
    forward-plus-backward FLOPs of `exporters.flops` split the same way (for reported training cost).
    For an LSTM the input product scales with the hidden group's mean, the recurrent product with
    its square. Expected FLOPs use mean keep probabilities; the product of two *different* groups'
    kept fractions has exactly that expectation (independent thresholds), the LSTM's squared term
    is biased by the variance of the kept fraction (small for 256 units).

Budget (eq. 5)
    ``g(p) = r - mean_c flops(p_c) / flops(dense)``; the initial uniform keep probability solves
    ``g = 0`` in closed form (a quadratic in ``p``).

Per-device budgets (our extension, fleetbench issue 8)
    Hardware budgets are per device, so the budget may also be a vector ``r_c`` (one per client of
    the round): one constraint per client ``g_c(q) = r_c - flops(q_c) / flops(dense) >= 0`` and the
    barrier ``-mu sum_c log g_c``; the uniform start is each client's own closed-form root. A client
    with ``r_c >= 1`` has no barrier term: ``q <= 1`` already implies ``g_c >= 0``, so its keep
    probabilities may reach 1 (a barrier would keep them strictly below).

Optimisation (eq. 7-8)
    ``min_q sum_{n,i,j} S_ij^n / max(q_i^n, q_j^n) - mu log g(q)``. The first sum equals
    ``sum_{n,i} U_i^n / q_i^n`` where ``U_i^n = S_ii^n + 2 sum_{j ranked after i} S_ij^n`` depends
    only on the *order* of the ``q^n``, so the gradient is ``-U / q^2``.
    Each channel's client ranking is cached; after a step, ``U`` is recomputed (O(C^2), vectorised
    over channels) only for the channels whose ranking changed, found by an O(N C) check.
    Ties are broken by a priority (the pair is charged to one of the tied clients: the same value).

    The paper keeps ``mu = 1e-4`` fixed without stating the scale of ``S``, which is tiny (products of
    parameter updates times ``lambda^2``): the barrier would then dominate and push every ``q`` to its
    floor. `optimise_keep` therefore divides ``S`` by its total trace first, which leaves the
    constrained optimum unchanged and makes ``mu`` relative to the objective (our choice).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import overload

import numpy as np

from exporters.arch import Dim
from exporters.flops import count
from exporters.userinput import InputError
from exporters.zoo import ZooModel

#: Interior-point weight of eq. 8 (the paper keeps it at 1e-4).
DEFAULT_MU = 1e-4

#: Lowest keep probability the optimiser may assign (keeps ``1/p`` scaling finite).
DEFAULT_MIN_KEEP = 1e-3

_FLOPS_CONVENTIONS = ("paper", "training")

#: Step-size growth after an accepted step (halved on every rejected trial).
GROWTH = 1.1

#: Per-client gaps below this are moved off the budget boundary before optimising (vector budgets).
BOUNDARY_GAP = 1e-9


# --------------------------------------------------------------------------- FLOPs model


@dataclass(frozen=True)
class FlopsModel:
    """Per-example FLOPs as a polynomial in the mean keep probability of every neuron group.

    Attributes
    ----------
    group_sizes : tuple of int
        Full size ``K_g`` of every neuron group, in the model's group order.
    coefficients : numpy.ndarray
        ``(T,)`` FLOPs of every term at full width.
    exponents : numpy.ndarray
        ``(T, G)`` integer exponent of every group's mean keep probability in every term.

    """

    group_sizes: tuple[int, ...]
    coefficients: np.ndarray
    exponents: np.ndarray

    @property
    def dense(self) -> float:
        """FLOPs of the dense model (every keep probability 1)."""
        return float(self.coefficients.sum())

    def flops(self, means: np.ndarray) -> np.ndarray:
        """Return the FLOPs for mean keep probabilities ``means`` of shape ``(..., G)``."""
        means = np.asarray(means, dtype=np.float64)
        powers = means[..., None, :] ** self.exponents  # (..., T, G)
        return np.asarray(powers.prod(axis=-1) @ self.coefficients)

    def gradient(self, means: np.ndarray) -> np.ndarray:
        """Return ``d flops / d mean_g`` for ``means`` of shape ``(..., G)``; same shape."""
        means = np.asarray(means, dtype=np.float64)
        if np.all(means > 0):
            terms = (means[..., None, :] ** self.exponents).prod(axis=-1) * self.coefficients  # (..., T)
            return np.asarray(terms @ self.exponents) / means
        out = np.zeros(means.shape, dtype=np.float64)
        for g in range(means.shape[-1]):
            e = self.exponents[:, g]
            if not e.any():
                continue
            reduced = self.exponents.copy()
            reduced[:, g] = np.maximum(e - 1, 0)
            powers = (means[..., None, :] ** reduced).prod(axis=-1)  # (..., T)
            out[..., g] = powers @ (self.coefficients * e)
        return out

    def channel_means(self, keep: np.ndarray) -> np.ndarray:
        """Return per-group means of channel keep probabilities ``keep`` ``(..., N)`` as ``(..., G)``."""
        return group_means(keep, self.group_sizes)


def group_means(values: np.ndarray, sizes: Sequence[int]) -> np.ndarray:
    """Average the last axis of ``values`` (channels, groups concatenated) per group.

    Parameters
    ----------
    values : numpy.ndarray
        ``(..., N)`` with ``N = sum(sizes)``.
    sizes : sequence of int
        Channels per group.

    Returns
    -------
    numpy.ndarray
        ``(..., G)``.

    """
    values = np.asarray(values, dtype=np.float64)
    if values.shape[-1] != sum(sizes):
        raise InputError(f"expected {sum(sizes)} channels, got {values.shape[-1]}")
    offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.intp)
    return np.add.reduceat(values, offsets, axis=-1) / np.asarray(sizes, dtype=np.float64)


def _output_group(model: ZooModel, name: str) -> Dim | None:
    layout = model.layouts.get(name)
    if layout is None:
        raise InputError(f"{model.name}: no layout for parameter {name!r}")
    return layout[0]


def flops_model(model: ZooModel, convention: str = "paper") -> FlopsModel:
    """Return the FLOPs of ``model`` as a polynomial in its groups' mean keep probabilities.

    Parameters
    ----------
    model : ZooModel
        Its conv, linear and LSTM layers are counted (`exporters.flops.count` at full width).
    convention : str
        ``"paper"``: Appendix B eq. 10, ``2 * (MACs + output elements)`` per layer, nothing else;
        ``"training"``: forward plus backward FLOPs of `exporters.flops` for those layers.

    Returns
    -------
    FlopsModel

    Raises
    ------
    InputError
        For an unknown convention or a layer whose groups cannot be found.

    """
    if convention not in _FLOPS_CONVENTIONS:
        raise InputError(f"unknown FLOPs convention {convention!r}; known: {', '.join(_FLOPS_CONVENTIONS)}")
    order = {g: i for i, g in enumerate(model.group_names)}
    module = model.build()
    shapes = {name: tuple(p.shape) for name, p in module.named_parameters()}
    coefficients: list[float] = []
    exponents: list[np.ndarray] = []

    def add(coefficient: float, groups: Sequence[Dim | None]) -> None:
        e = np.zeros(len(order), dtype=np.int64)
        for dim in groups:
            if dim is not None:
                e[order[dim.group]] += 1
        coefficients.append(float(coefficient))
        exponents.append(e)

    for layer in count(model, model.full_arch()).layers:
        if layer.kind in ("conv", "linear"):
            layout = model.layouts[f"{layer.name}.weight"]
            out_dim, in_dim = layout[0], layout[1]
            outputs = layer.flops - 2 * layer.macs  # one bias add per output element
            if convention == "paper":
                matmul, rest = 2.0 * layer.macs, 2.0 * outputs  # eq. 10
            else:
                matmul, rest = float(layer.train_flops - 2 * outputs), 2.0 * outputs
            add(matmul, (out_dim, in_dim))
            add(rest, (out_dim,))
        elif layer.kind == "lstm":
            gates = _output_group(model, f"{layer.name}.weight_ih_l0")
            in_dim = model.layouts[f"{layer.name}.weight_ih_l0"][1]
            four_h, inputs = shapes[f"{layer.name}.weight_ih_l0"]
            hidden = four_h // 4
            ih_share = inputs / (inputs + hidden)  # 4H*I of the 4H(I+H) MACs per step
            outputs = layer.flops - 2 * layer.macs  # biases and cell elementwise
            if convention == "paper":
                matmul, rest = 2.0 * layer.macs, float(outputs)
            else:
                matmul, rest = float(layer.train_flops - 2 * outputs), 2.0 * outputs
            add(matmul * ih_share, (gates, in_dim))
            add(matmul * (1 - ih_share), (gates, gates))  # recurrent H x H product
            add(rest, (gates,))
    if not coefficients:
        raise InputError(f"{model.name}: no conv, linear or LSTM layer to count")
    return FlopsModel(model.group_sizes, np.asarray(coefficients), np.stack(exponents))


def client_gaps(flops: FlopsModel, keep: np.ndarray, budgets: float | np.ndarray) -> np.ndarray:
    """Return every client's own gap ``g_c(p) = r_c - flops(p_c) / flops(dense)``.

    Parameters
    ----------
    flops : FlopsModel
    keep : numpy.ndarray
        ``(C, N)`` keep probabilities of the round's clients.
    budgets : float or numpy.ndarray
        One FLOPs budget ratio for all clients or ``(C,)``, one per client.

    Returns
    -------
    numpy.ndarray
        ``(C,)``.

    """
    means = flops.channel_means(np.atleast_2d(keep))
    return np.asarray(budgets, dtype=np.float64) - flops.flops(means) / flops.dense


@overload
def budget_gap(flops: FlopsModel, keep: np.ndarray, budget: float) -> float: ...


@overload
def budget_gap(flops: FlopsModel, keep: np.ndarray, budget: np.ndarray) -> np.ndarray: ...


def budget_gap(flops: FlopsModel, keep: np.ndarray, budget: float | np.ndarray) -> float | np.ndarray:
    """Return ``g(p) = r - mean_c flops(p_c) / flops(dense)`` (eq. 5), or per-client gaps.

    Parameters
    ----------
    flops : FlopsModel
    keep : numpy.ndarray
        ``(C, N)`` keep probabilities of the round's clients.
    budget : float or numpy.ndarray
        FLOPs budget ratio ``r`` in (0, 1] (the paper's mean constraint), or ``(C,)`` per-client
        ratios ``r_c``.

    Returns
    -------
    float or numpy.ndarray
        ``g`` for a scalar budget; `client_gaps` ``(C,)`` for a vector.

    """
    if np.ndim(budget) == 0:
        means = flops.channel_means(np.atleast_2d(keep))
        return float(float(budget) - flops.flops(means).mean() / flops.dense)
    return client_gaps(flops, keep, np.asarray(budget, dtype=np.float64))


def _check_budgets(budgets: np.ndarray) -> None:
    bad = ~((budgets > 0.0) & (budgets <= 1.0))  # NaN is bad too
    if bad.any():
        raise InputError(f"FLOPs budget ratio {budgets[bad][0]!r} is outside (0, 1]")


@overload
def uniform_keep(flops: FlopsModel, budget: float, sites: Sequence[bool] | None = None) -> float: ...


@overload
def uniform_keep(flops: FlopsModel, budget: np.ndarray, sites: Sequence[bool] | None = None) -> np.ndarray: ...


def uniform_keep(
    flops: FlopsModel, budget: float | np.ndarray, sites: Sequence[bool] | None = None
) -> float | np.ndarray:
    """Return the uniform keep probability ``p`` with ``g(p) = 0`` (Section 3.5), in closed form.

    Parameters
    ----------
    flops : FlopsModel
    budget : float or numpy.ndarray
        FLOPs budget ratio ``r`` in (0, 1], or ``(C,)`` per-client ratios: each client then gets its
        own root of ``g_c(p) = 0``.
    sites : sequence of bool, optional
        Per group, whether it is a dropout site (others stay at ``p = 1``); all by default.

    Returns
    -------
    float or numpy.ndarray
        ``p`` in (0, 1]: the positive root of ``A p^2 + B p + C = r flops(dense)`` (``(C,)`` roots
        for a vector budget).

    Raises
    ------
    InputError
        If a budget is outside (0, 1], a budget is below the FLOPs no dropout removes, or a term is
        of degree above 2 in ``p``.

    """
    scalar = np.ndim(budget) == 0
    r = np.atleast_1d(np.asarray(budget, dtype=np.float64))
    if r.ndim != 1:
        raise InputError(f"FLOPs budget must be a number or a vector, got shape {np.shape(budget)}")
    _check_budgets(r)
    mask = np.ones(len(flops.group_sizes), dtype=bool) if sites is None else np.asarray(sites, dtype=bool)
    degree = flops.exponents[:, mask].sum(axis=1)
    if degree.max(initial=0) > 2:
        raise InputError("FLOPs model has a term of degree > 2 in the keep probability")
    a, b, c = (float(flops.coefficients[degree == d].sum()) for d in (2, 1, 0))
    target = r * flops.dense
    low = target <= c
    if low.any():
        share = c / flops.dense
        raise InputError(f"FLOPs budget ratio {float(r[low][0])} is below the undroppable share {share:.4f}")
    if a == 0.0:
        p = (target - c) / b
    else:
        p = (-b + np.sqrt(b * b - 4.0 * a * (c - target))) / (2.0 * a)
    p = np.minimum(1.0, p)
    return float(p[0]) if scalar else p


# --------------------------------------------------------------------------- SyncDrop


def sync_thresholds(sync_seed: int, step: int, sizes: Sequence[int]) -> list[np.ndarray]:
    """Return the shared thresholds ``t ~ U(0, 1)`` of one mini-batch, one array per group.

    Every client draws the same values for the same ``(sync_seed, step)`` (Section 3.3).

    Parameters
    ----------
    sync_seed : int
        Seed shared by all clients of a round.
    step : int
        Local mini-batch number (0-based).
    sizes : sequence of int
        Neurons per group.

    Returns
    -------
    list of numpy.ndarray

    """
    rng = np.random.default_rng((int(sync_seed), int(step)))
    return [rng.random(k) for k in sizes]


def keep_masks(thresholds: Sequence[np.ndarray], keep: Sequence[np.ndarray]) -> list[np.ndarray]:
    """Return the dropout decisions ``d = 1[t < p]`` (eq. 3) per group as bool arrays."""
    return [np.asarray(t) < np.asarray(p) for t, p in zip(thresholds, keep, strict=True)]


def inverted_scales(masks: Sequence[np.ndarray], keep: Sequence[np.ndarray]) -> list[np.ndarray]:
    """Return the per-channel multipliers ``d / p`` (eq. 3: kept channels scaled by ``1/p``)."""
    return [np.where(d, 1.0 / np.asarray(p, dtype=np.float64), 0.0) for d, p in zip(masks, keep, strict=True)]


def split_channels(values: np.ndarray, sizes: Sequence[int]) -> list[np.ndarray]:
    """Split the last axis of ``values`` (all channels) into one array per group."""
    return np.split(np.asarray(values), np.cumsum(sizes)[:-1], axis=-1)


# --------------------------------------------------------------------------- initialisation


def producing_parameters(model: ZooModel, group: str) -> list[str]:
    """Return the parameters whose first dimension is indexed by ``group`` (a neuron's own weights)."""
    out = []
    for name, layout in model.layouts.items():
        if layout and isinstance(layout[0], Dim) and layout[0].group == group:
            out.append(name)
    return out


def modified_he_init(
    model: ZooModel, params: Mapping[str, np.ndarray], keep: Mapping[str, float], rng: np.random.Generator
) -> dict[str, np.ndarray]:
    """Re-initialise the layers followed by dropout with variance ``2p/N`` (Theorem 1).

    Parameters
    ----------
    model : ZooModel
    params : mapping of str to numpy.ndarray
        Full-width parameters; returned unchanged except the re-initialised layers.
    keep : mapping of str to float
        Keep probability ``p`` per dropout group; the conv / linear layer producing the group gets
        weights ``N(0, 2p/N)`` with ``N`` its fan-in (``C_in k_h k_w`` or ``in_features``) and zero
        bias (Assumption 1). LSTM groups (gate blocks, tanh units) are left as they are.
    rng : numpy.random.Generator

    Returns
    -------
    dict of str to numpy.ndarray

    """
    out = {k: np.array(v, dtype=np.float32, copy=True) for k, v in params.items()}
    for group, p in keep.items():
        for name in producing_parameters(model, group):
            dim = model.layouts[name][0]
            if not name.endswith(".weight") or dim is None or dim.blocks != 1:
                continue
            shape = out[name].shape
            fan_in = int(np.prod(shape[1:]))
            out[name] = rng.normal(0.0, math.sqrt(2.0 * p / fan_in), size=shape).astype(np.float32)
            bias = name[: -len("weight")] + "bias"
            if bias in out:
                out[bias] = np.zeros_like(out[bias])
    return out


# --------------------------------------------------------------------------- similarity


def neuron_vectors(model: ZooModel, params: Mapping[str, np.ndarray], group: str) -> np.ndarray:
    """Return every neuron's own parameters of ``group`` as rows ``(K, F)``.

    A neuron owns the slices of every parameter whose first dimension its group indexes (a conv's
    filter and bias; an LSTM unit's four gate rows of both weight matrices and both biases).
    """
    size = dict(model.groups)[group]
    parts = []
    for name in producing_parameters(model, group):
        dim = model.layouts[name][0]
        assert dim is not None
        tensor = np.asarray(params[name])
        blocks = tensor.reshape(dim.blocks, size, dim.inner, -1)  # (blocks, K, inner, rest)
        parts.append(blocks.transpose(1, 0, 2, 3).reshape(size, -1))
    return np.concatenate(parts, axis=1)


def channel_gram(deltas: Sequence[np.ndarray]) -> np.ndarray:
    """Return ``<delta_i^n, delta_j^n>`` for every channel and client pair.

    Parameters
    ----------
    deltas : sequence of numpy.ndarray
        Per group, the clients' neuron updates ``(C, K_g, F_g)``.

    Returns
    -------
    numpy.ndarray
        ``(N, C, C)``, channels of all groups concatenated.

    """
    return np.concatenate([np.einsum("ikf,jkf->kij", d, d, optimize=True) for d in deltas], axis=0)


def similarity(gram: np.ndarray, weights: np.ndarray, keep: np.ndarray) -> np.ndarray:
    """Return ``S_ij^n = lambda_i lambda_j max(p_i^n, p_j^n) <delta_i^n, delta_j^n>`` (Theorem 2).

    Parameters
    ----------
    gram : numpy.ndarray
        ``(N, C, C)`` from `channel_gram`.
    weights : numpy.ndarray
        ``(C,)`` client data weights ``lambda``.
    keep : numpy.ndarray
        ``(C, N)`` the keep probabilities the clients trained with.

    Returns
    -------
    numpy.ndarray
        ``(N, C, C)``.

    """
    lam = np.asarray(weights, dtype=np.float64)
    p = np.asarray(keep, dtype=np.float64).T  # (N, C)
    return np.asarray(gram, dtype=np.float64) * lam[None, :, None] * lam[None, None, :] * np.maximum(
        p[:, :, None], p[:, None, :]
    )


def make_psd(s: np.ndarray) -> np.ndarray:
    """Shift every ``S^n`` by its minimum eigenvalue when that is negative (``S - lambda_min I``)."""
    s = np.asarray(s, dtype=np.float64)
    s = (s + s.transpose(0, 2, 1)) / 2.0
    lowest = np.linalg.eigvalsh(s)[:, 0]
    shift = np.minimum(lowest, 0.0)
    return s - shift[:, None, None] * np.eye(s.shape[1])[None]


# --------------------------------------------------------------------------- optimisation


@dataclass(frozen=True)
class KeepOptimum:
    """Result of `optimise_keep`.

    Attributes
    ----------
    keep : numpy.ndarray
        ``(C, N)`` optimised keep probabilities ``q``.
    objective : numpy.ndarray
        Eq. 8 (eq. 7 term plus barrier) at the start and after every accepted step.
    gap : numpy.ndarray
        ``g(q)`` at the same points (all > 0); ``(points, C)`` per-client gaps ``g_c`` for a vector
        budget (> 0 for every client with ``r_c < 1``).
    iterations : int
        Accepted gradient steps.
    converged : bool
        Whether it stopped early on convergence.

    """

    keep: np.ndarray
    objective: np.ndarray
    gap: np.ndarray
    iterations: int
    converged: bool


def rank_keys(q: np.ndarray, priority: np.ndarray) -> np.ndarray:
    """Return sort keys ranking clients by ``q`` descending, exact ties by ``priority`` ascending.

    Parameters
    ----------
    q : numpy.ndarray
        ``(N, C)`` keep probabilities (channel-major), in ``(0, 1]``.
    priority : numpy.ndarray
        ``(C,)`` distinct integers in ``[0, C)`` breaking ties.

    Returns
    -------
    numpy.ndarray
        ``(N, C)`` float64, smaller = ranked first. The tie offset (``1e-13`` per priority step) only
        reorders values closer than ``1e-13 C``, whose pair terms then differ by that much.

    """
    return -np.asarray(q, dtype=np.float64) + 1e-13 * np.asarray(priority, dtype=np.float64)


def pair_weights(s: np.ndarray, keys: np.ndarray) -> np.ndarray:
    """Return ``U_i^n`` with ``sum_ij S_ij^n / max(q_i^n, q_j^n) = sum_i U_i^n / q_i^n``.

    ``U_i = S_ii + 2 sum_{j ranked after i} S_ij``: the pair ``(i, j)`` is divided by the larger
    ``q``, i.e. charged to the client ranked first (either one when they tie: the same value).

    Parameters
    ----------
    s : numpy.ndarray
        ``(N, C, C)`` symmetric (float32 is fastest).
    keys : numpy.ndarray
        ``(N, C)`` from `rank_keys`.

    Returns
    -------
    numpy.ndarray
        ``(N, C)`` float64.

    """
    first = (keys[:, :, None] < keys[:, None, :]).view(np.int8).astype(s.dtype)  # (N, C, C): i before j
    return 2.0 * np.einsum("nij,nij->ni", s, first).astype(np.float64) + np.einsum("nii->ni", s)


class _Objective:
    """Eq. 8 on channel-major ``q`` ``(N, C)``, with ``U`` recomputed for re-ordered channels only.

    ``budget`` is the paper's scalar ``r`` (gap: one float) or per-client ``r_c`` ``(C,)`` (gap: the
    ``(C,)`` vector ``g_c``; clients with ``r_c >= 1`` carry no barrier term).
    """

    def __init__(
        self,
        s: np.ndarray,
        flops: FlopsModel,
        budget: float | np.ndarray,
        mu: float,
        q: np.ndarray,
        priority: np.ndarray,
    ) -> None:
        self.s = s.astype(np.float32)
        self.flops = flops
        self.per_client = np.ndim(budget) == 1
        self.budget: float | np.ndarray = np.asarray(budget, dtype=np.float64) if self.per_client else float(budget)
        self.constrained = np.asarray(self.budget < 1.0) if self.per_client else np.ones(1, dtype=bool)
        self.mu = mu
        self.priority = priority
        self.sizes = np.asarray(flops.group_sizes)
        self.offsets = np.concatenate([[0], np.cumsum(self.sizes)[:-1]]).astype(np.intp)
        self.clients = q.shape[1]
        self.base = (np.arange(q.shape[0]) * q.shape[1])[:, None]
        keys = rank_keys(q, priority)
        self.u = pair_weights(self.s, keys)
        self.order = self.base + np.argsort(keys, axis=1)  # flat indices into q, ranked

    def refresh(self, q: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Recompute ``U`` of the channels whose ranking changed; return what `undo` needs."""
        ranked = q.ravel()[self.order]  # descending while the cached ranking holds
        rows = np.flatnonzero((ranked[:, 1:] > ranked[:, :-1]).any(axis=1))
        saved = (rows, self.u[rows], self.order[rows])
        if rows.size:
            keys = rank_keys(q[rows], self.priority)
            self.u[rows] = pair_weights(self.s[rows], keys)
            self.order[rows] = self.base[rows] + np.argsort(keys, axis=1)
        return saved

    def undo(self, saved: tuple[np.ndarray, np.ndarray, np.ndarray]) -> None:
        """Restore the cache as it was before a `refresh`."""
        rows, u, order = saved
        self.u[rows], self.order[rows] = u, order

    def means(self, q: np.ndarray) -> np.ndarray:
        return np.add.reduceat(q, self.offsets, axis=0) / self.sizes[:, None]  # (G, C)

    def client_gaps(self, q: np.ndarray) -> np.ndarray:
        """Return ``r_c - flops(q_c) / flops(dense)`` ``(C,)`` (scalar ``r`` broadcast)."""
        return np.asarray(self.budget - self.flops.flops(self.means(q).T) / self.flops.dense)

    def gap(self, q: np.ndarray) -> float | np.ndarray:
        if self.per_client:
            return self.client_gaps(q)
        return float(self.budget - self.flops.flops(self.means(q).T).mean() / self.flops.dense)

    def feasible(self, gap: float | np.ndarray) -> bool:
        if self.per_client:
            return bool(np.all(np.asarray(gap)[self.constrained] > 0))
        return bool(gap > 0)

    def value(self, q: np.ndarray, gap: float | np.ndarray) -> float:
        if self.per_client:
            barrier = float(np.log(np.asarray(gap)[self.constrained]).sum())
            return float((self.u / q).sum() - self.mu * barrier)
        return float((self.u / q).sum() - self.mu * math.log(float(gap)))

    def gradient(self, q: np.ndarray, gap: float | np.ndarray) -> np.ndarray:
        dflops = self.flops.gradient(self.means(q).T)  # (C, G)
        if self.per_client:
            # d(-mu sum_c log g_c)/dq_c = (mu / g_c) * dflops_c/dmean_g / (K_g flops(dense)); 0 if unconstrained
            weight = np.where(self.constrained, self.mu / np.where(self.constrained, gap, 1.0), 0.0) / self.flops.dense
            barrier = weight[None, :] * dflops.T / self.sizes[:, None]  # (G, C)
        else:
            # d(-mu log g)/dq = (mu / g) * dflops/dmean_g / (K_g C flops(dense)): one value per group
            barrier = (self.mu / (float(gap) * self.clients * self.flops.dense)) * dflops.T / self.sizes[:, None]
        return np.repeat(barrier, self.sizes, axis=0) - self.u / (q * q)


def _scale_into_budgets(obj: _Objective, q: np.ndarray, movable: np.ndarray, min_keep: float) -> np.ndarray:
    """Scale every infeasible client's movable ``q`` down until its own ``g_c > 0`` (vectorised bisection).

    The factor ``s_c`` with ``g_c = 0`` is bracketed by bisection (``flops`` grows with ``s``), then
    ``0.999 s_c`` is taken for a strict margin, as the scalar path's ``0.999`` steps do. A gap below
    `BOUNDARY_GAP` counts as on the boundary (a closed-form root leaves ``g_c`` of rounding size,
    whose barrier gradient would shrink the first steps by about ``1e12``).
    """
    bad = obj.constrained & ~(obj.client_gaps(q) > BOUNDARY_GAP)
    if not bad.any():
        return q

    def scaled(factor: np.ndarray) -> np.ndarray:
        return np.where(movable[:, None], np.maximum(q * factor[None, :], min_keep), q)

    lo, hi = np.zeros(q.shape[1]), np.ones(q.shape[1])
    floor_gaps = obj.client_gaps(scaled(lo))
    if not np.all(floor_gaps[bad] > 0):
        worst = int(np.flatnonzero(bad & ~(floor_gaps > 0))[0])
        budgets = np.broadcast_to(np.asarray(obj.budget), (q.shape[1],))
        raise InputError(f"no strictly feasible keep probabilities for client {worst}'s budget {budgets[worst]}")
    for _ in range(60):
        mid = (lo + hi) / 2.0
        ok = obj.client_gaps(scaled(mid)) > 0
        lo, hi = np.where(ok, mid, lo), np.where(ok, hi, mid)
    return scaled(np.where(bad, 0.999 * lo, 1.0))


def optimise_keep(
    s: np.ndarray,
    start: np.ndarray,
    flops: FlopsModel,
    budget: float | np.ndarray,
    *,
    mu: float = DEFAULT_MU,
    iterations: int = 10_000,
    tol: float = 1e-10,
    patience: int = 20,
    min_keep: float = DEFAULT_MIN_KEEP,
    free: np.ndarray | None = None,
    priority: np.ndarray | None = None,
) -> KeepOptimum:
    """Minimise eq. 8 by projected gradient descent with a backtracking step (Algorithm 1, line 13).

    Parameters
    ----------
    s : numpy.ndarray
        ``(N, C, C)`` positive semi-definite similarity (see `make_psd`); normalised to unit total
        trace here (module docstring).
    start : numpy.ndarray
        ``(C, N)`` starting keep probabilities; scaled down until strictly feasible (``g > 0``;
        per client for a vector budget, each infeasible client by its own factor).
    flops : FlopsModel
    budget : float or numpy.ndarray
        FLOPs budget ratio ``r`` (eq. 5, the clients' mean FLOPs), or ``(C,)`` per-client ratios
        ``r_c`` in (0, 1] (every client's own FLOPs; see the module docstring).
    mu : float
        Barrier weight.
    iterations : int
        Most accepted steps.
    tol : float
        Stop when the relative objective decrease stays below ``tol`` for ``patience`` steps.
    patience : int
    min_keep : float
        Floor of ``q`` (``q`` stays in ``[min_keep, 1]``).
    free : numpy.ndarray, optional
        ``(N,)`` bool, channels that may move (others keep their start value); all by default.
    priority : numpy.ndarray, optional
        ``(C,)`` distinct integers: among clients with equal ``q`` (all of them at the start) the
        pair term is charged to the lowest priority value (a subgradient choice; the objective is
        the same). Client order by default; the strategy passes a per-round permutation.

    Returns
    -------
    KeepOptimum
        Every recorded point is feasible and the objective never increases (Armijo condition).
        For a vector budget ``gap`` is ``(points, C)``.

    Raises
    ------
    InputError
        If the shapes disagree, a per-client budget is outside (0, 1] or no strictly feasible start
        exists.

    """
    s = np.asarray(s, dtype=np.float64)
    q = np.clip(np.asarray(start, dtype=np.float64).T.copy(), min_keep, 1.0)  # (N, C)
    if s.shape != (q.shape[0], q.shape[1], q.shape[1]):
        raise InputError(f"similarity shape {s.shape} does not fit keep probabilities {start.shape}")
    movable = np.ones(q.shape[0], dtype=bool) if free is None else np.asarray(free, dtype=bool)
    pinned = not movable.all()
    trace = float(np.einsum("nii->", s))
    if trace > 0:
        s = s / trace
    ranks = np.arange(q.shape[1]) if priority is None else np.asarray(priority, dtype=np.int64)
    if np.ndim(budget) == 1:
        budget = np.asarray(budget, dtype=np.float64)
        if budget.shape != (q.shape[1],):
            raise InputError(f"per-client budgets of shape {budget.shape} do not fit {q.shape[1]} clients")
        _check_budgets(budget)
    elif np.ndim(budget) != 0:
        raise InputError(f"FLOPs budget must be a number or a vector, got shape {np.shape(budget)}")
    obj = _Objective(s, flops, budget, mu, q, ranks)
    if obj.per_client:
        q = _scale_into_budgets(obj, q, movable, min_keep)
        gap = obj.gap(q)
    else:
        gap = obj.gap(q)
        for _ in range(200):
            if gap > 0:
                break
            q = np.where(movable[:, None], np.maximum(q * 0.999, min_keep), q)
            gap = obj.gap(q)
        if gap <= 0:
            raise InputError(f"no strictly feasible keep probabilities for budget {budget}")
    obj.refresh(q)
    value = obj.value(q, gap)
    values: list[float] = [value]
    gaps: list[float | np.ndarray] = [gap]
    step: float | None = None
    quiet = 0
    converged = False
    done = 0
    for _ in range(iterations):
        grad = obj.gradient(q, gap)
        if pinned:
            grad[~movable] = 0.0
        if step is None:
            step = 0.01 / max(float(np.abs(grad).max()), 1e-300)
        accepted = False
        while step > 1e-300:
            trial = np.clip(q - step * grad, min_keep, 1.0)
            trial_gap = obj.gap(trial)
            if obj.feasible(trial_gap):
                saved = obj.refresh(trial)
                trial_value = obj.value(trial, trial_gap)
                if trial_value <= value + 1e-4 * float(np.vdot(grad, trial - q)):
                    accepted = True
                    break
                obj.undo(saved)
            step *= 0.5
        if not accepted:
            converged = True
            break
        done += 1
        change = (value - trial_value) / max(abs(value), 1e-300)
        q, gap, value = trial, trial_gap, trial_value
        values.append(value)
        gaps.append(gap)
        step *= GROWTH
        quiet = quiet + 1 if change < tol else 0
        if quiet >= patience:
            converged = True
            break
    return KeepOptimum(q.T.copy(), np.asarray(values), np.asarray(gaps), done, converged)
