"""The devices executor: real runner, real ORT training, over a local, an unreachable and an emulated SSH device.

The resident runner (one ``runner.pyz serve`` per device) is checked against the one-shot
mode (same parameters out for the same inputs), across rounds (one process, its pid
stays), after a request that times out (killed, a new one next round), and on an SSH
device that goes down and comes back (a new runner). FjORD per step and FedDrop's
SyncDrop are checked against the in-process trainers on the same data and seeds, and so
are clients whose shard is smaller than one batch or not a whole number of batches: the
device trains the short last batch as in process, and reports every example (the FedAvg
weight).
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import numpy as np
import pytest

from devices.connect import connect
from devices.emulation import emulate
from devices.emulation.sshd import free_port
from devices.fleet import Device, Emulation
from devices.fleetfile import load_fleet
from devices.transport import Process, RunResult, Transport
from exporters.userinput import InputError
from exporters.zoo import get_model
from fl.executors.devices import DevicesExecutor, cut_prefix, prefix_positions
from fl.records import ClientFailure, TrainIns

PY = sys.executable


def _global(model_name: str) -> dict[str, np.ndarray]:
    import torch

    torch.manual_seed(0)
    return {k: v.numpy().copy() for k, v in get_model(model_name).build().state_dict().items()}


def _shard(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.standard_normal((n, 1, 28, 28)).astype(np.float32), rng.integers(0, 10, n).astype(np.int64)


def test_clients_train_on_a_device_and_a_dead_device_is_a_failure(tmp_path: Path) -> None:
    model = get_model("fjord-cnn")
    g = _global("fjord-cnn")
    local = Device("loc", "local", workdir=str(tmp_path / "device"), python=PY, emulate=Emulation(rate_kbit=8000))
    dead = Device(
        "dead", "ssh", host="127.0.0.1", port=free_port(), user="nobody", workdir="/tmp/x", trust_on_first_use=True
    )
    placement = {"c0": local, "c1": local, "c2": dead}
    executor = DevicesExecutor(
        model, placement, artifacts_dir=tmp_path / "artifacts", work_dir=tmp_path / "work", batch=20,
        connect=lambda d: connect(d, connect_timeout=2.0), timeout_s=120,
    )  # fmt: skip
    instructions = {}
    for cid, rate in (("c0", 0.25), ("c1", 0.5), ("c2", 0.25)):
        sub = model.static(rate)
        instructions[cid] = TrainIns(cid, sub, model.extract(g, sub), {"epochs": 1, "lr": 0.1, "seed": 3})
    shards = {cid: _shard(40, i) for i, cid in enumerate(instructions)}
    try:
        results, failures = executor.run(instructions, shards)
    finally:
        executor.close()
    assert [r.cid for r in results] == ["c0", "c1"]
    assert [(f.cid, f.reason) for f in failures] == [("c2", "unreachable")]
    for res in results:
        sent = instructions[res.cid].parameters
        assert set(res.parameters) == set(sent)
        assert all(res.parameters[k].shape == sent[k].shape for k in sent)
        assert any(not np.array_equal(res.parameters[k], sent[k]) for k in sent)
        assert res.num_examples == 40 and res.metrics["steps"] == 2
        # the step loop: its CPU time within its wall time (one thread), which holds the steps
        assert 0 < res.metrics["loop_cpu_seconds"] <= res.metrics["loop_seconds"] + 1e-3
        assert res.metrics["step_seconds"] <= res.metrics["loop_seconds"]
        assert res.compute_seconds > 0 and res.download_seconds >= 0 and res.upload_seconds >= 0
        assert res.metrics["download_modelled_s"] == pytest.approx(res.metrics["download_bytes"] * 8 / 8e6)


def test_a_second_round_pushes_only_parameters(tmp_path: Path) -> None:
    model = get_model("fjord-cnn")
    g = _global("fjord-cnn")
    device = Device("loc", "local", workdir=str(tmp_path / "device"), python=PY)
    executor = DevicesExecutor(
        model, {"c0": device}, artifacts_dir=tmp_path / "a", work_dir=tmp_path / "w", batch=20, connect=connect
    )
    sub = model.static(0.25)
    shards = {"c0": _shard(20, 0)}
    first, _ = executor.run({"c0": TrainIns("c0", sub, model.extract(g, sub), {"lr": 0.1})}, shards)
    cas = tmp_path / "device" / "cas"
    before = sorted(p.name for p in cas.iterdir())
    second, _ = executor.run({"c0": TrainIns("c0", sub, first[0].parameters, {"lr": 0.1})}, shards)
    executor.close()
    assert sorted(p.name for p in cas.iterdir()) == before
    assert any(not np.array_equal(second[0].parameters[k], first[0].parameters[k]) for k in first[0].parameters)


def test_a_client_round_on_a_device_with_a_power_sensor_logs_its_measured_energy(tmp_path: Path) -> None:
    from tests.harness.test_runner_energy import hwmon

    model = get_model("fjord-cnn")
    g = _global("fjord-cnn")
    root = hwmon(tmp_path / "power", interval_ms=1)  # VDD_IN: 5 V x 1 A, updated every millisecond
    metered = Device("metered", "local", workdir=str(tmp_path / "device"), python=PY, power_root=str(root))
    bare = Device("bare", "local", workdir=str(tmp_path / "bare"), python=PY, power_root=str(tmp_path / "none"))
    executor = DevicesExecutor(
        model, {"c0": metered, "c1": bare}, artifacts_dir=tmp_path / "a", work_dir=tmp_path / "w", batch=20,
        connect=connect,
    )  # fmt: skip
    sub = model.static(0.25)
    instructions = {cid: TrainIns(cid, sub, model.extract(g, sub), {"lr": 0.1}) for cid in ("c0", "c1")}
    try:
        # 100 steps: the window's reading before the first step and after the last, late by some tens of
        # milliseconds on a busy host, stay a small part of it
        results, failures = executor.run(instructions, {"c0": _shard(2000, 0), "c1": _shard(40, 1)})
    finally:
        executor.close()
    assert not failures
    by_cid = {r.cid: r for r in results}
    energy = by_cid["c0"].metrics["energy_j"]
    # a constant 5 W over the round's metered window: about the step loop's wall time (the window
    # opens with a reading just before the first step and closes with one just after the last)
    assert 0.5 <= energy / (5.0 * by_cid["c0"].metrics["loop_seconds"]) <= 1.5
    assert by_cid["c0"].metrics["energy_emulated"] == 0.0
    assert "energy_j" not in by_cid["c1"].metrics  # no sensor below its power root: no energy, and no failure


def test_an_unknown_local_trainer_and_fjord_kd_are_refused_not_dropped(tmp_path: Path) -> None:
    model = get_model("fjord-cnn")
    device = Device("loc", "local", workdir=str(tmp_path / "device"), python=PY)
    executor = DevicesExecutor(
        model, {"c0": device, "c1": device, "c2": device}, artifacts_dir=tmp_path / "a", work_dir=tmp_path / "w",
        batch=20, connect=connect,
    )  # fmt: skip
    sub = model.static(0.25)
    params = model.extract(_global("fjord-cnn"), sub)
    kd = {"trainer": "fjord", "widths": [0.25], "capacity": 0.25, "kd": True}
    instructions = {
        "c0": TrainIns("c0", sub, params, {"trainer": "scaffold"}),
        "c1": TrainIns("c1", sub, params, {"trainer": "syncdrop"}),  # SyncDrop trains the full model only
        "c2": TrainIns("c2", sub, params, kd),
    }
    results, failures = executor.run(instructions, {c: _shard(20, 0) for c in instructions})
    executor.close()
    assert results == [] and all(isinstance(f, ClientFailure) and f.reason == "refused" for f in failures)
    messages = {f.cid: f.message for f in failures}
    assert "scaffold" in messages["c0"] and "full model" in messages["c1"]
    assert "kd=true" in messages["c2"] and "devices" in messages["c2"]


def test_a_fjord_train_config_with_the_old_p_max_key_trains_at_that_capacity(tmp_path: Path) -> None:
    model = get_model("fjord-cnn")
    device = Device("loc", "local", workdir=str(tmp_path / "device"), python=PY)
    executor = DevicesExecutor(
        model, {"c0": device}, artifacts_dir=tmp_path / "a", work_dir=tmp_path / "w", batch=20, connect=connect
    )
    sub = model.static(0.25)
    params = model.extract(_global("fjord-cnn"), sub)
    try:
        for key in ("p_max", "capacity"):  # a config from a checkpoint written before the rename, and today's
            ins = TrainIns("c0", sub, params, {"trainer": "fjord", key: 0.25})
            widths = executor._fjord_widths(ins, tmp_path / "set", {})
            assert [(w.width, w.index) for w in widths] == [(0.25, None)], key
    finally:
        executor.close()


def test_prefix_cut_and_flat_positions_on_an_lstm() -> None:
    from exporters.manifest import flatten

    model = get_model("fjord-rnn")  # LSTM gate blocks: positions depend on the outer width
    g = _global("fjord-rnn")
    outer, inner = model.arch(0.6), model.arch(0.2)
    outer_params = model.extract(g, model.static(0.6))
    cut = cut_prefix(model, outer, outer_params, inner)
    direct = model.extract(g, model.static(0.2))
    assert all(np.array_equal(cut[k], direct[k]) for k in direct)

    def manifest(params: dict[str, np.ndarray]) -> dict:
        entries, offset = [], 0
        for name in sorted(params, reverse=True):  # an order other than the dict's
            entries.append(
                {"name": name, "shape": list(params[name].shape), "offset": offset, "size": params[name].size}
            )
            offset += params[name].size
        return {"parameters": entries}

    outer_m, inner_m = manifest(outer_params), manifest(direct)
    positions = prefix_positions(model, outer, outer_m, inner, inner_m)
    assert np.array_equal(flatten(outer_m, outer_params)[positions], flatten(inner_m, direct))
    assert len(set(positions.tolist())) == positions.size


# ---------------------------------------------------------------------------- connections are closed


@pytest.fixture(scope="module")
def board(sshd_path: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Device]:
    """One emulated SSH device (a real sshd), up for the module."""
    path = tmp_path_factory.mktemp("fleet") / "fleet.yaml"
    path.write_text(
        "state_dir: state\ndevices:\n  - name: board\n    kind: ssh\n    host: 127.0.0.1\n"
        f"    port: {free_port()}\n    emulate: {{memory_mb: 4096}}\n"
    )
    fleet = load_fleet(path)
    try:
        assert emulate.up(fleet, say=lambda line: None).ok
        yield fleet.devices[0]
    finally:
        assert emulate.down(fleet, say=lambda line: None) == []


def established_to(port: int) -> int:
    """Count the ESTABLISHED TCP connections to 127.0.0.1:``port`` on this machine (``/proc/net/tcp``)."""
    count = 0
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        address, state = fields[2], fields[3]
        if state == "01" and address == f"0100007F:{port:04X}":
            count += 1
    return count


def _run_fl_on(board: Device, tmp_path: Path, artifacts: Path, progress: object) -> object:
    from fl.data import load_federated
    from fl.server import RunConfig, run_fl

    model = get_model("fjord-cnn")
    placement = {"c0": board, "c1": board}
    config = RunConfig(
        strategy="fedavg", model="fjord-cnn", dataset="mnist5k", clients=2, rounds=2, seed=1,
        executor="devices", db=str(tmp_path / "fl.db"), lr=0.05,
    )  # fmt: skip
    data = load_federated("mnist5k", model, 2, "iid", 1, max_examples=80)
    with DevicesExecutor(
        model, placement, artifacts_dir=artifacts, work_dir=tmp_path / "work", batch=20,
        connect=lambda d: connect(d, connect_timeout=10.0), timeout_s=120,
    ) as executor:  # fmt: skip
        return run_fl(
            config, executor=executor, data=data, progress=progress,  # type: ignore[arg-type]
            placement={cid: board.name for cid in placement},
        )  # fmt: skip


@pytest.fixture(scope="module")
def shared_artifacts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One export cache for the module's runs."""
    return tmp_path_factory.mktemp("artifacts")


