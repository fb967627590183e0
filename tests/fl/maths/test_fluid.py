import math

import numpy as np
import pytest

from exporters.arch import Dim
from exporters.userinput import InputError
from exporters.zoo import ZooModel, get_model
from fl.maths import fluid


def tiny_model(blocks: int = 1) -> ZooModel:
    """Two dense layers around one hidden group ``h`` of 4 neurons (builder unused here)."""
    layouts = {
        "fc1.weight": (Dim("h", blocks=blocks), None),  # (blocks*4, 2)
        "fc1.bias": (Dim("h", blocks=blocks),),
        "fc2.weight": (None, Dim("h")),  # (2, 4): input of the next layer, not incoming
        "fc2.bias": (None,),
    }
    return ZooModel("tiny", "test", (("h", 4),), lambda group_sizes: None, layouts, (2,), "float32", 2)


def tiny_state(blocks: int = 1) -> dict[str, np.ndarray]:
    return {
        "fc1.weight": np.ones((4 * blocks, 2), dtype=np.float32),
        "fc1.bias": np.ones(4 * blocks, dtype=np.float32),
        "fc2.weight": np.ones((2, 4), dtype=np.float32),
        "fc2.bias": np.zeros(2, dtype=np.float32),
    }


# -- straggler detection and sub-model size --------------------------------------------


def test_straggler_count_fixed_and_fraction():
    assert fluid.straggler_count(5) == 1
    assert fluid.straggler_count(5, fraction=0.2) == 1  # the paper's slowest 20 %
    assert fluid.straggler_count(10, fraction=0.2) == 2
    assert fluid.straggler_count(50, fraction=0.2) == 10
    assert fluid.straggler_count(3, num_stragglers=5) == 2  # one client must remain to set the target
    assert fluid.straggler_count(1) == 0
    with pytest.raises(InputError):
        fluid.straggler_count(5, fraction=1.0)


def test_find_stragglers_target_is_next_slowest():
    times = {"c0": 12.0, "c1": 4.0, "c2": 8.0, "c3": 5.0}
    assert fluid.find_stragglers(times, 1) == (["c0"], 8.0)
    assert fluid.find_stragglers(times, 2) == (["c0", "c2"], 5.0)
    assert fluid.find_stragglers(times, 0) == ([], 12.0)
    # ties broken by client id
    assert fluid.find_stragglers({"b": 3.0, "a": 3.0, "c": 1.0}, 1) == (["a"], 3.0)


def test_linear_width_closest_to_inverse_speedup():
    # speed-up 12/8 = 1.5 -> 1/1.5 = 0.667 -> 0.65 (distance 0.017 vs 0.083 for 0.75)
    assert fluid.linear_width(12.0 / 8.0) == 0.65
    # 12/5 = 2.4 -> 0.417 -> 0.5 is the smallest available size
    assert fluid.linear_width(12.0 / 5.0) == 0.5
    # 1/1.05 = 0.952 -> 0.95
    assert fluid.linear_width(1.05) == 0.95
    # no speed-up needed -> full model
    assert fluid.linear_width(1.0) == 1.0
    assert fluid.linear_width(0.8) == 1.0
    # exact tie (0.5 is 0.25 from both) -> the smaller size, the one that meets the target
    assert fluid.linear_width(2.0, widths=(0.25, 0.75)) == 0.25
    # a tie in exact arithmetic that floating point breaks the other way: 1/5 = 0.2 is 0.1 from
    # both 0.1 and 0.3, but |0.3 - 0.2| rounds below |0.1 - 0.2|; the tolerance keeps it a tie
    assert abs(0.3 - 1 / 5.0) < abs(0.1 - 1 / 5.0)
    assert fluid.linear_width(5.0, widths=(0.1, 0.3)) == 0.1
    with pytest.raises(InputError):
        fluid.linear_width(1.5, widths=(0.5, 1.5))


CONVEX = ((0.25, 0.5, 0.75, 1.0), (300.0, 700.0, 1300.0, 2000.0))
OVERHEAD = ((0.25, 0.5, 0.75, 1.0), (1000.0, 1200.0, 1400.0, 1600.0))


