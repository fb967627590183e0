"""Tests of the analytic FLOPs / MACs / params counter (`exporters.flops`).

Every zoo model is checked at widths 0.25, 0.5, 0.75 and 1.0 against the module itself
(parameter count) and two independent counters from PyPI:

* fvcore's ``FlopCountAnalysis`` counts one "flop" per multiply-accumulate of conv, linear
  and matmul and ignores biases; it has no handle for ``aten::lstm`` (counted 0) and none
  for ``aten::embedding`` (0). So: fvcore == our conv + linear MACs, exactly, and our total
  MACs - fvcore == our LSTM MACs.
* thop's ``profile`` counts conv as ``out * C_in/groups * k_h*k_w`` and linear as
  ``out * in_features`` (MACs, no bias), embedding as 0, and an LSTM per step and layer as
  ``4*((I + H)*H + H + 2H) + 3H + H = 4H(I + H) + 16H`` with biases (``4H(I + H) + 8H``
  without). We count ``4H(I + H)`` MACs (the gate matmuls only; the bias adds and the cell
  arithmetic are FLOPs). So: thop == ours for conv and linear, and
  thop_lstm - ours_lstm == steps * layers * dirs * 16H exactly.

Then come hand-checked small cases and the papers' tables (Coded-FD Table 5, FjORD
Table 1b, FedDrop Tables 6-9). A paper check skips, naming the model, when the model
is not registered in the zoo.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import pytest
import torch
from torch import nn

from exporters.flops import (
    OPTIMIZER_FLOPS_PER_PARAM,
    Counts,
    LayerCount,
    adaptive_window_total,
    count,
    count_module,
    optimizer_flops,
)
from exporters.zoo import ZooModel, get_model, model_names
from tests.exporters.examples import ALL as EXAMPLES

WIDTHS = (0.25, 0.5, 0.75, 1.0)
NAMES = model_names()
CASES = [(name, width) for name in NAMES for width in WIDTHS]
KNOWN_KINDS = {
    "conv",
    "linear",
    "lstm",
    "embedding",
    "batchnorm",
    "relu",
    "activation",
    "maxpool",
    "avgpool",
    "add",
    "mul",
    "scale",
    "dropout",
}
MATMUL_KINDS = {"conv", "linear"}


# --------------------------------------------------------------------------- cached results


class _Cache:
    """Counts, thop and fvcore results per (model, width), computed once per module."""

    def __init__(self) -> None:
        self.counts: dict[tuple[str, float], Counts] = {}
        self.modules: dict[tuple[str, float], nn.Module] = {}
        self.thop: dict[tuple[str, float], dict[str, float]] = {}
        self.fvcore: dict[tuple[str, float], Mapping[str, int]] = {}

    def module(self, name: str, width: float) -> nn.Module:
        key = (name, width)
        if key not in self.modules:
            model = get_model(name)
            self.modules[key] = model.build(model.arch(width))
        return self.modules[key]

    def count(self, name: str, width: float) -> Counts:
        key = (name, width)
        if key not in self.counts:
            self.counts[key] = count_module(self.module(name, width), get_model(name))
        return self.counts[key]

    def example(self, name: str) -> torch.Tensor:
        model = get_model(name)
        dtype = torch.int64 if model.input_dtype == "int64" else torch.float32
        return torch.zeros((1, *model.input_shape), dtype=dtype)

    def thop_ops(self, name: str, width: float) -> dict[str, float]:
        """thop's ops per leaf module (qualified name), one example, eval mode."""
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from thop import profile

        key = (name, width)
        if key not in self.thop:
            net = self.module(name, width)  # thop adds, then removes, its buffers
            _, _, tree = profile(net, (self.example(name),), verbose=False, ret_layer_info=True)
            flat: dict[str, float] = {}

            def walk(prefix: str, node: Mapping[str, Any]) -> None:
                for child, (ops, _params, sub) in node.items():
                    qual = f"{prefix}.{child}" if prefix else child
                    if sub:
                        walk(qual, sub)
                    else:
                        flat[qual] = float(ops)

            walk("", tree)
            self.thop[key] = flat
        return self.thop[key]

    def fvcore_ops(self, name: str, width: float) -> Mapping[str, int]:
        """fvcore's counts per operator (``conv``, ``linear``, ...), one example."""
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from fvcore.nn import FlopCountAnalysis

        key = (name, width)
        if key not in self.fvcore:
            net = self.module(name, width).eval()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                analysis = FlopCountAnalysis(net, (self.example(name),))
                analysis.unsupported_ops_warnings(False).uncalled_modules_warnings(False)
                self.fvcore[key] = dict(analysis.by_operator())
        return self.fvcore[key]


