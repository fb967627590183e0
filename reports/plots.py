"""Report figures: matplotlib (Agg) figures from report tables, saved as PNG and SVG.

Every ``*_figure`` function takes a `reports.tables` DataFrame and returns a
`matplotlib.figure.Figure`; `save_figure` writes it (atomically) as PNG and SVG.
One style for all: a colour per device, a line style per backend, axes with units,
a light grid, and legends outside the data where they would cover it.
"""

from __future__ import annotations

import functools
import io
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar, cast

import matplotlib

from devices.files import atomic_write

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402 - the backend must be chosen first
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.colors import ListedColormap  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter  # noqa: E402

#: Colour cycle (Okabe-Ito, readable by colour-blind readers and in greyscale print).
PALETTE = ("#0072B2", "#E69F00", "#009E73", "#D55E00", "#CC79A7", "#56B4E9", "#F0E442", "#000000")
#: Line style and marker per backend.
BACKEND_STYLE = {"ort": ("-", "o"), "torch": ("--", "s"), "onnx": (":", "D")}
#: Line style and marker per backend pair of the runtime comparison (`reports.tables.BACKEND_PAIRS`).
PAIR_STYLE = {("ort", "torch"): ("-", "o"), ("onnx", "ort"): ("-.", "D"), ("onnx", "torch"): (":", "v")}
#: How the runtime comparison names a backend.
BACKEND_NAMES = {"ort": "ORT training", "onnx": "portable", "torch": "PyTorch"}
#: Pixels per inch of the PNG files.
DPI = 144

_RC: Any = {
    "figure.figsize": (6.4, 3.8),
    "font.size": 9.5,
    "axes.titlesize": 10.5,
    "axes.titleweight": "bold",
    "axes.labelsize": 9.5,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.grid": True,
    "grid.color": "#d9d9d9",
    "grid.linewidth": 0.6,
    "legend.fontsize": 8.5,
    "legend.frameon": False,
    "lines.linewidth": 1.6,
    "lines.markersize": 5,
    "svg.fonttype": "none",
    "svg.hashsalt": "fleetbench",
}


_F = TypeVar("_F", bound=Callable[..., Any])


def _styled(function: _F) -> _F:
    """Run a plotting or saving function under the report's rcParams (read when artists are made)."""

    @functools.wraps(function)
    def run(*args: Any, **kwargs: Any) -> Any:
        with plt.rc_context(_RC):
            return function(*args, **kwargs)

    return cast(_F, run)


def _figure(width: float = 6.4, height: float = 3.8) -> tuple[Figure, Any]:
    fig = Figure(figsize=(width, height), layout="constrained")
    ax = fig.add_subplot()
    return fig, ax


def device_colours(devices: list[str]) -> dict[str, str]:
    """Return a stable colour per device (sorted names take the palette in order).

    Parameters
    ----------
    devices : list of str

    Returns
    -------
    dict of str to str
        Device -> hex colour.
    """
    return {d: PALETTE[i % len(PALETTE)] for i, d in enumerate(sorted(set(devices)))}


def _configs(frame: pd.DataFrame, keys: list[str]) -> Iterator[tuple[str, dict[str, Any], pd.DataFrame]]:
    """Yield ``(label, key values, rows)`` per configuration; the label names only what varies."""
    varying = [k for k in keys if k == "device" or frame[k].nunique() > 1]
    for values, group in frame.groupby(keys, sort=True):
        key = dict(zip(keys, values if isinstance(values, tuple) else (values,), strict=True))
        parts = [str(key[k]) if k in ("device", "backend", "model") else f"{k} {key[k]}" for k in varying]
        yield " · ".join(parts), key, group.sort_values("width")


def _style(key: dict[str, Any], colours: dict[str, str]) -> dict[str, Any]:
    linestyle, marker = BACKEND_STYLE.get(str(key.get("backend", "ort")), ("-.", "^"))
    return {"color": colours.get(str(key["device"]), PALETTE[0]), "linestyle": linestyle, "marker": marker}


