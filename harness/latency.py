"""Latency and memory models fitted to stored measurements (pure maths, no I/O).

Per device and per measured configuration (model, batch, backend), two straight lines
are fitted to the widths that were measured, so that an unmeasured width can be
predicted from its analytic counts alone:

Latency model
    ``latency_us = a + b * train_flops``, where ``latency_us`` is the median per-image
    training-step latency (the store's ``median_us``) and ``train_flops`` the forward
    plus backward FLOPs of ONE example (`exporters.flops.count`, optimizer excluded).
    ``a`` is the fixed per-image cost of a step that does not scale with the model
    (runner overhead, kernel launches, optimizer bookkeeping amortised over the batch);
    it is constrained to ``a >= 0``: ordinary least squares is solved first and, when
    it gives a negative intercept, the constrained optimum lies on ``a = 0``, so the
    line through the origin (``b = sum(x y) / sum(x x)``) is fitted instead. With a
    single measured width (or all rows at one FLOPs value) the slope cannot be
    separated from the intercept and the proportional model ``latency = b * flops``
    is used (``LatencyModel.kind == "proportional"``).

Memory model
    ``peak_bytes = c + d * footprint`` with
    ``footprint = params * bytes_per_param + activation_elements * batch * 4``:

    * ``bytes_per_param`` (default `BYTES_PER_PARAM` = 16) counts the float32 weight,
      its gradient and the two Adam/AdamW moment buffers (4 x 4 bytes);
    * ``activation_elements`` is the sum over executed layers of their output
      elements for one example (``prod(LayerCount.output_shape)``), i.e. an upper-bound
      estimate of what a training step keeps for the backward pass, in float32 (4
      bytes). It ignores workspace buffers and in-place reuse; the fitted ``d``
      absorbs that scale and ``c`` the runtime's own resident memory (interpreter,
      ONNX Runtime, loaded graphs). ``c >= 0`` is enforced as for ``a``.

Leave-one-width-out error
    `leave_one_out_error` refits each configuration without all rows of one width,
    predicts that width and compares with its measured median; the median absolute
    relative error over all left-out widths of a device is the figure to report.

Inputs are plain rows: an iterable of mappings or a pandas DataFrame with at least the
columns ``device, model, width, batch, backend, median_us`` (``status`` and
``peak_memory_bytes`` when present). Rows whose ``status`` is present and not ``"ok"``,
or without a finite positive ``median_us``, are ignored. Optional columns
``train_flops``, ``params`` and ``activation_elements`` override the analytic counts
(tests use them; otherwise they are computed from the zoo, see
`train_flops_per_example` and `memory_features`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

if TYPE_CHECKING:
    from exporters.arch import Arch

#: Bytes per trainable parameter during training: weight + gradient + 2 Adam moments.
BYTES_PER_PARAM = 16
#: Bytes per activation element (float32).
BYTES_PER_ACTIVATION = 4

#: (model, batch, backend): one measured configuration of a device.
ConfigKey = tuple[str, int, str]
Rows = Any  # Iterable[Mapping[str, Any]] or a pandas DataFrame

FitKind = Literal["affine", "proportional"]


# ---------------------------------------------------------------------------- analytic counts


@lru_cache(maxsize=1024)
def _counts(model_name: str, width: float) -> tuple[int, int, int]:
    from exporters.flops import count
    from exporters.zoo import get_model

    model = get_model(model_name)
    counts = count(model, model.arch(float(width)))
    activations = sum(math.prod(layer.output_shape) for layer in counts.layers)
    return counts.train_flops, counts.params, activations


def _arch_counts(arch: Arch) -> tuple[int, int, int]:
    from exporters.flops import count
    from exporters.zoo import get_model

    counts = count(get_model(arch.model), arch)
    activations = sum(math.prod(layer.output_shape) for layer in counts.layers)
    return counts.train_flops, counts.params, activations


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
    return _counts(model_name, float(width))[0]


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
        Trainable parameters and the sum of the layers' output elements for one
        example (see the module docstring for what the estimate covers).
    """
    _, params, activations = _counts(model_name, float(width))
    return params, activations


