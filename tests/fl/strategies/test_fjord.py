from dataclasses import replace

import numpy as np
import pytest
import torch

from exporters.userinput import InputError
from exporters.zoo import get_model
from fl.client import TRAINERS, get_trainer, train_plain
from fl.records import ClientSpec, TrainIns, TrainRes
from fl.strategies import strategy_class
from fl.strategies.fjord import FjORD, capacity_for, drawn_widths, train_ordered, width_set
from tests.fl.strategies.tiny import accuracy, blobs, initial_params, learn_blobs, tiny_model


def test_registered():
    assert strategy_class("fjord") is FjORD
    assert TRAINERS["fjord"] == "fl.strategies.fjord:train_ordered"
    assert get_trainer("fjord") is train_ordered


def test_width_set_and_capacity():
    assert width_set(5) == pytest.approx((0.2, 0.4, 0.6, 0.8, 1.0))
    assert capacity_for(0.7, width_set(5)) == pytest.approx(0.6)
    assert capacity_for(0.8, width_set(5)) == pytest.approx(0.8)
    assert capacity_for(1.0, width_set(4)) == 1.0
    with pytest.raises(InputError, match="0.1"):
        capacity_for(0.1, width_set(5))
    with pytest.raises(InputError):
        width_set(0)


def test_configure_round_sends_capacity_prefix_and_the_widths_to_sample():
    model = tiny_model()  # h1 = 10, h2 = 8
    strategy = FjORD(model, initial_params(model), kd="true")
    ins = strategy.configure_round(0, [ClientSpec("c0", 10, 0.7), ClientSpec("c1", 10, 1.0)])
    c0 = ins["c0"]
    assert c0.submodel.arch.sizes == (6, 5)  # capacity 0.6: ceil(6), ceil(4.8)
    assert c0.submodel.indices[0].tolist() == list(range(6))
    assert c0.config["trainer"] == "fjord" and c0.config["kd"] is True
    assert c0.config["widths"] == pytest.approx([0.2, 0.4, 0.6])
    assert ins["c1"].config["widths"] == pytest.approx([0.2, 0.4, 0.6, 0.8, 1.0])
    subs = strategy.eval_submodels([ClientSpec("c0", 10, 0.7), ClientSpec("c2", 10, 0.5)])
    assert list(subs) == pytest.approx([0.6, 0.4, 0.2])


def test_nested_aggregation_eq1_hand_worked():
    model = tiny_model(h1=10, h2=10)
    strategy = FjORD(model, initial_params(model))
    start = {k: v.copy() for k, v in strategy.global_state.items()}
    clients = [ClientSpec("full", 1, 1.0), ClientSpec("mid", 2, 0.6), ClientSpec("low", 1, 0.2)]
    ins = strategy.configure_round(0, clients)
    value = {"full": 1.0, "mid": 4.0, "low": 8.0}
    res = [
        TrainRes(
            c.cid,
            ins[c.cid].submodel,
            {k: np.full_like(v, value[c.cid]) for k, v in ins[c.cid].parameters.items()},
            c.num_examples,
        )
        for c in clients
    ]
    state, _ = strategy.aggregate_round(0, res, [])
    # F_0.2 = neurons 0-1 (all three: (1*1 + 2*4 + 1*8) / 4), F_0.6 minus F_0.2 = neurons 2-5 (full, mid:
    # (1 + 8) / 3), the rest only full (1)
    assert state["fc1.bias"].tolist() == [4.25, 4.25, 3, 3, 3, 3, 1, 1, 1, 1]
    w = state["fc2.weight"]
    assert np.all(w[:2, :2] == 4.25)
    assert np.all(w[:6, 2:6] == 3) and np.all(w[2:6, :2] == 3)
    assert np.all(w[6:, :] == 1) and np.all(w[:, 6:] == 1)
    assert np.all(state["fc3.bias"] == 4.25)
    # without the full client, neurons 6-9 keep their values
    strategy.load_state({"global": start})
    state, _ = strategy.aggregate_round(0, res[1:], [])
    assert np.array_equal(state["fc1.bias"][6:], start["fc1.bias"][6:])


