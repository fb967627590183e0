"""Round-cost functions from a real profile store (fl/roundcost.py), worked from the stored lines."""

from __future__ import annotations

import pytest

from exporters.flops import count
from exporters.userinput import InputError
from exporters.zoo import get_model
from fl.roundcost import (
    measured_models,
    modelled_transfer_seconds,
    parse_links,
    round_cost_from_rows,
    round_cost_from_store,
)
from fl.scheduling.configs import ProfileConfig
from harness.latency import fit
from harness.roundcost import RoundCostModel
from harness.store import ProfileStore
from tests.fl.scheduling.profiles import store_lines

MODEL = get_model("fjord-cnn")
LINES = {"fast": (50.0, 2e-4), "slow": (400.0, 1.5e-3)}


@pytest.fixture
def cells(tmp_path):
    path = tmp_path / "p.db"
    store_lines(path, LINES)
    with ProfileStore(path, create=False) as store:
        return store.latest_cells()


def per_image_us(device: str, width: float) -> float:
    a, b = LINES[device]
    return a + b * count(MODEL, MODEL.arch(width)).train_flops


def test_compute_time_is_steps_times_batch_times_the_fitted_latency(cells):
    cost = round_cost_from_rows(cells, "fjord-cnn", 20, ["fast", "slow"])
    models = fit(cells)
    for device in LINES:
        for width in (0.25, 0.375, 1.0):  # 0.375 was never measured: predicted by the latency model
            latency = models[device].latency[models[device].key("fjord-cnn", 20, "ort")]
            seconds = cost(device, MODEL.arch(width), 7, 0, 0)
            assert seconds == pytest.approx(7 * 20 * latency.predict(MODEL.arch(width)).value, rel=1e-12)
            # the stored cells lie on a line in FLOPs, which the model recovers (its fixed share of
            # about 9 % at width 1 is pulled a little by the latency fit's tighter fixed-cost prior)
            assert seconds == pytest.approx(7 * 20 * per_image_us(device, width) * 1e-6, rel=0.02)
    assert cost("fast", MODEL.arch(1.0), 0, 10**6, 10**6) == 0.0  # no link, no transfer time
    assert cost("slow", MODEL.arch(1.0), 3, 0, 0) > cost("fast", MODEL.arch(1.0), 3, 0, 0)


def test_a_link_adds_bytes_over_rate_plus_delay_each_way(cells):
    links = parse_links("slow=8000:20", ["fast", "slow"])
    assert links == {"slow": (8000.0, 20.0)}
    cost = round_cost_from_rows(cells, "fjord-cnn", 20, ["fast", "slow"], links=links)
    # 1e6 bytes = 8e6 bit at 8e6 bit/s = 1 s, plus 20 ms; 5e5 bytes up = 0.5 s + 20 ms
    assert cost("slow", MODEL.arch(0.5), 0, 10**6, 5 * 10**5) == pytest.approx(1.02 + 0.52)
    assert cost("fast", MODEL.arch(0.5), 0, 10**6, 5 * 10**5) == 0.0
    assert parse_links("1000", ["a", "b"]) == {"a": (1000.0, 0.0), "b": (1000.0, 0.0)}
    assert parse_links(None, ["a"]) == {}


@pytest.mark.parametrize(
    ("spec", "words"),
    [("x=100", "device 'x' is not in the population"), ("a=0", "rate must be positive"), ("a=fast", "not KBIT")],
)
def test_bad_links_are_refused(spec, words):
    with pytest.raises(InputError, match=words):
        parse_links(spec, ["a"])


def test_measured_models_lists_every_device_also_without_usable_cells(cells):
    rows = cells.to_dict("records") + [{"device": "dead", "model": "fjord-cnn", "status": "timeout"}]
    assert measured_models(rows) == {"fast": {"fjord-cnn"}, "slow": {"fjord-cnn"}, "dead": set()}


