"""FedDrop maths (fl/maths/feddrop.py) against hand-worked values from the paper's equations."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import nn

from exporters.flops import count
from exporters.userinput import InputError
from exporters.zoo import ZooModel, get_model
from exporters.zoo.common import chain_layouts
from fl.maths import feddrop as fd


class TinyNet(nn.Module):
    """conv 3x3 pad 1 (1 -> a) -> ReLU -> conv 3x3 pad 1 (a -> b) -> ReLU -> flatten -> dense 3, on 1x4x4."""

    def __init__(self, group_sizes):
        super().__init__()
        self.conv1 = nn.Conv2d(1, group_sizes["conv1"], 3, padding=1)
        self.conv2 = nn.Conv2d(group_sizes["conv1"], group_sizes["conv2"], 3, padding=1)
        self.fc = nn.Linear(group_sizes["conv2"] * 16, 3)

    def forward(self, x):
        x = torch.relu(self.conv1(x))
        x = torch.relu(self.conv2(x))
        return self.fc(torch.flatten(x, 1))


def tiny_model() -> ZooModel:
    return ZooModel(
        name="tiny-feddrop",
        paper="test",
        groups=(("conv1", 2), ("conv2", 2)),
        builder=TinyNet,
        layouts=chain_layouts([("conv1", "conv1"), ("conv2", "conv2")], [("fc", None)], 16),
        input_shape=(1, 4, 4),
        input_dtype="float32",
        num_classes=3,
    )


# Appendix B eq. 10 on the tiny net, by hand (a, b: mean keep of conv1, conv2; H = W = 4):
#   conv1: 2 * (C1 a (9 * 1 + 1) * 16) with C1 = 2           = 640 a
#   conv2: 2 * (C2 b (9 * C1 a + 1) * 16) with C1 = C2 = 2    = 1152 a b + 64 b
#   fc:    2 * (3 * (32 b) + 3)   (dense output, one add per output) = 192 b + 6
def hand_flops(a: float, b: float) -> float:
    return 640 * a + 1152 * a * b + 64 * b + 192 * b + 6


def test_flops_model_matches_eq10_by_hand():
    fm = fd.flops_model(tiny_model())
    assert fm.dense == pytest.approx(2054.0)
    assert fm.flops(np.array([0.5, 0.25])) == pytest.approx(hand_flops(0.5, 0.25))
    assert fm.flops(np.array([1.0, 0.1])) == pytest.approx(hand_flops(1.0, 0.1))
    grad = fm.gradient(np.array([0.5, 0.25]))
    assert grad == pytest.approx([640 + 1152 * 0.25, 1152 * 0.5 + 256])


def test_training_convention_is_more_and_dense_equals_exporters_count():
    # exporters.flops by hand for the weighted layers (forward: 2 MACs + one bias add per output;
    # backward: 2 MACs for the weights, 2 MACs for the input except in the first layer, one add per
    # output for the bias):
    #   conv1: MACs 32 * 9 = 288   -> 608 + 576 + 32 = 1216
    #   conv2: MACs 32 * 18 = 576  -> 1184 + 1152 + 1152 + 32 = 3520
    #   fc:    MACs 3 * 32 = 96    -> 195 + 192 + 192 + 3 = 582
    model = tiny_model()
    train = fd.flops_model(model, "training")
    paper = fd.flops_model(model, "paper")
    assert train.dense == pytest.approx(1216 + 3520 + 582)
    assert train.dense > paper.dense

    def counted(rate: float) -> int:  # the exporters' count of the conv and linear layers only (no ReLU)
        layers = count(model, model.arch(rate)).layers
        return sum(layer.train_flops for layer in layers if layer.kind in ("conv", "linear"))

    assert train.dense == counted(1.0)
    # keeping half of each layer's channels is the width-0.5 sub-model: one channel per layer
    assert train.flops(np.array([0.5, 0.5])) == pytest.approx(counted(0.5))
    with pytest.raises(InputError, match="convention"):
        fd.flops_model(model, "nonsense")


def test_budget_gap_eq5_averages_clients():
    fm = fd.flops_model(tiny_model())
    keep = np.array([[1.0, 1.0, 0.5, 0.5], [0.5, 0.5, 0.5, 0.5]])  # client 0: a=1, b=.5; client 1: a=b=.5
    expected = 0.6 - (hand_flops(1, 0.5) + hand_flops(0.5, 0.5)) / 2 / 2054
    assert fd.budget_gap(fm, keep, 0.6) == pytest.approx(expected)


def test_uniform_keep_closed_form_solves_g_zero():
    fm = fd.flops_model(tiny_model())
    # 1152 p^2 + 896 p + 6 = r * 2054
    r = 0.5
    p_hand = (-896 + math.sqrt(896**2 + 4 * 1152 * (r * 2054 - 6))) / (2 * 1152)
    p = fd.uniform_keep(fm, r)
    assert p == pytest.approx(p_hand, rel=1e-12)
    assert fd.budget_gap(fm, np.full((3, 4), p), r) == pytest.approx(0.0, abs=1e-12)
    assert fd.uniform_keep(fm, 1.0) == pytest.approx(1.0)
    # only conv2 dropped: 640 + 6 + (1152 + 256) p = r * 2054
    p2 = fd.uniform_keep(fm, r, sites=[False, True])
    assert p2 == pytest.approx((r * 2054 - 646) / 1408)


@pytest.mark.parametrize("budget", [0.0, 1.5, float("nan"), 0.001])
def test_uniform_keep_rejects_bad_budgets(budget):
    with pytest.raises(InputError):
        fd.uniform_keep(fd.flops_model(tiny_model()), budget)


def test_zoo_paper_widths_agree_with_the_closed_form():
    fm = fd.flops_model(get_model("feddrop-vgg9"))
    assert round(fd.uniform_keep(fm, 0.5), 2) == 0.71
    assert round(fd.uniform_keep(fm, 0.25), 2) == 0.50


def test_modified_he_init_variance_is_2p_over_fan_in():
    model = get_model("feddrop-lenet")
    params = {k: v.detach().numpy() for k, v in model.build().state_dict().items()}
    out = fd.modified_he_init(model, params, {"conv2": 0.7, "fc1": 0.4}, np.random.default_rng(0))
    w = out["conv2.weight"]  # (64, 32, 5, 5): fan-in 800, 51200 samples
    assert w.var() == pytest.approx(2 * 0.7 / 800, rel=0.03)
    assert abs(w.mean()) < 3 * math.sqrt(2 * 0.7 / 800 / w.size)
    assert out["fc1.weight"].var() == pytest.approx(2 * 0.4 / 256, rel=0.03)
    assert not out["conv2.bias"].any()
    np.testing.assert_array_equal(out["conv1.weight"], params["conv1.weight"])  # not a listed group
    np.testing.assert_array_equal(out["fc2.weight"], params["fc2.weight"])  # classifier


def test_sync_thresholds_are_shared_and_per_step():
    a = fd.sync_thresholds(7, 3, [4, 5])
    b = fd.sync_thresholds(7, 3, [4, 5])
    c = fd.sync_thresholds(7, 4, [4, 5])
    assert [x.shape for x in a] == [(4,), (5,)]
    for x, y in zip(a, b, strict=True):
        np.testing.assert_array_equal(x, y)
    assert not np.array_equal(a[0], c[0])
    assert all(((x >= 0) & (x < 1)).all() for x in a)


def test_keep_relation_and_inverted_scaling():
    t = [np.array([0.1, 0.5, 0.9])]
    p = [np.array([0.5, 0.5, 0.95])]
    (d,) = fd.keep_masks(t, p)
    np.testing.assert_array_equal(d, [True, False, True])  # keep iff t < p (eq. 3)
    (s,) = fd.inverted_scales([d], p)
    np.testing.assert_allclose(s, [2.0, 0.0, 1 / 0.95])


def test_synced_masks_are_nested_across_clients():
    # the same t for every client: a client with larger p keeps a superset (eq. 4 correlation)
    t = fd.sync_thresholds(1, 0, [1000])
    low, high = fd.keep_masks(t, [np.full(1000, 0.3)])[0], fd.keep_masks(t, [np.full(1000, 0.6)])[0]
    assert np.all(high[low])
    assert 0.25 < low.mean() < 0.35 and 0.55 < high.mean() < 0.65


def test_expected_and_sampled_flops_agree_as_in_table5():
    model = get_model("feddrop-vgg9")
    fm = fd.flops_model(model, "training")
    rng = np.random.default_rng(0)
    keep = fd.split_channels(rng.uniform(0.2, 1.0, sum(model.group_sizes)), model.group_sizes)
    expected = float(fm.flops(np.array([k.mean() for k in keep])))
    sampled = [
        float(fm.flops(np.array([m.mean() for m in fd.keep_masks(fd.sync_thresholds(3, s, model.group_sizes), keep)])))
        for s in range(2000)
    ]
    assert np.mean(sampled) == pytest.approx(expected, rel=5e-3)
    assert np.std(sampled) > 0  # the draws do vary


def test_neuron_vectors_collect_each_channels_own_weights():
    model = tiny_model()
    params = {k: v.detach().numpy() for k, v in model.build().state_dict().items()}
    vec = fd.neuron_vectors(model, params, "conv1")
    assert vec.shape == (2, 10)  # 1*3*3 weights + bias
    np.testing.assert_array_equal(vec[1, :9], params["conv1.weight"][1].ravel())
    assert vec[1, 9] == params["conv1.bias"][1]


def test_similarity_by_hand():
    # one channel, two clients: delta_0 = (1, 2), delta_1 = (3, -1)
    gram = fd.channel_gram([np.array([[[1.0, 2.0]], [[3.0, -1.0]]])])
    np.testing.assert_allclose(gram, [[[5.0, 1.0], [1.0, 10.0]]])
    s = fd.similarity(gram, np.array([0.25, 0.75]), np.array([[0.5], [0.8]]))
    # S_ij = lambda_i lambda_j max(p_i, p_j) <d_i, d_j>
    np.testing.assert_allclose(s[0], [[0.0625 * 0.5 * 5, 0.1875 * 0.8], [0.1875 * 0.8, 0.5625 * 0.8 * 10]])


def test_make_psd_shifts_by_the_minimum_eigenvalue():
    s = np.array([[[1.0, 2.0], [2.0, 1.0]], [[2.0, 0.0], [0.0, 1.0]]])  # eigenvalues (-1, 3) and (1, 2)
    out = fd.make_psd(s)
    np.testing.assert_allclose(out[0], [[2.0, 2.0], [2.0, 2.0]])
    np.testing.assert_allclose(out[1], s[1])


def test_pair_weights_rewrite_the_max_objective():
    s = np.array([[[1.0, 0.5], [0.5, 2.0]]])
    q = np.array([[0.5, 0.25]])
    u = fd.pair_weights(s, fd.rank_keys(q, np.arange(2)))
    # 1/0.5 + 2 * 0.5 / max(0.5, 0.25) + 2/0.25 = 12
    assert (u / q).sum() == pytest.approx(12.0)
    rng = np.random.default_rng(1)
    s = rng.normal(size=(5, 4, 4))
    s = s + s.transpose(0, 2, 1)
    q = rng.uniform(0.1, 1, (5, 4))
    q[0, 1] = q[0, 2]  # a tie
    direct = sum(s[n, i, j] / max(q[n, i], q[n, j]) for n in range(5) for i in range(4) for j in range(4))
    u = fd.pair_weights(s, fd.rank_keys(q, rng.permutation(4)))
    assert (u / q).sum() == pytest.approx(direct, rel=1e-6)


def _random_psd(n: int, c: int, seed: int) -> np.ndarray:
    g = np.random.default_rng(seed).normal(size=(n, c, 3))
    return fd.make_psd(np.einsum("nif,njf->nij", g, g) - 0.5)


def test_optimiser_keeps_budget_and_decreases_objective_every_step():
    model = tiny_model()
    fm = fd.flops_model(model)
    p = fd.uniform_keep(fm, 0.5)
    s = _random_psd(4, 3, 0)
    found = fd.optimise_keep(s, np.full((3, 4), p), fm, 0.5, iterations=300, tol=0.0)
    assert found.iterations > 10
    assert np.all(found.gap > 0)  # feasible at every recorded step
    assert np.all(np.diff(found.objective) <= 1e-12)
    assert found.objective[-1] < found.objective[0]
    assert np.all((found.keep >= fd.DEFAULT_MIN_KEEP) & (found.keep <= 1.0))
    assert fd.budget_gap(fm, found.keep, 0.5) == pytest.approx(found.gap[-1])


def test_optimiser_raises_keep_where_clients_agree():
    # channel 0 of conv2: both clients move the same way; channel 1: opposite ways
    fm = fd.flops_model(tiny_model())
    s = np.zeros((4, 2, 2))
    s[:2] = np.eye(2) * 1e-3
    s[2] = [[1.0, 1.0], [1.0, 1.0]]
    s[3] = [[1.0, -1.0], [-1.0, 1.0]]
    p = fd.uniform_keep(fm, 0.5)
    found = fd.optimise_keep(s, np.full((2, 4), p), fm, 0.5, iterations=2000)
    assert found.keep[:, 2].max() > found.keep[:, 3].max()


def test_optimiser_respects_fixed_channels_and_shapes():
    fm = fd.flops_model(tiny_model())
    s = _random_psd(4, 2, 3)
    free = np.array([False, False, True, True])
    found = fd.optimise_keep(s, np.full((2, 4), 0.6), fm, 0.9, iterations=50, free=free)
    np.testing.assert_array_equal(found.keep[:, :2], 0.6)
    with pytest.raises(InputError, match="shape"):
        fd.optimise_keep(s[:3], np.full((2, 4), 0.6), fm, 0.9)


# --------------------------------------------------------------------------- per-client budgets


def _hand_root(r: float) -> float:
    # 1152 p^2 + 896 p + 6 = r * 2054 (every channel at p), positive root, capped at 1
    return min(1.0, (-896 + math.sqrt(896**2 + 4 * 1152 * (r * 2054 - 6))) / (2 * 1152))


def test_client_gaps_are_each_clients_own_budget_minus_ratio():
    fm = fd.flops_model(tiny_model())
    keep = np.array([[1.0, 1.0, 0.5, 0.5], [0.5, 0.5, 0.5, 0.5]])
    want = [0.9 - hand_flops(1, 0.5) / 2054, 0.4 - hand_flops(0.5, 0.5) / 2054]
    np.testing.assert_allclose(fd.client_gaps(fm, keep, np.array([0.9, 0.4])), want, rtol=1e-12)
    np.testing.assert_allclose(fd.budget_gap(fm, keep, np.array([0.9, 0.4])), want, rtol=1e-12)
    assert isinstance(fd.budget_gap(fm, keep, 0.6), float)  # the scalar path is eq. 5 unchanged


def test_uniform_keep_per_client_roots_plug_back_to_zero_gaps():
    fm = fd.flops_model(tiny_model())
    r = np.array([1.0, 0.5, 0.3])
    p = fd.uniform_keep(fm, r)
    np.testing.assert_allclose(p, [1.0, _hand_root(0.5), _hand_root(0.3)], rtol=1e-12)
    gaps = fd.client_gaps(fm, np.repeat(p[:, None], 4, axis=1), r)
    np.testing.assert_allclose(gaps, 0.0, atol=1e-12)
    for bad in (np.array([0.5, 1.2]), np.array([0.5, np.nan]), np.array([0.5, 0.001])):
        with pytest.raises(InputError):
            fd.uniform_keep(fm, bad)


def test_vector_budget_keeps_every_client_feasible_at_every_step():
    fm = fd.flops_model(tiny_model())
    r = np.array([0.8, 0.5, 0.3])
    p = fd.uniform_keep(fm, r)  # on each client's own boundary: the start must be scaled down
    s = _random_psd(4, 3, 0)
    found = fd.optimise_keep(s, np.repeat(p[:, None], 4, axis=1), fm, r, iterations=300, tol=0.0)
    assert found.iterations > 10
    assert found.gap.shape == (found.iterations + 1, 3)
    assert np.all(found.gap > 0)  # every g_c at every recorded step
    assert np.all(np.diff(found.objective) <= 1e-12)
    assert found.objective[-1] < found.objective[0]
    np.testing.assert_allclose(fd.client_gaps(fm, found.keep, r), found.gap[-1], rtol=1e-9)
    means = found.keep.reshape(3, 2, 2).mean(axis=2)  # (client, group): a, b
    ratios = [hand_flops(a, b) / 2054 for a, b in means]
    assert all(ratio < budget for ratio, budget in zip(ratios, r, strict=True))


def test_infeasible_start_is_scaled_per_client():
    fm = fd.flops_model(tiny_model())
    r = np.array([0.9, 0.3])
    found = fd.optimise_keep(_random_psd(4, 2, 1), np.ones((2, 4)), fm, r, iterations=0)
    assert np.all(found.gap[0] > 0)
    # each client scaled by its own factor: the 0.3 client much lower than the 0.9 one
    assert found.keep[1].max() < _hand_root(0.3) < _hand_root(0.9) * 0.999 <= found.keep[0].min() + 1e-12


def test_unconstrained_client_reaches_full_keep_while_tight_one_stays_in_budget():
    # S = identity per channel: U_i^n = S_ii = 1 > 0, so the objective falls as any q rises. Client 0
    # (r = 1) has no barrier: its q rises to the box bound 1; client 1 (r = 0.3) stays within 0.3.
    fm = fd.flops_model(tiny_model())
    s = np.tile(np.eye(2), (4, 1, 1))
    r = np.array([1.0, 0.3])
    start = np.repeat(fd.uniform_keep(fm, r)[:, None], 4, axis=1)
    found = fd.optimise_keep(s, start, fm, r, iterations=2000)
    np.testing.assert_array_equal(found.keep[0], 1.0)
    a, b = found.keep[1].reshape(2, 2).mean(axis=1)
    assert hand_flops(a, b) / 2054 <= 0.3
    assert np.all(found.gap[:, 1] > 0)


def test_vector_budget_shape_and_range_errors():
    fm = fd.flops_model(tiny_model())
    s = _random_psd(4, 2, 3)
    with pytest.raises(InputError, match="do not fit"):
        fd.optimise_keep(s, np.full((2, 4), 0.6), fm, np.array([0.5, 0.5, 0.5]))
    with pytest.raises(InputError, match="outside"):
        fd.optimise_keep(s, np.full((2, 4), 0.6), fm, np.array([0.5, 1.5]))
    with pytest.raises(InputError, match="client 1"):
        fd.optimise_keep(s, np.full((2, 4), 0.6), fm, np.array([0.5, 0.002]))
