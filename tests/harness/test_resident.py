"""The resident runner (``runner.pyz serve``) through real local, SSH (sshd) and ADB (emulated phone) transports.

On every transport: one process answers several requests (its pid stays) with the
parameters the one-shot ``train`` mode writes for the same inputs, for both ``ort`` and
the portable ``onnx`` backend; a request that times out kills the process and the next
request starts another; a process killed from outside fails its request (SIGKILL read as
out of memory) and the next request starts another; a bad request is answered and the
process goes on. Request paths are relative to ``--cwd`` (the emulated phone maps paths
of command lines only).
"""

from __future__ import annotations

import json
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from devices.emulation.adb_endpoint import AdbEndpoint
from devices.errors import CommandTimeout
from devices.local import LocalTransport
from devices.ssh import SSHTransport
from devices.transport import Transport
from exporters.artifacts import export_artifacts
from exporters.manifest import ARTIFACT_FILES, MANIFEST
from exporters.zoo import get_model
from harness import contract
from harness.resident import ResidentRunner, relative_paths
from harness.runner_archive import archive_path
from tests.harness.test_runner import learnable_shard

PY = sys.executable


@dataclass
class Board:
    """A transport, the device directory holding runner, set, shard and parameters, and that directory here."""

    transport: Transport
    remote_dir: str
    host_dir: Path

    def serve(self, backend: str, timeout: float = 120.0) -> ResidentRunner:
        argv = contract.serve_argv(PY, f"{self.remote_dir}/runner.pyz", backend=backend, threads=1, cwd=self.remote_dir)
        return ResidentRunner(self.transport, argv, start_timeout=timeout)


@pytest.fixture(scope="module")
def artifact_set(tmp_path_factory: pytest.TempPathFactory) -> Path:
    model = get_model("fjord-cnn")
    return export_artifacts(
        model, model.arch(0.25), batch=4, optimizer="sgd", out_dir=tmp_path_factory.mktemp("a")
    ).directory


@pytest.fixture(scope="module", params=["local", "ssh", "adb"])
def board(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, artifact_set: Path
) -> Iterator[Board]:
    """A board of each transport for the module: runner, set, shard and parameters pushed once.

    Its tests write outputs of their own names beside them and leave the inputs as they found them.
    """
    tmp_path = tmp_path_factory.mktemp(f"board-{request.param}")
    host_dir = tmp_path / "device"
    host_dir.mkdir()
    if request.param == "local":
        made = Board(LocalTransport(workdir=host_dir), str(host_dir), host_dir)
    elif request.param == "ssh":
        made = Board(request.getfixturevalue("sshd_server").transport(), str(host_dir), host_dir)
    else:
        phone: AdbEndpoint = request.getfixturevalue("phone")
        remote_dir = f"/data/local/tmp/{tmp_path.name}"
        sandbox_dir = phone.sandbox.root / "data" / "local" / "tmp" / tmp_path.name
        sandbox_dir.mkdir(parents=True)
        made = Board(request.getfixturevalue("adb_transport"), remote_dir, sandbox_dir)
    made.transport.run(["mkdir", "-p", f"{made.remote_dir}/set"], timeout=30)
    made.transport.put(archive_path(), f"{made.remote_dir}/runner.pyz")
    for name in (*ARTIFACT_FILES, MANIFEST):
        made.transport.put(artifact_set / name, f"{made.remote_dir}/set/{name}")
    shard = learnable_shard(tmp_path / "shard.npz", 24)
    made.transport.put(shard, f"{made.remote_dir}/shard.npz")
    start = np.load(artifact_set / "initial_parameters.npy") + 0.01
    np.save(tmp_path / "in.npy", start.astype(np.float32), allow_pickle=False)
    made.transport.put(tmp_path / "in.npy", f"{made.remote_dir}/in.npy")
    yield made
    if request.param == "local":
        made.transport.close()


def _request(backend: str, out: str, epochs: int = 2, request_id: object = None) -> dict:
    return contract.train_request(
        "set", backend=backend, params="in.npy", data="shard.npz", out=out, epochs=epochs, lr=0.05, threads=1, seed=3,
        request_id=request_id,
    )  # fmt: skip


def _fetch(board: Board, name: str, tmp: Path) -> np.ndarray:
    board.transport.get(f"{board.remote_dir}/{name}", tmp / name)
    return np.load(tmp / name)


