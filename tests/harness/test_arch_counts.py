"""What an architecture costs, counted: the latency features of zoo models (harness/arch_counts.py)."""

from __future__ import annotations

from exporters.flops import count
from exporters.zoo import get_model
from harness.arch_counts import FEATURES, arch_counts, latency_features, train_flops_per_example


def test_linear_and_lstm_flops_are_one_feature_apart_from_the_convolutions() -> None:
    # the exported LSTM runs on the linear layers' Gemm / MatMul kernels: one cost per FLOP
    lstm = arch_counts(get_model("fluid-lstm").arch(0.5))
    cnn = arch_counts(get_model("fjord-cnn").arch(0.5))
    assert lstm.linear > 0 and lstm.lstm > 0 and cnn.conv > 0 and cnn.linear > 0
    matmul, conv = FEATURES.index("matmul"), FEATURES.index("conv")
    assert latency_features(lstm, 20)[matmul] == lstm.linear + lstm.lstm
    assert latency_features(cnn, 20)[[conv, matmul]].tolist() == [cnn.conv, cnn.linear]
    assert len(latency_features(lstm, 20)) == len(FEATURES)


def test_training_flops_of_the_zoo_are_the_counters() -> None:
    zoo = get_model("fjord-cnn")
    assert train_flops_per_example("fjord-cnn", 0.5) == count(zoo, zoo.arch(0.5)).train_flops
