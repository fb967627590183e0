"""The ray executor (fl/executors/ray.py) on a real Ray instance.

The first test runs ``fleetbench fl run --executor ray`` in this process, before anything
else connects to Ray: the command starts its own local instance and must leave no process
behind. Then one Ray instance serves the rest of the module (started by this process, two
CPUs, its processes marked in their environment), and the executors under test use this
process's connection to it. The tests of `TestOneExecutor` share one executor (the default
workers: two actors, one per CPU), which is closed when they finish, freeing the CPUs for the
executors the other tests build. The last test runs the command in a subprocess that joins the
instance, which must keep running.
Ray is imported unconditionally: without the ``scale`` extra the module fails, it is never
skipped.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
import warnings
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import ray

from devices import processes
from exporters.userinput import InputError
from exporters.zoo import get_model
from fl.client import run_local
from fl.executors import EXECUTORS, make_executor
from fl.executors.ray import CALLS_PER_ACTOR, IN_FLIGHT, RAY_MISSING, RayExecutor, require_ray
from fl.records import TrainIns
from fl.runlog import RunLog
from fl.server import RunConfig, run_fl
from fleetbench.cli import main
from harness.store import ProfileStore
from tests.fl.executors.test_inprocess import instructions, shards

MODEL = get_model("fjord-cnn")
TOKEN_ENV = "FLEETBENCH_TEST_RAY_TOKEN"
REPO = Path(__file__).resolve().parents[3]

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _fl_run(tmp_path: Path) -> list[str]:
    """The arguments of a one-round ``fleetbench fl run`` of four clients on one Ray worker, its summary as JSON."""
    argv = ["fl", "run", "--executor", "ray", "--workers", "1", "--dataset", "digits", "--clients", "4"]
    return [*argv, "--rounds", "1", "--batch", "16", "--db", str(tmp_path / "fl.db"), "--json"]


def test_a_local_instance_is_stopped_with_every_process_it_started(tmp_path, monkeypatch, capsys):
    assert not ray.is_initialized(), "runs first: with a connection, the command would use it"
    token = uuid.uuid4().hex
    monkeypatch.setenv(TOKEN_ENV, token)  # inherited by every process the command starts
    monkeypatch.setenv("RAY_USAGE_STATS_ENABLED", "0")
    rc = main(_fl_run(tmp_path))
    assert rc == 0, capsys.readouterr().err
    summary = json.loads(capsys.readouterr().out)
    assert summary["status"] == "finished" and summary["history"][0]["clients_ok"] == 4
    assert not ray.is_initialized()
    assert processes.marked(TOKEN_ENV, token) == []  # gcs, raylet, workers: all gone when the command returned


@pytest.fixture(scope="module")
def cluster() -> Iterator[tuple[str, str]]:
    """A Ray instance with 2 CPUs started by this process, its processes marked with a token; its address.

    Its files live in a private directory: Ray records an instance's address in its temp directory,
    where any later ``ray.init()`` on this machine (Flower's, another test's) would find it.
    """
    token = uuid.uuid4().hex
    temp = tempfile.mkdtemp(prefix="fbray")  # short: Ray's socket paths must stay under 108 bytes
    try:
        with pytest.MonkeyPatch.context() as env, warnings.catch_warnings():
            env.setenv(TOKEN_ENV, token)  # inherited by every process of the instance
            env.setenv("RAY_USAGE_STATS_ENABLED", "0")
            warnings.simplefilter("ignore", FutureWarning)  # Ray's tip about accelerator variables
            context = ray.init(
                address="local", num_cpus=2, include_dashboard=False, _node_ip_address="127.0.0.1",
                _temp_dir=temp, configure_logging=False, log_to_driver=False,
            )  # fmt: skip
        yield context.address_info["gcs_address"], token
    finally:
        ray.shutdown()
        left = processes.stop([], also=lambda: processes.marked(TOKEN_ENV, token))
        shutil.rmtree(temp, ignore_errors=True)
        assert left == [], f"Ray processes still running: {left}"


def test_registry_builds_the_ray_executor_on_the_connection(cluster):
    assert EXECUTORS["ray"] == "fl.executors.ray:RayExecutor"
    with make_executor("ray", MODEL, workers=1) as ex:
        assert isinstance(ex, RayExecutor) and len(ex.worker_pids()) == 1
    assert ray.is_initialized()  # an executor that found a connection leaves it open


def _kill(pid: int) -> None:
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while not processes.exited(pid, None) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert processes.exited(pid, None)


class KillingExecutor:
    """Delegates to a RayExecutor and kills one of its workers before the second round."""

    def __init__(self, inner: RayExecutor) -> None:
        self.inner = inner
        self.rounds = 0

    def run(self, instructions, shards, timeout_s=None):
        self.rounds += 1
        if self.rounds == 2:
            _kill(self.inner.worker_pids()[1])
        return self.inner.run(instructions, shards, timeout_s)

    def close(self) -> None:
        self.inner.close()


def _final_global(db: str, run_id: int) -> dict[str, np.ndarray]:
    with ProfileStore(db) as store:
        checkpoint = RunLog(store).load_checkpoint(run_id)
    assert checkpoint is not None
    return dict(checkpoint[1]["strategy"]["global"])


@pytest.fixture(scope="class")
def executor(cluster) -> Iterator[RayExecutor]:
    """An executor with the default workers, for the tests of one class; closed after them, freeing the CPUs."""
    with RayExecutor(MODEL) as ex:
        yield ex


class TestOneExecutor:
    """Tests that share one executor: a test that kills or replaces a worker leaves two working ones."""

    def test_workers_default_to_one_per_cpu_and_live_in_other_processes(self, executor):
        pids = executor.worker_pids()
        assert len(set(pids)) == 2 and os.getpid() not in pids  # the instance's two CPUs
        with pytest.raises(InputError, match="--workers 3: the Ray cluster has 2 CPU"):
            RayExecutor(MODEL, workers=3)

    def test_results_equal_run_local_and_each_payload_is_put_once(self, executor):
        cids = [f"c{i}" for i in range(5)]
        ins, data = instructions(cids), shards(cids)
        results, failures = executor.run(ins, data)
        assert failures == [] and [r.cid for r in results] == cids
        for res in results:
            direct = run_local(MODEL, ins[res.cid], *data[res.cid])
            assert all(np.array_equal(res.parameters[k], v) for k, v in direct.parameters.items())
        # every client got an equal copy of one sub-model: one put for the round
        assert executor.last_round == {"payloads": 1, "clients": 5, "calls": 5}
        # a client given other parameters gets its own payload, exactly as sent
        other = ins["c4"]
        changed = {k: v + 1.0 for k, v in other.parameters.items()}
        ins["c4"] = TrainIns("c4", other.submodel, changed, other.config)
        results, _ = executor.run(ins, data)
        assert executor.last_round["payloads"] == 2
        direct = run_local(MODEL, ins["c4"], *data["c4"])
        assert all(np.array_equal(results[4].parameters[k], v) for k, v in direct.parameters.items())

    def test_a_failing_client_is_an_error_and_the_others_finish(self, executor):
        cids = ["c0", "c1", "c2"]
        ins, data = instructions(cids), shards(cids)
        ins["c1"] = dataclasses.replace(ins["c1"], config={**ins["c1"].config, "trainer": "no-such-trainer"})
        del data["c2"]
        results, failures = executor.run(ins, data)
        assert [r.cid for r in results] == ["c0"]
        assert [(f.cid, f.reason) for f in failures] == [("c1", "error"), ("c2", "error")]
        assert failures[0].message.startswith("KeyError:") and "no-such-trainer" in failures[0].message

    def test_a_large_round_goes_in_batches_whose_clients_succeed_and_fail_alone(self, executor):
        cids = [f"c{i}" for i in range(10 * CALLS_PER_ACTOR)]  # 2 actors: batches of 5
        ins, data = instructions(cids), shards(cids)
        ins["c7"] = dataclasses.replace(ins["c7"], config={**ins["c7"].config, "trainer": "no-such-trainer"})
        results, failures = executor.run(ins, data)
        assert executor.last_round["calls"] == 2 * CALLS_PER_ACTOR
        assert [(f.cid, f.reason) for f in failures] == [("c7", "error")]
        assert failures[0].message.startswith("KeyError:") and "no-such-trainer" in failures[0].message
        assert [r.cid for r in results] == [c for c in cids if c != "c7"]
        for res in results:
            direct = run_local(MODEL, ins[res.cid], *data[res.cid])
            assert all(np.array_equal(res.parameters[k], v) for k, v in direct.parameters.items())
        executor.run(ins, data, timeout_s=60.0)  # with a timeout, one client per call
        assert executor.last_round["calls"] == len(cids)

    def test_a_call_past_the_timeout_fails_and_its_worker_is_replaced(self, executor):
        ins = instructions(["c0"])
        ins["c0"] = dataclasses.replace(ins["c0"], config={**ins["c0"].config, "epochs": 50, "batch_size": 4})
        before = executor.worker_pids()
        start = time.perf_counter()
        results, failures = executor.run(ins, shards(["c0"], n=200), timeout_s=0.5)
        assert time.perf_counter() - start < 20  # did not wait for 2500 steps
        assert results == [] and [(f.cid, f.reason) for f in failures] == [("c0", "timeout")]
        assert "no result within 0.5 s" in failures[0].message
        after = executor.worker_pids()
        assert len(set(before) ^ set(after)) == 2  # one worker replaced
        results, failures = executor.run(instructions(["c1"]), shards(["c1"]))
        assert failures == [] and len(results) == 1

    def test_a_killed_worker_fails_the_batches_it_held_and_is_replaced(self, executor):
        cids = [f"c{i}" for i in range(10 * CALLS_PER_ACTOR)]  # 2 actors: batches of 5
        ins, data = instructions(cids), shards(cids)
        victim = executor.worker_pids()[0]
        _kill(victim)
        results, failures = executor.run(ins, data)
        # the batches the dead worker held when it was found dead: at most its queue, never a whole round
        assert 1 <= len(failures) <= IN_FLIGHT * 5 and len(failures) % 5 == 0
        assert {f.reason for f in failures} == {"unreachable"}
        assert all(f.message.startswith("Ray worker died") for f in failures)
        assert sorted([r.cid for r in results] + [f.cid for f in failures]) == sorted(cids)
        assert victim not in executor.worker_pids()
        results, failures = executor.run(ins, data)
        assert failures == [] and len(results) == len(cids)

    @pytest.mark.parametrize(("strategy", "capacities"), [("fedavg", "1"), ("fedrolex", "uniform:1,0.5,0.25")])
    def test_a_run_gives_the_inprocess_parameters_bit_for_bit(self, executor, tmp_path, strategy, capacities):
        base = RunConfig(
            strategy=strategy, dataset="digits", clients=6, rounds=2, batch_size=16, lr=0.1, capacities=capacities,
            fraction=0.5, seed=4,
        )  # fmt: skip
        local = run_fl(dataclasses.replace(base, db=str(tmp_path / "a.db")), progress=None)
        ray_config = dataclasses.replace(base, db=str(tmp_path / "b.db"), executor="ray")
        on_ray = run_fl(ray_config, executor=executor, progress=None)
        assert on_ray.accuracy == local.accuracy
        a, b = _final_global(str(tmp_path / "a.db"), local.run_id), _final_global(str(tmp_path / "b.db"), on_ray.run_id)
        assert list(a) == list(b) and all(np.array_equal(a[k], b[k]) for k in a)

    def test_a_run_goes_on_after_a_worker_dies(self, executor, tmp_path):
        cfg = RunConfig(dataset="digits", clients=6, rounds=3, batch_size=16, lr=0.1, db=str(tmp_path / "fl.db"))
        summary = run_fl(cfg, executor=KillingExecutor(executor), progress=None)  # type: ignore[arg-type]
        assert summary.status == "finished" and summary.rounds == 3
        first, second, third = summary.history
        assert first.clients_failed == 0 and third.clients_failed == 0
        assert second.clients_failed >= 1 and second.clients_ok >= 1
        assert {f.reason for f in second.failures} == {"unreachable"}
        with ProfileStore(cfg.db) as store:
            rows = RunLog(store).client_rounds(summary.run_id)
        logged = rows[(rows["round"] == 1) & (rows["status"] != "ok")]
        assert set(logged["status"]) == {"unreachable"}
        assert all("Ray worker died" in m for m in logged["message"])


def test_ray_missing_is_one_line_naming_the_extra(monkeypatch, tmp_path, capsys):
    monkeypatch.setitem(sys.modules, "ray", None)
    with pytest.raises(InputError, match="fleetbench\\[scale\\]"):
        require_ray()
    db = tmp_path / "fl.db"
    rc = main(["fl", "run", "--executor", "ray", "--dataset", "digits", "--clients", "2", "--db", str(db)])
    err = capsys.readouterr().err
    assert rc == 2 and err.strip().splitlines() == [f"fleetbench: error: {RAY_MISSING}"]
    assert not db.exists()


def _cmdline(pid: int) -> str:
    """The command line of ``pid``; empty when it has ended."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_text(errors="replace")
    except OSError:
        return ""


def test_joining_a_cluster_leaves_it_running(tmp_path, cluster):
    address, cluster_token = cluster
    # the head's pids, read before the run: a worker of the cluster may end (and leave /proc) meanwhile
    head = {pid for pid in processes.marked(TOKEN_ENV, cluster_token) if "gcs_server" in _cmdline(pid)}
    argv = [sys.executable, "-m", "fleetbench", *_fl_run(tmp_path), "--ray-address", address]
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300, cwd=REPO)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["history"][0]["clients_ok"] == 4
    still = set(processes.marked(TOKEN_ENV, cluster_token))
    assert head and head <= still  # the cluster's head still runs
    assert ray.is_initialized() and ray.cluster_resources().get("CPU") == 2.0
