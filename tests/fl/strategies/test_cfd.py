import numpy as np
import pytest

from exporters.arch import Arch, Dim, make_submodel
from exporters.userinput import InputError
from exporters.zoo import ZooModel
from exporters.zoo.cfd import coded_cnn
from exporters.zoo.common import TwoConvCNNSizes
from exporters.zoo.fluid import FluidLSTMSizes, fluid_lstm
from fl.client import module_params, run_local
from fl.records import ClientFailure, ClientSpec, TrainRes
from fl.strategies import strategy_class
from fl.strategies.cfd import CodedFD

# A hand-sized model: one group of 4 neurons; w1 (4 x 2) indexed by the group on rows,
# w2 (3 x 4) on columns. Its builder is never called.
TOY = ZooModel(
    name="toy",
    paper="test",
    groups=(("h", 4),),
    builder=lambda group_sizes: None,
    layouts={"w1": (Dim("h"), None), "w2": (None, Dim("h"))},
    input_shape=(2,),
    input_dtype="float32",
    num_classes=3,
)


def toy_state():
    return {"w1": np.zeros((4, 2), np.float32), "w2": np.zeros((3, 4), np.float32)}


def toy_result(cid, neurons, value, examples=1):
    sub = make_submodel(Arch("toy", (2,)), (4,), [neurons])
    params = {"w1": np.full((2, 2), value, np.float32), "w2": np.full((3, 2), value, np.float32)}
    return TrainRes(cid, sub, params, num_examples=examples, metrics={"accuracy": value / 10, "loss": 1.0})


def small_cnn():
    return coded_cnn(TwoConvCNNSizes(conv1=8, conv2=8, hidden=32, classes=4, image=8))


def clients(n):
    return [ClientSpec(f"c{i}", 6) for i in range(n)]


def test_registered():
    assert strategy_class("cfd") is CodedFD


