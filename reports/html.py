"""The report page: a small HTML template, inline CSS, PNGs embedded as base64; no script.

The page is a header, a table of contents and a list of `Section` blocks. A section
holds prose paragraphs, figures (`EmbeddedFigure`: PNG bytes plus the names of the
PNG/SVG files written next to the page), tables (`TableBlock`: a DataFrame formatted
by column name) and explanations (`Section.notes`) shown where data is missing, so
that later sections (FL runs) slot in as more `Section` values. Nothing here reads
the store; `render_page` is a pure function of its arguments.
"""

from __future__ import annotations

import base64
import html
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd


@dataclass(frozen=True)
class EmbeddedFigure:
    """A figure on the page.

    Attributes
    ----------
    name : str
        File stem of ``name.png`` / ``name.svg`` next to the page.
    caption : str
        One or two sentences under the figure (plain text).
    png : bytes
        The PNG, embedded as base64.
    """

    name: str
    caption: str
    png: bytes


@dataclass(frozen=True)
class TableBlock:
    """A table on the page, also written as ``name.csv``.

    Attributes
    ----------
    name : str
        File stem of the CSV.
    caption : str
        Plain-text caption.
    frame : pandas.DataFrame
        The rows; cells are formatted by column name (`format_value`).
    """

    name: str
    caption: str
    frame: pd.DataFrame


@dataclass(frozen=True)
class Section:
    """One block of the page.

    Attributes
    ----------
    key : str
        HTML id (anchor of the table of contents).
    title : str
    paragraphs : tuple of str
        Prose (plain text; escaped when rendered).
    figures : tuple of EmbeddedFigure
    tables : tuple of TableBlock
    notes : tuple of str
        Explanations of what is missing and why (shown in a highlighted box).
    """

    key: str
    title: str
    paragraphs: tuple[str, ...] = ()
    figures: tuple[EmbeddedFigure, ...] = ()
    tables: tuple[TableBlock, ...] = ()
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class Page:
    """The whole report.

    Attributes
    ----------
    title : str
    facts : tuple of (str, str)
        Header key/value pairs (store, generated at, campaigns, commits).
    sections : tuple of Section
    """

    title: str
    facts: tuple[tuple[str, str], ...] = ()
    sections: tuple[Section, ...] = field(default_factory=tuple)


_PERCENT = ("share", "fraction", "efficiency", "error", "accuracy", "_pct")
_RATIO = ("speedup", "flops_ratio", "ort_over_torch", "theory", "ratio")


def format_value(column: str, value: Any) -> str:
    """Format one table cell for the page by its column name.

    Parameters
    ----------
    column : str
        Column name; its suffix or words choose the format (``_us`` one decimal,
        ``*share/fraction/efficiency/error/accuracy*`` percent, ``speedup/ratio``
        ``1.75×``, ``_mib`` / ``gflops`` / ``_s`` two significant decimals).
    value : Any

    Returns
    -------
    str
        ``"—"`` for missing values, ``"yes"`` / ``""`` for flags.
    """
    if value is None or value is pd.NA:
        return "—"
    if isinstance(value, (bool, np.bool_)):
        return "yes" if value else ""
    if isinstance(value, (int, float)) or hasattr(value, "dtype"):
        try:
            number = float(value)
        except (TypeError, ValueError):
            return str(value)
        if math.isnan(number):
            return "—"
        name = column.lower()
        if name == "width" or name.startswith("w="):
            return f"{number:g}" if name == "width" else f"{number:,.1f}"
        if any(word in name for word in _PERCENT):
            return _no_negative_zero(f"{number:.1%}")
        if any(word in name for word in _RATIO):
            return f"{number:.2f}×"
        if name.endswith("_us"):
            return _no_negative_zero(f"{number:,.1f}")
        if name.endswith(("_mib", "_s", "gflops", "mflops")) or name == "cv":
            return f"{number:,.3g}" if abs(number) < 100 else f"{number:,.0f}"
        if number.is_integer():
            return f"{int(number):d}"
        return f"{number:.4g}"
    return str(value)