def test_the_run_batch_is_used_when_measured_else_the_only_one(tmp_path, cells):
    assert round_cost_from_rows(cells, "fjord-cnn", 32, ["fast"])("fast", MODEL.arch(1.0), 1, 0, 0) == pytest.approx(
        32 * per_image_us("fast", 1.0) * 1e-6,
        rel=0.01,  # the batch-20 line, 32 images a step
    )
    path = tmp_path / "two.db"
    store_lines(path, {"fast": (10.0, 1e-4)}, batch=8)
    store_lines(path, {"fast": (20.0, 1e-4)}, batch=20)
    with ProfileStore(path, create=False) as store:
        two = store.latest_cells()
    at_8 = round_cost_from_rows(two, "fjord-cnn", 8, ["fast"])("fast", MODEL.arch(1.0), 1, 0, 0)
    assert at_8 == pytest.approx(8 * (10.0 + 1e-4 * count(MODEL, MODEL.arch(1.0)).train_flops) * 1e-6, rel=0.01)
    with pytest.raises(InputError, match="measured fjord-cnn at batches 8, 20, not at the run's batch 32"):
        round_cost_from_rows(two, "fjord-cnn", 32, ["fast"])
    with pytest.raises(InputError, match="device 'nano' has no usable profile"):
        round_cost_from_rows(cells, "fjord-cnn", 20, ["nano"])


def _cost(device: str, **overrides: object) -> RoundCostModel:
    values: dict[str, object] = {
        "device": device, "model": "fjord-cnn", "width": 1.0, "batch": 20, "backend": "ort", "optimizer": "adamw",
        "threads": 1, "fixed_s": 0.8, "step_s": 0.01, "down_s_per_byte": 2e-8, "down_latency_s": 0.05,
        "up_s_per_byte": 3e-8, "up_latency_s": 0.07, "measured_at": 1.0,
    }  # fmt: skip
    values.update(overrides)
    return RoundCostModel(**values)  # type: ignore[arg-type]


def test_a_measured_round_cost_adds_its_fixed_cost_and_transfer_lines(tmp_path):
    path = tmp_path / "p.db"
    campaign = store_lines(path, LINES)
    warnings: list[str] = []
    with ProfileStore(path, create=False) as store:
        store.record_round_cost(campaign, _cost("slow"))
        cost = round_cost_from_store(
            store, "fjord-cnn", 20, {d: ProfileConfig(batch=20, backend="ort", optimizer="adamw", threads=1)
                                     for d in LINES}, warn=warnings.append,
        )  # fmt: skip
    compute = 5 * 20 * per_image_us("slow", 0.5) * 1e-6
    down, up = 0.05 + 1e6 * 2e-8, 0.07 + 4e5 * 3e-8
    assert cost("slow", MODEL.arch(0.5), 5, 10**6, 4 * 10**5) == pytest.approx(0.8 + compute + down + up, rel=0.01)
    assert cost("slow", MODEL.arch(0.5), 0, 0, 0) == pytest.approx(0.8)  # nothing trained or sent: the fixed cost
    # fast has no round-cost measurement: latency alone, and a warning that says so
    assert cost("fast", MODEL.arch(0.5), 5, 10**6, 10**6) == pytest.approx(
        5 * 20 * per_image_us("fast", 0.5) * 1e-6, rel=0.01
    )
    assert len(warnings) == 1 and "'fast' has no round-cost measurement" in warnings[0]


def test_a_link_replaces_the_measured_transfer(tmp_path):
    path = tmp_path / "p.db"
    campaign = store_lines(path, LINES)
    with ProfileStore(path, create=False) as store:
        store.record_round_cost(campaign, _cost("slow"))
        cost = round_cost_from_store(
            store, "fjord-cnn", 20, {"slow": ProfileConfig(batch=20)}, links={"slow": (8000.0, 20.0)}
        )
    assert cost("slow", MODEL.arch(1.0), 0, 10**6, 0) == pytest.approx(0.8 + 1.02)


def test_a_profile_of_another_configuration_is_used_with_a_warning_naming_the_difference(tmp_path):
    path = tmp_path / "p.db"
    campaign = store_lines(path, {"slow": LINES["slow"]}, optimizer="adamw")
    store_lines(path, {"slow": (10.0, 1e-5)}, optimizer="sgd", threads=4)
    warnings: list[str] = []
    with ProfileStore(path, create=False) as store:
        store.record_round_cost(campaign, _cost("slow", optimizer="adamw", fixed_s=2.0))
        want = ProfileConfig(batch=20, backend="ort", optimizer="adamw", threads=2)
        cost = round_cost_from_store(store, "fjord-cnn", 20, {"slow": want}, warn=warnings.append)
        # the adamw profile (threads 1) is nearer than the sgd one (threads 4): an optimizer weighs more
        assert cost("slow", MODEL.arch(1.0), 3, 0, 0) == pytest.approx(
            2.0 + 3 * 20 * per_image_us("slow", 1.0) * 1e-6, rel=0.01
        )
        assert any("differs in threads 1 (run: 2)" in w for w in warnings), warnings
        assert not any("optimizer" in w for w in warnings)
        with pytest.raises(InputError, match="device 'mid' has no measured profile of fjord-cnn"):
            round_cost_from_store(store, "fjord-cnn", 20, {"mid": want})


