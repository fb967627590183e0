"""The FL run log: runs, clients, rounds and checkpoints in the profile store.

The ``fl_*`` tables live in the profile store's file but belong to this package:
`FL_MIGRATIONS` holds their DDL, applied by `ProfileStore.ensure_schema` (component
``"fl"``) when a `RunLog` opens a store. Version 1 creates the tables only if they
are missing, because stores written before the tables moved here already hold them.
Writes go through `ProfileStore.transaction`. Every round is **one** transaction holding its
``fl_rounds`` row, its ``fl_client_rounds`` rows and the run's checkpoint (which
replaces the previous one), so a run killed at any moment resumes from the last
round that is fully in the log, and the log never holds a round the checkpoint
does not.

Checkpoint encoding
-------------------
A checkpoint is a tree of dicts, lists and tuples whose leaves are numpy arrays,
numpy scalars or JSON values (str, int, float, bool, None). `encode_state`
writes it as ``np.savez`` bytes with ``allow_pickle=False``: each array is one
member ``a0``, ``a1``, ...; the tree itself is one uint8 member ``__tree__``
holding JSON in which an array is ``{"__array__": "a3"}``, a dict is
``{"__dict__": [[key, value], ...]}`` (keys may be str, int, float, bool or None
and keep their type) and a tuple is ``{"__tuple__": [...]}``. Nothing is ever
unpickled on load, and a dtype numpy cannot save without pickling (object
arrays) is refused on write.
"""

from __future__ import annotations

import io
import json
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from exporters.userinput import InputError
from harness.provenance import git_commit, host_versions
from harness.store import ProfileStore

if TYPE_CHECKING:
    import pandas as pd

_TREE = "__tree__"

