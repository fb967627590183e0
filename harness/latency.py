"""Latency and memory models of a device, fitted to its measured widths (pure maths, no I/O).

Per device and measured configuration (model, batch, backend), the per-image training time
of ANY architecture of the model is predicted: an unmeasured width (0.375), or mixed
per-layer widths (FedRolex windows and FLuID's invariant drops keep a width per layer,
HeteroFL levels are uniform widths). The same is done for peak memory.

Features
    Per architecture, from `exporters.flops.count` (per example, training step, optimizer
    excluded), in `FEATURES` order:

    * ``fixed``: 1 per image. The per-step cost that does not grow with the model
      (runtime dispatch of every kernel, the optimizer's bookkeeping, the Python loop),
      divided over the batch; the layer count is the same at every width of a model, so
      within one configuration the kernel count is this constant.
    * ``conv``: training FLOPs of the convolutions (their products and bias work, forward
      plus backward).
    * ``matmul``: training FLOPs of the linear and LSTM layers together. The exported LSTM
      is unrolled (`exporters.export_forms.UnrolledLSTM`) into the same ``Gemm`` and
      ``MatMul`` kernels as a linear layer, plus element-wise gates; a FLOP of either runs
      on one kernel. (As two features, the share prior below let a narrow output layer, a
      few thousand FLOPs of ``fluid-lstm``, carry everything linear in the width at an
      implausible cost per FLOP, and the widest width was predicted short;
      ``python -m tests.bench.latency_bench`` measures the leave-one-width-out error.)
    * ``bytes``: bytes moved per example, ``4 * (3 A + 4 P / batch)`` with ``A`` the output
      elements of every executed layer (written forward, read and written back backward)
      and ``P`` the parameters (read forward and backward, gradient written, updated once
      per batch). It carries the memory-bound work (activations, pooling, the element-wise
      layers) and the part of a narrow layer's cost that its matrix products do not
      explain (small GEMMs run far below peak).

    A model that is not in the zoo (rows that bring their own ``train_flops``) is fitted
    on ``fixed`` and ``flops`` (all training FLOPs) only.

Fit (decision: a non-negative MAP fit under a weak prior)
    ``seconds_per_image = sum_j c_j f_j`` with every ``c_j >= 0``: no kind of work makes a
    step faster. With four or five measured widths, ``1``, ``A`` and the FLOPs of a model
    whose widths all scale together span about three directions (constant, linear and
    quadratic in the width), so an unconstrained least-squares fit of four coefficients
    over-fits: it puts large opposite-signed weights on collinear features and predicts
    nonsense between and beyond the widths. Two guards:

    1. non-negativity (exact: SciPy's Lawson-Hanson non-negative least squares);
    2. a Gaussian prior on each coefficient's *share* of the widest measured latency,
       ``theta_j = c_j f_j(widest) / y(widest) ~ N(0, PRIOR_SD**2)``: among the
       combinations the data cannot tell apart it prefers the one that spreads the time
       over the kinds of work (the smallest shares), and it gives directions the data do
       not constrain (a layer kind whose width never varied alone) a finite uncertainty.
       In a zoo model's latency fit the ``fixed`` share has the tighter `FIXED_PRIOR_SD`
       (elsewhere it carries all the work the other features miss): a step's per-image fixed cost
       (dispatching a few dozen kernels, divided over the batch) is small against the
       batch's work, and a width whose kernels run less efficiently than the line through
       its neighbours (0.375 of ``fjord-cnn``: 12 and 24 channels, off the SIMD block)
       otherwise raises it and every narrower prediction with it, so the narrowest width,
       left out, is over-predicted (``python -m tests.bench.latency_bench`` measures it).

    The data enter as relative residuals: each measured median weighs by
    ``1 / (y * sigma)`` with ``sigma**2 = (precision / 1.96)**2 + MODEL_ERROR**2``, where
    ``precision`` is the half-width of the median's 95 % interval the runner achieved (2 %
    when unknown) and `MODEL_ERROR` the error a linear feature model keeps even on perfect
    data (cache effects, kernel choices that switch with the size).

Uncertainty
    ``std`` of a prediction is the standard deviation of the fitted latency at that
    architecture under the Laplace approximation of the posterior: ``f^T H^-1 f`` with
    ``H`` the Gaussian system's normal matrix (data and prior rows), ignoring the
    non-negativity bounds. It grows where the data do not reach: narrower or wider than
    every measured width, or layer widths mixed in proportions never measured. A
    prediction whose features leave the measured range by more than `EXTRAPOLATION_SLACK`
    is marked ``extrapolated`` and its note says how far (``far`` beyond a factor of
    `FAR_FACTOR`).

Memory
    ``peak_bytes = c_0 + c_p * 16 P + c_a * 4 A * batch`` (runtime resident memory, weights
    with gradient and two Adam moments, activations kept for the backward pass), fitted the
    same way (`MemoryModel`).

Validation
    `leave_one_out_error` refits each configuration without all rows of one width,
    predicts that width and compares with its measured level: the error per width (the
    report's prediction-error section), not only its median.

Inputs are plain rows: an iterable of mappings or a pandas DataFrame with at least the
columns ``device, model, width, batch, backend, median_us`` (``status``,
``peak_memory_bytes``, ``arch_widths``, ``precision_achieved``, ``pass_mean_us`` when present;
the fits use ``pass_mean_us`` where a row has it, see `cell_latency_us`). Rows whose
``status`` is present and not ``"ok"``, or without a finite positive ``median_us``, are
ignored. ``arch_widths`` (a comma-separated string or a sequence) names a mixed
architecture; without it the row is the uniform ``model.arch(width)``. Optional columns
``train_flops``, ``params`` and ``activation_elements`` stand in for the counts of a model
that is not in the zoo (tests use them).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import TYPE_CHECKING, Any, Union

import numpy as np

if TYPE_CHECKING:
    import pandas as pd

    from exporters.arch import Arch

#: Bytes per trainable parameter during training: weight + gradient + 2 Adam moments.
BYTES_PER_PARAM = 16
#: Bytes per activation element (float32).
BYTES_PER_ACTIVATION = 4

#: Latency features of a zoo model, in order (see the module docstring).
FEATURES: tuple[str, ...] = ("fixed", "conv", "matmul", "bytes")
#: Latency features of a model the zoo does not know (rows bring ``train_flops``).
FLOPS_FEATURES: tuple[str, ...] = ("fixed", "flops")
#: Memory features.
MEMORY_FEATURES: tuple[str, ...] = ("fixed", "params_bytes", "activation_bytes")

#: Prior standard deviation of a coefficient's share of the widest measured latency.
PRIOR_SD = 1.0
#: Prior standard deviation of the ``fixed`` feature's share (see the module docstring).
FIXED_PRIOR_SD = 0.1
#: Relative error a linear feature model keeps on noise-free data (one standard deviation).
MODEL_ERROR = 0.03
#: Relative precision assumed for a row that does not say its own.
DEFAULT_ROW_PRECISION = 0.02
#: A feature may leave the measured range by this fraction before a prediction counts as extrapolated.
EXTRAPOLATION_SLACK = 0.1
#: Beyond this factor outside the measured range, an extrapolation is "far".
FAR_FACTOR = 2.0
#: z of a two-sided 95 % interval (converts a runner's precision into a standard deviation).
Z95 = 1.959964

#: (model, batch, backend): one measured configuration of a device.
ConfigKey = tuple[str, int, str]
#: Profile rows as the fits and the schedulers take them: a DataFrame of
#: `harness.store.CELL_COLUMNS` (`harness.store.ProfileStore.latest_cells`), row mappings with
#: those keys, or rows per device (``{device: rows}``, a row's ``device`` filled from its key).
ProfileRows = Union["pd.DataFrame", Iterable[Mapping[str, Any]], Mapping[str, Sequence[Mapping[str, Any]]], None]


# ---------------------------------------------------------------------------- analytic counts


@dataclass(frozen=True)
class ArchCounts:
    """What the models need to know about one architecture, per example.

    Attributes
    ----------
    conv, linear, lstm : float
        Training FLOPs of the layers of each kind.
    train_flops : float
        All training FLOPs (`exporters.flops.Counts.train_flops`).
    params : float
        Trainable parameters.
    activations : float
        Output elements of every executed layer, summed.
    """

    conv: float
    linear: float
    lstm: float
    train_flops: float
    params: float
    activations: float


@lru_cache(maxsize=4096)
def _zoo_counts(model_name: str, which: tuple[int, ...] | float) -> ArchCounts:
    """Count a zoo model's architecture: its layer widths, or the uniform width rate ``which``."""
    from exporters.arch import Arch
    from exporters.flops import count
    from exporters.zoo import get_model

    model = get_model(model_name)
    arch = Arch(model.name, which) if isinstance(which, tuple) else model.arch(float(which))
    counts = count(model, arch)
    kinds = {"conv": 0.0, "linear": 0.0, "lstm": 0.0}
    for layer in counts.layers:
        if layer.kind in kinds:
            kinds[layer.kind] += layer.train_flops
    activations = float(sum(math.prod(layer.output_shape) for layer in counts.layers))
    return ArchCounts(
        kinds["conv"], kinds["linear"], kinds["lstm"], float(counts.train_flops), float(counts.params), activations
    )


