"""The cells view: one stored cell as a row of `ProfileStore.latest_cells`, statistics derived.

Statistics are never stored: a cell row holds the runner's raw samples, and this module
derives from them, on every read, what the view shows (`harness.stats.summarize`, the mean
of the pass medians, the CPU time per image). The view's columns and dtypes are
`harness.store_schema.CELL_COLUMNS` and `CELL_DTYPES`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from harness.passes import undisturbed
from harness.records import Measurement
from harness.runner.sampling import median_of_sorted
from harness.stats import summarize
from harness.store_schema import CELL_COLUMNS, CELL_DTYPES, STAT_COLUMNS

if TYPE_CHECKING:
    import pandas as pd


def cell_cpu_seconds(measurement: Measurement) -> list[float]:
    """Return a measured cell's CPU seconds per step, of the samples that count.

    Parameters
    ----------
    measurement : Measurement
        A cell whose runner document may carry ``cpu_step_seconds`` (one per sample) and
        ``disturbed`` (the runner's or the pooled passes' flags, one per sample).

    Returns
    -------
    list of float
        The undisturbed samples' CPU seconds per step, as `Measurement.step_seconds` keeps
        their wall seconds; empty for a failed cell or a runner without CPU times.
    """
    runner = measurement.runner
    cpu = list(runner.cpu_step_seconds)
    if measurement.status != "ok" or len(cpu) != len(runner.step_seconds):
        return []
    return undisturbed(cpu, runner)


def _pass_mean_us(measurement: Measurement, median_us: float) -> float:
    """Return the mean of a cell's pass medians per image (its ``median_us`` without two passes)."""
    medians = [v for v in measurement.runner.pass_medians if v is not None]
    if measurement.status != "ok" or len(medians) < 2:
        return median_us
    return sum(medians) / len(medians) / measurement.spec.batch * 1e6


def _cpu_median_us(measurement: Measurement) -> float:
    cpu = sorted(cell_cpu_seconds(measurement))
    return median_of_sorted(cpu) / measurement.spec.batch * 1e6 if cpu else math.nan


def model_memory(peak_bytes: int | None, runtime_bytes: int | None) -> int | None:
    """Return what a cell's model added to its process's peak memory (pure).

    Parameters
    ----------
    peak_bytes : int or None
        The process's peak resident set over the cell.
    runtime_bytes : int or None
        Its peak before the model was opened (the runner's ``runtime_memory_bytes``).

    Returns
    -------
    int or None
        ``peak_bytes - runtime_bytes``, at least 0; None when either is unknown.
    """
    if peak_bytes is None or runtime_bytes is None:
        return None
    return max(0, int(peak_bytes) - int(runtime_bytes))


def _nan_if_none(value: float | None) -> float:
    return math.nan if value is None else value


def view_record(
    m: Measurement,
    *,
    cell_key: str,
    campaign_id: int,
    campaign_versions: Mapping[str, Any],
    campaign_git_commit: str | None,
    energy: Mapping[str, Any],
) -> dict[str, Any]:
    """Return one cell's row of the cells view.

    Parameters
    ----------
    m : Measurement
        The cell's stored attempt, rebuilt.
    cell_key, campaign_id : str, int
        Its key and campaign, as stored.
    campaign_versions, campaign_git_commit : mapping, str or None
        The campaign's provenance, which a cell that recorded none falls back to.
    energy : mapping
        The cell's stored `harness.store_schema.ENERGY_COLUMNS`, shown as they are.

    Returns
    -------
    dict
        A value for every name of `CELL_COLUMNS` (see `ProfileStore.latest_cells` for what
        each means).
    """
    versions = dict(m.versions) or dict(campaign_versions)
    isolation = m.isolation
    record: dict[str, Any] = {
        "device": m.spec.device,
        "model": m.spec.model,
        "width": m.spec.width,
        "batch": m.spec.batch,
        "backend": m.spec.backend,
        "status": m.status,
        "peak_memory_bytes": m.peak_memory_bytes,
        "peak_memory_source": m.peak_memory_source,
        "runtime_memory_bytes": m.runner.runtime_memory_bytes,
        "model_memory_bytes": model_memory(m.peak_memory_bytes, m.runner.runtime_memory_bytes),
        "throttled": m.throttled,
        "matmul_gflops": _nan_if_none(m.matmul_gflops),
        "train_flops": _nan_if_none(m.runner.train_flops),
        "message": m.message,
        "arch_sizes": ",".join(str(w) for w in m.spec.arch_sizes),
        "threads": m.spec.threads,
        "warmup": m.spec.warmup,
        "steps": m.spec.steps,
        "optimizer": m.spec.optimizer,
        "data": m.spec.data,
        "cell_key": cell_key,
        "campaign_id": campaign_id,
        "started_at": m.started_at,
        "finished_at": m.finished_at,
        "git_commit": m.git_commit if m.git_commit is not None else campaign_git_commit,
        "versions": json.dumps(versions, sort_keys=True, default=str),
        "export_format": str(versions.get("export_format", "")),
        "emulated_isa": m.emulated_isa,
        "precision": m.spec.precision,
        "max_seconds": m.spec.max_seconds,
        "precision_achieved": _nan_if_none(m.precision_achieved),
        "imprecise": m.imprecise,
        "stop_reason": m.stop_reason,
        "alone": isolation.get("alone") if isolation else None,
        "concurrent_with": ",".join(isolation.get("concurrent_with") or ()) if isolation else "",
        "isolation_reason": str(isolation.get("reason", "")) if isolation else "",
        **energy,
    }
    if m.step_seconds:
        record.update(summarize(m.step_seconds, m.spec.batch).as_dict())
    else:
        record.update({name: math.nan for name in STAT_COLUMNS})
        record.update({"n": None, "noisy": None})
    record["pass_mean_us"] = _pass_mean_us(m, record["median_us"])
    record["cpu_median_us"] = _cpu_median_us(m)
    return record


def cell_frame(records: Iterable[Mapping[str, Any]]) -> pd.DataFrame:
    """Return view rows (`view_record`) as a DataFrame of `CELL_COLUMNS` typed by `CELL_DTYPES`.

    Parameters
    ----------
    records : iterable of mapping
        Rows of the cells view, in the order to keep.

    Returns
    -------
    pandas.DataFrame
        One row per record; an empty frame still has every column and dtype.
    """
    import pandas as pd

    frame = pd.DataFrame.from_records(list(records), columns=list(CELL_COLUMNS))
    return frame.astype(CELL_DTYPES)