def test_a_finished_run_leaves_no_connection_open(board: Device, tmp_path: Path, shared_artifacts: Path) -> None:
    port = board.port or 22
    assert established_to(port) == 0
    during: list[int] = []
    summary = _run_fl_on(board, tmp_path, shared_artifacts, lambda line: during.append(established_to(port)))
    assert summary.rounds == 2  # type: ignore[attr-defined]
    assert len(during) == 2 and all(n >= 1 for n in during), during  # one connection, kept between rounds
    assert established_to(port) == 0


def test_a_run_failing_midway_leaves_no_connection_open(board: Device, tmp_path: Path, shared_artifacts: Path) -> None:
    port = board.port or 22
    seen: list[int] = []

    def fail_after_round_one(line: str) -> None:
        seen.append(established_to(port))
        raise RuntimeError("the run failed midway")

    with pytest.raises(RuntimeError, match="midway"):
        _run_fl_on(board, tmp_path, shared_artifacts, fail_after_round_one)
    assert seen and seen[0] >= 1
    assert established_to(port) == 0


# ---------------------------------------------------------------------------- the resident runner


def _executor(tmp_path: Path, placement: dict, resident: bool = True, **kw: object) -> DevicesExecutor:
    return DevicesExecutor(
        get_model("fjord-cnn"), placement, artifacts_dir=tmp_path / "a", work_dir=tmp_path / f"w{resident}",
        batch=20, connect=lambda d: connect(d, connect_timeout=5.0), timeout_s=120, resident=resident, **kw,  # type: ignore[arg-type]
    )  # fmt: skip


