from collections import Counter

import pytest

from exporters.userinput import InputError
from fl.capacity import assign, counts, fjord_tiers, tiers


@pytest.mark.parametrize(("spec", "value"), [("1", 1.0), ("0.5", 0.5), ("1/4", 0.25), (" 0.0625 ", 0.0625)])
def test_homogeneous(spec, value):
    assert assign(spec, 4, seed=0) == (value,) * 4


@pytest.mark.parametrize(
    "spec",
    [
        "0",
        "1.5",
        "-1",
        "abc",
        "",
        "nan",
        "uniform:",
        "uniform:1,,0.5",
        "uniform:1,2",
        "uniform:1,1",
        "realworld:3",
        "explicit:1,0.5",
        "explicit:1,0.5,x",
        "fjord:",
        "fjord:x",
        "fjord:0",
        "fjord:5,ds=2",
        "fjord:5,ds=-0.1",
        "fjord:5,scale=1",
        "fjord:5,ds=a",
        "zipf:1",
    ],
)
def test_bad_specs_are_input_errors(spec):
    with pytest.raises(InputError):
        assign(spec, 3, seed=0)


def test_zero_clients_is_an_input_error():
    with pytest.raises(InputError):
        assign("1", 0, seed=0)


def test_uniform_spreads_evenly_and_shuffles_by_seed():
    caps = assign("uniform:1,0.5,0.25,0.125,0.0625", 10, seed=1)
    assert Counter(caps) == {1.0: 2, 0.5: 2, 0.25: 2, 0.125: 2, 0.0625: 2}
    assert assign("uniform:1,0.5,0.25,0.125,0.0625", 10, seed=1) == caps
    orders = {assign("uniform:1,0.5,0.25,0.125,0.0625", 10, seed=s) for s in range(5)}
    assert len(orders) > 1


def test_uniform_remainder_goes_to_the_first_levels_and_default_levels():
    assert Counter(assign("uniform:1,0.5,0.25", 7, seed=0)) == {1.0: 3, 0.5: 2, 0.25: 2}
    assert Counter(assign("uniform", 5, seed=0)) == {1.0: 1, 0.5: 1, 0.25: 1, 0.125: 1, 0.0625: 1}


def test_realworld_fedrolex_shares():
    assert Counter(assign("realworld", 100, seed=3)) == {1.0: 6, 0.5: 10, 0.25: 11, 0.125: 18, 0.0625: 55}
    # 10 clients: exact 0.6, 1.0, 1.1, 1.8, 5.5 -> floors 0, 1, 1, 1, 5, the two left go to 0.8 and 0.6
    assert Counter(assign("realworld", 10, seed=3)) == {1.0: 1, 0.5: 1, 0.25: 1, 0.125: 2, 0.0625: 5}


def test_explicit_is_in_client_order():
    assert assign("explicit:1,0.5,1/4", 3, seed=9) == (1.0, 0.5, 0.25)


def test_fjord_tiers_with_drop_scale():
    levels, shares = fjord_tiers("5,ds=0.5")
    assert levels == pytest.approx([0.2, 0.4, 0.6, 0.8, 1.0])
    assert shares == pytest.approx([0.1, 0.1, 0.1, 0.1, 0.6])
    assert fjord_tiers("5")[1] == pytest.approx([0.2] * 5)
    assert Counter(assign("fjord:5", 10, seed=0)) == {0.2: 2, 0.4: 2, 0.6: 2, 0.8: 2, 1.0: 2}
    assert Counter(assign("fjord:5,ds=0.5", 10, seed=0)) == {0.2: 1, 0.4: 1, 0.6: 1, 0.8: 1, 1.0: 6}
    assert Counter(assign("fjord:10,ds=1", 20, seed=0)) == {i / 10: 2 for i in range(1, 11)}


def test_counts_largest_remainder():
    assert counts([0.5, 0.5], 3) == [2, 1]
    assert counts([0.2, 0.3, 0.5], 10) == [2, 3, 5]
    assert sum(counts([0.06, 0.10, 0.11, 0.18, 0.55], 37)) == 37


def test_tiers_rank_capacities():
    assert tiers([0.5, 1.0, 0.25, 1.0]) == (1, 0, 2, 0)
    assert tiers([0.3]) == (0,)