def test_curve_width_picks_the_width_whose_time_is_closest_to_the_target():
    predict = fluid.curve_predictor(*CONVEX)
    # full 10 s, predicted 10 * lat(s) / 2000:
    # 0.95 -> lat 1300 + 0.8 * 700 = 1860 -> 9.3 s; 0.85 -> 1580 -> 7.9 s; 0.75 -> 6.5 s
    # target 7 s: 6.5 s is 0.5 s under it, 7.9 s 0.9 s over
    assert fluid.curve_width(10.0, 7.0, fluid.PAPER_WIDTHS, predict) == 0.75
    # target 7.5 s: 7.9 s is 0.4 s over it, 6.5 s 1 s under: the closer time, above the target
    assert fluid.curve_width(10.0, 7.5, fluid.PAPER_WIDTHS, predict) == 0.85
    assert fluid.curve_width(10.0, 11.0, fluid.PAPER_WIDTHS, predict) == 1.0
    assert fluid.curve_width(10.0, 1.0, fluid.PAPER_WIDTHS, predict) == 0.5  # nothing meets it: smallest


def test_curve_width_differs_from_linear_rule_when_time_is_not_proportional():
    predict = fluid.curve_predictor(*OVERHEAD)
    # full 10 s, target 9.2 s. Linear: 1/speed-up = 0.92 -> 0.95.
    assert fluid.linear_width(10.0 / 9.2) == 0.95
    # Curve: 0.95 -> 1560/1600 -> 9.75 s; 0.85 -> 1480/1600 -> 9.25 s (0.05 s over); 0.75 -> 8.75 s
    assert fluid.curve_width(10.0, 9.2, fluid.PAPER_WIDTHS, predict) == 0.85


WIDTHS = (0.25, 0.5, 0.75, 1.0)
MEASURED = ((0.25, 0.5, 1.0), (500.0, 600.0, 800.0))  # 0.75 interpolates to 700


def test_curve_rule_interpolates_between_measured_widths_and_differs_from_linear():
    predict = fluid.curve_predictor(*MEASURED)
    # full model 10 s, target 8 s: 0.75 -> 10 * 700 / 800 = 8.75 s (0.75 s over), 0.5 -> 7.5 s (0.5 s under)
    assert fluid.predicted_seconds(10.0, 0.75, predict) == pytest.approx(8.75)
    assert fluid.predicted_seconds(10.0, 0.5, predict) == pytest.approx(7.5)
    assert fluid.curve_width(10.0, 8.0, WIDTHS, predict) == 0.5
    assert fluid.straggler_width(10.0, 8.0, WIDTHS, predict) == 0.5
    assert fluid.curve_width(10.0, 9.0, WIDTHS, predict) == 0.75
    # the linear rule picks 0.75 (closest to 1 / 1.25 = 0.8) for the same 8 s target
    assert fluid.straggler_width(10.0, 8.0, WIDTHS) == 0.75
    assert fluid.predicted_seconds(10.0, 0.75) == pytest.approx(7.5)


def test_curve_rule_from_a_sub_model_time():
    predict = fluid.curve_predictor(*MEASURED)
    # at 0.5 the straggler took 6 s: full model 6 * 800 / 600 = 8 s; 0.25 -> 8 * 500 / 800 = 5 s
    full = fluid.full_model_seconds(6.0, 0.5, predict)
    assert full == pytest.approx(8.0)
    assert fluid.predicted_seconds(full, 0.5, predict) == pytest.approx(6.0)  # the inverse
    # 5 s is met exactly (within the tolerance, whatever the rounding of 6 * 800 / 600 * 500 / 800)
    assert fluid.curve_width(full, 5.0, WIDTHS, predict) == 0.25
    # nothing meets 4 s: the smallest size, predicted above the target
    assert fluid.curve_width(full, 4.0, WIDTHS, predict) == 0.25
    assert fluid.predicted_seconds(full, 0.25, predict) > 4.0
    # no speed-up needed: the full model, also when 1.0 is not an available size
    assert fluid.curve_width(full, 8.0, (0.25, 0.5), predict) == 1.0


def test_a_prediction_equal_to_the_target_meets_it():
    # 3 s * 1100 / 2000 = 1.65 s exactly, but the product rounds to 1.6500000000000001
    predict = fluid.curve_predictor((0.5, 1.0), (1100.0, 2000.0))
    assert fluid.predicted_seconds(3.0, 0.5, predict) > 1.65
    assert fluid.curve_width(3.0, 1.65, (0.25, 0.5), predict) == 0.5