def _ins(model, capacity, widths, **config):
    sub = model.static(capacity)
    params = model.extract(initial_params(model, seed=3), sub)
    cfg = {"epochs": 1, "batch_size": 8, "lr": 0.2, "seed": 11, "widths": widths, **config}
    return TrainIns("c0", sub, params, cfg)


def test_train_ordered_with_one_width_equals_plain_sgd_on_that_prefix():
    model = tiny_model()
    x, y = blobs(24, seed=0)
    ins = _ins(model, 0.6, [0.2])
    trained, metrics = train_ordered(model, ins, x, y)
    assert metrics["steps"] == 3 and metrics["mean_width"] == pytest.approx(0.2)
    # the same steps done by hand: copy the 0.2 prefix out, train it plainly, copy it back
    small = model.static(0.2)
    prefix = model.extract(ins.parameters, small)
    plain, _ = train_plain(model, TrainIns("c0", small, prefix, ins.config), x, y)
    for k in trained:
        got = model.extract(trained, small)[k]
        np.testing.assert_allclose(got, plain[k], rtol=1e-5, atol=1e-6)
        # everything outside the prefix is untouched
        mask = np.ones(trained[k].shape, dtype=bool)
        mask[tuple(slice(0, n) for n in got.shape)] = False
        assert np.array_equal(trained[k][mask], ins.parameters[k][mask])


def test_train_ordered_samples_widths_uniformly_and_never_above_capacity():
    model = tiny_model()
    x, y = blobs(400, seed=1)
    ins = _ins(model, 0.6, [0.2, 0.4, 0.6], batch_size=2, lr=0.01)
    _, metrics = train_ordered(model, ins, x, y)
    assert metrics["steps"] == 200
    assert metrics["mean_width"] == pytest.approx(0.4, abs=0.03)  # uniform over {0.2, 0.4, 0.6}
    with pytest.raises(InputError, match="0.8"):
        train_ordered(model, _ins(model, 0.6, [0.2, 0.8]), x, y)
    with pytest.raises(InputError, match="momentum"):
        train_ordered(model, _ins(model, 0.6, [0.2], momentum=0.9), x, y)


def test_drawn_widths_are_the_widths_train_ordered_trains_step_by_step():
    model = tiny_model()
    x, y = blobs(45, seed=3)  # batches of 10: four whole ones and a short one per epoch
    widths = [0.2, 0.4, 0.6]
    ins = _ins(model, 0.6, widths, batch_size=10, epochs=3, seed=5)
    _, metrics = train_ordered(model, ins, x, y)
    drawn = drawn_widths(widths, 5, 45, 10, 3)
    assert len(drawn) == metrics["steps"] == 15  # the short batches train too
    assert np.mean(drawn) == pytest.approx(metrics["mean_width"])
    assert drawn_widths(widths, 6, 45, 10, 3) != drawn
    client = ClientSpec("c0", 45, capacity=0.6)
    work = {w: sum(0.5 if i % 5 == 4 else 1.0 for i, d in enumerate(drawn) if d == w) for w in set(drawn)}
    assert FjORD(model, initial_params(model)).step_widths(ins, client) == pytest.approx(work)  # 5th: 5 of 10


def test_train_ordered_is_deterministic_given_the_seed():
    model = tiny_model()
    x, y = blobs(40, seed=2)
    a, _ = train_ordered(model, _ins(model, 1.0, [0.2, 0.6, 1.0]), x, y)
    b, _ = train_ordered(model, _ins(model, 1.0, [0.2, 0.6, 1.0]), x, y)
    c, _ = train_ordered(model, _ins(model, 1.0, [0.2, 0.6, 1.0], seed=12), x, y)
    assert all(np.array_equal(a[k], b[k]) for k in a)
    assert any(not np.array_equal(a[k], c[k]) for k in a)