def _width_axis(ax: Any, widths: Any) -> None:
    ticks = sorted({float(w) for w in widths})
    ax.set_xticks(ticks)
    ax.set_xticklabels([f"{w:g}" for w in ticks])
    ax.set_xlabel("sub-model width (fraction of the full model)")


_CONFIG = ["device", "model", "batch", "backend"]


def _width_lines(
    ax: Any, frame: pd.DataFrame, column: str, colours: dict[str, str], scale: float = 1.0, keys: list[str] = _CONFIG
) -> None:
    """Plot ``scale * frame[column]`` against width, one styled line per configuration, and label the width axis."""
    for label, key, g in _configs(frame, keys):
        ax.plot(g["width"], scale * g[column], label=label, **_style(key, colours))
    _width_axis(ax, frame["width"])


@_styled
def latency_figure(latency: pd.DataFrame, log_scale: bool = False) -> Figure:
    """Median per-image training latency against width, with p5-p95 bars.

    Parameters
    ----------
    latency : pandas.DataFrame
        `reports.tables.latency_table` output (not empty).
    log_scale : bool
        Logarithmic latency axis.

    Returns
    -------
    Figure
    """
    fig, ax = _figure()
    colours = device_colours(list(latency["device"]))
    groups = list(_configs(latency, _CONFIG))
    # Dodge the configurations sideways a little so that overlapping p5-p95 bars stay readable.
    span = float(latency["width"].max() - latency["width"].min()) or 1.0
    step = 0.006 * span
    for i, (label, key, g) in enumerate(groups):
        low = (g["median_us"] - g["p5_us"]).clip(lower=0)
        high = (g["p95_us"] - g["median_us"]).clip(lower=0)
        x = g["width"] + (i - (len(groups) - 1) / 2) * step
        ax.errorbar(x, g["median_us"], yerr=[low, high], capsize=3, label=label, **_style(key, colours))
    if log_scale:
        ax.set_yscale("log")
        ax.yaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
        ax.yaxis.set_major_formatter(FuncFormatter(lambda value, _pos: f"{value:,.0f}" if value >= 1 else f"{value:g}"))
        ax.yaxis.set_minor_formatter(NullFormatter())
    else:
        ax.set_ylim(bottom=0)
    _width_axis(ax, latency["width"])
    ax.set_ylabel("training latency per image (µs)")
    ax.set_title("Training latency vs width (median, bars p5–p95)")
    ax.legend(loc="upper left")
    return fig


@_styled
def memory_figure(latency: pd.DataFrame, column: str = "model_memory_mib") -> Figure:
    """Memory of training against width: what the model adds to the runtime, or the whole peak.

    Parameters
    ----------
    latency : pandas.DataFrame
        `reports.tables.latency_table` output with some finite values in ``column``.
    column : {"model_memory_mib", "peak_memory_mib"}
        The model's share of the peak (the peak less the runtime's memory before the model
        opened), or the process's whole peak.

    Returns
    -------
    Figure
    """
    fig, ax = _figure()
    colours = device_colours(list(latency["device"]))
    _width_lines(ax, latency[np.isfinite(latency[column].astype(float))], column, colours)
    ax.set_ylim(bottom=0)
    if column == "model_memory_mib":
        ax.set_ylabel("peak less the runtime's (MiB)")
        ax.set_title("Memory the model adds to the runtime vs width")
    else:
        ax.set_ylabel("peak memory (MiB)")
        ax.set_title("Peak memory of a training step vs width")
    ax.legend(loc="best")
    return fig