@pytest.fixture(scope="module")
def cache() -> _Cache:
    return _Cache()


@pytest.fixture(scope="module", autouse=True)
def _one_thread() -> Iterator[None]:
    """Batch-1 forwards are tiny: one intra-op thread avoids oversubscribing a busy machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _kind_sum(counts: Counts, kinds: set[str], attr: str = "macs") -> int:
    return sum(int(getattr(layer, attr)) for layer in counts.layers if layer.kind in kinds)


def _layers(counts: Counts, kind: str) -> list[LayerCount]:
    return [layer for layer in counts.layers if layer.kind == kind]


# --------------------------------------------------------------------------- every model


@pytest.mark.parametrize(("name", "width"), CASES)
def test_params_equal_module_numel(cache: _Cache, name: str, width: float) -> None:
    net = cache.module(name, width)
    counts = cache.count(name, width)
    expected = sum(p.numel() for p in net.parameters() if p.requires_grad)
    assert counts.params == expected
    # every parameter tensor is used by exactly one counted layer
    assert sum(layer.params for layer in counts.layers) == expected


@pytest.mark.parametrize(("name", "width"), CASES)
def test_every_op_has_a_formula(cache: _Cache, name: str, width: float) -> None:
    kinds = {layer.kind for layer in cache.count(name, width).layers}
    assert kinds <= KNOWN_KINDS, f"ops without a formula: {kinds - KNOWN_KINDS}"


@pytest.mark.parametrize(("name", "width"), CASES)
def test_macs_match_fvcore(cache: _Cache, name: str, width: float) -> None:
    counts = cache.count(name, width)
    ops = cache.fvcore_ops(name, width)
    fv_matmul = sum(ops.get(op, 0) for op in ("conv", "linear", "addmm", "matmul", "bmm", "einsum"))
    # fvcore: one flop per MAC of conv / linear / matmul, biases ignored -> exact match.
    assert fv_matmul == _kind_sum(counts, MATMUL_KINDS)
    # fvcore has no aten::lstm handle (0): the whole difference is our LSTM gate MACs.
    assert counts.macs - fv_matmul == _kind_sum(counts, {"lstm"})


@pytest.mark.parametrize(("name", "width"), CASES)
def test_macs_match_thop(cache: _Cache, name: str, width: float) -> None:
    counts = cache.count(name, width)
    thop = cache.thop_ops(name, width)
    net = cache.module(name, width)
    modules = dict(net.named_modules())
    by_name = {layer.name.split("#")[0]: layer for layer in counts.layers}
    conv_linear = sum(ops for qual, ops in thop.items() if isinstance(modules[qual], nn.Conv2d | nn.Linear))
    assert conv_linear == _kind_sum(counts, MATMUL_KINDS)
    for qual, ops in thop.items():
        module = modules[qual]
        if isinstance(module, nn.LSTM):
            layer = by_name[qual]
            steps = layer.output_shape[0] if len(layer.output_shape) == 2 else 1
            dirs = 2 if module.bidirectional else 1
            per_cell = 16 if module.bias else 8
            # thop adds biases and cell arithmetic to the gate MACs; we count them as FLOPs.
            assert ops - layer.macs == steps * module.num_layers * dirs * per_cell * module.hidden_size
        elif isinstance(module, nn.Embedding):
            assert ops == 0 and by_name[qual].macs == 0


@pytest.mark.parametrize(("name", "width"), CASES)
def test_train_flops_above_flops_above_macs(cache: _Cache, name: str, width: float) -> None:
    counts = cache.count(name, width)
    assert counts.train_flops > counts.flops > counts.macs > 0
    # a training step costs between 2x and 3x the forward pass
    assert 2 * counts.flops <= counts.train_flops <= 3 * counts.flops
    for layer in counts.layers:
        assert layer.train_flops >= layer.flops >= 2 * layer.macs >= 0
    assert counts.macs == sum(layer.macs for layer in counts.layers)
    assert counts.flops == sum(layer.flops for layer in counts.layers)
    assert counts.train_flops == sum(layer.train_flops for layer in counts.layers)


@pytest.mark.parametrize("name", NAMES)
def test_counts_grow_with_width(cache: _Cache, name: str) -> None:
    rows = [cache.count(name, width) for width in WIDTHS]
    for small, big in zip(rows[:-1], rows[1:], strict=True):
        assert small.params < big.params
        assert small.macs < big.macs
        assert small.flops < big.flops
        assert small.train_flops < big.train_flops


@pytest.mark.parametrize("name", NAMES)
def test_count_is_the_public_entry_point(cache: _Cache, name: str) -> None:
    model = get_model(name)
    assert count(model, model.arch(0.5)) == cache.count(name, 0.5)


# --------------------------------------------------------------------------- hand checks


def test_coded_fd_cnn_by_hand() -> None:
    """Coded-FD EMNIST CNN (paper Table 5) at full width, every layer computed by hand."""
    model = get_model("cfd-cnn")
    counts = count(model, model.full_arch())
    conv1 = 28 * 28 * 32 * (5 * 5 * 1)  # 'same' 5x5 conv, 1 -> 32 channels
    conv2 = 14 * 14 * 64 * (5 * 5 * 32)  # after 2x2 max pool
    fc1 = 2048 * 3136  # 64 * 7 * 7 = 3136 inputs
    fc2 = 62 * 2048
    assert counts.macs == conv1 + conv2 + fc1 + fc2 == 17_211_904
    # Table 5 params per layer and total
    assert [layer.params for layer in counts.layers if layer.params] == [832, 51264, 6424576, 127038]
    assert counts.params == 6_603_710
    # Table 5 output shapes (NCHW here, NHWC there)
    shapes = {layer.name: layer.output_shape for layer in counts.layers}
    assert shapes == {
        "conv1": (32, 28, 28),
        "relu": (32, 28, 28),
        "pool": (32, 14, 14),
        "conv2": (64, 14, 14),
        "relu#2": (64, 14, 14),
        "pool#2": (64, 7, 7),
        "fc1": (2048,),
        "relu#3": (2048,),
        "fc2": (62,),
    }
    relu = 32 * 28 * 28 + 64 * 14 * 14 + 2048
    pool = 3 * (32 * 14 * 14 + 64 * 7 * 7)  # 3 comparisons per 2x2 window
    bias = 32 * 28 * 28 + 64 * 14 * 14 + 2048 + 62
    assert counts.flops == 2 * counts.macs + bias + relu + pool == 34_531_454
    # backward: conv1 has no input gradient; every other matmul has input + weight gradients
    backward = 2 * conv1 + 4 * (conv2 + fc1 + fc2) + bias + relu + pool
    assert counts.train_flops == counts.flops + backward == 102_232_316
    first = counts.layers[0]
    assert first.train_flops == 2 * first.flops  # forward + weight grad + bias grad only


class _Scaler(nn.Module):
    """HeteroFL's scaler: divides by the rate in training mode only."""

    def __init__(self, rate: float) -> None:
        super().__init__()
        self.rate = rate

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x / self.rate if self.training else x


