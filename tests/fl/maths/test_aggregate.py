import numpy as np
import pytest
from torch import nn

import fl.maths.aggregate as aggregate
from exporters.arch import Arch, Dim, SubModel
from exporters.userinput import InputError
from exporters.zoo import ZooModel
from fl.maths.aggregate import full_index, holder_counts, runs, selective_average, updates_from_results
from fl.records import TrainRes


def _model(groups, layouts):
    return ZooModel(
        name="hand",
        paper="test",
        groups=groups,
        builder=lambda group_sizes: nn.Identity(),
        layouts=layouts,
        input_shape=(1,),
        input_dtype="float32",
        num_classes=2,
    )


def _sub(model, *indices):
    arrays = tuple(np.array(i, dtype=np.int64) for i in indices)
    return SubModel(Arch(model.name, tuple(len(i) for i in indices)), arrays)


# A conv with 3 channels (group "c") feeding, through an NCHW flatten of 2x2 maps, a linear layer of 2 outputs.
CONV = _model(
    (("c", 3),),
    {
        "conv.weight": (Dim("c"), None, None, None),  # (3, 1, 2, 2)
        "conv.bias": (Dim("c"),),  # (3,)
        "fc.weight": (None, Dim("c", inner=4)),  # (2, 12): channel c owns columns 4c .. 4c+3
        "fc.bias": (None,),  # (2,)
    },
)


def _conv_global():
    return {
        "conv.weight": np.full((3, 1, 2, 2), -1.0, np.float32),
        "conv.bias": np.array([-1.0, -2.0, -3.0], np.float32),
        "fc.weight": np.full((2, 12), -1.0, np.float32),
        "fc.bias": np.array([-1.0, -1.0], np.float32),
    }


def _conv_update(n_channels, value):
    return {
        "conv.weight": np.full((n_channels, 1, 2, 2), value, np.float32),
        "conv.bias": np.full((n_channels,), value, np.float32),
        "fc.weight": np.full((2, 4 * n_channels), value, np.float32),
        "fc.bias": np.full((2,), value, np.float32),
    }


def test_each_weight_averaged_over_its_holders_only_with_flatten():
    a = _sub(CONV, [0, 2])
    b = _sub(CONV, [2])
    new = selective_average(CONV, _conv_global(), [(a, _conv_update(2, 1.0), 1.0), (b, _conv_update(1, 4.0), 1.0)])
    # channel 0: only A (1); channel 1: nobody (unchanged); channel 2: (1 + 4) / 2
    assert new["conv.bias"].tolist() == [1.0, -2.0, 2.5]
    assert np.all(new["conv.weight"][0] == 1.0) and np.all(new["conv.weight"][1] == -1.0)
    assert np.all(new["conv.weight"][2] == 2.5)
    expected_fc = np.array([1.0] * 4 + [-1.0] * 4 + [2.5] * 4, np.float32)
    assert new["fc.weight"].tolist() == [expected_fc.tolist()] * 2
    assert new["fc.bias"].tolist() == [2.5, 2.5]  # both clients hold the classifier bias


def test_weights_enter_the_average():
    a = _sub(CONV, [0, 2])
    b = _sub(CONV, [2])
    new = selective_average(CONV, _conv_global(), [(a, _conv_update(2, 1.0), 3.0), (b, _conv_update(1, 4.0), 1.0)])
    assert new["conv.bias"].tolist() == [1.0, -2.0, 1.75]  # (3*1 + 1*4) / 4
    assert new["fc.weight"][0, 8:].tolist() == [1.75] * 4
    assert new["fc.weight"][0, :4].tolist() == [1.0] * 4  # a single holder: its value whatever the weight


def test_sub_tensor_order_follows_sorted_global_indices():
    a = _sub(CONV, [0, 2])
    update = _conv_update(2, 0.0)
    update["conv.bias"] = np.array([10.0, 30.0], np.float32)
    update["fc.weight"] = np.arange(16, dtype=np.float32).reshape(2, 8)
    new = selective_average(CONV, _conv_global(), [(a, update, 1.0)])
    assert new["conv.bias"].tolist() == [10.0, -2.0, 30.0]
    assert new["fc.weight"][1].tolist() == [8, 9, 10, 11, -1, -1, -1, -1, 12, 13, 14, 15]


ROLL = _model((("h", 8),), {"w": (Dim("h"), Dim("h")), "b": (Dim("h"),)})


def test_wrapped_window_scatters_to_its_positions():
    sub = _sub(ROLL, [0, 6, 7])  # FedRolex window of round 6, K = 8, width 3
    glob = {"w": np.zeros((8, 8), np.float32), "b": np.zeros(8, np.float32)}
    w = np.arange(9, dtype=np.float32).reshape(3, 3) + 1
    new = selective_average(ROLL, glob, [(sub, {"w": w, "b": np.array([5.0, 6.0, 7.0], np.float32)}, 1.0)])
    assert new["b"].tolist() == [5, 0, 0, 0, 0, 0, 6, 7]
    expected = np.zeros((8, 8))
    expected[np.ix_([0, 6, 7], [0, 6, 7])] = w
    assert np.array_equal(new["w"], expected)


LSTM = _model((("h", 3),), {"w_ih": (Dim("h", blocks=4), None)})  # (12, 2): gate blocks i, f, g, o


