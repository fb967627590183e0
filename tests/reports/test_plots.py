"""Figures of the report (`reports.plots`): how a figure is written."""

from __future__ import annotations

from pathlib import Path

import pytest
from matplotlib import layout_engine

from reports import plots


def test_a_figure_is_laid_out_once_for_both_of_its_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fig, ax = plots._figure()
    ax.plot([0.25, 0.5, 1.0], [1.0, 2.0, 4.0], marker="o", label="fast")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.set_title("latency")
    solved = []
    layout = layout_engine.do_constrained_layout
    monkeypatch.setattr(layout_engine, "do_constrained_layout", lambda *a, **k: solved.append(1) or layout(*a, **k))

    png = plots.save_figure(fig, tmp_path, "latency")

    assert len(solved) == 1  # the PNG's draw; the SVG keeps its axes where that put them
    assert (tmp_path / "latency.png").read_bytes() == png and png.startswith(b"\x89PNG")
    svg = (tmp_path / "latency.svg").read_text()
    assert svg.lstrip().startswith("<?xml") and ">latency<" in svg and ">fast<" in svg
