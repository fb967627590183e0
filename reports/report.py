"""Build the report from stored records: sources in, sections out, files written.

`load_sources` is the only function that reads the store (the cells through
`harness.store.ProfileStore`, the FL runs through `fl.runlog.read_history`, which
opens the file read-only). `build_sections`
turns `Sources` into page sections (tables from `reports.tables`, figures from
`reports.plots`), and `write_report` writes ``report.html`` with every figure as PNG
and SVG and every table as CSV, each file through a temporary file and a rename.

Missing data is explained on the page, never a crash: an empty store, a device with
failures only, a single width (no speed-up), no matmul probe (no roofline), one
backend only (no ORT/PyTorch comparison), no FL runs.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from devices.files import atomic_write
from fl.runlog import read_history
from harness.records import ModelRecord
from harness.store import ProfileStore
from harness.store_errors import StoreError
from reports import plots, tables
from reports.html import EmbeddedFigure, Page, Section, TableBlock, render_page

#: File name of the page inside the output directory.
REPORT_FILE = "report.html"
#: Runs with more clients get no per-client timeline and tier chart (one row per client would not read).
MAX_TIMELINE_CLIENTS = 40


@dataclass(frozen=True)
class Sources:
    """Everything the report reads, as DataFrames (no connection kept).

    Attributes
    ----------
    cells : pandas.DataFrame
        `ProfileStore.latest_cells` (all statuses).
    campaigns : pandas.DataFrame
        `ProfileStore.campaigns`.
    facts : mapping of str to mapping
        Device -> facts snapshot of its latest attempt.
    fl_runs, fl_rounds, fl_client_rounds : pandas.DataFrame
        The FL tables as stored (empty when no run was logged).
    store : str
        Path of the store, for the header.
    fl_plans : pandas.DataFrame
        The runs' plans and their revisions (``fl_plans``; empty when no run was planned).
    models : tuple of ModelRecord
        The users' own models measured or trained in the store (`ProfileStore.models`).
    """

    cells: pd.DataFrame
    campaigns: pd.DataFrame
    facts: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    fl_runs: pd.DataFrame = field(default_factory=pd.DataFrame)
    fl_rounds: pd.DataFrame = field(default_factory=pd.DataFrame)
    fl_client_rounds: pd.DataFrame = field(default_factory=pd.DataFrame)
    store: str = ""
    fl_plans: pd.DataFrame = field(default_factory=pd.DataFrame)
    models: tuple[ModelRecord, ...] = ()


def load_sources(db: str | os.PathLike[str]) -> Sources:
    """Read the store for the report.

    Parameters
    ----------
    db : path
        An existing profile store.

    Returns
    -------
    Sources

    Raises
    ------
    StoreError
        If there is no file at ``db`` or it is not a usable store.
    """
    path = Path(db)
    if not path.is_file():
        raise StoreError(f"no profile store at {path} (run `fleetbench profile --db {path}` first)")
    with ProfileStore(path) as store:
        cells = store.latest_cells()
        campaigns = store.campaigns()
        models = tuple(store.models())
        facts: dict[str, Mapping[str, Any]] = {}
        for m in store.measurements(latest=True):
            if m.facts:
                facts[m.spec.device] = dict(m.facts)
    fl = read_history(path)
    return Sources(cells, campaigns, facts, fl.runs, fl.rounds, fl.client_rounds, str(path), fl.plans, models)


# ---------------------------------------------------------------------------- sections


@dataclass(frozen=True)
class PendingFigure:
    """A matplotlib figure waiting to be written and embedded.

    Attributes
    ----------
    name : str
    caption : str
    figure : matplotlib.figure.Figure
    """

    name: str
    caption: str
    figure: Any


@dataclass(frozen=True)
class Draft:
    """A section before rendering: `Section` fields with matplotlib figures.

    Attributes
    ----------
    key, title : str
    paragraphs : tuple of str
    figures : tuple of PendingFigure
    tables : tuple of TableBlock
    notes : tuple of str
    """

    key: str
    title: str
    paragraphs: tuple[str, ...] = ()
    figures: tuple[PendingFigure, ...] = ()
    tables: tuple[TableBlock, ...] = ()
    notes: tuple[str, ...] = ()


def _fmt_devices(names: Sequence[str]) -> str:
    return ", ".join(str(n) for n in names)


def _summary(src: Sources, headline: pd.DataFrame) -> Draft:
    cells = src.cells
    notes: list[str] = []
    if cells.empty:
        notes.append(
            "The store holds no measured cells yet, so there is nothing to plot. Measure a fleet with "
            "`fleetbench profile --fleet FILE --db PATH` and run `fleetbench report --db PATH` again."
        )
        return Draft("summary", "Summary", notes=tuple(notes))
    ok = int((cells["status"] == "ok").sum())
    devices = sorted(set(cells["device"]))
    widths = sorted(set(cells.loc[cells["status"] == "ok", "width"]))
    text = (
        f"{len(cells)} cells (latest attempt of each) on {len(devices)} device(s): {ok} measured, "
        f"{len(cells) - ok} failed. Widths measured: {', '.join(f'{w:g}' for w in widths) or 'none'}. "
        "Latencies are per image of a full training step (forward, backward, optimizer), median over the "
        "timed steps after warm-up."
    )
    if ok == 0:
        notes.append("No cell was measured successfully; the device section lists every failure with its reason.")
    if emulated := tables.emulated_devices(cells):
        notes.append(
            f"{_fmt_devices(emulated)}: {tables.EMULATED_ISA} (an instruction-set emulator such as qemu-user ran "
            "the training), so those times are not a device's. Their cells are marked so in the latency table and "
            "left out of the headline, speed-up, roofline and ORT-vs-PyTorch comparisons."
        )
    return Draft(
        "summary",
        "Summary",
        paragraphs=(text,),
        tables=(
            TableBlock(
                "headline",
                "Median per-image training latency (µs) per width; speed-up of the narrowest against the widest "
                "width, its FLOPs ratio, and the fixed share of the full-width latency.",
                headline,
            ),
        ),
        notes=tuple(notes),
    )


def _latency(latency: pd.DataFrame, log_scale: bool) -> Draft:
    title = "Latency vs width"
    if latency.empty:
        return Draft("latency", title, notes=("No measured cell: no latency to plot (see the device section).",))
    notes = []
    if latency["width"].nunique() < 2:
        notes.append("Only one width was measured, so each device is a single point, not a curve.")
    noisy = latency[latency["noisy"].fillna(False).astype(bool)]
    if len(noisy):
        notes.append(
            f"{len(noisy)} of {len(latency)} cells are noisy (the 95 % interval of their robust coefficient of "
            "variation, 1.4826 MAD / median, lies above 5 %): the bulk of their steps is spread; prefer "
            "re-measuring on an idle device."
        )
    scale = "logarithmic" if log_scale else "linear"
    marked = [
        f"{d} ({tables.EMULATED_ISA})" if isa else d for d, isa in zip(latency["device"], latency["isa"], strict=True)
    ]
    return Draft(
        "latency",
        title,
        paragraphs=(
            "One line per device and backend: the median per-image training latency at each width, bars from "
            f"the 5th to the 95th percentile of the timed steps ({scale} latency axis).",
        ),
        figures=(
            PendingFigure(
                "latency_vs_width",
                "Per-image training latency vs sub-model width; markers are medians, bars p5–p95.",
                plots.latency_figure(latency.assign(device=marked), log_scale),
            ),
        ),
        tables=(
            TableBlock(
                "latency",
                "Every measured cell; precision = half-width of the median's 95 % interval / median; cv = stdev / "
                "mean of the samples, robust_cv = 1.4826 MAD / median, robust_cv_low the lower end of its 95 % "
                "interval (noisy: robust_cv_low above 5 %).",
                latency,
            ),
        ),
        notes=tuple(notes),
    )


def _memory(latency: pd.DataFrame) -> Draft:
    title = "Memory vs width"
    has = latency[np.isfinite(latency["peak_memory_mib"].astype(float))] if not latency.empty else latency
    if has.empty:
        return Draft("memory", title, notes=("No measured cell reported its peak memory.",))
    split = tables.memory_table(has)
    if split.empty:
        return Draft(
            "memory",
            title,
            paragraphs=(
                "Peak resident memory of the training process (VmHWM, else ru_maxrss) while training at each "
                "width. It includes the runtime itself, so it does not go to zero with the model: these cells' "
                "runner did not read the runtime's memory apart.",
            ),
            figures=(
                PendingFigure("memory_vs_width", "Peak memory vs width.", plots.memory_figure(has, "peak_memory_mib")),
            ),
        )
    without = int((~np.isfinite(has["model_memory_mib"].astype(float))).sum())
    left_out = f"{without} cells stored by a runner that did not read the runtime's memory are left out."
    notes = (left_out,) if without else ()
    return Draft(
        "memory",
        title,
        paragraphs=(
            "The peak resident memory of a training process (VmHWM, else ru_maxrss) is the runtime's own memory "
            "(the interpreter, numpy and the runtime imported, the data loaded, before any model opens) plus "
            "what the model adds: its session, parameters, gradients, optimizer state and the steps' "
            "activations. The figure shows the model's share per width; the table, the runtime's memory and "
            "the model's share of the peak at the widest width.",
        ),
        figures=(PendingFigure("memory_vs_width", "Memory the model adds vs width.", plots.memory_figure(has)),),
        tables=(TableBlock("memory", "The runtime's memory and the model's share of the peak.", split),),
        notes=notes,
    )


def _speedup(speed: pd.DataFrame) -> Draft:
    title = "Measured vs theoretical speed-up"
    intro = (
        "The theoretical speed-up of a width is the FLOPs ratio of the widest measured width to it; the measured "
        "speed-up is the ratio of their median latencies. FedDrop (Table 10) measured 1.75× for a 2× FLOPs "
        "reduction on an iPhone 12 Pro CPU. The gap is a fixed per-step cost: the device's latency model has a fixed "
        "term a that does not shrink with the model, and with its share φ of the full-width latency "
        "the speed-up is at most 1 / (φ + (1 − φ) / T) for a FLOPs ratio T (Amdahl's law)."
    )
    if speed.empty:
        return Draft(
            "speedup",
            title,
            paragraphs=(intro,),
            notes=(
                "No configuration was measured at two or more widths with known FLOPs, so no speed-up can be "
                "computed. Profile at least two widths (e.g. --widths 0.5,1.0).",
            ),
        )
    findings = []
    for key, g in speed.groupby(tables.CONFIG, sort=True):
        narrow = g.loc[g["width"].idxmin()]
        findings.append(
            f"{key[0]} ({key[3]}, batch {key[2]}): width {narrow['width']:g} runs "
            f"{narrow['measured_speedup']:.2f}× faster for a {narrow['flops_ratio']:.2f}× FLOPs reduction; the fit "
            f"puts {narrow['fixed_us']:.1f} µs per image in the fixed cost (φ = {narrow['fixed_share']:.0%}), "
            f"which predicts {narrow['modelled_speedup']:.2f}×."
        )
    notes = []
    beyond = speed[speed["measured_speedup"] > 1.05 * speed["flops_ratio"]]
    if len(beyond):
        where = ", ".join(sorted({f"{r.device} ({r.backend})" for r in beyond.itertuples()}))
        notes.append(
            f"{where}: a measured speed-up exceeds its FLOPs ratio, which fewer FLOPs alone cannot cause; the "
            "widest cell was probably slowed by contention or throttling. Check its noisy and throttled flags "
            "and re-measure before drawing conclusions."
        )
    return Draft(
        "speedup",
        title,
        notes=tuple(notes),
        paragraphs=(intro, *findings),
        figures=(
            PendingFigure(
                "speedup",
                "Markers: measured speed-up per width; dotted: ideal; lines: speed-up predicted by the fixed share φ.",
                plots.speedup_figure(speed),
            ),
        ),
        tables=(TableBlock("speedup", "Speed-up per width against the widest measured width.", speed),),
    )


def _roofline(roof: pd.DataFrame) -> Draft:
    title = "Roofline efficiency"
    intro = (
        "Achieved training throughput (training FLOPs per image / median per-image latency) as a fraction of the "
        "device's measured matmul GFLOP/s (the runner's probe). Small widths are launch- and memory-bound, so "
        "their fraction is lower."
    )
    usable = roof[np.isfinite(roof["fraction"].astype(float))] if not roof.empty else roof
    if usable.empty:
        return Draft(
            "roofline",
            title,
            paragraphs=(intro,),
            notes=("No measured cell has both training FLOPs and a matmul probe result, so no efficiency is shown.",),
        )
    return Draft(
        "roofline",
        title,
        paragraphs=(intro,),
        figures=(PendingFigure("roofline", "Achieved / matmul GFLOP/s per width.", plots.roofline_figure(usable)),),
        tables=(TableBlock("roofline", "Achieved and peak GFLOP/s per cell.", roof),),
    )


def _energy(energy: pd.DataFrame, without: Mapping[str, str]) -> Draft:
    title = "Energy vs width"
    intro = (
        "Energy of a training step per image, read from each device's power sensor over the timed steps "
        "(joules over the images they trained), beside the same cells' latency; above idle subtracts the "
        "device's idle draw over the same seconds, measured just before the steps."
    )
    notes = [f"{device}: no energy ({why})." for device, why in without.items()]
    measured = energy[np.isfinite(energy["energy_mj"].astype(float))] if not energy.empty else energy
    if measured.empty:
        notes.insert(0, "No measured cell carries energy: run `fleetbench profile` on devices with a power sensor.")
        tables_ = (TableBlock("energy", "Cells whose energy was flagged.", energy),) if not energy.empty else ()
        return Draft("energy", title, paragraphs=(intro,), tables=tables_, notes=tuple(notes))
    emulated = sorted(set(measured.loc[measured["emulated"] != "", "device"]))
    if emulated:
        notes.append(
            f"{_fmt_devices(emulated)}: {tables.EMULATED_SENSOR} (a driver writes watts modelled from the "
            "device's cpu use), so their joules are a model's, not a device's."
        )
    figures = [
        PendingFigure(
            "energy_vs_width",
            "Per-image training latency (left) and energy (right, bars ± the sensor's uncertainty) vs width.",
            plots.energy_figure(energy),
        )
    ]
    if np.isfinite(measured["train_mflops"].astype(float)).any():
        figures.append(
            PendingFigure(
                "energy_vs_flops",
                "Per-image training energy vs the width's training FLOPs per image.",
                plots.energy_flops_figure(energy),
            )
        )
    return Draft(
        "energy",
        title,
        paragraphs=(intro,),
        figures=tuple(figures),
        tables=(
            TableBlock(
                "energy",
                "Every cell with energy: mJ per image, above idle, the uncertainty, the sensor and its flag.",
                energy,
            ),
        ),
        notes=tuple(notes),
    )


def _prediction(errors: pd.DataFrame, summary: pd.DataFrame, by_width: pd.DataFrame) -> Draft:
    title = "Latency-model prediction error"
    intro = (
        "Each width is left out in turn, the device's latency model (per-image time = a non-negative sum of a "
        "fixed cost, conv / linear / LSTM training FLOPs and bytes moved, fitted per device) is refitted on the "
        "other widths of the same configuration, and the left-out width is predicted: the error says how far an "
        "unmeasured width can be trusted. The narrowest and the widest widths are extrapolations; the model's own "
        "uncertainty (one standard deviation) is listed beside each prediction."
    )
    if errors.empty:
        return Draft(
            "prediction",
            title,
            paragraphs=(intro,),
            notes=("Leave-one-out needs at least two measured widths per configuration; none has them.",),
        )
    return Draft(
        "prediction",
        title,
        paragraphs=(intro,),
        figures=(
            PendingFigure(
                "prediction_error", "Leave-one-width-out error; band: ±10 %.", plots.prediction_figure(errors)
            ),
        ),
        tables=(
            TableBlock(
                "prediction_by_width", "Error per left-out width (rows) on every device (columns).", by_width
            ),
            TableBlock("prediction_summary", "Median and worst absolute error per device.", summary),
            TableBlock("prediction_error", "Every left-out width, with the prediction's uncertainty.", errors),
        ),
        notes=tuple(_beyond_ten(by_width)),
    )


def _beyond_ten(by_width: pd.DataFrame) -> list[str]:
    worst = by_width[by_width["max_abs_error"] > 0.10] if not by_width.empty else by_width
    if worst.empty:
        return []
    where = ", ".join(f"{r.model} width {r.width:g} ({r.max_abs_error:.0%})" for r in worst.itertuples())
    return [f"Widths predicted more than 10 % off on some device: {where}."]


def _measurement(cells: pd.DataFrame, isolation: pd.DataFrame) -> Draft:
    title = "Measurement: isolation and precision"
    intro = (
        "Devices that share this host's cpus (local devices, emulated devices, devices at a loopback address) "
        "are measured one at a time unless they are pinned to disjoint cpus; devices on other hosts are measured "
        "at the same time. Each cell is sampled until the distribution-free 95 % interval of its median is within "
        "the target precision, or until its time cap; a cell that missed is flagged imprecise with the reason."
    )
    ok = tables.ok_cells(cells)
    if ok.empty:
        return Draft("measurement", title, paragraphs=(intro,), notes=("No measured cell.",))
    notes = []
    if "imprecise" in ok.columns:
        missed = ok[ok["imprecise"].fillna(False).astype(bool)]
        for r in missed.itertuples():
            notes.append(f"{r.device} width {r.width:g} ({r.backend}): {r.message}")
    paragraphs = [intro]
    if not isolation.empty:
        alone = isolation[isolation["concurrent"] == 0]["device"].tolist()
        together = isolation[isolation["concurrent"] > 0]
        if alone:
            paragraphs.append(f"Measured alone: {_fmt_devices(alone)}.")
        for r in together.itertuples():
            paragraphs.append(
                f"{r.device}: {r.concurrent} of {r.cells} cells measured beside {r.concurrent_with} ({r.reason})."
            )
    else:
        notes.append("These cells were stored before fleetbench recorded how cells were isolated.")
    blocks = (TableBlock("isolation", "Per device: cells measured alone, beside other devices, and why.", isolation),)
    return Draft("measurement", title, paragraphs=tuple(paragraphs), tables=blocks, notes=tuple(notes))


def _backends(pairs: pd.DataFrame, cells: pd.DataFrame) -> Draft:
    title = "ONNX Runtime vs PyTorch"
    intro = (
        "Where a device was measured with two backends at the same model, batch and width, each in its own "
        "process: the latency of one over the other's (below 1 means the first is faster). Backends: ort (the "
        "ONNX Runtime training build), onnx (the portable step model on plain onnxruntime) and torch (PyTorch)."
    )
    if pairs.empty:
        seen = sorted(set(cells["backend"])) if not cells.empty else []
        return Draft(
            "backends",
            title,
            paragraphs=(intro,),
            notes=(
                "No device has measured cells of two backends (seen: "
                f"{', '.join(seen) or 'none'}). Profile with --backend ort,onnx,torch to compare.",
            ),
        )
    ort_torch = pairs[(pairs["backend"] == "ort") & (pairs["baseline"] == "torch")]
    blocks = [TableBlock("backend_pairs", "Every pair measured at the same cell.", pairs)]
    if not ort_torch.empty:
        blocks.append(
            TableBlock("ort_vs_torch", "ORT training build and PyTorch side by side.", tables.backend_table(cells))
        )
    return Draft(
        "backends",
        title,
        paragraphs=(intro,),
        figures=(
            PendingFigure("backend_pairs", "Latency ratio per width and backend pair.", plots.backend_figure(pairs)),
        ),
        tables=tuple(blocks),
    )


def _devices(devices: pd.DataFrame, failures: pd.DataFrame) -> Draft:
    title = "Devices"
    if devices.empty:
        return Draft("devices", title, notes=("No device appears in the store.",))
    notes = []
    only_failed = devices[(devices["cells"] > 0) & (devices["ok"] == 0)]
    for _, row in only_failed.iterrows():
        reasons = sorted(set(failures.loc[failures["device"] == row["device"], "status"]))
        notes.append(
            f"{row['device']} has failures only ({row['failed']} cells: {', '.join(reasons)}); it appears in no plot."
        )
    throttled = devices[devices["throttled"] > 0]
    for _, row in throttled.iterrows():
        count = int(row["throttled"])
        notes.append(
            f"{row['device']}: {count} cell{'s' if count != 1 else ''} ran while the CPU was throttled "
            "(frequency dropped or a throttle flag was set); treat those latencies with care."
        )
    facts = devices[["device", "platform", "arch", "isa", "cpu", "cores", "mem_mib", "os", "onnxruntime", "torch"]]
    outcomes = devices[
        ["device", "backends", "cells", "ok", "failed", "throttled", "noisy", "imprecise", "matmul_gflops"]
    ]
    blocks = [
        TableBlock("devices", "What each device is (facts of its latest probe) and its backend versions.", facts),
        TableBlock(
            "device_cells",
            "Cells per device (latest attempts): measured, failed, measured while throttled, noisy (robust cv > "
            "5 %), imprecise (median's 95 % interval wider than its target); matmul GFLOP/s is the median of the "
            "runner's probe.",
            outcomes,
        ),
    ]
    if not failures.empty:
        blocks.append(TableBlock("failures", "Cells whose latest attempt failed, with the reason.", failures))
    return Draft("devices", title, tables=tuple(blocks), notes=tuple(notes))


def _energy_note(clients: pd.DataFrame) -> str:
    """Say how a run's measured energy per client round compares with the predicted one."""
    both = clients[np.isfinite(clients["measured_j"]) & np.isfinite(clients["predicted_j"])]
    if both.empty:
        return (
            "Energy per client round is predicted from the profiles; no round was measured (no sensor, or the "
            "sensor updates slower than the round's steps last)."
        )
    error = ((both["predicted_j"] - both["measured_j"]).abs() / both["measured_j"]).median()
    emulated = " (emulated sensors)" if (both["sensor"] == "emulated").all() else ""
    return (
        f"Energy: over {len(both)} client rounds measured{emulated}, |predicted - measured| / measured is "
        f"{error:.1%} in the median."
    )


