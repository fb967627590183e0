"""The runner contract read on the host: statuses, argv, and the flat-parameter wire format."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

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
    for killed in (-9, 137):  # SIGKILL, as the OOM killer sends it: locally, and through a device's shell
        oom_killed = contract.parse_output(killed, "", "Killed")
        assert oom_killed.status == "out of memory" and oom_killed.message.startswith("runner killed by SIGKILL")
        assert oom_killed.message.endswith("; stderr: Killed")
    assert contract.parse_output(-15, "", "").status == "runner error"  # SIGTERM is no memory limit
    assert contract.parse_output(137, json.dumps({"status": "ok"}), "").status == "runner error"  # a document decides
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
    with pytest.raises(ValueError, match=r"expected float32 \(7,\)"):
        contract.read_params(tmp_path / "short.npy", manifest)


@pytest.mark.parametrize(
    ("stdout", "reason"),
    [
        ("[]", "output that is not a JSON object"),
        ("3", "output that is not a JSON object"),
        ('{"status": "ok",', "its output refused: it is not JSON"),
        ('{"status": "ok", "loss": [NaN]}', "holds the non-finite number NaN"),
        ('{"status": "ok", "step_seconds": [-Infinity]}', "holds the non-finite number -Infinity"),
        ('{"status": "ok", "step_seconds": [1e400]}', "'step_seconds[0]': expected a finite number"),
        ('{"status": "ok", "loop_seconds": -0.25}', "'loop_seconds': expected seconds (a number >= 0)"),
        ('{"status": "ok", "mystery": 1}', "unknown keys 'mystery'"),
        ('{"status": "ok", "error": null, "x": "' + "y" * 3000 + '"}', "bytes, over the cap of 2000"),
    ],
)
def test_a_one_shot_document_that_cannot_be_trusted_is_a_runner_error_saying_why_in_one_line(
    monkeypatch: pytest.MonkeyPatch, stdout: str, reason: str
) -> None:
    monkeypatch.setattr(contract, "MAX_REPLY_BYTES", 2000)
    out = contract.parse_output(0, stdout, "line one\nline two")
    assert out.status == "runner error" and reason in out.message and out.document == EMPTY_DOCUMENT
    if "refused" in out.message or "malformed" in out.message:
        assert "\n" not in out.message


def test_the_byte_cap_is_the_transports_line_cap_and_a_reply_at_it_is_read() -> None:
    from devices.transport import MAX_LINE_BYTES

    assert contract.MAX_REPLY_BYTES == MAX_LINE_BYTES == 16 * 1024 * 1024
    padding = contract.MAX_REPLY_BYTES - len('{"status": "ok", "error": ""}')
    at_cap = json.dumps({"status": "ok", "error": "e" * padding})
    assert len(at_cap.encode()) == contract.MAX_REPLY_BYTES and contract.parse_reply(at_cap).ok
    over = contract.parse_reply(at_cap[:-2] + 'e"}')
    assert over.status == "runner error" and "over the cap" in over.message


def test_a_ready_line_must_speak_the_hosts_protocol() -> None:
    ready = {"mode": "serve", "event": "ready", "protocol": protocol.PROTOCOL_VERSION, "status": "ok"}
    assert contract.parse_reply(json.dumps(ready), ready=True).ok
    for wrong in ({**ready, "protocol": 0}, {**ready, "protocol": "1"}, {**ready, "event": None}):
        out = contract.parse_reply(json.dumps(wrong), ready=True)
        assert out.status == "runner error" and "the host speaks protocol 1" in out.message
    assert contract.parse_reply(json.dumps({**ready, "protocol": 0})).ok  # a reply is not a ready line


class _Planted:
    """Unpickling this creates a file: a device that could make the host unpickle would run code."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self) -> tuple[Any, tuple[Path]]:
        return (Path.touch, (self.path,))


MANIFEST = {"num_parameters": 4, "parameters": [{"name": "w", "shape": [2, 2], "offset": 0, "size": 4}]}


@pytest.mark.parametrize(
    ("array", "reason"),
    [
        (np.array([1, np.nan, 3, 4], dtype=np.float32), "hold 1 values that are NaN or Inf (the first at 1)"),
        (np.array([1, 2, np.inf, -np.inf], dtype=np.float32), "hold 2 values that are NaN or Inf (the first at 2)"),
        (np.ones(4, dtype=np.float64), "dtype float64, expected float32 (4,)"),
        (np.ones(4, dtype=np.float16), "dtype float16, expected float32 (4,)"),
        (np.ones(4, dtype=np.int32), "dtype int32, expected float32 (4,)"),
        (np.ones((2, 2), dtype=np.float32), "shape (2, 2) and dtype float32, expected float32 (4,)"),
        (np.ones(5, dtype=np.float32), "shape (5,) and dtype float32, expected float32 (4,)"),
        (np.ones(0, dtype=np.float32), "shape (0,) and dtype float32, expected float32 (4,)"),
    ],
)
def test_a_parameter_file_of_the_wrong_shape_dtype_size_or_not_finite_is_refused(
    tmp_path: Path, array: np.ndarray, reason: str
) -> None:
    path = tmp_path / "out.npy"
    np.save(path, array, allow_pickle=False)
    with pytest.raises(ValueError) as refused:
        contract.read_params(path, MANIFEST)
    assert reason in str(refused.value) and str(path) in str(refused.value) and "\n" not in str(refused.value)


def test_a_parameter_file_is_never_unpickled_and_a_file_that_is_no_array_is_refused(tmp_path: Path) -> None:
    planted = tmp_path / "planted"
    path = tmp_path / "out.npy"
    np.save(path, np.array([_Planted(planted)], dtype=object), allow_pickle=True)
    with pytest.raises(ValueError, match="not an .npy float32 vector"):
        contract.read_params(path, MANIFEST)
    assert not planted.exists()
    np.load(path, allow_pickle=True)  # what unpickling it would have done
    assert planted.exists()
    path.write_bytes(b"\x93NUMPY garbage")
    with pytest.raises(ValueError, match="not an .npy float32 vector"):
        contract.read_params(path, MANIFEST)
    np.save(path, np.ones(4, dtype=np.float32), allow_pickle=False)
    path.write_bytes(path.read_bytes()[:-4])  # the header promises 4 floats, the data holds 3
    with pytest.raises(ValueError, match="not an .npy float32 vector"):
        contract.read_params(path, MANIFEST)


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
