from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from exporters.flops import count
from exporters.userinput import InputError
from exporters.zoo import ZooModel, get_model
from fl import server
from fl.client import TRAINERS, evaluate
from fl.executors.inprocess import InProcessExecutor
from fl.maths.aggregate import selective_average
from fl.population import Population, VirtualClock, draw_population
from fl.records import ClientFailure, ClientSpec, Params, TrainIns, TrainRes
from fl.runlog import RunLog
from fl.server import (
    RunConfig,
    clients_per_round,
    format_round,
    initial_parameters,
    profiles_for,
    run_clock_only,
    run_fl,
    sample_clients,
)
from fl.strategies import STRATEGIES
from fl.strategies.base import Strategy
from harness.store import ProfileStore

# -- test-local strategy and data -------------------------------------------------------------


class StaticAvg(Strategy):
    """Each client trains the prefix sub-model at its capacity; per-weight weighted average."""

    name = "test-static"

    def __init__(
        self,
        model: ZooModel,
        initial: Params,
        seed: int = 0,
        local=None,
        *,
        fail: str = "",
        slow: str = "",
        lie: dict[str, str] | None = None,
    ) -> None:
        super().__init__(model, initial, seed, local)
        self.fail = fail
        self.lie = dict(lie or {})  # cid -> a trainer that returns a result the model must not take
        self.stragglers = [slow] if slow else []  # as FLuID names its stragglers
        self.aggregated: list[tuple[int, list[str], list[str]]] = []
        self.seen: list[dict[str, tuple[float, ...]]] = []  # per round: cid -> the times it was given

    def configure_round(self, rnd, clients, profiles=None):
        out = {}
        for client in clients:
            sub = self.model.static(client.capacity)
            extra = {"trainer": "test-boom"} if client.cid == self.fail else {}
            if client.cid in self.lie:
                extra = {"trainer": self.lie[client.cid]}
            config = self.client_config(rnd, client.cid, width=client.capacity, **extra)
            out[client.cid] = TrainIns(client.cid, sub, self.model.extract(self.global_state, sub), config)
        return out

    def aggregate_round(self, rnd, results: Sequence[TrainRes], failures: Sequence[ClientFailure]):
        self.aggregated.append((rnd, [r.cid for r in results], [f.cid for f in failures]))
        seen = {r.cid: (r.download_seconds, r.compute_seconds, r.upload_seconds) for r in results}
        self.seen.append({**seen, **{f.cid: (f.seconds,) for f in failures}})
        updates = [(r.submodel, r.parameters, float(r.num_examples)) for r in results]
        self.global_state = selective_average(self.model, self.global_state, updates)
        return self.global_state, {"aggregated": float(len(results))}


def boom_trainer(model, ins, x, y):
    raise RuntimeError("client exploded")


def nan_trainer(model, ins, x, y):
    params = {k: v.copy() for k, v in ins.parameters.items()}
    params["conv1.weight"].flat[0] = np.nan
    return params, {"loss": 1.0}


def reshaped_trainer(model, ins, x, y):
    params = {k: v.copy() for k, v in ins.parameters.items()}
    params["conv1.bias"] = params["conv1.bias"][:-1]
    return params, {"loss": 1.0}


