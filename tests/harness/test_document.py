"""The runner's document parsed once into typed records (`harness.document`)."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from harness.document import (
    EMPTY_DOCUMENT,
    HOST_KEYS,
    RUNNER_KEYS,
    BeforeAfter,
    DocumentError,
    RunnerDocument,
    Sessions,
    Versions,
    parse_document,
)
from harness.runner import protocol

#: A document of ``runner.py bench`` (ort, fjord-cnn at width 0.25, batch 4), its sample lists cut to 6.
BENCH = json.loads(
    '{"mode": "bench", "status": "ok", "error": null, "missing": null, "backend": "ort", "batch": 4, "warmup": 3,'
    ' "steps": 6, "threads": 1, "seed": 0, "flush_denormals": true,'
    ' "step_seconds": [0.000146, 0.000143, 0.000142, 0.000164, 0.000143, 0.000142],'
    ' "loss": [2.736199, 1.266301, 1.04475, 0.885933, 0.704172, 0.53082], "peak_memory_bytes": 84799488,'
    ' "peak_memory_source": "VmHWM", "peak_memory_scope": "process", "cpu_freq_khz": {"before": [], "after": []},'
    ' "thermal_c": {"before": {}, "after": {}}, "throttled": false, "matmul_gflops": 97.337834,'
    ' "versions": {"python": "3.11.7", "numpy": "2.4.6", "onnxruntime": "1.19.2", "torch": "2.13.0+cpu"},'
    ' "precision": 0.05, "max_seconds": 3.0, "sample_seconds": 0.02,'
    ' "steps_per_sample": [137, 141, 141, 123, 141, 141],'
    ' "cpu_step_seconds": [0.000144, 0.000142, 0.000142, 0.000146, 0.000141, 0.000141],'
    ' "disturbed": [0, 0, 0, 0, 0, 0], "warmup_steps": 3, "warmup_seconds": [0.000663, 0.000216, 0.000198],'
    ' "warmup_settled": false, "samples": 6, "median_ci_seconds": [0.000142, 0.000146],'
    ' "precision_achieved": 0.027777, "stop_reason": "precision", "imprecise": false, "timed_seconds": 0.975395,'
    ' "loadavg": {"before": [2.43, 6.03, 7.1], "after": [2.43, 6.03, 7.1]}, "cpus_available": 2,'
    ' "bench_data": "random"}'
)

#: A document of ``runner.py train`` (the same set, one epoch of a 16-example shard).
TRAIN = json.loads(
    '{"mode": "train", "status": "ok", "error": null, "missing": null, "backend": "ort", "batch": 4, "warmup": 0,'
    ' "steps": 4, "threads": 1, "seed": 0, "flush_denormals": true,'
    ' "step_seconds": [0.000632, 0.000281, 0.000256, 0.000252], "loss": [4.036842, 4.087239, 3.905977, 3.336983],'
    ' "peak_memory_bytes": 83345408, "peak_memory_source": "VmHWM", "peak_memory_scope": "process",'
    ' "cpu_freq_khz": {"before": [], "after": []}, "thermal_c": {"before": {}, "after": {}}, "throttled": false,'
    ' "matmul_gflops": null,'
    ' "versions": {"python": "3.11.7", "numpy": "2.4.6", "onnxruntime": "1.19.2", "torch": "2.13.0+cpu"},'
    ' "epochs": 1, "lr": 0.05, "examples": 16, "step_examples": [4, 4, 4, 4], "num_parameters": 6496,'
    ' "out": "/w/out.npy", "load_seconds": 0.133227, "loop_cpu_seconds": 0.001526, "loop_seconds": 0.001531,'
    ' "save_seconds": 0.000326}'
)


def test_a_bench_document_reads_as_typed_fields() -> None:
    doc = parse_document(BENCH)
    assert (doc.mode, doc.status, doc.backend, doc.batch, doc.threads) == ("bench", "ok", "ort", 4, 1)
    assert doc.step_seconds[:2] == (0.000146, 0.000143) and len(doc.cpu_step_seconds) == doc.samples == 6
    assert doc.steps_per_sample[0] == 137 and doc.disturbed == (0,) * 6
    assert doc.median_ci_seconds == (0.000142, 0.000146)
    assert doc.loadavg == BeforeAfter((2.43, 6.03, 7.1), (2.43, 6.03, 7.1)) and doc.cpus_available == 2
    assert doc.versions == Versions("3.11.7", "2.4.6", "1.19.2", "2.13.0+cpu") and doc.flush_denormals is True
    assert doc.peak_memory_bytes == 84799488 and doc.matmul_gflops == 97.337834 and doc.warmup_settled is False
    assert doc.stop_reason == "precision" and not doc.imprecise and doc.sessions is None and doc.examples is None
    assert doc.raw == BENCH


def test_a_train_document_and_a_serve_reply_read_as_typed_fields() -> None:
    doc = parse_document(TRAIN)
    assert (doc.epochs, doc.lr, doc.examples, doc.step_examples, doc.num_parameters) == (1, 0.05, 16, (4,) * 4, 6496)
    assert doc.out == "/w/out.npy" and doc.load_seconds == 0.133227 and doc.matmul_gflops is None
    reply = parse_document({
        **TRAIN, "id": {"client": 3}, "request_seconds": 0.2,
        "sessions": {"opened": 1, "reused": 2, "open_seconds": 0.1},
        "step_sets": [0, 1, 1, 0], "step_widths": [0.25, 1, 1, 0.25], "switch_seconds": [0.01, 0.02],
        "mask_means": [[1.0, 0.5], [0.75, 0.5]], "mask_seconds": 0.003,
    })  # fmt: skip
    assert reply.id == {"client": 3} and reply.sessions == Sessions(1, 2, 0.1) and reply.request_seconds == 0.2
    assert reply.step_widths == (0.25, 1.0, 1.0, 0.25) and reply.mask_means == ((1.0, 0.5), (0.75, 0.5))
    ready = parse_document({"mode": "serve", "event": "ready", "protocol": 2, "pid": 4321, "startup_seconds": 0.4})
    assert (ready.event, ready.protocol, ready.pid, ready.startup_seconds) == ("ready", 2, 4321, 0.4)


def test_every_key_of_a_fresh_runner_document_parses() -> None:
    raw = {**protocol.new_result(), **protocol.new_bench_keys()}
    assert parse_document(raw) == RunnerDocument(
        status=raw["status"], mode=raw["mode"], peak_memory_scope="process",
        versions=Versions(python=raw["versions"]["python"]),
        warmup_steps=0, warmup_settled=False, samples=0,
    )  # fmt: skip


def test_absent_and_null_keys_read_as_defaults() -> None:
    assert parse_document({}) == EMPTY_DOCUMENT and parse_document({}).raw == {}
    nulls = parse_document(dict.fromkeys(BENCH))
    assert nulls == EMPTY_DOCUMENT and nulls.throttled is False and nulls.loadavg == BeforeAfter()
    # a stored document of an older runner: no CPU times, no flags, no serve keys; host keys kept
    old = parse_document({"step_seconds": [0.01, 0.02], "passes": 2, "pass_medians": [0.01, None], "freq_khz": [1]})
    assert old.cpu_step_seconds == () and old.disturbed == () and old.passes == 2 and old.pass_medians == (0.01, None)
    assert old.raw["freq_khz"] == [1]
    assert parse_document({"disturbed": [True, False, 1]}).disturbed == (1, 0, 1)


def test_train_flops_come_from_the_counts_the_host_added() -> None:
    assert parse_document({"counts": {"train_flops": 4_000_000}}).train_flops == 4e6
    assert parse_document({"manifest": {"counts": {"train_flops": 5}}}).train_flops == 5.0
    assert parse_document({"train_flops": 6, "counts": {"train_flops": 7}}).train_flops == 6.0
    assert parse_document({"counts": {"train_flops": "many"}}).train_flops is None


@pytest.mark.parametrize(
    ("key", "value", "named"),
    [
        ("step_seconds", [0.1, "fast"], "'step_seconds[1]'"),
        ("step_seconds", 0.1, "'step_seconds'"),
        ("batch", 4.5, "'batch'"),
        ("status", 0, "'status'"),
        ("throttled", "no", "'throttled'"),
        ("samples", True, "'samples'"),
        ("disturbed", [0, 2], "'disturbed[1]'"),
        ("loadavg", {"before": ["high"]}, "'loadavg.before[0]'"),
        ("sessions", {"opened": "one"}, "'sessions.opened'"),
        ("versions", {"numpy": 2}, "'versions.numpy'"),
        ("thermal_c", {"before": {"cpu": "hot"}}, "'thermal_c.before.cpu'"),
        ("mask_means", [[1.0], 0.5], "'mask_means[1]'"),
    ],
)
def test_a_key_of_the_wrong_type_is_one_error_naming_it(key: str, value: Any, named: str) -> None:
    with pytest.raises(DocumentError, match=re.escape(named)):
        parse_document({**BENCH, key: value})


def test_a_document_that_is_not_an_object_is_refused() -> None:
    with pytest.raises(DocumentError, match="JSON object"):
        parse_document([1, 2])  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("key", "value", "named"),
    [
        ("step_seconds", [0.1, float("nan")], "'step_seconds[1]': expected a finite number"),
        ("loss", [1.0, float("inf")], "'loss[1]': expected a finite number"),
        ("matmul_gflops", float("-inf"), "'matmul_gflops': expected a finite number"),
        ("step_seconds", [0.1, -0.1], "'step_seconds[1]': expected seconds (a number >= 0)"),
        ("cpu_step_seconds", [-1e-9], "'cpu_step_seconds[0]': expected seconds"),
        ("warmup_seconds", [-1], "'warmup_seconds[0]': expected seconds"),
        ("timed_seconds", -2.0, "'timed_seconds': expected seconds"),
        ("median_ci_seconds", [-0.1, 0.1], "'median_ci_seconds[0]': expected seconds"),
        ("peak_memory_bytes", -1, "'peak_memory_bytes': expected a count (an integer >= 0)"),
        ("runtime_memory_bytes", -5, "'runtime_memory_bytes': expected a count"),
        ("samples", -6, "'samples': expected a count"),
        ("steps_per_sample", [3, -1], "'steps_per_sample[1]': expected a count"),
        ("sessions", {"open_seconds": -0.5}, "'sessions.open_seconds': expected seconds"),
        ("sessions", {"reused": -1}, "'sessions.reused': expected a count"),
    ],
)
def test_a_number_that_is_not_finite_or_negative_seconds_or_counts_are_refused(
    key: str, value: Any, named: str
) -> None:
    with pytest.raises(DocumentError, match=re.escape(named)):
        parse_document({**BENCH, key: value})


def test_settings_echoed_back_may_be_negative_and_a_loss_may_be_null() -> None:
    # a refused request's document echoes its settings ("bad arguments"), and a non-finite loss arrives as null
    doc = parse_document({**TRAIN, "status": "bad arguments", "lr": -0.5, "warmup": -1, "loss": [1.0, None]})
    assert (doc.lr, doc.warmup, doc.loss) == (-0.5, -1, (1.0, None))


def test_a_document_from_a_device_with_an_unknown_key_is_refused_a_stored_one_keeps_it() -> None:
    reply = {**TRAIN, "id": "c1", "request_seconds": 0.2, "sessions": {"opened": 1}}
    assert parse_document(reply, from_device=True).id == "c1"
    ready = {**protocol.new_result(), "mode": "serve", "event": "ready", "protocol": 1, "pid": 7, "max_sessions": 8}
    assert parse_document(ready, from_device=True).max_sessions == 8
    with pytest.raises(DocumentError, match=re.escape("unknown keys '__class__', 'exec'")):
        parse_document({**TRAIN, "exec": "print(1)", "__class__": "x"}, from_device=True)
    with pytest.raises(DocumentError, match=re.escape("unknown keys 'counts'")):  # the host adds it, never a runner
        parse_document({**BENCH, "counts": {"train_flops": 5}}, from_device=True)
    stored = parse_document({**BENCH, "exec": "print(1)", "counts": {"train_flops": 5}})
    assert stored.raw["exec"] == "print(1)" and stored.train_flops == 5.0


def test_every_key_the_runner_writes_is_one_the_host_reads() -> None:
    runner_keys = {*protocol.new_result(), *protocol.new_bench_keys()}
    assert runner_keys <= RUNNER_KEYS and not HOST_KEYS & RUNNER_KEYS