def arch_counts(arch: Arch) -> ArchCounts:
    """Return the counts of a zoo architecture (cached).

    Parameters
    ----------
    arch : Arch
        Any widths of a zoo model.

    Returns
    -------
    ArchCounts
    """
    return _zoo_counts(arch.model, tuple(int(w) for w in arch.sizes))


def train_flops_per_example(model_name: str, width: float) -> int:
    """Return the training-step FLOPs of one example of a zoo model at a width rate.

    Parameters
    ----------
    model_name : str
        Zoo model name (`exporters.zoo.get_model`).
    width : float
        Width rate in (0, 1] (``model.arch(width)``).

    Returns
    -------
    int
        Forward plus backward FLOPs per example (`exporters.flops.Counts.train_flops`).
    """
    return int(_zoo_counts(model_name, float(width)).train_flops)


def memory_features(model_name: str, width: float) -> tuple[int, int]:
    """Return ``(params, activation_elements)`` of one example of a zoo model at a width rate.

    Parameters
    ----------
    model_name : str
        Zoo model name.
    width : float
        Width rate in (0, 1].

    Returns
    -------
    tuple of int
        Trainable parameters and the sum of the layers' output elements for one example.
    """
    counts = _zoo_counts(model_name, float(width))
    return int(counts.params), int(counts.activations)


