import numpy as np
import pytest

from exporters.userinput import InputError
from fl.records import ClientSpec, TrainRes
from fl.strategies import strategy_class
from fl.strategies.fd import FederatedDropout
from tests.fl.strategies.tiny import accuracy, blobs, initial_params, learn_blobs, run_rounds, tiny_model


def _clients(caps):
    return [ClientSpec(f"c{i}", 10 * (i + 1), c) for i, c in enumerate(caps)]


def test_registered():
    assert strategy_class("fd") is FederatedDropout


def test_same_mask_for_every_client_of_a_round_and_new_each_round():
    model = tiny_model(h1=40, h2=40)
    strategy = FederatedDropout(model, initial_params(model), seed=4)
    clients = _clients([0.5, 0.5, 0.25])
    r0 = strategy.configure_round(0, clients)
    a, b, small = (r0[c.cid].submodel for c in clients)
    assert a.arch.sizes == (20, 20) and small.arch.sizes == (10, 10)
    for g in range(2):
        assert a.indices[g].tolist() == b.indices[g].tolist()
        assert set(small.indices[g].tolist()) <= set(a.indices[g].tolist())
        assert a.indices[g].tolist() != list(range(20))  # not a prefix
    r1 = strategy.configure_round(1, clients)
    assert r1["c0"].submodel.indices[0].tolist() != a.indices[0].tolist()
    again = strategy.configure_round(0, clients)  # a resumed run redraws the same masks
    assert again["c0"].submodel.indices[1].tolist() == a.indices[1].tolist()
    g = strategy.global_state["fc2.weight"]
    assert np.array_equal(r0["c0"].parameters["fc2.weight"], g[np.ix_(a.indices[1], a.indices[0])])


def test_per_client_masks_differ_and_width_option_overrides_capacity():
    model = tiny_model(h1=40, h2=40)
    strategy = FederatedDropout(model, initial_params(model), mask="per_client", width="0.25")
    ins = strategy.configure_round(0, _clients([1.0, 1.0]))
    a, b = ins["c0"].submodel, ins["c1"].submodel
    assert a.arch.sizes == b.arch.sizes == (10, 10)
    assert a.indices[0].tolist() != b.indices[0].tolist()
    again = FederatedDropout(model, initial_params(model), mask="per_client", width=0.25).configure_round(
        0, _clients([1.0, 1.0])
    )
    assert again["c1"].submodel.indices[0].tolist() == b.indices[0].tolist()


def test_bad_options():
    model = tiny_model()
    with pytest.raises(InputError, match="mask"):
        FederatedDropout(model, initial_params(model), mask="gold")
    with pytest.raises(InputError):
        FederatedDropout(model, initial_params(model), width=1.5)


def test_aggregation_weighted_over_holders():
    model = tiny_model(h1=4, h2=4)
    strategy = FederatedDropout(model, initial_params(model), mask="per_client", width=0.5)
    start = strategy.global_state["fc1.bias"].copy()
    clients = _clients([1.0, 1.0])  # 10 and 20 examples
    ins = strategy.configure_round(0, clients)
    res = [
        TrainRes(
            c.cid,
            ins[c.cid].submodel,
            {k: np.full_like(v, 3.0 * (i + 1)) for k, v in ins[c.cid].parameters.items()},
            c.num_examples,
        )
        for i, c in enumerate(clients)
    ]
    state, _ = strategy.aggregate_round(0, res, [])
    held0 = set(ins["c0"].submodel.indices[0].tolist())
    held1 = set(ins["c1"].submodel.indices[0].tolist())
    for n in range(4):
        if n in held0 and n in held1:
            expected = (10 * 3 + 20 * 6) / 30
        elif n in held0:
            expected = 3.0
        elif n in held1:
            expected = 6.0
        else:
            expected = start[n]
        assert state["fc1.bias"][n] == pytest.approx(expected)


def test_end_to_end_learns():
    model = tiny_model(h1=16, h2=16)
    strategy = FederatedDropout(model, initial_params(model), local={"epochs": 2, "batch_size": 10, "lr": 0.3})
    clients = _clients([0.75, 0.75, 0.75])
    x_test, y_test = learn_blobs(strategy, clients, 6)
    assert accuracy(strategy, x_test, y_test) > 0.8


@pytest.mark.parametrize("mask", ["same", "per_client"])
def test_resumed_run_equals_uninterrupted_run(mask):
    model = tiny_model(h1=12, h2=12)
    local = {"epochs": 1, "batch_size": 10, "lr": 0.2}
    clients = _clients([0.5, 0.75])
    data = {c.cid: blobs(20, seed=i) for i, c in enumerate(clients)}
    whole = FederatedDropout(model, initial_params(model), seed=7, local=local, mask=mask)
    run_rounds(whole, clients, 3, data)
    first = FederatedDropout(model, initial_params(model), seed=7, local=local, mask=mask)
    run_rounds(first, clients, 1, data)
    resumed = FederatedDropout(model, initial_params(model, seed=5), seed=7, local=local, mask=mask)
    resumed.load_state(first.state())
    run_rounds(resumed, clients, 2, data, start=1)
    for k in whole.global_state:
        assert np.array_equal(whole.global_state[k], resumed.global_state[k])