#: The FL tables' migrations (component ``"fl"`` of the profile store); append-only.
FL_MIGRATIONS: tuple[str, ...] = (
    # v1: runs, clients, rounds, client rounds and checkpoints.
    """
    CREATE TABLE IF NOT EXISTS fl_runs (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        started_at REAL NOT NULL,
        finished_at REAL,
        strategy TEXT NOT NULL,
        model TEXT NOT NULL,
        dataset TEXT NOT NULL,
        executor TEXT NOT NULL DEFAULT 'inprocess',
        seed INTEGER NOT NULL,
        rounds INTEGER NOT NULL,
        config TEXT NOT NULL DEFAULT '{}',
        status TEXT NOT NULL DEFAULT 'running',
        versions TEXT NOT NULL DEFAULT '{}',
        git_commit TEXT
    );
    CREATE TABLE IF NOT EXISTS fl_clients (
        run_id INTEGER NOT NULL REFERENCES fl_runs(id),
        cid TEXT NOT NULL,
        device TEXT,
        capacity REAL NOT NULL,
        tier INTEGER NOT NULL DEFAULT 0,
        num_examples INTEGER NOT NULL,
        label_counts TEXT NOT NULL DEFAULT '{}',
        PRIMARY KEY (run_id, cid)
    );
    CREATE TABLE IF NOT EXISTS fl_rounds (
        run_id INTEGER NOT NULL REFERENCES fl_runs(id),
        round INTEGER NOT NULL,
        started_at REAL NOT NULL,
        finished_at REAL NOT NULL,
        wall_seconds REAL NOT NULL,
        metrics TEXT NOT NULL DEFAULT '{}',
        evaluation TEXT NOT NULL DEFAULT '{}',
        PRIMARY KEY (run_id, round)
    );
    CREATE TABLE IF NOT EXISTS fl_client_rounds (
        run_id INTEGER NOT NULL REFERENCES fl_runs(id),
        round INTEGER NOT NULL,
        cid TEXT NOT NULL,
        device TEXT,
        width REAL NOT NULL,
        arch_widths TEXT NOT NULL DEFAULT '[]',
        tier INTEGER NOT NULL DEFAULT 0,
        straggler INTEGER NOT NULL DEFAULT 0,
        status TEXT NOT NULL,
        message TEXT NOT NULL DEFAULT '',
        num_examples INTEGER NOT NULL DEFAULT 0,
        loss REAL,
        accuracy REAL,
        steps INTEGER,
        compute_seconds REAL,
        download_seconds REAL,
        upload_seconds REAL,
        wait_seconds REAL,
        train_flops REAL,
        metrics TEXT NOT NULL DEFAULT '{}',
        PRIMARY KEY (run_id, round, cid)
    );
    CREATE TABLE IF NOT EXISTS fl_checkpoints (
        run_id INTEGER PRIMARY KEY REFERENCES fl_runs(id),
        round INTEGER NOT NULL,
        state BLOB NOT NULL
    );
    """,
    # v2: why a run failed (its failed rounds' client failures, summarised).
    """
    ALTER TABLE fl_runs ADD COLUMN error TEXT;
    """,
    # v3: the virtual clock of a population run (fl.population): the round's virtual duration,
    # each client's virtual round time, and each client's device speed factor.
    """
    ALTER TABLE fl_rounds ADD COLUMN virtual_seconds REAL;
    ALTER TABLE fl_client_rounds ADD COLUMN virtual_seconds REAL;
    ALTER TABLE fl_clients ADD COLUMN speed_factor REAL;
    """,
    # v4: the runner backend a client trained with on its device (ort / onnx / torch; NULL in process).
    """
    ALTER TABLE fl_client_rounds ADD COLUMN backend TEXT;
    """,
    # v5: the round-cost model's prediction of each client's round, beside the measured times
    # (`fl.roundcost.ClientRoundPredictor`; NULL where the run had no profiles to predict from).
    """
    ALTER TABLE fl_client_rounds ADD COLUMN predicted_seconds REAL;
    """,
    # v6: the plan a run trains with (`fl.plan.FleetPlan` as JSON) and each revision of it:
    # revision 0 before the first round; a revision made after round R applies from R + 1.
    """
    CREATE TABLE IF NOT EXISTS fl_plans (
        run_id INTEGER NOT NULL REFERENCES fl_runs(id),
        revision INTEGER NOT NULL,
        from_round INTEGER NOT NULL,
        created_at REAL NOT NULL,
        reason TEXT NOT NULL DEFAULT '',
        plan TEXT NOT NULL,
        PRIMARY KEY (run_id, revision)
    );
    """,
    # v7: one name per idea: a client round's kept neurons per group are its architecture's sizes.
    """
    ALTER TABLE fl_client_rounds RENAME COLUMN arch_widths TO arch_sizes;
    """,
    # v8: energy per client round: predicted from the profiles' energy per image at the client's
    # width x the images it trained, measured by the device's power sensor (the runner train
    # document's ``energy``; emulated sensors marked); each round's sums beside them.
    """
    ALTER TABLE fl_client_rounds ADD COLUMN predicted_energy_j REAL;
    ALTER TABLE fl_client_rounds ADD COLUMN measured_energy_j REAL;
    ALTER TABLE fl_client_rounds ADD COLUMN energy_emulated INTEGER;
    ALTER TABLE fl_rounds ADD COLUMN predicted_energy_j REAL;
    ALTER TABLE fl_rounds ADD COLUMN measured_energy_j REAL;
    """,
)


#: Columns of an `fl_client_rounds` row, in the order `RunLog.log_round` writes them.
CLIENT_ROUND_COLUMNS = (
    "run_id", "round", "cid", "device", "width", "arch_sizes", "tier", "straggler", "status", "message",
    "num_examples", "loss", "accuracy", "steps", "compute_seconds", "download_seconds", "upload_seconds",
    "wait_seconds", "train_flops", "metrics", "virtual_seconds", "backend", "predicted_seconds",
    "predicted_energy_j", "measured_energy_j", "energy_emulated",
)  # fmt: skip


class CheckpointError(InputError):
    """A checkpoint that cannot be written or read (unsupported value, corrupt bytes)."""