def _pid_running(pid: int) -> bool:
    import os

    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_resident_runner_keeps_its_process_across_rounds_and_equals_the_one_shot_mode(tmp_path: Path) -> None:
    model = get_model("fjord-cnn")
    g = _global("fjord-cnn")
    device = Device("loc", "local", workdir=str(tmp_path / "device"), python=PY)
    sub = model.static(0.5)
    ins = {"c0": TrainIns("c0", sub, model.extract(g, sub), {"epochs": 2, "lr": 0.1, "seed": 4})}
    shards = {"c0": _shard(60, 1)}
    with _executor(tmp_path, {"c0": device}, resident=False) as once:
        expected, failed = once.run(ins, shards)
    assert not failed
    pids = []
    with _executor(tmp_path, {"c0": device}) as executor:
        for rnd in range(3):
            results, failures = executor.run(ins, shards)
            assert not failures
            # the first round on a new runner is trained once and discarded first: no round that counts opens a session
            assert results[0].metrics["sessions_opened"] == 0
            assert ("setup_seconds" in results[0].metrics) == (rnd == 0)
            assert all(
                np.array_equal(results[0].parameters[k], expected[0].parameters[k]) for k in ins["c0"].parameters
            )
            assert results[0].metrics["loss"] == expected[0].metrics["loss"]
            runner = executor.runner_of("loc")
            pids.append(runner.pid)
            assert results[0].metrics["runner_starts"] == 1
        assert len(set(pids)) == 1 and _pid_running(pids[0])
    assert not _pid_running(pids[0])  # closed with the executor


