import itertools
import math

import numpy as np
import pytest

from exporters.userinput import InputError
from fl.maths.codes import (
    GOLD_PAIRS,
    assign_rows,
    constant_weight_code,
    distance_bound,
    gold_code_matrix,
    gold_degree_for_length,
    gold_family,
    gold_t,
    is_preferred_pair,
    m_sequence,
    min_pairwise_distance,
    pad_after_longest_zero_run,
    periodic_cross_correlation,
    random_rows,
    sequence_period,
)

# t = 1 + 2^floor((n+2)/2), worked out by hand for every tabulated degree.
HAND_T = {3: 5, 5: 9, 6: 17, 7: 17, 9: 33, 10: 65, 11: 65, 13: 129, 14: 257, 15: 257}


def brute_correlation(a, b):
    """Eq. 9 straight from the definition, no FFT."""
    x, y = 1 - 2 * np.asarray(a, int), 1 - 2 * np.asarray(b, int)
    n = len(x)
    return np.array([sum(x[j] * y[(j + k) % n] for j in range(n)) for k in range(n)])


# ----------------------------------------------------------------------------- LFSR


def test_m_sequence_by_hand():
    # x^3 + x + 1: s[i+3] = s[i+1] ^ s[i], started from 1 1 1.
    assert m_sequence((3, 1, 0)).tolist() == [1, 1, 1, 0, 0, 1, 0]


def test_cross_correlation_by_hand():
    # x = (1, 1, -1), y = (1, -1, -1): theta(0) = 1, theta(1) = -3, theta(2) = 1.
    assert periodic_cross_correlation(np.array([0, 0, 1]), np.array([0, 1, 1])).tolist() == [1, -3, 1]


def test_fft_correlation_matches_definition():
    rng = np.random.default_rng(3)
    a, b = rng.integers(0, 2, 23), rng.integers(0, 2, 23)
    assert periodic_cross_correlation(a, b).tolist() == brute_correlation(a, b).tolist()


def test_gold_t_by_hand():
    assert {n: gold_t(n) for n in HAND_T} == HAND_T


@pytest.mark.parametrize("degree", sorted(GOLD_PAIRS))
def test_every_tabulated_pair_is_preferred(degree):
    taps_a, taps_b = GOLD_PAIRS[degree]
    assert max(taps_a) == max(taps_b) == degree
    a, b = m_sequence(taps_a), m_sequence(taps_b)
    n = 2**degree - 1
    # Primitive: full period; m-sequences are balanced (2^(n-1) ones).
    assert len(a) == len(b) == n
    assert sequence_period(a) == sequence_period(b) == n
    assert a.sum() == b.sum() == 2 ** (degree - 1)
    t = HAND_T[degree]
    assert set(periodic_cross_correlation(a, b).tolist()) == {-t, -1, t - 2}
    assert is_preferred_pair(taps_a, taps_b)


def test_no_degree_multiple_of_four():
    assert all(n % 4 for n in GOLD_PAIRS)


@pytest.mark.parametrize(
    "taps_a, taps_b",
    [
        # The degree-10 pair that circulates in public code: primitive, but ten-valued.
        ((10, 3, 0), (10, 9, 8, 5, 0)),
        # A polynomial and its reciprocal: not a preferred pair at degree 5.
        ((5, 2, 0), (5, 3, 0)),
        # Not primitive (x^6 + x^3 + 1 has period 9).
        ((6, 1, 0), (6, 3, 0)),
    ],
)
def test_non_preferred_pairs_are_rejected(taps_a, taps_b):
    assert not is_preferred_pair(taps_a, taps_b)


def test_bad_taps():
    with pytest.raises(InputError):
        m_sequence((5, 2))
    with pytest.raises(InputError):
        gold_family(8)


# --------------------------------------------------------------------------- Gold family