def encode_state(state: Any) -> bytes:
    """Serialise a checkpoint tree to ``np.savez`` bytes (see the module docstring).

    Parameters
    ----------
    state : tree
        Dicts, lists and tuples of numpy arrays, numpy scalars and JSON values.

    Returns
    -------
    bytes

    Raises
    ------
    CheckpointError
        If a leaf is of another type, a dict key is not a JSON scalar, or an array has object dtype.
    """
    arrays: dict[str, np.ndarray] = {}

    def walk(node: Any) -> Any:
        if isinstance(node, np.ndarray):
            if node.dtype.hasobject:
                raise CheckpointError(f"checkpoint array of dtype {node.dtype} needs pickling; refused")
            key = f"a{len(arrays)}"
            arrays[key] = node
            return {"__array__": key}
        if isinstance(node, np.generic):
            return node.item()
        if isinstance(node, Mapping):
            items = []
            for k, v in node.items():
                if isinstance(k, np.generic):
                    k = k.item()
                if not (k is None or isinstance(k, str | int | float | bool)):
                    raise CheckpointError(f"checkpoint dict key {k!r} is not a str, number, bool or None")
                items.append([k, walk(v)])
            return {"__dict__": items}
        if isinstance(node, tuple):
            return {"__tuple__": [walk(v) for v in node]}
        if isinstance(node, list):
            return [walk(v) for v in node]
        if node is None or isinstance(node, str | int | float | bool):
            return node
        raise CheckpointError(f"checkpoint value of type {type(node).__name__} is not supported")

    tree = json.dumps(walk(state)).encode()
    buffer = io.BytesIO()
    members: dict[str, Any] = {_TREE: np.frombuffer(tree, dtype=np.uint8), **arrays}
    np.savez(buffer, allow_pickle=False, **members)
    return buffer.getvalue()


def decode_state(blob: bytes) -> Any:
    """Inverse of `encode_state` (never unpickles).

    Raises
    ------
    CheckpointError
        If the bytes are not a checkpoint written by `encode_state`.
    """
    try:
        with np.load(io.BytesIO(blob), allow_pickle=False) as archive:
            members = {name: archive[name] for name in archive.files}
        tree = json.loads(members.pop(_TREE).tobytes().decode())
    except (ValueError, KeyError, OSError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"not a fleetbench checkpoint: {exc}") from None

    def walk(node: Any) -> Any:
        if isinstance(node, list):
            return [walk(v) for v in node]
        if isinstance(node, dict):
            if "__array__" in node:
                return members[node["__array__"]]
            if "__tuple__" in node:
                return tuple(walk(v) for v in node["__tuple__"])
            return {k: walk(v) for k, v in node["__dict__"]}
        return node

    return walk(tree)


@dataclass(frozen=True)
class ClientRound:
    """One client's row of one round (``fl_client_rounds``).

    ``status`` is ``"ok"`` or a `fl.records.FAILURE_REASONS` value; the optional
    fields are None for a failed client. ``predicted_energy_j`` is the profiles' energy per
    image at the client's width times the images it trained (a population run's virtual
    energy); ``measured_energy_j`` the device's power sensor's joules over the round's
    training steps, ``energy_emulated`` whether that sensor was emulated (None: not measured).
    """

    cid: str
    width: float
    status: str
    device: str | None = None
    arch_sizes: tuple[int, ...] = ()
    tier: int = 0
    straggler: bool = False
    message: str = ""
    num_examples: int = 0
    loss: float | None = None
    accuracy: float | None = None
    steps: int | None = None
    compute_seconds: float | None = None
    download_seconds: float | None = None
    upload_seconds: float | None = None
    wait_seconds: float | None = None
    train_flops: float | None = None
    metrics: Mapping[str, Any] | None = None
    virtual_seconds: float | None = None
    backend: str | None = None
    predicted_seconds: float | None = None
    predicted_energy_j: float | None = None
    measured_energy_j: float | None = None
    energy_emulated: bool | None = None


def round_energy_totals(clients: Sequence[ClientRound]) -> tuple[float | None, float | None]:
    """Return a round's predicted and measured energy: the sums over its client rounds.

    Parameters
    ----------
    clients : sequence of ClientRound

    Returns
    -------
    predicted, measured : float or None
        The sum of the client rounds that have the value; None when none has it.
    """
    predicted = [c.predicted_energy_j for c in clients if c.predicted_energy_j is not None]
    measured = [c.measured_energy_j for c in clients if c.measured_energy_j is not None]
    return (float(sum(predicted)) if predicted else None, float(sum(measured)) if measured else None)


