import numpy as np
import pytest

from exporters.arch import Dim
from exporters.userinput import InputError
from exporters.zoo import ZooModel
from fl.records import ClientFailure, ClientSpec, TrainRes
from fl.runlog import decode_state, encode_state
from fl.strategies import strategy_class
from fl.strategies.fluid import FLuID


def tiny_model() -> ZooModel:
    """fc1 (4 hidden neurons, 2 inputs) -> fc2 (2 outputs); the builder is never called here."""
    layouts = {
        "fc1.weight": (Dim("h"), None),
        "fc1.bias": (Dim("h"),),
        "fc2.weight": (None, Dim("h")),
        "fc2.bias": (None,),
    }
    return ZooModel("tiny", "test", (("h", 4),), lambda group_sizes: None, layouts, (2,), "float32", 2)


def initial() -> dict[str, np.ndarray]:
    return {
        "fc1.weight": np.ones((4, 2), dtype=np.float32),
        "fc1.bias": np.ones(4, dtype=np.float32),
        "fc2.weight": np.ones((2, 4), dtype=np.float32),
        "fc2.bias": np.zeros(2, dtype=np.float32),
    }


CLIENTS = [ClientSpec(f"c{i}", 10) for i in range(4)]

#: Relative change of each hidden neuron's incoming weights and bias per client (4 clients x 4 neurons).
#: Neurons 1 and 3 barely move on 3 of the 4 clients; neurons 0 and 2 move on all.
CHANGES = np.array(
    [
        [0.5, 0.001, 0.4, 0.002],
        [0.6, 0.002, 0.3, 0.001],
        [0.7, 0.001, 0.5, 0.003],
        [0.8, 0.9, 0.6, 0.9],
    ]
)


def result(ins, seconds, scale=None, num_examples=10, **times):
    params = {k: v.copy() for k, v in ins.parameters.items()}
    if scale is not None:
        params["fc1.weight"] *= (1 + scale)[:, None].astype(np.float32)
        params["fc1.bias"] *= (1 + scale).astype(np.float32)
    return TrainRes(ins.cid, ins.submodel, params, num_examples, compute_seconds=seconds, **times)


def play(strategy, rnd, seconds, changes=None):
    """Configure a round, let every client 'train' (scale its hidden neurons) and aggregate."""
    ins = strategy.configure_round(rnd, CLIENTS, None)
    results = []
    for i, client in enumerate(CLIENTS):
        scale = None
        if changes is not None and ins[client.cid].submodel.arch.sizes == (4,):
            scale = changes[i]
        results.append(result(ins[client.cid], seconds[client.cid], scale))
    strategy.aggregate_round(rnd, results, [])
    return ins


def test_registered_under_fluid():
    assert strategy_class("fluid") is FLuID


def test_round_zero_trains_everyone_full():
    strategy = FLuID(tiny_model(), initial())
    ins = strategy.configure_round(0, CLIENTS, None)
    assert all(i.submodel.arch.sizes == (4,) for i in ins.values())
    assert not any(i.config["straggler"] for i in ins.values())


def test_straggler_and_linear_width_from_times():
    strategy = FLuID(tiny_model(), initial())
    play(strategy, 0, {"c0": 12.0, "c1": 4.0, "c2": 8.0, "c3": 5.0})
    ins = strategy.configure_round(1, CLIENTS, None)
    # target = next slowest = 8 s; speed-up 1.5; 1/1.5 = 0.667 -> 0.65; ceil(0.65 * 4) = 3 neurons
    assert strategy.stragglers == ["c0"]
    assert strategy.target_seconds == 8.0
    assert strategy.client_widths == {"c0": 0.65}
    assert ins["c0"].submodel.arch.sizes == (3,)
    assert ins["c0"].config["straggler"] is True and ins["c0"].config["width"] == 0.65
    assert ins["c0"].parameters["fc1.weight"].shape == (3, 2)
    assert all(ins[c].submodel.arch.sizes == (4,) for c in ("c1", "c2", "c3"))


def play_with_device_metrics(strategy, seconds, cid, metrics):
    """Play round 0 with ``seconds`` per client, ``cid``'s result carrying a devices executor's ``metrics``."""
    ins = strategy.configure_round(0, CLIENTS, None)
    results = [result(ins[c.cid], seconds[c.cid]) for c in CLIENTS]
    i = [c.cid for c in CLIENTS].index(cid)
    results[i] = TrainRes(cid, ins[cid].submodel, results[i].parameters, 10, compute_seconds=seconds[cid],
                          metrics=metrics)  # fmt: skip
    strategy.aggregate_round(0, results, [])