def test_a_sub_model_the_runner_has_not_trained_is_warmed_up_once(tmp_path: Path) -> None:
    model = get_model("fjord-cnn")
    g = _global("fjord-cnn")
    device = Device("loc", "local", workdir=str(tmp_path / "device"), python=PY)
    shards = {"c0": _shard(40, 1)}

    def at(width: float) -> dict[str, TrainIns]:
        sub = model.static(width)
        return {"c0": TrainIns("c0", sub, model.extract(g, sub), {"lr": 0.1, "seed": 3})}

    warmed = []
    with _executor(tmp_path, {"c0": device}) as executor:
        for width in (0.5, 0.25, 0.5, 0.25):
            results, failures = executor.run(at(width), shards)
            assert not failures
            assert results[0].metrics["sessions_opened"] == 0
            warmed.append("setup_seconds" in results[0].metrics)
    assert warmed == [True, True, False, False]
    with _executor(tmp_path, {"c0": device}, warm_up=False) as executor:
        results, _ = executor.run(at(0.5), shards)
        assert results[0].metrics["sessions_opened"] == 1 and "setup_seconds" not in results[0].metrics


def test_no_counted_round_starts_before_every_cold_runner_has_warmed_up(tmp_path: Path) -> None:
    model = get_model("fjord-cnn")
    sub = model.static(0.25)
    params = model.extract(_global("fjord-cnn"), sub)
    placement = {cid: Device(cid, "local", workdir=str(tmp_path / cid), python=PY) for cid in ("quick", "long")}
    # "long" trains 20 epochs of its shard, so its warm-up outlasts "quick"'s warm-up and round
    ins = {
        "quick": TrainIns("quick", sub, params, {"lr": 0.1}),
        "long": TrainIns("long", sub, params, {"lr": 0.1, "epochs": 20}),
    }
    shards = {"quick": _shard(20, 0), "long": _shard(100, 1)}
    calls: dict[str, list[tuple[float, float]]] = {"quick": [], "long": []}
    with _executor(tmp_path, placement) as executor:
        train = executor._train

        def timed(job):  # type: ignore[no-untyped-def]
            begin = time.monotonic()
            try:
                return train(job)
            finally:
                calls[job.device.name].append((begin, time.monotonic()))

        executor._train = timed  # type: ignore[method-assign]
        results, failures = executor.run(ins, shards)
    assert not failures and all("setup_seconds" in r.metrics for r in results)
    (quick_warm, quick_round), (long_warm, long_round) = calls["quick"], calls["long"]
    assert quick_round[0] >= long_warm[1] and long_round[0] >= quick_warm[1]


def test_a_timed_out_client_kills_the_runner_and_the_next_round_gets_a_new_one(tmp_path: Path) -> None:
    model = get_model("fjord-cnn")
    device = Device("loc", "local", workdir=str(tmp_path / "device"), python=PY)
    sub = model.static(0.25)
    params = model.extract(_global("fjord-cnn"), sub)
    shards = {"c0": _shard(40, 0)}
    with _executor(tmp_path, {"c0": device}) as executor:
        ok, _ = executor.run({"c0": TrainIns("c0", sub, params, {"lr": 0.1})}, shards)
        old = executor.runner_of("loc").pid
        long = TrainIns("c0", sub, params, {"lr": 0.1, "epochs": 20_000})
        results, failures = executor.run({"c0": long}, shards, timeout_s=1.0)
        assert results == [] and failures[0].reason == "timeout" and "killed" in failures[0].message
        assert not _pid_running(old)
        again, failures = executor.run({"c0": TrainIns("c0", sub, params, {"lr": 0.1})}, shards, timeout_s=120)
        assert not failures and again[0].metrics["runner_starts"] == 2
        assert again[0].metrics["setup_seconds"] > 0 and again[0].metrics["sessions_opened"] == 0  # warmed again
        assert executor.runner_of("loc").pid not in (None, old)
        assert all(np.array_equal(again[0].parameters[k], ok[0].parameters[k]) for k in params)