def test_curve_rule_extends_the_nearest_segment_below_the_measured_range():
    predict = fluid.curve_predictor((0.5, 0.75, 1.0), (600.0, 650.0, 800.0))
    # the lowest segment's slope (50 per 0.25), not the steeper upper one (150 per 0.25)
    assert predict(0.25) == pytest.approx(550.0)
    assert fluid.curve_width(10.0, 10.0 * 550.0 / 800.0, WIDTHS, predict) == 0.25
    assert fluid.curve_width(10.0, 10.0 * 550.0 / 800.0 * 0.99, WIDTHS, predict) == 0.25  # none meets
    assert fluid.curve_width(10.0, 10.0 * 600.0 / 800.0, WIDTHS, predict) == 0.5


def test_linear_rule_from_a_sub_model_time():
    # at 0.5 it took 4 s: full model 8 s; target 3 s -> size closest to 3 / 8 = 0.375:
    # 0.25 and 0.5 tie, the smaller wins (it meets the target: 2 s, 0.5 would take 4 s)
    full = fluid.full_model_seconds(4.0, 0.5)
    assert full == pytest.approx(8.0)
    assert fluid.variable_speedup(full, 3.0) == pytest.approx(8.0 / 3.0)
    assert fluid.straggler_width(full, 3.0, WIDTHS) == 0.25
    assert fluid.predicted_seconds(full, 0.25) == pytest.approx(2.0)
    # full model 10 s, target 9 s: the closest available size to 0.9 is 1.0 (which misses it)
    assert fluid.straggler_width(10.0, 9.0, WIDTHS) == 1.0


def test_any_latency_model_serves_as_the_curve():
    # a fitted line a + b * FLOPs with FLOPs quadratic in the width, instead of measured points
    def line(width: float) -> float:
        return 400.0 + 1e-4 * 4e6 * width**2

    # full model 10 s: 0.5 -> 10 * 500 / 800 = 6.25 s; 0.75 -> 10 * 625 / 800 = 7.8125 s
    assert fluid.curve_width(10.0, 7.0, WIDTHS, line) == 0.5  # 0.75 s under against 0.8125 s over
    assert fluid.curve_width(10.0, 7.5, WIDTHS, line) == 0.75  # 0.3125 s over against 1.25 s under


def test_straggler_sizing_rejects_bad_inputs():
    predict = fluid.curve_predictor(*MEASURED)
    for bad in (-1.0, math.nan, math.inf):
        with pytest.raises(InputError, match="target_seconds"):
            fluid.straggler_width(10.0, bad, WIDTHS, predict)
        with pytest.raises(InputError, match="target_seconds"):
            fluid.straggler_width(10.0, bad, WIDTHS)
        with pytest.raises(InputError, match="full_seconds"):
            fluid.straggler_width(bad, 5.0, WIDTHS, predict)
    with pytest.raises(InputError, match="sub-model widths is empty"):
        fluid.straggler_width(10.0, 5.0, ())
    with pytest.raises(InputError, match=r"must lie in \(0, 1\]"):
        fluid.straggler_width(10.0, 5.0, (0.5, 1.5), predict)
    with pytest.raises(InputError, match=r"must lie in \(0, 1\]"):
        fluid.predicted_seconds(10.0, 0.0)


def test_curve_predictor_interpolates_and_extrapolates():
    predict = fluid.curve_predictor((1.0, 0.5), (2000.0, 700.0))  # any order
    assert predict(0.75) == pytest.approx(1350.0)
    assert predict(0.25) == pytest.approx(50.0)  # 700 - 0.25 * (1300 / 0.5)
    assert predict(0.1) == pytest.approx(0.7)  # would be negative: floored at 1e-3 * 700
    with pytest.raises(InputError):
        fluid.curve_predictor((0.5,), (700.0,))
    with pytest.raises(InputError):
        fluid.curve_predictor((0.5, 1.0), (700.0, -1.0))


def test_full_model_seconds_reestimates_time_over_width():
    assert fluid.full_model_seconds(6.0, 0.75) == pytest.approx(8.0)
    assert fluid.full_model_seconds(6.0, 1.0) == 6.0
    # with a curve: 6.5 s at 0.75 -> 6.5 * 2000 / 1300 = 10 s
    assert fluid.full_model_seconds(6.5, 0.75, fluid.curve_predictor(*CONVEX)) == pytest.approx(10.0)
    with pytest.raises(InputError):
        fluid.full_model_seconds(6.0, 0.0)