@_styled
def speedup_figure(speed: pd.DataFrame) -> Figure:
    """Measured speed-up against the theoretical (FLOPs) speed-up, with the fixed-cost model.

    Parameters
    ----------
    speed : pandas.DataFrame
        `reports.tables.speedup_table` output (not empty).

    Returns
    -------
    Figure
    """
    fig, ax = _figure(6.4, 4.2)
    colours = device_colours(list(speed["device"]))
    top = float(max(speed["flops_ratio"].max(), speed["measured_speedup"].max())) * 1.08
    grid = np.linspace(1.0, top, 100)
    ax.plot(grid, grid, color="#7f7f7f", linewidth=1.0, linestyle=":")
    handles: list[Any] = [Line2D([], [], color="#7f7f7f", linewidth=1.0, linestyle=":", label="ideal")]
    for label, key, g in _configs(speed, _CONFIG):
        style = _style(key, colours)
        share = float(g["fixed_share"].iloc[0])
        model = 1.0 / (share + (1.0 - share) / grid)
        ax.plot(grid, model, color=style["color"], linestyle=style["linestyle"], linewidth=1.0, alpha=0.75)
        ax.plot(g["flops_ratio"], g["measured_speedup"], linestyle="none", marker=style["marker"], color=style["color"])
        handles.append(Line2D([], [], label=f"{label} (fixed share φ = {share:.0%})", **style))
    ax.set_xlim(1.0, top)
    ax.set_ylim(bottom=min(1.0, float(speed["measured_speedup"].min()) * 0.95))
    ax.set_xlabel("theoretical speed-up (FLOPs of widest / FLOPs of width)")
    ax.set_ylabel("measured speed-up (latency ratio)")
    ax.set_title("Measured speed-up (markers) and the fixed share's speed-up (lines)")
    ax.legend(handles=handles, loc="upper left")
    return fig


@_styled
def roofline_figure(roof: pd.DataFrame) -> Figure:
    """Achieved training GFLOP/s as a share of the device's measured matmul GFLOP/s.

    Parameters
    ----------
    roof : pandas.DataFrame
        `reports.tables.roofline_table` output with some finite ``fraction``.

    Returns
    -------
    Figure
    """
    fig, ax = _figure()
    colours = device_colours(list(roof["device"]))
    _width_lines(ax, roof[np.isfinite(roof["fraction"].astype(float))], "fraction", colours, scale=100.0)
    ax.set_ylim(bottom=0)
    ax.set_ylabel("achieved / matmul peak (%)")
    ax.set_title("Roofline efficiency of training vs width")
    ax.legend(loc="upper left")
    return fig


def _marked(frame: pd.DataFrame) -> pd.DataFrame:
    """Return ``frame`` with its devices named ``device (emulated sensor)`` where its ``emulated`` column says so."""
    names = [f"{d} ({e})" if e else str(d) for d, e in zip(frame["device"], frame["emulated"], strict=True)]
    return frame.assign(device=names)


@_styled
def energy_figure(energy: pd.DataFrame) -> Figure:
    """Energy per image against width per device, beside the latency of the same cells.

    Parameters
    ----------
    energy : pandas.DataFrame
        `reports.tables.energy_table` output with some finite ``energy_mj``.

    Returns
    -------
    Figure
        Two panels sharing the width axis: median latency per image (µs) and energy per
        image (mJ, bars +- its uncertainty); an emulated device's sensor is named so.
    """
    measured = _marked(energy[np.isfinite(energy["energy_mj"].astype(float))])
    fig = Figure(figsize=(9.6, 3.8), layout="constrained")
    latency_ax, energy_ax = fig.subplots(1, 2, sharex=True)
    colours = device_colours(list(measured["device"]))
    _width_lines(latency_ax, measured, "median_us", colours)
    latency_ax.set_ylim(bottom=0)
    latency_ax.set_ylabel("training latency per image (µs)")
    latency_ax.set_title("Latency vs width")
    for label, key, g in _configs(measured, _CONFIG):
        spread = g["uncertainty_mj"].astype(float).fillna(0.0)
        energy_ax.errorbar(g["width"], g["energy_mj"], yerr=spread, capsize=3, label=label, **_style(key, colours))
    _width_axis(energy_ax, measured["width"])
    energy_ax.set_ylim(bottom=0)
    energy_ax.set_ylabel("training energy per image (mJ)")
    energy_ax.set_title("Energy vs width")
    energy_ax.legend(loc="upper left")
    return fig


