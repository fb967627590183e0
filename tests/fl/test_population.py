"""Populations of virtual clients and the virtual round (fl/population.py), with costs worked by hand."""

from __future__ import annotations

import math

import numpy as np
import pytest

from exporters.userinput import InputError
from exporters.zoo import get_model
from fl.population import (
    DEFAULT_VARIATION,
    Population,
    VirtualClock,
    check_devices,
    client_timing,
    draw_population,
    full_batch_steps,
    online,
    parse_population,
    payload_bytes,
    sample_round,
    schedule_round,
    split_item,
)
from fl.records import ClientSpec
from fl.server import sample_clients

ARCH = get_model("fjord-cnn").arch(0.5)


def test_parse_population_keeps_order_and_shares():
    assert parse_population("fast=0.3, mid=0.5,slow=0.2") == {"fast": 0.3, "mid": 0.5, "slow": 0.2}
    assert list(parse_population("b=0.5,a=0.5")) == ["b", "a"]


@pytest.mark.parametrize(
    ("spec", "words"),
    [
        ("fast=0.3,mid=0.5", "sum to 0.8, not 1"),
        ("fast=0.6,mid=0.6", "sum to 1.2, not 1"),
        ("fast", "is not device=share"),
        ("=1", "is not device=share"),
        ("fast=x", "share 'x' of fast is not a number"),
        ("fast=-0.5,mid=1.5", "outside [0, 1]"),
        ("fast=0.5,fast=0.5", "named twice"),
        ("", "give device=share"),
        ("fast=1,", "give device=share"),
    ],
)
def test_parse_population_refuses_bad_specs_in_one_line(spec, words):
    with pytest.raises(InputError) as err:
        parse_population(spec)
    assert words in str(err.value) and "\n" not in str(err.value)


def test_split_item_names_the_refusal():
    assert split_item(" k =v=w", "bad") == ("k", "v=w")
    with pytest.raises(InputError, match="^bad$"):
        split_item("kv", "bad")


def test_check_devices_names_what_the_store_has():
    measured = {"fast": {"fjord-cnn"}, "mid": {"other"}, "dead": set()}
    check_devices({"fast": 1.0}, measured, "fjord-cnn", "p.db")
    with pytest.raises(InputError, match="unknown device 'gpu'; devices measured in p.db: dead, fast, mid"):
        check_devices({"fast": 0.5, "gpu": 0.5}, measured, "fjord-cnn", "p.db")
    with pytest.raises(InputError, match="device 'mid' has no profile of model 'fjord-cnn' in p.db \\(other\\)"):
        check_devices({"mid": 1.0}, measured, "fjord-cnn", "p.db")
    with pytest.raises(InputError, match="'dead' has no profile .* \\(no usable profile\\)"):
        check_devices({"dead": 1.0}, measured, "fjord-cnn", "p.db")


def test_population_counts_follow_the_shares_and_the_seed_shuffles():
    pop = draw_population({"fast": 0.3, "mid": 0.5, "slow": 0.2}, 10, seed=1)
    assert sorted(pop.devices) == ["fast"] * 3 + ["mid"] * 5 + ["slow"] * 2
    # largest remainder: 7 clients at 0.3/0.5/0.2 -> 2.1, 3.5, 1.4 -> 2, 4, 1
    assert sorted(draw_population({"a": 0.3, "b": 0.5, "c": 0.2}, 7, seed=0).devices) == ["a"] * 2 + ["b"] * 4 + ["c"]
    assert draw_population({"fast": 0.3, "mid": 0.5, "slow": 0.2}, 10, seed=1) == pop
    others = {draw_population({"fast": 0.3, "mid": 0.5, "slow": 0.2}, 10, seed=s).devices for s in range(2, 8)}
    assert len(others - {pop.devices}) >= 5  # the seed decides who is which device
    assert pop.placement() == {f"c{i}": d for i, d in enumerate(pop.devices)}
    assert pop.variation == DEFAULT_VARIATION == 0.1


def test_speed_factors_are_lognormal_with_the_documented_sigma():
    pop = draw_population({"a": 1.0}, 20000, seed=3, variation=0.5)
    logs = np.log(np.array(pop.factors))
    assert abs(np.mean(logs)) < 0.02 and abs(np.std(logs) - 0.5) < 0.02  # median factor 1, sigma 0.5
    assert draw_population({"a": 1.0}, 50, seed=3, variation=0.0).factors == (1.0,) * 50


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"variation": -0.1}, "--variation"),
        ({"availability": 0.0}, "--availability"),
        ({"availability": 1.5}, "--availability"),
    ],
)
def test_population_refuses_bad_variation_and_availability(kwargs, words):
    with pytest.raises(InputError, match=words):
        draw_population({"a": 1.0}, 5, seed=0, **kwargs)