def test_gold_family_shape_members_and_weights():
    fam = gold_family(5)
    a, b = m_sequence(GOLD_PAIRS[5][0]), m_sequence(GOLD_PAIRS[5][1])
    assert fam.shape == (2**5 + 1, 2**5 - 1)
    assert fam[0].tolist() == a.tolist() and fam[1].tolist() == b.tolist()
    assert fam[2 + 4].tolist() == (a ^ np.roll(b, -4)).tolist()
    assert len({row.tobytes() for row in fam}) == 33
    # Weight of a XOR shift_k(b) is (N - theta(k)) / 2.
    theta = brute_correlation(a, b)
    assert fam[2:].sum(axis=1).tolist() == ((31 - theta) // 2).tolist()


@pytest.mark.parametrize("degree", [3, 5, 6])
def test_gold_family_pairs_are_three_valued(degree):
    fam = gold_family(degree)
    t = HAND_T[degree]
    allowed = {-t, -1, t - 2}
    n = 2**degree - 1
    for i, j in itertools.combinations(range(len(fam)), 2):
        assert set(periodic_cross_correlation(fam[i], fam[j]).tolist()) <= allowed, (i, j)
    # Off-peak autocorrelation is bounded the same way.
    for i in range(len(fam)):
        auto = periodic_cross_correlation(fam[i], fam[i])
        assert auto[0] == n
        assert set(auto[1:].tolist()) <= allowed


def test_pad_after_longest_zero_run_by_hand():
    rows = np.array([[1, 0, 0, 1, 0, 1], [0, 1, 0, 1, 1, 1], [1, 1, 1, 1, 1, 1]], dtype=np.uint8)
    assert pad_after_longest_zero_run(rows).tolist() == [
        [1, 0, 0, 0, 1, 0, 1],  # after the run at positions 1-2
        [0, 0, 1, 0, 1, 1, 1],  # tie: the first run
        [1, 1, 1, 1, 1, 1, 0],  # no zeros: appended
    ]


def test_pad_of_m_sequence_lengthens_its_longest_zero_run():
    a = m_sequence(GOLD_PAIRS[5][0])  # longest zero run of an m-sequence: n - 1 = 4
    padded = pad_after_longest_zero_run(a[None, :])[0]
    text = "".join(map(str, padded.tolist()))
    assert len(padded) == 32 and padded.sum() == 16
    assert "00000" in text and "000000" not in text


@pytest.mark.parametrize(
    "length, degree", [(2048, 11), (2047, 11), (32, 5), (31, 5), (16, 5), (33, 6), (256, 9), (8, 3)]
)
def test_gold_degree_for_length(length, degree):
    assert gold_degree_for_length(length) == degree


def test_gold_degree_limits():
    with pytest.raises(InputError):
        gold_degree_for_length(0)
    with pytest.raises(InputError):
        gold_degree_for_length(2**15 + 1)


def test_gold_matrix_paper_case_2048_units():
    code = gold_code_matrix(2048, 1024, 35, np.random.default_rng(0))
    assert code.degree == 11 and code.repaired == 0
    # Balanced Gold sequences for odd n: 2^(n-1) - 1 shifted members plus a and b.
    assert code.rows.shape == (2**10 + 1, 2048)
    assert (code.rows.sum(axis=1) == 1024).all()
    assert len({row.tobytes() for row in code.rows}) == len(code.rows)


def test_gold_matrix_unpadded_rows_are_balanced_family_members():
    code = gold_code_matrix(31, 16, 1, np.random.default_rng(0))
    fam = gold_family(5)
    balanced = {row.tobytes() for row in fam.astype(bool) if row.sum() == 16}
    assert len(balanced) == 2**4 + 1
    assert {row.tobytes() for row in code.rows} == balanced
    # In-phase correlation of every pair of rows is one of the three Gold values.
    rows = code.rows.astype(int)
    for i, j in itertools.combinations(range(len(rows)), 2):
        theta = int(((1 - 2 * rows[i]) * (1 - 2 * rows[j])).sum())
        assert theta in {-9, -1, 7}


def test_gold_matrix_more_clients_than_family_uses_shifts():
    code = gold_code_matrix(32, 16, 35, np.random.default_rng(0))
    assert code.rows.shape == (35, 32) and code.repaired == 0
    assert (code.rows.sum(axis=1) == 16).all()
    assert len({row.tobytes() for row in code.rows}) == 35


def test_gold_matrix_cut_length():
    code = gold_code_matrix(100, 50, 35, np.random.default_rng(0))
    assert code.degree == 7
    assert code.rows.shape[1] == 100 and len(code.rows) >= 35
    assert (code.rows.sum(axis=1) == 50).all()
    assert len({row.tobytes() for row in code.rows}) == len(code.rows)


def test_gold_matrix_off_balance_rate_is_repaired():
    code = gold_code_matrix(2048, 512, 35, np.random.default_rng(0))
    assert code.rows.shape == (35, 2048)
    assert (code.rows.sum(axis=1) == 512).all()
    assert code.repaired == 35  # no Gold sequence has weight K/4
    assert len({row.tobytes() for row in code.rows}) == 35


def test_gold_matrix_tiny_layer_gives_all_words():
    code = gold_code_matrix(4, 2, 10, np.random.default_rng(0))
    assert len(code.rows) == math.comb(4, 2)
    assert (code.rows.sum(axis=1) == 2).all()


# ---------------------------------------------------------------------- constant weight


def brute_min_distance(rows):
    rows = rows.astype(int)
    return min(int(np.abs(rows[i] - rows[j]).sum()) for i, j in itertools.combinations(range(len(rows)), 2))


def test_distance_bound_by_hand():
    # 35 words of weight 1024 in 2048: column counts 1024 x 18 and 1024 x 17, total pair distance
    # 2 * 1024 * 18 * 17 = 626688 over 595 pairs -> 1053.3 -> even 1052.
    assert distance_bound(2048, 1024, 35) == 1052
    # Two words of weight 2 in 4: complements, distance 4.
    assert distance_bound(4, 2, 2) == 4
    # Never above 2 * min(w, K - w).
    assert distance_bound(10, 1, 2) == 2


def test_cwc_complements():
    code = constant_weight_code(4, 2, 2, np.random.default_rng(5))
    assert code.min_distance == 4
    assert (code.rows[0] ^ code.rows[1]).all()


def test_cwc_whole_space_when_needed():
    code = constant_weight_code(6, 3, 20, np.random.default_rng(0))
    assert len({row.tobytes() for row in code.rows}) == 20
    assert code.min_distance == 2


@pytest.mark.parametrize("length, weight, rows", [(16, 8, 35), (32, 16, 35), (64, 16, 35), (256, 128, 35), (12, 3, 9)])
def test_cwc_properties(length, weight, rows):
    code = constant_weight_code(length, weight, rows, np.random.default_rng(1))
    assert code.rows.shape == (rows, length)
    assert (code.rows.sum(axis=1) == weight).all()
    assert brute_min_distance(code.rows) == code.min_distance >= 2
    assert code.min_distance <= distance_bound(length, weight, rows)


def test_cwc_beats_random_masks():
    # Greedy maximisation should do better than independent random masks of the same weight.
    code = constant_weight_code(256, 128, 35, np.random.default_rng(2))
    rand = random_rows(256, 128, 35, np.random.default_rng(2))
    assert code.min_distance > brute_min_distance(rand)


def test_cwc_is_seeded():
    a = constant_weight_code(64, 32, 10, np.random.default_rng(7)).rows
    b = constant_weight_code(64, 32, 10, np.random.default_rng(7)).rows
    assert np.array_equal(a, b)


def test_cwc_rejects_impossible():
    with pytest.raises(InputError):
        constant_weight_code(4, 2, 7, np.random.default_rng(0))
    with pytest.raises(InputError):
        constant_weight_code(4, 5, 1, np.random.default_rng(0))


# ---------------------------------------------------------------------------- helpers


def test_min_pairwise_distance_by_hand():
    rows = np.array([[1, 1, 0, 0], [1, 0, 1, 0], [0, 0, 1, 1]])
    assert min_pairwise_distance(rows) == 2
    with pytest.raises(InputError):
        min_pairwise_distance(rows[:1])


def test_random_rows_weights():
    rows = random_rows(50, 13, 8, np.random.default_rng(0))
    assert rows.shape == (8, 50) and (rows.sum(axis=1) == 13).all()


def test_assign_rows_without_shuffle_and_cycling():
    mat = np.eye(3, dtype=bool)
    out = assign_rows(mat, 5, np.random.default_rng(0), shuffle=False)
    assert out.tolist() == mat[[0, 1, 2, 0, 1]].tolist()


def test_assign_rows_shuffle_keeps_weights_and_distances():
    code = constant_weight_code(32, 16, 12, np.random.default_rng(0)).rows
    out = assign_rows(code, 12, np.random.default_rng(4))
    assert (out.sum(axis=1) == 16).all()
    assert len({row.tobytes() for row in out}) == 12
    assert min_pairwise_distance(out) == min_pairwise_distance(code)
    assert not np.array_equal(out, code)
