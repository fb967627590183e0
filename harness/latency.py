"""Latency and memory models of a device, fitted to its measured widths (pure maths, no I/O).

The features come from `harness.arch_counts`, the fit from `harness.linear_fit`, and the
leave-one-width-out check from `harness.latency_validation`.

Per device and measured configuration (model, batch, backend), the per-image training time
of ANY architecture of the model is predicted: an unmeasured width (0.375), or mixed
per-layer widths (FedRolex windows and FLuID's invariant drops keep a width per layer,
HeteroFL levels are uniform widths). The same is done for peak memory.

Features
    Per architecture, from `exporters.flops.count` (per example, training step, optimizer
    excluded), in `harness.arch_counts.FEATURES` order:

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
    when unknown) and `harness.linear_fit.MODEL_ERROR` the error a linear feature model keeps even on perfect
    data (cache effects, kernel choices that switch with the size).

Uncertainty
    ``std`` of a prediction is the standard deviation of the fitted latency at that
    architecture under the Laplace approximation of the posterior: ``f^T H^-1 f`` with
    ``H`` the Gaussian system's normal matrix (data and prior rows), ignoring the
    non-negativity bounds. It grows where the data do not reach: narrower or wider than
    every measured width, or layer widths mixed in proportions never measured. A
    prediction whose features leave the measured range by more than `harness.linear_fit.EXTRAPOLATION_SLACK`
    is marked ``extrapolated`` and its note says how far (``far`` beyond a factor of
    `harness.linear_fit.FAR_FACTOR`).

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
``peak_memory_bytes``, ``arch_sizes``, ``precision_achieved``, ``pass_mean_us`` when present;
the fits use ``pass_mean_us`` where a row has it, see `cell_latency_us`). Rows whose
``status`` is present and not ``"ok"``, or without a finite positive ``median_us``, are
ignored. ``arch_sizes`` (a comma-separated string or a sequence) names a mixed
architecture; without it the row is the uniform ``model.arch(width)``. Optional columns
``train_flops``, ``params`` and ``activation_elements`` stand in for the counts of a model
that is not in the zoo (tests use them).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Union

import numpy as np

from harness.arch_counts import (
    FEATURES,
    MEMORY_FEATURES,
    ArchCounts,
    arch_counts,
    latency_features,
    memory_feature_vector,
    zoo_counts,
)
from harness.linear_fit import PRIOR_SD, Estimate, LinearFit, estimate, fit_linear

if TYPE_CHECKING:
    import pandas as pd

    from exporters.arch import Arch

#: Latency features of a model the zoo does not know (rows bring ``train_flops``).
FLOPS_FEATURES: tuple[str, ...] = ("fixed", "flops")

#: Prior standard deviation of the ``fixed`` feature's share (see the module docstring).
FIXED_PRIOR_SD = 0.1

#: (model, batch, backend): one measured configuration of a device.
ConfigKey = tuple[str, int, str]
#: Profile rows as the fits and the schedulers take them: a DataFrame of
#: `harness.store.CELL_COLUMNS` (`harness.store.ProfileStore.latest_cells`), row mappings with
#: those keys, or rows per device (``{device: rows}``, a row's ``device`` filled from its key).
ProfileRows = Union["pd.DataFrame", Iterable[Mapping[str, Any]], Mapping[str, Sequence[Mapping[str, Any]]], None]


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
            A width is ``model.arch(width)`` of the zoo model; for a model outside the
            zoo only a row's ``train_flops`` can say it, so it needs `predict_flops`.

        Returns
        -------
        numpy.ndarray
        """
        if not self.zoo:
            raise ValueError(f"{self.model} is not a zoo model: predict it from training FLOPs (predict_flops)")
        if isinstance(arch, (int, float)):
            counts = zoo_counts(self.model, float(arch))
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
            Any architecture of the model, or a uniform width in (0, 1].

        Returns
        -------
        Estimate
            Seconds per image; ``extrapolated`` and a note when ``arch`` lies outside the
            measured widths.
        """
        return estimate(self.fit, self.features_of(arch), "work")

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
        return estimate(self.fit, np.array([1.0, float(train_flops)]), "training FLOPs")

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
            Any architecture of the (zoo) model, or a uniform width.

        Returns
        -------
        Estimate
        """
        counts = zoo_counts(self.model, float(arch)) if isinstance(arch, (int, float)) else arch_counts(arch)
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
        return estimate(self.fit, memory_feature_vector(params, activations, self.batch), "memory footprint")

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
    from exporters.userinput import InputError
    from exporters.zoo import get_model

    try:
        get_model(model)
    except (InputError, KeyError):
        return False
    return True


def row_sizes(r: Mapping[str, Any]) -> tuple[int, ...] | None:
    """Return a row's architecture sizes (its ``arch_sizes`` column), or None when it has none."""
    value = r.get("arch_sizes")
    if isinstance(value, str) and value.strip():
        return tuple(int(v) for v in value.split(","))
    if isinstance(value, (list, tuple)) and value:
        return tuple(int(v) for v in value)
    return None


def row_counts(r: Mapping[str, Any]) -> ArchCounts:
    """Return the counts of a row's architecture: its ``arch_sizes``, else its uniform width.

    Parameters
    ----------
    r : mapping
        A row of a zoo model.

    Returns
    -------
    ArchCounts
    """
    widths = row_sizes(r)
    return zoo_counts(str(r["model"]), widths if widths else float(r["width"]))


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


def fit_config(device: str, key: ConfigKey, rows: list[dict[str, Any]]) -> tuple[LatencyModel, MemoryModel | None]:
    """Fit one configuration's latency model and, where peaks were measured, its memory model.

    Parameters
    ----------
    device : str
    key : ConfigKey
        (model, batch, backend) of ``rows``.
    rows : list of dict
        The configuration's usable rows (`usable_rows`).

    Returns
    -------
    (LatencyModel, MemoryModel or None)
    """
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


def group_rows(rows: list[dict[str, Any]]) -> dict[str, dict[ConfigKey, list[dict[str, Any]]]]:
    """Return ``rows`` by device, then by configuration (model, batch, backend)."""
    out: dict[str, dict[ConfigKey, list[dict[str, Any]]]] = {}
    for r in rows:
        out.setdefault(str(r["device"]), {}).setdefault(_config(r), []).append(r)
    return out


def _fit_grouped(device: str, groups: Mapping[ConfigKey, list[dict[str, Any]]]) -> DeviceModels:
    models = DeviceModels(device)
    for key, group in groups.items():
        lat, mem = fit_config(device, key, group)
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
    return {device: _fit_grouped(device, groups) for device, groups in group_rows(usable_rows(rows)).items()}


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
    grouped = group_rows([r for r in usable if str(r["device"]) == device])
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