def test_profile_curve_selects_model_status_and_batch():
    rows = [
        {"model": "m", "width": 0.5, "batch": 20, "backend": "ort", "status": "ok", "median_us": 700.0},
        {"model": "m", "width": 1.0, "batch": 20, "backend": "ort", "status": "ok", "median_us": 2000.0},
        {"model": "m", "width": 1.0, "batch": 20, "backend": "ort", "status": "ok", "median_us": 2200.0},
        {"model": "m", "width": 0.75, "batch": 20, "backend": "ort", "status": "error", "median_us": 1.0},
        {"model": "m", "width": 0.25, "batch": 10, "backend": "ort", "status": "ok", "median_us": 100.0},
        {"model": "m", "width": 0.5, "batch": 10, "backend": "ort", "status": "ok", "median_us": 200.0},
        {"model": "m", "width": 1.0, "batch": 10, "backend": "ort", "status": "ok", "median_us": 400.0},
        {"model": "other", "width": 0.5, "batch": 20, "backend": "ort", "status": "ok", "median_us": 5.0},
        {"model": "m", "width": 0.75, "batch": 20, "backend": "ort", "status": "ok", "median_us": float("nan")},
    ]
    # preferred batch 20: widths 0.5 and 1.0, the two 1.0 rows give their median 2100
    assert fluid.profile_curve(rows, "m", batch=20) == ((0.5, 1.0), (700.0, 2100.0))
    # no preference: the series with the most widths (batch 10)
    assert fluid.profile_curve(rows, "m") == ((0.25, 0.5, 1.0), (100.0, 200.0, 400.0))
    assert fluid.profile_curve(rows, "other") is None  # one width is no curve
    assert fluid.profile_curve([], "m") is None


# -- invariant neurons ------------------------------------------------------------------


def test_relative_change_guards_zero_global_weight():
    new = np.array([1.1, 0.0, 0.0, 2.0, 0.5])
    old = np.array([1.0, 0.0, 1.0, -1.0, 0.0])
    out = fluid.relative_change(new, old)
    assert out[:4] == pytest.approx([0.1, 0.0, 1.0, 3.0])
    assert out[4] == math.inf  # w_global == 0 and the weight moved: never invariant


def test_neuron_changes_take_the_largest_incoming_change():
    model = tiny_model()
    base = tiny_state()
    base["fc1.weight"][2] = [0.0, 1.0]
    client = {k: v.copy() for k, v in base.items()}
    client["fc1.weight"][0] = [1.01, 1.0]  # neuron 0: 1 %
    client["fc1.bias"][1] = 1.5  # neuron 1: 50 % through its bias
    client["fc1.weight"][2] = [0.0, 1.02]  # neuron 2: zero weight unchanged, the other 2 %
    client["fc1.weight"][3] = [1.0, 1.0]  # neuron 3: unchanged
    client["fc2.weight"][:] = 9.0  # the next layer's input columns are not incoming weights
    changes = fluid.neuron_changes(model, client, base)
    assert changes["h"] == pytest.approx([0.01, 0.5, 0.02, 0.0], rel=1e-5)
    client["fc1.weight"][2, 0] = 0.1  # the zero global weight moved
    assert fluid.neuron_changes(model, client, base)["h"][2] == math.inf


def test_neuron_changes_move_lstm_gate_blocks_together():
    model = tiny_model(blocks=4)
    base = tiny_state(blocks=4)
    client = {k: v.copy() for k, v in base.items()}
    client["fc1.bias"][2 * 4 + 1] = 1.3  # block 2 (g gate), neuron 1
    assert fluid.neuron_changes(model, client, base)["h"] == pytest.approx([0.0, 0.3, 0.0, 0.0], rel=1e-5)