def _fl(src: Sources) -> list[Draft]:
    title = "Federated learning runs"
    if src.fl_runs.empty or src.fl_rounds.empty:
        return [
            Draft(
                "fl",
                title,
                notes=(
                    "No federated learning run is logged in this store yet. Once an FL run writes its rounds "
                    "(tables fl_runs, fl_rounds, fl_client_rounds), this section shows accuracy per round per "
                    "width, a round timeline with stragglers highlighted and tier membership over rounds.",
                ),
            )
        ]
    drafts = []
    accuracy = tables.fl_accuracy_table(src.fl_rounds)
    timeline = tables.fl_timeline_table(src.fl_client_rounds)
    tiers = tables.fl_tier_table(src.fl_client_rounds)
    virtual = tables.fl_virtual_table(src.fl_rounds, src.fl_client_rounds)
    predictions = tables.fl_prediction_table(src.fl_client_rounds)
    straggler_rounds = tables.fl_straggler_table(src.fl_rounds, src.fl_client_rounds)
    feddrop = tables.fl_feddrop_time_table(src.fl_client_rounds)
    planned = tables.fl_plan_table(src.fl_plans, src.fl_client_rounds)
    client_energy, fleet_energy = tables.fl_energy_tables(src.fl_rounds, src.fl_client_rounds)
    for _, run in src.fl_runs.iterrows():
        rid = int(run["id"])
        key = f"fl-run-{rid}"
        acc = accuracy[accuracy["run_id"] == rid] if not accuracy.empty else accuracy
        tl = timeline[timeline["run_id"] == rid] if not timeline.empty else timeline
        tr = tiers[tiers["run_id"] == rid] if not tiers.empty else tiers
        vt = virtual[virtual["run_id"] == rid] if not virtual.empty else virtual
        figures, blocks, notes = [], [], []
        if acc.empty:
            notes.append("No round of this run was evaluated yet.")
        else:
            figures.append(
                PendingFigure(
                    f"fl_run{rid}_accuracy", "Test accuracy per round per width.", plots.fl_accuracy_figure(acc)
                )
            )
            blocks.append(TableBlock(f"fl_run{rid}_accuracy", "Evaluation per round and width.", acc))
        if not vt.empty:
            figures.append(
                PendingFigure(
                    f"fl_run{rid}_virtual",
                    "Virtual clock of the population: one band per round (it closes when its K-th client "
                    "finishes, or at the deadline), one mark per sampled client at its virtual finish time.",
                    plots.fl_virtual_figure(vt),
                )
            )
        many = tl["cid"].nunique() > MAX_TIMELINE_CLIENTS if not tl.empty else False
        if tl.empty:
            notes.append("No client round of this run is logged.")
        elif many:
            notes.append(
                f"{tl['cid'].nunique()} clients: more than {MAX_TIMELINE_CLIENTS}, so no per-client timeline "
                "and tier chart (the virtual clock figure shows every client round)."
            )
        if not tl.empty:
            figures.extend([] if many else [
                PendingFigure(
                    f"fl_run{rid}_timeline",
                    "One bar per client and round: download, compute, upload; stragglers outlined, failures hatched.",
                    plots.fl_timeline_figure(tl),
                ),
                PendingFigure(f"fl_run{rid}_tiers", "Tier of every client in every round.", plots.fl_tier_figure(tl)),
            ])  # fmt: skip
            blocks.append(TableBlock(f"fl_run{rid}_tiers", "Clients and stragglers per tier and round.", tr))
            stragglers = int(tl["straggler"].sum())
            failed = int((tl["status"] != "ok").sum())
            notes_text = f"{len(tl)} client rounds, {stragglers} straggler(s), {failed} failed."
        pr = predictions[predictions["run_id"] == rid] if not predictions.empty else predictions
        st = straggler_rounds[straggler_rounds["run_id"] == rid] if not straggler_rounds.empty else straggler_rounds
        extra = []
        if not pr.empty:
            median, worst, n = tables.prediction_errors(src.fl_client_rounds[src.fl_client_rounds["run_id"] == rid])
            extra.append(
                f"Round-cost model: over {n} client rounds, |predicted - measured| / measured is {median:.1%} in the "
                f"median and {worst:.1%} at worst (predicted: fixed cost + steps x batch x per-image latency + "
                "transfers; measured: download + compute + upload)."
            )
            blocks.append(
                TableBlock(f"fl_run{rid}_predicted", "Predicted against measured client round, per device.", pr)
            )
        if not st.empty:
            blocks.append(
                TableBlock(
                    f"fl_run{rid}_stragglers",
                    "FLuID per round: the straggler, its sub-model width, its round time against the target.",
                    st,
                )
            )
        pl = planned[planned["run_id"] == rid] if not planned.empty else planned
        if not pl.empty:
            revisions = int(pl["revision"].max())
            extra.append(
                f"Planned on the measured profiles (fleetbench plan); revised {revisions} time(s) from the measured "
                "rounds." if revisions else "Planned on the measured profiles (fleetbench plan); never revised."
            )
            blocks.append(
                TableBlock(
                    f"fl_run{rid}_plan",
                    "The plan against what happened, per plan revision and device: planned width and round, the "
                    "width trained and the measured round (medians over its rounds under that revision).",
                    pl,
                )
            )
        ce = client_energy[client_energy["run_id"] == rid]
        if not ce.empty:
            fe = fleet_energy[fleet_energy["run_id"] == rid]
            extra.append(_energy_note(ce))
            blocks.append(TableBlock(f"fl_run{rid}_energy_rounds", "Energy per fleet round (sums of its clients).", fe))
            blocks.append(
                TableBlock(
                    f"fl_run{rid}_energy_clients",
                    "Energy per client round: predicted (the profile's energy per image at the width trained x the "
                    "images trained) and measured by the device's power sensor over the round's steps.",
                    ce,
                )
            )
        fd = feddrop[feddrop["run_id"] == rid] if not feddrop.empty else feddrop
        if not fd.empty:
            extra.append(_feddrop_note(fd))
            blocks.append(
                TableBlock(
                    f"fl_run{rid}_feddrop",
                    "FedDrop on the devices, per device (medians over its rounds): expected and sampled training "
                    "FLOPs as fractions of the dense model's, the measured client round, the profile's prediction "
                    "of the dense round, their ratio, and the seconds spent drawing masks.",
                    fd,
                )
            )
        rounds = src.fl_rounds[src.fl_rounds["run_id"] == rid]
        text = (
            f"Run {rid}: strategy {run['strategy']}, model {run['model']}, data set {run['dataset']}, executor "
            f"{run['executor']}, seed {run['seed']}; {len(rounds)} of {run['rounds']} rounds logged "
            f"(status {run['status']})."
        )
        paragraphs = [text] + ([notes_text] if not tl.empty else []) + extra
        drafts.append(
            Draft(
                key, f"FL run {rid}: {run['strategy']}", tuple(paragraphs), tuple(figures), tuple(blocks), tuple(notes)
            )
        )
    return drafts


