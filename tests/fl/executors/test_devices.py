"""The devices executor: real runner, real ORT training, over a local and an unreachable device."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from devices.connect import connect
from devices.fleet import Device, Emulation
from devices.sshd import free_port
from exporters.zoo import get_model
from fl.executors.devices import (
    DevicesExecutor,
    cut_prefix,
    modelled_transfer_seconds,
    ordered_width_for_round,
    write_prefix,
)
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


def test_an_unknown_local_trainer_is_a_failure_not_a_crash(tmp_path: Path) -> None:
    model = get_model("fjord-cnn")
    device = Device("loc", "local", workdir=str(tmp_path / "device"), python=PY)
    executor = DevicesExecutor(
        model, {"c0": device}, artifacts_dir=tmp_path / "a", work_dir=tmp_path / "w", batch=20, connect=connect
    )
    sub = model.static(0.25)
    ins = TrainIns("c0", sub, model.extract(_global("fjord-cnn"), sub), {"trainer": "syncdrop"})
    results, failures = executor.run({"c0": ins}, {"c0": _shard(20, 0)})
    assert results == [] and isinstance(failures[0], ClientFailure) and "syncdrop" in failures[0].message


def test_prefix_cut_and_write_back_on_an_lstm() -> None:
    model = get_model("fjord-rnn")  # LSTM gate blocks: positions depend on the outer width
    g = _global("fjord-rnn")
    outer, inner = model.arch(0.6), model.arch(0.2)
    outer_params = model.extract(g, model.static(0.6))
    cut = cut_prefix(model, outer, outer_params, inner)
    direct = model.extract(g, model.static(0.2))
    assert all(np.array_equal(cut[k], direct[k]) for k in direct)
    bumped = {k: v + 1.0 for k, v in cut.items()}
    merged = write_prefix(model, outer, outer_params, inner, bumped)
    assert all(np.array_equal(cut_prefix(model, outer, merged, inner)[k], bumped[k]) for k in bumped)
    changed = sum(int((merged[k] != outer_params[k]).sum()) for k in merged)
    assert changed == sum(v.size for v in bumped.values())


def test_ordered_width_is_drawn_only_up_to_p_max() -> None:
    widths = (0.2, 0.4, 0.6, 0.8, 1.0)
    drawn = {ordered_width_for_round(widths, 0.6, seed) for seed in range(200)}
    assert drawn == {0.2, 0.4, 0.6}


def test_modelled_transfer_time() -> None:
    assert modelled_transfer_seconds(1_000_000, 8000, 20.0) == pytest.approx(1.0 + 0.02)
    assert modelled_transfer_seconds(10, None, 5.0) is None
