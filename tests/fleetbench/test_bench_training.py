"""The training benchmark's figures and targets, and the light import path of its ONNX workers.

The benchmark itself (``python -m tests.bench --only training``) is not collected; its pure parts
are (`tests/bench/training_targets.py`, `tests/bench/ort_latest.py`). The ``onnx`` worker also runs
from an environment holding only numpy and onnxruntime, so its imports reach neither PyTorch nor
``exporters``; the ``ort`` worker's do not load PyTorch either, as the runner's do not.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.bench.ort_latest import parse_index_versions
from tests.bench.training_targets import (
    BEST,
    MIB,
    ModelResult,
    WorkerRun,
    memory_mib,
    parse_worker_output,
    ratio_pairs,
    round_ratio,
    verdict_line,
    verdicts,
    with_best,
)

REPO_ROOT = Path(__file__).resolve().parents[2]


def test_best_form_is_the_fastest_onnx_form_of_each_round() -> None:
    rounds = with_best({"ort": [3.0, 1.0], "onnx": [2.0, 4.0], "onnx-latest": [5.0, 2.0], "torch": [1.0, 1.0]})
    assert rounds[BEST] == [2.0, 1.0]
    assert round_ratio(rounds, (BEST, "torch")) == [2.0, 1.0]
    assert BEST not in with_best({"torch": [1.0]})


def test_ratios_need_both_sides() -> None:
    assert ratio_pairs(["ort", "onnx", "onnx-latest", "torch"]) == [
        ("onnx", "ort"),
        ("ort", "torch"),
        ("onnx", "torch"),
        ("onnx-latest", "onnx"),
        ("onnx-latest", "torch"),
        (BEST, "torch"),
    ]
    assert ratio_pairs(["ort", "onnx"]) == [("onnx", "ort")]
    assert ratio_pairs(["torch"]) == []


def test_memory_is_the_median_baseline_and_the_median_share() -> None:
    runs = [WorkerRun((0.1,), "1", 100 * MIB, 130 * MIB), WorkerRun((0.1,), "1", 110 * MIB, 120 * MIB)]
    runs.append(WorkerRun((0.1,), "1", 90 * MIB, 110 * MIB))
    assert memory_mib(runs) == (100.0, 20.0)
    assert memory_mib([WorkerRun((0.1,), "1", None, None)]) == (None, None)


def test_worker_document_is_parsed_from_its_last_line() -> None:
    document = {"seconds": [0.3, 0.1, 0.2], "runtime": "1.32.0", "baseline_bytes": 5, "peak_bytes": 9}
    run = parse_worker_output("a warning\n" + json.dumps(document) + "\n")
    assert run == WorkerRun((0.3, 0.1, 0.2), "1.32.0", 5, 9)
    assert run.step_seconds == 0.2


def test_verdicts_per_model() -> None:
    cnn = ModelResult("fjord-cnn", True, {(BEST, "torch"): 0.85, ("onnx", "ort"): 0.9}, 0.35)
    line = verdict_line(verdicts(cnn))
    assert line == "not met: best/torch <= 0.80 (is 0.85x)"
    lstm = ModelResult("fluid-lstm", False, {(BEST, "torch"): 0.85, ("onnx", "ort"): 1.0}, None)
    assert verdict_line(verdicts(lstm)) == "ok"
    unmeasured = ModelResult("fluid-cnn", True, {(BEST, "torch"): 0.5, ("onnx", "ort"): 0.9}, None)
    assert verdict_line(verdicts(unmeasured)) == "ok; not measured: matmul share at width 1 >= 30%"
    torch_only = ModelResult("fluid-lstm", False, {}, None)
    assert verdict_line(verdicts(torch_only)) == "not measured: best/torch <= 1.00, onnx/ort <= 1.00"


def test_newest_version_is_read_from_pip_index() -> None:
    text = "onnxruntime (1.32.0)\nAvailable versions: 1.32.0, 1.31.1\n"
    assert parse_index_versions(text) == "1.32.0"
    assert parse_index_versions("ERROR: No matching distribution found for onnxruntime") is None


@pytest.mark.parametrize("backend", ["onnx", "ort"])
def test_onnx_forms_load_neither_torch_nor_exporters(backend: str) -> None:
    code = (
        "import sys; from tests.bench.worker import load_runtime; load_runtime(sys.argv[1], 1); "
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'torch', 'exporters'}))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, backend], cwd=REPO_ROOT, capture_output=True, text=True, check=True
    )
    assert done.stdout.strip() == "[]"


@pytest.mark.parametrize(
    ("op", "kind"),
    [
        ("aten::convolution_backward", "conv-grad"),
        ("aten::mkldnn_convolution", "conv"),
        ("aten::addmm", "matmul"),
        ("aten::max_pool2d_with_indices_backward", "pool"),
        ("aten::native_batch_norm_backward", "norm"),
        ("aten::_foreach_addcdiv_", "optimizer"),
        ("aten::threshold_backward", "elementwise"),
        ("aten::t", "layout"),
        ("aten::tanh_backward", "elementwise"),
        ("Optimizer.step#AdamW.step", "other"),
    ],
)
def test_torch_operators_map_to_their_kind(op: str, kind: str) -> None:
    from tests.bench.op_kinds import torch_kind

    assert torch_kind(op) == kind


def test_profiles_sum_per_kind_on_both_sides() -> None:
    from tests.bench.op_kinds import KINDS, by_kind, onnx_kind

    ops = {"ConvTranspose": 5.0, "Gemm": 2.0, "Slice": 1.0, "Concat": 1.5, "Mul": 0.5, "Sqrt": 0.25}
    totals = by_kind(ops, onnx_kind)
    assert list(totals) == list(KINDS)
    assert (totals["conv-grad"], totals["matmul"], totals["layout"], totals["elementwise"]) == (5.0, 2.0, 2.5, 0.75)
    assert totals["conv"] == totals["optimizer"] == 0.0