def test_self_distillation_loss_and_teacher_update():
    model = tiny_model()
    x, y = blobs(16, seed=3)
    ins = _ins(model, 0.6, [0.2], kd=True, batch_size=16, lr=0.0)
    same, metrics = train_ordered(model, ins, x, y)
    teacher = model.build(model.static(0.6).arch)
    teacher.load_state_dict({k: torch.from_numpy(v) for k, v in ins.parameters.items()})
    student = model.build(model.static(0.2).arch)
    prefix = model.extract(ins.parameters, model.static(0.2))
    student.load_state_dict({k: torch.from_numpy(v) for k, v in prefix.items()})
    with torch.no_grad():
        t = teacher(torch.from_numpy(x))
        s = student(torch.from_numpy(x))
        pt = torch.softmax(t, 1)
        expected = (
            torch.nn.functional.cross_entropy(t, torch.from_numpy(y))
            + (pt * (torch.log(pt) - torch.log_softmax(s, 1))).sum(1).mean()
        )
    assert metrics["loss"] == pytest.approx(float(expected), rel=1e-5)
    assert all(np.array_equal(same[k], ins.parameters[k]) for k in same)  # lr 0
    # with a learning rate the teacher's cross-entropy moves weights outside the 0.2 prefix
    trained, _ = train_ordered(model, replace(ins, config={**ins.config, "lr": 0.2}), x, y)
    assert not np.array_equal(trained["fc1.weight"][2:], ins.parameters["fc1.weight"][2:])
    plain, _ = train_ordered(model, replace(ins, config={**ins.config, "lr": 0.2, "kd": False}), x, y)
    assert np.array_equal(plain["fc1.weight"][2:], ins.parameters["fc1.weight"][2:])


def test_train_ordered_on_lstm_gate_blocks():
    model = get_model("fjord-rnn")
    sub = model.static(0.4)
    torch.manual_seed(0)
    params = model.extract({k: v.detach().numpy() for k, v in model.build().state_dict().items()}, sub)
    rng = np.random.default_rng(0)
    x = rng.integers(0, 84, (6, 80))
    y = rng.integers(0, 84, 6)
    ins = TrainIns("c0", sub, params, {"epochs": 1, "batch_size": 6, "lr": 0.5, "seed": 1, "widths": [0.2]})
    trained, _ = train_ordered(model, ins, x, y)
    small = model.static(0.2)  # 26 of the 52 units kept by capacity 0.4
    h = small.arch.sizes[0]
    w = trained["lstm1.weight_ih_l0"]  # (4 * 52, 8): gate blocks i, f, g, o
    old = params["lstm1.weight_ih_l0"]
    for block in range(4):
        rows = slice(block * 52, block * 52 + h)
        rest = slice(block * 52 + h, (block + 1) * 52)
        assert not np.array_equal(w[rows], old[rows])
        assert np.array_equal(w[rest], old[rest])


def test_end_to_end_with_tiers_learns_every_width():
    model = tiny_model()
    strategy = FjORD(model, initial_params(model), local={"epochs": 2, "batch_size": 10, "lr": 0.3})
    clients = [ClientSpec("c0", 30, 1.0), ClientSpec("c1", 30, 0.6), ClientSpec("c2", 30, 0.2)]
    x_test, y_test = learn_blobs(strategy, clients, 5)
    for width in (1.0, 0.6, 0.4):
        assert accuracy(strategy, x_test, y_test, width=width) > 0.85


def test_train_ordered_reads_an_old_train_config_p_max_as_capacity():
    model = tiny_model()
    x, y = blobs(24, seed=0)
    ins = _ins(model, 0.4, [])
    old = replace(ins, config={k: v for k, v in ins.config.items() if k != "widths"} | {"p_max": 0.4})
    _, metrics = train_ordered(model, old, x, y)
    assert metrics["mean_width"] == pytest.approx(0.4)  # every step at the capacity, not the default 1
    _, current = train_ordered(model, replace(old, config={**ins.config, "capacity": 0.4}), x, y)
    assert current["mean_width"] == pytest.approx(0.4)