def footprint_bytes(
    params: float, activation_elements: float, batch: int, bytes_per_param: float = BYTES_PER_PARAM
) -> float:
    """Return the memory-model regressor ``params * bytes_per_param + activations * batch * 4``.

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


# ---------------------------------------------------------------------------- fitting


def fit_line(x: Iterable[float], y: Iterable[float]) -> tuple[float, float, FitKind]:
    """Least-squares ``y = a + b x`` with ``a >= 0``; proportional with one distinct ``x``.

    Parameters
    ----------
    x, y : iterable of float
        Regressor and response, same length, at least one point.

    Returns
    -------
    a, b : float
        Intercept (>= 0) and slope.
    kind : {"affine", "proportional"}
        ``"proportional"`` when ``a`` was forced to 0 because only one distinct ``x``
        was given; a negative unconstrained intercept also gives ``a = 0`` (the
        constrained least-squares optimum) but keeps ``kind == "affine"``.

    Raises
    ------
    ValueError
        If no point is given, the lengths differ, or every ``x`` is 0.
    """
    xs = np.asarray(list(x), dtype=float)
    ys = np.asarray(list(y), dtype=float)
    if xs.shape != ys.shape or xs.size == 0:
        raise ValueError(f"need matching, non-empty x and y (got {xs.size} and {ys.size} values)")
    if not np.any(xs != 0):
        raise ValueError("every regressor value is 0: cannot fit a slope")
    if np.unique(xs).size < 2:
        return 0.0, float(xs @ ys / (xs @ xs)), "proportional"
    design = np.column_stack([np.ones_like(xs), xs])
    (a, b), *_ = np.linalg.lstsq(design, ys, rcond=None)
    if a < 0:
        return 0.0, float(xs @ ys / (xs @ xs)), "affine"
    return float(a), float(b), "affine"


@dataclass(frozen=True)
class LatencyModel:
    """``latency_us = intercept_us + slope_us_per_flop * train_flops`` per image.

    Attributes
    ----------
    intercept_us : float
        Fixed per-image cost of a step (>= 0), microseconds.
    slope_us_per_flop : float
        Microseconds per training FLOP of one example.
    kind : {"affine", "proportional"}
    n_points : int
        Rows used in the fit.
    widths : tuple of float
        Widths measured.
    """

    intercept_us: float
    slope_us_per_flop: float
    kind: FitKind = "affine"
    n_points: int = 0
    widths: tuple[float, ...] = ()

    def predict(self, arch_or_flops: Arch | float) -> float:
        """Predict per-image latency (us) for an `Arch` or a training-FLOPs-per-example value.

        Parameters
        ----------
        arch_or_flops : Arch or float
            An architecture (its FLOPs are counted with `exporters.flops.count`) or
            training FLOPs per example.

        Returns
        -------
        float
        """
        flops = _arch_counts(arch_or_flops)[0] if not isinstance(arch_or_flops, (int, float)) else arch_or_flops
        return self.intercept_us + self.slope_us_per_flop * float(flops)


@dataclass(frozen=True)
class MemoryModel:
    """``peak_bytes = base_bytes + scale * footprint`` (see `footprint_bytes`).

    Attributes
    ----------
    base_bytes : float
        Footprint-independent resident memory (>= 0).
    scale : float
        Bytes of peak memory per byte of estimated footprint.
    batch : int
        Batch size the model was fitted for (used when predicting from an `Arch`).
    bytes_per_param : float
    kind : {"affine", "proportional"}
    n_points : int
    """

    base_bytes: float
    scale: float
    batch: int
    bytes_per_param: float = BYTES_PER_PARAM
    kind: FitKind = "affine"
    n_points: int = 0

    def predict(self, arch_or_footprint: Arch | float) -> float:
        """Predict peak memory (bytes) for an `Arch` or a footprint in bytes.

        Parameters
        ----------
        arch_or_footprint : Arch or float
            An architecture (params and activations counted, at ``self.batch``) or a
            value of `footprint_bytes`.

        Returns
        -------
        float
        """
        if isinstance(arch_or_footprint, (int, float)):
            value = float(arch_or_footprint)
        else:
            _, params, activations = _arch_counts(arch_or_footprint)
            value = footprint_bytes(params, activations, self.batch, self.bytes_per_param)
        return self.base_bytes + self.scale * value


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


def _records(rows: Rows) -> list[dict[str, Any]]:
    if hasattr(rows, "to_dict") and hasattr(rows, "columns"):
        return list(rows.to_dict("records"))
    return [dict(r) for r in rows]


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


def usable_rows(rows: Rows) -> list[dict[str, Any]]:
    """Return the rows a fit may use: status ``ok`` (or absent) and a finite positive ``median_us``.

    Parameters
    ----------
    rows : iterable of mapping or pandas.DataFrame

    Returns
    -------
    list of dict
    """
    out = []
    for r in _records(rows):
        status = r.get("status")
        if status is not None and not (isinstance(status, float) and math.isnan(status)) and status != "ok":
            continue
        if finite_positive(r.get("median_us")):
            out.append(r)
    return out


def _flops(r: Mapping[str, Any]) -> float:
    if finite_positive(r.get("train_flops")):
        return float(r["train_flops"])
    return float(train_flops_per_example(str(r["model"]), float(r["width"])))


def _footprint(r: Mapping[str, Any], bytes_per_param: float) -> float:
    if finite_positive(r.get("params")) and r.get("activation_elements") is not None:
        params, acts = float(r["params"]), float(r["activation_elements"])
    else:
        params, acts = (float(v) for v in memory_features(str(r["model"]), float(r["width"])))
    return footprint_bytes(params, acts, int(r["batch"]), bytes_per_param)


def _config(r: Mapping[str, Any]) -> ConfigKey:
    return (str(r["model"]), int(r["batch"]), str(r["backend"]))


def _fit_config(
    device: str, rows: list[dict[str, Any]], bytes_per_param: float
) -> tuple[LatencyModel, MemoryModel | None]:
    a, b, kind = fit_line([_flops(r) for r in rows], [float(r["median_us"]) for r in rows])
    widths = tuple(sorted({float(r["width"]) for r in rows}))
    lat = LatencyModel(a, b, kind, len(rows), widths)
    mem_rows = [r for r in rows if finite_positive(r.get("peak_memory_bytes"))]
    mem = None
    if mem_rows:
        c, d, mkind = fit_line(
            [_footprint(r, bytes_per_param) for r in mem_rows], [float(r["peak_memory_bytes"]) for r in mem_rows]
        )
        mem = MemoryModel(c, d, int(mem_rows[0]["batch"]), bytes_per_param, mkind, len(mem_rows))
    return lat, mem


def _group(rows: list[dict[str, Any]]) -> dict[str, dict[ConfigKey, list[dict[str, Any]]]]:
    out: dict[str, dict[ConfigKey, list[dict[str, Any]]]] = {}
    for r in rows:
        out.setdefault(str(r["device"]), {}).setdefault(_config(r), []).append(r)
    return out


def fit(rows: Rows, bytes_per_param: float = BYTES_PER_PARAM) -> dict[str, DeviceModels]:
    """Fit latency and memory models for every device in ``rows``.

    Parameters
    ----------
    rows : iterable of mapping or pandas.DataFrame
        Store rows (see the module docstring); unusable rows are skipped.
    bytes_per_param : float
        Bytes per parameter in the memory footprint (default 16: AdamW, float32).

    Returns
    -------
    dict of str to DeviceModels
    """
    return {
        device: _fit_grouped(device, groups, bytes_per_param) for device, groups in _group(usable_rows(rows)).items()
    }


def _fit_grouped(device: str, groups: Mapping[ConfigKey, list[dict[str, Any]]], bytes_per_param: float) -> DeviceModels:
    models = DeviceModels(device)
    for key, group in groups.items():
        lat, mem = _fit_config(device, group, bytes_per_param)
        models.latency[key] = lat
        if mem is not None:
            models.memory[key] = mem
    return models


def fit_device(rows: Rows, device: str | None = None, bytes_per_param: float = BYTES_PER_PARAM) -> DeviceModels:
    """Fit the models of one device.

    Parameters
    ----------
    rows : iterable of mapping or pandas.DataFrame
    device : str, optional
        Which device to fit; may be omitted when ``rows`` hold exactly one device.
    bytes_per_param : float

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
    return _fit_grouped(device, grouped[device], bytes_per_param)