def _running(board: Board, pid: int) -> bool:
    return board.transport.run(["kill", "-0", str(pid)], timeout=30).rc == 0


@pytest.mark.parametrize("backend", ["ort", "onnx"])
def test_one_process_answers_several_requests_as_the_one_shot_mode(board: Board, backend: str, tmp_path: Path) -> None:
    argv = contract.train_argv(
        PY, f"{board.remote_dir}/runner.pyz", f"{board.remote_dir}/set", backend=backend,
        params=f"{board.remote_dir}/in.npy", data=f"{board.remote_dir}/shard.npz", out=f"{board.remote_dir}/once.npy",
        epochs=2, lr=0.05, threads=1, seed=3,
    )  # fmt: skip
    once = board.transport.run(argv, timeout=120)
    once_doc = contract.parse_output(once.rc, once.stdout, once.stderr)
    assert once_doc.ok, once_doc.message
    expected = _fetch(board, "once.npy", tmp_path)
    runner = board.serve(backend)
    try:
        pids, opened = [], []
        for i in range(3):
            output, seconds = runner.request(_request(backend, f"served-{i}.npy", request_id=i), timeout=120)
            assert output.ok, output.message
            doc = output.document
            assert doc.id == i and doc.mode == "train" and doc.request_seconds is not None
            assert seconds >= doc.request_seconds > 0 and doc.loss == once_doc.document.loss
            assert np.array_equal(_fetch(board, f"served-{i}.npy", tmp_path), expected)
            assert doc.peak_memory_bytes and doc.peak_memory_scope in ("request", "process")
            pids.append(runner.pid)
            assert doc.sessions is not None
            opened.append(doc.sessions.opened)
        assert runner.starts == 1 and len(set(pids)) == 1 and _running(board, pids[0])
        assert opened == [1, 0, 0]  # the session is kept and reused (SGD sets)
        assert not np.array_equal(expected, np.load(board.host_dir / "in.npy"))
    finally:
        runner.close()
    assert not _running(board, pids[0])


def test_a_bad_request_is_answered_and_serving_goes_on(board: Board, tmp_path: Path) -> None:
    runner = board.serve("onnx")
    try:
        bad, _ = runner.request(_request("onnx", "x.npy", epochs=0), timeout=120)
        assert bad.status == "bad arguments" and "--epochs" in bad.message
        missing, _ = runner.request({**_request("onnx", "x.npy"), "data": "nowhere.npz"}, timeout=120)
        assert missing.status == "bad arguments" and "nowhere.npz" in missing.message
        unknown, _ = runner.request({"mode": "train", "frobnicate": 1}, timeout=120)
        assert unknown.status == "bad arguments"
        good, _ = runner.request(_request("onnx", "good.npy"), timeout=120)
        assert good.ok and runner.starts == 1
    finally:
        runner.close()


def test_a_timed_out_request_kills_the_runner_and_the_next_starts_another(board: Board, tmp_path: Path) -> None:
    runner = board.serve("onnx")
    try:
        first, _ = runner.request(_request("onnx", "a.npy"), timeout=120)
        assert first.ok
        old = runner.pid
        assert old is not None
        began = time.monotonic()
        with pytest.raises(CommandTimeout):
            runner.request(_request("onnx", "slow.npy", epochs=100_000), timeout=1.0)
        assert time.monotonic() - began < 15
        assert runner.pid is None and not _running(board, old)
        again, _ = runner.request(_request("onnx", "b.npy"), timeout=120)
        assert again.ok and runner.starts == 2 and runner.pid not in (None, old)
        assert np.array_equal(_fetch(board, "a.npy", tmp_path), _fetch(board, "b.npy", tmp_path))
    finally:
        runner.close()