def test_a_warm_up_that_times_out_fails_its_client_with_the_reason(tmp_path: Path) -> None:
    model = get_model("fjord-cnn")
    device = Device("loc", "local", workdir=str(tmp_path / "device"), python=PY)
    sub = model.static(0.25)
    long = {"c0": TrainIns("c0", sub, model.extract(_global("fjord-cnn"), sub), {"lr": 0.1, "epochs": 20_000})}
    with _executor(tmp_path, {"c0": device}) as executor:
        results, failures = executor.run(long, {"c0": _shard(40, 0)}, timeout_s=1.0)
    assert results == [] and [f.reason for f in failures] == ["timeout"]
    assert "while warming up the device's runner" in failures[0].message


def test_fjord_samples_a_width_per_step_on_the_device_as_in_process(tmp_path: Path, one_torch_thread: None) -> None:
    from fl.strategies.fjord import drawn_widths, train_ordered

    model = get_model("fjord-cnn")
    g = _global("fjord-cnn")
    device = Device("loc", "local", workdir=str(tmp_path / "device"), python=PY)
    sub = model.static(0.6)
    cfg = {"trainer": "fjord", "widths": [0.2, 0.4, 0.6], "capacity": 0.6, "epochs": 2, "lr": 0.05, "seed": 7,
           "batch_size": 20}  # fmt: skip
    ins = TrainIns("c0", sub, model.extract(g, sub), cfg)
    x, y = _shard(80, 2)
    expected, in_metrics = train_ordered(model, ins, x, y)
    with _executor(tmp_path, {"c0": device}) as executor:
        results, failures = executor.run({"c0": ins}, {"c0": (x, y)})
    assert not failures, failures
    res = results[0]
    assert res.metrics["mean_width"] == pytest.approx(in_metrics["mean_width"])
    assert res.metrics["steps"] == in_metrics["steps"] == 8
    per_width = dict(res.steps_at_width)
    assert sum(per_width.values()) == 8 and len(per_width) >= 2  # more than one width within one round
    drawn = drawn_widths([0.2, 0.4, 0.6], 7, 80, 20, 2)  # what the server predicts with
    assert per_width == {w: drawn.count(w) for w in set(drawn)}
    assert not any("/" in key for key in res.metrics)  # no structure encoded in metric names
    assert res.metrics["width_switches"] >= 1
    for k in expected:
        np.testing.assert_allclose(res.parameters[k], expected[k], rtol=1e-4, atol=1e-5, err_msg=k)
    moved = sum(float(np.abs(res.parameters[k] - ins.parameters[k]).sum()) for k in expected)
    assert moved > 0


def test_syncdrop_masks_on_the_device_train_as_in_process(tmp_path: Path, one_torch_thread: None) -> None:
    from fl.strategies.feddrop import train_syncdrop

    model = get_model("fjord-cnn")
    g = _global("fjord-cnn")
    device = Device("loc", "local", workdir=str(tmp_path / "device"), python=PY)
    sub = model.static(1.0)
    rng = np.random.default_rng(5)
    keep = {group: rng.uniform(0.3, 1.0, size).tolist() for group, size in model.groups}
    cfg = {"trainer": "syncdrop", "keep": keep, "sync_seed": 11, "epochs": 1, "lr": 0.05, "seed": 2, "batch_size": 20}
    ins = TrainIns("c0", sub, model.extract(g, sub), cfg)
    x, y = _shard(60, 3)
    expected, in_metrics = train_syncdrop(model, ins, x, y)
    with _executor(tmp_path, {"c0": device}, backends={"loc": "onnx"}) as executor:
        results, failures = executor.run({"c0": ins}, {"c0": (x, y)})
    assert not failures, failures
    res = results[0]
    for key in ("expected_train_flops", "sampled_train_flops", "dense_train_flops", "train_flops", "kept_fraction"):
        assert res.metrics[key] == pytest.approx(in_metrics[key], rel=1e-9), key
    assert res.metrics["sampled_train_flops"] < res.metrics["dense_train_flops"]
    for k in expected:
        np.testing.assert_allclose(res.parameters[k], expected[k], rtol=1e-4, atol=1e-5, err_msg=k)
    dense = TrainIns("c0", sub, ins.parameters, {**cfg, "trainer": "plain"})
    with _executor(tmp_path, {"c0": device}, backends={"loc": "onnx"}) as executor:
        plain, _ = executor.run({"c0": dense}, {"c0": (x, y)})
    assert any(not np.allclose(plain[0].parameters[k], res.parameters[k]) for k in expected)  # the masks acted