def test_a_device_clients_fixed_start_cost_does_not_scale_with_the_size():
    strategy = FLuID(tiny_model(), initial())
    # c0's runner spent 6 of its 12 s outside the training steps (start, loading)
    play_with_device_metrics(strategy, {"c0": 12.0, "c1": 4.0, "c2": 8.0, "c3": 5.0}, "c0", {"step_seconds": 6.0})
    strategy.configure_round(1, CLIENTS, None)
    # target 8 s: only the 6 s of steps scale, speed-up (12 - 6) / (8 - 6) = 3 -> 1/3 -> 0.5 (not 1/1.5 -> 0.65)
    assert strategy.client_widths == {"c0": 0.5}


def test_straggler_fraction_gives_each_straggler_its_own_width():
    strategy = FLuID(tiny_model(), initial(), straggler_fraction=0.5)
    play(strategy, 0, {"c0": 12.0, "c1": 4.0, "c2": 8.0, "c3": 5.0})
    strategy.configure_round(1, CLIENTS, None)
    # 2 stragglers, target 5 s: c0 12/5 -> 0.417 -> 0.5; c2 8/5 -> 0.625 -> 0.65
    assert strategy.stragglers == ["c0", "c2"]
    assert strategy.client_widths == {"c0": 0.5, "c2": 0.65}


def test_slowdown_multiplies_compute_time_only():
    strategy = FLuID(tiny_model(), initial(), slowdown='{"c1": 3.0}')
    ins = strategy.configure_round(0, CLIENTS, None)
    res = [result(ins[c.cid], 2.0, download_seconds=1.0, upload_seconds=1.0) for c in CLIENTS]
    _, metrics = strategy.aggregate_round(0, res, [])
    # c1: 1 + 3 * 2 + 1 = 8 s; others 4 s
    assert strategy.last_seconds == {"c0": 4.0, "c1": 8.0, "c2": 4.0, "c3": 4.0}
    assert metrics["round_seconds"] == 8.0
    strategy.configure_round(1, CLIENTS, None)
    assert strategy.stragglers == ["c1"] and strategy.client_widths == {"c1": 0.5}


def test_straggler_switching_after_recalibration_reestimates_time_over_width():
    strategy = FLuID(tiny_model(), initial(), calibration_period=2, widths="0.5")
    play(strategy, 0, {"c0": 12.0, "c1": 4.0, "c2": 8.0, "c3": 5.0})
    # round 1: calibrate -> c0 at 0.5; c0 now takes 6 s on its half model, c2 got slow (20 s)
    play(strategy, 1, {"c0": 6.0, "c1": 4.0, "c2": 20.0, "c3": 5.0})
    assert strategy.stragglers == ["c0"] and strategy.last_calibration == 1
    # round 2: not a calibration round (period 2): c0 stays the straggler
    ins = play(strategy, 2, {"c0": 6.0, "c1": 4.0, "c2": 20.0, "c3": 5.0})
    assert strategy.stragglers == ["c0"] and ins["c0"].submodel.arch.sizes == (2,)
    # round 3: recalibration. c0's full-model time is re-estimated as 6 / 0.5 = 12 s, so c2 (20 s)
    # becomes the straggler with target 12 s and c0 trains the full model again.
    ins = strategy.configure_round(3, CLIENTS, None)
    assert strategy.last_calibration == 3
    assert strategy.stragglers == ["c2"]
    assert strategy.target_seconds == pytest.approx(12.0)
    assert ins["c0"].submodel.arch.sizes == (4,)
    assert ins["c2"].submodel.arch.sizes == (2,)


def test_no_straggler_switch_when_old_straggler_is_still_slowest_at_full_size():
    strategy = FLuID(tiny_model(), initial(), widths="0.5")
    play(strategy, 0, {"c0": 12.0, "c1": 4.0, "c2": 8.0, "c3": 5.0})
    # c0 on its half model takes 6 s: measured it is no longer the slowest (c2 8 s),
    # but its full-model estimate (12 s) is, so it stays the straggler.
    play(strategy, 1, {"c0": 6.0, "c1": 4.0, "c2": 8.0, "c3": 5.0})
    strategy.configure_round(2, CLIENTS, None)
    assert strategy.stragglers == ["c0"] and strategy.target_seconds == 8.0


