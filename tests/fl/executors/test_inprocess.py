from __future__ import annotations

import numpy as np
import pytest
import torch

from exporters.userinput import InputError
from exporters.zoo import get_model
from fl.client import module_params, run_local
from fl.executors import EXECUTORS, make_executor
from fl.executors.inprocess import InProcessExecutor
from fl.records import TrainIns

MODEL = get_model("fjord-cnn")


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def instructions(cids, width=0.5):
    torch.manual_seed(0)
    global_state = module_params(MODEL.build())
    sub = MODEL.static(width)
    params = MODEL.extract(global_state, sub)
    return {
        cid: TrainIns(cid, sub, params, {"epochs": 1, "batch_size": 8, "lr": 0.1, "seed": i})
        for i, cid in enumerate(cids)
    }


def shards(cids, n=16):
    rng = np.random.default_rng(1)
    return {
        cid: (rng.normal(size=(n, 1, 28, 28)).astype(np.float32), rng.integers(0, 10, size=n).astype(np.int64))
        for cid in cids
    }


def test_sequential_runs_every_client_as_run_local_would():
    ins, data = instructions(["c0", "c1"]), shards(["c0", "c1"])
    results, failures = InProcessExecutor(MODEL).run(ins, data)
    assert failures == [] and [r.cid for r in results] == ["c0", "c1"]
    for res in results:
        direct = run_local(MODEL, ins[res.cid], *data[res.cid])
        assert res.num_examples == 16 and res.metrics["steps"] == 2
        for name, value in direct.parameters.items():
            assert np.array_equal(res.parameters[name], value)
    # the two clients had different seeds and data, so they trained differently
    assert not np.array_equal(results[0].parameters["fc.weight"], results[1].parameters["fc.weight"])


def test_a_raising_client_is_an_error_failure_and_the_others_finish():
    ins, data = instructions(["c0", "c1", "c2"]), shards(["c0", "c1", "c2"])
    bad = ins["c1"]
    ins["c1"] = TrainIns("c1", bad.submodel, {k: v[:1] for k, v in bad.parameters.items()}, bad.config)
    del data["c2"]
    results, failures = InProcessExecutor(MODEL).run(ins, data)
    assert [r.cid for r in results] == ["c0"]
    assert [(f.cid, f.reason) for f in failures] == [("c1", "error"), ("c2", "error")]
    assert failures[0].message.startswith("RuntimeError: ") and "size mismatch for conv1.weight" in failures[0].message
    assert "KeyError" in failures[1].message


def test_a_client_over_the_timeout_is_a_timeout_failure():
    ticks = iter(float(i) * 5 for i in range(100))
    executor = InProcessExecutor(MODEL, clock=lambda: next(ticks))
    results, failures = executor.run(instructions(["c0"]), shards(["c0"]), timeout_s=1.0)
    assert results == [] and [(f.cid, f.reason, f.seconds) for f in failures] == [("c0", "timeout", 5.0)]


def test_pool_gives_the_same_results_as_sequential():
    cids = ["c0", "c1", "c2"]
    ins, data = instructions(cids), shards(cids)
    bad = ins["c2"]
    ins["c2"] = TrainIns("c2", bad.submodel, {k: v[:1] for k, v in bad.parameters.items()}, bad.config)
    sequential, _ = InProcessExecutor(MODEL).run(ins, data)
    with InProcessExecutor(MODEL, workers=2) as pool:
        pooled, failures = pool.run(ins, data)
    assert [r.cid for r in pooled] == ["c0", "c1"]
    assert [(f.cid, f.reason) for f in failures] == [("c2", "error")]
    for a, b in zip(sequential, pooled, strict=True):
        for name in a.parameters:
            assert np.array_equal(a.parameters[name], b.parameters[name]), name


def test_registry():
    assert "inprocess" in EXECUTORS
    executor = make_executor("inprocess", MODEL, workers=0)
    assert isinstance(executor, InProcessExecutor)
    executor.close()
    executor.close()  # idempotent
    with pytest.raises(InputError, match="pigeon"):
        make_executor("pigeon", MODEL)


def test_leaving_with_stops_the_worker_processes_even_after_an_error():
    from devices import processes

    ins, data = instructions(["c0", "c1"]), shards(["c0", "c1"])
    with pytest.raises(RuntimeError, match="midway"):
        with InProcessExecutor(MODEL, workers=2) as executor:
            results, _ = executor.run(ins, data)
            assert len(results) == 2
            assert executor._pool is not None
            workers = [processes.record("worker", pid) for pid in executor._pool._processes]  # noqa: SLF001
            assert workers and all(processes.running(w) for w in workers)
            raise RuntimeError("the run failed midway")
    assert executor._pool is None
    assert not any(processes.running(w) for w in workers)
    executor.close()  # idempotent
