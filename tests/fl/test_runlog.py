from __future__ import annotations

import io
import sqlite3

import numpy as np
import pandas as pd
import pytest

from fl.records import ClientSpec
from fl.runlog import CheckpointError, ClientRound, RunLog, decode_state, encode_state, read_history
from harness.store import ProfileStore


class Tick:
    def __init__(self, start: float = 1000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        self.now += 1.0
        return self.now


@pytest.fixture
def store(tmp_path):
    with ProfileStore(tmp_path / "fl.db") as opened:
        yield opened


def start(log: RunLog, **changes) -> int:
    args = dict(
        strategy="fedavg",
        model="fjord-cnn",
        dataset="digits",
        executor="inprocess",
        seed=7,
        rounds=2,
        config={"lr": 0.1, "options": {"a": [1, 2]}},
        clients=[ClientSpec("c0", 12, 1.0, 0), ClientSpec("c1", 8, 0.5, 1, device="pi4")],
        label_counts={"c0": {0: 5, 3: 7}, "c1": {1: 8}},
    )
    args.update(changes)
    return log.start_run(**args)


def log_bare_round(log: RunLog, run_id: int, rnd: int, clients: list[ClientRound], checkpoint: dict) -> None:
    """Log a round timed 0 to 1 s with no metrics and no evaluation."""
    log.log_round(
        run_id,
        rnd,
        started_at=0,
        finished_at=1,
        wall_seconds=1,
        metrics={},
        evaluation={},
        clients=clients,
        checkpoint=checkpoint,
    )


def round_rows() -> list[ClientRound]:
    return [
        ClientRound(
            "c0",
            1.0,
            "ok",
            arch_sizes=(20, 15),
            num_examples=12,
            loss=0.5,
            accuracy=0.75,
            steps=3,
            compute_seconds=0.2,
            download_seconds=0.0,
            upload_seconds=0.0,
            train_flops=1e6,
            metrics={"loss": 0.5},
        ),
        ClientRound(
            "c1",
            0.5,
            "timeout",
            device="pi4",
            arch_sizes=(10, 8),
            tier=1,
            straggler=True,
            message="took too long",
            num_examples=8,
            wait_seconds=3.0,
        ),
    ]


# -- checkpoint encoding -----------------------------------------------------------------------


def test_encoding_round_trips_nested_state_with_typed_keys():
    state = {
        "global": {"conv.weight": np.arange(6, dtype=np.float32).reshape(2, 3), "bias": np.zeros(2, np.float32)},
        "keep": {0.5: np.array([0.25, 0.75]), 1.0: np.ones(3)},
        "counts": {3: np.array([1, 2], dtype=np.int64)},
        "round": 4,
        "lr": 0.01,
        "name": "x",
        "flag": True,
        "nothing": None,
        "pair": (np.float32(1.5), [1, "a"]),
    }
    back = decode_state(encode_state(state))
    assert set(back) == set(state)
    assert back["global"]["conv.weight"].dtype == np.float32
    assert np.array_equal(back["global"]["conv.weight"], state["global"]["conv.weight"])
    assert list(back["keep"]) == [0.5, 1.0]  # float keys stay floats, in order
    assert np.array_equal(back["keep"][0.5], [0.25, 0.75])
    assert list(back["counts"]) == [3] and back["counts"][3].dtype == np.int64
    assert back["round"] == 4 and back["lr"] == 0.01 and back["name"] == "x"
    assert back["flag"] is True and back["nothing"] is None
    assert back["pair"] == (1.5, [1, "a"]) and isinstance(back["pair"], tuple)


def test_encoding_is_a_plain_npz_without_pickles():
    blob = encode_state({"w": np.ones(3, np.float32)})
    with np.load(io.BytesIO(blob), allow_pickle=False) as archive:
        assert sorted(archive.files) == ["__tree__", "a0"]
        assert archive["a0"].tolist() == [1.0, 1.0, 1.0]


@pytest.mark.parametrize("bad", [{"w": np.array([object()], dtype=object)}, {"f": {1, 2}}, {(1, 2): 3}])
def test_encoding_refuses_what_needs_pickling(bad):
    with pytest.raises(CheckpointError):
        encode_state(bad)


def test_decoding_garbage_is_a_checkpoint_error():
    with pytest.raises(CheckpointError, match="not a fleetbench checkpoint"):
        decode_state(b"definitely not an npz")


# -- the log -----------------------------------------------------------------------------------


def test_run_and_clients_are_stored(store):
    log = RunLog(store, clock=Tick())
    run_id = start(log)
    run = log.run(run_id)
    assert run["strategy"] == "fedavg" and run["seed"] == 7 and run["status"] == "running"
    assert run["config"] == {"lr": 0.1, "options": {"a": [1, 2]}}
    assert run["started_at"] == 1001.0
    assert "python" in run["versions"]
    clients = log.clients(run_id)
    assert list(clients["cid"]) == ["c0", "c1"]
    assert clients["device"].isna().tolist() == [True, False] and clients.iloc[1]["device"] == "pi4"
    assert list(clients["capacity"]) == [1.0, 0.5] and list(clients["tier"]) == [0, 1]
    assert clients.iloc[0]["label_counts"] == {0: 5, 3: 7}
    log.finish_run(run_id)
    runs = log.runs()
    assert runs.iloc[0]["status"] == "finished" and runs.iloc[0]["finished_at"] == 1002.0
    assert runs.iloc[0]["rounds_done"] == 0


def test_round_rows_and_checkpoint_replace(store):
    log = RunLog(store, clock=Tick())
    run_id = start(log)
    other = start(log, seed=8)
    for rnd in range(2):
        log.log_round(
            run_id,
            rnd,
            started_at=10.0 + rnd,
            finished_at=11.0 + rnd,
            wall_seconds=0.9,
            metrics={"clients_ok": 1, "x": np.float32(0.5)},
            evaluation={"1.0": {"accuracy": 0.5 + rnd / 10}},
            clients=round_rows(),
            checkpoint={"round": rnd, "w": np.full(2, rnd, np.float32)},
        )
    log_bare_round(log, other, 0, [], {"round": 0, "w": np.full(2, 9, np.float32)})
    rounds = log.rounds(run_id)
    assert list(rounds["round"]) == [0, 1]
    assert rounds.iloc[1]["evaluation"] == {"1.0": {"accuracy": 0.6}}
    assert rounds.iloc[0]["metrics"] == {"clients_ok": 1, "x": 0.5}
    rows = log.client_rounds(run_id)
    assert len(rows) == 4 and list(rows["cid"]) == ["c0", "c1", "c0", "c1"]
    failed = rows.iloc[1]
    assert failed["status"] == "timeout" and failed["message"] == "took too long"
    assert bool(failed["straggler"]) is True and failed["arch_sizes"] == (10, 8) and failed["device"] == "pi4"
    assert np.isnan(failed["loss"]) and failed["wait_seconds"] == 3.0
    ok = rows.iloc[0]
    assert ok["loss"] == 0.5 and ok["steps"] == 3 and ok["train_flops"] == 1e6 and ok["metrics"] == {"loss": 0.5}
    # one checkpoint per run: the latest replaced the first, the other run's is its own
    rnd, state = log.load_checkpoint(run_id)
    assert rnd == 1 and state["round"] == 1 and state["w"].tolist() == [1.0, 1.0]
    assert log.load_checkpoint(other)[1]["w"].tolist() == [9.0, 9.0]
    with store.transaction() as conn:
        assert conn.execute("SELECT COUNT(*) FROM fl_checkpoints").fetchone()[0] == 2
    assert log.runs().set_index("id").loc[run_id, "rounds_done"] == 2


def test_history_reads_every_run_in_order_without_writing(tmp_path):
    path = tmp_path / "fl.db"
    with ProfileStore(path) as opened:
        log = RunLog(opened, clock=Tick())
        first, second = start(log), start(log, seed=8)
        log_bare_round(log, second, 1, round_rows(), {"round": 1})
        log_bare_round(log, second, 0, [], {"round": 0})
        log.log_plan(first, 0, 0, {"devices": []})
    before = path.read_bytes()
    history = read_history(path)
    assert list(history.runs["id"]) == [first, second] and list(history.runs["seed"]) == [7, 8]
    assert list(history.rounds["round"]) == [0, 1]  # by run, then round: not in the order logged
    assert len(history.client_rounds) == 2 and set(history.client_rounds["run_id"]) == {second}
    assert history.plans.iloc[0]["plan"] == '{"devices": []}'  # JSON as stored
    assert path.read_bytes() == before


def test_history_of_a_store_without_runs_is_empty_and_creates_no_table(tmp_path):
    path = tmp_path / "cells.db"
    with ProfileStore(path):
        pass
    history = read_history(path)
    assert all(frame.empty for frame in (history.runs, history.rounds, history.client_rounds, history.plans))
    tables = {row[0] for row in sqlite3.connect(path).execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert not any(name.startswith("fl_") for name in tables)


def test_a_failed_round_write_leaves_no_partial_round(store):
    log = RunLog(store, clock=Tick())
    run_id = start(log)
    log_bare_round(log, run_id, 0, round_rows(), {"round": 0})
    duplicate = [round_rows()[0], round_rows()[0]]  # same (run, round, cid) twice: the insert fails
    with pytest.raises(sqlite3.IntegrityError):
        log_bare_round(log, run_id, 1, duplicate, {"round": 1})
    assert list(log.rounds(run_id)["round"]) == [0]
    assert set(log.client_rounds(run_id)["round"]) == {0}
    assert log.load_checkpoint(run_id)[0] == 0


def test_missing_run_and_missing_checkpoint(store):
    log = RunLog(store)
    with pytest.raises(Exception, match="no FL run 5"):
        log.run(5)
    assert log.load_checkpoint(5) is None
    assert log.runs().empty


def test_a_store_before_virtual_times_is_upgraded_and_keeps_its_rows(tmp_path):
    from fl.runlog import FL_MIGRATIONS

    path = tmp_path / "old.db"
    with ProfileStore(path) as old:
        old.ensure_schema("fl", FL_MIGRATIONS[:2])  # the log as it was before virtual times
        with old.transaction() as conn:
            conn.execute(
                "INSERT INTO fl_runs (started_at, strategy, model, dataset, seed, rounds) "
                "VALUES (1.0, 'fedavg', 'fjord-cnn', 'digits', 0, 1)"
            )
            conn.execute(
                "INSERT INTO fl_rounds (run_id, round, started_at, finished_at, wall_seconds) VALUES (1, 0, 1, 2, 1)"
            )
    with ProfileStore(path) as upgraded:
        log = RunLog(upgraded)
        assert upgraded.ensure_schema("fl", FL_MIGRATIONS) == len(FL_MIGRATIONS) >= 3
        old_round = log.rounds(1)
        assert list(old_round["wall_seconds"]) == [1.0] and old_round["virtual_seconds"].isna().all()
        run_id = start(log)
        log.log_round(
            run_id, 0, started_at=1.0, finished_at=2.0, wall_seconds=1.0, metrics={}, evaluation={},
            clients=[ClientRound("c0", 1.0, "ok", virtual_seconds=3.25)], checkpoint={"round": 0},
            virtual_seconds=4.5,
        )  # fmt: skip
        assert list(log.rounds(run_id)["virtual_seconds"]) == [4.5]
        assert list(log.client_rounds(run_id)["virtual_seconds"]) == [3.25]
        assert log.clients(run_id)["speed_factor"].isna().all()


def test_a_store_before_predictions_gains_the_column_and_logs_it(tmp_path):
    from fl.runlog import FL_MIGRATIONS

    path = tmp_path / "v3.db"
    with ProfileStore(path) as old:
        old.ensure_schema("fl", FL_MIGRATIONS[:3])  # the log as it was before predicted round times
        with old.transaction() as conn:
            conn.execute(
                "INSERT INTO fl_runs (started_at, strategy, model, dataset, seed, rounds) "
                "VALUES (1.0, 'fedavg', 'fjord-cnn', 'digits', 0, 1)"
            )
            conn.execute(
                "INSERT INTO fl_client_rounds (run_id, round, cid, width, status, compute_seconds) "
                "VALUES (1, 0, 'c0', 1.0, 'ok', 2.0)"
            )
    with ProfileStore(path) as upgraded:
        log = RunLog(upgraded)
        [old_row] = log.client_rounds(1).to_dict("records")
        assert old_row["compute_seconds"] == 2.0 and old_row["predicted_seconds"] is None
        run_id = start(log)
        log.log_round(
            run_id, 0, started_at=1.0, finished_at=2.0, wall_seconds=1.0, metrics={}, evaluation={},
            clients=[ClientRound("c0", 1.0, "ok", predicted_seconds=2.5), ClientRound("c1", 1.0, "ok")],
            checkpoint={"round": 0},
        )  # fmt: skip
        frame = log.client_rounds(run_id)
        assert frame["predicted_seconds"].iloc[0] == 2.5 and pd.isna(frame["predicted_seconds"].iloc[1])
