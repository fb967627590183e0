"""The runner contract read on the host: statuses, argv, and the flat-parameter wire format."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from exporters.userinput import InputError
from harness import contract
from harness.document import EMPTY_DOCUMENT
from harness.runner import protocol
from harness.runner.arguments import build_parser


def test_parse_output_statuses() -> None:
    ok = contract.parse_output(0, json.dumps({"status": "ok", "step_seconds": [0.1]}), "")
    assert (ok.status, ok.message, ok.ok) == ("ok", "", True) and ok.document.step_seconds == (0.1,)
    oom = contract.parse_output(4, json.dumps({"status": "out of memory", "error": "MemoryError"}), "")
    assert (oom.status, oom.message, oom.ok) == ("out of memory", "MemoryError", False)
    crashed = contract.parse_output(1, "Traceback ...", "boom")
    assert crashed.status == "runner error" and "boom" in crashed.message and crashed.document == EMPTY_DOCUMENT
    assert contract.parse_output(3, "", "").status == "runner error"  # no document: runner error whatever the code
    assert contract.parse_output(4, json.dumps({"mode": "bench"}), "").status == "out of memory"  # exit code decides
    # an "ok" document with a failing exit status is not ok
    assert contract.parse_output(3, json.dumps({"status": "ok"}), "").status == "missing runtime"
    # a document with a key of the wrong type is the runner's error, and the message names the key
    bad = contract.parse_output(0, json.dumps({"status": "ok", "step_seconds": ["fast"]}), "")
    assert bad.status == "runner error" and "'step_seconds[0]'" in bad.message and bad.document == EMPTY_DOCUMENT
    assert "'samples'" in contract.parse_reply(json.dumps({"status": "ok", "samples": "many"})).message


def test_exit_codes_are_the_runners_own() -> None:
    assert {code: status for status, code in protocol.EXIT_CODES.items()} == dict(contract.RUNNER_EXIT_CODES)


def test_argv_parses_with_the_runners_own_parser() -> None:
    bench = contract.bench_argv(
        "python3", "/w/runner.pyz", "/w/set", backend="ort", warmup=2, steps=7, threads=3, sample_seconds=0.2
    )
    assert bench[:3] == ["python3", "/w/runner.pyz", "bench"]
    args = build_parser().parse_args(bench[2:])
    assert (args.mode, args.artifacts, args.backend, args.warmup, args.steps, args.threads, args.sample_seconds) == (
        "bench", "/w/set", "ort", 2, 7, 3, 0.2,
    )  # fmt: skip
    train = contract.train_argv(
        "py", "r.py", "/s", backend="torch", params="in.npy", data="d.npz", out="o.npy", epochs=2, lr=0.05,
        threads=1, seed=9,
    )  # fmt: skip
    args = build_parser().parse_args(train[2:])
    assert (args.mode, args.params, args.data, args.out, args.epochs, args.lr, args.seed) == (
        "train", "in.npy", "d.npz", "o.npy", 2, 0.05, 9,
    )  # fmt: skip


def test_wire_format_round_trips_in_manifest_order(tmp_path: Path) -> None:
    manifest = {
        "num_parameters": 7,
        "parameters": [
            {"name": "b", "shape": [3], "offset": 0, "size": 3},
            {"name": "a", "shape": [2, 2], "offset": 3, "size": 4},
        ],
    }
    params = {"a": np.arange(4, dtype=np.float32).reshape(2, 2), "b": np.array([7, 8, 9], dtype=np.float32)}
    path = tmp_path / "p.npy"
    nbytes = contract.write_params(path, manifest, params)
    assert nbytes == path.stat().st_size
    flat = np.load(path, allow_pickle=False)
    assert flat.dtype == np.float32 and flat.tolist() == [7, 8, 9, 0, 1, 2, 3]  # manifest order, not name order
    back = contract.read_params(path, manifest)
    assert set(back) == {"a", "b"} and all(np.array_equal(back[k], params[k]) for k in params)
    with pytest.raises(InputError, match="'a' missing"):
        contract.write_params(tmp_path / "q.npy", manifest, {"b": params["b"]})
    np.save(tmp_path / "short.npy", np.zeros(6, dtype=np.float32))
    with pytest.raises(ValueError, match=r"expected float \(7,\)"):
        contract.read_params(tmp_path / "short.npy", manifest)


def test_a_full_device_disk_is_out_of_space() -> None:
    assert protocol.EXIT_CODES["out of space"] == 6 and contract.RUNNER_EXIT_CODES[6] == "out of space"
    doc = {"status": "out of space", "error": "writing /w/out.npy: No space left on device"}
    full = contract.parse_output(6, json.dumps(doc), "")
    assert (full.status, full.message) == ("out of space", doc["error"])
    assert contract.parse_output(6, json.dumps({"mode": "train"}), "").status == "out of space"  # exit code decides
    # no document, and stderr says why: the device's file system is full
    crashed = contract.parse_output(1, "", "OSError: [Errno 28] No space left on device: '/w/runner'")
    assert crashed.status == "out of space" and "No space left" in crashed.message
    assert contract.parse_output(1, "", "boom").status == "runner error"
    assert contract.FAILURE_REASON_OF_STATUS["out of space"] == "refused"