def predict(
    models: Mapping[str, DeviceModels] | DeviceModels,
    device: str,
    arch: Arch,
    batch: int | None = None,
    backend: str | None = None,
) -> float:
    """Predict per-image latency (us) of ``arch`` on ``device``.

    Parameters
    ----------
    models : dict of str to DeviceModels, or DeviceModels
        From `fit` (or `fit_device`).
    device : str
    arch : Arch
        Any width of a fitted model (measured or not).
    batch, backend : optional
        Needed only when the device was measured in several configurations.

    Returns
    -------
    float
    """
    dm = _device_models(models, device)
    return dm.latency[dm.key(arch.model, batch, backend)].predict(arch)


def predict_memory(
    models: Mapping[str, DeviceModels] | DeviceModels,
    device: str,
    arch: Arch,
    batch: int | None = None,
    backend: str | None = None,
) -> float:
    """Predict peak memory (bytes) of training ``arch`` on ``device`` (see `predict`)."""
    dm = _device_models(models, device)
    return dm.memory[dm.key(arch.model, batch, backend)].predict(arch)


def _device_models(models: Mapping[str, DeviceModels] | DeviceModels, device: str) -> DeviceModels:
    dm = models if isinstance(models, DeviceModels) else models[device]
    if dm.device != device:
        raise KeyError(f"models are of device {dm.device!r}, not {device!r}")
    return dm


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
    relative_error : float
        ``(predicted - measured) / measured``.
    """

    model: str
    batch: int
    backend: str
    width: float
    predicted_us: float
    measured_us: float
    relative_error: float


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
    """

    device: str
    points: tuple[LooPoint, ...]
    median_abs_error: float