def test_a_runner_killed_mid_request_fails_it_and_one_dead_between_requests_is_replaced(board: Board) -> None:
    runner = board.serve("onnx")
    try:
        assert runner.request(_request("onnx", "a.npy"), timeout=120)[0].ok
        pid = runner.pid
        killer = threading.Timer(1.5, lambda: board.transport.run(["kill", "-9", str(pid)], timeout=30))
        killer.start()
        failed, _ = runner.request(_request("onnx", "b.npy", epochs=100_000), timeout=120)
        killer.join()
        if isinstance(board.transport, SSHTransport):  # paramiko drops exit-signal: the status reads -1
            assert failed.status == "runner error" and "exited -1" in failed.message
        else:
            assert failed.status == "out of memory" and "SIGKILL" in failed.message  # what the OOM killer sends
        assert not _running(board, pid)
        again, _ = runner.request(_request("onnx", "c.npy"), timeout=120)
        assert again.ok and runner.starts == 2 and runner.pid != pid
        second = runner.pid
        board.transport.run(["kill", "-9", str(second)], timeout=30)
        deadline = time.monotonic() + 10
        while runner.alive() and time.monotonic() < deadline:
            time.sleep(0.05)
        quiet, _ = runner.request(_request("onnx", "d.npy"), timeout=120)  # died while idle: no client lost
        assert quiet.ok and runner.starts == 3 and runner.pid not in (pid, second)
    finally:
        runner.close()


class _Recording(ResidentRunner):
    """A resident runner that keeps the requests it sends."""

    sent: list[dict[str, Any]]

    def request(self, doc: Mapping[str, Any], timeout: float) -> tuple[contract.RunnerOutput, float]:
        self.sent = [*getattr(self, "sent", []), dict(doc)]
        return super().request(doc, timeout)


def test_a_device_s_runner_trains_with_device_paths_sent_relative_to_its_workdir(board: Board, tmp_path: Path) -> None:
    # absolute device paths in, relative ones on the line: the phone's sandbox maps only command-line paths
    runner = _Recording.for_device(
        board.transport, PY, f"{board.remote_dir}/runner.pyz", backend="onnx", threads=1,
        workdir=board.remote_dir, start_timeout=120,
    )  # fmt: skip
    base = board.remote_dir
    try:
        output, seconds = runner.train(
            f"{base}/set", params=f"{base}/in.npy", data=f"{base}/shard.npz", out=f"{base}/rel.npy", timeout=120,
            backend="onnx", epochs=2, lr=0.05, threads=1, seed=3, request_id="c0",
        )  # fmt: skip
        assert output.ok, output.message
        assert output.document.id == "c0" and seconds > 0 and runner.starts == 1
        assert {k: runner.sent[0][k] for k in ("artifacts", "params", "data", "out")} == {
            "artifacts": "set", "params": "in.npy", "data": "shard.npz", "out": "rel.npy",
        }  # fmt: skip
        assert (board.host_dir / "rel.npy").exists()
    finally:
        runner.close()
    assert relative_paths("/w/", a="/w/x/y", b="/elsewhere/z", c="rel") == {"a": "x/y", "b": "/elsewhere/z", "c": "rel"}
    assert relative_paths(None, a="/w/x") == {"a": "/w/x"}


def test_start_up_failure_is_one_line_and_leaves_nothing_running(tmp_path: Path) -> None:
    transport = LocalTransport(workdir=tmp_path)
    runner = ResidentRunner(
        transport, contract.serve_argv(PY, str(archive_path()), backend="onnx", threads=0), start_timeout=60
    )
    ready = runner.start()
    assert ready.status == "bad arguments" and "--threads" in ready.message
    assert not runner.alive() and runner.pid is None
    transport.close()


@pytest.mark.parametrize(
    ("backend", "hidden", "missing"),
    [
        ("ort", "onnxruntime", "onnxruntime.training"),
        ("onnx", "onnxruntime", "onnxruntime"),
        ("torch", "torch", "torch"),
    ],
)
def test_a_runtime_that_cannot_be_imported_is_named_in_the_ready_line(
    tmp_path: Path, backend: str, hidden: str, missing: str
) -> None:
    """``serve --backend B`` imports B's runtime at start, as ``bench`` does, and names what is missing."""
    import os
    import subprocess

    package = tmp_path / "hide" / hidden  # earlier on sys.path and failing to import: an uninstalled runtime
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(f"raise ImportError('{hidden} hidden by the test')\n")
    argv = contract.serve_argv(PY, str(archive_path()), backend=backend, threads=1)
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "hide")}
    done = subprocess.run(argv, input="", capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)
    ready = json.loads(done.stdout.splitlines()[0])
    assert (ready["event"], ready["status"], ready["missing"]) == ("ready", "missing runtime", missing), ready
    assert "hidden by the test" in ready["error"] and done.returncode == 3