@_styled
def energy_flops_figure(energy: pd.DataFrame) -> Figure:
    """Energy per image against training FLOPs per image, one line per device.

    Parameters
    ----------
    energy : pandas.DataFrame
        `reports.tables.energy_table` output with some finite ``energy_mj`` and ``train_mflops``.

    Returns
    -------
    Figure
    """
    usable = energy[np.isfinite(energy["energy_mj"].astype(float)) & np.isfinite(energy["train_mflops"].astype(float))]
    measured = _marked(usable)
    fig, ax = _figure()
    colours = device_colours(list(measured["device"]))
    for label, key, g in _configs(measured, _CONFIG):
        g = g.sort_values("train_mflops")
        ax.plot(g["train_mflops"], g["energy_mj"], label=label, **_style(key, colours))
    ax.set_xlim(left=0)
    ax.set_ylim(bottom=0)
    ax.set_xlabel("training MFLOPs per image")
    ax.set_ylabel("training energy per image (mJ)")
    ax.set_title("Energy vs training FLOPs")
    ax.legend(loc="upper left")
    return fig


@_styled
def prediction_figure(errors: pd.DataFrame) -> Figure:
    """Leave-one-width-out latency-model error per width (percent of measured).

    Parameters
    ----------
    errors : pandas.DataFrame
        `reports.tables.prediction_error_table` output (not empty).

    Returns
    -------
    Figure
    """
    fig, ax = _figure()
    ax.axhspan(-10, 10, color="#e8f4e8", zorder=0, label="±10 %")
    ax.axhline(0, color="#7f7f7f", linewidth=0.8)
    _width_lines(ax, errors, "error", device_colours(list(errors["device"])), scale=100.0)
    ax.set_ylabel("prediction error (% of measured)")
    ax.set_title("Latency model, width left out of the fit")
    ax.legend(loc="best")
    return fig


@_styled
def backend_figure(pairs: pd.DataFrame) -> Figure:
    """Per-image latency of one backend over another's at the same cell, per width.

    Parameters
    ----------
    pairs : pandas.DataFrame
        `reports.tables.backend_pairs_table` output (not empty).

    Returns
    -------
    Figure
        One line per device, model, batch and backend pair: a colour per device, a line
        style per pair (`PAIR_STYLE`).
    """
    fig, ax = _figure()
    ax.axhline(1.0, color="#7f7f7f", linewidth=0.8, linestyle=":")
    colours = device_colours(list(pairs["device"]))
    keys = ["device", "model", "batch"]
    varying = [k for k in keys if k == "device" or pairs[k].nunique() > 1]
    for values, group in pairs.groupby([*keys, "backend", "baseline"], sort=True):
        key = dict(zip([*keys, "backend", "baseline"], values, strict=True))
        pair = (str(key["backend"]), str(key["baseline"]))
        linestyle, marker = PAIR_STYLE.get(pair, ("--", "^"))
        names = " / ".join(BACKEND_NAMES.get(b, b) for b in pair)
        label = " · ".join([*(str(key[k]) if k != "batch" else f"batch {key[k]}" for k in varying), names])
        g = group.sort_values("width")
        ax.plot(
            g["width"],
            g["ratio"],
            label=label,
            color=colours.get(str(key["device"]), PALETTE[0]),
            linestyle=linestyle,
            marker=marker,
        )
    _width_axis(ax, pairs["width"])
    ax.set_ylim(bottom=0)
    ax.set_ylabel("latency ratio (backend / baseline)")
    ax.set_title("Runtimes at the same cell (below 1: the first named is faster)")
    ax.legend(loc="best")
    return fig


