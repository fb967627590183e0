"""The sessions the learning-rate search plays: real FL rounds reporting their median accuracy (fl/lr_sessions.py)."""

import json

import numpy as np
import pytest

from exporters.userinput import InputError
from fl.maths.lr_search import search_server_lr


def test_inprocess_session_trains_real_rounds():
    from exporters.zoo.cfd import coded_cnn
    from exporters.zoo.common import TwoConvCNNSizes
    from fl.client import module_params
    from fl.lr_sessions import inprocess_session
    from fl.records import ClientSpec
    from fl.strategies.cfd import CodedFD

    model = coded_cnn(TwoConvCNNSizes(conv1=4, conv2=4, hidden=8, classes=3, image=8))
    initial = module_params(model.build())
    rng = np.random.default_rng(0)
    clients = [ClientSpec(f"c{i}", 6) for i in range(4)]
    shards = {c.cid: (rng.normal(size=(6, 1, 8, 8)).astype(np.float32), rng.integers(0, 3, 6)) for c in clients}
    session = inprocess_session(
        model,
        lambda lr: CodedFD(model, initial, local={"batch_size": 3}, code="gold", server_lr=lr),
        clients,
        shards,
        clients_per_round=2,
    )
    it = session(1.0)
    values = [next(it), next(it)]
    assert all(0.0 <= v <= 1.0 for v in values)
    with pytest.raises(InputError):
        inprocess_session(model, lambda lr: None, clients, shards, clients_per_round=5)


def test_server_sessions_are_logged_runs(tmp_path):
    from types import SimpleNamespace

    from fl.lr_sessions import server_session
    from fl.runlog import RunLog
    from fl.server import RunConfig
    from harness.store import ProfileStore

    rng = np.random.default_rng(0)

    def shard(n):
        return rng.normal(size=(n, 1, 28, 28)).astype(np.float32), rng.integers(0, 62, n)

    data = SimpleNamespace(train=[shard(4) for _ in range(3)], test=shard(4))
    config = RunConfig(
        strategy="cfd",
        model="fjord-cnn",
        dataset="synthetic",
        clients=3,
        per_round=2,
        batch_size=4,
        eval_every=1000,
        options={"code": "gold"},
        db=str(tmp_path / "runs.db"),
    )
    store = ProfileStore(config.db)
    try:
        # Unreachable target: step 1's three sessions each run max_rounds = 2 rounds.
        result = search_server_lr(
            server_session(config, store=store, data=data), target=2.0, window=1, steps=1, max_rounds=2
        )
        runs = RunLog(store).runs()
    finally:
        store.close()
    assert [s.rounds for s in result.sessions] == [2, 2, 2]
    assert all(0.0 <= s.score <= 1.0 for s in result.sessions)
    assert runs["rounds_done"].tolist() == [2, 2, 2]
    assert sorted(json.loads(c)["options"]["server_lr"] for c in runs["config"]) == pytest.approx([0.1, 1.0, 10.0])