def _feddrop_note(feddrop: pd.DataFrame) -> str:
    """Say plainly what SyncDrop's masks do to a device's time (`tables.fl_feddrop_time_table` rows)."""
    flops = float(feddrop["expected_flops"].median())
    ratio = feddrop["time_ratio"].dropna()
    measured = (
        f"the measured rounds took {float(ratio.median()):.2f}x the profile's dense prediction (median over "
        f"devices, {float(ratio.min()):.2f}x to {float(ratio.max()):.2f}x)"
        if not ratio.empty
        else "no dense prediction was logged to compare the measured rounds with"
    )
    return (
        f"FedDrop's masks leave {flops:.0%} of the dense model's training FLOPs in expectation (median over "
        f"devices), and {measured}. The masks multiply the outputs of dense kernels: a dropped neuron is "
        "still computed, so masks save no time without sparse kernels, and none of this project's runner "
        "backends has them. The FLOPs are what FedDrop's budgets bound; the time is what the device spends."
    )


def _models_block(models: Sequence[ModelRecord]) -> tuple[TableBlock, ...]:
    if not models:
        return ()
    frame = pd.DataFrame(
        {
            "model": [m.name for m in models],
            "source": [m.source for m in models],
            "definition sha256": [m.digest for m in models],
            "channel groups": [len(m.groups) for m in models],
            "notes": ["; ".join(m.notes) or "—" for m in models],
        }
    )
    caption = "Your own models: where each is defined and the hash of its definition (a changed model is a new name)."
    return (TableBlock("models", caption, frame),)