def _no_negative_zero(text: str) -> str:
    """Drop the sign of a value that rounds to zero (``-0.0%`` -> ``0.0%``)."""
    if text.startswith("-") and not any(c in "123456789" for c in text):
        return text[1:]
    return text


_HEADINGS = {
    "median_us": "median µs",
    "p5_us": "p5 µs",
    "p95_us": "p95 µs",
    "iqr_us": "IQR µs",
    "peak_memory_mib": "peak MiB",
    "runtime_memory_mib": "runtime MiB",
    "model_memory_mib": "model MiB",
    "runtime_mib": "runtime MiB",
    "model_mib": "model MiB at the widest",
    "model_share": "model's share of the peak",
    "widest": "widest width",
    "train_mflops": "train MFLOPs",
    "flops_ratio": "theoretical",
    "measured_speedup": "measured",
    "modelled_speedup": "fixed-share model",
    "fixed_us": "fixed µs",
    "fixed_share": "fixed share",
    "achieved_gflops": "achieved GFLOP/s",
    "matmul_gflops": "matmul GFLOP/s",
    "predicted_us": "predicted µs",
    "measured_us": "measured µs",
    "ort_over_torch": "ORT / PyTorch",
    "ort_us": "ORT µs",
    "torch_us": "PyTorch µs",
    "ort_mib": "ORT MiB",
    "torch_mib": "PyTorch MiB",
    "backend_us": "backend µs",
    "baseline_us": "baseline µs",
    "backend_mib": "backend MiB",
    "baseline_mib": "baseline MiB",
    "median_abs_error": "median |error|",
    "max_abs_error": "max |error|",
    "mem_mib": "memory MiB",
}

_NUMERIC_HINTS = ("_us", "_mib", "gflops", "mflops", "_s", "share", "ratio", "speedup", "error", "fraction")

CSS = """
:root { --ink:#1d2430; --muted:#5b6575; --rule:#dfe3ea; --accent:#0b5cad; --note:#fff7e0; --noteb:#e0b84a; }
* { box-sizing: border-box; }
body { margin: 0; font: 14px/1.5 -apple-system, "Segoe UI", "DejaVu Sans", Helvetica, Arial, sans-serif;
       color: var(--ink); background: #f4f6f9; }
header { background: #14243b; color: #fff; padding: 22px 40px 18px; }
header h1 { margin: 0 0 6px; font-size: 22px; font-weight: 600; letter-spacing: .2px; }
header dl { display: flex; flex-wrap: wrap; gap: 4px 26px; margin: 0; font-size: 12.5px; color: #c9d3e3; }
header dt { display: inline; font-weight: 600; color: #fff; }
header dd { display: inline; margin: 0 0 0 6px; }
nav { background: #fff; border-bottom: 1px solid var(--rule); padding: 8px 40px; font-size: 13px;
      display: flex; flex-wrap: wrap; gap: 4px 18px; }
nav a { color: var(--accent); text-decoration: none; white-space: nowrap; }
main { max-width: 1180px; margin: 0 auto; padding: 18px 28px 40px; }
section { background: #fff; border: 1px solid var(--rule); border-radius: 6px; margin: 18px 0;
          padding: 16px 24px 20px; }
h2 { font-size: 17px; margin: 0 0 8px; padding-bottom: 6px; border-bottom: 1px solid var(--rule); }
p { margin: 6px 0 10px; max-width: 88ch; }
.note { background: var(--note); border-left: 4px solid var(--noteb); padding: 8px 12px; margin: 10px 0;
        border-radius: 3px; }
figure { margin: 14px 0 18px; }
figure img { display: block; width: 760px; max-width: 100%; height: auto; border: 1px solid var(--rule);
             border-radius: 4px; }
figcaption, .caption { color: var(--muted); font-size: 12.5px; margin-top: 6px; max-width: 96ch; }
.files { font-size: 12px; color: var(--muted); }
.files a { color: var(--accent); }
.tablewrap { overflow-x: auto; margin: 12px 0 16px; }
table { border-collapse: collapse; font-size: 12.5px; font-variant-numeric: tabular-nums; }
th, td { padding: 4px 10px; border-bottom: 1px solid var(--rule); text-align: left; white-space: nowrap; }
th { background: #f0f3f7; font-weight: 600; border-bottom: 2px solid #c8ced8; }
td.num { text-align: right; }
td.wrap { white-space: normal; min-width: 36ch; }
tbody tr:nth-child(even) { background: #fafbfc; }
footer { color: var(--muted); font-size: 12px; text-align: center; padding: 10px 0 30px; }
"""