def test_timed_out_client_counts_with_its_waited_seconds():
    strategy = FLuID(tiny_model(), initial())
    ins = strategy.configure_round(0, CLIENTS, None)
    results = [result(ins[c], 4.0) for c in ("c1", "c2", "c3")]
    strategy.aggregate_round(0, results, [ClientFailure("c0", "timeout", "too slow", seconds=10.0)])
    strategy.configure_round(1, CLIENTS, None)
    # 10 s against a target of 4 s: speed-up 2.5 -> 1/2.5 = 0.4 -> 0.5
    assert strategy.stragglers == ["c0"] and strategy.client_widths == {"c0": 0.5}


def _calibrated_widths(profiles, **options):
    """Round 0 with c0 (device "pi") at 10 s and the next slowest at 9.2 s, then calibrate."""
    clients = [ClientSpec("c0", 10, device="pi"), *CLIENTS[1:]]
    times = {"c0": 10.0, "c1": 4.0, "c2": 9.2, "c3": 5.0}
    strategy = FLuID(tiny_model(), initial(), **options)
    ins = strategy.configure_round(0, clients, profiles)
    strategy.aggregate_round(0, [result(ins[c.cid], times[c.cid]) for c in clients], [])
    strategy.configure_round(1, clients, profiles)
    return strategy.client_widths


def test_width_from_device_profile_curve():
    rows = [
        {"model": "tiny", "width": w, "batch": 20, "backend": "ort", "status": "ok", "median_us": lat}
        for w, lat in zip((0.25, 0.5, 0.75, 1.0), (1000.0, 1200.0, 1400.0, 1600.0), strict=True)
    ]
    # curve: 0.85 -> 10 * 1480 / 1600 = 9.25 s, 0.05 s over 9.2; 0.75 -> 8.75 s, 0.45 s under
    # (the linear rule would give 0.95)
    assert _calibrated_widths({"pi": rows}) == {"c0": 0.85}
    # without profiles, with use_profiles off, or with another device's profile only: the linear rule
    assert _calibrated_widths(None) == {"c0": 0.95}
    assert _calibrated_widths({"pi": rows}, use_profiles="false") == {"c0": 0.95}
    assert _calibrated_widths({"nano": rows}) == {"c0": 0.95}
    # another model's rows are no curve either
    assert _calibrated_widths({"pi": [{**r, "model": "other"} for r in rows]}) == {"c0": 0.95}


def test_invariant_dropout_drops_neurons_invariant_for_most_non_stragglers():
    strategy = FLuID(tiny_model(), initial(), widths=[0.5])
    play(strategy, 0, {"c0": 12.0, "c1": 4.0, "c2": 8.0, "c3": 5.0}, CHANGES)
    # scores (3rd smallest change of 4 clients): [0.7, 0.002, 0.5, 0.003]
    assert strategy.scores["h"] == pytest.approx([0.7, 0.002, 0.5, 0.003], rel=1e-3)
    # initial threshold: the minimum change, 0.001
    assert strategy.thresholds["h"] == pytest.approx(0.001, rel=1e-3)
    ins = strategy.configure_round(1, CLIENTS, None)
    # c0 keeps 2 of 4: threshold raised 0.001 * 1.1^k until 2 neurons are invariant:
    # 0.001 * 1.1^12 = 0.00314 >= 0.003 -> neurons 1 and 3 dropped
    assert strategy.thresholds["h"] == pytest.approx(0.001 * 1.1**12, rel=1e-3)
    assert list(ins["c0"].submodel.indices[0]) == [0, 2]
    assert ins["c0"].parameters["fc2.weight"].shape == (2, 2)


def test_ordered_and_random_baselines():
    ordered = FLuID(tiny_model(), initial(), widths=[0.5], dropout="ordered")
    play(ordered, 0, {"c0": 12.0, "c1": 4.0, "c2": 8.0, "c3": 5.0}, CHANGES)
    assert list(ordered.configure_round(1, CLIENTS, None)["c0"].submodel.indices[0]) == [0, 1]
    draws = set()
    for seed in range(12):
        rnd_strategy = FLuID(tiny_model(), initial(), seed=seed, widths=[0.5], dropout="random")
        play(rnd_strategy, 0, {"c0": 12.0, "c1": 4.0, "c2": 8.0, "c3": 5.0})
        first = tuple(rnd_strategy.configure_round(1, CLIENTS, None)["c0"].submodel.indices[0])
        again = tuple(rnd_strategy.configure_round(1, CLIENTS, None)["c0"].submodel.indices[0])
        assert first == again  # seeded by (seed, round, client)
        draws.add(first)
    assert len(draws) > 1


