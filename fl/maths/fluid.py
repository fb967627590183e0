"""FLuID's maths: straggler calibration and Invariant Dropout (pure functions, no I/O).

Paper: "FLuID: Mitigating Stragglers in Federated Learning using Invariant Dropout"
(papers/003, section 5, Algorithm 1, Appendices A.2 and A.3).

Straggler calibration (Algorithm 1, lines 18-21)
    From the clients' measured end-to-end round times (compute + transfers), the
    slowest clients are the stragglers; the target time is the next-slowest
    client's time (the slowest non-straggler); each straggler's required speed-up
    is ``T_straggler / T_target``. Times are compared as *full-model* times: a
    client measured while training a sub-model of width ``r`` is re-estimated as
    ``T / r`` (linear rule, Appendix A.3) or ``T * lat(1) / lat(r)`` with its
    device's measured latency-vs-width curve. Only the width-dependent part of a
    time scales; a fixed part (a device runner's start, transfers) is carried
    over unchanged. The sub-model width (`straggler_width`) is

    * linear rule (Appendix A.3, no measured curve): the available width closest
      to ``1 / speed-up``;
    * measured curve: the available width whose predicted time
      ``T_full * lat(r) / lat(1)`` is closest to the target, the same rule in time
      (under the linear model the width closest to ``1 / speed-up`` is the one whose
      time is closest to the target). It may lie above the target, by at most half
      the step between two widths' times: picking the largest width that meets the
      target instead kept the straggler up to a whole step under its target, every
      round, and FLuID asks for its time at the target.

    Both rules give the full model (1.0) when no speed-up is needed.
    **Decision (ties):** two widths equally close to ``1 / speed-up`` (within
    `TIE_TOL`, so that a tie is a tie whatever the floating-point rounding of
    ``1 / speed-up``) resolve to the *smaller* one: under the linear rule it is the
    one predicted to meet the target, and the larger misses it by as much; the curve
    rule breaks its ties (two times equally far from the target) the same way. A
    predicted time within a relative `TIE_TOL` of the target meets it.
    **Decision (one implementation):** this is the project's only straggler
    sizing; an earlier FLOPs-interpolated copy in the scheduling module was used by
    nothing and was removed. The curve is interpolated in *width*, not FLOPs,
    because the profiles a strategy receives may lack FLOPs (and its model may
    not be a zoo model whose FLOPs can be counted); between two measured widths the
    chord of the convex latency curve over-estimates the time, which errs toward
    the smaller width.
    **Decision (the latency model where a width was not measured):** FLuID's widths (0.95,
    0.85, ...) are rarely the measured widths. `profile_predictor` therefore asks the
    device's fitted latency model (`harness.latency`: per-layer features of the width's
    architecture) for a zoo model, and interpolates the measured curve
    (`curve_predictor`) only for a model the zoo does not know.

Invariant neurons (section 5, Algorithm 1 lines 9, 16, 22)
    A weight is invariant at threshold ``th`` when ``|w_client - w_global| <=
    th * |w_global|``; where ``w_global == 0`` that allows no change at all (the
    relative change is 0 for an unchanged weight and infinite otherwise). A
    neuron's change for one client is the largest relative change over its
    incoming weights and bias (the paper's "minimum g" bounding every weight of the
    neuron), so the neuron is invariant for that client iff that change is
    ``<= th``. It is invariant for the round when that holds for at least
    ``quorum`` (75 %) of the non-stragglers; equivalently when its *score*, the
    ``ceil(quorum * N)``-th smallest change over the N non-stragglers, is ``<= th``.
    Thresholds are per layer (neuron group): initialised as the mean, over the
    first calibration rounds, of the minimum change of the layer's neurons
    (Algorithm 1 line 9), then raised in multiplicative steps ``th <- th * (1 +
    step)`` (``step`` = 0.1 by default: the paper gives no step size) until at
    least as many neurons are invariant as the stragglers must drop (line 22).
    Stragglers drop invariant neurons first, least-changing first, and fill up at
    random when there are too few.

"Incoming weights" of a neuron of group ``g`` are the slices, along dimension 0,
of every parameter whose first dimension is indexed by ``g`` (conv filters and
biases, linear rows and biases, the four LSTM gate rows with their recurrent
weights, BatchNorm affine parameters). A dimension indexed by ``g`` elsewhere is
an *input* of the next layer and is not used; in particular a conv -> linear
flatten column belongs to the next layer. Coupled layers (residual additions)
share one group, so their neuron is invariant only if every coupled tensor is.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from exporters.arch import SubModel, make_submodel, size_at_width
from exporters.userinput import InputError
from exporters.zoo import ZooModel
from fl.scheduling.checks import check_widths

#: Sub-model widths of the paper's Table 2 (0.4 also appears in Table 5).
PAPER_WIDTHS = (0.95, 0.85, 0.75, 0.65, 0.5)

#: Fraction of non-stragglers for which a neuron must be invariant (reference: 75 %).
DEFAULT_QUORUM = 0.75

#: Multiplicative threshold increment per step (the paper leaves the step open).
DEFAULT_THRESHOLD_STEP = 0.1

#: Upper bound on increments in one calibration (the loop ends long before in practice).
MAX_THRESHOLD_STEPS = 10_000

#: Predicts per-image training latency (any unit) at a width in (0, 1].
LatencyPredictor = Callable[[float], float]

#: Tolerance of straggler sizing: widths this close to ``1 / speed-up`` tie, and a predicted
#: time within this relative margin of the target meets it.
TIE_TOL = 1e-9


def straggler_count(num_clients: int, num_stragglers: int = 1, fraction: float | None = None) -> int:
    """Return how many of ``num_clients`` are treated as stragglers.

    Parameters
    ----------
    num_clients : int
        Clients with a known round time.
    num_stragglers : int
        Fixed count (the paper's five-phone experiments use one).
    fraction : float, optional
        If given, ``round(fraction * num_clients)`` (at least 1) instead: the paper's
        simulations treat the slowest 20 % as stragglers.

    Returns
    -------
    int
        Between 0 and ``num_clients - 1``: at least one client must set the target.
    """
    if fraction is not None:
        if not 0.0 <= fraction < 1.0:
            raise InputError(f"straggler fraction {fraction!r} is outside [0, 1)")
        wanted = max(1, round(fraction * num_clients)) if fraction > 0 else 0
    else:
        if num_stragglers < 0:
            raise InputError(f"number of stragglers {num_stragglers!r} is negative")
        wanted = num_stragglers
    return max(0, min(wanted, num_clients - 1))


def find_stragglers(times: Mapping[str, float], count: int) -> tuple[list[str], float]:
    """Return the ``count`` slowest clients (slowest first) and the target time.

    Parameters
    ----------
    times : mapping of str to float
        Full-model end-to-end seconds per client.
    count : int
        Number of stragglers (`straggler_count`).

    Returns
    -------
    stragglers : list of str
        Client ids, slowest first; ties broken by client id.
    target : float
        ``T_target``: the time of the next-slowest client, i.e. the slowest client
        that is not a straggler (NaN when every client is a straggler or none is known).
    """
    order = sorted(times, key=lambda cid: (-float(times[cid]), cid))
    count = max(0, min(count, len(order) - 1))
    target = float(times[order[count]]) if len(order) > count else math.nan
    return order[:count], target


def _check_widths(widths: Sequence[float]) -> tuple[float, ...]:
    return tuple(sorted(set(check_widths(widths, "sub-model widths"))))


def _check_seconds(value: float, name: str) -> float:
    seconds = float(value)
    if not (math.isfinite(seconds) and seconds >= 0):
        raise InputError(f"{name} must be a finite number of seconds >= 0; got {value!r}")
    return seconds


def _fixed_part(fixed: float, full_seconds: float) -> float:
    return min(max(float(fixed), 0.0), float(full_seconds))


def linear_width(speedup: float, widths: Sequence[float] = PAPER_WIDTHS) -> float:
    """Return the available width closest to ``1 / speedup`` (Appendix A.3).

    Parameters
    ----------
    speedup : float
        ``T_straggler / T_target`` with the straggler's full-model time (`variable_speedup`).
    widths : sequence of float
        Available sub-model widths.

    Returns
    -------
    float
        1.0 when no speed-up is needed (``speedup <= 1``); otherwise the closest width.
        Widths whose distances differ by at most `TIE_TOL` tie, and the smaller of them
        wins: it is the one the linear rule predicts to meet the target (module docstring).

    Raises
    ------
    InputError
        If ``speedup`` is not positive or a width lies outside (0, 1].
    """
    available = _check_widths(widths)
    if not speedup > 0 or math.isnan(speedup):
        raise InputError(f"speed-up {speedup!r} is not positive")
    if speedup <= 1.0:
        return 1.0
    goal = 0.0 if math.isinf(speedup) else 1.0 / speedup
    nearest = min(abs(s - goal) for s in available)
    return min(s for s in available if abs(s - goal) <= nearest + TIE_TOL)


def curve_predictor(widths: Sequence[float], latencies: Sequence[float]) -> LatencyPredictor:
    """Return a piecewise-linear latency predictor through measured ``(width, latency)`` points.

    Parameters
    ----------
    widths : sequence of float
        Measured widths (at least two distinct).
    latencies : sequence of float
        Per-image latency at each width (positive).

    Returns
    -------
    callable
        ``predict(width)``: linear interpolation, extended along the nearest segment past
        the first and last points, never below 1e-3 of the smallest measured latency.

    Raises
    ------
    InputError
        On fewer than two distinct widths, repeated widths, mismatched lengths or a
        latency that is not positive.
    """
    w = np.asarray(widths, dtype=np.float64)
    lat = np.asarray(latencies, dtype=np.float64)
    if w.shape != lat.shape or w.ndim != 1:
        raise InputError(f"curve needs equally long widths and latencies, got {w.shape} and {lat.shape}")
    if len(np.unique(w)) < 2 or len(np.unique(w)) != len(w):
        raise InputError(f"curve needs at least two distinct widths, got {list(w)}")
    if not np.all(np.isfinite(lat)) or np.any(lat <= 0):
        raise InputError(f"curve latencies must be positive, got {list(lat)}")
    order = np.argsort(w)
    w, lat = w[order], lat[order]
    floor = 1e-3 * float(lat.min())

    def predict(width: float) -> float:
        if width < w[0]:
            slope = (lat[1] - lat[0]) / (w[1] - w[0])
            value = lat[0] + slope * (width - w[0])
        elif width > w[-1]:
            slope = (lat[-1] - lat[-2]) / (w[-1] - w[-2])
            value = lat[-1] + slope * (width - w[-1])
        else:
            value = float(np.interp(width, w, lat))
        return max(float(value), floor)

    return predict


def full_model_seconds(
    seconds: float, width: float, predict: LatencyPredictor | None = None, fixed: float = 0.0
) -> float:
    """Re-estimate a client's full-model time from a time measured on the sub-model at ``width``.

    Parameters
    ----------
    seconds : float
        Measured end-to-end time at ``width``.
    width : float
        Sub-model width the client trained, in (0, 1].
    predict : callable, optional
        The client's latency-vs-width curve; without one the linear rule.
    fixed : float
        The part of ``seconds`` that does not depend on the width (a device runner's start,
        transfers); only the rest scales: ``fixed + (seconds - fixed) * scale``.

    Returns
    -------
    float
        ``fixed + (seconds - fixed) / width`` (linear rule) or ``fixed + (seconds - fixed) *
        predict(1) / predict(width)`` (curve); the inverse of `predicted_seconds`.
    """
    return _rescaled(seconds, width, 1.0, predict, fixed)


def predicted_seconds(
    full_seconds: float, width: float, predict: LatencyPredictor | None = None, fixed: float = 0.0
) -> float:
    """Predict a straggler's time at sub-model ``width`` from its full-model time.

    Parameters
    ----------
    full_seconds : float
        The straggler's (estimated) full-model time.
    width : float
        Sub-model width in (0, 1].
    predict : callable, optional
        Per-image latency at a width; without one the linear rule (time proportional to width).
    fixed : float
        The width-independent part of ``full_seconds`` (clamped to ``[0, full_seconds]``).

    Returns
    -------
    float
        ``fixed + (full_seconds - fixed) * predict(width) / predict(1)``, or ``* width``
        under the linear rule.
    """
    return _rescaled(full_seconds, 1.0, width, predict, fixed)


def _rescaled(seconds: float, width: float, new_width: float, predict: LatencyPredictor | None, fixed: float) -> float:
    """Carry a time measured at ``width`` over to ``new_width``: only the part above ``fixed`` scales."""
    check_widths((width, new_width), "sub-model widths")
    fixed = _fixed_part(fixed, seconds)
    scale = new_width / width if predict is None else predict(new_width) / predict(width)
    return fixed + (float(seconds) - fixed) * scale


def curve_width(
    full_seconds: float,
    target_seconds: float,
    widths: Sequence[float],
    predict: LatencyPredictor,
    fixed: float = 0.0,
) -> float:
    """Return the width whose predicted time is closest to the target, from a measured curve.

    Parameters
    ----------
    full_seconds : float
        The straggler's (estimated) full-model time.
    target_seconds : float
        ``T_target``.
    widths : sequence of float
        Available sub-model widths; 1.0 is always a candidate.
    predict : callable
        Per-image latency at a width (`curve_predictor` or any model of it).
    fixed : float
        The width-independent part of ``full_seconds`` (see `full_model_seconds`).

    Returns
    -------
    float
        1.0 when ``full_seconds`` meets the target (within a relative `TIE_TOL`);
        otherwise the candidate whose `predicted_seconds` is closest to
        ``target_seconds``. Candidates whose distances differ by at most a relative
        `TIE_TOL` of the target tie, and the smaller wins (it meets the target).

    Raises
    ------
    InputError
        On a negative or non-finite time, or a width outside (0, 1].
    """
    available = _check_widths(widths)
    full = _check_seconds(full_seconds, "full_seconds")
    target = _check_seconds(target_seconds, "target_seconds")
    if full <= target * (1.0 + TIE_TOL):
        return 1.0
    distance = {s: abs(predicted_seconds(full, s, predict, fixed) - target) for s in {*available, 1.0}}
    nearest = min(distance.values())
    return min(s for s, d in distance.items() if d <= nearest + TIE_TOL * target)


def variable_speedup(full_seconds: float, target_seconds: float, fixed: float = 0.0) -> float:
    """Return the speed-up the width-dependent part of a straggler's time needs.

    Parameters
    ----------
    full_seconds, target_seconds : float
        The straggler's full-model time and the target time.
    fixed : float
        The width-independent part of ``full_seconds``.

    Returns
    -------
    float
        ``(full - fixed) / (target - fixed)`` (Appendix A.3's ``T / T_target`` when ``fixed``
        is 0); infinite when the target is not above the fixed part (no width can meet it).

    Raises
    ------
    InputError
        On a negative or non-finite time.
    """
    full = _check_seconds(full_seconds, "full_seconds")
    target = _check_seconds(target_seconds, "target_seconds")
    fixed = _fixed_part(fixed, full)
    if target <= fixed:
        return math.inf
    return (full - fixed) / (target - fixed)


def straggler_width(
    full_seconds: float,
    target_seconds: float,
    widths: Sequence[float],
    predict: LatencyPredictor | None = None,
    fixed: float = 0.0,
) -> float:
    """Size a straggler's sub-model: the curve rule with a measured curve, else the linear rule.

    Parameters
    ----------
    full_seconds : float
        The straggler's (estimated) full-model time (`full_model_seconds`).
    target_seconds : float
        ``T_target`` (`find_stragglers`).
    widths : sequence of float
        Available sub-model widths in (0, 1].
    predict : callable, optional
        The device's latency-vs-width curve (`curve_predictor`); None selects the linear rule.
    fixed : float
        The width-independent part of ``full_seconds``.

    Returns
    -------
    float
        `curve_width` with ``predict``, otherwise `linear_width` of `variable_speedup`
        (ties and tolerances in the module docstring); 1.0 when no speed-up is needed.
    """
    if predict is not None:
        return curve_width(full_seconds, target_seconds, widths, predict, fixed)
    return linear_width(variable_speedup(full_seconds, target_seconds, fixed), widths)


def _profile_series(
    rows: Sequence[Mapping[str, Any]], model: str, batch: int | None
) -> list[Mapping[str, Any]] | None:
    """Return the measured rows of the one (backend, batch) series `profile_curve` describes."""
    series: dict[tuple[str, int], list[Mapping[str, Any]]] = {}
    for row in rows:
        if row.get("model") != model or row.get("status", "ok") != "ok":
            continue
        latency = row.get("median_us")
        width = row.get("width")
        if latency is None or width is None or not math.isfinite(float(latency)) or float(latency) <= 0:
            continue
        key = (str(row.get("backend", "")), int(row.get("batch", 0) or 0))
        series.setdefault(key, []).append(row)
    widths = {k: {float(r["width"]) for r in v} for k, v in series.items()}
    usable = {k: v for k, v in series.items() if len(widths[k]) >= 2}
    if not usable:
        return None
    preferred = sorted(k for k in usable if batch is not None and k[1] == batch)
    key = preferred[0] if preferred else min(usable, key=lambda k: (-len(widths[k]), k))
    return usable[key]


def profile_curve(
    rows: Sequence[Mapping[str, Any]], model: str, batch: int | None = None
) -> tuple[tuple[float, ...], tuple[float, ...]] | None:
    """Return one device's latency-vs-width curve for ``model`` from its profile rows.

    Parameters
    ----------
    rows : sequence of mapping
        ``ProfileStore.latest_cells`` records of one device (keys ``model``,
        ``width``, ``batch``, ``backend``, ``status``, ``median_us``).
    model : str
        Zoo model name.
    batch : int, optional
        Preferred batch size (the run's local batch size).

    Returns
    -------
    (widths, latencies) or None
        Per width the median of ``median_us`` over the chosen (backend, batch)
        series: the preferred batch if it has at least two widths, otherwise the
        series with the most widths (ties: smallest backend name, then batch).
        None when no series has two measured widths.
    """
    series = _profile_series(rows, model, batch)
    if series is None:
        return None
    points: dict[float, list[float]] = {}
    for row in series:
        points.setdefault(float(row["width"]), []).append(float(row["median_us"]))
    ordered = sorted(points.items())
    return tuple(w for w, _ in ordered), tuple(float(np.median(v)) for _, v in ordered)


def profile_predictor(
    rows: Sequence[Mapping[str, Any]], model: str, batch: int | None = None
) -> LatencyPredictor | None:
    """Return one device's latency-vs-width predictor for ``model`` from its profile rows.

    Parameters
    ----------
    rows : sequence of mapping
        ``ProfileStore.latest_cells`` records of one device.
    model : str
        Model name.
    batch : int, optional
        Preferred batch size (the run's local batch size).

    Returns
    -------
    callable or None
        For a zoo model, the device's latency model (`harness.latency`) fitted on the
        series `profile_curve` picks, as ``predict(width) -> seconds per image``; for any
        other model the piecewise-linear `curve_predictor` through that series. None when
        no series has two measured widths.
    """
    from exporters.userinput import InputError as ZooError
    from exporters.zoo import get_model
    from harness.latency import fit_device

    series = _profile_series(rows, model, batch)
    if series is None:
        return None
    try:
        get_model(model)
    except (ZooError, KeyError):
        curve = profile_curve(series, model)
        assert curve is not None  # the series has two widths
        return curve_predictor(*curve)
    latency = fit_device([{**r, "device": "device"} for r in series]).latency_model(model)
    return lambda width: latency.predict(float(width)).value


def relative_change(new: np.ndarray, old: np.ndarray) -> np.ndarray:
    """Return ``|new - old| / |old|`` elementwise, guarding ``old == 0``.

    Where ``old == 0`` the result is 0 if the weight did not change and ``inf``
    otherwise, so that ``|new - old| <= th * |old|`` holds exactly when the result
    is ``<= th`` for every finite ``th >= 0``.
    """
    old64 = np.asarray(old, dtype=np.float64)
    diff = np.abs(np.asarray(new, dtype=np.float64) - old64)
    scale = np.abs(old64)
    out = np.full(diff.shape, np.inf)
    nonzero = scale > 0
    out[nonzero] = diff[nonzero] / scale[nonzero]
    out[~nonzero & (diff == 0)] = 0.0
    return out


def neuron_changes(
    model: ZooModel, client_params: Mapping[str, np.ndarray], global_params: Mapping[str, np.ndarray]
) -> dict[str, np.ndarray]:
    """Return, per neuron group, each neuron's largest relative change over its incoming weights.

    Parameters
    ----------
    model : ZooModel
    client_params : mapping of str to numpy.ndarray
        Full-width parameters a client returned.
    global_params : mapping of str to numpy.ndarray
        The full-width parameters it was sent.

    Returns
    -------
    dict of str to numpy.ndarray
        ``{group: float64 array of K}``; a neuron is invariant for this client at
        ``th`` iff its entry is ``<= th``. A group without incoming weights gets ``inf``.
    """
    sizes = dict(model.groups)
    out = {g: np.full(k, -np.inf) for g, k in sizes.items()}
    for name, layout in model.layouts.items():
        if not layout or layout[0] is None:
            continue
        dim = layout[0]
        if name not in client_params or name not in global_params:
            raise InputError(f"{model.name}: parameter {name!r} missing from the update")
        new, old = np.asarray(client_params[name]), np.asarray(global_params[name])
        if new.shape != old.shape:
            raise InputError(f"{model.name}: {name!r} has shape {new.shape}, global {old.shape}")
        rel = relative_change(new, old)
        k = sizes[dim.group]
        # dim 0 is (blocks, K, inner): LSTM gate blocks, the neuron, positions per neuron
        per_neuron = rel.reshape(dim.blocks, k, dim.inner, -1).max(axis=(0, 2, 3))
        out[dim.group] = np.maximum(out[dim.group], per_neuron)
    return {g: np.where(np.isneginf(v), np.inf, v) for g, v in out.items()}


def invariance_scores(
    changes: Sequence[Mapping[str, np.ndarray]], quorum: float = DEFAULT_QUORUM
) -> dict[str, np.ndarray]:
    """Combine non-stragglers' neuron changes into one score per neuron.

    Parameters
    ----------
    changes : sequence of mapping
        `neuron_changes` of every non-straggler of the round.
    quorum : float
        Fraction of non-stragglers for which a neuron must be invariant, in (0, 1].

    Returns
    -------
    dict of str to numpy.ndarray
        Per group, the ``ceil(quorum * N)``-th smallest change of each neuron: the
        neuron is invariant at ``th`` (for at least ``quorum`` of the N clients)
        iff its score is ``<= th``.
    """
    if not 0.0 < quorum <= 1.0:
        raise InputError(f"invariance quorum {quorum!r} is outside (0, 1]")
    if not changes:
        raise InputError("no non-straggler updates to find invariant neurons in")
    need = max(1, math.ceil(quorum * len(changes) - 1e-9))
    out: dict[str, np.ndarray] = {}
    for group in changes[0]:
        stacked = np.sort(np.stack([np.asarray(c[group], dtype=np.float64) for c in changes]), axis=0)
        out[group] = stacked[need - 1]
    return out


def minimum_changes(changes: Sequence[Mapping[str, np.ndarray]]) -> dict[str, float]:
    """Return per group the smallest finite neuron change over all clients (Algorithm 1, line 9).

    Returns
    -------
    dict of str to float
        NaN for a group whose changes are all infinite.
    """
    out: dict[str, float] = {}
    for group in changes[0] if changes else {}:
        values = np.concatenate([np.asarray(c[group], dtype=np.float64).ravel() for c in changes])
        finite = values[np.isfinite(values)]
        out[group] = float(finite.min()) if finite.size else math.nan
    return out


def invariant_count(scores: np.ndarray, threshold: float) -> int:
    """Return how many neurons are invariant at ``threshold``."""
    return int(np.count_nonzero(np.asarray(scores) <= threshold))


def raise_threshold(threshold: float, scores: np.ndarray, needed: int, step: float = DEFAULT_THRESHOLD_STEP) -> float:
    """Raise a layer's threshold in steps until at least ``needed`` neurons are invariant.

    Parameters
    ----------
    threshold : float
        Current threshold (>= 0); it is never lowered.
    scores : numpy.ndarray
        The layer's `invariance_scores`.
    needed : int
        Neurons the stragglers must drop from this layer.
    step : float
        Each step multiplies the threshold by ``1 + step``; a zero threshold first
        jumps to the smallest positive finite score.

    Returns
    -------
    float
        The first threshold of the sequence with ``invariant_count >= needed``, or
        the last one tried when that is impossible (too few finite scores).
    """
    if step <= 0:
        raise InputError(f"threshold step {step!r} is not positive")
    finite = np.sort(np.asarray(scores, dtype=np.float64)[np.isfinite(scores)])
    needed = min(int(needed), finite.size)
    if needed <= 0 or invariant_count(scores, threshold) >= needed:
        return float(threshold)
    goal = float(finite[needed - 1])
    th = float(threshold)
    for _ in range(MAX_THRESHOLD_STEPS):
        if th >= goal:
            break
        if th <= 0:
            positive = finite[finite > 0]
            th = float(positive[0])
        else:
            th *= 1.0 + step
    return th


def invariant_keep(scores: np.ndarray, threshold: float, kept: int, rng: np.random.Generator) -> np.ndarray:
    """Return the ``kept`` neurons a straggler keeps: invariant ones dropped first, then random.

    Parameters
    ----------
    scores : numpy.ndarray
        The layer's invariance scores (K entries).
    threshold : float
        The layer's threshold.
    kept : int
        Neurons to keep.
    rng : numpy.random.Generator
        Draws the fill when fewer than ``K - kept`` neurons are invariant.

    Returns
    -------
    numpy.ndarray
        Sorted int64 kept indices. Dropped: the invariant neurons with the smallest
        scores (ties by index), then non-invariant neurons drawn uniformly.
    """
    scores = np.asarray(scores, dtype=np.float64)
    size = scores.size
    if not 1 <= kept <= size:
        raise InputError(f"{kept!r} kept neurons outside [1, {size}]")
    n_drop = size - kept
    invariant = np.flatnonzero(scores <= threshold)
    invariant = invariant[np.lexsort((invariant, scores[invariant]))]
    dropped = invariant[:n_drop]
    short = n_drop - dropped.size
    if short > 0:
        others = np.setdiff1d(np.arange(size), dropped)
        dropped = np.concatenate([dropped, rng.choice(others, size=short, replace=False)])
    keep = np.setdiff1d(np.arange(size, dtype=np.int64), dropped)
    return keep.astype(np.int64)


def invariant_submodel(
    model: ZooModel,
    width: float,
    scores: Mapping[str, np.ndarray] | None,
    thresholds: Mapping[str, float],
    rng: np.random.Generator,
) -> SubModel:
    """Return a straggler's Invariant Dropout sub-model at ``width``.

    Parameters
    ----------
    model : ZooModel
    width : float
        Sub-model width in (0, 1]; each group keeps ``ceil(width * K)`` neurons.
    scores : mapping of str to numpy.ndarray or None
        Per-group invariance scores; None (nothing measured yet) drops at random.
    thresholds : mapping of str to float
        Per-group thresholds (a missing group has no invariant neurons).
    rng : numpy.random.Generator
        Random fill, drawn group by group in model order.

    Returns
    -------
    SubModel
        Built with `exporters.arch.make_submodel`. The zoo layouts map a conv ->
        linear flatten channel-major (NCHW), so dropping a channel drops its whole
        block of linear columns; the FLuID reference maps it in the wrong order and
        this project does not repeat that.
    """
    arch = model.arch(width)
    indices: list[Any] = []
    for (group, size), kept in zip(model.groups, arch.sizes, strict=True):
        layer = np.full(size, np.inf) if scores is None or group not in scores else scores[group]
        indices.append(invariant_keep(layer, float(thresholds.get(group, -np.inf)), kept, rng))
    return make_submodel(arch, model.group_sizes, indices)


def neurons_to_drop(model: ZooModel, widths: Sequence[float]) -> dict[str, int]:
    """Return per group the most neurons any of ``widths`` drops (``K - ceil(w*K)``)."""
    return {group: max((size - size_at_width(w, size) for w in widths), default=0) for group, size in model.groups}
