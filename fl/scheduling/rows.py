"""Profile rows as the scheduling modules read them (pure functions).

Every scheduling function takes profiles as a pandas DataFrame
(`harness.store.ProfileStore.latest_cells`), an iterable of row mappings, or the
strategies' ``Profiles`` mapping ``{device: rows}`` (`fl.server.profiles_for`);
`profile_rows` turns any of them into one list of row dicts. Rows need ``device, model,
width, batch, backend, median_us`` (``status``, ``train_flops``, ``peak_memory_bytes``,
``params``, ``activation_elements`` when present); rows whose status is not ``"ok"`` are
ignored for fitting (`harness.latency.usable_rows`). The training FLOPs and the memory
counts at a width come from the rows that measured that width, otherwise from the zoo
(`harness.latency.train_flops_per_example`, `harness.latency.memory_features`), so that a
row's own counts win over a recount.

`predicted_latency` and `predicted_peak` are where the schedulers ask a device's fitted
models (`harness.latency`) about a width, measured or not: a zoo model is predicted from
the architecture of that width (per-layer features), a model outside the zoo from its
rows' training FLOPs.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from exporters.userinput import InputError
from fl.scheduling.checks import same_width
from harness.arch_counts import memory_features, train_flops_per_example
from harness.latency import (
    Estimate,
    LatencyModel,
    MemoryModel,
    finite_positive,
)

#: Status of a cell that ran out of memory (`harness.records.Status`).
OUT_OF_MEMORY = "out of memory"



def select(
    rows: Iterable[Mapping[str, Any]],
    *,
    device: str | None = None,
    model: str | None = None,
    batch: int | None = None,
    backend: str | None = None,
) -> list[dict[str, Any]]:
    """Return copies of the rows matching every given field (``None``: any value).

    Parameters
    ----------
    rows : iterable of mapping
    device, model, batch, backend : optional

    Returns
    -------
    list of dict
        In input order.
    """
    return [
        dict(r)
        for r in rows
        if (device is None or str(r.get("device")) == device)
        and (model is None or str(r.get("model")) == model)
        and (batch is None or int(r.get("batch", -1)) == int(batch))
        and (backend is None or str(r.get("backend")) == backend)
    ]


def status_summary(rows: Sequence[Mapping[str, Any]]) -> str:
    """Count the rows by status, for a reason that names why a device has no usable cell.

    Parameters
    ----------
    rows : sequence of mapping

    Returns
    -------
    str
        ``"2 x no latency, 4 x timeout"``, statuses sorted. It is asked for only about a
        device none of whose rows gave a latency, so an ``ok`` row (or one without a
        status) counts as ``no latency``.
    """
    counts: dict[str, int] = {}
    for r in rows:
        status = r.get("status")
        status = "no latency" if status in (None, "ok") or isinstance(status, float) else str(status)
        counts[status] = counts.get(status, 0) + 1
    return ", ".join(f"{n} x {s}" for s, n in sorted(counts.items()))


def width_flops(model: str, width: float, rows: Iterable[Mapping[str, Any]] = ()) -> float:
    """Return training FLOPs per example of ``model`` at ``width``: measured rows first, then the zoo.

    Parameters
    ----------
    model : str
        Model name.
    width : float
        Width in (0, 1].
    rows : iterable of mapping
        Profile rows; the median ``train_flops`` of the rows of ``model`` at ``width``
        is used when present.

    Returns
    -------
    float

    Raises
    ------
    InputError
        If no row gives the FLOPs and ``model`` is not a zoo model.
    """
    found = [
        float(r["train_flops"])
        for r in rows
        if str(r.get("model")) == model and same_width(r["width"], width) and finite_positive(r.get("train_flops"))
    ]
    if found:
        return float(np.median(found))
    try:
        return float(train_flops_per_example(model, float(width)))
    except InputError as exc:
        raise InputError(f"width {width} of model {model!r}: no measured train_flops and {exc}") from None


def memory_counts(model: str, width: float, rows: Sequence[Mapping[str, Any]] = ()) -> tuple[float, float]:
    """Return ``(params, activation_elements)`` of ``model`` at ``width``: a measured row's first, then the zoo.

    Parameters
    ----------
    model : str
    width : float
    rows : sequence of mapping
        Profile rows; the first row of ``model`` at ``width`` with ``params`` and
        ``activation_elements`` gives the counts.

    Returns
    -------
    tuple of float
    """
    for r in rows:
        if (
            str(r.get("model")) == model
            and same_width(r["width"], width)
            and finite_positive(r.get("params"))
            and r.get("activation_elements") is not None
        ):
            return float(r["params"]), float(r["activation_elements"])
    params, activations = memory_features(model, float(width))
    return float(params), float(activations)


def predicted_latency(
    latency: LatencyModel, model: str, width: float, rows: Sequence[Mapping[str, Any]] = ()
) -> Estimate:
    """Ask a device's latency model for seconds per image of ``model`` at ``width``.

    Parameters
    ----------
    latency : harness.latency.LatencyModel
    model : str
    width : float
        Any width in (0, 1], measured or not.
    rows : sequence of mapping
        Profile rows (the training FLOPs of a model outside the zoo).

    Returns
    -------
    harness.latency.Estimate
        Seconds per image, its uncertainty, and whether it is extrapolated.
    """
    if latency.zoo:
        return latency.predict(float(width))
    return latency.predict_flops(width_flops(model, width, rows))


def predicted_peak(memory: MemoryModel, model: str, width: float, rows: Sequence[Mapping[str, Any]] = ()) -> Estimate:
    """Ask a device's memory model for the peak bytes of training ``model`` at ``width``.

    Parameters
    ----------
    memory : harness.latency.MemoryModel
    model : str
    width : float
    rows : sequence of mapping

    Returns
    -------
    harness.latency.Estimate
    """
    return memory.predict_counts(*memory_counts(model, width, rows))
