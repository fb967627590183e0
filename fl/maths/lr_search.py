"""Fast server learning-rate search (Coded FD paper, Algorithm 1 and eq. 8).

The search runs FL *sessions* side by side, one per tentative server learning rate
``eta``, advanced round by round in lockstep (the paper's "parallel search
synchronized round-by-round"). A session reports, per round, the median training
accuracy of the round's clients; its score after round ``r`` is the average of the
last ``window`` medians (fewer in the first rounds). Per adaptation step:

* step 1 tries three rates on a log10 grid around ``initial_lr``:
  ``initial_lr * 10^(-delta), initial_lr, initial_lr * 10^(+delta)``;
* every later step tries two rates around the best so far ``eta_hat``:
  ``eta_hat * 10^(-delta_i)`` and ``eta_hat * 10^(+delta_i)`` with
  ``delta_i = delta_{i-1} * shrink``. (The paper's text does not spell out the
  spacing of its lines 15-16; halving the log distance each step refines the grid
  around the best rate: with ``delta = 1`` the grid reaches quarter decades after
  three steps, the granularity of the paper's Table 1.)

A step ends as soon as a session's score reaches ``target``: that session set a
new best round count ``R`` (the fewest rounds so far) and its rate becomes
``eta_hat``; the others stop at the same round, since they can no longer beat
``R``. Several sessions reaching the target in the same round: the highest
score wins, then the smaller rate. A later step stops after ``R - 1`` rounds when no
session reached the target, since it can then no longer beat ``R``. If no session
of step 1 reaches the target within ``max_rounds``, later steps centre on the rate
with the highest score so far, which is also the answer, with ``reached=False``.

Overhead (eq. 8): the rounds all sessions ran, minus the rounds of the session
that set the final best count (its model is the one a full run continues from). In
lockstep this is ``3 R_1 + 2 sum_{i>=2} R'_i - R_S`` where ``R'_i`` is the length
of step ``i``.

`search_server_lr` is a pure driver over an injected
``session(lr) -> iterator of per-round median accuracies``. Two adapters build
real sessions (`fl.lr_sessions`): `server_session` runs each session as a logged run of the FL server
(`fl.server.run_fl`), one round per call (the run is resumed from its checkpoint
for the next round, which continues it exactly); `inprocess_session` is a
lighter loop over a strategy factory and in-memory client data, training with
`fl.client.run_local`, for tests and benchmarks.

Example (the Coded-FD strategy takes the server learning rate as ``server_lr``)::

    config = RunConfig(strategy="cfd", model="cfd-cnn", dataset="mnist5k", clients=100,
                       per_round=35, rounds=1, eval_every=1000, options={"code": "gold"})
    with ProfileStore("fleetbench.db") as store:
        result = search_server_lr(server_session(config, store=store), target=0.5, window=5)
    print(result.lr, result.best_rounds, result.overhead_rounds)
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from exporters.userinput import InputError

#: ``session(lr)`` returns an iterator over the session's per-round median client accuracy.
Session = Callable[[float], Iterator[float]]


@dataclass(frozen=True)
class SessionOutcome:
    """One tried server learning rate.

    Attributes
    ----------
    step : int
        Adaptation step (0-based).
    lr : float
        The server learning rate.
    rounds : int
        Rounds the session ran before it stopped.
    reached : bool
        Whether its windowed median accuracy reached the target.
    score : float
        Its last windowed median accuracy (``nan`` if it ran no round).
    """

    step: int
    lr: float
    rounds: int
    reached: bool
    score: float


@dataclass(frozen=True)
class SearchResult:
    """Outcome of the server learning-rate search.

    Attributes
    ----------
    lr : float
        The chosen server learning rate.
    reached : bool
        Whether any session reached the target.
    best_rounds : int or None
        Fewest rounds to the target (``None`` if never reached).
    sessions : tuple of SessionOutcome
        Every session, in the order they were tried.
    step_rounds : tuple of int
        Length in rounds of every adaptation step.
    total_rounds : int
        Rounds run by all sessions together.
    overhead_rounds : int
        ``total_rounds`` minus ``best_rounds`` (eq. 8); ``total_rounds`` when the
        target was never reached.
    """

    lr: float
    reached: bool
    best_rounds: int | None
    sessions: tuple[SessionOutcome, ...]
    step_rounds: tuple[int, ...]
    total_rounds: int
    overhead_rounds: int


def windowed_score(medians: Sequence[float], window: int) -> float:
    """Return the mean of the last ``window`` values (all of them when fewer exist)."""
    if window < 1:
        raise InputError(f"accuracy window {window} must be at least 1")
    if not medians:
        return math.nan
    return float(statistics.fmean(medians[-window:]))


def candidate_rates(center: float, log_step: float, step: int) -> tuple[float, ...]:
    """Return the rates tried in adaptation ``step`` around ``center``.

    Step 0: ``center * 10^(-log_step), center, center * 10^(+log_step)``; later
    steps: the two outer values only.
    """
    low, high = center * 10.0 ** (-log_step), center * 10.0**log_step
    return (low, center, high) if step == 0 else (low, high)


def search_server_lr(
    session: Session,
    *,
    target: float,
    window: int = 5,
    steps: int = 3,
    initial_lr: float = 1.0,
    log_step: float = 1.0,
    shrink: float = 0.5,
    max_rounds: int = 500,
) -> SearchResult:
    """Find the server learning rate that reaches ``target`` in the fewest rounds (Algorithm 1).

    Parameters
    ----------
    session : callable
        ``session(lr)`` starts an FL session with server learning rate ``lr`` and
        returns an iterator yielding, per round, the median training accuracy of
        the round's clients. An iterator that ends early ends its session. A
        generator is closed when its session stops.
    target : float
        Target windowed median accuracy ``A_target``.
    window : int
        Rounds ``W`` averaged into a session's score.
    steps : int
        Adaptation steps ``S`` (the paper's Table 3: 3).
    initial_lr : float
        Centre of the first step's grid (the paper's Table 3: 1).
    log_step : float
        Log10 distance ``delta`` between the first step's rates.
    shrink : float
        Factor applied to the log distance after every step, in (0, 1].
    max_rounds : int
        Longest a session may run before any session has reached the target.

    Returns
    -------
    SearchResult

    Raises
    ------
    InputError
        On a non-positive rate, distance, step count or round limit, or a shrink
        factor outside (0, 1].
    """
    if not initial_lr > 0 or not log_step > 0:
        raise InputError(f"initial_lr {initial_lr!r} and log_step {log_step!r} must be positive")
    if steps < 1 or max_rounds < 1:
        raise InputError(f"steps {steps} and max_rounds {max_rounds} must be at least 1")
    if not 0 < shrink <= 1:
        raise InputError(f"shrink {shrink!r} outside (0, 1]")
    windowed_score([], window)  # validates the window

    best_lr: float | None = None
    best_rounds: int | None = None
    center, delta = float(initial_lr), float(log_step)
    outcomes: list[SessionOutcome] = []
    step_rounds: list[int] = []
    scored: list[tuple[float, float, float]] = []
    for step in range(steps):
        rates = candidate_rates(center, delta, step)
        limit = max_rounds if best_rounds is None else best_rounds - 1
        played, winner = _run_step(session, rates, target, window, limit)
        step_rounds.append(max((p.rounds for p in played.values()), default=0))
        outcomes.extend(
            SessionOutcome(step, lr, p.rounds, lr == winner, p.score) for lr, p in played.items()
        )
        if winner is not None:
            best_lr, best_rounds, center = winner, played[winner].rounds, winner
        elif best_rounds is None:
            # Nobody reached the target yet: centre the next step on the best score so far.
            scored.extend((p.score, -lr, lr) for lr, p in played.items() if not math.isnan(p.score))
            if scored:
                center = max(scored)[2]
        delta *= shrink
    total = sum(o.rounds for o in outcomes)
    reached = best_rounds is not None
    chosen = best_lr if best_lr is not None else center
    return SearchResult(
        lr=chosen,
        reached=reached,
        best_rounds=best_rounds,
        sessions=tuple(outcomes),
        step_rounds=tuple(step_rounds),
        total_rounds=total,
        overhead_rounds=total - (best_rounds or 0),
    )


@dataclass
class _Played:
    rounds: int = 0
    score: float = math.nan


def _run_step(
    session: Session, rates: Sequence[float], target: float, window: int, limit: int
) -> tuple[dict[float, _Played], float | None]:
    """Run one adaptation step in lockstep; return per-rate outcomes and the winner, if any."""
    iterators = {lr: session(lr) for lr in rates}
    medians: dict[float, list[float]] = {lr: [] for lr in rates}
    played = {lr: _Played() for lr in rates}
    alive = list(rates)
    winner: float | None = None
    try:
        for _ in range(limit):
            reached: list[tuple[float, float, float]] = []
            for lr in list(alive):
                try:
                    value = float(next(iterators[lr]))
                except StopIteration:
                    alive.remove(lr)
                    continue
                medians[lr].append(value)
                played[lr].rounds += 1
                played[lr].score = windowed_score(medians[lr], window)
                if played[lr].score >= target:
                    reached.append((played[lr].score, -lr, lr))
            if reached:
                winner = max(reached)[2]
                break
            if not alive:
                break
    finally:
        for it in iterators.values():
            close = getattr(it, "close", None)
            if close is not None:
                close()
    return played, winner