def leave_one_out_error(rows: Rows) -> dict[str, LooReport]:
    """Measure prediction error by refitting each configuration without one width at a time.

    Parameters
    ----------
    rows : iterable of mapping or pandas.DataFrame

    Returns
    -------
    dict of str to LooReport
        Per device: each left-out width's prediction, measured median and relative
        error, and the median absolute relative error over them. With two widths the
        refit has one width and uses the proportional model.
    """
    out: dict[str, LooReport] = {}
    for device, groups in _group(usable_rows(rows)).items():
        points: list[LooPoint] = []
        for (model, batch, backend), group in sorted(groups.items()):
            widths = sorted({float(r["width"]) for r in group})
            if len(widths) < 2:
                continue
            for w in widths:
                held = [r for r in group if float(r["width"]) == w]
                rest = [r for r in group if float(r["width"]) != w]
                a, b, _ = fit_line([_flops(r) for r in rest], [float(r["median_us"]) for r in rest])
                predicted = a + b * _flops(held[0])
                measured = float(np.median([float(r["median_us"]) for r in held]))
                points.append(
                    LooPoint(model, batch, backend, w, predicted, measured, (predicted - measured) / measured)
                )
        med = float(np.median([abs(p.relative_error) for p in points])) if points else float("nan")
        out[device] = LooReport(device, tuple(points), med)
    return out


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
        f"{'pred_us':>10} {'meas_us':>10} {'err':>7}"
    ]
    for device, rep in sorted(reports.items()):
        for p in rep.points:
            lines.append(
                f"{device:<16} {p.model:<16} {p.batch:>5} {p.backend:<8} {p.width:>6.3g} "
                f"{p.predicted_us:>10.1f} {p.measured_us:>10.1f} {p.relative_error:>+7.1%}"
            )
        lines.append(f"{device:<16} median |error| {rep.median_abs_error:.1%}")
    return "\n".join(lines)


__all__ = [
    "BYTES_PER_PARAM",
    "DeviceModels",
    "LatencyModel",
    "LooPoint",
    "LooReport",
    "MemoryModel",
    "fit",
    "fit_device",
    "fit_line",
    "footprint_bytes",
    "format_loo",
    "leave_one_out_error",
    "memory_features",
    "predict",
    "predict_memory",
    "train_flops_per_example",
    "usable_rows",
]