def test_fixed_width_overrides_time_based_width():
    strategy = FLuID(tiny_model(), initial(), width=0.75, widths=0.5)  # a bare number, as --opt widths=0.5 gives
    play(strategy, 0, {"c0": 12.0, "c1": 4.0, "c2": 8.0, "c3": 5.0})
    ins = strategy.configure_round(1, CLIENTS, None)
    assert strategy.client_widths == {"c0": 0.75} and ins["c0"].submodel.arch.sizes == (3,)


def test_aggregation_denominator_counts_only_holders():
    strategy = FLuID(tiny_model(), initial(), widths=[0.5], dropout="ordered")
    play(strategy, 0, {"c0": 12.0, "c1": 4.0, "c2": 8.0, "c3": 5.0})
    strategy.global_state = initial()
    ins = strategy.configure_round(1, CLIENTS, None)  # c0 holds hidden neurons 0 and 1
    results = []
    for value, client in zip((2.0, 5.0, 5.0, 5.0), CLIENTS, strict=True):
        params = {k: np.full_like(v, value) for k, v in ins[client.cid].parameters.items()}
        num = 30 if client.cid == "c0" else 10
        results.append(TrainRes(client.cid, ins[client.cid].submodel, params, num, compute_seconds=1.0))
    new, metrics = strategy.aggregate_round(1, results, [])
    # rows 0-1: (30 * 2 + 3 * 10 * 5) / 60 = 3.5; rows 2-3: only the three full clients hold them -> 5
    assert new["fc1.weight"][:, 0] == pytest.approx([3.5, 3.5, 5.0, 5.0])
    assert new["fc2.weight"][0] == pytest.approx([3.5, 3.5, 5.0, 5.0])
    assert new["fc2.bias"] == pytest.approx([3.5, 3.5])  # every client holds the classifier bias
    assert metrics["stragglers"] == 1.0 and metrics["straggler_width"] == 0.5


def test_state_round_trip_resumes_identically():
    def run(strategy, rounds):
        seen = []
        for rnd in rounds:
            times = {"c0": 12.0 - rnd, "c1": 4.0, "c2": 8.0 + 2 * rnd, "c3": 5.0}
            ins = play(strategy, rnd, times, CHANGES * (1 + 0.1 * rnd))
            seen.append({cid: tuple(i.submodel.indices[0]) for cid, i in ins.items()})
        return seen

    options = {"widths": [0.75, 0.5], "dropout": "invariant", "threshold_init_rounds": 2}
    straight = FLuID(tiny_model(), initial(), seed=3, **options)
    seen_straight = run(straight, range(5))

    first = FLuID(tiny_model(), initial(), seed=3, **options)
    seen_first = run(first, range(2))
    resumed = FLuID(tiny_model(), initial(), seed=3, **options)
    resumed.load_state(decode_state(encode_state(first.state())))
    seen_resumed = run(resumed, range(2, 5))

    assert seen_first + seen_resumed == seen_straight
    assert resumed.thresholds == straight.thresholds
    assert resumed.stragglers == straight.stragglers and resumed.client_widths == straight.client_widths
    for name, value in straight.global_state.items():
        assert np.array_equal(resumed.global_state[name], value)


def test_bad_options_are_input_errors():
    with pytest.raises(InputError, match="dropout"):
        FLuID(tiny_model(), initial(), dropout="prefix")
    with pytest.raises(InputError, match="widths"):
        FLuID(tiny_model(), initial(), widths="0.5,1.5")
    with pytest.raises(InputError, match="slowdown"):
        FLuID(tiny_model(), initial(), slowdown="{c0: 3}")
    with pytest.raises(InputError, match="calibration_period"):
        FLuID(tiny_model(), initial(), calibration_period=0)
    with pytest.raises(InputError):
        FLuID(tiny_model(), initial(), width=1.5)


