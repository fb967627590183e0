"""FLuID zoo models: parameter counts at full width, shapes at width 0.5.

The paper (section 6) gives layer types and sizes but no parameter counts. The expected counts below
are derived from its description, with padding, pooling and input encoding taken from the authors'
TensorFlow reference (``tflite_convertor``): 'same' convs, a max pool after every conv pair in
VGG-9, one-hot characters into the LSTM. Counting convention: ``numel`` of every parameter, biases
included. The only difference from the Keras reference is the LSTM bias: PyTorch keeps two bias
vectors (``b_ih``, ``b_hh``) per layer, Keras one, so the PyTorch model has ``2 * 4 * 128`` more.
"""

from __future__ import annotations

import pytest

from exporters.zoo import get_model
from tests.exporters.zoo_checks import check_half_width_shapes

FLUID_MODELS = ("fluid-cnn", "fluid-vgg9", "fluid-lstm")


def conv(cin: int, cout: int, k: int) -> int:
    return cout * cin * k * k + cout


def dense(fin: int, fout: int) -> int:
    return fout * fin + fout


def lstm(fin: int, hidden: int, bias_vectors: int) -> int:
    return 4 * hidden * (fin + hidden) + bias_vectors * 4 * hidden


def param_counts(name: str) -> dict[str, int]:
    counts: dict[str, int] = {}
    for pname, param in get_model(name).build().named_parameters():
        prefix = pname.rsplit(".", 1)[0]
        counts[prefix] = counts.get(prefix, 0) + param.numel()
    return counts


def test_femnist_cnn_parameter_counts() -> None:
    expected = {
        "conv1": conv(1, 16, 5),
        "conv2": conv(16, 64, 5),
        "fc1": dense(64 * 7 * 7, 120),  # two 'same' convs, two 2x2 pools: 28 -> 7
        "fc2": dense(120, 62),
    }
    counts = param_counts("fluid-cnn")
    assert counts == expected
    assert sum(counts.values()) == 410_022, "FEMNIST CNN, 'same' padding as in the Keras reference"


def test_vgg9_parameter_counts() -> None:
    channels = [3, 32, 32, 64, 64, 128, 128]
    expected = {f"convs.{i}": conv(channels[i], channels[i + 1], 3) for i in range(6)}
    expected |= {
        "fc1": dense(128 * 4 * 4, 512),  # three 2x2 pools: 32 -> 4
        "fc2": dense(512, 256),
        "fc3": dense(256, 10),
    }
    counts = param_counts("fluid-vgg9")
    assert counts == expected
    assert sum(counts.values()) == 1_469_994


def test_lstm_parameter_counts_differ_from_keras_by_the_second_bias_vector() -> None:
    counts = param_counts("fluid-lstm")
    assert counts == {
        "lstm1": lstm(80, 128, bias_vectors=2),  # one-hot input: 80 characters
        "lstm2": lstm(128, 128, bias_vectors=2),
        "fc": dense(128, 80),
    }
    keras = lstm(80, 128, 1) + lstm(128, 128, 1) + dense(128, 80)
    assert keras == 248_912
    assert sum(counts.values()) == keras + 2 * 4 * 128 == 249_936, (
        "PyTorch LSTM: two bias vectors per layer (Keras reference: one, 1,024 parameters fewer)"
    )


HALF_WIDTH_SHAPES = {
    "fluid-cnn": {
        "conv1.weight": (8, 1, 5, 5),
        "conv2.weight": (32, 8, 5, 5),
        "fc1.weight": (60, 32 * 49),
        "fc2.weight": (62, 60),
        "fc2.bias": (62,),
    },
    "fluid-vgg9": {
        "convs.0.weight": (16, 3, 3, 3),
        "convs.1.weight": (16, 16, 3, 3),
        "convs.2.weight": (32, 16, 3, 3),
        "convs.3.weight": (32, 32, 3, 3),
        "convs.4.weight": (64, 32, 3, 3),
        "convs.5.weight": (64, 64, 3, 3),
        "fc1.weight": (256, 64 * 16),
        "fc2.weight": (128, 256),
        "fc3.weight": (10, 128),
    },
    "fluid-lstm": {
        "lstm1.weight_ih_l0": (4 * 64, 80),
        "lstm1.weight_hh_l0": (4 * 64, 64),
        "lstm1.bias_ih_l0": (4 * 64,),
        "lstm2.weight_ih_l0": (4 * 64, 64),
        "lstm2.weight_hh_l0": (4 * 64, 64),
        "lstm2.bias_hh_l0": (4 * 64,),
        "fc.weight": (80, 64),
        "fc.bias": (80,),
    },
}


@pytest.mark.parametrize("name", FLUID_MODELS)
def test_half_width_shapes(name: str) -> None:
    check_half_width_shapes(name, HALF_WIDTH_SHAPES[name])


def test_lstm_takes_character_ids_and_has_one_group_per_layer() -> None:
    model = get_model("fluid-lstm")
    assert model.groups == (("lstm1", 128), ("lstm2", 128))
    assert model.input_shape == (80,) and model.input_dtype == "int64" and model.num_classes == 80


@pytest.mark.parametrize("name", FLUID_MODELS)
def test_paper_widths_are_the_sub_model_sizes_of_table_2(name: str) -> None:
    widths = get_model(name).paper_widths
    assert {0.5, 0.65, 0.75, 0.85, 0.95, 1.0} <= set(widths)
    assert (0.4 in widths) == (name == "fluid-cnn"), "r = 0.40 only for FEMNIST (Table 5)"
