import math

import pytest

from exporters.userinput import InputError
from fl.maths.lr_search import candidate_rates, search_server_lr, windowed_score


def scripted(curves, default=()):
    """session(lr) over hand-written per-round median accuracies, keyed by round(log10(lr), 6)."""
    started = []

    def session(lr):
        key = round(math.log10(lr), 6)
        started.append(key)
        return iter(curves.get(key, default))

    return session, started


def ramp(rounds_to_half, length=60):
    """Accuracy r / (2 * rounds_to_half) after round r: crosses 0.5 exactly at round rounds_to_half."""
    return [min(1.0, r / (2 * rounds_to_half)) for r in range(1, length + 1)]


def test_windowed_score():
    assert windowed_score([0.4, 0.6, 0.6, 0.9], 3) == pytest.approx(0.7)
    assert windowed_score([0.4, 0.6], 3) == pytest.approx(0.5)
    assert math.isnan(windowed_score([], 2))
    with pytest.raises(InputError):
        windowed_score([1.0], 0)


def test_candidate_rates():
    assert candidate_rates(1.0, 1.0, 0) == pytest.approx((0.1, 1.0, 10.0))
    assert candidate_rates(10.0, 0.5, 1) == pytest.approx((10**0.5, 10**1.5))


def test_three_steps_choice_and_overhead():
    # Step 1 (0.1, 1, 10): 1 reaches 0.5 first, at round 5 -> R1 = 5, all three ran 5 rounds.
    # Step 2 (10^-0.5, 10^0.5), limit R1 - 1 = 4: 10^0.5 reaches at round 4 -> R2 = 4.
    # Step 3 (10^0.25, 10^0.75), limit 3: neither reaches -> both stop after 3 rounds.
    curves = {
        -1.0: ramp(10),
        0.0: ramp(5),
        1.0: ramp(25),
        -0.5: ramp(8),
        0.5: ramp(4),
        0.25: ramp(6),
        0.75: ramp(9),
    }
    session, started = scripted(curves)
    result = search_server_lr(session, target=0.5, window=1, steps=3, initial_lr=1.0, log_step=1.0)
    assert started == [-1.0, 0.0, 1.0, -0.5, 0.5, 0.25, 0.75]
    assert result.lr == pytest.approx(10**0.5)
    assert result.reached and result.best_rounds == 4
    assert [s.rounds for s in result.sessions] == [5, 5, 5, 4, 4, 3, 3]
    assert [s.reached for s in result.sessions] == [False, True, False, False, True, False, False]
    assert result.step_rounds == (5, 4, 3)
    # Eq. 8 by hand: 3 * 5 + 2 * 4 + 2 * 3 - 4 = 25.
    assert result.total_rounds == 29
    assert result.overhead_rounds == 25


def test_window_smooths_a_spike():
    # Medians 0.4, 0.6, 0.6, 0.9: window 3 averages 0.4, 0.5, 0.533, 0.7 -> target 0.55 at round 4;
    # with window 1 the spike at round 2 would already count.
    spike = [0.4, 0.6, 0.6, 0.9, 0.9]
    slow = [0.0] * 10
    session, _ = scripted({-1.0: slow, 0.0: spike, 1.0: slow})
    assert search_server_lr(session, target=0.55, window=3, steps=1).best_rounds == 4
    session, _ = scripted({-1.0: slow, 0.0: spike, 1.0: slow})
    assert search_server_lr(session, target=0.55, window=1, steps=1).best_rounds == 2


def test_tie_goes_to_higher_score_then_smaller_rate():
    session, _ = scripted({-1.0: [0.2, 0.6], 0.0: [0.2, 0.7], 1.0: [0.2, 0.6]})
    assert search_server_lr(session, target=0.5, window=1, steps=1).lr == pytest.approx(1.0)
    session, _ = scripted({-1.0: [0.2, 0.6], 0.0: [0.2, 0.3], 1.0: [0.2, 0.6]})
    assert search_server_lr(session, target=0.5, window=1, steps=1).lr == pytest.approx(0.1)


def test_never_reached_centres_on_best_score():
    # Nobody reaches 0.9 within 4 rounds; 10 scores best, so step 2 tries 10^0.5 and 10^1.5.
    curves = {-1.0: [0.1] * 9, 0.0: [0.2] * 9, 1.0: [0.3] * 9, 0.5: [0.1] * 9, 1.5: [0.1] * 9}
    session, started = scripted(curves)
    result = search_server_lr(session, target=0.9, window=2, steps=2, max_rounds=4)
    assert started == [-1.0, 0.0, 1.0, 0.5, 1.5]
    assert not result.reached and result.best_rounds is None
    assert result.lr == pytest.approx(10.0)
    assert result.total_rounds == result.overhead_rounds == 5 * 4


def test_session_that_ends_early_stops_alone():
    session, _ = scripted({-1.0: [0.1, 0.1], 0.0: ramp(3), 1.0: [0.0] * 9})
    result = search_server_lr(session, target=0.5, window=1, steps=1)
    assert [s.rounds for s in result.sessions] == [2, 3, 3]
    assert result.best_rounds == 3


def test_generators_are_closed():
    closed = []

    def session(lr):
        def gen():
            try:
                while True:
                    yield 0.9 if lr == 1.0 else 0.0
            finally:
                closed.append(lr)

        return gen()

    result = search_server_lr(session, target=0.5, window=1, steps=1)
    assert result.best_rounds == 1
    assert sorted(closed) == pytest.approx([0.1, 1.0, 10.0])


@pytest.mark.parametrize(
    "kwargs",
    [{"initial_lr": 0.0}, {"log_step": -1.0}, {"steps": 0}, {"max_rounds": 0}, {"shrink": 0.0}, {"window": 0}],
)
def test_bad_parameters(kwargs):
    session, _ = scripted({})
    with pytest.raises(InputError):
        search_server_lr(session, target=0.5, **kwargs)