def test_target_and_size_come_from_the_predicted_round_when_there_is_a_predictor():
    strategy = FLuID(tiny_model(), initial())
    # a round-cost model: c0 has a 3 s fixed cost, its steps cost 2 s per neuron; the others 1 s + 1 s per neuron
    fixed = {"c0": 3.0, "c1": 1.0, "c2": 1.0, "c3": 1.0}
    per_neuron = {"c0": 2.0, "c1": 1.0, "c2": 1.0, "c3": 1.0}
    strategy.round_predictor = lambda client, arch: fixed[client.cid] + per_neuron[client.cid] * arch.sizes[0]
    play(strategy, 0, {"c0": 12.0, "c1": 4.0, "c2": 8.0, "c3": 5.0})  # measured: c0 straggles, c2 next slowest
    strategy.configure_round(1, CLIENTS, None)
    assert strategy.stragglers == ["c0"]
    # target: c2's predicted full round, 1 + 4 = 5 s (not its measured 8 s); c0's predicted round at a size:
    # 3 + 2 * ceil(4 s); 0.5 -> 2 neurons -> 7 s, 0.65 -> 3 -> 9 s: none meets 5 s, so the smallest size
    assert strategy.target_seconds == 5.0
    assert strategy.client_widths == {"c0": 0.5}
    # with a smaller fixed cost the size whose predicted round is closest to the target is taken:
    # 0.5 -> 0.5 + 2 * 2 = 4.5 s (0.5 s under 5 s), 0.65 -> 0.5 + 2 * 3 = 6.5 s (1.5 s over)
    fixed["c0"] = 0.5
    strategy.last_calibration = None
    strategy.configure_round(2, CLIENTS, None)
    assert strategy.client_widths == {"c0": 0.5} and strategy.target_seconds == 5.0
    # 1.6 s per neuron: 0.5 -> 3.7 s (1.3 s under), 0.65 and 0.75 -> 3 neurons, 5.3 s (0.3 s over):
    # the closer round, above the target; 0.65 and 0.75 tie and the smaller wins
    fixed["c0"], per_neuron["c0"] = 0.5, 1.6
    strategy.last_calibration = None
    strategy.configure_round(3, CLIENTS, None)
    assert strategy.client_widths == {"c0": 0.65}


def test_without_a_prediction_for_every_client_the_measured_rules_apply():
    strategy = FLuID(tiny_model(), initial())
    strategy.round_predictor = lambda client, arch: None if client.cid == "c3" else 1.0
    play(strategy, 0, {"c0": 12.0, "c1": 4.0, "c2": 8.0, "c3": 5.0})
    strategy.configure_round(1, CLIENTS, None)
    # as test_straggler_and_linear_width
    assert strategy.target_seconds == 8.0 and strategy.client_widths == {"c0": 0.65}


def test_a_round_that_opened_the_runners_sessions_is_judged_without_that_cost():
    strategy = FLuID(tiny_model(), initial())
    # c1 took 12 s, 9 of them opening its runner's sessions: 3 s once they are open, so c0 straggles
    opened = {"session_open_seconds": 9.0, "step_seconds": 2.0}
    play_with_device_metrics(strategy, {"c0": 9.0, "c1": 12.0, "c2": 8.0, "c3": 5.0}, "c1", opened)
    strategy.configure_round(1, CLIENTS, None)
    # target c2's 8 s; c0's speed-up 9 / 8 = 1.125 -> 1/1.125 = 0.89 -> 0.85 on the paper's grid
    assert strategy.stragglers == ["c0"] and strategy.target_seconds == 8.0
    assert strategy.client_widths == {"c0": 0.85}


def test_a_measured_straggler_the_model_puts_under_the_target_is_sized_by_its_measured_time():
    strategy = FLuID(tiny_model(), initial())
    # the model predicts c0 (1 s) faster than c2 (5 s); the measurement has c0 straggle (12 s against 8 s)
    strategy.round_predictor = lambda client, arch: 1.0 if client.cid == "c0" else 1.0 + arch.sizes[0]
    play(strategy, 0, {"c0": 12.0, "c1": 4.0, "c2": 8.0, "c3": 5.0})
    strategy.configure_round(1, CLIENTS, None)
    # 12 s / 8 s measured, as without a model
    assert strategy.stragglers == ["c0"] and strategy.client_widths == {"c0": 0.65}


def test_a_checkpoint_with_the_old_memory_keys_loads():
    strategy = FLuID(tiny_model(), initial(), widths=[0.5])
    play(strategy, 0, {"c0": 12.0, "c1": 4.0, "c2": 8.0, "c3": 5.0})
    play(strategy, 1, {"c0": 6.0, "c1": 4.0, "c2": 8.0, "c3": 5.0})
    state = strategy.state()
    memory = dict(state["fluid"])
    memory["rates"] = memory.pop("client_widths")  # as checkpoints written before the rename
    memory["last_rate"] = memory.pop("last_width")
    resumed = FLuID(tiny_model(), initial(), widths=[0.5])
    resumed.load_state(decode_state(encode_state({**state, "fluid": memory})))
    assert resumed.client_widths == strategy.client_widths == {"c0": 0.5}
    assert resumed.last_width == strategy.last_width and resumed.last_width["c0"] == 0.5
    assert set(resumed.state()["fluid"]) == set(state["fluid"])  # written back under the current keys
