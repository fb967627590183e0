"""Report tables: pure functions from stored rows (pandas DataFrames) to report tables.

Every function takes DataFrames shaped like `harness.store.ProfileStore.latest_cells`
(or the ``fl_*`` tables) and returns a new DataFrame; nothing here reads files or
measures. Units are in the column names (``_us`` per image microseconds, ``_mib``
mebibytes, ``gflops`` 1e9 FLOP/s).

Speed-up and the fixed per-step cost
------------------------------------
For a configuration (device, model, batch, backend) with widest measured width
``w_max``, the *theoretical* speed-up of width ``w`` is the FLOPs ratio
``T = F(w_max) / F(w)`` (training FLOPs per example) and the *measured* speed-up is
``S = L(w_max) / L(w)`` with ``L`` the median per-image latency. FedDrop (Table 10)
measured ``S = 1.75`` for ``T = 2`` on an iPhone CPU. The gap is explained by the
latency model of `harness.latency`: its ``fixed`` coefficient ``a >= 0`` is the per-image
cost of a step that does not shrink with the model. With the fixed share
``phi = a / L_model(w_max)`` the model predicts (Amdahl's law)
``S_model = 1 / (phi + (1 - phi) / T)``, so ``phi`` is the single number that says how
much of the theoretical speed-up a device can ever give.

Emulated ISA
------------
A cell whose facts snapshot says ``emulated_isa`` (an aarch64 device run through
qemu-user, `devices.emulation.qemu`) was timed through binary translation: its latencies are not a
device's. Such cells stay in the per-cell latency table, marked ``emulated ISA`` in its
``isa`` column (and in the device table), and are left out of every comparison: the
headline, the speed-up, roofline and ORT-vs-PyTorch tables (`native_cells`).

Energy
------
A cell measured with a power sensor (`harness.energy.EnergyReading`) carries its joules per
training example, above the device's idle draw over the same seconds, and their
uncertainty (`energy_table`, in millijoules). A sensor written by an emulated device's
driver draws a model's watts, not a device's: such cells are marked ``emulated sensor``.
A flagged cell (external power, a sensor slower than the cell, a sensor that could not be
read) has no number, only its flag; `devices_without_energy` names the devices none of
whose measured cells has energy, and why.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd

from harness.arch_counts import train_flops_per_example
from harness.latency import fit
from harness.latency_validation import leave_one_out_error

#: The columns that identify one measured configuration of a device.
CONFIG = ["device", "model", "batch", "backend"]

#: What the tables say on a cell timed under an instruction-set emulator.
EMULATED_ISA = "emulated ISA"
#: What the tables say on a cell whose energy came from an emulated device's sensor.
EMULATED_SENSOR = "emulated sensor"

_MIB = 1024.0 * 1024.0


def ok_cells(cells: pd.DataFrame) -> pd.DataFrame:
    """Return the cells that were measured: status ``ok`` and a finite positive median.

    Parameters
    ----------
    cells : pandas.DataFrame
        `ProfileStore.latest_cells` rows.

    Returns
    -------
    pandas.DataFrame
        The usable rows, sorted by configuration and width, index reset.
    """
    if cells.empty:
        return cells.copy()
    median = pd.to_numeric(cells["median_us"], errors="coerce")
    keep = (cells["status"] == "ok") & np.isfinite(median) & (median > 0)
    return cells[keep].sort_values([*CONFIG, "width"]).reset_index(drop=True)


def is_emulated(cells: pd.DataFrame) -> pd.Series:
    """Return, per row, whether the cell ran under an instruction-set emulator (False without the column)."""
    if "emulated_isa" not in cells.columns:
        return pd.Series(False, index=cells.index, dtype=bool)
    return cells["emulated_isa"].fillna(False).astype(bool)


def native_cells(cells: pd.DataFrame) -> pd.DataFrame:
    """Return the rows of ``cells`` whose times are a device's own (not `is_emulated`).

    Parameters
    ----------
    cells : pandas.DataFrame
        `ProfileStore.latest_cells` rows.

    Returns
    -------
    pandas.DataFrame
    """
    return cells[~is_emulated(cells)] if not cells.empty else cells


def emulated_devices(cells: pd.DataFrame) -> list[str]:
    """Return the devices (sorted) that have cells timed under an instruction-set emulator."""
    return sorted(set(cells.loc[is_emulated(cells), "device"])) if not cells.empty else []


def _zoo_flops(model: str, width: float) -> float:
    try:
        return float(train_flops_per_example(model, width))
    except Exception:  # noqa: BLE001 - a model outside the zoo has no analytic count
        return math.nan


def with_flops(cells: pd.DataFrame) -> pd.DataFrame:
    """Fill missing ``train_flops`` from the analytic counter of the zoo (NaN when unknown).

    Parameters
    ----------
    cells : pandas.DataFrame

    Returns
    -------
    pandas.DataFrame
        A copy whose ``train_flops`` holds per-example training FLOPs where the runner
        document lacked them and the model is a zoo model.
    """
    out = cells.copy()
    if out.empty:
        return out
    flops = _floats(out["train_flops"])
    missing = ~np.isfinite(flops)
    if missing.any():
        flops[missing] = [
            _zoo_flops(str(m), float(w))
            for m, w in zip(out.loc[missing, "model"], out.loc[missing, "width"], strict=True)
        ]
    out["train_flops"] = flops
    return out


def _column(frame: pd.DataFrame, name: str, default: Any) -> pd.Series:
    """Return ``frame[name]``, or ``default`` on every row where the store predates the column."""
    if name in frame.columns:
        return frame[name]
    return pd.Series([default] * len(frame), index=frame.index)


def _floats(values: pd.Series) -> pd.Series:
    """Return ``values`` as float64, NaN where a value is missing or not a number."""
    return pd.to_numeric(values, errors="coerce").astype("float64")


def _with_known_flops(cells: pd.DataFrame) -> pd.DataFrame:
    """Return the measured cells (`ok_cells`) whose per-example training FLOPs are known (`with_flops`)."""
    ok = with_flops(ok_cells(cells))
    return ok[np.isfinite(ok["train_flops"])] if not ok.empty else ok


def latency_table(cells: pd.DataFrame) -> pd.DataFrame:
    """Per-image training latency and peak memory of every measured cell.

    Parameters
    ----------
    cells : pandas.DataFrame
        `ProfileStore.latest_cells` rows (failed cells are dropped).

    Returns
    -------
    pandas.DataFrame
        Columns ``device, model, batch, backend, width, n, median_us, precision, imprecise,
        p5_us, p95_us, iqr_us, cv, robust_cv, robust_cv_low, noisy, throttled,
        peak_memory_mib, runtime_memory_mib, model_memory_mib, train_mflops, isa``
        (``precision``: half-width of the median's 95 % interval as a fraction of it;
        ``robust_cv_low``: the lower end of the robust CV's 95 % interval, which ``noisy``
        compares with 5 %; ``runtime_memory_mib``: the process's peak before the model
        opened, ``model_memory_mib`` the peak less it, NaN where the runner did not read
        it; ``isa`` is ``"emulated ISA"`` on a cell timed under qemu-user, else empty).
    """
    columns = [
        *CONFIG,
        "width",
        "n",
        "median_us",
        "precision",
        "imprecise",
        "p5_us",
        "p95_us",
        "iqr_us",
        "cv",
        "robust_cv",
        "robust_cv_low",
        "noisy",
        "throttled",
        "peak_memory_mib",
        "runtime_memory_mib",
        "model_memory_mib",
        "train_mflops",
        "isa",
    ]
    ok = with_flops(ok_cells(cells))
    if ok.empty:
        return pd.DataFrame(columns=columns)
    picked = ["n", "median_us", "p5_us", "p95_us", "iqr_us", "cv", "robust_cv", "robust_cv_low", "noisy", "throttled"]
    out = ok[[*CONFIG, "width", *[c for c in picked if c in ok.columns]]].copy()
    out["precision"] = _floats(_column(ok, "precision_achieved", math.nan))
    out["imprecise"] = _column(ok, "imprecise", False).fillna(False).astype(bool)
    for spread in ("robust_cv", "robust_cv_low"):
        if spread not in out.columns:
            out[spread] = math.nan
    out["peak_memory_mib"] = _floats(ok["peak_memory_bytes"]) / _MIB
    for memory in ("runtime_memory", "model_memory"):
        out[f"{memory}_mib"] = _floats(_column(ok, f"{memory}_bytes", None)) / _MIB
    out["train_mflops"] = ok["train_flops"] / 1e6
    out["isa"] = [EMULATED_ISA if e else "" for e in is_emulated(ok)]
    return out[columns].reset_index(drop=True)


def memory_table(latency: pd.DataFrame) -> pd.DataFrame:
    """Return the runtime's memory apart from the model's, per configuration.

    Parameters
    ----------
    latency : pandas.DataFrame
        `latency_table` output.

    Returns
    -------
    pandas.DataFrame
        Columns ``device, model, batch, backend, runtime_mib, widest, model_mib,
        model_share``: the median of the cells' runtime memory, and at the widest width
        measured the model's share of the peak in MiB and as a fraction of the peak. Only
        configurations whose cells carry the runtime's memory; empty when none does.
    """
    columns = [*CONFIG, "runtime_mib", "widest", "model_mib", "model_share"]
    known = latency[np.isfinite(_floats(_column(latency, "model_memory_mib", None)))] if not latency.empty else latency
    if known.empty:
        return pd.DataFrame(columns=columns)
    rows = []
    for key, group in known.groupby(CONFIG, sort=True):
        widest = group.loc[group["width"].idxmax()]
        rows.append(
            {
                **dict(zip(CONFIG, key, strict=True)),
                "runtime_mib": float(group["runtime_memory_mib"].median()),
                "widest": float(widest["width"]),
                "model_mib": float(widest["model_memory_mib"]),
                "model_share": float(widest["model_memory_mib"] / widest["peak_memory_mib"]),
            }
        )
    return pd.DataFrame(rows, columns=columns)


def energy_table(cells: pd.DataFrame) -> pd.DataFrame:
    """Energy per training example of every measured cell that carries energy, beside its latency.

    Parameters
    ----------
    cells : pandas.DataFrame
        `ProfileStore.latest_cells` rows (failed cells and cells without energy columns
        are dropped).

    Returns
    -------
    pandas.DataFrame
        Columns ``device, model, batch, backend, width, median_us, energy_mj, above_idle_mj,
        uncertainty_mj, train_mflops, sensor, emulated, flag``: millijoules per image
        (NaN for a flagged cell), the sensor's kind, ``emulated sensor`` where the sensor
        was an emulated device's, and the flag of a cell whose energy was not measured.
        Empty when no cell carries energy.
    """
    columns = [
        *CONFIG, "width", "median_us", "energy_mj", "above_idle_mj", "uncertainty_mj", "train_mflops", "sensor",
        "emulated", "flag",
    ]  # fmt: skip
    ok = with_flops(ok_cells(cells))
    if ok.empty:
        return pd.DataFrame(columns=columns)
    joules = _floats(_column(ok, "energy_j_per_image", math.nan))
    flags = _column(ok, "energy_flag", None)
    carries = np.isfinite(joules) | flags.notna()
    ok, joules, flags = ok[carries], joules[carries], flags[carries]
    if ok.empty:
        return pd.DataFrame(columns=columns)
    out = ok[[*CONFIG, "width", "median_us"]].copy()
    out["energy_mj"] = 1e3 * joules
    out["above_idle_mj"] = 1e3 * _floats(_column(ok, "energy_above_idle_j_per_image", math.nan))
    out["uncertainty_mj"] = 1e3 * _floats(_column(ok, "energy_uncertainty_j_per_image", math.nan))
    out["train_mflops"] = ok["train_flops"] / 1e6
    out["sensor"] = _column(ok, "energy_sensor", "").fillna("").astype(str)
    emulated = _column(ok, "energy_emulated", False).fillna(False).astype(bool)
    out["emulated"] = [EMULATED_SENSOR if e else "" for e in emulated]
    out["flag"] = flags.fillna("").astype(str)
    return out[columns].reset_index(drop=True)


def devices_without_energy(cells: pd.DataFrame) -> dict[str, str]:
    """Name the devices none of whose measured cells has energy, and why.

    Parameters
    ----------
    cells : pandas.DataFrame
        `ProfileStore.latest_cells` rows.

    Returns
    -------
    dict of str to str
        Device -> ``"no power sensor"`` (no cell carries energy) or its cells' first flag,
        in device order.
    """
    ok = ok_cells(cells)
    if ok.empty:
        return {}
    joules = _floats(_column(ok, "energy_j_per_image", math.nan))
    flags = _column(ok, "energy_flag", None)
    out: dict[str, str] = {}
    for device in sorted(set(ok["device"])):
        mine = ok["device"] == device
        if np.isfinite(joules[mine]).any():
            continue
        flagged = [str(f) for f in flags[mine] if isinstance(f, str) and f]
        out[str(device)] = flagged[0] if flagged else "no power sensor"
    return out


def speedup_table(cells: pd.DataFrame) -> pd.DataFrame:
    """Measured against theoretical speed-up per width, with the fixed-cost explanation.

    Parameters
    ----------
    cells : pandas.DataFrame
        `ProfileStore.latest_cells` rows.

    Returns
    -------
    pandas.DataFrame
        One row per measured width of every configuration with at least two widths:
        ``device, model, batch, backend, width, flops_ratio`` (theoretical speed-up
        ``F(w_max) / F(w)``), ``measured_speedup`` (``L(w_max) / L(w)``),
        ``efficiency`` (measured / theoretical), ``fixed_us`` (the ``fixed`` coefficient
        ``a`` of the device's latency model), ``fixed_share`` (``a / L_model(w_max)``) and
        ``modelled_speedup`` (``1 / (phi + (1 - phi) / T)``; see the module docstring).
        Emulated-ISA cells are left out.
    """
    columns = [
        *CONFIG,
        "width",
        "flops_ratio",
        "measured_speedup",
        "efficiency",
        "fixed_us",
        "fixed_share",
        "modelled_speedup",
    ]
    ok = _with_known_flops(native_cells(cells))
    if ok.empty:
        return pd.DataFrame(columns=columns)
    models = fit(ok)
    rows: list[dict[str, Any]] = []
    for key, group in ok.groupby(CONFIG, sort=True):
        if group["width"].nunique() < 2:
            continue
        device, model, batch, backend = key
        widest = group.loc[group["width"].idxmax()]
        lat = models[str(device)].latency[(str(model), int(batch), str(backend))]
        full = (
            lat.predict_flops(float(widest["train_flops"])).value * 1e6
            if not lat.zoo
            else (lat.predict_us(float(widest["width"])))
        )
        share = lat.fixed_us / full if full > 0 else math.nan
        for _, row in group.sort_values("width").iterrows():
            ratio = float(widest["train_flops"]) / float(row["train_flops"])
            measured = float(widest["median_us"]) / float(row["median_us"])
            rows.append(
                {
                    "device": device,
                    "model": model,
                    "batch": int(batch),
                    "backend": backend,
                    "width": float(row["width"]),
                    "flops_ratio": ratio,
                    "measured_speedup": measured,
                    "efficiency": measured / ratio,
                    "fixed_us": lat.fixed_us,
                    "fixed_share": share,
                    "modelled_speedup": amdahl_speedup(ratio, share),
                }
            )
    return pd.DataFrame(rows, columns=columns)


def amdahl_speedup(theoretical: float, fixed_share: float) -> float:
    """Return the speed-up left when a share of the full-width time does not scale.

    Parameters
    ----------
    theoretical : float
        FLOPs ratio ``T`` (at least 1 for a narrower width).
    fixed_share : float
        ``phi`` in [0, 1]: the fixed share of the full-width latency.

    Returns
    -------
    float
        ``1 / (phi + (1 - phi) / T)``.
    """
    return 1.0 / (fixed_share + (1.0 - fixed_share) / theoretical)


def roofline_table(cells: pd.DataFrame) -> pd.DataFrame:
    """Achieved training GFLOP/s per width as a fraction of the device's matmul GFLOP/s.

    Parameters
    ----------
    cells : pandas.DataFrame
        `ProfileStore.latest_cells` rows.

    Returns
    -------
    pandas.DataFrame
        ``device, model, batch, backend, width, train_mflops, achieved_gflops``
        (``train_flops / median`` per image), ``matmul_gflops`` (the runner's probe)
        and ``fraction`` (achieved / matmul; NaN without a probe). Emulated-ISA cells
        are left out.
    """
    columns = [*CONFIG, "width", "train_mflops", "achieved_gflops", "matmul_gflops", "fraction"]
    ok = with_flops(ok_cells(native_cells(cells)))
    if ok.empty:
        return pd.DataFrame(columns=columns)
    ok = ok[np.isfinite(ok["train_flops"])]
    out = ok[[*CONFIG, "width"]].copy()
    out["train_mflops"] = ok["train_flops"] / 1e6
    out["achieved_gflops"] = ok["train_flops"] / (ok["median_us"] * 1e-6) / 1e9
    out["matmul_gflops"] = _floats(ok["matmul_gflops"])
    out["fraction"] = out["achieved_gflops"] / out["matmul_gflops"]
    return out[columns].reset_index(drop=True)


def _versions(text: Any) -> dict[str, str]:
    if isinstance(text, Mapping):
        return {str(k): str(v) for k, v in text.items()}
    try:
        value = json.loads(str(text))
    except (TypeError, ValueError):
        return {}
    return {str(k): str(v) for k, v in value.items()} if isinstance(value, dict) else {}


def device_table(cells: pd.DataFrame, facts: Mapping[str, Mapping[str, Any]]) -> pd.DataFrame:
    """One row per device: what it is, the backend versions, and how its cells went.

    Parameters
    ----------
    cells : pandas.DataFrame
        `ProfileStore.latest_cells` rows (all statuses).
    facts : mapping of str to mapping
        Device name -> facts snapshot (`devices.facts.DeviceFacts.to_dict`); may miss devices.

    Returns
    -------
    pandas.DataFrame
        ``device, platform, arch, cpu, cores, mem_mib, os, onnxruntime, torch, backends,
        cells, ok, failed, throttled, noisy, imprecise, matmul_gflops, isa`` (``"emulated
        ISA"`` when its facts or cells say so).
    """
    columns = [
        "device",
        "platform",
        "arch",
        "cpu",
        "cores",
        "mem_mib",
        "os",
        "onnxruntime",
        "torch",
        "backends",
        "cells",
        "ok",
        "failed",
        "throttled",
        "noisy",
        "imprecise",
        "matmul_gflops",
        "isa",
    ]
    rows: list[dict[str, Any]] = []
    devices = sorted(set(cells["device"]) if not cells.empty else set()) or sorted(facts)
    for device in devices:
        group = cells[cells["device"] == device] if not cells.empty else cells
        info = facts.get(device, {})
        ok = group[group["status"] == "ok"] if not group.empty else group
        probes = pd.to_numeric(ok["matmul_gflops"], errors="coerce") if not ok.empty else pd.Series(dtype=float)
        versions: dict[str, str] = {}
        for text in group["versions"] if not group.empty else []:
            versions.update(_versions(text))
        rows.append(
            {
                "device": device,
                "platform": info.get("platform") or "",
                "arch": info.get("arch") or "",
                "cpu": info.get("cpu_model") or info.get("board") or "",
                "cores": info.get("cores"),
                "mem_mib": info.get("mem_total_mb"),
                "os": info.get("os") or "",
                "onnxruntime": info.get("onnxruntime") or versions.get("onnxruntime", ""),
                "torch": info.get("torch") or versions.get("torch", ""),
                "backends": ", ".join(sorted(set(group["backend"]))) if not group.empty else "",
                "cells": len(group),
                "ok": len(ok),
                "failed": len(group) - len(ok),
                "throttled": int(ok["throttled"].astype(bool).sum()) if not ok.empty else 0,
                "noisy": int(ok["noisy"].fillna(False).astype(bool).sum()) if not ok.empty else 0,
                "imprecise": int(_column(ok, "imprecise", False).fillna(False).astype(bool).sum()),
                "matmul_gflops": float(probes.median()) if probes.notna().any() else math.nan,
                "isa": EMULATED_ISA if info.get("emulated_isa") or is_emulated(group).any() else "",
            }
        )
    return pd.DataFrame(rows, columns=columns)


def failures_table(cells: pd.DataFrame) -> pd.DataFrame:
    """Return the cells whose latest attempt failed, with the reason.

    Parameters
    ----------
    cells : pandas.DataFrame
        `ProfileStore.latest_cells` rows.

    Returns
    -------
    pandas.DataFrame
        ``device, model, batch, backend, width, status, message``.
    """
    columns = [*CONFIG, "width", "status", "message"]
    if cells.empty:
        return pd.DataFrame(columns=columns)
    failed = cells[cells["status"] != "ok"]
    return failed[columns].sort_values([*CONFIG, "width"]).reset_index(drop=True)


def prediction_error_table(cells: pd.DataFrame) -> pd.DataFrame:
    """Leave-one-width-out latency-model error per device (`harness.latency.leave_one_out_error`).

    Parameters
    ----------
    cells : pandas.DataFrame
        `ProfileStore.latest_cells` rows.

    Returns
    -------
    pandas.DataFrame
        ``device, model, batch, backend, width, predicted_us, predicted_std_us,
        measured_us, error, extrapolated`` (``error`` relative: ``(predicted - measured) /
        measured``; ``extrapolated``: the width lay outside the others).
    """
    columns = [*CONFIG, "width", "predicted_us", "predicted_std_us", "measured_us", "error", "extrapolated"]
    ok = _with_known_flops(cells)
    if ok.empty:
        return pd.DataFrame(columns=columns)
    rows = [
        {
            "device": device,
            "model": p.model,
            "batch": p.batch,
            "backend": p.backend,
            "width": p.width,
            "predicted_us": p.predicted_us,
            "predicted_std_us": p.predicted_std_us,
            "measured_us": p.measured_us,
            "error": p.relative_error,
            "extrapolated": p.extrapolated,
        }
        for device, report in sorted(leave_one_out_error(ok).items())
        for p in report.points
    ]
    return pd.DataFrame(rows, columns=columns)


def prediction_summary(errors: pd.DataFrame) -> pd.DataFrame:
    """Median and worst absolute leave-one-out error per device and configuration.

    Parameters
    ----------
    errors : pandas.DataFrame
        `prediction_error_table` output.

    Returns
    -------
    pandas.DataFrame
        ``device, model, batch, backend, widths, median_abs_error, max_abs_error``.
    """
    columns = [*CONFIG, "widths", "median_abs_error", "max_abs_error"]
    if errors.empty:
        return pd.DataFrame(columns=columns)
    grouped = errors.assign(abs_error=errors["error"].abs()).groupby(CONFIG, sort=True)
    out = grouped.agg(
        widths=("width", "count"), median_abs_error=("abs_error", "median"), max_abs_error=("abs_error", "max")
    )
    return out.reset_index()[columns]


#: Backend pairs compared wherever a device measured both at the same cell, as
#: ``(backend, baseline)``: the training build against PyTorch eager, the portable step model
#: against the training build, and the portable step model against PyTorch eager.
BACKEND_PAIRS = (("ort", "torch"), ("onnx", "ort"), ("onnx", "torch"))


def backend_pairs_table(cells: pd.DataFrame) -> pd.DataFrame:
    """Every pair of `BACKEND_PAIRS` that a device measured at the same cell.

    Parameters
    ----------
    cells : pandas.DataFrame
        `ProfileStore.latest_cells` rows.

    Returns
    -------
    pandas.DataFrame
        ``device, model, batch, width, backend, baseline, backend_us, baseline_us, ratio``
        (``backend_us / baseline_us``: below 1, ``backend`` is faster), ``backend_mib,
        baseline_mib`` (peak memory); pairs in `BACKEND_PAIRS` order within a cell.
        Emulated-ISA cells are left out (qemu timings are not a device's).
    """
    key = ["device", "model", "batch", "width"]
    columns = [*key, "backend", "baseline", "backend_us", "baseline_us", "ratio", "backend_mib", "baseline_mib"]
    ok = ok_cells(native_cells(cells))
    if ok.empty:
        return pd.DataFrame(columns=columns)
    parts = []
    for order, (backend, baseline) in enumerate(BACKEND_PAIRS):
        mine = ok[ok["backend"] == backend][[*key, "median_us", "peak_memory_bytes"]]
        theirs = ok[ok["backend"] == baseline][[*key, "median_us", "peak_memory_bytes"]]
        both = mine.merge(theirs, on=key, suffixes=("_a", "_b"))
        if both.empty:
            continue
        out = both[key].copy()
        out["backend"], out["baseline"], out["_order"] = backend, baseline, order
        out["backend_us"] = both["median_us_a"]
        out["baseline_us"] = both["median_us_b"]
        out["ratio"] = out["backend_us"] / out["baseline_us"]
        out["backend_mib"] = _floats(both["peak_memory_bytes_a"]) / _MIB
        out["baseline_mib"] = _floats(both["peak_memory_bytes_b"]) / _MIB
        parts.append(out)
    if not parts:
        return pd.DataFrame(columns=columns)
    table = pd.concat(parts, ignore_index=True).sort_values([*key, "_order"])
    return table[columns].reset_index(drop=True)


def prediction_by_width(errors: pd.DataFrame) -> pd.DataFrame:
    """Tabulate the leave-one-out error of every width on every device, one row per width.

    Parameters
    ----------
    errors : pandas.DataFrame
        `prediction_error_table` output.

    Returns
    -------
    pandas.DataFrame
        ``model, batch, backend, width``, one column per device (relative error), then
        ``max_abs_error`` over the devices; sorted by configuration and width.
    """
    keys = ["model", "batch", "backend", "width"]
    if errors.empty:
        return pd.DataFrame(columns=[*keys, "max_abs_error"])
    table = errors.pivot_table(index=keys, columns="device", values="error", aggfunc="first")
    table.columns = [str(c) for c in table.columns]
    table["max_abs_error"] = table.abs().max(axis=1)
    return table.reset_index().sort_values(keys).reset_index(drop=True)


def isolation_table(cells: pd.DataFrame) -> pd.DataFrame:
    """How each device's cells were isolated from the other devices of their campaign.

    Parameters
    ----------
    cells : pandas.DataFrame
        `ProfileStore.latest_cells` rows (``alone``, ``concurrent_with``, ``isolation_reason``).

    Returns
    -------
    pandas.DataFrame
        ``device, cells, alone, concurrent, concurrent_with, reason``: per device the measured
        cells, how many were measured alone and how many beside other devices, the devices
        seen beside it, and the reasons stored with its cells (distinct, joined). Cells
        stored before the isolation plan count in neither column.
    """
    columns = ["device", "cells", "alone", "concurrent", "concurrent_with", "reason"]
    ok = ok_cells(cells)
    if ok.empty or "alone" not in ok.columns:
        return pd.DataFrame(columns=columns)
    rows = []
    for device, group in ok.groupby("device", sort=True):
        alone = group["alone"].astype("boolean")
        beside = sorted({n for text in group["concurrent_with"].fillna("") for n in str(text).split(",") if n})
        reasons = [str(r) for r in dict.fromkeys(group["isolation_reason"].fillna("")) if r]
        rows.append(
            {
                "device": device,
                "cells": len(group),
                "alone": int((alone == True).sum()),  # noqa: E712 - NA counts in neither
                "concurrent": int((alone == False).sum()),  # noqa: E712
                "concurrent_with": ", ".join(beside),
                "reason": "; ".join(reasons),
            }
        )
    return pd.DataFrame(rows, columns=columns)


def backend_table(cells: pd.DataFrame) -> pd.DataFrame:
    """ONNX Runtime (training build) against PyTorch wherever a device measured both at the same cell.

    Parameters
    ----------
    cells : pandas.DataFrame
        `ProfileStore.latest_cells` rows.

    Returns
    -------
    pandas.DataFrame
        ``device, model, batch, width, ort_us, torch_us, ort_over_torch`` (below 1: ORT is
        faster), ``ort_mib, torch_mib`` (peak memory): the ``ort``/``torch`` rows of
        `backend_pairs_table` (emulated-ISA cells are left out).
    """
    columns = ["device", "model", "batch", "width", "ort_us", "torch_us", "ort_over_torch", "ort_mib", "torch_mib"]
    pairs = backend_pairs_table(cells)
    pairs = pairs[(pairs["backend"] == "ort") & (pairs["baseline"] == "torch")]
    renamed = pairs.rename(
        columns={
            "backend_us": "ort_us",
            "baseline_us": "torch_us",
            "ratio": "ort_over_torch",
            "backend_mib": "ort_mib",
            "baseline_mib": "torch_mib",
        }
    )
    return renamed[columns].reset_index(drop=True)


def headline_table(cells: pd.DataFrame) -> pd.DataFrame:
    """Return the headline: median per-image latency per configuration and width, and the speed-up.

    Parameters
    ----------
    cells : pandas.DataFrame
        `ProfileStore.latest_cells` rows.

    Returns
    -------
    pandas.DataFrame
        One row per configuration: ``device, model, batch, backend``, one column
        ``w=<width> us`` per measured width (median per-image microseconds, NaN where
        not measured), ``speedup`` (measured, narrowest against widest width),
        ``theory`` (FLOPs ratio of the same pair), ``fixed_share``, ``failed`` (cells of
        the configuration whose latest attempt failed). Configurations timed under an
        instruction-set emulator are left out (`native_cells`).
    """
    cells = native_cells(cells)
    ok = ok_cells(cells)
    if cells.empty:
        return pd.DataFrame(columns=[*CONFIG, "speedup", "theory", "fixed_share", "failed"])
    configs = cells[CONFIG].drop_duplicates().sort_values(CONFIG)
    widths = sorted(ok["width"].unique()) if not ok.empty else []
    speed = speedup_table(cells)
    rows: list[dict[str, Any]] = []
    for _, cfg in configs.iterrows():
        match = (cells[CONFIG] == cfg.values).all(axis=1)
        group = ok[(ok[CONFIG] == cfg.values).all(axis=1)] if not ok.empty else ok
        row: dict[str, Any] = dict(cfg)
        for w in widths:
            hit = group[group["width"] == w]["median_us"]
            row[f"w={w:g} us"] = float(hit.iloc[0]) if len(hit) else math.nan
        s = speed[(speed[CONFIG] == cfg.values).all(axis=1)] if not speed.empty else speed
        if len(s):
            narrow = s.loc[s["width"].idxmin()]
            row.update(
                speedup=float(narrow["measured_speedup"]),
                theory=float(narrow["flops_ratio"]),
                fixed_share=float(narrow["fixed_share"]),
            )
        else:
            row.update(speedup=math.nan, theory=math.nan, fixed_share=math.nan)
        row["failed"] = int((cells[match]["status"] != "ok").sum())
        rows.append(row)
    return pd.DataFrame(rows)


# ---------------------------------------------------------------------------- FL runs


def _number(value: Any) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan


def fl_accuracy_table(rounds: pd.DataFrame) -> pd.DataFrame:
    """Accuracy and loss of every evaluated width per round, from ``fl_rounds.evaluation``.

    Parameters
    ----------
    rounds : pandas.DataFrame
        ``fl_rounds`` rows (``run_id, round, evaluation`` JSON ``{width: {loss, accuracy}}``).

    Returns
    -------
    pandas.DataFrame
        ``run_id, round, width, accuracy, loss``.
    """
    columns = ["run_id", "round", "width", "accuracy", "loss"]
    rows: list[dict[str, Any]] = []
    for _, r in rounds.iterrows():
        evaluation = json.loads(r["evaluation"]) if isinstance(r["evaluation"], str) else r["evaluation"]
        for width, metrics in (evaluation or {}).items():
            try:
                w = float(width)
            except ValueError:
                continue
            if not isinstance(metrics, Mapping):
                metrics = {"accuracy": metrics}
            rows.append(
                {
                    "run_id": int(r["run_id"]),
                    "round": int(r["round"]),
                    "width": w,
                    "accuracy": _number(metrics.get("accuracy")),
                    "loss": _number(metrics.get("loss")),
                }
            )
    out = pd.DataFrame(rows, columns=columns)
    return out.sort_values(["run_id", "width", "round"]).reset_index(drop=True) if rows else out


def fl_timeline_table(client_rounds: pd.DataFrame) -> pd.DataFrame:
    """Per round and client: where its round time went, and whether it straggled.

    Parameters
    ----------
    client_rounds : pandas.DataFrame
        ``fl_client_rounds`` rows.

    Returns
    -------
    pandas.DataFrame
        ``run_id, round, cid, device, width, tier, straggler, status, download_s,
        compute_s, upload_s, wait_s, total_s`` (missing times count as 0).
    """
    columns = [
        "run_id",
        "round",
        "cid",
        "device",
        "width",
        "tier",
        "straggler",
        "status",
        "download_s",
        "compute_s",
        "upload_s",
        "wait_s",
        "total_s",
    ]
    if client_rounds.empty:
        return pd.DataFrame(columns=columns)
    out = client_rounds[["run_id", "round", "cid", "device", "width", "tier", "straggler", "status"]].copy()
    out["straggler"] = out["straggler"].astype(bool)
    for src, dst in (
        ("download_seconds", "download_s"),
        ("compute_seconds", "compute_s"),
        ("upload_seconds", "upload_s"),
        ("wait_seconds", "wait_s"),
    ):
        out[dst] = _floats(client_rounds[src]).fillna(0.0)
    out["total_s"] = out["download_s"] + out["compute_s"] + out["upload_s"]
    return out[columns].sort_values(["run_id", "round", "cid"]).reset_index(drop=True)


def host_disturbed_rounds(client_rounds: pd.DataFrame) -> pd.Series:
    """Flag the client rounds the host disturbed: more CPU per step, or less of the cpu, than nearby rounds.

    Parameters
    ----------
    client_rounds : pandas.DataFrame
        ``fl_client_rounds`` rows; ``metrics`` (dicts or JSON) with ``loop_cpu_seconds``,
        ``loop_seconds`` and ``steps`` (the devices executor's resident runner).

    Returns
    -------
    pandas.Series of bool
        Indexed as ``client_rounds``. A round is flagged by `fl.roundcost.host_disturbed`
        over each run's rounds of one device at one configuration (width and architecture;
        not FjORD rounds that drew more than one width, whose CPU per step moves with the
        draw: those are judged by their CPU per step over the profile's at their draws,
        ``cpu_vs_profile_mix``, over each run's such rounds of one device), or by
        `fl.roundcost.cpu_starved` over each run's rounds of one device at any width, or
        when its CPU per step exceeds the profile's at its architecture by more than
        `fl.roundcost.HOST_DISTURBANCE_LIMIT` (``cpu_vs_profile``, logged by the server
        for the rounds it judged; this one needs no other round), or when its transfers
        stalled (`fl.roundcost.transfer_stalled` over each run's rounds of one device, from
        ``download_seconds``, ``upload_seconds`` and the metrics' ``download_bytes`` and
        ``upload_bytes``). Rounds without the loop's times are not judged by the CPU rules,
        rounds without their transfers' bytes not by the transfer rule.
    """
    from fl.roundcost import cpu_starved, drawn_steps, host_disturbed, loop_cpu_per_step, slowed_by_host

    flags = pd.Series(False, index=client_rounds.index, dtype=bool)
    if client_rounds.empty or "metrics" not in client_rounds:
        return flags
    # (run, device[, configuration]) -> [(round, index, what the group's rule judges)]
    per_config: dict[tuple[Any, ...], list[tuple[Any, Any, Any]]] = {}
    per_device: dict[tuple[Any, ...], list[tuple[Any, Any, Any]]] = {}
    per_link: dict[tuple[Any, ...], list[tuple[Any, Any, Any]]] = {}
    per_mix: dict[tuple[Any, ...], list[tuple[Any, Any, Any]]] = {}
    for index, row in client_rounds.iterrows():
        metrics = row["metrics"] if isinstance(row["metrics"], Mapping) else json.loads(row["metrics"] or "{}")
        flags[index] = slowed_by_host(_number(metrics.get("cpu_vs_profile")))
        cpu, wall = _number(metrics.get("loop_cpu_seconds")), _number(metrics.get("loop_seconds"))
        drawn = drawn_steps(metrics)
        per_step = loop_cpu_per_step(metrics) if len(drawn) <= 1 else None
        vs_mix = _number(metrics.get("cpu_vs_profile_mix"))
        if len(drawn) > 1 and math.isfinite(vs_mix):
            per_mix.setdefault((row["run_id"], row["device"]), []).append((row["round"], index, vs_mix))
        share = cpu / wall if math.isfinite(cpu) and math.isfinite(wall) and wall > 0 else None
        arch_sizes = row.get("arch_sizes", ())
        arch = tuple(json.loads(arch_sizes)) if isinstance(arch_sizes, str) else tuple(arch_sizes or ())
        per_config.setdefault((row["run_id"], row["device"], float(row["width"]), arch), []).append(
            (row["round"], index, per_step)
        )
        per_device.setdefault((row["run_id"], row["device"]), []).append((row["round"], index, share))
        per_link.setdefault((row["run_id"], row["device"]), []).append((row["round"], index, _transfer(row, metrics)))
    rules = ((per_config, host_disturbed), (per_mix, host_disturbed), (per_device, cpu_starved), (per_link, _stalled))
    for groups, rule in rules:
        for rounds in groups.values():
            rounds.sort(key=lambda item: item[0])
            for (_, index, _), flag in zip(rounds, rule([v for _, _, v in rounds]), strict=True):
                flags[index] = flags[index] or flag
    return flags


def _transfer(row: Mapping[str, Any], metrics: Mapping[str, Any]) -> tuple[tuple[float, float], float] | None:
    """Return a client round's ``((transfer seconds, bytes), round seconds)``, or None where a part is unknown."""
    down, up, compute = (_number(row.get(k)) for k in ("download_seconds", "upload_seconds", "compute_seconds"))
    nbytes = _number(metrics.get("download_bytes")) + _number(metrics.get("upload_bytes"))
    if not all(math.isfinite(v) for v in (down, up, compute, nbytes)):
        return None
    return (down + up, nbytes), down + compute + up


def _stalled(rounds: list[tuple[tuple[float, float], float] | None]) -> list[bool]:
    """`fl.roundcost.transfer_stalled` over `_transfer` values."""
    from fl.roundcost import transfer_stalled

    return transfer_stalled([r and r[0] for r in rounds], [r and r[1] for r in rounds])


def _timeline_with_predictions(client_rounds: pd.DataFrame) -> pd.DataFrame:
    """`fl_timeline_table` plus ``predicted_s`` (NaN where none) and ``disturbed`` (`host_disturbed_rounds`)."""
    timeline = fl_timeline_table(client_rounds)
    ordered = client_rounds.sort_values(["run_id", "round", "cid"])  # fl_timeline_table's order
    predicted = ordered["predicted_seconds"] if "predicted_seconds" in ordered else pd.Series([math.nan] * len(ordered))
    timeline["predicted_s"] = _floats(predicted).to_numpy()
    timeline["disturbed"] = host_disturbed_rounds(client_rounds).loc[ordered.index].to_numpy()
    return timeline


def fl_virtual_table(rounds: pd.DataFrame, client_rounds: pd.DataFrame) -> pd.DataFrame:
    """Place each client's virtual round of a population run on the run's virtual time line.

    Rounds follow each other on the virtual clock: a round starts when the previous one
    closed (``virtual_seconds`` of ``fl_rounds``, summed).

    Parameters
    ----------
    rounds : pandas.DataFrame
        ``fl_rounds`` rows.
    client_rounds : pandas.DataFrame
        ``fl_client_rounds`` rows.

    Returns
    -------
    pandas.DataFrame
        ``run_id, round, round_start_s, round_s, cid, device, status, virtual_s`` for the client rounds
        with a virtual time (empty when no run has one, or the store predates virtual times).
    """
    columns = ["run_id", "round", "round_start_s", "round_s", "cid", "device", "status", "virtual_s"]
    if "virtual_seconds" not in rounds or "virtual_seconds" not in client_rounds:
        return pd.DataFrame(columns=columns)
    frame = rounds[["run_id", "round"]].copy()
    frame["round_s"] = _floats(rounds["virtual_seconds"])
    frame = frame.dropna(subset=["round_s"]).sort_values(["run_id", "round"])
    if frame.empty:
        return pd.DataFrame(columns=columns)
    frame["round_start_s"] = frame.groupby("run_id")["round_s"].cumsum() - frame["round_s"]
    clients = client_rounds[["run_id", "round", "cid", "device", "status"]].copy()
    clients["virtual_s"] = _floats(client_rounds["virtual_seconds"])
    out = frame.merge(clients.dropna(subset=["virtual_s"]), on=["run_id", "round"])
    return out[columns].sort_values(["run_id", "round", "cid"]).reset_index(drop=True)


def fl_energy_tables(rounds: pd.DataFrame, client_rounds: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Energy of each client round and of each fleet round: predicted from the profiles, measured by sensors.

    Parameters
    ----------
    rounds : pandas.DataFrame
        ``fl_rounds`` rows.
    client_rounds : pandas.DataFrame
        ``fl_client_rounds`` rows.

    Returns
    -------
    clients : pandas.DataFrame
        ``run_id, round, cid, device, status, predicted_j, measured_j, sensor`` for every client
        round with a predicted or a measured energy (``sensor``: "emulated", "measured" or "-").
    fleet : pandas.DataFrame
        ``run_id, round, predicted_j, measured_j``: the sums over each round's client rounds
        (``fl_rounds``' own sums). Both are empty for a store that predates energy or a run without any.
    """
    client_columns = ["run_id", "round", "cid", "device", "status", "predicted_j", "measured_j", "sensor"]
    fleet_columns = ["run_id", "round", "predicted_j", "measured_j"]
    if "predicted_energy_j" not in client_rounds or "predicted_energy_j" not in rounds:
        return pd.DataFrame(columns=client_columns), pd.DataFrame(columns=fleet_columns)
    clients = client_rounds[["run_id", "round", "cid", "device", "status"]].copy()
    clients["predicted_j"] = _floats(client_rounds["predicted_energy_j"])
    clients["measured_j"] = _floats(client_rounds["measured_energy_j"])
    emulated = client_rounds["energy_emulated"]
    clients["sensor"] = [
        "-" if not np.isfinite(m) else "emulated" if e else "measured"
        for m, e in zip(clients["measured_j"], emulated, strict=True)
    ]
    clients = clients[np.isfinite(clients["predicted_j"]) | np.isfinite(clients["measured_j"])]
    fleet = rounds[["run_id", "round"]].copy()
    fleet["predicted_j"] = _floats(rounds["predicted_energy_j"])
    fleet["measured_j"] = _floats(rounds["measured_energy_j"])
    fleet = fleet[np.isfinite(fleet["predicted_j"]) | np.isfinite(fleet["measured_j"])]
    return (
        clients[client_columns].sort_values(["run_id", "round", "cid"]).reset_index(drop=True),
        fleet[fleet_columns].sort_values(["run_id", "round"]).reset_index(drop=True),
    )


def fl_tier_table(client_rounds: pd.DataFrame) -> pd.DataFrame:
    """Tier membership: how many clients each tier held per round.

    Parameters
    ----------
    client_rounds : pandas.DataFrame
        ``fl_client_rounds`` rows.

    Returns
    -------
    pandas.DataFrame
        ``run_id, round, tier, width, clients, stragglers``.
    """
    columns = ["run_id", "round", "tier", "width", "clients", "stragglers"]
    if client_rounds.empty:
        return pd.DataFrame(columns=columns)
    frame = client_rounds.assign(straggler=client_rounds["straggler"].astype(bool))
    grouped = frame.groupby(["run_id", "round", "tier"], sort=True)
    out = grouped.agg(width=("width", "max"), clients=("cid", "count"), stragglers=("straggler", "sum"))
    out["stragglers"] = out["stragglers"].astype(int)
    return out.reset_index()[columns]


def fl_predicted_rounds(client_rounds: pd.DataFrame) -> pd.DataFrame:
    """Return the successful client rounds that have a prediction.

    Parameters
    ----------
    client_rounds : pandas.DataFrame
        ``fl_client_rounds`` rows.

    Returns
    -------
    pandas.DataFrame
        `fl_timeline_table` columns plus ``predicted_s``, ``error`` (``|predicted_s -
        total_s| / total_s``) and ``disturbed`` (`host_disturbed_rounds`).
    """
    if client_rounds.empty or "predicted_seconds" not in client_rounds:
        return pd.DataFrame(columns=["run_id", "device", "predicted_s", "total_s", "disturbed", "error"])
    frame = _timeline_with_predictions(client_rounds)
    frame = frame[(frame["status"] == "ok") & frame["predicted_s"].notna() & (frame["total_s"] > 0)]
    return frame.assign(error=(frame["predicted_s"] - frame["total_s"]).abs() / frame["total_s"])


def fl_prediction_table(client_rounds: pd.DataFrame) -> pd.DataFrame:
    """Predicted against measured client round time, per run and device.

    Parameters
    ----------
    client_rounds : pandas.DataFrame
        ``fl_client_rounds`` rows (``predicted_seconds`` from FL schema version 4).

    Returns
    -------
    pandas.DataFrame
        ``run_id, device, rounds, predicted_s, measured_s, median_error, worst_error,
        disturbed``: medians over the device's successful rounds with a prediction; the
        errors are ``|predicted - measured| / measured`` (median and largest); ``disturbed``
        counts the rounds the host disturbed (`host_disturbed_rounds`). Empty when no round
        has a prediction.
    """
    columns = ["run_id", "device", "rounds", "predicted_s", "measured_s", "median_error", "worst_error", "disturbed"]
    frame = fl_predicted_rounds(client_rounds)
    if frame.empty:
        return pd.DataFrame(columns=columns)
    rows = []
    for (rid, device), group in frame.groupby(["run_id", "device"], sort=True):
        rows.append(
            {
                "run_id": rid,
                "device": device,
                "rounds": len(group),
                "predicted_s": float(group["predicted_s"].median()),
                "measured_s": float(group["total_s"].median()),
                "median_error": float(group["error"].median()),
                "worst_error": float(group["error"].max()),
                "disturbed": int(group["disturbed"].sum()),
            }
        )
    return pd.DataFrame(rows, columns=columns)


def fl_feddrop_time_table(client_rounds: pd.DataFrame) -> pd.DataFrame:
    """FedDrop rounds on the devices: measured time beside the FLOPs the masks leave, per run and device.

    Parameters
    ----------
    client_rounds : pandas.DataFrame
        ``fl_client_rounds`` rows; the SyncDrop rounds are those whose ``metrics`` hold
        ``dense_train_flops`` and ``expected_train_flops`` (`fl.executors.devices.syncdrop_metrics`).

    Returns
    -------
    pandas.DataFrame
        ``run_id, device, rounds, expected_flops, sampled_flops, measured_s, dense_s,
        time_ratio, mask_s``, medians over the device's successful SyncDrop rounds:
        ``expected_flops`` and ``sampled_flops`` are the training FLOPs per example with the
        keep probabilities and with the drawn masks, as fractions of the dense model's;
        ``measured_s`` the client round (download, compute, upload); ``dense_s`` the
        profile's prediction of that round for the dense model (``profile_predicted_seconds``,
        else ``predicted_seconds``; NaN without one); ``time_ratio`` the median of
        ``measured / dense`` per round; ``mask_s`` the runner's time drawing masks. Empty
        when no round trained with SyncDrop masks.
    """
    columns = ["run_id", "device", "rounds", "expected_flops", "sampled_flops", "measured_s", "dense_s",
               "time_ratio", "mask_s"]  # fmt: skip
    if client_rounds.empty or "metrics" not in client_rounds:
        return pd.DataFrame(columns=columns)
    timeline = fl_timeline_table(client_rounds)
    ordered = client_rounds.sort_values(["run_id", "round", "cid"])  # fl_timeline_table's order
    per_round = []
    for (_, row), status, measured in zip(ordered.iterrows(), timeline["status"], timeline["total_s"], strict=True):
        metrics = row["metrics"] if isinstance(row["metrics"], Mapping) else json.loads(row["metrics"] or "{}")
        dense = _number(metrics.get("dense_train_flops"))
        if status != "ok" or not (dense > 0) or "expected_train_flops" not in metrics:
            continue
        predicted = _number(metrics.get("profile_predicted_seconds", row.get("predicted_seconds")))
        per_round.append(
            {
                "run_id": row["run_id"], "device": row["device"],
                "expected_flops": _number(metrics["expected_train_flops"]) / dense,
                "sampled_flops": _number(metrics.get("sampled_train_flops")) / dense,
                "measured_s": float(measured), "dense_s": predicted,
                "time_ratio": measured / predicted if predicted > 0 else math.nan,
                "mask_s": _number(metrics.get("mask_seconds")),
            }
        )  # fmt: skip
    if not per_round:
        return pd.DataFrame(columns=columns)
    frame = pd.DataFrame(per_round)
    grouped = frame.groupby(["run_id", "device"], sort=True)
    out = grouped.median(numeric_only=True).reset_index()
    out.insert(2, "rounds", grouped.size().to_numpy())
    return out[columns]


def prediction_errors(client_rounds: pd.DataFrame, *, skip_disturbed: bool = False) -> tuple[float, float, int]:
    """Return the median and worst ``|predicted - measured| / measured`` over every predicted client round.

    Parameters
    ----------
    client_rounds : pandas.DataFrame
        ``fl_client_rounds`` rows.
    skip_disturbed : bool
        Leave out the rounds the host disturbed (`host_disturbed_rounds`).

    Returns
    -------
    (median, worst, n)
        NaN and 0 rounds when none was predicted.
    """
    frame = fl_predicted_rounds(client_rounds)
    if skip_disturbed and not frame.empty:
        frame = frame[~frame["disturbed"].astype(bool)]
    if frame.empty:
        return math.nan, math.nan, 0
    return float(frame["error"].median()), float(frame["error"].max()), len(frame)


def fl_straggler_table(rounds: pd.DataFrame, client_rounds: pd.DataFrame) -> pd.DataFrame:
    """FLuID per round: the straggler, its target, its sub-model width and its time against the target.

    Parameters
    ----------
    rounds : pandas.DataFrame
        ``fl_rounds`` rows (``metrics`` with FLuID's ``target_seconds``).
    client_rounds : pandas.DataFrame
        ``fl_client_rounds`` rows.

    Returns
    -------
    pandas.DataFrame
        ``run_id, round, cid, device, width, seconds, predicted_s, target_s, over_target,
        disturbed`` for every straggler of a round with a target (``disturbed``: the host
        disturbed its round, `host_disturbed_rounds`).
    """
    columns = [
        "run_id", "round", "cid", "device", "width", "seconds", "predicted_s", "target_s", "over_target", "disturbed"
    ]  # fmt: skip
    if rounds.empty or client_rounds.empty:
        return pd.DataFrame(columns=columns)
    timeline = _timeline_with_predictions(client_rounds)
    rows = []
    for _, r in rounds.iterrows():
        metrics = r["metrics"] if isinstance(r["metrics"], Mapping) else json.loads(r["metrics"] or "{}")
        target = _number(metrics.get("target_seconds"))
        if not math.isfinite(target):
            continue
        these = timeline[(timeline["run_id"] == r["run_id"]) & (timeline["round"] == r["round"])]
        for _, s in these[these["straggler"] & (these["status"] == "ok")].iterrows():
            rows.append(
                {
                    "run_id": r["run_id"], "round": r["round"], "cid": s["cid"], "device": s["device"],
                    "width": s["width"], "seconds": s["total_s"], "predicted_s": s["predicted_s"], "target_s": target,
                    "over_target": s["total_s"] / target if target > 0 else math.nan,
                    "disturbed": bool(s["disturbed"]),
                }
            )  # fmt: skip
    return pd.DataFrame(rows, columns=columns)


def fl_plan_table(plans: pd.DataFrame, client_rounds: pd.DataFrame) -> pd.DataFrame:
    """Planned against realised, per run, plan revision and device.

    Parameters
    ----------
    plans : pandas.DataFrame
        ``fl_plans`` rows (``plan`` as the stored JSON text).
    client_rounds : pandas.DataFrame
        ``fl_client_rounds`` rows.

    Returns
    -------
    pandas.DataFrame
        ``run_id, revision, from_round, device, status, planned_width, trained_width,
        planned_s, measured_s, measured_vs_planned, rounds``: the revision's width and
        predicted round of the device, and over the device's successful client rounds while
        that revision was in force, the median width it trained and its median measured round
        (download + compute + upload). Empty without plans.
    """
    columns = [
        "run_id", "revision", "from_round", "device", "status", "planned_width", "trained_width", "planned_s",
        "measured_s", "measured_vs_planned", "rounds",
    ]  # fmt: skip
    if plans is None or plans.empty:
        return pd.DataFrame(columns=columns)
    rows = []
    for rid, group in plans.sort_values(["run_id", "revision"]).groupby("run_id", sort=True):
        starts = list(group["from_round"]) + [math.inf]
        mine = client_rounds[client_rounds["run_id"] == rid] if not client_rounds.empty else client_rounds
        for i, row in enumerate(group.itertuples(index=False)):
            plan = json.loads(row.plan) if isinstance(row.plan, str) else row.plan
            span = mine[(mine["round"] >= starts[i]) & (mine["round"] < starts[i + 1])] if not mine.empty else mine
            for device in plan.get("devices", ()):
                ok = span[(span["device"] == device["device"]) & (span["status"] == "ok")] if not span.empty else span
                measured = (
                    float((ok["download_seconds"] + ok["compute_seconds"] + ok["upload_seconds"]).median())
                    if not ok.empty
                    else math.nan
                )
                planned = device.get("round_s")
                rows.append(
                    {
                        "run_id": rid,
                        "revision": int(row.revision),
                        "from_round": int(row.from_round),
                        "device": device["device"],
                        "status": device.get("status"),
                        "planned_width": device.get("width"),
                        "trained_width": float(ok["width"].median()) if not ok.empty else math.nan,
                        "planned_s": planned,
                        "measured_s": measured,
                        "measured_vs_planned": measured / planned if planned else math.nan,
                        "rounds": len(ok),
                    }
                )
    return pd.DataFrame(rows, columns=columns)