class RunLog:
    """Read and write FL runs in a `ProfileStore`.

    Parameters
    ----------
    store : ProfileStore
        An open store; the FL tables are created or upgraded (`FL_MIGRATIONS`).
    clock : callable
        Wall clock in seconds since the epoch (injected for tests).
    """

    def __init__(self, store: ProfileStore, clock: Callable[[], float] = time.time) -> None:
        self.store = store
        self.clock = clock
        store.ensure_schema("fl", FL_MIGRATIONS)

    # -- writing -----------------------------------------------------------------------------

    def start_run(
        self,
        *,
        strategy: str,
        model: str,
        dataset: str,
        executor: str,
        seed: int,
        rounds: int,
        config: Mapping[str, Any],
        clients: Sequence[Any],
        label_counts: Mapping[str, Mapping[int, int]] | None = None,
        speed_factors: Mapping[str, float] | None = None,
    ) -> int:
        """Insert a run and its clients; return the run id.

        Parameters
        ----------
        strategy, model, dataset, executor : str
        seed, rounds : int
        config : mapping
            The full run configuration (JSON values).
        clients : sequence of fl.records.ClientSpec
        label_counts : mapping of cid to {label: count}, optional
        speed_factors : mapping of cid to float, optional
            A population run's per-client speed factors (`fl.population.Population.factors`).
        """
        label_counts = label_counts or {}
        speed_factors = speed_factors or {}
        with self.store.transaction() as conn:
            cursor = conn.execute(
                "INSERT INTO fl_runs (started_at, strategy, model, dataset, executor, seed, rounds, config, "
                "status, versions, git_commit) VALUES (?, ?, ?, ?, ?, ?, ?, ?, 'running', ?, ?)",
                (
                    self.clock(),
                    strategy,
                    model,
                    dataset,
                    executor,
                    int(seed),
                    int(rounds),
                    json.dumps(dict(config), sort_keys=True),
                    json.dumps(host_versions(), sort_keys=True),
                    git_commit(),
                ),
            )
            run_id = int(cursor.lastrowid or 0)
            conn.executemany(
                "INSERT INTO fl_clients (run_id, cid, device, capacity, tier, num_examples, label_counts, "
                "speed_factor) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                [
                    (
                        run_id,
                        c.cid,
                        c.device,
                        float(c.capacity),
                        int(c.tier),
                        int(c.num_examples),
                        json.dumps({str(k): int(v) for k, v in label_counts.get(c.cid, {}).items()}),
                        speed_factors.get(c.cid),
                    )
                    for c in clients
                ],
            )
        return run_id

    def log_round(
        self,
        run_id: int,
        rnd: int,
        *,
        started_at: float,
        finished_at: float,
        wall_seconds: float,
        metrics: Mapping[str, Any],
        evaluation: Mapping[str, Any],
        clients: Sequence[ClientRound],
        checkpoint: Any,
        virtual_seconds: float | None = None,
    ) -> None:
        """Write one round (round row, client rows, checkpoint) in one transaction.

        Parameters
        ----------
        run_id, rnd : int
        started_at, finished_at : float
            Wall-clock times (seconds since the epoch).
        wall_seconds : float
            Round duration on the monotonic clock.
        metrics, evaluation : mapping
            JSON values (round metrics; ``{width: {"loss", "accuracy"}}``).
        clients : sequence of ClientRound
        checkpoint : tree
            State to resume from after this round (see `encode_state`); replaces the run's previous one.
        virtual_seconds : float, optional
            The round's duration on the virtual clock of a population run.

        The round's ``predicted_energy_j`` and ``measured_energy_j`` are its clients'
        sums (`round_energy_totals`).
        """
        blob = encode_state(checkpoint)
        predicted_j, measured_j = round_energy_totals(clients)
        with self.store.transaction() as conn:
            conn.execute(
                "INSERT INTO fl_rounds (run_id, round, started_at, finished_at, wall_seconds, metrics, evaluation, "
                "virtual_seconds, predicted_energy_j, measured_energy_j) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    run_id,
                    int(rnd),
                    started_at,
                    finished_at,
                    wall_seconds,
                    json.dumps(_jsonable(metrics), sort_keys=True),
                    json.dumps(_jsonable(evaluation), sort_keys=True),
                    virtual_seconds,
                    predicted_j,
                    measured_j,
                ),
            )
            conn.executemany(
                f"INSERT INTO fl_client_rounds ({', '.join(CLIENT_ROUND_COLUMNS)}) "
                f"VALUES ({', '.join('?' * len(CLIENT_ROUND_COLUMNS))})",
                [
                    (
                        run_id,
                        int(rnd),
                        c.cid,
                        c.device,
                        float(c.width),
                        json.dumps([int(w) for w in c.arch_sizes]),
                        int(c.tier),
                        int(bool(c.straggler)),
                        c.status,
                        c.message,
                        int(c.num_examples),
                        c.loss,
                        c.accuracy,
                        c.steps,
                        c.compute_seconds,
                        c.download_seconds,
                        c.upload_seconds,
                        c.wait_seconds,
                        c.train_flops,
                        json.dumps(_jsonable(c.metrics or {}), sort_keys=True),
                        c.virtual_seconds,
                        c.backend,
                        c.predicted_seconds,
                        c.predicted_energy_j,
                        c.measured_energy_j,
                        None if c.energy_emulated is None else int(bool(c.energy_emulated)),
                    )
                    for c in clients
                ],
            )
            conn.execute(
                "INSERT INTO fl_checkpoints (run_id, round, state) VALUES (?, ?, ?) "
                "ON CONFLICT(run_id) DO UPDATE SET round = excluded.round, state = excluded.state",
                (run_id, int(rnd), blob),
            )

    def mark_resumed(self, run_id: int, rounds: int, config: Mapping[str, Any]) -> None:
        """Record a resumed run's new round target and configuration; mark it running again."""
        with self.store.transaction() as conn:
            conn.execute(
                "UPDATE fl_runs SET rounds = ?, config = ?, status = 'running', finished_at = NULL WHERE id = ?",
                (int(rounds), json.dumps(dict(config), sort_keys=True), run_id),
            )

    def finish_run(self, run_id: int, status: str = "finished", error: str | None = None) -> None:
        """Mark a run finished (or ``"failed"`` / ``"interrupted"``) now.

        Parameters
        ----------
        run_id : int
        status : str
        error : str, optional
            Why the run failed (stored in ``fl_runs.error``).
        """
        with self.store.transaction() as conn:
            conn.execute(
                "UPDATE fl_runs SET status = ?, finished_at = ?, error = ? WHERE id = ?",
                (status, self.clock(), error, run_id),
            )

    def log_plan(self, run_id: int, revision: int, from_round: int, plan: Mapping[str, Any], reason: str = "") -> None:
        """Store revision ``revision`` of a run's plan, in force from round ``from_round`` (0-based).

        Parameters
        ----------
        run_id, revision, from_round : int
        plan : mapping
            The plan as JSON-ready data (`fl.plan.FleetPlan.to_json`).
        reason : str
            Why it was made ("" for the plan the run started with).
        """
        with self.store.transaction() as conn:
            conn.execute(
                "INSERT OR REPLACE INTO fl_plans (run_id, revision, from_round, created_at, reason, plan) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                (run_id, int(revision), int(from_round), self.clock(), reason, json.dumps(_jsonable(plan))),
            )

    # -- reading -----------------------------------------------------------------------------

    def run(self, run_id: int) -> dict[str, Any]:
        """Return one run's row as a dict (``config`` and ``versions`` decoded).

        Raises
        ------
        InputError
            If the store has no run with that id.
        """
        frame = self._frame("SELECT * FROM fl_runs WHERE id = ?", (run_id,))
        if frame.empty:
            raise InputError(f"no FL run {run_id} in {self.store.path}")
        row = frame.iloc[0].to_dict()
        row["config"] = json.loads(row["config"])
        row["versions"] = json.loads(row["versions"])
        return row

    def runs(self) -> pd.DataFrame:
        """Return every run, one row each, with its completed round count (``rounds_done``)."""
        return self._frame(
            "SELECT r.*, (SELECT COUNT(*) FROM fl_rounds WHERE run_id = r.id) AS rounds_done "
            "FROM fl_runs r ORDER BY r.id"
        )

    def rounds(self, run_id: int) -> pd.DataFrame:
        """Return a run's rounds in order (``metrics`` and ``evaluation`` decoded to dicts)."""
        frame = self._frame("SELECT * FROM fl_rounds WHERE run_id = ? ORDER BY round", (run_id,))
        for column in ("metrics", "evaluation"):
            frame[column] = [json.loads(v) for v in frame[column]]
        return frame

    def client_rounds(self, run_id: int) -> pd.DataFrame:
        """Return a run's per-client round rows, by round then client id."""
        frame = self._frame("SELECT * FROM fl_client_rounds WHERE run_id = ? ORDER BY round, cid", (run_id,))
        frame["arch_sizes"] = [tuple(json.loads(v)) for v in frame["arch_sizes"]]
        frame["metrics"] = [json.loads(v) for v in frame["metrics"]]
        frame["straggler"] = frame["straggler"].astype(bool)
        frame["energy_emulated"] = [None if v is None or v != v else bool(v) for v in frame["energy_emulated"]]
        return frame

    def clients(self, run_id: int) -> pd.DataFrame:
        """Return a run's clients (``label_counts`` decoded to ``{label: count}``)."""
        frame = self._frame("SELECT * FROM fl_clients WHERE run_id = ? ORDER BY rowid", (run_id,))
        frame["label_counts"] = [{int(k): v for k, v in json.loads(s).items()} for s in frame["label_counts"]]
        return frame

    def plans(self, run_id: int) -> list[dict[str, Any]]:
        """Return a run's plan and its revisions in order: ``{revision, from_round, reason, plan}`` each."""
        frame = self._frame("SELECT * FROM fl_plans WHERE run_id = ? ORDER BY revision", (run_id,))
        return [
            {
                "revision": int(r.revision),
                "from_round": int(r.from_round),
                "reason": r.reason,
                "plan": json.loads(r.plan),
            }
            for r in frame.itertuples(index=False)
        ]

    def load_checkpoint(self, run_id: int) -> tuple[int, Any] | None:
        """Return ``(round, state)`` of the run's latest checkpoint, or None when it has none."""
        with self.store.transaction() as conn:
            row = conn.execute("SELECT round, state FROM fl_checkpoints WHERE run_id = ?", (run_id,)).fetchone()
        if row is None:
            return None
        return int(row[0]), decode_state(bytes(row[1]))

    def _frame(self, sql: str, params: Sequence[Any] = ()) -> pd.DataFrame:
        import pandas as pd

        with self.store.transaction() as conn:
            cursor = conn.execute(sql, tuple(params))
            columns = [d[0] for d in cursor.description]
            rows = cursor.fetchall()
        return pd.DataFrame(rows, columns=columns)