def blob_data(num_clients: int, per_client: int, seed: int = 0, num_test: int = 100):
    """Class k lights a 6x6 block at position k of a 28x28 image (plus noise): easy to learn."""

    def make(n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        y = rng.integers(0, 10, size=n)
        x = rng.normal(0.0, 0.1, size=(n, 1, 28, 28)).astype(np.float32)
        for i, label in enumerate(y):
            row, col = divmod(int(label), 4)
            x[i, 0, 2 + 6 * row : 8 + 6 * row, 2 + 6 * col : 8 + 6 * col] += 1.0
        return x, y.astype(np.int64)

    rng = np.random.default_rng(seed)
    train = tuple(make(per_client + i, rng) for i in range(num_clients))
    return Data(train=train, test=make(num_test, rng))


@dataclasses.dataclass(frozen=True)
class Data:
    train: tuple[tuple[np.ndarray, np.ndarray], ...]
    test: tuple[np.ndarray, np.ndarray]


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture
def registered(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(STRATEGIES, "test-static", "tests.fl.test_server:StaticAvg")
    monkeypatch.setitem(TRAINERS, "test-boom", "tests.fl.test_server:boom_trainer")
    monkeypatch.setitem(TRAINERS, "test-nan", "tests.fl.test_server:nan_trainer")
    monkeypatch.setitem(TRAINERS, "test-reshaped", "tests.fl.test_server:reshaped_trainer")


def config(tmp_path: Path, **changes) -> RunConfig:
    base = RunConfig(
        strategy="test-static",
        model="fjord-cnn",
        dataset="test-blobs",
        clients=4,
        rounds=3,
        seed=3,
        epochs=2,
        batch_size=10,
        lr=0.2,
        db=str(tmp_path / "fl.db"),
    )
    return dataclasses.replace(base, **changes)


CAPACITIES = (1.0, 1.0, 0.5, 0.5)


# -- sampling ----------------------------------------------------------------------------------


def test_clients_per_round_follows_fraction_and_count():
    assert clients_per_round(10, 0.3, None) == 3
    assert clients_per_round(10, 1.0, None) == 10
    assert clients_per_round(10, 0.05, None) == 1  # never fewer than one
    assert clients_per_round(7, 0.5, None) == 3  # floor(3.5)
    assert clients_per_round(10, 0.3, 4) == 4  # the count wins over the fraction


def test_sampling_is_deterministic_per_seed_and_round():
    clients = [ClientSpec(f"c{i}", 10) for i in range(20)]
    first = [c.cid for c in sample_clients(clients, 5, seed=1, fraction=0.25)]
    assert first == [c.cid for c in sample_clients(clients, 5, seed=1, fraction=0.25)]
    assert len(first) == 5 and len(set(first)) == 5
    # the draw is numpy's default_rng((seed, round)) choice without replacement, in client order
    expected = sorted(int(i) for i in np.random.default_rng((1, 5)).choice(20, size=5, replace=False))
    assert first == [f"c{i}" for i in expected]
    rounds = {tuple(c.cid for c in sample_clients(clients, r, seed=1, fraction=0.25)) for r in range(6)}
    assert len(rounds) > 1  # rounds draw differently
    other_seed = [c.cid for c in sample_clients(clients, 5, seed=2, fraction=0.25)]
    assert other_seed != first
    assert len(sample_clients(clients, 0, seed=1, per_round=7)) == 7


# -- config ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("change", "word"),
    [
        ({"strategy": "nope"}, "nope"),
        ({"clients": 0}, "clients"),
        ({"fraction": 1.5}, "1.5"),
        ({"per_round": 11}, "11"),
        ({"lr": -1.0}, "-1.0"),
        ({"executor": "carrier-pigeon"}, "carrier-pigeon"),
        ({"optimizer": "adagrad"}, "adagrad"),
    ],
)
def test_bad_config_names_the_value(tmp_path, change, word):
    with pytest.raises(InputError, match=word):
        dataclasses.replace(RunConfig(db=str(tmp_path / "x.db")), **change).validate()


def test_config_round_trips_through_json(tmp_path):
    cfg = config(tmp_path, options={"rate": 0.5, "mode": "x"}, per_round=2, optimizer="adamw")
    assert RunConfig.from_dict(cfg.to_dict()) == cfg


# -- a run -------------------------------------------------------------------------------------


def test_run_logs_what_happened(tmp_path, registered):
    data = blob_data(4, 30)
    lines: list[str] = []
    cfg = config(tmp_path, per_round=3)
    summary = run_fl(cfg, data=data, capacities=CAPACITIES, progress=lines.append)
    assert summary.rounds == 3 and len(summary.history) == 3 and len(lines) == 3
    assert lines[0].startswith("round 1/3: clients ok 3 failed 0")
    with ProfileStore(cfg.db) as store:
        log = RunLog(store)
        runs = log.runs()
        assert list(runs["id"]) == [summary.run_id]
        assert runs.iloc[0]["status"] == "finished" and runs.iloc[0]["rounds_done"] == 3
        run = log.run(summary.run_id)
        assert run["strategy"] == "test-static" and run["seed"] == 3 and run["config"]["per_round"] == 2 + 1
        assert "python" in run["versions"]
        clients = log.clients(summary.run_id)
        assert list(clients["cid"]) == ["c0", "c1", "c2", "c3"]
        assert list(clients["capacity"]) == list(CAPACITIES)
        assert list(clients["tier"]) == [0, 0, 1, 1]
        assert list(clients["num_examples"]) == [30, 31, 32, 33]
        for cid, counts, (_, y) in zip(clients["cid"], clients["label_counts"], data.train, strict=True):
            assert counts == {int(k): int(v) for k, v in zip(*np.unique(y, return_counts=True), strict=True)}, cid
        rows = log.client_rounds(summary.run_id)
        specs = [ClientSpec(f"c{i}", 30 + i, cap) for i, cap in enumerate(CAPACITIES)]
        model = get_model("fjord-cnn")
        for rnd in range(3):
            logged = rows[rows["round"] == rnd]
            expected = [c.cid for c in sample_clients(specs, rnd, seed=3, per_round=3)]
            assert list(logged["cid"]) == expected
            assert set(logged["status"]) == {"ok"}
            assert list(logged["width"]) == [CAPACITIES[int(c[1:])] for c in expected]
            assert list(logged["num_examples"]) == [30 + int(c[1:]) for c in expected]
            # fjord-cnn groups (conv1 20, conv2 15) at width 0.5 keep ceil(10), ceil(7.5) = 10, 8
            arch_sizes = {1.0: (20, 15), 0.5: (10, 8)}
            assert list(logged["arch_sizes"]) == [arch_sizes[CAPACITIES[int(c[1:])]] for c in expected]
            # training FLOPs: the exporters' count per example at the client's width x examples x 2 epochs
            per_example = {w: count(model, model.arch(w)).train_flops for w in (1.0, 0.5)}
            train_flops = [per_example[CAPACITIES[int(c[1:])]] * (30 + int(c[1:])) * 2 for c in expected]
            assert list(logged["train_flops"]) == pytest.approx(train_flops)
            assert (logged["compute_seconds"] > 0).all()
        rounds = log.rounds(summary.run_id)
        assert list(rounds["round"]) == [0, 1, 2]
        assert [m["clients_ok"] for m in rounds["metrics"]] == [3, 3, 3]
        assert [m["aggregated"] for m in rounds["metrics"]] == [3.0, 3.0, 3.0]
        last, state = log.load_checkpoint(summary.run_id)
    assert last == 2
    # the checkpointed global model, evaluated independently, has the logged and returned accuracy
    model = get_model("fjord-cnn")
    for width in (1.0, 0.5):
        sub = model.static(width)
        acc = evaluate(model, sub.arch, model.extract(state["strategy"]["global"], sub), *data.test)["accuracy"]
        assert summary.accuracy[width] == acc
        assert rounds.iloc[2]["evaluation"][str(width)]["accuracy"] == acc
    # the blobs are easy: the full model is well above chance (10 %) after 3 rounds
    assert summary.accuracy[1.0] > 0.5


def test_a_failing_client_does_not_stop_the_round(tmp_path, registered):
    cfg = config(tmp_path, rounds=1, options={"fail": "c1"})
    lines: list[str] = []
    summary = run_fl(cfg, data=blob_data(4, 20), capacities=CAPACITIES, progress=lines.append)
    assert summary.history[0].clients_ok == 3 and summary.history[0].clients_failed == 1
    assert "failed 1" in lines[0]
    with ProfileStore(cfg.db) as store:
        rows = RunLog(store).client_rounds(summary.run_id)
    failed = rows[rows["cid"] == "c1"].iloc[0]
    assert failed["status"] == "error" and "client exploded" in failed["message"]
    assert np.isnan(failed["loss"]) and np.isnan(failed["compute_seconds"])
    assert set(rows[rows["cid"] != "c1"]["status"]) == {"ok"}


def test_the_strategys_stragglers_are_flagged_in_the_log(tmp_path, registered):
    cfg = config(tmp_path, rounds=1, options={"slow": "c3"})
    summary = run_fl(cfg, data=blob_data(4, 10), capacities=CAPACITIES, progress=None)
    with ProfileStore(cfg.db) as store:
        rows = RunLog(store).client_rounds(summary.run_id)
    assert dict(zip(rows["cid"], rows["straggler"], strict=True)) == {"c0": False, "c1": False, "c2": False, "c3": True}


def test_failed_clients_are_left_out_of_aggregation(tmp_path, registered, monkeypatch):
    seen: list[tuple[int, list[str], list[str]]] = []
    original = StaticAvg.aggregate_round

    def spy(self, rnd, results, failures):
        out = original(self, rnd, results, failures)
        seen.extend(self.aggregated[-1:])
        return out

    monkeypatch.setattr(StaticAvg, "aggregate_round", spy)
    cfg = config(tmp_path, rounds=1, options={"fail": "c2"})
    run_fl(cfg, data=blob_data(4, 20), capacities=CAPACITIES, progress=None)
    assert seen == [(0, ["c0", "c1", "c3"], ["c2"])]


def test_a_non_finite_or_misshapen_result_fails_its_client_and_never_reaches_the_global_model(
    tmp_path, registered, monkeypatch
):
    seen: list[tuple[int, list[str], list[str]]] = []
    original = StaticAvg.aggregate_round

    def spy(self, rnd, results, failures):
        assert all(np.isfinite(v).all() for r in results for v in r.parameters.values())
        out = original(self, rnd, results, failures)
        seen.extend(self.aggregated[-1:])
        return out

    monkeypatch.setattr(StaticAvg, "aggregate_round", spy)
    cfg = config(tmp_path, rounds=1, options={"lie": {"c1": "test-nan", "c2": "test-reshaped"}})
    summary = run_fl(cfg, data=blob_data(4, 20), capacities=CAPACITIES, progress=None)
    assert seen == [(0, ["c0", "c3"], ["c1", "c2"])]  # the honest clients are aggregated
    assert summary.history[0].clients_ok == 2 and summary.history[0].clients_failed == 2
    with ProfileStore(cfg.db) as store:
        log = RunLog(store)
        rows = log.client_rounds(summary.run_id)
        _, state = log.load_checkpoint(summary.run_id)
    assert all(np.isfinite(v).all() for v in state["strategy"]["global"].values())
    logged = {row.cid: (row.status, row.message) for row in rows.itertuples()}
    assert logged["c1"] == ("error", "result refused: parameter 'conv1.weight' holds NaN or Inf")
    assert logged["c2"][0] == "error"
    assert logged["c2"][1].startswith("result refused: parameter 'conv1.bias' is float32 (9,), sent as float32 (10,)")
    assert logged["c0"][0] == logged["c3"][0] == "ok"


def test_a_result_is_taken_only_as_sent_finite_and_counted():
    model = get_model("fjord-cnn")
    sub = model.static(0.5)
    sent = model.extract(initial_parameters(model, 0), sub)
    ins = TrainIns("c0", sub, sent)

    def res(**changes) -> TrainRes:
        return dataclasses.replace(TrainRes("c0", sub, {k: v.copy() for k, v in sent.items()}, 10), **changes)

    assert server.invalid_result(ins, res()) is None
    first = next(iter(sent))
    cases = {
        "not as sent": res(parameters={k: v for k, v in sent.items() if k != first}),
        "holds NaN or Inf": res(parameters={**sent, first: np.full_like(sent[first], np.inf)}),
        "is int64": res(parameters={**sent, first: sent[first].astype(np.int64)}),
        "is not a count": res(num_examples=-1),
        "are not all >= 0": res(compute_seconds=float("nan")),
    }
    for why, bad in cases.items():
        assert why in (server.invalid_result(ins, bad) or ""), why
    kept, failures = server.refuse_invalid_results({"c0": ins}, [cases["is not a count"]], [])
    assert kept == [] and [(f.cid, f.reason) for f in failures] == [("c0", "error")]
    assert failures[0].message == "result refused: num_examples -1 is not a count"


@pytest.mark.parametrize("strategy", ["test-static", "fjord", "fedrolex", "fd"])
def test_resume_is_bit_exact(tmp_path, registered, strategy):
    data = blob_data(4, 25)
    base = config(tmp_path, strategy=strategy)
    straight = run_fl(
        dataclasses.replace(base, db=str(tmp_path / "a.db")), data=data, capacities=CAPACITIES, progress=None
    )
    cut = dataclasses.replace(base, db=str(tmp_path / "b.db"), rounds=2)
    first = run_fl(cut, data=data, capacities=CAPACITIES, progress=None)
    assert first.rounds == 2
    resumed = run_fl(
        dataclasses.replace(cut, rounds=3), data=data, capacities=CAPACITIES, resume_run=first.run_id, progress=None
    )
    assert resumed.run_id == first.run_id and resumed.rounds == 3
    assert [h.round for h in resumed.history] == [0, 1, 2]
    assert resumed.accuracy == straight.accuracy
    states = []
    for db, run_id in ((tmp_path / "a.db", straight.run_id), (tmp_path / "b.db", resumed.run_id)):
        with ProfileStore(db) as store:
            log = RunLog(store)
            states.append(log.load_checkpoint(run_id))
            assert log.runs().iloc[0]["rounds"] == 3 and log.runs().iloc[0]["status"] == "finished"
            assert log.run(run_id)["config"]["rounds"] == 3
            assert list(log.rounds(run_id)["round"]) == [0, 1, 2]
    (round_a, state_a), (round_b, state_b) = states
    assert round_a == round_b == 2
    global_a, global_b = state_a["strategy"]["global"], state_b["strategy"]["global"]
    assert list(global_a) == list(global_b)
    for name in global_a:
        assert np.array_equal(global_a[name], global_b[name]), name
    # and the training moved the model away from its initial parameters
    initial = initial_parameters(get_model("fjord-cnn"), 3)
    assert not all(np.array_equal(initial[n], global_a[n]) for n in initial)


def test_resume_refuses_a_changed_configuration(tmp_path, registered):
    data = blob_data(4, 20)
    cfg = config(tmp_path, rounds=1)
    first = run_fl(cfg, data=data, capacities=CAPACITIES, progress=None)
    with pytest.raises(InputError, match="lr"):
        run_fl(dataclasses.replace(cfg, rounds=2, lr=0.3), data=data, capacities=CAPACITIES, resume_run=first.run_id)
    with pytest.raises(InputError, match="no FL run 99"):
        run_fl(dataclasses.replace(cfg, rounds=2), data=data, capacities=CAPACITIES, resume_run=99)


def test_resume_of_a_finished_run_runs_nothing(tmp_path, registered):
    data = blob_data(4, 20)
    cfg = config(tmp_path, rounds=1)
    first = run_fl(cfg, data=data, capacities=CAPACITIES, progress=None)
    again = run_fl(cfg, data=data, capacities=CAPACITIES, resume_run=first.run_id, progress=None)
    assert again.rounds == 1 and again.accuracy == first.accuracy


def test_unknown_strategy_option_is_input_error(tmp_path, registered):
    with pytest.raises(InputError, match="colour"):
        run_fl(config(tmp_path, options={"colour": "red"}), data=blob_data(4, 10), capacities=CAPACITIES)


def test_initial_parameters_follow_the_seed():
    model = get_model("fjord-cnn")
    a, b, c = initial_parameters(model, 1), initial_parameters(model, 1), initial_parameters(model, 2)
    assert all(np.array_equal(a[n], b[n]) for n in a)
    assert not all(np.array_equal(a[n], c[n]) for n in a)


def test_profiles_are_empty_without_devices(tmp_path):
    with ProfileStore(tmp_path / "p.db") as store:
        assert profiles_for(store, [ClientSpec("c0", 5)]) == {}


def test_profiles_are_grouped_by_the_clients_devices():
    import pandas as pd

    class FakeStore:
        def latest_cells(self):
            return pd.DataFrame(
                {"device": ["pi4", "pi4", "nano", "other"], "width": [0.5, 1.0, 1.0, 1.0], "median_us": [1, 2, 3, 4]}
            )

    clients = [ClientSpec("c0", 5, device="pi4"), ClientSpec("c1", 5, device="nano"), ClientSpec("c2", 5)]
    profiles = profiles_for(FakeStore(), clients)
    assert sorted(profiles) == ["nano", "pi4"]
    assert [row["width"] for row in profiles["pi4"]] == [0.5, 1.0]
    assert [row["median_us"] for row in profiles["nano"]] == [3]


def test_placement_puts_devices_in_the_log(tmp_path, registered):
    cfg = config(tmp_path, rounds=1)
    placement = {"c0": "pi4", "c2": "nano"}
    summary = run_fl(cfg, data=blob_data(4, 10), capacities=CAPACITIES, placement=placement, progress=None)
    with ProfileStore(cfg.db) as store:
        log = RunLog(store)
        clients, rows = log.clients(summary.run_id), log.client_rounds(summary.run_id)
    assert list(clients["device"].fillna("-")) == ["pi4", "-", "nano", "-"]
    assert list(rows["device"].fillna("-")) == ["pi4", "-", "nano", "-"]


def test_progress_line_names_round_clients_loss_accuracy_seconds():
    from fl.server import RoundSummary

    line = format_round(RoundSummary(1, 4, 1, 0.25, {1.0: 0.9, 0.5: 0.75}, 1.5), 10)
    assert line == "round 2/10: clients ok 4 failed 1, loss 0.2500, accuracy 1:0.9000 0.5:0.7500, 1.50 s"
    virtual = format_round(RoundSummary(1, 4, 0, 0.25, {}, 1.5, virtual_seconds=12.25), 10)
    assert virtual.endswith(", 1.50 s (virtual 12.25 s)")
    energy = RoundSummary(1, 4, 1, 0.25, {}, 1.5, predicted_energy_j=2.0, measured_energy_j=0.75, energy_measured=2)
    assert format_round(energy, 10).endswith(", 1.50 s, energy predicted 2 J, measured 0.75 J on 2 of 5 clients")


# -- the real strategies on non-IID data -------------------------------------------------------


@pytest.mark.parametrize(
    ("strategy", "capacities"),
    [
        ("fedavg", "1"),
        ("heterofl", "uniform:1,0.5"),
        ("fjord", "uniform:1,0.5"),
        ("fedrolex", "uniform:1,0.5"),
        ("fd", "uniform:1,0.5"),
    ],
)
def test_each_strategy_learns_non_iid_digits(tmp_path, strategy, capacities):
    from fl.data import load_federated

    data = load_federated("digits", get_model("fjord-cnn"), 6, "dirichlet:0.5", 0, max_examples=800)
    cfg = RunConfig(
        strategy=strategy,
        dataset="digits",
        clients=6,
        rounds=5,
        capacities=capacities,
        partition="dirichlet:0.5",
        seed=0,
        epochs=2,
        batch_size=16,
        lr=0.1,
        db=str(tmp_path / "fl.db"),
    )
    summary = run_fl(cfg, data=data, progress=None)
    # ten digits: chance is 0.1; the global model at full width is clearly above it
    assert summary.accuracy[1.0] > 0.35, summary.accuracy
    with ProfileStore(cfg.db) as store:
        rows = RunLog(store).client_rounds(summary.run_id)
    assert len(rows) == 5 * 6 and set(rows["status"]) == {"ok"}
    if capacities != "1":
        assert set(rows["tier"]) == {0, 1}


# -- the virtual clock of a population ---------------------------------------------------------


def hand_cost(device, arch, steps, bytes_down, bytes_up):
    """0.2 s fixed, 10 ms a step on 'fast' and 100 ms on 'slow', 0.1 us a byte each way."""
    return 0.2 + {"fast": 0.01, "slow": 0.1}[device] * steps + 1e-7 * (bytes_down + bytes_up)


def hand_times(cfg, devices, factors, capacities, sizes):
    """Each client's virtual round, from the cost above, its sub-model's payload and its steps."""
    model = get_model("fjord-cnn")
    initial = initial_parameters(model, cfg.seed)
    out = {}
    for i, (device, factor, cap, n) in enumerate(zip(devices, factors, capacities, sizes, strict=True)):
        nbytes = 4 * sum(v.size for v in model.extract(initial, model.static(cap)).values())
        steps = cfg.epochs * n / cfg.batch_size  # full-batch steps: the short batch counts its share
        out[f"c{i}"] = factor * hand_cost(device, None, steps, nbytes, nbytes)
    return out


DEVICES, FACTORS = ("fast", "slow", "fast", "slow"), (1.0, 1.0, 2.0, 0.5)


def test_a_population_without_limits_trains_what_the_plain_run_trains(tmp_path, registered):
    cfg, data = config(tmp_path, rounds=2), blob_data(4, 10)
    plain = run_fl(cfg, data=data, capacities=CAPACITIES, progress=None)
    clock = VirtualClock(Population(DEVICES, FACTORS), hand_cost, seed=cfg.seed)
    strategy_seen = []
    real_make = server._make_strategy

    def keep(config, model):
        strategy = real_make(config, model)
        strategy_seen.append(strategy)
        return strategy

    pop_cfg = dataclasses.replace(cfg, db=str(tmp_path / "pop.db"))
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(server, "_make_strategy", keep)
        pop = run_fl(pop_cfg, data=data, capacities=CAPACITIES, virtual=clock, progress=None)
    assert pop.accuracy == plain.accuracy  # the virtual clock only annotates
    times = hand_times(cfg, DEVICES, FACTORS, CAPACITIES, [10, 11, 12, 13])
    assert [h.virtual_seconds for h in pop.history] == [pytest.approx(max(times.values()))] * 2
    assert all(h.virtual_seconds is None for h in plain.history)
    # the strategy saw the virtual times, split into transfers and compute
    (strategy,) = strategy_seen
    for cid, (down, compute, up) in strategy.seen[0].items():
        assert down + compute + up == pytest.approx(times[cid])
    with ProfileStore(pop_cfg.db) as store:
        log = RunLog(store)
        rows, rounds, clients = log.client_rounds(pop.run_id), log.rounds(pop.run_id), log.clients(pop.run_id)
    assert list(rows["device"][:4]) == list(DEVICES)
    assert list(rows["virtual_seconds"][:4]) == pytest.approx([times[c] for c in ("c0", "c1", "c2", "c3")])
    assert all(rows["compute_seconds"] < 5)  # the measured times are logged beside the virtual ones
    assert list(rounds["virtual_seconds"]) == pytest.approx([max(times.values())] * 2)
    assert list(clients["speed_factor"]) == list(FACTORS)


class RecordingExecutor(InProcessExecutor):
    def __init__(self, model):
        super().__init__(model)
        self.asked: list[list[str]] = []

    def run(self, instructions, shards, timeout_s=None):
        self.asked.append(list(instructions))
        return super().run(instructions, shards, timeout_s)


def test_overcommitment_and_the_deadline_keep_the_fastest_and_train_only_them(tmp_path, registered):
    devices, factors = ("fast", "slow", "fast", "slow", "fast", "fast"), (1.0, 1.0, 1.5, 0.5, 3.0, 1.2)
    cfg = config(tmp_path, clients=6, rounds=1, per_round=2)
    sizes = [10 + i for i in range(6)]
    times = hand_times(cfg, devices, factors, [1.0] * 6, sizes)
    clock = VirtualClock(Population(devices, factors), hand_cost, seed=cfg.seed, overcommit=1.0, deadline_s=1.0)
    sampled = [f"c{i}" for i in clock.sample(0, 2)]
    assert len(sampled) == 4
    order = sorted(sampled, key=lambda c: times[c])
    kept = [c for c in order if times[c] <= 1.0][:2]
    executor = RecordingExecutor(get_model("fjord-cnn"))
    summary = run_fl(cfg, data=blob_data(6, 10), capacities=[1.0] * 6, virtual=clock, executor=executor, progress=None)
    assert executor.asked == [sorted(kept, key=sampled.index)]  # only the kept clients trained
    (round0,) = summary.history
    assert round0.clients_ok == len(kept) and round0.clients_failed == 4 - len(kept)
    assert {f.reason for f in round0.failures} == {"timeout"}
    for failure in round0.failures:
        expected = "deadline" if times[failure.cid] > 1.0 else "over-committed"
        assert expected in failure.message
    assert round0.virtual_seconds == pytest.approx(times[kept[-1]] if len(kept) == 2 else 1.0)
    with ProfileStore(cfg.db) as store:
        rows = RunLog(store).client_rounds(summary.run_id)
    assert sorted(rows["cid"]) == sorted(sampled)
    assert dict(zip(rows["cid"], rows["virtual_seconds"], strict=True)) == pytest.approx({c: times[c] for c in sampled})


def test_fluid_picks_its_straggler_from_the_virtual_times(tmp_path):
    # c3 is on the slow device: FLuID makes it the straggler although every client trains on this machine
    cfg = dataclasses.replace(
        config(tmp_path, rounds=2), strategy="fluid", options={"sizes": [0.5, 0.75]}, dataset="digits"
    )
    clock = VirtualClock(Population(("fast", "fast", "fast", "slow"), (1.0,) * 4), hand_cost, seed=cfg.seed)
    summary = run_fl(cfg, data=blob_data(4, 40), capacities=[1.0] * 4, virtual=clock, progress=None)
    assert summary.status == "finished"
    with ProfileStore(cfg.db) as store:
        rows = RunLog(store).client_rounds(summary.run_id)
    second = rows[rows["round"] == 1].set_index("cid")
    assert list(second["straggler"]) == [False, False, False, True]
    assert second.loc["c3", "width"] < 1.0 and set(second.loc[["c0", "c1", "c2"], "width"]) == {1.0}


def test_the_clock_only_schedule_equals_the_trained_runs(tmp_path, registered):
    cfg, data = config(tmp_path, rounds=2, per_round=3), blob_data(4, 10)
    clock = VirtualClock(Population(DEVICES, FACTORS), hand_cost, seed=cfg.seed, deadline_s=2.0)
    trained = run_fl(cfg, data=data, capacities=CAPACITIES, virtual=clock, progress=None)
    only = run_clock_only(
        dataclasses.replace(cfg, db=str(tmp_path / "clock.db")),
        clock,
        examples=[10, 11, 12, 13],
        capacities=CAPACITIES,
        progress=None,
    )
    assert [h.virtual_seconds for h in only.history] == pytest.approx([h.virtual_seconds for h in trained.history])
    assert [(h.clients_ok, h.clients_failed) for h in only.history] == [
        (h.clients_ok, h.clients_failed) for h in trained.history
    ]
    assert only.accuracy == {} and only.status == "finished"
    with ProfileStore(tmp_path / "clock.db") as store:
        log = RunLog(store)
        assert log.run(only.run_id)["executor"] == "clock-only"
        rows = log.client_rounds(only.run_id)
    assert set(rows["status"]) <= {"ok", "timeout"} and rows["loss"].isna().all()


def test_clock_only_schedules_ten_thousand_clients_for_a_hundred_rounds_within_a_minute(tmp_path):
    cfg = RunConfig(
        clients=10_000, rounds=100, per_round=100, db=str(tmp_path / "clock.db"), population="fast=0.5,slow=0.5",
        profiles="unused.db", clock_only=True, client_examples=20, overcommit=0.3, deadline_s=0.5,
    )  # fmt: skip
    clock = VirtualClock(
        draw_population({"fast": 0.5, "slow": 0.5}, 10_000, 0), hand_cost, overcommit=0.3, deadline_s=0.5
    )
    start = time.perf_counter()
    summary = run_clock_only(cfg, clock, progress=None)
    assert time.perf_counter() - start < 60
    assert summary.rounds == 100 and all(h.clients_ok + h.clients_failed == 130 for h in summary.history)
    assert all(h.clients_ok <= 100 and h.virtual_seconds <= 0.5 for h in summary.history)


def test_every_client_round_logs_the_round_cost_model_s_prediction(tmp_path, registered):
    from fl.roundcost import payload_bytes_of
    from fl.scheduling.configs import ProfileConfig
    from harness.latency import fit
    from harness.roundcost import RoundCostModel
    from tests.fl.scheduling.profiles import store_lines

    cfg = config(tmp_path, rounds=3)
    lines = {"pi4": (200.0, 1e-4), "nano": (400.0, 3e-4)}
    campaign = store_lines(cfg.db, lines, batch=10, optimizer="sgd")
    measured = RoundCostModel("pi4", "fjord-cnn", 1.0, 10, "ort", "sgd", 1, 1.25, 0.0, 1e-8, 0.02, 2e-8, 0.03)
    with ProfileStore(cfg.db) as store:
        store.record_round_cost(campaign, measured)
        cells = store.latest_cells()
    warnings: list[str] = []
    placement = {"c0": "pi4", "c1": "pi4", "c2": "nano"}
    wants = {d: ProfileConfig(batch=10, backend="ort", optimizer="sgd", threads=1) for d in lines}
    data = blob_data(4, 10)
    summary = run_fl(
        cfg, data=data, capacities=CAPACITIES, placement=placement, progress=warnings.append, device_configs=wants
    )
    with ProfileStore(cfg.db) as store:
        rows = RunLog(store).client_rounds(summary.run_id)
    models = fit(cells)
    model = get_model("fjord-cnn")
    for row in rows.itertuples():
        client = int(row.cid[1:])
        if row.cid not in placement:
            assert row.predicted_seconds is None or row.predicted_seconds != row.predicted_seconds  # no device
            continue
        device = placement[row.cid]
        arch = model.static(CAPACITIES[client]).arch
        steps = 2 * len(data.train[client][1]) / 10  # 2 epochs of its examples, in batches of 10
        per_image = models[device].latency_model("fjord-cnn", 10, "ort").predict(arch).value
        expected = steps * 10 * per_image
        if device == "pi4":  # measured round cost: fixed cost and both transfers on top
            nbytes = payload_bytes_of(arch)
            expected += 1.25 + 0.02 + nbytes * 1e-8 + 0.03 + nbytes * 2e-8
        metrics = row.metrics
        assert metrics["profile_predicted_seconds"] == pytest.approx(expected, rel=1e-9), row.cid
        # round 1 is calibrated by the device's measured rounds of round 0 (fl.roundcost.CalibratedPredictor)
        earlier = rows[(rows["round"] < row.round) & (rows["device"] == device)]
        ratios = [
            (r.compute_seconds + r.download_seconds + r.upload_seconds) / r.metrics["profile_predicted_seconds"]
            for r in earlier.itertuples()
        ]
        factor = float(np.median(ratios[-3:])) if len(ratios) >= 2 else 1.0
        assert row.predicted_seconds == pytest.approx(expected * factor, rel=1e-9), row.cid
        assert metrics["calibration"] == pytest.approx(factor, rel=1e-9)
    assert any("'nano' has no round-cost measurement" in w for w in warnings)
    # in-process rounds are nothing like the hand-made profile: its factor says it is stale, once
    stale = [w for w in warnings if "profile looks stale" in w]
    assert any(w.startswith("device 'pi4': its last 2 rounds took") for w in stale), warnings
    assert len(stale) == len({w.split("'")[1] for w in stale})


def test_a_run_on_an_old_profile_says_how_old_it_is(tmp_path, registered):
    import sqlite3

    from fl.scheduling.configs import ProfileConfig
    from tests.fl.scheduling.profiles import store_lines

    cfg = config(tmp_path, rounds=1)
    store_lines(cfg.db, {"pi4": (200.0, 1e-4)}, batch=10, optimizer="sgd")
    ten_days_ago = time.time() - 10 * 86400
    with sqlite3.connect(cfg.db) as db:
        db.execute("UPDATE cells SET started_at = ?, finished_at = ?", (ten_days_ago - 1, ten_days_ago))
    warnings: list[str] = []
    run_fl(
        cfg, data=blob_data(4, 10), capacities=CAPACITIES, placement={"c0": "pi4"},
        progress=warnings.append, device_configs={"pi4": ProfileConfig(batch=10, optimizer="sgd")},
    )  # fmt: skip
    assert any(w.startswith("device 'pi4': its profile was measured 10 days ago") for w in warnings), warnings


def test_a_run_on_a_profile_of_an_older_export_says_so(tmp_path, registered):
    import sqlite3

    from fl.scheduling.configs import ProfileConfig
    from tests.fl.scheduling.profiles import store_lines

    def warnings_of_a_run(db: Path, recorded: str | None) -> list[str]:
        cfg = config(tmp_path, rounds=1, db=str(db))
        store_lines(cfg.db, {"pi4": (200.0, 1e-4)}, batch=10, optimizer="sgd")
        if recorded is not None:
            with sqlite3.connect(cfg.db) as store:
                store.execute("UPDATE campaigns SET versions = ?", (recorded,))
        said: list[str] = []
        run_fl(
            cfg, data=blob_data(4, 10), capacities=CAPACITIES, placement={"c0": "pi4"},
            progress=said.append, device_configs={"pi4": ProfileConfig(batch=10, optimizer="sgd")},
        )  # fmt: skip
        return [w for w in said if "export format" in w]

    from exporters.manifest import (
        EXPORT_FORMAT_VERSION,
        FIRST_RECORDED_EXPORT_FORMAT,
        UNTIMED_EXPORT_FORMATS,
        timed_format_changes,
    )

    assert warnings_of_a_run(tmp_path / "now.db", None) == []  # measured on this version's artifacts
    last_timed = max(timed_format_changes())
    if last_timed < EXPORT_FORMAT_VERSION:  # only untimed changes since: the profile still holds
        assert set(range(last_timed + 1, EXPORT_FORMAT_VERSION + 1)) <= UNTIMED_EXPORT_FORMATS
        assert warnings_of_a_run(tmp_path / "untimed.db", f'{{"export_format": "{last_timed}"}}') == []
    previous = last_timed - 1
    older = warnings_of_a_run(tmp_path / "older.db", f'{{"export_format": "{previous}"}}')
    assert len(older) == 1
    assert older[0].startswith(f"device 'pi4': its profile was measured on artifacts of export format {previous},")
    assert timed_format_changes()[last_timed] in older[0]  # what the newer format changed
    unrecorded = warnings_of_a_run(tmp_path / "unrecorded.db", "{}")
    assert len(unrecorded) == 1
    assert f"export format unrecorded (before {FIRST_RECORDED_EXPORT_FORMAT})" in unrecorded[0]


def test_a_profile_of_another_configuration_is_planned_with_a_warning(tmp_path, registered):
    from fl.scheduling.configs import ProfileConfig
    from tests.fl.scheduling.profiles import store_lines

    cfg = config(tmp_path, rounds=1)
    store_lines(cfg.db, {"pi4": (200.0, 1e-4)}, batch=10, optimizer="adamw")
    warnings: list[str] = []
    summary = run_fl(
        cfg, data=blob_data(4, 10), capacities=CAPACITIES, placement={"c0": "pi4", "c1": "nano"},
        progress=warnings.append, device_configs={d: ProfileConfig(batch=10, optimizer="sgd") for d in ("pi4", "nano")},
    )  # fmt: skip
    assert any("'pi4'" in w and "optimizer adamw (run: sgd)" in w for w in warnings), warnings
    assert any("'nano' has no measured profile" in w for w in warnings), warnings
    with ProfileStore(cfg.db) as store:
        rows = RunLog(store).client_rounds(summary.run_id).set_index("cid")
    assert rows.loc["c0", "predicted_seconds"] > 0  # planned from the nearest profile
    assert pd.isna(rows.loc["c1", "predicted_seconds"])  # nothing to plan with


#: The local configuration every instruction carries (`fl.strategies.base.Strategy.client_config`).
LOCAL = {"batch_size": 20, "epochs": 1}


def fjord_with(model: ZooModel, predictor):
    """A FjORD strategy whose round predictor is ``predictor``."""
    from fl.strategies.fjord import FjORD

    strategy = FjORD(model, server.initial_parameters(model, 0))
    strategy.round_predictor = predictor
    return strategy


def test_a_fjord_client_round_is_predicted_from_the_widths_its_seed_draws():

    from fl.records import ClientSpec
    from fl.roundcost import CalibratedPredictor, ClientRoundPredictor
    from fl.server import _predictions
    from fl.strategies.fjord import drawn_widths

    model = get_model("fjord-cnn")

    def cost(device, arch, steps, down, up):  # 1 s fixed, 10 s per step per unit of width
        return 1.0 + steps * 10.0 * arch.sizes[0] / model.group_sizes[0]

    base = ClientRoundPredictor(cost, 20, 1, frozenset({"d"}))
    client = {"a": ClientSpec("a", capacity=1.0, num_examples=90, device="d")}
    widths = [0.25, 0.5, 0.75, 1.0]
    for seed in (3, 4):
        config = {"trainer": "fjord", "widths": widths, "seed": seed, "batch_size": 20, "epochs": 1}
        ins = {"a": TrainIns("a", model.static(1.0), {}, config)}
        drawn = drawn_widths(widths, seed, 90, 20, 1)
        expected = 1.0 + 10.0 * (sum(drawn[:4]) + 0.5 * drawn[4])  # four batches of 20 and one of 10
        for predictor in (base, CalibratedPredictor(base)):
            strategy = fjord_with(model, predictor)
            assert _predictions(strategy, ins, [], client)["a"] == pytest.approx(expected)
    uniform = 1.0 + 4.5 * 10.0 * np.mean(widths)
    assert expected != pytest.approx(uniform)  # the draws, not the mean over widths


def test_a_fjord_client_round_is_predicted_over_the_widths_it_draws_from():
    from types import SimpleNamespace

    from fl.records import ClientSpec
    from fl.server import _predictions

    model = get_model("fjord-cnn")
    step_cost = {w: 10.0 * w for w in (0.25, 0.5, 0.75, 1.0)}

    def predictor(client, arch, bytes_down=None):  # fixed 1 s plus a step cost growing with the width
        return 1.0 + step_cost[arch.sizes[0] / model.group_sizes[0]]

    strategy = SimpleNamespace(model=model, round_predictor=predictor, step_widths=lambda ins, client: None)
    clients = {c: ClientSpec(c, capacity=1.0, num_examples=40, device="d") for c in ("a", "b")}
    sub = model.static(0.75)
    instructions = {
        "a": TrainIns("a", sub, {}, {"trainer": "fjord", "widths": [0.25, 0.5, 0.75], "capacity": 0.75}),
        "b": TrainIns("b", sub, {}, {}),
    }
    predicted = _predictions(strategy, instructions, [], clients)
    assert predicted["a"] == pytest.approx(1.0 + (2.5 + 5.0 + 7.5) / 3)  # not the capacity round, 8.5
    assert predicted["b"] == pytest.approx(8.5)


def test_say_once_passes_each_distinct_line_once() -> None:
    from fl.server import say_once

    lines: list[str] = []
    warn = say_once(lines.append)
    for line in ("device 'a': nearest profile", "device 'b': nearest profile", "device 'a': nearest profile"):
        warn(line)
    assert lines == ["device 'a': nearest profile", "device 'b': nearest profile"]
    other: list[str] = []
    say_once(other.append)("device 'a': nearest profile")  # each printer remembers its own lines
    assert other == ["device 'a': nearest profile"]


def test_a_round_the_host_slowed_is_logged_against_the_profile_s_cpu_and_does_not_calibrate():

    from fl.records import ClientSpec, TrainRes
    from fl.roundcost import CalibratedPredictor, ClientRoundPredictor
    from fl.server import _predict_and_calibrate

    model = get_model("fjord-cnn")

    def cost(device, arch, steps, down, up):  # 0.1 s per step at any width
        return 0.1 * steps

    def reference(device, arch):  # the profile's CPU per step: 10 ms per unit of width
        return 0.01 * arch.sizes[0] / model.group_sizes[0]

    predictor = CalibratedPredictor(ClientRoundPredictor(cost, 20, 1, frozenset({"d"})), cpu_reference=reference)
    strategy = fjord_with(model, predictor)
    clients = {c: ClientSpec(c, capacity=1.0, num_examples=40, device="d") for c in ("a", "b")}  # 2 steps
    sub = model.static(0.5)
    instructions = {
        "a": TrainIns("a", sub, {}, {}),
        "b": TrainIns("b", model.static(1.0), {}, {"trainer": "fjord", "widths": [0.5, 1.0], "seed": 1, **LOCAL}),
    }

    def result(cid, seconds, cpu, **metrics):
        loop = {"loop_cpu_seconds": cpu, "steps": 2, **metrics}
        return TrainRes(cid, sub, [], 40, compute_seconds=seconds, metrics=loop)

    for seconds, cpu in ((0.3, 0.0125), (0.24, 0.0105), (0.22, 0.010)):  # 2 steps at 5 ms: 1.25, 1.05, 1.0
        _, logged = _predict_and_calibrate(strategy, instructions, [result("a", seconds, cpu)], clients)
        assert logged[0].metrics["cpu_vs_profile"] == pytest.approx(cpu / 2 / 0.005)
    assert [slowed for _, slowed in predictor.rounds["d"]] == [True, False, False]
    assert predictor.factor("d") == pytest.approx((1.2 + 1.1) / 2)  # the slowed round's 1.5 left out
    # a width trained narrower than sent is judged at the width it trained
    _, logged = _predict_and_calibrate(strategy, instructions, [result("a", 0.2, 0.005, trained_width=0.25)], clients)
    assert logged[0].metrics["cpu_vs_profile"] == pytest.approx(1.0)
    # FjORD per step trains several widths: not judged, and it calibrates
    _, logged = _predict_and_calibrate(strategy, instructions, [result("b", 0.2, 0.5)], clients)
    assert "cpu_vs_profile" not in logged[0].metrics and predictor.rounds["d"][-1][1] is False


def test_a_fjord_round_is_judged_against_the_profile_at_its_draws_and_its_own_earlier_rounds():

    from fl.records import ClientSpec, TrainRes
    from fl.roundcost import CalibratedPredictor, ClientRoundPredictor
    from fl.server import _predict_and_calibrate

    model = get_model("fjord-cnn")

    def reference(device, arch):  # the profile's CPU per step: 10 ms at full width, 5 ms at half
        return 0.01 * arch.sizes[0] / model.group_sizes[0]

    predictor = CalibratedPredictor(
        ClientRoundPredictor(lambda *a: 0.1 * a[2], 20, 1, frozenset({"d"})), cpu_reference=reference
    )
    strategy = fjord_with(model, predictor)
    clients = {"b": ClientSpec("b", capacity=1.0, num_examples=40, device="d")}  # 2 steps
    fjord = {"trainer": "fjord", "widths": [0.5, 1.0], "seed": 1, **LOCAL}
    instructions = {"b": TrainIns("b", model.static(1.0), {}, fjord)}

    def result(cpu, drawn):
        metrics = {"loop_cpu_seconds": cpu, "steps": 2}
        return TrainRes("b", model.static(1.0), [], 40, compute_seconds=0.2, metrics=metrics, steps_at_width=drawn)

    both = {0.5: 1, 1.0: 1}  # the profile's mean: 7.5 ms per step
    logged_mix = []
    for cpu in (0.0165, 0.0162, 0.021, 0.0168):
        _, logged = _predict_and_calibrate(strategy, instructions, [result(cpu, both)], clients)
        assert "cpu_vs_profile" not in logged[0].metrics
        logged_mix.append(logged[0].metrics["cpu_vs_profile_mix"])
    assert logged_mix == pytest.approx([1.1, 1.08, 1.4, 1.12])
    # the first has no earlier round to be judged against; 1.4 / 1.08 is the host's
    assert [slowed for _, slowed in predictor.rounds["d"]] == [False, False, True, False]
    # one width drawn at every step: judged against the profile at that width, as any round
    _, logged = _predict_and_calibrate(strategy, instructions, [result(0.0125, {0.5: 2})], clients)
    assert logged[0].metrics["cpu_vs_profile"] == pytest.approx(1.25) and predictor.rounds["d"][-1][1] is True


def test_a_round_s_steps_per_width_are_logged_as_one_object_a_reader_gets_back() -> None:
    import json

    from fl.roundcost import drawn_steps
    from fl.server import _logged_metrics

    model = get_model("fjord-cnn")
    res = TrainRes("b", model.static(1.0), {}, 40, metrics={"steps": 3.0}, steps_at_width={0.25: 2, 1.0: 1})
    logged = json.loads(json.dumps(_logged_metrics(res)))
    assert logged == {"steps": 3.0, "steps_at_width": {"0.25": 2, "1": 1}}
    assert drawn_steps(logged) == {0.25: 2.0, 1.0: 1.0}
    assert "steps_at_width" not in _logged_metrics(TrainRes("b", model.static(1.0), {}, 40, metrics={"steps": 3.0}))


def test_a_run_stored_with_the_old_option_keys_resumes(tmp_path, registered):
    import json
    import sqlite3

    data = blob_data(4, 20)
    cfg = config(tmp_path, strategy="fd", rounds=1, options={"width": 0.5})
    first = run_fl(cfg, data=data, capacities=CAPACITIES, progress=None)
    with sqlite3.connect(cfg.db) as db:  # as a store written before `rate` became `width`
        stored = json.loads(db.execute("SELECT config FROM fl_runs WHERE id = ?", (first.run_id,)).fetchone()[0])
        assert stored["options"] == {"width": 0.5}
        stored["options"] = {"rate": 0.5}
        db.execute("UPDATE fl_runs SET config = ? WHERE id = ?", (json.dumps(stored), first.run_id))
    with ProfileStore(cfg.db) as store:
        old = RunLog(store).run(first.run_id)["config"]
    assert old["options"] == {"rate": 0.5}
    assert RunConfig.from_dict(old).options == {"width": 0.5}  # what `fl run --resume` builds
    resumed = run_fl(
        dataclasses.replace(RunConfig.from_dict(old), rounds=2),
        data=data, capacities=CAPACITIES, resume_run=first.run_id, progress=None,
    )  # fmt: skip
    assert resumed.run_id == first.run_id and resumed.rounds == 2


def test_old_option_keys_are_read_under_their_current_names():
    assert RunConfig(strategy="fd", options={"rate": 0.5, "mask": "same"}).options == {"width": 0.5, "mask": "same"}
    assert RunConfig(strategy="cfd", options={"rate": "0.25"}).options == {"width": "0.25"}
    fluid = RunConfig(strategy="fluid", options={"sizes": [0.75, 0.5], "rate": 0.5})
    assert fluid.options == {"widths": [0.75, 0.5], "width": 0.5}
    assert RunConfig(strategy="heterofl", options={"rate": 1}).options == {"rate": 1}  # not one of its renames
    with pytest.raises(InputError, match="'rate' is the old name of 'width'; give only 'width'"):
        RunConfig(strategy="fd", options={"rate": 0.5, "width": 0.25})