def test_a_calibrated_prediction_follows_the_device_s_measured_rounds() -> None:
    from fl.records import ClientSpec
    from fl.roundcost import CalibratedPredictor, ClientRoundPredictor

    model = get_model("fjord-cnn")

    def cost(device, arch, steps, down, up):  # fixed 0.1 s + 10 ms per step at full width, scaled by width
        return 0.1 + steps * 0.01 * arch.sizes[0] / model.group_sizes[0]

    base = ClientRoundPredictor(cost, batch=20, epochs=1, devices=frozenset({"pi", "phone"}))
    predictor = CalibratedPredictor(base, window=3)
    pi = ClientSpec("c0", capacity=1.0, num_examples=200, device="pi")  # 10 steps
    phone = ClientSpec("c1", capacity=1.0, num_examples=200, device="phone")
    full, half = model.arch(1.0), model.arch(0.5)
    assert predictor(pi, full) == pytest.approx(0.2)  # nothing measured yet: the profile's
    predictor.observe("pi", 0.2, 0.4)
    assert predictor(pi, full) == pytest.approx(0.2)  # one round is not enough to move it
    predictor.rounds.clear()
    for measured in (0.3, 0.26, 0.5):
        predictor.observe("pi", 0.2, measured)
    assert predictor.factor("pi") == pytest.approx(1.5)  # median of 1.5, 1.3, 2.5
    assert predictor(pi, full) == pytest.approx(0.3)
    assert predictor(pi, half) == pytest.approx(1.5 * 0.15)  # the profile's shape, the device's level
    assert predictor.base(pi, half) == pytest.approx(0.15)
    assert predictor(phone, full) == pytest.approx(0.2)  # another device keeps its own
    for measured in (0.2, 0.2, 0.2):  # only the last `window` rounds count
        predictor.observe("pi", 0.2, measured)
    assert predictor.factor("pi") == pytest.approx(1.0)
    predictor.observe("pi", 0.0, 0.3)  # an unusable prediction is ignored
    assert predictor.factor("pi") == pytest.approx(1.0)
    assert predictor(ClientSpec("c2", capacity=1.0, num_examples=200, device=None), full) is None


def test_host_disturbed_flags_a_round_above_its_cheapest_neighbour() -> None:
    from fl.roundcost import host_disturbed

    # 12 ms per step among rounds of 10 ms: 20 % above the cheapest neighbour
    assert host_disturbed([0.012, 0.010, 0.0105, 0.010]) == [True, False, False, False]
    # exactly at the limit is not above it; a lone round has no reference; unmeasured rounds are skipped
    assert host_disturbed([0.011, 0.010], limit=0.10) == [False, False]
    assert host_disturbed([0.5]) == [False]
    assert host_disturbed([None, 0.010, None, 0.013]) == [False, False, False, True]
    # the reference is the cheapest round within `span` rounds: a level that moved for good ages out
    levels = [0.010, 0.010, 0.012, 0.012, 0.012, 0.012]
    assert host_disturbed(levels, span=2) == [False, False, True, True, False, False]
    assert host_disturbed(levels, span=5) == [False, False, True, True, True, True]


def test_cpu_starved_flags_a_round_that_got_less_of_the_cpu_than_its_neighbours() -> None:
    from fl.roundcost import cpu_starved

    # a 0.14-core device: 0.10 of a cpu is 40 % more wall time per CPU second than 0.14
    assert cpu_starved([0.14, 0.10, 0.138, 0.14]) == [False, True, False, False]
    # 0.14 / 1.1 = 0.1273: just above is within the limit, below is flagged
    assert cpu_starved([0.14, 0.128]) == [False, False]
    assert cpu_starved([0.14, 0.126]) == [False, True]
    # a round above its neighbours is never starved; unmeasured or empty loops are skipped
    assert cpu_starved([0.14, 0.20, 0.14]) == [True, False, True]
    assert cpu_starved([None, 0.0, 0.14]) == [False, False, False]