#: The tables `read_history` returns, each with the order its rows come in.
_HISTORY_ORDER = {
    "fl_runs": "id",
    "fl_rounds": "run_id, round",
    "fl_client_rounds": "run_id, round",
    "fl_plans": "run_id, revision",
}


@dataclass(frozen=True)
class RunHistory:
    """Every FL run of a store, as stored: one DataFrame per table.

    The columns are the tables' own (`FL_MIGRATIONS`); JSON columns (``config``,
    ``metrics``, ``evaluation``, ``arch_sizes``, ``plan``) hold the stored text. A table
    the store does not have (no FL run was ever logged) is an empty DataFrame.

    Attributes
    ----------
    runs : pandas.DataFrame
        ``fl_runs``, by id.
    rounds : pandas.DataFrame
        ``fl_rounds``, by run then round.
    client_rounds : pandas.DataFrame
        ``fl_client_rounds``, by run then round.
    plans : pandas.DataFrame
        ``fl_plans``, by run then revision.
    """

    runs: pd.DataFrame
    rounds: pd.DataFrame
    client_rounds: pd.DataFrame
    plans: pd.DataFrame


def read_history(path: str | Path) -> RunHistory:
    """Read every FL run of the store at ``path`` without writing to it.

    Unlike `RunLog`, which creates or upgrades the FL tables when it opens a store,
    this opens the file read-only, so a report can be built from a store another
    process is writing, or from a copy on read-only media.

    Parameters
    ----------
    path : str or pathlib.Path
        An existing profile store.

    Returns
    -------
    RunHistory
    """
    import sqlite3

    import pandas as pd

    conn = sqlite3.connect(f"{Path(path).resolve().as_uri()}?mode=ro", uri=True)
    try:
        found = {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        frames = {
            name: pd.read_sql_query(f"SELECT * FROM {name} ORDER BY {order}", conn)  # noqa: S608
            if name in found
            else pd.DataFrame()
            for name, order in _HISTORY_ORDER.items()
        }
    finally:
        conn.close()
    return RunHistory(frames["fl_runs"], frames["fl_rounds"], frames["fl_client_rounds"], frames["fl_plans"])


def _jsonable(value: Any) -> Any:
    """Convert numpy scalars and non-string keys so that ``json.dumps`` accepts a metrics tree."""
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    return value