def _table_html(block: TableBlock) -> str:
    frame = block.frame
    numeric = {
        c for c in frame.columns if pd.api.types.is_numeric_dtype(frame[c]) or any(h in c for h in _NUMERIC_HINTS)
    }
    head = "".join(f"<th>{html.escape(_HEADINGS.get(str(c), str(c)))}</th>" for c in frame.columns)
    body = []
    for row in frame.itertuples(index=False, name=None):
        cells = []
        for column, value in zip(frame.columns, row, strict=True):
            if isinstance(value, str):
                klass = ' class="wrap"' if len(value) > 40 else ""
            else:
                klass = ' class="num"' if column in numeric else ""
            cells.append(f"<td{klass}>{html.escape(format_value(str(column), value))}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    return (
        f'<div class="tablewrap"><table id="table-{html.escape(block.name)}"><thead><tr>{head}</tr></thead>'
        f"<tbody>{''.join(body)}</tbody></table></div>"
        f'<div class="caption">{html.escape(block.caption)} '
        f'<span class="files">(<a href="{html.escape(block.name)}.csv">{html.escape(block.name)}.csv</a>)</span></div>'
    )


def _figure_html(fig: EmbeddedFigure) -> str:
    data = base64.b64encode(fig.png).decode("ascii")
    name = html.escape(fig.name)
    return (
        f'<figure id="figure-{name}"><img alt="{html.escape(fig.caption)}" src="data:image/png;base64,{data}">'
        f"<figcaption>{html.escape(fig.caption)} "
        f'<span class="files">(<a href="{name}.png">{name}.png</a> · <a href="{name}.svg">{name}.svg</a>)</span>'
        "</figcaption></figure>"
    )


def _section_html(section: Section) -> str:
    parts = [f'<section id="{html.escape(section.key)}"><h2>{html.escape(section.title)}</h2>']
    parts += [f"<p>{html.escape(text)}</p>" for text in section.paragraphs]
    parts += [f'<div class="note">{html.escape(text)}</div>' for text in section.notes]
    parts += [_figure_html(fig) for fig in section.figures]
    parts += [_table_html(block) for block in section.tables]
    parts.append("</section>")
    return "\n".join(parts)


def render_page(page: Page, sections: Sequence[Section] | None = None) -> str:
    """Render the report page as one self-contained HTML document.

    Parameters
    ----------
    page : Page
    sections : sequence of Section, optional
        Override ``page.sections``.

    Returns
    -------
    str
        HTML5 with inline CSS, images as ``data:`` URLs, no script and no external resource.
    """
    blocks = tuple(page.sections if sections is None else sections)
    facts = "".join(f"<div><dt>{html.escape(k)}</dt><dd>{html.escape(v)}</dd></div>" for k, v in page.facts)
    nav = "".join(f'<a href="#{html.escape(s.key)}">{html.escape(s.title)}</a>' for s in blocks)
    body = "\n".join(_section_html(s) for s in blocks)
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1"><link rel="icon" href="data:,">'
        f"<title>{html.escape(page.title)}</title><style>{CSS}</style></head>\n"
        f"<body><header><h1>{html.escape(page.title)}</h1><dl>{facts}</dl></header>\n"
        f"<nav>{nav}</nav>\n<main>\n{body}\n</main>\n"
        "<footer>Generated by fleetbench from stored records only; every figure is also a PNG and an SVG, "
        "every table a CSV, next to this page.</footer>\n"
        "</body></html>\n"
    )