def footprint_bytes(
    params: float, activation_elements: float, batch: int, bytes_per_param: float = BYTES_PER_PARAM
) -> float:
    """Return ``params * bytes_per_param + activations * batch * 4``: a training step's own memory.

    Parameters
    ----------
    params : float
        Trainable parameters.
    activation_elements : float
        Sum of layer output elements for ONE example.
    batch : int
        Batch size.
    bytes_per_param : float
        Bytes per parameter with gradient and optimizer state (default 16, AdamW).

    Returns
    -------
    float
        Estimated training footprint in bytes.
    """
    return float(params) * bytes_per_param + float(activation_elements) * batch * BYTES_PER_ACTIVATION


def latency_features(counts: ArchCounts, batch: int) -> np.ndarray:
    """Return the `FEATURES` of an architecture at a batch size.

    Parameters
    ----------
    counts : ArchCounts
    batch : int

    Returns
    -------
    numpy.ndarray
        ``[1, conv, linear + lstm, 4 * (3 A + 4 P / batch)]``.
    """
    moved = BYTES_PER_ACTIVATION * (3.0 * counts.activations + 4.0 * counts.params / batch)
    return np.array([1.0, counts.conv, counts.linear + counts.lstm, moved])


def memory_feature_vector(params: float, activations: float, batch: int) -> np.ndarray:
    """Return the `MEMORY_FEATURES`: ``[1, 16 P, 4 A batch]``.

    Parameters
    ----------
    params, activations : float
    batch : int

    Returns
    -------
    numpy.ndarray
    """
    return np.array([1.0, BYTES_PER_PARAM * float(params), BYTES_PER_ACTIVATION * float(activations) * batch])


# ---------------------------------------------------------------------------- the fit


@dataclass(frozen=True)
class Estimate:
    """A prediction with its uncertainty.

    Attributes
    ----------
    value : float
        Seconds per image (latency) or bytes (memory).
    std : float
        One standard deviation of ``value``, same unit.
    extrapolated : bool
        The architecture lies outside what was measured (`EXTRAPOLATION_SLACK`).
    note : str
        How far outside, and the relative uncertainty ("" inside the measured range).
    """

    value: float
    std: float
    extrapolated: bool = False
    note: str = ""

    @property
    def relative(self) -> float:
        """``std / value`` (inf for a value of 0)."""
        return self.std / self.value if self.value > 0 else math.inf


