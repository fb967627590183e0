from dataclasses import replace

import numpy as np
import pytest
from torch import nn

from exporters.userinput import InputError
from exporters.zoo import get_model
from fl.records import ClientSpec, TrainRes
from fl.strategies import strategy_class
from fl.strategies.heterofl import HeteroFL, has_running_stats
from tests.fl.strategies.tiny import TinyMLP, accuracy, initial_params, learn_blobs, tiny_model


def test_registered():
    assert strategy_class("heterofl") is HeteroFL


def test_static_extraction_at_each_clients_capacity_in_every_round():
    model = tiny_model()  # h1 = 10, h2 = 8
    strategy = HeteroFL(model, initial_params(model))
    clients = [ClientSpec("c0", 20, 1.0), ClientSpec("c1", 20, 0.5), ClientSpec("c2", 20, 0.25)]
    for rnd in (0, 3):
        ins = strategy.configure_round(rnd, clients)
        assert ins["c1"].submodel.arch.sizes == (5, 4)
        assert ins["c2"].submodel.arch.sizes == (3, 2)  # ceil(2.5), ceil(2)
        assert ins["c2"].submodel.indices[0].tolist() == [0, 1, 2]
        assert np.array_equal(ins["c1"].parameters["fc2.weight"], strategy.global_state["fc2.weight"][:4, :5])


def test_unweighted_average_over_holders():
    model = tiny_model()
    strategy = HeteroFL(model, initial_params(model))
    glob = {k: v.copy() for k, v in strategy.global_state.items()}
    clients = [ClientSpec("big", 100, 1.0), ClientSpec("small", 1, 0.5)]
    ins = strategy.configure_round(0, clients)

    def filled(cid, value):
        return {k: np.full_like(v, value) for k, v in ins[cid].parameters.items()}

    res = [
        TrainRes("big", ins["big"].submodel, filled("big", 2.0), 100),
        TrainRes("small", ins["small"].submodel, filled("small", 6.0), 1),
    ]
    state, _ = strategy.aggregate_round(0, res, [])
    w = state["fc2.weight"]  # (8, 10); the small client holds [:4, :5]
    assert np.all(w[:4, :5] == 4.0)  # (2 + 6) / 2, examples ignored
    assert np.all(w[4:, :] == 2.0) and np.all(w[:4, 5:] == 2.0)
    assert np.all(state["fc3.bias"] == 4.0)
    weighted = HeteroFL(model, glob, weighted=True)
    state, _ = weighted.aggregate_round(0, res, [])
    assert np.allclose(state["fc2.weight"][:4, :5], (200 + 6) / 101)


def test_untrained_part_keeps_its_value_when_no_client_is_full_width():
    model = tiny_model()
    strategy = HeteroFL(model, initial_params(model))
    before = strategy.global_state["fc1.weight"].copy()
    clients = [ClientSpec("c0", 20, 0.5)]
    ins = strategy.configure_round(0, clients)
    res = [TrainRes("c0", ins["c0"].submodel, {k: v + 1 for k, v in ins["c0"].parameters.items()}, 20)]
    state, _ = strategy.aggregate_round(0, res, [])
    assert np.array_equal(state["fc1.weight"][5:], before[5:])
    assert np.allclose(state["fc1.weight"][:5], before[:5] + 1)


def test_bn_recompute_is_refused_for_models_without_running_stats():
    model = get_model("fjord-cnn")
    assert not has_running_stats(model)
    with pytest.raises(InputError, match="bn_recompute"):
        HeteroFL(model, initial_params(model), bn_recompute=True)
    HeteroFL(model, initial_params(model), bn_recompute=False)


def test_eval_submodels_per_capacity():
    model = tiny_model()
    strategy = HeteroFL(model, initial_params(model))
    subs = strategy.eval_submodels([ClientSpec("a", 1, 0.5), ClientSpec("b", 1, 1.0), ClientSpec("c", 1, 0.5)])
    assert list(subs) == [1.0, 0.5] and subs[0.5].arch.sizes == (5, 4)


def test_end_to_end_mixed_capacities_learn():
    model = tiny_model()
    strategy = HeteroFL(model, initial_params(model), local={"epochs": 2, "batch_size": 10, "lr": 0.3})
    clients = [ClientSpec("c0", 30, 1.0), ClientSpec("c1", 30, 0.5), ClientSpec("c2", 30, 0.5)]
    x_test, y_test = learn_blobs(strategy, clients, 4)
    assert accuracy(strategy, x_test, y_test, width=0.5) > 0.9
    assert accuracy(strategy, x_test, y_test, width=1.0) > 0.9


def test_bn_recompute_with_running_stats_is_refused_with_its_own_reason():
    base = tiny_model()

    def build(group_sizes):
        module = TinyMLP(group_sizes)
        module.norm = nn.BatchNorm1d(3)  # tracks running statistics (buffers, not parameters)
        return module

    model = replace(base, builder=build)
    assert has_running_stats(model)
    with pytest.raises(InputError, match="running statistics, which are buffers"):
        HeteroFL(model, initial_params(base), bn_recompute=True)
