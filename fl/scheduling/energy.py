"""Energy per image per width from the profiles, and a client round's predicted energy (pure functions).

The profile store's latest cells carry a cell's energy (`harness.store`: the nullable columns
``energy_j_per_image``, ``energy_flag`` and ``energy_emulated``; a flagged cell's joules are
null and its ``energy_flag`` says why). `energy_cells` reads them once into `EnergyCell`
records, one per (device, model, width) — the median of the width's measured cells —
and `energy_curves` gathers each device's cells of a model into an `EnergyCurve`.

A curve gives the energy per image at any width::

    energy(w) = interpolated linearly in training FLOPs per example between the two
                measured widths around w;
                outside the measured widths: the nearest measured width's joules per FLOP x FLOPs(w)

so a measured width gets exactly its measurement, and a width beyond them is marked
extrapolated (`EnergyEstimate.extrapolated`; a plan names it). A client round trains
``epochs * examples`` images (the plan's ``steps * batch``, `fl.population.full_batch_steps`),
so its predicted energy is `round_energy`: energy per image at its width times those images.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from fl.scheduling.checks import same_width
from harness.latency import ProfileRows, finite_positive, profile_rows


@dataclass(frozen=True)
class EnergyCell:
    """The energy per image one device spent training one model at one width.

    Attributes
    ----------
    device, model : str
    width : float
    joules_per_image : float or None
        The median over the width's latest cells with a reading; None when every one of
        them was flagged or had no sensor.
    emulated : bool
        A reading came from an emulated sensor.
    flag : str or None
        The flag of a cell without joules (e.g. ``"external-power"``), when no cell of the
        width has joules.
    train_flops : float or None
        Training FLOPs per example the cells recorded.
    """

    device: str
    model: str
    width: float
    joules_per_image: float | None
    emulated: bool = False
    flag: str | None = None
    train_flops: float | None = None


@dataclass(frozen=True)
class EnergyEstimate:
    """A curve's energy per image at one width.

    Attributes
    ----------
    joules_per_image : float
    extrapolated : bool
        The width lies outside the device's measured widths.
    """

    joules_per_image: float
    extrapolated: bool = False


@dataclass(frozen=True)
class EnergyCurve:
    """One device's measured energy per image of one model over training FLOPs per example.

    Attributes
    ----------
    device, model : str
    points : tuple of (float, float, float)
        ``(width, train FLOPs per example, joules per image)``, by FLOPs; at least one.
    emulated : bool
        A point came from an emulated sensor.
    """

    device: str
    model: str
    points: tuple[tuple[float, float, float], ...]
    emulated: bool = False

    @property
    def widths(self) -> tuple[float, ...]:
        """The measured widths, by FLOPs."""
        return tuple(p[0] for p in self.points)

    def at_flops(self, flops: float) -> EnergyEstimate:
        """Return the energy per image at ``flops`` training FLOPs per example (see the module docstring)."""
        points = self.points
        low, high = points[0], points[-1]
        if flops < low[1] or flops > high[1]:
            near = low if flops < low[1] else high
            return EnergyEstimate(near[2] / near[1] * flops, extrapolated=True)
        for (_, f0, e0), (_, f1, e1) in zip(points, points[1:], strict=False):
            if f0 <= flops <= f1:
                share = 0.0 if f1 == f0 else (flops - f0) / (f1 - f0)
                return EnergyEstimate(e0 + share * (e1 - e0))
        return EnergyEstimate(low[2])  # a single point, flops equal to its own

    def at(self, width: float, flops_at: Callable[[float], float]) -> EnergyEstimate:
        """Return the energy per image at ``width`` (a measured width exactly, else `at_flops`).

        Parameters
        ----------
        width : float
        flops_at : callable
            ``width -> training FLOPs per example`` of the model.
        """
        for w, _, joules in self.points:
            if same_width(w, width):
                return EnergyEstimate(joules)
        return self.at_flops(float(flops_at(width)))


def energy_cells(cells: ProfileRows) -> list[EnergyCell]:
    """Return the energy of every (device, model, width) of the store's latest cells.

    Parameters
    ----------
    cells : DataFrame or rows
        The store's latest cells (`harness.store.ProfileStore.latest_cells`) or any form
        `harness.latency.profile_rows` accepts; cells without the energy columns (a store
        written before them) count as cells without a reading.

    Returns
    -------
    list of EnergyCell
        One per (device, model, width), in order of first appearance. Only cells of status
        ``ok`` count.
    """
    groups: dict[tuple[str, str, float], list[dict[str, Any]]] = {}
    for row in profile_rows(cells):
        if row.get("status") != "ok" or row.get("width") is None:
            continue
        key = (str(row.get("device")), str(row.get("model")), float(row["width"]))
        groups.setdefault(key, []).append(row)
    out = []
    for (device, model, width), rows in groups.items():
        read = [r for r in rows if finite_positive(r.get("energy_j_per_image"))]
        flops = [float(r["train_flops"]) for r in rows if finite_positive(r.get("train_flops"))]
        flags = [str(r["energy_flag"]) for r in rows if r.get("energy_flag")]
        out.append(
            EnergyCell(
                device, model, width,
                joules_per_image=statistics.median(float(r["energy_j_per_image"]) for r in read) if read else None,
                emulated=any(bool(r.get("energy_emulated")) for r in read),
                flag=None if read else (flags[0] if flags else None),
                train_flops=statistics.median(flops) if flops else None,
            )  # fmt: skip
        )
    return out


def energy_curves(
    cells: Iterable[EnergyCell], model: str, flops_at: Callable[[float], float]
) -> dict[str, EnergyCurve]:
    """Return each device's `EnergyCurve` of ``model`` (devices without a reading at any width are left out).

    Parameters
    ----------
    cells : iterable of EnergyCell
    model : str
    flops_at : callable
        ``width -> training FLOPs per example``, for a cell that did not record its FLOPs.

    Returns
    -------
    dict of str to EnergyCurve
    """
    points: dict[str, list[tuple[float, float, float]]] = {}
    emulated: dict[str, bool] = {}
    for cell in cells:
        if cell.model != model or cell.joules_per_image is None:
            continue
        flops = cell.train_flops if cell.train_flops is not None else float(flops_at(cell.width))
        points.setdefault(cell.device, []).append((cell.width, flops, cell.joules_per_image))
        emulated[cell.device] = emulated.get(cell.device, False) or cell.emulated
    return {
        device: EnergyCurve(device, model, tuple(sorted(p, key=lambda t: t[1])), emulated[device])
        for device, p in points.items()
    }


def missing_energy(cells: Iterable[EnergyCell], device: str, model: str) -> str:
    """Return why ``device`` has no energy of ``model``: its cells' flags, or that none was measured.

    Parameters
    ----------
    cells : iterable of EnergyCell
    device, model : str

    Returns
    -------
    str
        One line naming the device and the model.
    """
    flags = sorted({f"width {c.width:g}: {c.flag}" for c in cells if (c.device, c.model) == (device, model) and c.flag})
    why = "; ".join(flags) if flags else "no cell with an energy reading (no power sensor, or profiled without one)"
    return f"no energy per image of {model} on {device}: {why}"


def round_images(examples: int, epochs: int) -> int:
    """Return the images a client round trains: every example of its shard, each epoch (``steps * batch``)."""
    return int(epochs) * int(examples)


def round_energy(
    curve: EnergyCurve,
    widths: Sequence[float],
    images: int,
    flops_at: Callable[[float], float],
    shares: Sequence[float] | None = None,
) -> tuple[float, bool]:
    """Return a client round's predicted energy in joules: energy per image x images trained.

    Parameters
    ----------
    curve : EnergyCurve
        The device's.
    widths : sequence of float
        The widths its steps train (one width for a static sub-model; FjORD's widths at or
        below its capacity).
    images : int
        Images trained in the round (`round_images`).
    flops_at : callable
        ``width -> training FLOPs per example``.
    shares : sequence of float, optional
        The steps trained at each width (default: equal shares, as a FjORD plan draws them).

    Returns
    -------
    joules : float
    extrapolated : bool
        Whether any width lies outside the measured ones.
    """
    estimates = [curve.at(w, flops_at) for w in widths]
    weights = [1.0] * len(estimates) if shares is None else [float(s) for s in shares]
    per_image = sum(w * e.joules_per_image for w, e in zip(weights, estimates, strict=True)) / sum(weights)
    return per_image * int(images), any(e.extrapolated for e in estimates)


#: Standard deviations of a FjORD round's mean energy per image that an energy budget covers
#: (`drawn_energy_bound`): about 97.7 % of rounds stay within it.
DRAW_MARGIN_SD = 2.0


def drawn_energy_bound(
    curve: EnergyCurve,
    widths: Sequence[float],
    images: int,
    steps: int,
    flops_at: Callable[[float], float],
    margin_sd: float = DRAW_MARGIN_SD,
) -> float:
    """Return the energy a client round that draws one of ``widths`` per step stays within.

    A FjORD client draws a width uniformly per step, so its round's energy is the mean of
    ``steps`` draws of the per-image energy, times the images: it has the expected energy
    (`round_energy`) as its mean and ``sd / sqrt(steps)`` of the per-image energies across
    ``widths`` as its spread. The bound is the mean plus ``margin_sd`` such spreads: an
    energy budget that holds the bound holds for the round's draw, not only on average.

    Parameters
    ----------
    curve : EnergyCurve
        The device's.
    widths : sequence of float
        The widths the client draws from (at or below its capacity).
    images : int
        Images trained in the round (`round_images`).
    steps : int
        Steps of the round (one draw each).
    flops_at : callable
        ``width -> training FLOPs per example``.
    margin_sd : float
        Spreads of the mean added to it.

    Returns
    -------
    float
        Joules.
    """
    per_image = [curve.at(w, flops_at).joules_per_image for w in widths]
    mean = sum(per_image) / len(per_image)
    sd = math.sqrt(sum((e - mean) ** 2 for e in per_image) / len(per_image))
    return (mean + margin_sd * sd / math.sqrt(max(1, int(steps)))) * int(images)