def nonnegative_lstsq(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Solve ``min ||a x - b||`` subject to ``x >= 0`` (SciPy's Lawson-Hanson active set).

    Parameters
    ----------
    a : numpy.ndarray
        ``(rows, k)``.
    b : numpy.ndarray
        ``(rows,)``.

    Returns
    -------
    numpy.ndarray
        ``(k,)``, every entry ``>= 0``.
    """
    from scipy.optimize import nnls

    solution, _ = nnls(np.asarray(a, dtype=float), np.asarray(b, dtype=float))
    return np.asarray(solution, dtype=float)


@dataclass(frozen=True)
class LinearFit:
    """A non-negative MAP fit ``y = X c`` with its posterior covariance (see the module docstring).

    Attributes
    ----------
    features : tuple of str
    coef : tuple of float
        Coefficients per feature (unit of ``y`` per unit of the feature).
    cov : tuple of tuple of float
        Laplace covariance of ``coef``.
    low, high : tuple of float
        Smallest and largest measured value of each feature.
    n_points : int
        Rows fitted.
    """

    features: tuple[str, ...]
    coef: tuple[float, ...]
    cov: tuple[tuple[float, ...], ...]
    low: tuple[float, ...]
    high: tuple[float, ...]
    n_points: int

    def mean(self, x: np.ndarray) -> float:
        """Return the fitted value at feature vector ``x``."""
        return float(np.asarray(self.coef) @ x)

    def std(self, x: np.ndarray) -> float:
        """Return the standard deviation of the fitted value at ``x``."""
        return float(math.sqrt(max(0.0, float(x @ np.asarray(self.cov) @ x))))

    def outside(self, x: np.ndarray) -> float:
        """Return how far ``x`` leaves the measured range: the largest ratio beyond it (1.0 inside)."""
        worst = 1.0
        for value, low, high in zip(x, self.low, self.high, strict=True):
            if high > 0 and value > high:
                worst = max(worst, value / high)
            if low > 0 and value < low:
                worst = max(worst, low / value if value > 0 else math.inf)
        return worst


def fit_linear(
    features: Sequence[str],
    x: np.ndarray,
    y: np.ndarray,
    precision: np.ndarray | None = None,
    *,
    prior_sd: float | Sequence[float] = PRIOR_SD,
    model_error: float = MODEL_ERROR,
) -> LinearFit:
    """Fit ``y = x c`` with ``c >= 0`` under the share prior (see the module docstring).

    Parameters
    ----------
    features : sequence of str
        Names of the columns of ``x``.
    x : numpy.ndarray
        ``(n, k)`` features of each measured row.
    y : numpy.ndarray
        ``(n,)`` positive measured values.
    precision : numpy.ndarray, optional
        ``(n,)`` half-widths of each value's 95 % interval as fractions (NaN: unknown,
        `DEFAULT_ROW_PRECISION`).
    prior_sd : float or sequence of float
        Prior standard deviation of each feature's share of the largest row: one for all,
        or one per feature (`latency_prior_sd`).
    model_error : float
        Relative error of the model itself.

    Returns
    -------
    LinearFit
        A feature that is 0 in every row gets coefficient 0 and no variance.

    Raises
    ------
    ValueError
        Without rows, or with a value that is not positive.
    """
    x = np.asarray(x, dtype=float)
    y = np.asarray(y, dtype=float)
    if x.ndim != 2 or x.shape[0] == 0 or x.shape[0] != y.shape[0] or x.shape[1] != len(features):
        raise ValueError(f"need (n, {len(features)}) features for n > 0 values, got {x.shape} and {y.shape}")
    if not np.all(np.isfinite(y)) or np.any(y <= 0):
        raise ValueError("measured values must be positive")
    prec = np.full(y.shape, DEFAULT_ROW_PRECISION) if precision is None else np.asarray(precision, dtype=float)
    prec = np.where(np.isfinite(prec) & (prec >= 0), prec, DEFAULT_ROW_PRECISION)
    sigma = np.sqrt((prec / Z95) ** 2 + model_error**2)
    used = [j for j in range(x.shape[1]) if np.any(x[:, j] != 0)]
    ref = int(np.argmax(y))
    scale = np.array([x[ref, j] if x[ref, j] > 0 else float(np.max(np.abs(x[:, j]))) for j in used]) / y[ref]
    # Unknowns: shares theta_j = c_j * scale_j, so each column is in units of the largest row.
    rows = (x[:, used] / scale) / (y * sigma)[:, None]
    target = 1.0 / sigma
    prior = np.diag(1.0 / np.broadcast_to(np.asarray(prior_sd, dtype=float), (x.shape[1],))[used])
    a = np.vstack([rows, prior])
    b = np.concatenate([target, np.zeros(len(used))])
    theta = nonnegative_lstsq(a, b)
    hessian_inv = np.linalg.pinv(a.T @ a)
    coef = np.zeros(x.shape[1])
    cov = np.zeros((x.shape[1], x.shape[1]))
    coef[used] = theta / scale
    cov[np.ix_(used, used)] = hessian_inv / np.outer(scale, scale)
    return LinearFit(
        tuple(features),
        tuple(float(c) for c in coef),
        tuple(tuple(float(v) for v in row) for row in cov),
        tuple(float(v) for v in x.min(axis=0)),
        tuple(float(v) for v in x.max(axis=0)),
        int(x.shape[0]),
    )


def _estimate(fit: LinearFit, x: np.ndarray, what: str) -> Estimate:
    value = max(fit.mean(x), 0.0)
    std = fit.std(x)
    factor = fit.outside(x)
    if factor <= 1.0 + EXTRAPOLATION_SLACK:
        return Estimate(value, std)
    far = "far " if factor > FAR_FACTOR else ""
    relative = f"+-{100 * std / value:.0f} %" if value > 0 else f"+-{std:.3g}"
    note = f"{what} {factor:.2g}x {far}outside the measured range: extrapolated, {relative} (one std)"
    return Estimate(value, std, True, note)


# ---------------------------------------------------------------------------- models


@dataclass(frozen=True)
class LatencyModel:
    """Per-image training time of any architecture of one model on one device.

    Build it with `fit` / `fit_device`; `predict` is the API the schedulers use.

    Attributes
    ----------
    device, model : str
    batch : int
    backend : str
    fit : LinearFit
        Seconds per image over the features (`FEATURES` or `FLOPS_FEATURES`).
    widths : tuple of float
        Widths measured.
    """

    device: str
    model: str
    batch: int
    backend: str
    fit: LinearFit
    widths: tuple[float, ...] = ()

    @property
    def zoo(self) -> bool:
        """Whether the model is fitted on the zoo's per-layer features (else on total FLOPs)."""
        return self.fit.features == FEATURES

    def features_of(self, arch: Arch | float) -> np.ndarray:
        """Return the feature vector of an architecture (an `Arch`, or a uniform width of the model).

        Parameters
        ----------
        arch : Arch or float
            A width rate is ``model.arch(width)`` of the zoo model; for a model outside the
            zoo only a row's ``train_flops`` can say it, so it needs `predict_flops`.

        Returns
        -------
        numpy.ndarray
        """
        if not self.zoo:
            raise ValueError(f"{self.model} is not a zoo model: predict it from training FLOPs (predict_flops)")
        if isinstance(arch, (int, float)):
            counts = _zoo_counts(self.model, float(arch))
        else:
            if arch.model != self.model:
                raise ValueError(f"architecture of {arch.model}, model fitted for {self.model}")
            counts = arch_counts(arch)
        return latency_features(counts, self.batch)

    def predict(self, arch: Arch | float) -> Estimate:
        """Predict seconds per image of training ``arch`` on the device, with its uncertainty.

        Parameters
        ----------
        arch : Arch or float
            Any architecture of the model, or a uniform width rate in (0, 1].

        Returns
        -------
        Estimate
            Seconds per image; ``extrapolated`` and a note when ``arch`` lies outside the
            measured widths.
        """
        return _estimate(self.fit, self.features_of(arch), "work")

    def predict_flops(self, train_flops: float) -> Estimate:
        """Predict seconds per image of a model fitted on total FLOPs (`FLOPS_FEATURES`).

        Parameters
        ----------
        train_flops : float
            Training FLOPs per example.

        Returns
        -------
        Estimate
        """
        if self.zoo:
            raise ValueError(f"{self.model} is fitted on per-layer features: predict it from an architecture")
        return _estimate(self.fit, np.array([1.0, float(train_flops)]), "training FLOPs")

    def predict_us(self, arch: Arch | float) -> float:
        """Return `predict`'s value in microseconds per image."""
        return self.predict(arch).value * 1e6

    @property
    def fixed_us(self) -> float:
        """The fitted per-image cost that does not grow with the model, in microseconds."""
        return self.fit.coef[0] * 1e6

    @property
    def n_points(self) -> int:
        """Rows fitted."""
        return self.fit.n_points


@dataclass(frozen=True)
class MemoryModel:
    """Peak memory (bytes) of training any architecture of one model on one device.

    Attributes
    ----------
    device, model : str
    batch : int
    backend : str
    fit : LinearFit
        Bytes over `MEMORY_FEATURES`.
    """

    device: str
    model: str
    batch: int
    backend: str
    fit: LinearFit

    def predict(self, arch: Arch | float) -> Estimate:
        """Predict the peak resident memory (bytes) of training ``arch``, with its uncertainty.

        Parameters
        ----------
        arch : Arch or float
            Any architecture of the (zoo) model, or a uniform width rate.

        Returns
        -------
        Estimate
        """
        counts = _zoo_counts(self.model, float(arch)) if isinstance(arch, (int, float)) else arch_counts(arch)
        return self.predict_counts(counts.params, counts.activations)

    def predict_counts(self, params: float, activations: float) -> Estimate:
        """Predict the peak memory (bytes) from parameter and activation counts per example.

        Parameters
        ----------
        params, activations : float

        Returns
        -------
        Estimate
        """
        return _estimate(self.fit, memory_feature_vector(params, activations, self.batch), "memory footprint")

    @property
    def base_bytes(self) -> float:
        """The fitted resident memory that does not depend on the architecture."""
        return self.fit.coef[0]


@dataclass(frozen=True)
class DeviceModels:
    """Fitted models of one device, per configuration ``(model, batch, backend)``.

    Attributes
    ----------
    device : str
    latency : dict of ConfigKey to LatencyModel
    memory : dict of ConfigKey to MemoryModel
        Only configurations with measured peak memory.
    """

    device: str
    latency: dict[ConfigKey, LatencyModel] = field(default_factory=dict)
    memory: dict[ConfigKey, MemoryModel] = field(default_factory=dict)

    def key(self, model: str, batch: int | None = None, backend: str | None = None) -> ConfigKey:
        """Return the one fitted configuration of ``model`` matching ``batch`` / ``backend``.

        Parameters
        ----------
        model : str
        batch : int, optional
        backend : str, optional
            ``None`` matches any; the match must then be unique.

        Returns
        -------
        ConfigKey

        Raises
        ------
        KeyError
            If no configuration, or more than one, matches.
        """
        found = [
            k
            for k in self.latency
            if k[0] == model and (batch is None or k[1] == batch) and (backend is None or k[2] == backend)
        ]
        if len(found) != 1:
            what = "no" if not found else f"{len(found)}"
            raise KeyError(
                f"{self.device}: {what} fitted configuration(s) for model={model} batch={batch} "
                f"backend={backend} (fitted: {sorted(self.latency)}); give batch and backend"
            )
        return found[0]

    def latency_model(self, model: str, batch: int | None = None, backend: str | None = None) -> LatencyModel:
        """Return the latency model of ``model`` (see `key`)."""
        return self.latency[self.key(model, batch, backend)]

    def memory_model(self, model: str, batch: int | None = None, backend: str | None = None) -> MemoryModel | None:
        """Return the memory model of ``model`` (None when no peak memory was measured)."""
        return self.memory.get(self.key(model, batch, backend))


# ---------------------------------------------------------------------------- rows


def profile_rows(profiles: ProfileRows) -> list[dict[str, Any]]:
    """Return profiles in any accepted form as a flat list of row dicts.

    Parameters
    ----------
    profiles : pandas.DataFrame, iterable of mapping, mapping of str to rows, or None
        A ``{device: rows}`` mapping fills a row's missing ``device`` with its key.
        ``None`` gives no rows.

    Returns
    -------
    list of dict
        pandas missing values (``pd.NA``, ``pd.NaT``) become ``None``.
    """
    if profiles is None:
        return []
    if hasattr(profiles, "to_dict") and hasattr(profiles, "columns"):
        records = [dict(r) for r in profiles.to_dict("records")]
    elif isinstance(profiles, Mapping):
        records = []
        for device, rows in profiles.items():
            for r in rows:
                row = dict(r)
                row.setdefault("device", device)
                records.append(row)
    else:
        records = [dict(r) for r in profiles]
    return [{k: _clean(v) for k, v in r.items()} for r in records]


def _clean(value: Any) -> Any:
    if value is None or isinstance(value, (str, bytes, bool, int, float)):
        return value
    import pandas as pd

    return None if value is pd.NA or value is pd.NaT else value


def finite_positive(value: Any) -> bool:
    """Return whether ``value`` converts to a finite number above 0 (``None`` and text do not).

    Parameters
    ----------
    value : Any

    Returns
    -------
    bool
    """
    try:
        v = float(value)
    except (TypeError, ValueError):
        return False
    return math.isfinite(v) and v > 0


def cell_latency_us(r: Mapping[str, Any]) -> float:
    """Return the per-image latency a fit uses for one cell: its ``pass_mean_us``, else its ``median_us``.

    A device's passes interleave its cells in time, so the mean of a cell's pass medians
    weighs every stretch of the host's speed the same in every cell of a sweep; the pooled
    median weighs a pass by the samples it took, which differ from cell to cell.

    Parameters
    ----------
    r : mapping
        A row of `harness.store.ProfileStore.latest_cells` (or any row with ``median_us``).

    Returns
    -------
    float
        Microseconds per image.
    """
    value = r.get("pass_mean_us")
    return float(value) if value is not None and finite_positive(value) else float(r["median_us"])


def usable_rows(rows: ProfileRows) -> list[dict[str, Any]]:
    """Return the rows a fit may use: status ``ok`` (or absent) and a finite positive ``median_us``.

    Parameters
    ----------
    rows : iterable of mapping or pandas.DataFrame

    Returns
    -------
    list of dict
    """
    out = []
    for r in profile_rows(rows):
        status = r.get("status")
        if status is not None and not (isinstance(status, float) and math.isnan(status)) and status != "ok":
            continue
        if finite_positive(r.get("median_us")):
            out.append(r)
    return out


def _is_zoo(model: str) -> bool:
    from exporters.errors import InputError
    from exporters.zoo import get_model

    try:
        get_model(model)
    except (InputError, KeyError):
        return False
    return True


def _row_widths(r: Mapping[str, Any]) -> tuple[int, ...] | None:
    value = r.get("arch_widths")
    if isinstance(value, str) and value.strip():
        return tuple(int(v) for v in value.split(","))
    if isinstance(value, (list, tuple)) and value:
        return tuple(int(v) for v in value)
    return None


def row_counts(r: Mapping[str, Any]) -> ArchCounts:
    """Return the counts of a row's architecture: its ``arch_widths``, else its uniform width.

    Parameters
    ----------
    r : mapping
        A row of a zoo model.

    Returns
    -------
    ArchCounts
    """
    widths = _row_widths(r)
    return _zoo_counts(str(r["model"]), widths if widths else float(r["width"]))


def _row_precision(r: Mapping[str, Any]) -> float:
    value = r.get("precision_achieved")
    return float(value) if value is not None and finite_positive(value) else math.nan


def _latency_design(rows: Sequence[Mapping[str, Any]], zoo: bool) -> np.ndarray:
    if zoo:
        return np.array([latency_features(row_counts(r), int(r["batch"])) for r in rows])
    missing = [r for r in rows if not finite_positive(r.get("train_flops"))]
    if missing:
        raise ValueError(f"model {missing[0]['model']!r} is not in the zoo and its rows do not say train_flops")
    return np.array([[1.0, float(r["train_flops"])] for r in rows])


def _memory_design(rows: Sequence[Mapping[str, Any]], zoo: bool) -> np.ndarray:
    out = []
    for r in rows:
        if finite_positive(r.get("params")) and r.get("activation_elements") is not None:
            params, acts = float(r["params"]), float(r["activation_elements"])
        elif zoo:
            counts = row_counts(r)
            params, acts = counts.params, counts.activations
        else:
            raise ValueError(f"model {r['model']!r} is not in the zoo and its rows do not say params")
        out.append(memory_feature_vector(params, acts, int(r["batch"])))
    return np.array(out)


def _config(r: Mapping[str, Any]) -> ConfigKey:
    return (str(r["model"]), int(r["batch"]), str(r["backend"]))


def latency_prior_sd(features: Sequence[str]) -> list[float]:
    """Return the prior standard deviation of each latency feature's share (module docstring).

    Parameters
    ----------
    features : sequence of str
        `FEATURES` (a zoo model) or `FLOPS_FEATURES`.

    Returns
    -------
    list of float
        `FIXED_PRIOR_SD` for ``fixed`` among a zoo model's features, `PRIOR_SD` for the
        rest (without the per-layer features, ``fixed`` carries all the work FLOPs miss).
    """
    zoo = tuple(features) == FEATURES
    return [FIXED_PRIOR_SD if zoo and name == "fixed" else PRIOR_SD for name in features]


def _fit_config(device: str, key: ConfigKey, rows: list[dict[str, Any]]) -> tuple[LatencyModel, MemoryModel | None]:
    model, batch, backend = key
    zoo = _is_zoo(model)
    names = FEATURES if zoo else FLOPS_FEATURES
    y = np.array([cell_latency_us(r) * 1e-6 for r in rows])
    precision = np.array([_row_precision(r) for r in rows])
    lat_fit = fit_linear(names, _latency_design(rows, zoo), y, precision, prior_sd=latency_prior_sd(names))
    widths = tuple(sorted({float(r["width"]) for r in rows}))
    lat = LatencyModel(device, model, batch, backend, lat_fit, widths)
    mem_rows = [
        r
        for r in rows
        if finite_positive(r.get("peak_memory_bytes"))
        and (zoo or (finite_positive(r.get("params")) and r.get("activation_elements") is not None))
    ]
    mem = None
    if mem_rows:
        peaks = np.array([float(r["peak_memory_bytes"]) for r in mem_rows])
        mem_fit = fit_linear(MEMORY_FEATURES, _memory_design(mem_rows, zoo), peaks)
        mem = MemoryModel(device, model, batch, backend, mem_fit)
    return lat, mem


def _group(rows: list[dict[str, Any]]) -> dict[str, dict[ConfigKey, list[dict[str, Any]]]]:
    out: dict[str, dict[ConfigKey, list[dict[str, Any]]]] = {}
    for r in rows:
        out.setdefault(str(r["device"]), {}).setdefault(_config(r), []).append(r)
    return out


def _fit_grouped(device: str, groups: Mapping[ConfigKey, list[dict[str, Any]]]) -> DeviceModels:
    models = DeviceModels(device)
    for key, group in groups.items():
        lat, mem = _fit_config(device, key, group)
        models.latency[key] = lat
        if mem is not None:
            models.memory[key] = mem
    return models


def fit(rows: ProfileRows) -> dict[str, DeviceModels]:
    """Fit latency and memory models for every device in ``rows``.

    Parameters
    ----------
    rows : iterable of mapping or pandas.DataFrame
        Store rows (see the module docstring); unusable rows are skipped.

    Returns
    -------
    dict of str to DeviceModels
    """
    return {device: _fit_grouped(device, groups) for device, groups in _group(usable_rows(rows)).items()}


def fit_device(rows: ProfileRows, device: str | None = None) -> DeviceModels:
    """Fit the models of one device.

    Parameters
    ----------
    rows : iterable of mapping or pandas.DataFrame
    device : str, optional
        Which device to fit; may be omitted when ``rows`` hold exactly one device.

    Returns
    -------
    DeviceModels

    Raises
    ------
    ValueError
        If ``device`` is omitted and the rows hold several devices, or the device has
        no usable row.
    """
    usable = usable_rows(rows)
    devices = sorted({str(r["device"]) for r in usable})
    if device is None:
        if len(devices) != 1:
            raise ValueError(f"rows hold {len(devices)} devices ({devices}); name one")
        device = devices[0]
    grouped = _group([r for r in usable if str(r["device"]) == device])
    if not grouped:
        raise ValueError(f"no usable measurement of device {device!r}")
    return _fit_grouped(device, grouped[device])


def _device_models(models: Mapping[str, DeviceModels] | DeviceModels, device: str) -> DeviceModels:
    dm = models if isinstance(models, DeviceModels) else models[device]
    if dm.device != device:
        raise KeyError(f"models are of device {dm.device!r}, not {device!r}")
    return dm


def predict(
    models: Mapping[str, DeviceModels] | DeviceModels,
    device: str,
    arch: Arch,
    batch: int | None = None,
    backend: str | None = None,
) -> Estimate:
    """Predict seconds per image of training ``arch`` on ``device``.

    Parameters
    ----------
    models : dict of str to DeviceModels, or DeviceModels
        From `fit` (or `fit_device`).
    device : str
    arch : Arch
        Any architecture of a fitted model (measured or not).
    batch, backend : optional
        Needed only when the device was measured in several configurations.

    Returns
    -------
    Estimate
    """
    return _device_models(models, device).latency_model(arch.model, batch, backend).predict(arch)


def predict_memory(
    models: Mapping[str, DeviceModels] | DeviceModels,
    device: str,
    arch: Arch,
    batch: int | None = None,
    backend: str | None = None,
) -> Estimate:
    """Predict the peak memory (bytes) of training ``arch`` on ``device`` (see `predict`).

    Raises
    ------
    KeyError
        When the device's configuration has no measured peak memory.
    """
    dm = _device_models(models, device)
    mem = dm.memory_model(arch.model, batch, backend)
    if mem is None:
        raise KeyError(f"{device}: no peak memory measured for {arch.model}")
    return mem.predict(arch)


def choose_next_width(
    models: Iterable[LatencyModel], candidates: Iterable[float], measured: Iterable[float]
) -> tuple[float, float] | None:
    """Return the candidate width whose predicted latency is the most uncertain (`--widths auto:N`).

    Parameters
    ----------
    models : iterable of LatencyModel
        One per device, fitted on the widths measured so far (zoo models).
    candidates : iterable of float
        Widths that may be measured.
    measured : iterable of float
        Widths already measured (never chosen again).

    Returns
    -------
    (width, score) or None
        The unmeasured candidate with the largest relative standard deviation averaged
        over the devices (ties: the smaller width); None when every candidate is measured.
    """
    fitted = list(models)
    done = {round(float(w), 9) for w in measured}
    best: tuple[float, float] | None = None
    for width in sorted(float(w) for w in candidates):
        if round(width, 9) in done:
            continue
        score = float(np.mean([m.predict(width).relative for m in fitted])) if fitted else 0.0
        if best is None or score > best[1] * (1 + 1e-9):
            best = (width, score)
    return best


# ---------------------------------------------------------------------------- validation


@dataclass(frozen=True)
class LooPoint:
    """One left-out width.

    Attributes
    ----------
    model : str
    batch : int
    backend : str
    width : float
    predicted_us, measured_us : float
        Prediction of the model refitted without this width; median of its measured rows.
    predicted_std_us : float
        The refitted model's standard deviation at this width.
    relative_error : float
        ``(predicted - measured) / measured``.
    extrapolated : bool
        The width lay outside the other measured widths.
    """

    model: str
    batch: int
    backend: str
    width: float
    predicted_us: float
    measured_us: float
    relative_error: float
    predicted_std_us: float = math.nan
    extrapolated: bool = False


@dataclass(frozen=True)
class LooReport:
    """Leave-one-width-out validation of one device.

    Attributes
    ----------
    device : str
    points : tuple of LooPoint
    median_abs_error : float
        Median of ``|relative_error|`` over ``points`` (NaN when there is none: a
        configuration needs at least two measured widths).
    max_abs_error : float
        Largest ``|relative_error|`` (NaN when there is none).
    """

    device: str
    points: tuple[LooPoint, ...]
    median_abs_error: float
    max_abs_error: float = math.nan


def leave_one_out_error(rows: ProfileRows) -> dict[str, LooReport]:
    """Measure prediction error by refitting each configuration without one width at a time.

    Parameters
    ----------
    rows : iterable of mapping or pandas.DataFrame

    Returns
    -------
    dict of str to LooReport
        Per device: each left-out width's prediction (with its uncertainty), measured
        median and relative error, and the median and largest absolute error.
    """
    out: dict[str, LooReport] = {}
    for device, groups in _group(usable_rows(rows)).items():
        points: list[LooPoint] = []
        for key, group in sorted(groups.items()):
            widths = sorted({float(r["width"]) for r in group})
            if len(widths) < 2:
                continue
            for w in widths:
                held = [r for r in group if float(r["width"]) == w]
                rest = [r for r in group if float(r["width"]) != w]
                lat, _ = _fit_config(device, key, rest)
                estimate = lat.predict_flops(float(held[0]["train_flops"])) if not lat.zoo else lat.predict(
                    _held_arch(held[0])
                )
                measured = float(np.median([cell_latency_us(r) for r in held]))
                predicted = estimate.value * 1e6
                points.append(
                    LooPoint(
                        key[0], key[1], key[2], w, predicted, measured, (predicted - measured) / measured,
                        estimate.std * 1e6, estimate.extrapolated,
                    )  # fmt: skip
                )
        errors = [abs(p.relative_error) for p in points]
        med = float(np.median(errors)) if errors else math.nan
        worst = float(np.max(errors)) if errors else math.nan
        out[device] = LooReport(device, tuple(points), med, worst)
    return out


def _held_arch(r: Mapping[str, Any]) -> Arch | float:
    from exporters.arch import Arch

    widths = _row_widths(r)
    return Arch(str(r["model"]), widths) if widths else float(r["width"])


def format_loo(reports: Mapping[str, LooReport]) -> str:
    """Render `leave_one_out_error` output as a plain-text table.

    Parameters
    ----------
    reports : dict of str to LooReport

    Returns
    -------
    str
    """
    lines = [
        f"{'device':<16} {'model':<16} {'batch':>5} {'backend':<8} {'width':>6} "
        f"{'pred_us':>10} {'+-std':>8} {'meas_us':>10} {'err':>7}"
    ]
    for device, rep in sorted(reports.items()):
        for p in rep.points:
            lines.append(
                f"{device:<16} {p.model:<16} {p.batch:>5} {p.backend:<8} {p.width:>6.3g} "
                f"{p.predicted_us:>10.1f} {p.predicted_std_us:>8.1f} {p.measured_us:>10.1f} {p.relative_error:>+7.1%}"
            )
        lines.append(f"{device:<16} median |error| {rep.median_abs_error:.1%}, max {rep.max_abs_error:.1%}")
    return "\n".join(lines)


__all__ = [
    "BYTES_PER_PARAM",
    "FEATURES",
    "ArchCounts",
    "DeviceModels",
    "Estimate",
    "LatencyModel",
    "LinearFit",
    "LooPoint",
    "LooReport",
    "MemoryModel",
    "arch_counts",
    "cell_latency_us",
    "choose_next_width",
    "fit",
    "fit_device",
    "fit_linear",
    "footprint_bytes",
    "latency_prior_sd",
    "format_loo",
    "leave_one_out_error",
    "memory_features",
    "nonnegative_lstsq",
    "predict",
    "predict_memory",
    "train_flops_per_example",
    "usable_rows",
]
