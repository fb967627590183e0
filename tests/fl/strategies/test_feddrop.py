"""FedDrop strategy and SyncDrop trainer (fl/strategies/feddrop.py)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from exporters.userinput import InputError
from exporters.zoo import get_model
from fl.client import build_module, get_trainer, module_params, run_local, train_plain
from fl.maths import feddrop as fd
from fl.records import ClientSpec, TrainIns, TrainRes
from fl.strategies import strategy_class
from fl.strategies.feddrop import FedDrop, _SyncDrop, train_syncdrop
from tests.fl.maths.test_feddrop import tiny_model


def _initial(model):
    torch.manual_seed(0)
    return module_params(model.build())


def _data(n=12, seed=0):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(n, 1, 4, 4)).astype(np.float32), rng.integers(0, 3, n)


def _ins(model, params, keep, sync_seed=5, seed=1, **extra):
    config = {"epochs": 1, "batch_size": 4, "lr": 0.1, "seed": seed, "sync_seed": sync_seed, "keep": keep, **extra}
    return TrainIns("c0", model.static(1.0), params, config)


def test_registered_names_resolve():
    assert strategy_class("feddrop") is FedDrop
    assert get_trainer("syncdrop") is train_syncdrop


def test_hooks_apply_inverted_masks_in_training_only():
    model = tiny_model()
    params = _initial(model)
    module = build_module(model, model.full_arch(), params)
    drop = _SyncDrop(module, model, [True, True])
    scales = [np.array([2.0, 0.0]), np.array([0.0, 1.25])]
    drop.set(scales)
    x = torch.as_tensor(_data(3)[0])
    module.train()
    got = module(x)
    conv = torch.nn.functional.conv2d
    with torch.no_grad():  # the hooked modules' maths by hand, without the modules
        h = conv(x, module.conv1.weight, module.conv1.bias, padding=1)
        h = torch.relu(h * torch.tensor([2.0, 0.0]).view(1, 2, 1, 1))
        h = conv(h, module.conv2.weight, module.conv2.bias, padding=1)
        h = torch.relu(h * torch.tensor([0.0, 1.25]).view(1, 2, 1, 1))
        want = module.fc(torch.flatten(h, 1))
    torch.testing.assert_close(got, want)
    module.eval()  # no dropout at inference
    dense = build_module(model, model.full_arch(), params).eval()
    torch.testing.assert_close(module(x), dense(x))


def test_keep_one_everywhere_is_plain_training():
    model = tiny_model()
    params = _initial(model)
    x, y = _data()
    keep = {"conv1": [1.0, 1.0], "conv2": [1.0, 1.0]}
    drop_params, metrics = train_syncdrop(model, _ins(model, params, keep), x, y)
    plain_params, _ = train_plain(model, _ins(model, params, keep), x, y)
    for name in plain_params:
        np.testing.assert_allclose(drop_params[name], plain_params[name], rtol=1e-6, atol=1e-7)
    assert metrics["sampled_train_flops"] == pytest.approx(metrics["dense_train_flops"])
    assert metrics["kept_fraction"] == 1.0


def test_always_dropped_channel_is_not_trained():
    model = tiny_model()
    params = _initial(model)
    x, y = _data()
    keep = {"conv1": [1.0, 1e-12], "conv2": [1.0, 1.0]}
    out, _ = train_syncdrop(model, _ins(model, params, keep), x, y)
    np.testing.assert_array_equal(out["conv1.weight"][1], params["conv1.weight"][1])
    assert not np.array_equal(out["conv1.weight"][0], params["conv1.weight"][0])


def test_clients_share_masks_and_report_flops():
    model = tiny_model()
    params = _initial(model)
    keep = {"conv1": [0.5, 0.5], "conv2": [0.5, 0.5]}
    _, m1 = train_syncdrop(model, _ins(model, params, keep, seed=1), *_data(12, 0))
    _, m2 = train_syncdrop(model, _ins(model, params, keep, seed=2), *_data(12, 1))
    assert m1["kept_fraction"] == m2["kept_fraction"]  # same sync seed: same draws per step
    assert m1["sampled_train_flops"] == m2["sampled_train_flops"]
    train = fd.flops_model(model, "training")
    assert m1["expected_train_flops"] == pytest.approx(float(train.flops(np.array([0.5, 0.5]))))
    assert m1["train_flops"] == pytest.approx(m1["sampled_train_flops"] * 12)
    _, m3 = train_syncdrop(model, _ins(model, params, keep, sync_seed=99), *_data(12, 0))
    assert m3["steps"] == 3.0


def test_trainer_rejects_submodels_and_bad_keep():
    model = tiny_model()
    params = _initial(model)
    x, y = _data()
    with pytest.raises(InputError, match="keep"):
        train_syncdrop(model, _ins(model, params, {"conv1": [1.5, 1.0]}), x, y)
    sub = model.static(0.5)
    bad = TrainIns("c0", sub, model.extract(params, sub), {"keep": {}})
    with pytest.raises(InputError, match="full model"):
        train_syncdrop(model, bad, x, y)


def _strategy(mode="feddrop", budget=0.5, **options):
    model = tiny_model()
    local = {"epochs": 1, "batch_size": 4, "lr": 0.1}
    return FedDrop(model, _initial(model), seed=3, local=local, mode=mode, budget=budget, iterations=200, **options)


CLIENTS = [ClientSpec("c0", 12), ClientSpec("c1", 36)]


def _results(strategy, ins, shift=(1.0, 3.0)):
    out = []
    for (cid, item), delta, n in zip(ins.items(), shift, (12, 36), strict=True):
        params = {
            k: v + np.float32(delta) * (np.arange(v.size).reshape(v.shape) % 3 - 1) for k, v in item.parameters.items()
        }
        out.append(TrainRes(cid, item.submodel, params, n, metrics={"train_flops": 10.0}))
    return out


def test_configure_sends_full_model_shared_seed_and_initial_keep():
    strategy = _strategy()
    ins = strategy.configure_round(0, CLIENTS)
    p = fd.uniform_keep(strategy.flops, 0.5)
    seeds = {i.config["sync_seed"] for i in ins.values()}
    assert len(seeds) == 1
    for item in ins.values():
        assert item.submodel.arch == strategy.model.full_arch()
        assert item.config["trainer"] == "syncdrop"
        assert item.config["keep"] == {"conv1": [p, p], "conv2": [p, p]}
    assert strategy.configure_round(1, CLIENTS)["c0"].config["sync_seed"] not in seeds


def test_aggregate_is_weighted_fedavg_and_reoptimises_keep_within_budget():
    strategy = _strategy()
    ins = strategy.configure_round(0, CLIENTS)
    results = _results(strategy, ins)
    new, metrics = strategy.aggregate_round(0, results, [])
    for name in new:
        want = (12 * results[0].parameters[name] + 36 * results[1].parameters[name]) / 48
        np.testing.assert_allclose(new[name], want, rtol=1e-5, atol=1e-6)
    # eq. 5 by hand on next round's keep: the budget minus the clients' mean FLOPs ratio, and feasible
    nxt = strategy.configure_round(1, CLIENTS)
    ratios = [_hand_ratio(nxt[cid].config["keep"]) for cid in ("c0", "c1")]
    assert metrics["budget_gap"] == pytest.approx(0.5 - np.mean(ratios), rel=1e-9)
    assert metrics["budget_gap"] > 0
    assert metrics["objective_end"] <= metrics["objective_start"]
    assert metrics["train_flops"] == 20.0
    keep = nxt["c0"].config["keep"]
    assert keep != {"conv1": [strategy.initial_keep] * 2, "conv2": [strategy.initial_keep] * 2}
    assert strategy.eval_submodels(CLIENTS)[1.0].arch == strategy.model.full_arch()


def test_unidrop_keeps_the_uniform_probability():
    strategy = _strategy("unidrop")
    ins = strategy.configure_round(0, CLIENTS)
    _, metrics = strategy.aggregate_round(0, _results(strategy, ins), [])
    assert "objective_end" not in metrics
    assert strategy.configure_round(1, CLIENTS)["c1"].config["keep"]["conv2"] == [strategy.initial_keep] * 2


def test_caldas_sends_random_unscaled_submodels():
    # budget 0.3: every client keeps p = 0.436 of each layer's 2 channels, ceil(0.87) = 1 channel
    # (at budget 0.5, ceil(2 p) = 2 keeps every channel and the rounds are FedAvg's)
    strategy = _strategy("caldas", budget=0.3)
    kept, pairs = set(), set()
    for rnd in range(8):
        old = strategy.global_state["conv1.bias"].copy()
        ins = strategy.configure_round(rnd, CLIENTS)
        for item in ins.values():
            assert item.config["trainer"] == "plain"
            assert item.submodel.arch.sizes == (1, 1)
            # the kept channel's global parameters, as they are (no dropout scaling)
            np.testing.assert_array_equal(item.parameters["conv1.bias"], old[item.submodel.indices[0]])
        c0, c1 = (int(ins[cid].submodel.indices[0][0]) for cid in ("c0", "c1"))
        kept |= {c0, c1}
        pairs.add(c0 == c1)
        new, _ = strategy.aggregate_round(rnd, _results(strategy, ins), [])
        # _results moves a kept bias by -1 (c0, 12 examples) or by -3 (c1, 36 examples); each channel
        # averages over the clients that held it, and a channel nobody held keeps its value
        want = old.astype(np.float64)
        if c0 == c1:
            want[c0] -= (12 * 1 + 36 * 3) / 48
        else:
            want[c0] -= 1
            want[c1] -= 3
        np.testing.assert_allclose(new["conv1.bias"], want, rtol=1e-6, atol=1e-6)
    assert kept == {0, 1}  # drawn at random, not the ordered prefix
    assert pairs == {True, False}  # rounds where the clients held the same channel and where not


def test_he_init_option_and_string_options():
    model = tiny_model()
    initial = _initial(model)
    off = FedDrop(model, initial, mode="feddrop", budget="0.5", he_init="false")
    np.testing.assert_array_equal(off.global_state["conv2.weight"], initial["conv2.weight"])
    on = FedDrop(model, initial, mode="feddrop", budget=0.5)
    assert not np.array_equal(on.global_state["conv2.weight"], initial["conv2.weight"])
    assert not on.global_state["conv2.bias"].any()
    with pytest.raises(InputError, match="mode"):
        FedDrop(model, initial, mode="random")
    with pytest.raises(InputError, match="boolean"):
        FedDrop(model, initial, he_init="maybe")


def test_state_round_trip_resumes_exactly():
    first = _strategy()
    ins = first.configure_round(0, CLIENTS)
    first.aggregate_round(0, _results(first, ins), [])
    state = first.state()
    second = _strategy()
    second.load_state(state)
    assert state["keep_clients"] == ["c0", "c1"]
    a, b = first.configure_round(1, CLIENTS), second.configure_round(1, CLIENTS)
    for cid in a:
        assert a[cid].config == b[cid].config
    ga, _ = first.aggregate_round(1, _results(first, a), [])
    gb, _ = second.aggregate_round(1, _results(second, b), [])
    for name in ga:
        np.testing.assert_array_equal(ga[name], gb[name])
    np.testing.assert_array_equal(first.state()["keep"], second.state()["keep"])


# --------------------------------------------------------------------------- per-client budgets


def _hand_ratio(keep_config):
    # tiny net, eq. 10 by hand (tests/fl/test_feddrop.py): a, b = mean keep of conv1, conv2
    a, b = np.mean(keep_config["conv1"]), np.mean(keep_config["conv2"])
    return (640 * a + 1152 * a * b + 64 * b + 192 * b + 6) / 2054


def _hand_root(r):
    return min(1.0, (-896 + math.sqrt(896**2 + 4 * 1152 * (r * 2054 - 6))) / (2 * 1152))


def test_budgets_option_from_json_or_dict_with_fallback():
    model = tiny_model()
    initial = _initial(model)
    from_json = FedDrop(model, initial, budget=0.5, budgets='{"c0": 0.8, "c1": 0.4}')
    from_dict = FedDrop(model, initial, budget=0.5, budgets={"c0": 0.8, "c1": 0.4})
    for strategy in (from_json, from_dict):
        assert [strategy.client_budget(c) for c in ("c0", "c1", "c9")] == [0.8, 0.4, 0.5]
    for bad, match in (('{"c0": 1.5}', "outside"), ("{c0: 1}", "JSON"), ('["c0"]', "map"), ('{"c0": "x"}', "number")):
        with pytest.raises(InputError, match=match):
            FedDrop(model, initial, budgets=bad)
    with pytest.raises(InputError, match="undroppable"):
        FedDrop(model, initial, budgets={"c0": 0.001})


def test_per_client_budgets_give_own_uniform_start_and_keep_every_client_in_budget():
    strategy = _strategy(budgets={"c0": 0.9, "c1": 0.3})
    ins = strategy.configure_round(0, CLIENTS)
    for cid, r in (("c0", 0.9), ("c1", 0.3)):  # each client's own root of g_c = 0
        np.testing.assert_allclose(ins[cid].config["keep"]["conv1"], [_hand_root(r)] * 2, rtol=1e-12)
    _, metrics = strategy.aggregate_round(0, _results(strategy, ins), [])
    assert metrics["objective_end"] <= metrics["objective_start"]
    nxt = strategy.configure_round(1, CLIENTS)
    for cid, r in (("c0", 0.9), ("c1", 0.3)):
        ratio = _hand_ratio(nxt[cid].config["keep"])
        assert ratio < r
        assert metrics["budget"][cid] == r
        assert metrics["flops_ratio"][cid] == pytest.approx(ratio, rel=1e-12)
    assert metrics["max_budget_excess"] < 0
    assert metrics["max_budget_excess"] == pytest.approx(
        max(_hand_ratio(nxt[c].config["keep"]) - r for c, r in (("c0", 0.9), ("c1", 0.3))), rel=1e-9
    )


def test_mean_budget_reports_excess_honestly():
    # the paper's mean constraint only bounds the average: report each client against the scalar budget
    strategy = _strategy()
    ins = strategy.configure_round(0, CLIENTS)
    _, metrics = strategy.aggregate_round(0, _results(strategy, ins), [])
    nxt = strategy.configure_round(1, CLIENTS)
    ratios = [_hand_ratio(nxt[c].config["keep"]) for c in ("c0", "c1")]
    assert np.mean(ratios) < 0.5
    assert metrics["max_budget_excess"] == pytest.approx(max(ratios) - 0.5, rel=1e-9)


def test_unidrop_per_client_uniform_keep_meets_each_budget():
    strategy = _strategy("unidrop", budgets={"c0": 1.0, "c1": 0.3})
    ins = strategy.configure_round(0, CLIENTS)
    assert ins["c0"].config["keep"]["conv2"] == [1.0, 1.0]
    assert _hand_ratio(ins["c1"].config["keep"]) == pytest.approx(0.3, abs=1e-12)
    _, metrics = strategy.aggregate_round(0, _results(strategy, ins), [])
    assert metrics["flops_ratio"]["c0"] == pytest.approx(1.0, abs=1e-12)
    assert metrics["max_budget_excess"] == pytest.approx(0.0, abs=1e-12)


def test_lenet_rounds_with_budgets_stay_within_each_clients_budget():
    model = get_model("feddrop-lenet")
    torch.manual_seed(0)
    initial = module_params(model.build())
    budgets = {"c0": 0.9, "c1": 0.5, "c2": 0.3}
    local = {"epochs": 1, "batch_size": 4, "lr": 0.05}
    strategy = FedDrop(model, initial, seed=1, local=local, budget=0.5, budgets=budgets, iterations=150)
    rng = np.random.default_rng(0)
    shards = {c: (rng.normal(size=(8, 1, 28, 28)).astype(np.float32), rng.integers(0, 10, 8)) for c in budgets}
    clients = [ClientSpec(c, 8) for c in budgets]
    dense = fd.flops_model(model).dense
    for rnd in range(2):
        ins = strategy.configure_round(rnd, clients)
        for cid, item in ins.items():
            means = np.array([np.mean(item.config["keep"][g]) for g in model.group_names])
            assert float(strategy.flops.flops(means)) / dense <= budgets[cid] + 1e-12
        results = [run_local(model, ins[c.cid], *shards[c.cid]) for c in clients]
        _, metrics = strategy.aggregate_round(rnd, results, [])
        assert metrics["max_budget_excess"] < 0
        assert metrics["budget"] == budgets
    assert strategy.client_keep("c0").mean() > strategy.client_keep("c2").mean()


def test_state_round_trip_with_budgets_resumes_exactly():
    first = _strategy(budgets='{"c0": 0.8, "c1": 0.35}')
    ins = first.configure_round(0, CLIENTS)
    first.aggregate_round(0, _results(first, ins), [])
    second = _strategy(budgets='{"c0": 0.8, "c1": 0.35}')
    second.load_state(first.state())
    a, b = first.configure_round(1, CLIENTS), second.configure_round(1, CLIENTS)
    for cid in a:
        assert a[cid].config == b[cid].config
    _, ma = first.aggregate_round(1, _results(first, a), [])
    _, mb = second.aggregate_round(1, _results(second, b), [])
    assert ma == mb
    np.testing.assert_array_equal(first.state()["keep"], second.state()["keep"])


def test_caldas_widths_follow_each_clients_uniform_keep():
    strategy = _strategy("caldas", budgets={"c0": 0.9, "c1": 0.3})
    ins = strategy.configure_round(0, CLIENTS)
    # p_c = 0.934 -> ceil(1.87) = 2 of 2 channels; p_c = 0.436 -> ceil(0.87) = 1
    assert ins["c0"].submodel.arch.sizes == (2, 2)
    assert ins["c1"].submodel.arch.sizes == (1, 1)


def test_convention_option_picks_the_constraint_flops_model():
    model = tiny_model()
    initial = _initial(model)
    training = FedDrop(model, initial, convention="training", budgets={"c0": 0.4})
    assert training.flops.dense == pytest.approx(fd.flops_model(model, "training").dense)
    assert training.uniform_for("c0") == pytest.approx(fd.uniform_keep(fd.flops_model(model, "training"), 0.4))
    with pytest.raises(InputError, match="convention"):
        FedDrop(model, initial, convention="nonsense")