def test_availability_takes_a_fresh_draw_per_round():
    pop = draw_population({"a": 1.0}, 4000, seed=0, availability=0.25)
    first, second = online(pop, 0, 0), online(pop, 1, 0)
    assert abs(len(first) / 4000 - 0.25) < 0.03 and abs(len(second) / 4000 - 0.25) < 0.03
    assert not np.array_equal(first, second)
    assert np.array_equal(online(pop, 0, 0), first)
    assert len(online(draw_population({"a": 1.0}, 30, seed=0), 5, 0)) == 30


def test_sampling_without_limits_is_the_plain_run_draw():
    pop = draw_population({"a": 0.5, "b": 0.5}, 40, seed=2)
    clients = [ClientSpec(f"c{i}", 5) for i in range(40)]
    for rnd in range(4):
        plain = [int(c.cid[1:]) for c in sample_clients(clients, rnd, seed=2, per_round=7)]
        assert sample_round(pop, rnd, 2, 7) == plain


def test_overcommitment_samples_more_and_only_online_clients():
    pop = draw_population({"a": 1.0}, 100, seed=0, availability=0.5)
    picked = sample_round(pop, 3, 0, 10, overcommit=0.3)
    assert len(picked) == 13 and len(set(picked)) == 13  # ceil(10 * 1.3)
    assert set(picked) <= set(online(pop, 3, 0).tolist())
    few = draw_population({"a": 1.0}, 6, seed=0, availability=0.3)
    assert len(sample_round(few, 0, 0, 5, overcommit=1.0)) == len(online(few, 0, 0))


def test_schedule_keeps_the_first_k_by_the_deadline_by_hand():
    times = {"a": 1.0, "b": 3.0, "c": 2.0, "d": 5.0}
    two = schedule_round(times, 2, deadline_s=4.0)
    assert two.kept == ("a", "c") and two.cut == {"b": 3.0} and two.late == {"d": 5.0} and two.seconds == 2.0
    three = schedule_round(times, 3, deadline_s=4.0)
    assert three.kept == ("a", "c", "b") and three.cut == {} and three.seconds == 3.0
    # fewer than K by the deadline: the round waits until the deadline
    four = schedule_round(times, 4, deadline_s=4.0)
    assert four.kept == ("a", "c", "b") and four.late == {"d": 5.0} and four.seconds == 4.0
    # no deadline, K above the sample: the last client ends the round
    assert schedule_round(times, 6).seconds == 5.0 and len(schedule_round(times, 6).kept) == 4
    # nobody in time: no client kept, the round lasts the deadline
    late = schedule_round({"a": 9.0}, 1, deadline_s=2.0)
    assert late.kept == () and late.seconds == 2.0
    # ties go to the client listed first
    assert schedule_round({"x": 1.0, "y": 1.0}, 1).kept == ("x",)


def cost(device, arch, steps, bytes_down, bytes_up):
    """0.5 s fixed + 0.1 s per step (0.2 on 'slow') + 1 us per byte down + 2 us per byte up."""
    per_step = 0.2 if device == "slow" else 0.1
    return 0.5 + per_step * steps + 1e-6 * bytes_down + 2e-6 * bytes_up


def test_client_timing_splits_the_cost_and_scales_it():
    t = client_timing(cost, "fast", ARCH, 10, 1000, 1000, factor=2.0)
    assert t.download == pytest.approx(2 * 1e-3)
    assert t.upload == pytest.approx(2 * 2e-3)
    assert t.steps == pytest.approx(2 * 1.0)
    assert t.compute == pytest.approx(2 * (0.5 + 1.0))
    assert t.total == pytest.approx(2 * cost("fast", ARCH, 10, 1000, 1000))


def test_virtual_clock_times_clients_on_their_devices():
    pop = Population(("fast", "slow"), (1.0, 1.5))
    clock = VirtualClock(pop, cost, seed=0, deadline_s=10.0)
    assert clock.timing(1, ARCH, 4, 0, 0).total == pytest.approx(1.5 * (0.5 + 0.8))
    assert clock.timing(0, ARCH, 4, 0, 0).total == pytest.approx(0.9)
    assert clock.schedule({"c0": 0.9, "c1": 11.0}, 2).late == {"c1": 11.0}


@pytest.mark.parametrize(
    ("kwargs", "words"), [({"overcommit": -1.0}, "--overcommit"), ({"deadline_s": 0.0}, "--deadline")]
)
def test_virtual_clock_refuses_bad_rules(kwargs, words):
    with pytest.raises(InputError, match=words):
        VirtualClock(Population(("a",), (1.0,)), cost, **kwargs)


def test_steps_and_payload_bytes():
    assert full_batch_steps(45, 20, 2) == 4.5  # 90 images: two full batches and a quarter per epoch
    assert full_batch_steps(0, 20, 1) == 0
    assert payload_bytes({"w": np.zeros((3, 4), np.float32), "b": np.zeros(5, np.float32)}) == 68
    assert math.isclose(full_batch_steps(20, 20, 1), 1)
