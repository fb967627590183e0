"""What a campaign tells its user: one line per finished cell as it goes, and a table of the cells at the end."""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from harness.records import BenchSpec, Measurement


@dataclass(frozen=True)
class CellEvent:
    """Progress of one device: a cell just finished (measured or failed).

    Attributes
    ----------
    device : str
        Device name.
    done : int
        Cells of this device finished so far in this run (this one included).
    total : int
        Cells of this device to run in this run.
    measurement : Measurement
        The stored result of the cell.
    """

    device: str
    done: int
    total: int
    measurement: Measurement


def per_image_us(measurement: Measurement) -> float | None:
    """Median per-image training time of a measured cell in microseconds (None if failed)."""
    if not measurement.ok or not measurement.step_seconds:
        return None
    from harness.stats import summarize

    stats = summarize(measurement.step_seconds, measurement.spec.batch)
    return float(stats.median_us)


def format_event(event: CellEvent) -> str:
    """One progress line, e.g. ``[fast] 2/4 w0.50 b20 ort ok 812 us/img +-1.2 %``.

    Parameters
    ----------
    event : CellEvent

    Returns
    -------
    str
    """
    m = event.measurement
    spec = m.spec
    head = f"[{event.device}] {event.done}/{event.total} w{spec.width:.2f} b{spec.batch} {spec.backend}"
    if m.ok:
        us = per_image_us(m)
        text = f"{head} ok" + (f" {us:.0f} us/img" if us is not None else "")
        if m.precision_achieved is not None:
            text += f" +-{100 * m.precision_achieved:.1f} %"
        if not m.isolation.get("alone", True):
            text += " (concurrent with " + ", ".join(m.isolation.get("concurrent_with") or ()) + ")"
        return text + (f"; {m.message}" if m.imprecise else "")
    return f"{head} {m.status}: {m.message}"


def print_progress(event: CellEvent) -> None:
    """Default progress callback: one line per finished cell on stderr."""
    print(format_event(event), file=sys.stderr, flush=True)


def summary_table(cells: Any, specs: Sequence[BenchSpec]) -> str:
    """Format the stored cells of ``specs`` as a device x width table.

    Parameters
    ----------
    cells : pandas.DataFrame
        `ProfileStore.latest_cells` (one row per cell key, latest attempt).
    specs : sequence of BenchSpec
        The campaign's cells, in plan order.

    Returns
    -------
    str
        One row per cell: median per-image latency (us), energy per image (mJ, followed by
        ``(emulated)`` for an emulated device's sensor; the column only when some cell
        carries energy), the half-width of the median's 95 % interval (%), p95 latency
        (us), peak memory (MB), status (``ok, imprecise`` for a cell that missed its
        precision; ``energy: <flag>`` after it for a cell whose energy was flagged).
    """
    import pandas as pd

    def present(value: Any) -> bool:
        return value is not None and not bool(pd.isna(value))

    by_key = {}
    if len(cells):
        for row in cells.to_dict("records"):
            by_key[row["cell_key"]] = row
    rows = [by_key.get(spec.cell_key()) for spec in specs]
    energy = any(
        row is not None and (present(row.get("energy_j_per_image")) or present(row.get("energy_flag"))) for row in rows
    )
    header = (
        f"{'device':<16} {'width':>6} {'batch':>5} {'backend':<7} {'median us':>10} "
        + (f"{'mJ/img':>19} " if energy else "")
        + f"{'+-%':>5} {'p95 us':>10} {'peak MB':>8}  status"
    )
    lines = [header]
    for spec, row in zip(specs, rows, strict=True):

        def num(name: str, scale: float = 1.0, row: Mapping[str, Any] | None = row) -> str:
            value = None if row is None else row.get(name)
            return f"{float(value) / scale:.0f}" if value is not None and present(value) else "-"

        status = "not run" if row is None else str(row.get("status"))
        if row is not None and bool(row.get("imprecise")):
            status += ", imprecise"
        achieved = None if row is None else row.get("precision_achieved")
        precision = "-" if achieved is None or bool(pd.isna(achieved)) else f"{100 * float(achieved):.1f}"
        joules = "-"
        if row is not None and present(row.get("energy_j_per_image")):
            emulated = present(row.get("energy_emulated")) and bool(row.get("energy_emulated"))
            joules = f"{1e3 * float(row['energy_j_per_image']):.3g}" + (" (emulated)" if emulated else "")
        if row is not None and present(row.get("energy_flag")):
            status += f", energy: {row['energy_flag']}"
        lines.append(
            f"{spec.device:<16} {spec.width:>6.2f} {spec.batch:>5} {spec.backend:<7} {num('median_us'):>10} "
            + (f"{joules:>19} " if energy else "")
            + f"{precision:>5} {num('p95_us'):>10} {num('peak_memory_bytes', 1e6):>8}  {status}"
        )
    return "\n".join(lines)