def test_invariance_scores_need_75_percent_of_non_stragglers():
    # per client changes of 3 neurons, 4 clients; quorum 0.75 -> at least 3 clients
    per_client = [
        {"h": np.array([0.01, 0.01, 0.0])},
        {"h": np.array([0.02, 0.02, 0.0])},
        {"h": np.array([0.03, 0.50, 0.0])},
        {"h": np.array([0.50, 0.60, math.inf])},
    ]
    scores = fluid.invariance_scores(per_client)["h"]
    # 3rd smallest: neuron 0 -> 0.03 (invariant for 3 of 4 at th 0.05), neuron 1 -> 0.5 (only 2 of 4)
    assert scores == pytest.approx([0.03, 0.5, 0.0])
    assert list(scores <= 0.05) == [True, False, True]
    # quorum 1.0 needs every client: neuron 2 moved a zero weight on client 3
    assert fluid.invariance_scores(per_client, quorum=1.0)["h"][2] == math.inf
    # 5 clients, 0.75 -> ceil(3.75) = 4 clients
    five = [*per_client, {"h": np.array([0.04, 0.0, 0.0])}]
    assert fluid.invariance_scores(five)["h"][0] == pytest.approx(0.04)
    with pytest.raises(InputError):
        fluid.invariance_scores([])


def test_minimum_changes_ignore_infinite():
    per_client = [
        {"h": np.array([0.2, math.inf]), "g": np.array([math.inf])},
        {"h": np.array([0.05, 0.3]), "g": np.array([math.inf])},
    ]
    minima = fluid.minimum_changes(per_client)
    assert minima["h"] == pytest.approx(0.05)
    assert math.isnan(minima["g"])


def test_raise_threshold_multiplies_by_step_until_enough_invariant():
    scores = np.array([0.005, 0.02, 0.03, 0.5, math.inf])
    # need 3 invariant: 0.01 * 1.1^k >= 0.03 first at k = 12 (1.1^11 = 2.853, 1.1^12 = 3.138)
    assert fluid.raise_threshold(0.01, scores, 3) == pytest.approx(0.01 * 1.1**12)
    # already enough: unchanged (never lowered)
    assert fluid.raise_threshold(0.01, scores, 1) == 0.01
    assert fluid.raise_threshold(1.0, scores, 2) == 1.0
    # a bigger step: 0.01 * 2^k >= 0.03 at k = 2
    assert fluid.raise_threshold(0.01, scores, 3, step=1.0) == pytest.approx(0.04)
    # more needed than finite scores: stops at the largest finite one (0.01 * 1.1^42 >= 0.5)
    assert fluid.raise_threshold(0.01, scores, 5) == pytest.approx(0.01 * 1.1**42)
    # a zero threshold first jumps to the smallest positive score
    assert fluid.raise_threshold(0.0, np.array([0.0, 0.2, 0.4]), 2) == pytest.approx(0.2)


def test_invariant_keep_drops_invariant_first_then_random():
    scores = np.array([0.3, 0.01, 0.5, 0.02, 0.04, 0.9])
    rng = np.random.default_rng(0)
    # drop 2: the two least-changing invariant neurons (1 and 3)
    assert list(fluid.invariant_keep(scores, 0.05, 4, rng)) == [0, 2, 4, 5]
    # drop 4: all three invariant (1, 3, 4) plus one drawn from {0, 2, 5}
    kept_sets = set()
    for seed in range(30):
        keep = fluid.invariant_keep(scores, 0.05, 2, np.random.default_rng(seed))
        assert len(keep) == 2 and set(keep) <= {0, 2, 5}
        kept_sets.add(tuple(keep))
    assert kept_sets == {(0, 2), (0, 5), (2, 5)}
    again = [tuple(fluid.invariant_keep(scores, 0.05, 2, np.random.default_rng(7))) for _ in range(2)]
    assert again[0] == again[1]
    with pytest.raises(InputError):
        fluid.invariant_keep(scores, 0.05, 0, rng)


def test_invariant_submodel_widths_and_random_fill_without_scores():
    model = get_model("fluid-cnn")
    sub = fluid.invariant_submodel(model, 0.5, None, {}, np.random.default_rng(1))
    assert sub.arch.sizes == (8, 32, 60)
    assert [len(i) for i in sub.indices] == [8, 32, 60]
    scores = {g: np.arange(k, dtype=np.float64) for g, k in model.groups}  # neuron i changed by i
    sub = fluid.invariant_submodel(
        model, 0.5, scores, {"conv1": 7.5, "conv2": 31.5, "fc1": 59.5}, np.random.default_rng(1)
    )
    # neurons 0 .. K/2-1 are invariant and dropped
    assert [list(i) for i in sub.indices] == [list(range(8, 16)), list(range(32, 64)), list(range(60, 120))]