@_styled
def fl_accuracy_figure(accuracy: pd.DataFrame) -> Figure:
    """Test accuracy per round of every evaluated width.

    Parameters
    ----------
    accuracy : pandas.DataFrame
        `reports.tables.fl_accuracy_table` rows of one run (not empty).

    Returns
    -------
    Figure
    """
    fig, ax = _figure()
    widths = sorted(accuracy["width"].unique())
    for i, w in enumerate(widths):
        g = accuracy[accuracy["width"] == w].sort_values("round")
        ax.plot(g["round"], 100.0 * g["accuracy"], marker="o", color=PALETTE[i % len(PALETTE)], label=f"width {w:g}")
    ax.set_xlabel("round")
    ax.set_ylabel("test accuracy (%)")
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.set_title("Accuracy per round per width")
    ax.legend(loc="lower right")
    return fig


def _client_axis(ax: Any, clients: list[Any]) -> None:
    """Label the y axis with one row per client, in the given order."""
    ax.set_yticks(range(len(clients)))
    ax.set_yticklabels([str(c) for c in clients])
    ax.set_ylabel("client")


_PHASES = (
    ("download_s", "download", "#56B4E9"),
    ("compute_s", "compute", "#0072B2"),
    ("upload_s", "upload", "#009E73"),
)


@_styled
def fl_timeline_figure(timeline: pd.DataFrame) -> Figure:
    """Round timeline: one bar per client and round (download, compute, upload); stragglers outlined.

    Parameters
    ----------
    timeline : pandas.DataFrame
        `reports.tables.fl_timeline_table` rows of one run (not empty).

    Returns
    -------
    Figure
    """
    rounds = sorted(timeline["round"].unique())
    clients = sorted(timeline["cid"].unique())
    fig, ax = _figure(6.8, max(2.6, 0.8 + 0.32 * len(clients) * min(len(rounds), 1) + 0.15 * len(clients)))
    offset = 0.0
    starts: list[float] = []
    for rnd in rounds:
        g = timeline[timeline["round"] == rnd]
        starts.append(offset)
        for _, row in g.iterrows():
            y = clients.index(row["cid"])
            left = offset
            for column, _name, colour in _PHASES:
                ax.barh(y, row[column], left=left, height=0.6, color=colour, edgecolor="none")
                left += row[column]
            if bool(row["straggler"]) or row["status"] != "ok":
                ax.barh(
                    y,
                    max(left - offset, 1e-9),
                    left=offset,
                    height=0.6,
                    fill=False,
                    edgecolor="#D55E00",
                    linewidth=1.6,
                    hatch="//" if row["status"] != "ok" else None,
                )
        offset += float(g["total_s"].max() if len(g) else 0.0) * 1.04
    for start in starts[1:]:
        ax.axvline(start, color="#7f7f7f", linewidth=0.7, linestyle=":")
    _client_axis(ax, clients)
    ax.invert_yaxis()
    ax.set_xlabel("seconds since the first round's start (rounds back to back)")
    ax.set_title("Round timeline (stragglers outlined)")
    handles = [Patch(color=colour, label=name) for _c, name, colour in _PHASES]
    handles.append(Patch(fill=False, edgecolor="#D55E00", linewidth=1.6, label="straggler"))
    handles.append(Patch(fill=False, edgecolor="#D55E00", linewidth=1.6, hatch="//", label="failed"))
    ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.22), ncol=5)
    ax.grid(axis="y", visible=False)
    ax.set_axisbelow(True)
    return fig


