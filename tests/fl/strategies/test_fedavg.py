import numpy as np
import pytest

from exporters.userinput import InputError
from fl.records import ClientFailure, ClientSpec, TrainRes
from fl.strategies import strategy_class
from fl.strategies.fedavg import FedAvg, parse_options
from tests.fl.strategies.tiny import accuracy, blobs, initial_params, run_rounds, tiny_model


def _clients(n, capacity=1.0):
    return [ClientSpec(f"c{i}", 30, capacity) for i in range(n)]


def test_registered():
    assert strategy_class("fedavg") is FedAvg


def test_configure_round_sends_the_full_model_to_everyone():
    model = tiny_model()
    strategy = FedAvg(model, initial_params(model), seed=1, local={"epochs": 2})
    ins = strategy.configure_round(0, _clients(3, capacity=0.25))
    assert set(ins) == {"c0", "c1", "c2"}
    for i in ins.values():
        assert i.submodel.arch.sizes == model.group_sizes
        for k, v in i.parameters.items():
            assert np.array_equal(v, strategy.global_state[k])
        assert i.config["epochs"] == 2 and i.config["trainer"] == "plain"
    assert ins["c0"].config["seed"] != ins["c1"].config["seed"]
    assert strategy.configure_round(0, _clients(3))["c1"].config["seed"] == ins["c1"].config["seed"]


def test_aggregate_is_weighted_by_examples():
    model = tiny_model()
    strategy = FedAvg(model, initial_params(model))
    ins = strategy.configure_round(0, _clients(2))
    res = [
        TrainRes(
            "c0",
            ins["c0"].submodel,
            {k: np.zeros_like(v) for k, v in ins["c0"].parameters.items()},
            10,
            metrics={"loss": 1.0, "accuracy": 0.0},
        ),
        TrainRes(
            "c1",
            ins["c1"].submodel,
            {k: np.full_like(v, 4.0) for k, v in ins["c1"].parameters.items()},
            30,
            metrics={"loss": 3.0, "accuracy": 1.0},
        ),
    ]
    state, metrics = strategy.aggregate_round(0, res, [ClientFailure("c2", "timeout")])
    for v in state.values():
        assert np.all(v == 3.0)  # (10 * 0 + 30 * 4) / 40
    assert metrics["clients"] == 2 and metrics["failures"] == 1 and metrics["examples"] == 40
    assert metrics["train_loss"] == pytest.approx(2.5) and metrics["train_accuracy"] == pytest.approx(0.75)
    unweighted = FedAvg(model, initial_params(model), weighted="false")
    state, _ = unweighted.aggregate_round(0, res, [])
    assert all(np.all(v == 2.0) for v in state.values())


def test_round_with_only_failures_keeps_the_global_model():
    model = tiny_model()
    strategy = FedAvg(model, initial_params(model))
    before = {k: v.copy() for k, v in strategy.global_state.items()}
    state, metrics = strategy.aggregate_round(0, [], [ClientFailure("c0", "unreachable")])
    assert all(np.array_equal(state[k], before[k]) for k in before)
    assert metrics["clients"] == 0 and "train_loss" not in metrics


def test_options_are_checked():
    model = tiny_model()
    with pytest.raises(InputError, match="unknown option"):
        FedAvg(model, initial_params(model), mask="same")
    with pytest.raises(InputError, match="weighted"):
        FedAvg(model, initial_params(model), weighted="perhaps")
    with pytest.raises(InputError, match="do not match"):
        FedAvg(model, {"fc1.weight": np.zeros((10, 6), np.float32)})
    assert parse_options("x", {"k": "7", "kd": "yes", "rate": "0.5"}, {"k": 5, "kd": False, "rate": None}) == {
        "k": 7,
        "kd": True,
        "rate": 0.5,
    }


def test_state_roundtrip():
    model = tiny_model()
    a = FedAvg(model, initial_params(model, seed=1))
    b = FedAvg(model, initial_params(model, seed=2))
    b.load_state(a.state())
    assert all(np.array_equal(a.global_state[k], b.global_state[k]) for k in a.global_state)


def test_end_to_end_learns_separable_blobs():
    model = tiny_model()
    strategy = FedAvg(model, initial_params(model), seed=0, local={"epochs": 2, "batch_size": 10, "lr": 0.1})
    clients = _clients(3)
    data = {c.cid: blobs(30, seed=i) for i, c in enumerate(clients)}
    x_test, y_test = blobs(150, seed=99)
    before = accuracy(strategy, x_test, y_test)
    history = run_rounds(strategy, clients, 4, data)
    assert history[-1]["train_loss"] < history[0]["train_loss"]
    assert accuracy(strategy, x_test, y_test) > max(0.9, before)
    assert strategy.eval_submodels(clients)[1.0].arch.sizes == model.group_sizes