def test_transfer_stalled_flags_transfers_slower_than_the_neighbours_by_a_share_of_the_round() -> None:
    from fl.roundcost import transfer_stalled

    mb = 200_000.0
    transfers = [(0.003, mb), (0.276, mb), (0.004, mb), (0.003, mb)]
    # 0.273 s more than the fastest neighbour's 3 ms, in a 0.69 s round: stalled
    assert transfer_stalled(transfers, [0.42, 0.69, 0.42, 0.42]) == [False, True, False, False]
    # the same excess in a round 3 s long is under 10 % of it
    assert transfer_stalled(transfers, [0.42, 3.0, 0.42, 0.42]) == [False, False, False, False]
    # a payload 4 times larger may take 4 times longer than a neighbour's; 5 times is 0.3 s over that in 1 s
    assert transfer_stalled([(0.1, mb), (0.4, 4 * mb)], [1.0, 1.0]) == [False, False]
    assert transfer_stalled([(0.1, mb), (0.48, 4 * mb), (0.1, mb)], [1.0, 1.0, 1.0]) == [False, False, False]
    assert transfer_stalled([(0.1, mb), (0.55, 4 * mb)], [1.0, 1.0]) == [False, True]
    # a smaller payload is held to the larger one's time, never less: latency is not stretched down
    assert transfer_stalled([(0.1, 4 * mb), (0.1, mb)], [1.0, 1.0]) == [False, False]
    # a lone round, unknown transfers or times, and empty payloads are not judged
    assert transfer_stalled([(0.5, mb)], [1.0]) == [False]
    assert transfer_stalled([None, (0.5, mb), (0.001, mb)], [1.0, None, 1.0]) == [False, False, False]
    assert transfer_stalled([(0.5, 0.0), (0.001, mb)], [1.0, 1.0]) == [False, False]
    # the reference comes from within `span` rounds only
    far = [(0.001, mb), (0.3, mb), (0.3, mb), (0.3, mb)]
    assert transfer_stalled(far, [1.0] * 4, span=1) == [False, True, False, False]


def test_the_cpu_reference_is_the_profile_s_cpu_time_per_step_at_any_architecture(cells) -> None:
    import numpy as np

    from fl.roundcost import cpu_reference_from_rows

    rows = cells.copy()
    rows["cpu_median_us"] = np.where(rows["device"] == "fast", rows["median_us"] * 0.5, np.nan)  # slow: none
    reference = cpu_reference_from_rows(rows, "fjord-cnn", 20)
    for width in (0.25, 0.375, 1.0):  # 0.375 was never measured: the fitted line in FLOPs
        expected = 20 * 0.5 * per_image_us("fast", width) * 1e-6
        assert reference("fast", MODEL.arch(width)) == pytest.approx(expected, rel=0.02)
    assert reference("slow", MODEL.arch(1.0)) is None  # no CPU times in its profile
    assert reference("nano", MODEL.arch(1.0)) is None  # no profile
    assert cpu_reference_from_rows(cells, "fjord-cnn", 20)("fast", MODEL.arch(1.0)) is None  # no column