class _TinyRes(nn.Module):
    def __init__(self, c: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, c, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(c, track_running_stats=False)
        self.scaler = _Scaler(0.5)
        self.conv2 = nn.Conv2d(c, c, 3, stride=2, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(c, track_running_stats=False, affine=False)
        self.short = nn.Conv2d(c, c, 1, stride=2, bias=False)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(c, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.bn1(self.scaler(self.conv1(x))))  # (c, 8, 8)
        y = self.bn2(self.conv2(x)) + self.short(x)  # (c, 4, 4), residual add
        return self.fc(torch.flatten(self.pool(torch.relu(y)), 1))


class _TinyRNN(nn.Module):
    def __init__(self, h: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(12, 4)
        self.lstm = nn.LSTM(4, h, num_layers=2, batch_first=True)
        self.fc = nn.Linear(h, 12)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, _ = self.lstm(self.embed(x))  # (N, 5, h)
        return self.fc(out[:, -1, :])


def _zoo(name: str, module: Callable[[int], nn.Module], shape: tuple[int, ...], dtype: str) -> ZooModel:
    return ZooModel(
        name=name,
        paper="test",
        groups=(("g", 8),),
        builder=lambda w: module(w["g"]),
        layouts={},
        input_shape=shape,
        input_dtype=dtype,
        num_classes=10,
    )


def test_residual_bn_scaler_by_hand() -> None:
    """Conv without bias, static BN (affine and not), scaler, residual add, adaptive pool."""
    model = _zoo("tiny-res", _TinyRes, (3, 8, 8), "float32")
    counts = count(model, model.full_arch())
    c = 8
    kinds = [(layer.name, layer.kind) for layer in counts.layers]
    assert kinds == [
        ("conv1", "conv"),
        ("scaler", "scale"),
        ("bn1", "batchnorm"),
        ("relu", "relu"),
        ("conv2", "conv"),
        ("bn2", "batchnorm"),
        ("short", "conv"),
        ("add", "add"),
        ("relu#2", "relu"),
        ("pool", "avgpool"),
        ("fc", "linear"),
    ]
    a, b = c * 8 * 8, c * 4 * 4  # elements at 8x8 and 4x4
    macs = [a * 27, b * c * 9, b * c, 10 * c]  # conv1, conv2, short, fc
    assert counts.macs == sum(macs)
    elementwise = a + 6 * a + a + 4 * b + b + b + b  # scaler, bn1 (affine), relu, bn2, add, relu, pool
    assert counts.flops == 2 * sum(macs) + elementwise + 10  # fc bias only
    backward = 2 * macs[0] + 4 * sum(macs[1:]) + elementwise + 10
    assert counts.train_flops == counts.flops + backward
    assert counts.params == 3 * c * 9 + 2 * c + c * c * 9 + c * c + 10 * c + 10
    assert counts.layers[-2].output_shape == (c, 1, 1)


def test_lstm_by_hand() -> None:
    """Embedding + 2-layer LSTM over 5 steps + linear on the last step."""
    model = _zoo("tiny-rnn", _TinyRNN, (5,), "int64")
    counts = count(model, model.full_arch())
    h, steps = 8, 5
    gates = 4 * h * (4 + h) + 4 * h * (h + h)  # per step: layer 0 (I = 4) and layer 1 (I = h)
    assert [layer.kind for layer in counts.layers] == ["embedding", "lstm", "linear"]
    emb, lstm, fc = counts.layers
    assert emb.macs == emb.flops == 0 and emb.train_flops == steps * 4  # weight-grad scatter-add
    assert lstm.output_shape == (steps, h)
    assert lstm.macs == steps * gates
    assert lstm.flops == 2 * lstm.macs + steps * 2 * (8 * h + 9 * h)
    # the embedding has parameters, so the LSTM back-propagates to its input too
    assert lstm.train_flops == 2 * lstm.flops + 2 * lstm.macs
    assert fc.macs == 12 * h and fc.flops == 2 * 12 * h + 12
    lstm_params = 4 * h * (4 + h) + 4 * h * (h + h) + 2 * 2 * 4 * h  # weights + b_ih, b_hh per layer
    assert lstm.params == lstm_params
    assert counts.params == 12 * 4 + lstm_params + 12 * h + 12


def test_first_lstm_spares_only_its_input_product() -> None:
    class FirstLSTM(nn.Module):
        def __init__(self, h: int) -> None:
            super().__init__()
            self.lstm = nn.LSTM(3, h, batch_first=True)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.lstm(x)[0][:, -1]

    model = _zoo("first-lstm", FirstLSTM, (7, 3), "float32")
    (lstm,) = count(model, model.full_arch()).layers
    h = 8
    assert lstm.train_flops == 2 * lstm.flops + 2 * lstm.macs - 2 * 7 * 4 * h * 3


def test_adaptive_windows_and_optimizer() -> None:
    assert adaptive_window_total(8, 1) == 8
    assert adaptive_window_total(8, 4) == 8
    assert adaptive_window_total(5, 2) == 6  # windows [0, 3) and [2, 5)
    assert optimizer_flops(10, "adamw") == 10 * OPTIMIZER_FLOPS_PER_PARAM["adamw"] == 140
    with pytest.raises(Exception, match="unknown optimizer"):
        optimizer_flops(10, "lion")


# --------------------------------------------------------------------------- papers


def _require(name: str) -> ZooModel:
    if name not in model_names():
        pytest.skip(f"{name} is not registered in the zoo yet: paper check not run")
    return get_model(name)


def _near(value: float, paper: float, step: float) -> bool:
    """True when ``value`` rounds to the paper's figure, printed to a multiple of ``step``."""
    return abs(value - paper) <= step / 2


# FjORD Table 1b, MACs per p = 0.2 .. 1.0 (printed as whole K or M).
FJORD_P = (0.2, 0.4, 0.6, 0.8, 1.0)


def test_fjord_table_1b_resnet18() -> None:
    """Table 1b CIFAR-10 ResNet18: 23M 91M 203M 360M 555M = our MACs (conv + linear)."""
    model = _require("fjord-resnet18")
    got = [count(model, model.arch(p)).macs for p in FJORD_P]
    for macs, paper in zip(got, (23e6, 91e6, 203e6, 360e6, 555e6), strict=True):
        assert _near(macs, paper, 1e6), got
    assert got[-1] == 555_422_720


def test_fjord_table_1b_rnn() -> None:
    """Table 1b Shakespeare RNN: 12K 40K 83K 143K 216K "MACs".

    The table counts ONE time step with ptflops' conventions: per LSTM layer the gate MACs
    ``4H(I + H)`` plus ``18H`` (8H biases, 4H to add the two products, 6H cell updates),
    plus the classifier's ``80H`` MACs and 80 bias adds. We count MACs over the whole
    80-character sequence (gates only) and put the biases (8H) and cell arithmetic (9H) in
    the FLOPs. Rebuilt from our per-layer counts, one step of ptflops' convention is
    ``(lstm.flops - lstm.macs) / T + H`` per LSTM layer plus ``fc.macs + 80``; our own
    gate + classifier MACs per step are 2-8 % below the table (about 211K against 216K at
    p = 1).
    """
    model = _require("fjord-rnn")
    steps = model.input_shape[0]
    for p, paper in zip(FJORD_P, (12e3, 40e3, 83e3, 143e3, 216e3), strict=True):
        counts = count(model, model.arch(p))
        lstms = _layers(counts, "lstm")
        (fc,) = _layers(counts, "linear")
        per_step = sum((x.flops - x.macs) // steps + x.output_shape[-1] for x in lstms)
        table_convention = per_step + fc.macs + math.prod(fc.output_shape)
        assert _near(table_convention, paper, 1e3), (p, table_convention)
        our_step_macs = sum(x.macs for x in lstms) // steps + fc.macs
        assert 0.90 < our_step_macs / paper < 0.99
        assert our_step_macs * steps - (steps - 1) * fc.macs == counts.macs  # fc on the last step


def test_fjord_table_1b_cnn() -> None:
    """Table 1b FEMNIST CNN: 47K 120K 218K 342K 491K -- NOT reproduced.

    The paper gives no layer sizes; the zoo's reconstruction (3x3 convs with 20 and 15
    channels, no padding, 2x2 max pools, linear to 62) reproduces the parameter row, and
    its conv + linear MACs are 42,054 / 110,244 / 204,570 / 325,032 / 471,630: 4-11 %
    below the table. Adding biases, ReLU and pooling as ptflops does gives 518K at p = 1,
    5 % above it, so no counting convention closes the gap: the architecture differs.
    """
    model = _require("fjord-cnn")
    got = []
    for p in FJORD_P:
        arch = model.arch(p)
        c1, c2 = arch.sizes
        by_hand = 26 * 26 * c1 * 9 + 11 * 11 * c2 * 9 * c1 + 62 * c2 * 25  # 28 -> 26 -> 13 -> 11 -> 5
        macs = count(model, arch).macs
        assert macs == by_hand
        got.append(macs)
    assert got == [42_054, 110_244, 204_570, 325_032, 471_630]
    ratios = [m / paper for m, paper in zip(got, (47e3, 120e3, 218e3, 342e3, 491e3), strict=True)]
    assert all(0.89 < r < 0.97 for r in ratios), ratios
    for p, paper in zip(FJORD_P, (5e3, 10e3, 15e3, 20e3, 26e3), strict=True):
        # params within one printed unit (1K): 4,863 9,880 15,113 20,562 26,227
        assert abs(count(model, model.arch(p)).params - paper) < 1e3


def _feddrop_rows(counts: Counts) -> list[int]:
    """Our layers in FedDrop's Tables 6-8 convention, one value per table row.

    The tables count one FLOP per MAC (eq. 10's factor 2 is *not* applied in them), plus one
    per conv / FC output (eq. 9's ``+ C H W`` term, numerically the bias add), and one per
    *input* element of a pooling layer; the ReLU of a "Conv+ReLU" row adds nothing more.
    From our per-layer counts: ``macs + output elements`` for conv / linear and the
    previous layer's output elements for a pool (ours: ``k*k - 1`` per max-pool output and
    ``k*k`` per average-pool output, which differ for the LeNets' overlapping average pool).
    """
    rows = []
    previous: tuple[int, ...] = ()
    for layer in counts.layers:
        if layer.kind in MATMUL_KINDS:
            rows.append(layer.macs + math.prod(layer.output_shape))
        elif layer.kind in ("maxpool", "avgpool"):
            rows.append(math.prod(previous))
        previous = layer.output_shape
    return rows


# FedDrop Tables 6-8 "#FLOPs" per row (ReLU rows merged into their conv), full width:
# (value, printed precision). Totals: (value, precision, relative tolerance).
FEDDROP_TABLES: dict[str, tuple[list[tuple[float, float]], tuple[float, float, float], float]] = {
    "feddrop-lenet": (  # Table 6; row 4 is printed "125 k": a misprint for 12.5 k (64*7*7*4)
        [
            (652e3, 1e3),
            (25.1e3, 0.1e3),
            (10.0e6, 0.1e6),
            (12.5e3, 0.1e3),
            (923e3, 1e3),
            (1.6e3, 0.1e3),
            (132e3, 1e3),
            (5.13e3, 0.01e3),
        ],
        (11.8e6, 0.1e6, 0.0),
        226e3,
    ),
    "feddrop-svhn": (  # Table 7; its total 7.54 M is the sum of the rounded rows. Row 5 is
        # printed "333 k" but its own rule gives 64*3*3*(64*9 + 1) = 332,352 (332 k): the
        # table is 0.2 % high there (one more op per output), unlike every other row.
        [
            (1.91e6, 0.01e6),
            (25.1e3, 0.1e3),
            (5.13e6, 0.01e6),
            (6.4e3, 0.1e3),
            (332e3, 1e3),
            (576, 1),
            (132e3, 1e3),
            (5.13e3, 0.01e3),
        ],
        (7.54e6, 0.01e6, 1e-3),
        227e3,
    ),
    "feddrop-vgg9": (  # Table 8
        [
            (918e3, 1e3),
            (18.9e6, 0.1e6),
            (65.5e3, 0.1e3),
            (18.9e6, 0.1e6),
            (37.8e6, 0.1e6),
            (32.8e3, 0.1e3),
            (18.9e6, 0.1e6),
            (37.8e6, 0.1e6),
            (16.4e3, 0.1e3),
            (132e3, 1e3),
            (263e3, 1e3),
            (5.13e3, 0.01e3),
        ],
        (134e6, 1e6, 0.0),
        1.53e6,
    ),
}


@pytest.mark.parametrize("name", sorted(FEDDROP_TABLES))
def test_feddrop_tables_6_to_8(name: str) -> None:
    model = _require(name)
    table_rows, (total, step, rel), params = FEDDROP_TABLES[name]
    counts = count(model, model.full_arch())
    rows = _feddrop_rows(counts)
    assert len(rows) == len(table_rows)
    for got, (want, precision) in zip(rows, table_rows, strict=True):
        assert _near(got, want, precision), (rows, table_rows)
    assert _near(sum(rows), total, step) or abs(sum(rows) - total) <= rel * total, sum(rows)
    assert _near(counts.params, params, 0.01 * params)
    # our FLOPs convention (2 per MAC + every elementwise op) is about twice the tables'
    assert 1.9 < counts.flops / sum(rows) < 2.1


def test_feddrop_table_9_lstm() -> None:
    """Table 9 counts one time step: LSTM 275 k, decoder 21 k, total 296 k FLOPs, 293 k params."""
    model = _require("feddrop-lstm")
    counts = count(model, model.full_arch())
    (lstm,) = _layers(counts, "lstm")
    (decoder,) = _layers(counts, "linear")
    steps = lstm.output_shape[0]
    # One step in the table's convention: the gate MACs once plus our bias adds (8H) and
    # cell arithmetic (9H): 4*256*(8 + 256) + 17*256 = 274,688 (ptflops counts 18H: 274,944).
    per_step = (lstm.flops - lstm.macs) // steps
    assert per_step == 4 * 256 * (8 + 256) + 17 * 256
    assert _near(per_step, 275e3, 1e3)
    assert _near(decoder.macs + 80, 21e3, 1e3)  # the decoder runs on the last step only
    # 296 k is 275 k + 21 k (rounded rows); the unrounded sum 295,248 is 0.3 % below it.
    assert abs(per_step + decoder.macs + 80 - 296e3) <= 0.003 * 296e3
    # 293 k printed; 640 + 272,384 + 20,560 = 293,584 (the table truncates).
    assert counts.params == 293_584 and 293e3 <= counts.params < 294e3


# --------------------------------------------------------------------------- users' models

USER_CASES = [
    pytest.param(spec, width, id=f"{spec.rpartition(':')[2]}-{width:g}") for spec in EXAMPLES for width in (0.25, 1.0)
]


@pytest.mark.parametrize(("spec", "width"), USER_CASES)
def test_users_models_count_every_layer_and_match_fvcore(cache: _Cache, spec: str, width: float) -> None:
    """Depthwise convs, ReLU6, residual adds and global pooling: no layer of the example models
    goes uncounted, and the conv + linear MACs are fvcore's exactly."""
    counts = cache.count(spec, width)
    assert {layer.kind for layer in counts.layers} <= KNOWN_KINDS - {"untracked"}
    ops = cache.fvcore_ops(spec, width)
    fv_matmul = sum(ops.get(op, 0) for op in ("conv", "linear", "addmm", "matmul", "bmm", "einsum"))
    assert fv_matmul == _kind_sum(counts, MATMUL_KINDS)
    assert counts.params == sum(p.numel() for p in cache.module(spec, width).parameters())