def test_neurons_to_drop_uses_ceil_widths():
    model = get_model("fluid-cnn")  # conv1 16, conv2 64, fc1 120
    assert fluid.neurons_to_drop(model, [0.75, 0.5]) == {"conv1": 8, "conv2": 32, "fc1": 60}
    # 0.95: ceil(15.2) = 16, ceil(60.8) = 61, ceil(114) = 114
    assert fluid.neurons_to_drop(model, [0.95]) == {"conv1": 0, "conv2": 3, "fc1": 6}
    assert fluid.neurons_to_drop(model, []) == {"conv1": 0, "conv2": 0, "fc1": 0}


def test_only_the_training_part_of_a_time_scales_with_the_width() -> None:
    # 10 s at size 0.5, of which 4 s fixed (runner start, transfers): linear rule 4 + 6 / 0.5 = 16 s
    assert fluid.full_model_seconds(10.0, 0.5, None, fixed=4.0) == pytest.approx(16.0)
    assert fluid.full_model_seconds(10.0, 0.5, None) == pytest.approx(20.0)
    # curve with latency 1 at size 1 and 0.25 at 0.5: 4 + 6 * 4 = 28 s
    curve = fluid.curve_predictor([0.5, 1.0], [0.25, 1.0])
    assert fluid.full_model_seconds(10.0, 0.5, curve, fixed=4.0) == pytest.approx(28.0)
    # full 28 s, 4 s fixed, target 10 s: needs latency ratio <= 6 / 24 = 0.25 -> size 0.5 exactly
    assert fluid.curve_width(28.0, 10.0, [0.5, 0.75], curve, fixed=4.0) == 0.5
    assert fluid.curve_width(28.0, 10.5, [0.5, 0.75], curve, fixed=4.0) == 0.5  # 0.75 predicts 4 + 24 * 0.625 = 19
    # without the split the same full time would ask for a speed-up of 2.8 instead of 4
    assert fluid.variable_speedup(28.0, 10.0, 4.0) == pytest.approx(4.0)
    assert fluid.variable_speedup(28.0, 10.0) == pytest.approx(2.8)
    assert fluid.variable_speedup(28.0, 3.0, 4.0) == math.inf  # the fixed part alone exceeds the target
    assert fluid.variable_speedup(28.0, 4.0, 4.0) == math.inf  # ... or equals it
    # straggler_width passes the fixed part to either rule. On the curve, target 13.5 s: with the
    # 4 s fixed 0.5 predicts 10 s and 0.75 19 s (0.5 is closer), without it 7 s and 17.5 s (0.75 is);
    # linear, target 18 s: speed-up 24 / 14 -> 1 / 1.71 = 0.583 -> 0.5, without the split 28 / 18 ->
    # 0.643 -> 0.75
    assert fluid.straggler_width(28.0, 13.5, [0.5, 0.75], curve, fixed=4.0) == 0.5
    assert fluid.straggler_width(28.0, 13.5, [0.5, 0.75], curve) == 0.75
    assert fluid.straggler_width(28.0, 18.0, [0.5, 0.75], fixed=4.0) == 0.5
    assert fluid.straggler_width(28.0, 18.0, [0.5, 0.75]) == 0.75
    assert fluid.linear_width(math.inf, [0.5, 0.75]) == 0.5


def test_profile_predictor_asks_the_latency_model_for_unmeasured_widths():
    from harness.arch_counts import train_flops_per_example
    from harness.latency import fit_device

    rows = [
        {"model": "fjord-cnn", "width": w, "batch": 20, "backend": "ort", "status": "ok",
         "median_us": 30.0 + 8e-5 * train_flops_per_example("fjord-cnn", w)}
        for w in (0.25, 0.5, 1.0)
    ]  # fmt: skip
    predict = fluid.profile_predictor(rows, "fjord-cnn", batch=20)
    model = fit_device([{**r, "device": "d"} for r in rows]).latency_model("fjord-cnn")
    for size in fluid.PAPER_WIDTHS:  # 0.95, 0.85, ...: none of them measured
        assert predict(size) == model.predict(size).value
    # a model outside the zoo keeps the measured curve
    curve_rows = [{**r, "model": "m"} for r in rows]
    interpolated = fluid.profile_predictor(curve_rows, "m")
    assert interpolated(0.75) == pytest.approx((rows[1]["median_us"] + rows[2]["median_us"]) / 2)
    assert fluid.profile_predictor(rows[:1], "fjord-cnn") is None