def test_reply_lines_parse_to_the_one_shot_statuses() -> None:
    assert contract.parse_reply(json.dumps({"status": "ok", "loss": [1.0]})).ok
    oom = contract.parse_reply(json.dumps({"status": "out of memory", "error": "bad_alloc"}))
    assert oom.status == "out of memory" and oom.message == "bad_alloc"
    assert contract.parse_reply("not json").status == "runner error"
    assert contract.ended_output(-9, "").status == "out of memory"
    assert contract.ended_output(1, "Traceback: boom").status == "runner error"
    assert "boom" in contract.ended_output(1, "Traceback: boom").message


# -- a runner that lies: every bad line is refused at the contract boundary, with its reason, in one line

LYING_RUNNER = Path(__file__).with_name("lying_runner.py")


def lying(tmp_path: Path, plan: Mapping[str, Any]) -> ResidentRunner:
    """A `ResidentRunner` whose process is the lying runner, on a local transport."""
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    argv = [PY, str(LYING_RUNNER), str(tmp_path / "plan.json")]
    return ResidentRunner(LocalTransport(workdir=tmp_path), argv, start_timeout=60.0)


@pytest.mark.parametrize(
    ("reply", "reason"),
    [
        ({"raw": "x" * 3000}, "3000 bytes, over the cap of 2000"),
        ({"raw": '{"status": "ok", '}, "is not JSON"),
        ({"raw": "[1, 2]"}, "is JSON list, not an object"),
        ({"raw": '"ok"'}, "is JSON str, not an object"),
        ({"raw": '{"status": "ok", "loss": [NaN]}'}, "holds the non-finite number NaN"),
        ({"raw": '{"status": "ok", "step_seconds": [Infinity]}'}, "holds the non-finite number Infinity"),
        ({"raw": '{"status": "ok", "step_seconds": [1e999]}'}, "'step_seconds[0]': expected a finite number"),
        ({"raw": '{"status": "ok", "loss": [-1e999]}'}, "'loss[0]': expected a finite number"),
        ({"patch": {"step_seconds": [0.01, -0.5]}}, "'step_seconds[1]': expected seconds (a number >= 0)"),
        ({"patch": {"request_seconds": -1}}, "'request_seconds': expected seconds (a number >= 0)"),
        ({"patch": {"examples": -20}}, "'examples': expected a count (an integer >= 0)"),
        ({"patch": {"loss": ["low"]}}, "'loss[0]': expected a finite number"),
        ({"patch": {"surprise": 1, "eval": "__import__('os')"}}, "unknown keys 'eval', 'surprise'"),
    ],
)
def test_a_lying_reply_is_refused_with_its_reason_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, reply: dict[str, Any], reason: str
) -> None:
    monkeypatch.setattr(contract, "MAX_REPLY_BYTES", 2000)
    runner = lying(tmp_path, {"replies": {"r1": reply, "r2": {}}})
    try:
        output, _ = runner.request({"id": "r1", "mode": "ping"}, timeout=60)
        assert output.status == "runner error" and not output.ok and reason in output.message
        assert "\n" not in output.message and output.document.raw == {}
        # the lie is refused, not the device: its next honest reply is taken
        honest, _ = runner.request({"id": "r2", "mode": "ping"}, timeout=60)
        assert honest.ok and honest.document.id == "r2"
    finally:
        runner.close()


@pytest.mark.parametrize(
    ("ready", "reason"),
    [
        ({"protocol": 2}, "event 'ready' of protocol 2, the host speaks protocol 1"),
        ({"protocol": None}, "of protocol None"),
        ({"event": "hello"}, "event 'hello'"),
        ('{"mode": "serve", "event": "ready", "protocol": 1, "pid": -4}', "'pid': expected a count"),
    ],
)
def test_a_ready_line_of_another_protocol_is_refused_and_no_runner_is_left(
    tmp_path: Path, ready: dict[str, Any] | str, reason: str
) -> None:
    runner = lying(tmp_path, {"ready": ready})
    try:
        output = runner.start()
        assert output.status == "runner error" and reason in output.message and "\n" not in output.message
        assert not runner.alive() and runner.pid is None
    finally:
        runner.close()


def test_the_honest_double_is_taken(tmp_path: Path) -> None:
    runner = lying(tmp_path, {})
    try:
        ready = runner.start()
        assert ready.ok and ready.document.protocol == 1 and ready.document.max_sessions == 8
    finally:
        runner.close()