def test_rounds_the_host_slowed_do_not_calibrate_unless_the_slowdown_lasts() -> None:
    from fl.records import ClientSpec
    from fl.roundcost import CalibratedPredictor, ClientRoundPredictor

    def cost(device, arch, steps, down, up):
        return 0.2

    def reference(device, arch):  # 2 ms of CPU per step at any width
        return 0.002 if device == "pi" else None

    predictor = CalibratedPredictor(ClientRoundPredictor(cost, 20, 1, frozenset({"pi"})), cpu_reference=reference)
    full = MODEL.arch(1.0)
    pi = ClientSpec("c0", capacity=1.0, num_examples=200, device="pi")
    assert predictor.cpu_slowdown("pi", full, 0.0025) == pytest.approx(1.25)
    assert predictor.cpu_slowdown("pi", None, 0.0025) is None  # several widths drawn: not judged
    assert predictor.cpu_slowdown("pi", full, None) is None
    assert predictor.cpu_slowdown("phone", full, 0.0025) is None  # no reference
    predictor.observe("pi", 0.2, 0.5, slowdown=1.25)  # 25 % more CPU per step: slowed
    predictor.observe("pi", 0.2, 0.3, slowdown=1.10)  # at the limit: not slowed
    assert predictor.factor("pi") == pytest.approx(1.0)  # one calibrating round is not enough
    predictor.observe("pi", 0.2, 0.26, slowdown=None)  # not judged: counts
    assert predictor.factor("pi") == pytest.approx(1.4)  # median of 1.5 and 1.3; the slowed 2.5 left out
    assert predictor(pi, full) == pytest.approx(0.28)
    for measured in (0.4, 0.44, 0.48):  # three slowed rounds in a row: a level that lasts
        predictor.observe("pi", 0.2, measured, slowdown=1.3)
    assert predictor.factor("pi") == pytest.approx(2.2)
    predictor.observe("pi", 0.2, 0.2, slowdown=1.0)
    assert predictor.factor("pi") == pytest.approx(1.3)  # the clean rounds again: 1.5, 1.3, 1.0
    unjudging = CalibratedPredictor(ClientRoundPredictor(cost, 20, 1, frozenset({"pi"})))
    assert unjudging.cpu_slowdown("pi", full, 0.0025) is None  # no reference: nothing is judged


def test_a_round_that_drew_several_widths_is_set_against_the_profile_s_mean_over_its_draws() -> None:
    from fl.roundcost import CalibratedPredictor, ClientRoundPredictor, drawn_steps

    metrics = {"steps_at_width": {"0.25": 3, "1": 1, "0.5": 0}, "steps": 4, "x": "y"}
    assert drawn_steps(metrics) == {0.25: 3.0, 1.0: 1.0}
    assert drawn_steps({"steps_at_width": {"oops": 2, "0.5": "n/a"}, "steps_at_width/x": 1}) == {}
    # a round logged with one key per width (stores written before the nested form) reads the same
    legacy = {"steps_at_width/0.25": 3.0, "steps_at_width/1": 1, "steps_at_width/0.5": 0, "steps": 4}
    assert drawn_steps(legacy) == {0.25: 3.0, 1.0: 1.0}

    def reference(device, arch):  # 1 ms of CPU per step per unit of the first layer's width
        return 0.001 * arch.sizes[0] / MODEL.group_sizes[0] if device == "pi" else None

    predictor = CalibratedPredictor(
        ClientRoundPredictor(lambda *a: 0.2, 20, 1, frozenset({"pi"})), cpu_reference=reference
    )
    draws = [(MODEL.arch(0.25), 3.0), (MODEL.arch(1.0), 1.0)]  # the mean: (3 * 0.25 + 1) / 4 ms
    assert predictor.cpu_vs_mix("pi", draws, 0.000525) == pytest.approx(1.2)
    assert predictor.cpu_vs_mix("phone", draws, 0.000525) is None  # no reference
    assert predictor.cpu_vs_mix("pi", draws, None) is None
    assert predictor.cpu_vs_mix("pi", [], 0.001) is None
    # each against the lowest of the device's last HOST_DISTURBANCE_SPAN such rounds
    slowdowns = [predictor.mix_slowdown("pi", v) for v in (1.2, 1.1, 1.5, 1.15, None)]
    assert slowdowns == [None, pytest.approx(1.1 / 1.2), pytest.approx(1.5 / 1.1), pytest.approx(1.15 / 1.1), None]
    for value in (1.3, 1.3, 1.3, 1.3):  # 1.1 leaves the window
        predictor.mix_slowdown("pi", value)
    assert predictor.mix_slowdown("pi", 1.3) == pytest.approx(1.0)


