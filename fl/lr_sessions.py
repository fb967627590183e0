"""Sessions the learning-rate search plays: FL runs that report each round's median client accuracy.

`fl.maths.lr_search.search_server_lr` plays sessions, one per candidate rate, and stops the
losing ones; a session here is one real run: `server_session` a logged run of the FL server,
resumed one round at a time, `inprocess_session` a light loop over a strategy and in-memory
client data (tests and benchmarks).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterator, Mapping, Sequence

import numpy as np

from exporters.userinput import InputError
from exporters.zoo import ZooModel
from fl.client import run_local
from fl.maths.lr_search import Session
from fl.records import ClientSpec
from fl.runlog import RunLog
from fl.server import FederatedDataLike, RunConfig, run_fl
from fl.strategies.base import Strategy
from harness.store import ProfileStore


def inprocess_session(
    model: ZooModel,
    make_strategy: Callable[[float], Strategy],
    clients: Sequence[ClientSpec],
    shards: Mapping[str, tuple[np.ndarray, np.ndarray]],
    *,
    clients_per_round: int,
    seed: int = 0,
) -> Session:
    """Return a `Session` that trains real FL rounds in this process.

    Each call ``session(lr)`` builds a fresh strategy with ``make_strategy(lr)`` and
    yields, after every round, the median of the clients' training accuracies
    (``TrainRes.metrics["accuracy"]``). Clients are sampled per round without
    replacement from ``numpy.random.default_rng((seed, session number, round))``,
    so parallel sessions see different client subsets, as in the paper.

    Parameters
    ----------
    model : ZooModel
    make_strategy : callable
        ``lr -> Strategy`` (e.g. ``lambda lr: CodedFD(model, initial, server_lr=lr)``).
    clients : sequence of ClientSpec
    shards : mapping
        ``cid -> (x, y)`` training data of every client.
    clients_per_round : int
    seed : int

    Returns
    -------
    Session
    """
    if not 1 <= clients_per_round <= len(clients):
        raise InputError(f"clients_per_round {clients_per_round} outside [1, {len(clients)}]")
    started = [0]

    def session(lr: float) -> Iterator[float]:
        number = started[0]
        started[0] += 1
        return _rounds(model, make_strategy(lr), clients, shards, clients_per_round, (seed, number))

    return session


def _rounds(
    model: ZooModel,
    strategy: Strategy,
    clients: Sequence[ClientSpec],
    shards: Mapping[str, tuple[np.ndarray, np.ndarray]],
    per_round: int,
    key: tuple[int, int],
) -> Iterator[float]:
    rnd = 0
    while True:
        rng = np.random.default_rng((*key, rnd))
        sampled = [clients[i] for i in sorted(rng.choice(len(clients), size=per_round, replace=False))]
        instructions = strategy.configure_round(rnd, sampled)
        results = [run_local(model, ins, *shards[cid]) for cid, ins in instructions.items()]
        strategy.aggregate_round(rnd, results, [])
        yield float(np.median([r.metrics["accuracy"] for r in results]))
        rnd += 1


def server_session(
    config: RunConfig,
    *,
    store: ProfileStore,
    data: FederatedDataLike | None = None,
    lr_option: str = "server_lr",
) -> Session:
    """Return a `Session` whose sessions are runs of the FL server (`fl.server.run_fl`).

    ``session(lr)`` starts a run of ``config`` with strategy option
    ``lr_option = lr`` (so every session starts from the same initial model and,
    with the same seed, samples the same clients), logged in ``store`` like any
    run. Each ``next()`` trains one more round (resuming the run from its
    checkpoint) and yields the median training accuracy of that round's clients
    (``accuracy`` of its ``ok`` client rows; ``nan`` if none finished).

    Parameters
    ----------
    config : RunConfig
        The run; ``rounds`` is ignored (sessions run until the search stops them).
        Set ``eval_every`` high to skip test-set evaluation during the search.
    store : ProfileStore
        Where the sessions are logged.
    data : FederatedData, optional
        Preloaded federated data (default: loaded once per session, as `run_fl` does).
    lr_option : str
        Strategy option that takes the server learning rate.

    Returns
    -------
    Session
    """

    def session(lr: float) -> Iterator[float]:
        options = {**dict(config.options), lr_option: float(lr)}
        return _server_rounds(dataclasses.replace(config, rounds=1, options=options), store, data)

    return session


def _server_rounds(config: RunConfig, store: ProfileStore, data: FederatedDataLike | None) -> Iterator[float]:
    if data is None:
        from exporters.zoo import get_model
        from fl.data import load_federated

        data = load_federated(config.dataset, get_model(config.model), config.clients, config.partition, config.seed)
    log = RunLog(store)
    run_id = run_fl(config, store=store, data=data, progress=None).run_id
    rnd = 0
    while True:
        rows = log.client_rounds(run_id)
        done = rows[(rows["round"] == rnd) & (rows["status"] == "ok")]["accuracy"].dropna()
        yield float(np.median(done.to_numpy(dtype=float))) if len(done) else math.nan
        rnd += 1
        run_fl(dataclasses.replace(config, rounds=rnd + 1), store=store, data=data, resume_run=run_id, progress=None)