@pytest.mark.parametrize("code", ["gold", "constant_weight", "random"])
def test_every_client_gets_a_different_mask_of_the_right_width(code):
    model = small_cnn()
    strategy = CodedFD(model, module_params(model.build()), seed=3, code=code, width=0.5)
    ins = strategy.configure_round(0, clients(6))
    assert list(ins) == [f"c{i}" for i in range(6)]
    for g, size in enumerate(model.group_sizes):
        sets = [tuple(i.submodel.indices[g].tolist()) for i in ins.values()]
        assert all(len(s) == size // 2 for s in sets)
        assert len(set(sets)) == 6, (code, g)
    for i in ins.values():
        assert i.submodel.arch == model.arch(0.5)
        assert i.parameters["fc1.weight"].shape == (16, 4 * 2 * 2)  # 16 of 32 units; 4 of 8 channels x 2 x 2
        assert i.config["epochs"] == 1 and "seed" in i.config


def test_same_code_gives_one_mask():
    model = small_cnn()
    strategy = CodedFD(model, module_params(model.build()), code="same", width=0.25)
    ins = strategy.configure_round(2, clients(5))
    for g, size in enumerate(model.group_sizes):
        sets = {tuple(i.submodel.indices[g].tolist()) for i in ins.values()}
        assert len(sets) == 1
        assert len(next(iter(sets))) == -(-size // 4)


def test_masks_change_across_rounds_and_replay_after_restart():
    model = small_cnn()
    initial = module_params(model.build())
    a = CodedFD(model, initial, seed=1, code="gold")
    b = CodedFD(model, initial, seed=1, code="gold")
    m0, m1 = a.masks(0, 4), a.masks(1, 4)
    assert any(not np.array_equal(x, y) for x, y in zip(m0, m1, strict=True))
    for x, y in zip(m1, b.masks(1, 4), strict=True):
        assert np.array_equal(x, y)
    # Rows keep the required weight after the row and column shuffles.
    for mask, kept in zip(m1, model.arch(0.5).sizes, strict=True):
        assert (mask.sum(axis=1) == kept).all()


def test_lstm_mask_covers_all_four_gates():
    sizes = FluidLSTMSizes(vocab=5, hidden=(6, 6), seq_len=3)
    model = fluid_lstm(sizes)
    initial = module_params(model.build())
    ins = CodedFD(model, initial, code="constant_weight").configure_round(0, clients(3))
    for i in ins.values():
        kept = i.submodel.indices[0]
        rows = np.concatenate([b * 6 + kept for b in range(4)])
        assert np.array_equal(i.parameters["lstm1.weight_ih_l0"], initial["lstm1.weight_ih_l0"][rows])


def test_per_weight_average_and_fedavg_by_hand():
    # Client A holds neurons {0, 1} with value 1, client B {1, 2} with value 3.
    # Uniform average: neuron 0 -> 1, neuron 1 -> 2, neuron 2 -> 3, neuron 3 unheld -> 0 (update 0).
    # FedAvg with eta = 0.5 moves each half way.
    strategy = CodedFD(TOY, toy_state(), width=0.5, server_lr=0.5, weighted=False)
    new, metrics = strategy.aggregate_round(0, [toy_result("a", [0, 1], 1.0), toy_result("b", [1, 2], 3.0)], [])
    assert new["w1"][:, 0].tolist() == [0.5, 1.0, 1.5, 0.0]
    assert new["w2"][0].tolist() == [0.5, 1.0, 1.5, 0.0]
    assert metrics["median_accuracy"] == pytest.approx(0.2)
    assert metrics["coverage"] == pytest.approx(0.75)
    assert metrics["clients"] == 2


def test_weighted_average_by_hand():
    # Weights 1 and 3 on neuron 1: (1 * 1 + 3 * 3) / 4 = 2.5; eta = 1 takes the average.
    strategy = CodedFD(TOY, toy_state(), width=0.5, server_lr=1.0)
    results = [toy_result("a", [0, 1], 1.0, examples=1), toy_result("b", [1, 2], 3.0, examples=3)]
    new, _ = strategy.aggregate_round(0, results, [ClientFailure("c", "timeout")])
    assert new["w1"][:, 1].tolist() == [1.0, 2.5, 3.0, 0.0]


def test_fedadam_state_round_trip():
    results = [toy_result("a", [0, 1], 1.0), toy_result("b", [1, 2], 3.0)]
    later = [toy_result("a", [2, 3], -1.0), toy_result("b", [0, 3], 2.0)]
    straight = CodedFD(TOY, toy_state(), server_opt="fedadam", server_lr=0.1)
    straight.aggregate_round(0, results, [])
    want, _ = straight.aggregate_round(1, later, [])

    first = CodedFD(TOY, toy_state(), server_opt="fedadam", server_lr=0.1)
    first.aggregate_round(0, results, [])
    saved = first.state()
    assert set(saved) == {"global", "server_opt"} and saved["server_opt"]["step"] == 1
    resumed = CodedFD(TOY, toy_state(), server_opt="fedadam", server_lr=0.1)
    resumed.load_state(saved)
    got, _ = resumed.aggregate_round(1, later, [])
    for name in want:
        assert np.array_equal(got[name], want[name])
    # Round 0: held neurons 0-2 moved; neuron 3 (nobody held it, zero momentum so far) did not.
    assert (saved["global"]["w1"][:3] != 0).all()
    assert (saved["global"]["w1"][3] == 0).all()


def test_no_results_keeps_the_model():
    strategy = CodedFD(TOY, toy_state())
    new, metrics = strategy.aggregate_round(0, [], [ClientFailure("a", "error")])
    assert (new["w1"] == 0).all() and metrics["failures"] == 1


def test_width_one_trains_the_full_model():
    model = small_cnn()
    ins = CodedFD(model, module_params(model.build()), code="constant_weight", width=1.0).configure_round(0, clients(3))
    for i in ins.values():
        assert [len(x) for x in i.submodel.indices] == list(model.group_sizes)


def test_real_round_changes_the_model():
    model = small_cnn()
    initial = module_params(model.build())
    strategy = CodedFD(model, initial, local={"batch_size": 3, "lr": 0.1}, code="gold")
    rng = np.random.default_rng(0)
    ins = strategy.configure_round(0, clients(3))
    results = [
        run_local(model, i, rng.normal(size=(6, 1, 8, 8)).astype(np.float32), rng.integers(0, 4, 6))
        for i in ins.values()
    ]
    new, metrics = strategy.aggregate_round(0, results, [])
    assert not np.array_equal(new["fc1.weight"], initial["fc1.weight"])
    assert 0.0 <= metrics["median_accuracy"] <= 1.0
    assert list(strategy.eval_submodels(clients(3))) == [1.0]


@pytest.mark.parametrize(
    "kwargs", [{"code": "hamming"}, {"width": 0.0}, {"server_opt": "sgd"}, {"server_lr": -1.0}, {"weighted": "maybe"}]
)
def test_bad_options(kwargs):
    with pytest.raises(InputError):
        CodedFD(TOY, toy_state(), **kwargs)


def test_string_options_from_the_command_line():
    strategy = CodedFD(TOY, toy_state(), width="0.5", server_lr="0.25", weighted="false")
    assert strategy.width == 0.5 and strategy.optimizer.lr == 0.25 and strategy.weighted is False