@pytest.mark.parametrize("backend", ["ort", "onnx"])
def test_a_short_last_batch_trains_on_the_device_as_in_process(
    tmp_path: Path, one_torch_thread: None, backend: str
) -> None:
    from fl.client import train_plain

    model = get_model("fjord-cnn")
    g = _global("fjord-cnn")
    device = Device("loc", "local", workdir=str(tmp_path / "device"), python=PY)
    sub = model.static(0.5)
    cfg = {"epochs": 2, "lr": 0.05, "seed": 3, "batch_size": 20}
    shards = {"c7": _shard(7, 1), "c45": _shard(45, 2)}  # smaller than one batch of 20; two and a short one
    instructions = {cid: TrainIns(cid, sub, model.extract(g, sub), cfg) for cid in shards}
    with _executor(tmp_path, {cid: device for cid in shards}, backends={"loc": backend}) as executor:
        results, failures = executor.run(instructions, shards)
    assert not failures, failures
    for res in results:
        x, y = shards[res.cid]
        expected, metrics = train_plain(model, instructions[res.cid], x, y)
        assert res.num_examples == len(y)  # 7 and 45, not 0 and 40
        assert res.metrics["steps"] == metrics["steps"] == 2 * -(-len(y) // 20)
        assert res.metrics["loss"] == pytest.approx(metrics["loss"], rel=1e-4)
        for k in expected:
            np.testing.assert_allclose(res.parameters[k], expected[k], rtol=1e-4, atol=1e-5, err_msg=k)
        assert any(not np.allclose(res.parameters[k], instructions[res.cid].parameters[k]) for k in expected)


def test_fjord_and_syncdrop_train_the_short_last_batch_on_the_device_as_in_process(
    tmp_path: Path, one_torch_thread: None
) -> None:
    from fl.strategies.feddrop import train_syncdrop
    from fl.strategies.fjord import drawn_widths, train_ordered

    model = get_model("fjord-cnn")
    g = _global("fjord-cnn")
    device = Device("loc", "local", workdir=str(tmp_path / "device"), python=PY)
    x, y = _shard(45, 4)
    fjord = {"trainer": "fjord", "widths": [0.2, 0.4, 0.6], "capacity": 0.6, "epochs": 2, "lr": 0.05, "seed": 7,
             "batch_size": 20}  # fmt: skip
    rng = np.random.default_rng(5)
    keep = {group: rng.uniform(0.3, 1.0, size).tolist() for group, size in model.groups}
    syncdrop = {"trainer": "syncdrop", "keep": keep, "sync_seed": 11, "epochs": 2, "lr": 0.05, "seed": 2,
                "batch_size": 20}  # fmt: skip
    instructions = {
        "fj": TrainIns("fj", model.static(0.6), model.extract(g, model.static(0.6)), fjord),
        "sd": TrainIns("sd", model.static(1.0), model.extract(g, model.static(1.0)), syncdrop),
    }
    expected = {"fj": train_ordered(model, instructions["fj"], x, y)}
    expected["sd"] = train_syncdrop(model, instructions["sd"], x, y)
    with _executor(tmp_path, {"fj": device, "sd": device}, backends={"loc": "onnx"}) as executor:
        results, failures = executor.run(instructions, {"fj": (x, y), "sd": (x, y)})
    assert not failures, failures
    for res in results:
        params, metrics = expected[res.cid]
        assert res.num_examples == 45 and res.metrics["steps"] == metrics["steps"] == 6
        assert res.metrics["loss"] == pytest.approx(metrics["loss"], rel=1e-4)
        for k in params:
            np.testing.assert_allclose(res.parameters[k], params[k], rtol=1e-4, atol=1e-5, err_msg=f"{res.cid} {k}")
    fj, sd = (next(r for r in results if r.cid == cid) for cid in ("fj", "sd"))
    assert fj.metrics["mean_width"] == pytest.approx(expected["fj"][1]["mean_width"])
    drawn = drawn_widths([0.2, 0.4, 0.6], 7, 45, 20, 2)  # every batch, the short ones too
    assert dict(fj.steps_at_width) == {w: drawn.count(w) for w in set(drawn)}
    assert not sd.steps_at_width  # SyncDrop trains the sub-model sent at every step
    for key in ("expected_train_flops", "sampled_train_flops", "dense_train_flops", "train_flops", "kept_fraction"):
        assert sd.metrics[key] == pytest.approx(expected["sd"][1][key], rel=1e-9), key


def test_a_device_that_drops_and_comes_back_gets_a_new_runner(sshd_path: str, tmp_path: Path) -> None:
    model = get_model("fjord-cnn")
    path = tmp_path / "fleet.yaml"
    path.write_text(
        "state_dir: state\ndevices:\n  - name: flaky\n    kind: ssh\n    host: 127.0.0.1\n"
        f"    port: {free_port()}\n    emulate: {{memory_mb: 4096}}\n"
    )
    fleet = load_fleet(path)
    sub = model.static(0.25)
    ins = {"c0": TrainIns("c0", sub, model.extract(_global("fjord-cnn"), sub), {"lr": 0.1})}
    shards = {"c0": _shard(20, 0)}
    try:
        assert emulate.up(fleet, say=lambda line: None).ok
        with _executor(tmp_path, {"c0": fleet.devices[0]}) as executor:
            first, failures = executor.run(ins, shards)
            assert not failures
            old = executor.runner_of("flaky").pid
            assert emulate.down(fleet, say=lambda line: None) == []
            _, failures = executor.run(ins, shards, timeout_s=20)
            assert failures and failures[0].reason in ("unreachable", "timeout", "error"), failures
            assert executor.runner_of("flaky") is None or executor.runner_of("flaky").pid is None
            assert emulate.up(fleet, say=lambda line: None).ok
            again, failures = executor.run(ins, shards, timeout_s=120)
            assert not failures, failures
            assert executor.runner_of("flaky").pid not in (None, old)
            assert all(np.array_equal(again[0].parameters[k], first[0].parameters[k]) for k in first[0].parameters)
    finally:
        emulate.down(fleet, say=lambda line: None)


def test_device_turns_follow_the_isolation_plan() -> None:
    from fl.executors.devices import device_turns
    from harness.isolation import plan_isolation

    a, b, c, remote = (
        Device("a", "local", workdir="/tmp/a"),
        Device("b", "local", workdir="/tmp/b"),
        Device("c", "local", workdir="/tmp/c"),
        Device("r", "ssh", host="10.0.0.9", user="u", workdir="/w"),
    )
    plan = plan_isolation([a, b, c, remote], {"a": frozenset({0}), "b": frozenset({1}), "c": frozenset({0, 1})})
    assert device_turns(plan, ["a", "b", "c", "r"]) == {"a": [], "b": [], "c": ["a", "b"], "r": []}
    assert device_turns(plan, ["c", "a"]) == {"c": [], "a": ["c"]}  # the round's order decides who goes first
    assert device_turns(None, ["a", "c"]) == {"a": [], "c": []}
    assert device_turns(plan, ["x", "a"]) == {"x": [], "a": []}  # a device the plan does not know waits for no one


def test_devices_that_share_cpus_train_in_turns(tmp_path: Path) -> None:
    import threading
    import time

    from harness.isolation import plan_isolation

    model = get_model("fjord-cnn")
    g = _global("fjord-cnn")
    one = Device("one", "local", workdir=str(tmp_path / "one"), python=PY)
    two = Device("two", "local", workdir=str(tmp_path / "two"), python=PY)
    spans: dict[str, tuple[float, float]] = {}
    lock = threading.Lock()

    class Timed(DevicesExecutor):
        def _train(self, job):  # type: ignore[no-untyped-def]
            start = time.perf_counter()
            try:
                return super()._train(job)
            finally:
                with lock:
                    spans[job.ins.cid] = (start, time.perf_counter())

    sub = model.static(0.5)
    instructions = {c: TrainIns(c, sub, model.extract(g, sub), {"lr": 0.1, "seed": 1}) for c in ("c0", "c1")}
    shards = {c: _shard(60, i) for i, c in enumerate(instructions)}
    with Timed(
        model, {"c0": one, "c1": two}, artifacts_dir=tmp_path / "a", work_dir=tmp_path / "w", batch=20,
        connect=connect, isolation=plan_isolation([one, two], {}),
    ) as executor:  # fmt: skip
        for _ in range(2):  # the first round also starts the runners
            results, failures = executor.run(instructions, shards)
            assert not failures and len(results) == 2
            first_end, second_start = spans["c0"][1], spans["c1"][0]
            assert first_end <= second_start, "two local devices share every cpu: the second waits for the first"


def test_a_dead_device_ahead_in_the_turns_does_not_hold_up_the_round(tmp_path: Path) -> None:
    from harness.isolation import plan_isolation

    model = get_model("fjord-cnn")
    g = _global("fjord-cnn")
    dead = Device(
        "dead", "ssh", host="127.0.0.1", port=free_port(), user="nobody", workdir="/tmp/x", trust_on_first_use=True
    )
    local = Device("loc", "local", workdir=str(tmp_path / "device"), python=PY)
    sub = model.static(0.25)
    instructions = {c: TrainIns(c, sub, model.extract(g, sub), {"lr": 0.1}) for c in ("c0", "c1")}
    with DevicesExecutor(
        model, {"c0": dead, "c1": local}, artifacts_dir=tmp_path / "a", work_dir=tmp_path / "w", batch=20,
        connect=lambda d: connect(d, connect_timeout=2.0), timeout_s=60, isolation=plan_isolation([dead, local], {}),
    ) as executor:  # fmt: skip
        assert executor.isolation is not None and executor.isolation.conflict("dead", "loc")  # loc waits for dead
        results, failures = executor.run(instructions, {c: _shard(20, i) for i, c in enumerate(instructions)})
    assert [r.cid for r in results] == ["c1"]
    assert [(f.cid, f.reason) for f in failures] == [("c0", "unreachable")]


def test_backend_for_strategy_sends_masked_strategies_to_the_onnx_step_model() -> None:
    from fl.executors.devices import backend_for_strategy

    assert backend_for_strategy("feddrop", "auto") == "onnx"
    assert backend_for_strategy("feddrop", "onnx") == "onnx"
    assert backend_for_strategy("fjord", "auto") == "auto" and backend_for_strategy("fedavg", "ort") == "ort"
    for other in ("ort", "torch"):
        with pytest.raises(InputError, match=f"--backend {other} has no mask inputs"):
            backend_for_strategy("feddrop", other)


def test_syncdrop_on_a_device_that_trains_with_ort_is_refused_before_anything_is_sent(tmp_path: Path) -> None:
    model = get_model("fjord-cnn")
    device = Device("loc", "local", workdir=str(tmp_path / "device"), python=PY)
    sub = model.static(1.0)
    keep = {group: [0.5] * size for group, size in model.groups}
    cfg = {"trainer": "syncdrop", "keep": keep, "sync_seed": 1, "epochs": 1, "lr": 0.05, "batch_size": 20}
    ins = TrainIns("c0", sub, model.extract(_global("fjord-cnn"), sub), cfg)
    with _executor(tmp_path, {"c0": device}, backends={"loc": "ort"}) as executor:
        results, failures = executor.run({"c0": ins}, {"c0": _shard(40, 1)})
    assert not results and [(f.cid, f.reason) for f in failures] == [("c0", "refused")]
    assert "masks enter only the onnx backend's step model, and loc trains with ort" in failures[0].message
    assert not (tmp_path / "device").exists()  # nothing was sent to the device


# -- a device that lies: its runner speaks the real protocol with bad data, and no result of it is taken

LYING_RUNNER = Path(__file__).parents[2] / "harness" / "lying_runner.py"


class LyingDevice:
    """A local device whose serving runner is the lying runner (`tests.harness.lying_runner`), the rest real."""

    def __init__(self, inner: Transport, plan: Path) -> None:
        self.inner, self.plan = inner, plan

    def run(self, argv: Sequence[str], timeout: float) -> RunResult:
        return self.inner.run(argv, timeout)

    def put(self, local: Path, remote: str) -> None:
        self.inner.put(local, remote)

    def get(self, remote: str, local: Path) -> None:
        self.inner.get(remote, local)

    def close(self) -> None:
        self.inner.close()

    def start(self, argv: Sequence[str], env: Mapping[str, str] | None = None) -> Process:
        options = list(argv[list(argv).index("serve") + 1 :])
        return self.inner.start([PY, str(LYING_RUNNER), str(self.plan), *options], env)


def test_a_lying_device_fails_each_lying_client_with_its_name_and_reason_and_the_honest_one_trains(
    tmp_path: Path,
) -> None:
    model = get_model("fjord-cnn")
    device = Device("liar", "local", workdir=str(tmp_path / "device"), python=PY)
    lies = {
        "c1": ({"params": "nan"}, "parameters hold 1 values that are NaN or Inf"),
        "c2": ({"params": "inf"}, "parameters hold 1 values that are NaN or Inf (the first at 0)"),
        "c3": ({"params": "float64"}, "dtype float64, expected float32"),
        "c4": ({"params": "short"}, "expected float32"),
        "c5": ({"params": "matrix"}, "expected float32"),
        "c6": ({"patch": {"step_seconds": [-0.01]}}, "'step_seconds[0]': expected seconds (a number >= 0)"),
        "c7": ({"patch": {"examples": -20}}, "'examples': expected a count (an integer >= 0)"),
        "c8": ({"patch": {"payload": "__import__('os').system('true')"}}, "unknown keys 'payload'"),
        "c9": ({"raw": '{"status": "ok", "loss": [NaN]}'}, "holds the non-finite number NaN"),
        "c10": ({"raw": "[]"}, "not an object"),
    }
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"replies": {cid: lie for cid, (lie, _) in lies.items()}}))
    clients = ["c0", *lies]
    executor = DevicesExecutor(
        model, dict.fromkeys(clients, device), artifacts_dir=tmp_path / "a", work_dir=tmp_path / "w", batch=20,
        connect=lambda d: LyingDevice(connect(d), plan), warm_up=False,
    )  # fmt: skip
    sub = model.static(0.25)
    params = model.extract(_global("fjord-cnn"), sub)
    instructions = {cid: TrainIns(cid, sub, params, {"lr": 0.1}) for cid in clients}
    try:
        results, failures = executor.run(instructions, {cid: _shard(20, 0) for cid in clients})
    finally:
        executor.close()
    # the honest reply is taken: the lying runner sends the parameters back as they came
    assert [r.cid for r in results] == ["c0"] and results[0].num_examples == 20
    assert all(np.array_equal(results[0].parameters[k], params[k]) for k in params)
    assert sorted(f.cid for f in failures) == sorted(lies)
    for failure in failures:
        assert failure.reason == "error" and failure.message.startswith("device liar: "), failure
        assert lies[failure.cid][1] in failure.message and "\n" not in failure.message, failure