def _provenance(campaigns: pd.DataFrame, models: Sequence[ModelRecord] = ()) -> Draft:
    if campaigns.empty:
        return Draft(
            "provenance", "Provenance", notes=("No campaign is recorded in the store.",), tables=_models_block(models)
        )
    frame = campaigns.copy()
    frame["started"] = [
        datetime.fromtimestamp(float(t), tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC") for t in frame["started_at"]
    ]
    frame["git_commit"] = [str(c)[:12] if isinstance(c, str) else "—" for c in frame["git_commit"]]
    frame["versions"] = [
        ", ".join(f"{k} {v}" for k, v in sorted(json.loads(v or "{}").items())) for v in frame["versions"]
    ]
    return Draft(
        "provenance",
        "Provenance",
        paragraphs=("Every campaign in the store, with the host's tool versions and the fleetbench commit.",),
        tables=(
            TableBlock(
                "campaigns",
                "Campaigns (cells = attempts recorded).",
                frame[["id", "started", "fleet", "model", "cells", "git_commit", "versions"]],
            ),
            *_models_block(models),
        ),
    )


def build_sections(src: Sources, log_scale: bool = False) -> tuple[list[Draft], pd.DataFrame]:
    """Build every section of the report from the sources (no I/O).

    Parameters
    ----------
    src : Sources
    log_scale : bool
        Logarithmic latency axis.

    Returns
    -------
    drafts : list of Draft
        The sections in page order, figures not yet rendered.
    headline : pandas.DataFrame
        `reports.tables.headline_table`, also printed by the CLI.
    """
    cells = src.cells
    headline = tables.headline_table(cells)
    latency = tables.latency_table(cells)
    errors = tables.prediction_error_table(cells)
    drafts = [
        _summary(src, headline),
        _latency(latency, log_scale),
        _memory(latency),
        _speedup(tables.speedup_table(cells)),
        _roofline(tables.roofline_table(cells)),
        _energy(tables.energy_table(cells), tables.devices_without_energy(cells)),
        _prediction(errors, tables.prediction_summary(errors), tables.prediction_by_width(errors)),
        _backends(tables.backend_pairs_table(cells), cells),
        _measurement(cells, tables.isolation_table(cells)),
        _devices(tables.device_table(cells, src.facts), tables.failures_table(cells)),
        *_fl(src),
        _provenance(src.campaigns, src.models),
    ]
    return drafts, headline


def write_report(
    src: Sources, out_dir: str | os.PathLike[str], *, log_scale: bool = False, now: datetime | None = None
) -> tuple[Path, pd.DataFrame]:
    """Write ``report.html``, every figure as PNG and SVG and every table as CSV.

    Parameters
    ----------
    src : Sources
    out_dir : path
        Created when missing.
    log_scale : bool
        Logarithmic latency axis.
    now : datetime, optional
        Time stamp for the header (default: now, UTC).

    Returns
    -------
    path : Path
        The written ``report.html``.
    headline : pandas.DataFrame
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    drafts, headline = build_sections(src, log_scale)
    sections = []
    for d in drafts:
        figures = tuple(EmbeddedFigure(f.name, f.caption, plots.save_figure(f.figure, out, f.name)) for f in d.figures)
        for block in d.tables:
            atomic_write(out / f"{block.name}.csv", block.frame.to_csv(index=False))
        sections.append(Section(d.key, d.title, d.paragraphs, figures, d.tables, d.notes))
    stamp = (now or datetime.now(timezone.utc)).strftime("%Y-%m-%d %H:%M UTC")
    cells = src.cells
    commits = sorted(
        {str(c)[:12] for c in src.campaigns.get("git_commit", pd.Series(dtype=object)) if isinstance(c, str)}
    )
    facts = (
        ("store", src.store or "—"),
        ("generated", stamp),
        ("campaigns", str(len(src.campaigns))),
        ("devices", str(cells["device"].nunique()) if not cells.empty else "0"),
        ("cells", str(len(cells))),
        ("commit", ", ".join(commits) or "—"),
    )
    page = Page("fleetbench report: training cost of sub-models per device", facts, tuple(sections))
    path = out / REPORT_FILE
    atomic_write(path, render_page(page))
    return path, headline


def format_headline(headline: pd.DataFrame, emulated: Sequence[str] = ()) -> str:
    """Render the headline table for the terminal.

    Parameters
    ----------
    headline : pandas.DataFrame
        `reports.tables.headline_table` output.
    emulated : sequence of str
        Devices whose cells ran under an instruction-set emulator (`reports.tables.emulated_devices`):
        the headline leaves them out, and an empty one says so.

    Returns
    -------
    str
        A fixed-width table, or one line saying why there is none.
    """
    if headline.empty and emulated:
        return (f"(no headline: the cells of {', '.join(emulated)} ran under an instruction-set emulator, so they "
                "are left out of it; the report shows them)")
    if headline.empty:
        return "(no cells in the store)"
    frame = headline.copy()
    for column in frame.columns:
        if column.startswith("w="):
            frame[column] = [("—" if math.isnan(v) else f"{v:,.1f}") for v in frame[column]]
    for column in ("speedup", "theory"):
        frame[column] = [("—" if math.isnan(v) else f"{v:.2f}x") for v in frame[column]]
    frame["fixed_share"] = [("—" if math.isnan(v) else f"{v:.0%}") for v in frame["fixed_share"]]
    return frame.to_string(index=False)
