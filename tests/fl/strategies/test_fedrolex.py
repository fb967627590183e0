import numpy as np

from fl.records import ClientSpec, TrainRes
from fl.strategies import strategy_class
from fl.strategies.fedrolex import FedRolex
from tests.fl.strategies.tiny import accuracy, initial_params, learn_blobs, tiny_model


def test_registered():
    assert strategy_class("fedrolex") is FedRolex


def test_rolling_windows_per_round():
    model = tiny_model(h1=8, h2=8)
    strategy = FedRolex(model, initial_params(model))
    clients = [ClientSpec("small", 10, 3 / 8), ClientSpec("big", 10, 0.5)]
    expected_small = {0: [0, 1, 2], 1: [1, 2, 3], 2: [2, 3, 4], 3: [3, 4, 5], 6: [0, 6, 7], 9: [1, 2, 3]}
    for rnd, idx in expected_small.items():
        ins = strategy.configure_round(rnd, clients)
        assert ins["small"].submodel.indices[0].tolist() == idx
        assert ins["small"].submodel.indices[1].tolist() == idx  # equal sizes, equal windows
        big = ins["big"].submodel.indices[0].tolist()
        assert set(idx) <= set(big) and len(big) == 4  # shared start: the small window is a prefix
    ins = strategy.configure_round(6, clients)
    g = strategy.global_state["fc2.weight"]
    assert np.array_equal(ins["small"].parameters["fc2.weight"], g[np.ix_([0, 6, 7], [0, 6, 7])])


def test_plain_selective_average_eq10_this_round_only():
    model = tiny_model(h1=8, h2=8)
    strategy = FedRolex(model, initial_params(model))
    start = strategy.global_state["fc1.bias"].copy()
    clients = [ClientSpec("a", 100, 3 / 8), ClientSpec("b", 1, 3 / 8), ClientSpec("c", 5, 0.25)]
    # round 6: a and b hold {0, 6, 7}, c (width 2) holds {6, 7}
    ins = strategy.configure_round(6, clients)
    values = {"a": 1.0, "b": 2.0, "c": 6.0}
    res = [
        TrainRes(
            cid,
            i.submodel,
            {k: np.full_like(v, values[cid]) for k, v in i.parameters.items()},
            {"a": 100, "b": 1, "c": 5}[cid],
        )
        for cid, i in ins.items()
    ]
    state, _ = strategy.aggregate_round(6, res, [])
    b = state["fc1.bias"]
    assert b[6] == b[7] == 3.0  # (1 + 2 + 6) / 3, no example weighting
    assert b[0] == 1.5  # (1 + 2) / 2
    assert np.array_equal(b[1:6], start[1:6])  # nobody held them
    # next round: a single client holding {1, 2, 3}; the count restarts (no accumulated per-element count)
    ins = strategy.configure_round(7, [ClientSpec("a", 100, 3 / 8)])
    assert ins["a"].submodel.indices[0].tolist() == [0, 1, 7]
    res = [TrainRes("a", ins["a"].submodel, {k: np.full_like(v, 9.0) for k, v in ins["a"].parameters.items()}, 100)]
    state, _ = strategy.aggregate_round(7, res, [])
    assert state["fc1.bias"][0] == 9.0 and state["fc1.bias"][7] == 9.0 and state["fc1.bias"][6] == 3.0


def test_global_model_larger_than_every_client_is_fully_trained_over_k_rounds():
    model = tiny_model(h1=8, h2=8)
    strategy = FedRolex(model, initial_params(model))
    held = np.zeros(8, dtype=int)
    for rnd in range(8):
        ins = strategy.configure_round(rnd, [ClientSpec("c0", 10, 0.25)])
        held[ins["c0"].submodel.indices[0]] += 1
    assert held.tolist() == [2] * 8  # every neuron exactly twice: even coverage


def test_eval_submodels_include_the_global_model():
    model = tiny_model()
    strategy = FedRolex(model, initial_params(model))
    subs = strategy.eval_submodels([ClientSpec("a", 1, 0.5)])
    assert list(subs) == [1.0, 0.5]


def test_end_to_end_learns_with_clients_smaller_than_the_global_model():
    model = tiny_model()
    strategy = FedRolex(model, initial_params(model), local={"epochs": 2, "batch_size": 10, "lr": 0.3})
    clients = [ClientSpec("c0", 30, 0.5), ClientSpec("c1", 30, 0.5), ClientSpec("c2", 30, 0.5)]
    x_test, y_test = learn_blobs(strategy, clients, 10)  # the windows cover every neuron in 10 rounds
    assert accuracy(strategy, x_test, y_test, width=1.0) > 0.8