@_styled
def fl_virtual_figure(virtual: pd.DataFrame) -> Figure:
    """Draw the virtual clock: each round a band on the virtual time line, each client's finish time a mark.

    Parameters
    ----------
    virtual : pandas.DataFrame
        `reports.tables.fl_virtual_table` rows of one run (not empty).

    Returns
    -------
    Figure
        Kept clients as dots, clients the round did not keep (over the deadline, or
        over-committed and later than the K-th) as crosses.
    """
    rounds = virtual.drop_duplicates("round").sort_values("round")
    fig, ax = _figure(6.8, max(2.6, 0.9 + 0.22 * len(rounds)))
    for _, r in rounds.iterrows():
        ax.barh(r["round"], r["round_s"], left=r["round_start_s"], height=0.7, color="#E6E6E6", edgecolor="#7f7f7f")
    ok = virtual["status"] == "ok"
    finish = virtual["round_start_s"] + virtual["virtual_s"]
    ax.scatter(finish[ok], virtual["round"][ok], s=9, color="#0072B2", label="kept", zorder=3)
    ax.scatter(finish[~ok], virtual["round"][~ok], s=14, marker="x", color="#D55E00", label="not kept", zorder=3)
    ax.set_yticks(list(rounds["round"]))
    ax.set_yticklabels([str(int(r) + 1) for r in rounds["round"]])
    ax.invert_yaxis()
    ax.set_ylabel("round")
    ax.set_xlabel("virtual seconds since the run's start")
    ax.set_title("Virtual clock: rounds and client finish times")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.22), ncol=2)
    return fig


@_styled
def fl_tier_figure(timeline: pd.DataFrame) -> Figure:
    """Tier membership over rounds: one row per client, coloured by its tier in each round.

    Parameters
    ----------
    timeline : pandas.DataFrame
        `reports.tables.fl_timeline_table` rows of one run (not empty).

    Returns
    -------
    Figure
    """
    rounds = sorted(timeline["round"].unique())
    clients = sorted(timeline["cid"].unique())
    tiers = sorted(timeline["tier"].unique())
    grid = np.full((len(clients), len(rounds)), np.nan)
    for _, row in timeline.iterrows():
        grid[clients.index(row["cid"]), rounds.index(row["round"])] = tiers.index(row["tier"])
    fig, ax = _figure(6.4, max(2.2, 0.9 + 0.25 * len(clients)))
    colours = [PALETTE[i % len(PALETTE)] for i in range(max(len(tiers), 2))]
    cmap = ListedColormap(colours)
    ax.imshow(grid, aspect="auto", cmap=cmap, vmin=-0.5, vmax=max(len(tiers), 2) - 0.5, interpolation="nearest")
    ax.set_xticks(range(len(rounds)))
    ax.set_xticklabels([str(r) for r in rounds])
    _client_axis(ax, clients)
    ax.set_xlabel("round")
    ax.grid(False)
    low, high = timeline.groupby("tier")["width"].min(), timeline.groupby("tier")["width"].max()
    handles = [
        Patch(
            color=colours[i],
            label=f"tier {t} (width {low[t]:g})" if low[t] == high[t] else f"tier {t} (widths {low[t]:g}–{high[t]:g})",
        )
        for i, t in enumerate(tiers)
    ]
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.set_title("Tier membership over rounds")
    return fig


@_styled
def render_png(fig: Figure) -> bytes:
    """Return the figure as PNG bytes.

    Parameters
    ----------
    fig : Figure

    Returns
    -------
    bytes
    """
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=DPI, facecolor="white", metadata={"Software": None})
    return buffer.getvalue()


@_styled
def save_figure(fig: Figure, out_dir: Path, name: str) -> bytes:
    """Write ``name.png`` and ``name.svg`` into ``out_dir`` atomically; return the PNG bytes.

    The figure's layout is solved once, for the PNG, and left fixed afterwards.

    Parameters
    ----------
    fig : Figure
    out_dir : Path
        Existing directory.
    name : str
        File stem.

    Returns
    -------
    bytes
        The PNG, for embedding in the HTML page.
    """
    png = render_png(fig)
    # The PNG's draw ran the constrained layout; the SVG keeps the axes where it placed them
    # rather than solving the layout a second time (a third of a figure's drawing).
    fig.set_layout_engine("none")
    svg = io.BytesIO()
    fig.savefig(svg, format="svg", facecolor="white", metadata={"Date": None})
    atomic_write(out_dir / f"{name}.png", png)
    atomic_write(out_dir / f"{name}.svg", svg.getvalue())
    return png