def test_a_factor_far_from_one_says_once_that_the_device_s_profile_is_stale() -> None:
    from fl.roundcost import (
        CalibratedPredictor,
        ClientRoundPredictor,
        profile_age_warning,
        profiled_at,
        stale_profile_warning,
    )

    assert stale_profile_warning("pi", 1.2, 3) is None and stale_profile_warning("pi", 0.8, 3) is None  # the limit
    line = stale_profile_warning("pi", 1.31, 3, measured_at=0.0)
    assert line is not None and line.startswith("device 'pi': its last 3 rounds took 1.31 x what its profile")
    assert "measured 1970-01-01 00:00 UTC" in line and "fleetbench profile" in line
    assert stale_profile_warning("pi", 0.7, 2) is not None  # faster than the profile says: stale too
    day = 86400.0
    assert profile_age_warning("pi", None, 100 * day) is None
    assert profile_age_warning("pi", 95 * day, 100 * day) is None  # 5 days
    old = profile_age_warning("pi", 90 * day, 100 * day)
    assert old is not None and old.startswith("device 'pi': its profile was measured 10 days ago")
    rows = {"pi": [{"finished_at": 5.0}, {"finished_at": 7.0}, {}], "nano": [{"finished_at": None}]}
    assert profiled_at(rows) == {"pi": 7.0}

    said: list[str] = []
    predictor = CalibratedPredictor(
        ClientRoundPredictor(lambda *a: 0.2, 20, 1, frozenset({"pi", "nano"})),
        warn=said.append,
        measured_at={"pi": 0.0},
    )
    predictor.observe("pi", 0.2, 0.3)  # one round: no factor yet
    predictor.observe("nano", 0.2, 0.22)
    predictor.observe("nano", 0.2, 0.21)  # 1.075: within the limit
    assert said == []
    predictor.observe("pi", 0.2, 0.26)
    assert said == [stale_profile_warning("pi", 1.4, 2, measured_at=0.0)]  # median of 1.5 and 1.3
    predictor.observe("pi", 0.2, 0.3)
    assert len(said) == 1  # once per device


def test_a_profile_of_another_export_format_is_named() -> None:
    from fl.roundcost import export_format_warning, profiled_export_formats

    rows = {
        "pi": [{"export_format": "5"}, {"export_format": "4"}],
        "nano": [{"export_format": ""}, {}],
        "phone": [{"export_format": 5}],
    }
    formats = profiled_export_formats(rows)
    assert formats == {"pi": {"5", "4"}, "nano": {""}, "phone": {"5"}}
    changes = {3: "three", 4: "four", 5: "five"}

    def warning(device: str) -> str | None:
        return export_format_warning(device, formats[device], 5, changes, first_recorded=4)

    assert warning("phone") is None
    line = warning("pi")
    assert line is not None and line.startswith("device 'pi': its profile was measured on artifacts of export format 4")
    assert "(format 5: five)" in line and "four" not in line and "re-profile it" in line
    old = warning("nano")
    assert old is not None and "export format unrecorded (before 4)" in old
    assert "(format 4: four; format 5: five)" in old and "three" not in old

    # Format 5 changed nothing a step time can see: a profile of format 4 still describes format 5's artifacts.
    timed = {3: "three", 4: "four"}
    assert export_format_warning("pi", {"4", "5"}, 5, timed, first_recorded=4) is None
    line = export_format_warning("pi", {"3"}, 5, timed, first_recorded=4)
    assert line is not None and "export format 3" in line and "(format 4: four)" in line
    newer = export_format_warning("pi", {"6"}, 5, timed, first_recorded=4)
    assert newer is not None and "export format 6" in newer


def test_rounds_whose_transfers_stalled_do_not_calibrate() -> None:
    from fl.roundcost import CalibratedPredictor, ClientRoundPredictor

    def cost(device, arch, steps, down, up):
        return 0.4

    predictor = CalibratedPredictor(ClientRoundPredictor(cost, 20, 1, frozenset({"mid"})))
    payload = 210_072.0
    predictor.observe("mid", 0.4, 0.42, transfer=(0.006, payload))
    predictor.observe("mid", 0.4, 0.69, transfer=(0.276, payload))  # a 0.27 s hiccup: left out
    predictor.observe("mid", 0.4, 0.44, transfer=(0.005, payload))
    assert predictor.factor("mid") == pytest.approx(1.075)  # median of 1.05 and 1.1
    assert [slowed for _, slowed in predictor.rounds["mid"]] == [False, True, False]
    # a first round has nothing to be judged against; a round without its transfers is not judged
    first = CalibratedPredictor(ClientRoundPredictor(cost, 20, 1, frozenset({"mid"})))
    first.observe("mid", 0.4, 0.69, transfer=(0.276, payload))
    first.observe("mid", 0.4, 0.8, transfer=None)
    assert [slowed for _, slowed in first.rounds["mid"]] == [False, False]


def test_modelled_transfer_time() -> None:
    assert modelled_transfer_seconds(1_000_000, 8000, 20.0) == pytest.approx(1.0 + 0.02)
    assert modelled_transfer_seconds(10, None, 5.0) is None