def test_lstm_gate_blocks_move_together():
    sub = _sub(LSTM, [1])
    glob = {"w_ih": np.zeros((12, 2), np.float32)}
    upd = {"w_ih": np.array([[1, 1], [2, 2], [3, 3], [4, 4]], np.float32)}
    new = selective_average(LSTM, glob, [(sub, upd, 1.0)])
    assert new["w_ih"][:, 0].tolist() == [0, 1, 0, 0, 2, 0, 0, 3, 0, 0, 4, 0]


WIDE = _model((("h", 200),), {"b": (Dim("h"),), "w": (None, Dim("h"))})


def test_fragmented_index_sets_take_the_fancy_path_correctly():
    even = _sub(WIDE, list(range(0, 200, 2)))  # 100 runs: more than MAX_SLICE_BLOCKS
    mixed = _sub(WIDE, list(range(0, 200, 4)) + list(range(1, 200, 4)))
    glob = {"b": np.full(200, -1.0, np.float32), "w": np.full((2, 200), -1.0, np.float32)}
    new = selective_average(
        WIDE,
        glob,
        [
            (even, {"b": np.full(100, 2.0, np.float32), "w": np.full((2, 100), 2.0, np.float32)}, 1.0),
            (mixed, {"b": np.full(100, 6.0, np.float32), "w": np.full((2, 100), 6.0, np.float32)}, 1.0),
        ],
    )
    expected = np.full(200, -1.0)
    expected[0::4] = 4.0  # held by both
    expected[2::4] = 2.0  # even only
    expected[1::4] = 6.0  # mixed only
    assert np.array_equal(new["b"], expected)
    assert np.array_equal(new["w"][1], expected)


def test_slice_and_fancy_paths_agree(monkeypatch):
    rng = np.random.default_rng(0)
    subs = [_sub(ROLL, sorted(rng.choice(8, k, replace=False).tolist())) for k in (2, 5, 5, 8)]
    glob = {"w": rng.normal(size=(8, 8)).astype(np.float32), "b": rng.normal(size=8).astype(np.float32)}
    updates = [
        (
            s,
            {
                "w": rng.normal(size=(s.arch.sizes[0],) * 2).astype(np.float32),
                "b": rng.normal(size=s.arch.sizes[0]).astype(np.float32),
            },
            float(i + 1),
        )
        for i, s in enumerate(subs)
    ]
    sliced = selective_average(ROLL, glob, updates)
    monkeypatch.setattr(aggregate, "MAX_SLICE_BLOCKS", 0)
    fancy = selective_average(ROLL, glob, updates)
    for k in glob:
        np.testing.assert_allclose(sliced[k], fancy[k], rtol=1e-6)


def test_identical_index_sets_are_summed_before_scattering():
    sub = _sub(ROLL, [1, 2])
    glob = {"w": np.zeros((8, 8), np.float32), "b": np.zeros(8, np.float32)}
    ups = [
        (sub, {"w": np.full((2, 2), v, np.float32), "b": np.full(2, v, np.float32)}, w)
        for v, w in ((1.0, 1.0), (2.0, 1.0), (10.0, 2.0))
    ]
    new = selective_average(ROLL, glob, ups)
    assert new["b"].tolist() == [0, 23 / 4, 23 / 4, 0, 0, 0, 0, 0]  # (1 + 2 + 20) / 4


def test_nobody_and_zero_weight_leave_the_global_unchanged():
    glob = _conv_global()
    same = selective_average(CONV, glob, [])
    zero = selective_average(CONV, glob, [(_sub(CONV, [0, 1, 2]), _conv_update(3, 9.0), 0.0)])
    for k in glob:
        assert np.array_equal(same[k], glob[k]) and np.array_equal(zero[k], glob[k])
        assert same[k] is not glob[k]


def test_bad_weight_and_bad_shape_are_input_errors():
    sub = _sub(CONV, [0, 2])
    with pytest.raises(InputError, match="-1"):
        selective_average(CONV, _conv_global(), [(sub, _conv_update(2, 1.0), -1.0)])
    with pytest.raises(InputError, match="conv.bias"):
        bad = _conv_update(2, 1.0)
        bad["conv.bias"] = np.zeros(3, np.float32)
        selective_average(CONV, _conv_global(), [(sub, bad, 1.0)])


def test_holder_counts_and_full_index():
    a = _sub(CONV, [0, 2])
    b = _sub(CONV, [2])
    counts = holder_counts(CONV, _conv_global(), [a, b])
    assert counts["conv.bias"].tolist() == [1, 0, 2]
    assert counts["fc.weight"][0].tolist() == [1] * 4 + [0] * 4 + [2] * 4
    assert counts["fc.bias"].tolist() == [2, 2]
    glob = np.arange(24).reshape(2, 12)
    assert glob[full_index(CONV, a, "fc.weight", (2, 12))][0].tolist() == [0, 1, 2, 3, 8, 9, 10, 11]


def test_runs():
    assert runs(np.array([2, 3, 4, 9])) == [(0, 2, 3), (3, 9, 1)]
    assert runs(np.array([0, 6, 7])) == [(0, 0, 1), (1, 6, 2)]
    assert runs(np.array([], dtype=np.int64)) == []


def test_updates_from_results_weighting():
    sub = _sub(CONV, [0])
    res = [TrainRes("c0", sub, {}, 30), TrainRes("c1", sub, {}, 10)]
    assert [w for _, _, w in updates_from_results(res, weighted=True)] == [30.0, 10.0]
    assert [w for _, _, w in updates_from_results(res, weighted=False)] == [1.0, 1.0]
