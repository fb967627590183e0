"""The linear fit under the latency and memory models: non-negative coefficients with a prior (pure).

`fit_linear` fits measured values on features with a Gaussian prior on each coefficient's
share and reports, per prediction, its mean, standard deviation and how far the features
leave the measured range (`Estimate`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

#: Prior standard deviation of a coefficient's share of the widest measured latency.
PRIOR_SD = 1.0
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


def estimate(fit: LinearFit, x: np.ndarray, what: str) -> Estimate:
    """Return the fit's prediction at features ``x``, flagged when ``x`` leaves the measured range.

    Parameters
    ----------
    fit : LinearFit
    x : numpy.ndarray
        One feature vector, in ``fit.features`` order.
    what : str
        What is predicted, for the note (e.g. ``"width 0.375"``).

    Returns
    -------
    Estimate
        Mean (never below 0) and standard deviation; beyond `EXTRAPOLATION_SLACK` outside
        the range, ``extrapolated`` with a note saying how far (`FAR_FACTOR`).
    """
    value = max(fit.mean(x), 0.0)
    std = fit.std(x)
    factor = fit.outside(x)
    if factor <= 1.0 + EXTRAPOLATION_SLACK:
        return Estimate(value, std)
    far = "far " if factor > FAR_FACTOR else ""
    relative = f"+-{100 * std / value:.0f} %" if value > 0 else f"+-{std:.3g}"
    note = f"{what} {factor:.2g}x {far}outside the measured range: extrapolated, {relative} (one std)"
    return Estimate(value, std, True, note)


