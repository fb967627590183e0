"""The profile store: one SQLite file of campaigns and measured cells.

Design
------
* **File**: SQLite (``fleetbench.db`` by default), WAL journal, ``synchronous=FULL``.
  Every measured (or failed) cell is written by `ProfileStore.record` in its own
  transaction, so a finished cell is durable as soon as ``record`` returns, and a
  process killed in the middle of a write leaves the file consistent (SQLite rolls
  the unfinished transaction back on the next open). ``--resume`` asks
  `ProfileStore.measured_keys` which cells to skip.
* **Schema versions**: the ``schema_version`` table holds one integer, the number of
  entries of `MIGRATIONS` applied. Opening a file applies the missing migrations in
  order, all in one transaction (an interrupted or failing upgrade leaves the file
  at its old version); a file whose version is newer than this code knows is
  refused with `StoreError`. Migrations are append-only: never edit a released
  entry, add a new one.
* **Components**: a package above the harness that keeps tables in the same file
  (``fl``: its ``fl_*`` run tables) owns their DDL and applies it with
  `ProfileStore.ensure_schema`, versioned per component in ``component_schema``, the
  same way (in order, one transaction, newer versions refused).
* **Attempts**: every call to ``record`` adds a row; a cell (``BenchSpec.cell_key``)
  may have several attempts (a failure, then a success on ``--resume``). The
  *latest attempt* of a key is its row with the highest id. `latest_cells` gives
  one row per key (the latest attempt) with statistics derived from the raw
  samples by `harness.stats`; statistics are never stored.
* **Provenance**: each cell row carries the host tool versions and the fleetbench
  git commit of the `Measurement` (the campaign fills them with `host_versions`
  and `git_commit`); the campaign row carries them too, and views fall back to the
  campaign's when a cell has none.
* **Threads**: one connection guarded by a lock, so the devices' worker threads of
  a campaign may share one `ProfileStore`. Other processes may open the same file
  (WAL; writers wait up to `BUSY_TIMEOUT_S`).
* **A full disk**: a write that finds the file system full is rolled back whole (the
  file stays consistent and every earlier cell stays stored) and is `StoreUnavailable`,
  one line naming the file and the bytes free (`exporters.host_disk.free_bytes`); once
  space is freed, ``--resume`` measures only the cells that were not stored.
"""

from __future__ import annotations

import json
import math
import os
import sqlite3
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

from harness.cell_view import cell_frame, view_record
from harness.document import parse_document
from harness.provenance import git_commit, host_versions
from harness.records import BenchSpec, Measurement, ModelRecord
from harness.roundcost import RoundCostModel
from harness.runner.protocol import DEFAULT_MAX_SECONDS
from harness.store_errors import StoreError, StoreUnavailable, environmental, unavailable
from harness.store_schema import ENERGY_COLUMNS, MIGRATIONS, SCHEMA_VERSION, split_statements

if TYPE_CHECKING:
    import pandas as pd

#: Default store file name (``--db``).
DEFAULT_DB = "fleetbench.db"

#: Seconds a writer waits for another process's write lock before failing.
BUSY_TIMEOUT_S = 30.0


def _dumps(value: Any) -> str:
    return json.dumps(value, sort_keys=True, default=str)


def _float_or_none(value: Any) -> float | None:
    if value is None:
        return None
    number = float(value)
    return number if math.isfinite(number) else None


def _energy_values(measurement: Measurement) -> dict[str, Any]:
    """Return the energy columns of a cell: its reading's, NULL where not measured or not ok."""
    energy = measurement.runner.energy if measurement.ok else None
    if energy is None:
        return {name: None for name in ENERGY_COLUMNS}
    return {
        "energy_j_per_image": energy.joules_per_image,
        "energy_above_idle_j_per_image": energy.above_idle_per_image,
        "energy_uncertainty_j_per_image": energy.uncertainty_per_image,
        "energy_sensor": energy.sensor or None,
        "energy_flag": energy.flag,
        "energy_emulated": int(energy.emulated),
    }


def _loads_mapping(text: str | None) -> dict[str, Any]:
    if not text:
        return {}
    value = json.loads(text)
    return dict(value) if isinstance(value, Mapping) else {}


class ProfileStore:
    """A SQLite profile store: campaigns, cells and pandas views over them.

    Parameters
    ----------
    path : str or path-like
        Store file; created (with its parent directories) when missing, upgraded
        to `SCHEMA_VERSION` when older.
    create : bool
        With False, a missing file is refused instead of created (commands that only read).

    Raises
    ------
    StoreError
        If the file is missing and ``create`` is False, is not a SQLite database, is not
        a fleetbench store, or has a schema version newer than `SCHEMA_VERSION`.
    StoreUnavailable
        If SQLite cannot read or write it (permissions, lock, disk).

    Examples
    --------
    >>> with ProfileStore("fleetbench.db") as store:  # doctest: +SKIP
    ...     cid = store.start_campaign(fleet="fleet.yaml", model="cnn")
    ...     store.record(cid, measurement)
    ...     table = store.latest_cells()
    """

    def __init__(self, path: str | os.PathLike[str] = DEFAULT_DB, *, create: bool = True) -> None:
        self.path = Path(path)
        if not create and not self.path.is_file():
            raise StoreError(f"no profile store at {self.path}")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.RLock()
        try:
            self._conn = sqlite3.connect(
                self.path, timeout=BUSY_TIMEOUT_S, isolation_level=None, check_same_thread=False
            )
        except sqlite3.Error as exc:
            raise StoreError(f"cannot open profile store {self.path}: {exc}") from None
        try:
            self._conn.execute("PRAGMA journal_mode=WAL")
            self._conn.execute("PRAGMA synchronous=FULL")
            self._conn.execute("PRAGMA foreign_keys=ON")
            self._migrate()
        except sqlite3.OperationalError as exc:
            self._conn.close()
            if not environmental(exc):
                raise StoreError(f"{self.path} is not a usable profile store: {exc}") from None
            raise unavailable(self.path, exc, "cannot use ") from None
        except StoreUnavailable:
            self._conn.close()
            raise
        except sqlite3.DatabaseError as exc:
            self._conn.close()
            raise StoreError(f"{self.path} is not a usable profile store: {exc}") from None
        except BaseException:
            self._conn.close()
            raise

    # -- lifecycle ---------------------------------------------------------------------------

    def close(self) -> None:
        """Close the connection (idempotent)."""
        with self._lock:
            self._conn.close()

    def __enter__(self) -> ProfileStore:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    @contextmanager
    def _locked(self) -> Iterator[sqlite3.Connection]:
        """Hold the lock; turn SQLite's environment errors into `StoreUnavailable` naming the file."""
        with self._lock:
            try:
                yield self._conn
            except sqlite3.OperationalError as exc:
                if not environmental(exc):
                    raise
                raise unavailable(self.path, exc) from exc

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """Hold the lock and one IMMEDIATE transaction; commit on success, roll back otherwise.

        Yields
        ------
        sqlite3.Connection
            The store's connection (rows as tuples unless the caller sets a factory
            on a cursor); other packages' tables (``fl_*``) are written through it.
        """
        with self._locked() as conn:
            conn.execute("BEGIN IMMEDIATE")
            try:
                yield conn
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise
            try:
                conn.execute("COMMIT")
            except sqlite3.Error:
                if conn.in_transaction:  # a COMMIT that could not write (a full disk) leaves it open
                    conn.execute("ROLLBACK")
                raise

    # -- schema ------------------------------------------------------------------------------

    @property
    def schema_version(self) -> int:
        """The schema version of the open file."""
        with self._locked() as conn:
            row = conn.execute("SELECT version FROM schema_version").fetchone()
        return int(row[0])

    def ensure_schema(self, component: str, migrations: Sequence[str]) -> int:
        """Apply a component's missing migrations, in order, in one transaction.

        Parameters
        ----------
        component : str
            Name of the package that owns the tables (``"fl"``).
        migrations : sequence of str
            Its append-only scripts; entry ``i`` takes it from version ``i`` to ``i + 1``.

        Returns
        -------
        int
            The component's version in this file (``len(migrations)``).

        Raises
        ------
        StoreError
            If the file holds a newer version of the component than ``migrations`` knows.
        """
        with self.transaction() as conn:
            row = conn.execute("SELECT version FROM component_schema WHERE component = ?", (component,)).fetchone()
            version = int(row[0]) if row else 0
            if version > len(migrations):
                raise StoreError(
                    f"{self.path} has {component} schema version {version}, newer than the {len(migrations)} "
                    "this fleetbench knows; upgrade fleetbench to read it"
                )
            for script in migrations[version:]:
                for statement in split_statements(script):
                    conn.execute(statement)
            conn.execute(
                "INSERT INTO component_schema (component, version) VALUES (?, ?) "
                "ON CONFLICT(component) DO UPDATE SET version = excluded.version",
                (component, len(migrations)),
            )
        return len(migrations)

    def _migrate(self) -> None:
        with self.transaction() as conn:
            tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
            if "schema_version" not in tables:
                if tables:
                    raise StoreError(
                        f"{self.path} is a SQLite file but not a fleetbench profile store (tables {sorted(tables)})"
                    )
                conn.execute("CREATE TABLE schema_version (version INTEGER NOT NULL)")
                conn.execute("INSERT INTO schema_version (version) VALUES (0)")
                version = 0
            else:
                rows = conn.execute("SELECT version FROM schema_version").fetchall()
                if len(rows) != 1:
                    raise StoreError(f"{self.path}: schema_version holds {len(rows)} rows, expected 1")
                version = int(rows[0][0])
            if version > SCHEMA_VERSION:
                raise StoreError(
                    f"{self.path} has profile store schema version {version}, newer than the "
                    f"{SCHEMA_VERSION} this fleetbench knows; upgrade fleetbench to read it"
                )
            for script in MIGRATIONS[version:]:
                for statement in split_statements(script):
                    conn.execute(statement)
            if version < SCHEMA_VERSION:
                conn.execute("UPDATE schema_version SET version = ?", (SCHEMA_VERSION,))

    # -- writing -----------------------------------------------------------------------------

    def start_campaign(
        self,
        fleet: str | os.PathLike[str] | None = None,
        model: str | None = None,
        *,
        versions: Mapping[str, str] | None = None,
        commit: str | None = None,
        started_at: float | None = None,
        plan: Mapping[str, Any] | None = None,
    ) -> int:
        """Record the start of a campaign and return its id.

        Parameters
        ----------
        fleet : path, optional
            The fleet file the campaign measures.
        model : str, optional
            Zoo model name.
        versions : mapping, optional
            Host tool versions; default `host_versions()`.
        commit : str, optional
            fleetbench git commit; default `git_commit()`.
        started_at : float, optional
            Unix time; default now.
        plan : mapping, optional
            The campaign's isolation plan (`harness.isolation.IsolationPlan.to_dict`).

        Returns
        -------
        int
            The campaign id to pass to `record`.
        """
        row = (
            time.time() if started_at is None else float(started_at),
            None if fleet is None else str(fleet),
            model,
            _dumps(dict(host_versions() if versions is None else versions)),
            git_commit() if commit is None else commit,
            _dumps(dict(plan or {})),
        )
        with self.transaction() as conn:
            cursor = conn.execute(
                "INSERT INTO campaigns (started_at, fleet, model, versions, git_commit, plan) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                row,
            )
            assert cursor.lastrowid is not None
            return int(cursor.lastrowid)

    def record(self, campaign_id: int, measurement: Measurement) -> int:
        """Store one attempt at a cell in its own transaction; durable when this returns.

        Parameters
        ----------
        campaign_id : int
            From `start_campaign`.
        measurement : Measurement
            The attempt, measured or failed.

        Returns
        -------
        int
            The row id of the stored attempt.

        Raises
        ------
        StoreError
            If ``campaign_id`` names no campaign.
        """
        spec = measurement.spec
        values = {
            "campaign_id": int(campaign_id),
            "cell_key": spec.cell_key(),
            "device": spec.device,
            "model": spec.model,
            "width": float(spec.width),
            "arch_sizes": json.dumps([int(w) for w in spec.arch_sizes]),
            "batch": int(spec.batch),
            "backend": spec.backend,
            "threads": int(spec.threads),
            "warmup": int(spec.warmup),
            "steps": int(spec.steps),
            "optimizer": spec.optimizer,
            "status": measurement.status,
            "message": measurement.message,
            "step_seconds": json.dumps([float(s) for s in measurement.step_seconds]),
            "peak_memory_bytes": None if measurement.peak_memory_bytes is None else int(measurement.peak_memory_bytes),
            "peak_memory_source": measurement.peak_memory_source,
            "throttled": int(bool(measurement.throttled)),
            "matmul_gflops": None if measurement.matmul_gflops is None else float(measurement.matmul_gflops),
            "runner": _dumps(dict(measurement.runner.raw)),
            "facts": _dumps(dict(measurement.facts)),
            "started_at": float(measurement.started_at),
            "finished_at": float(measurement.finished_at),
            "versions": _dumps(dict(measurement.versions)),
            "git_commit": measurement.git_commit,
            "precision": float(spec.precision),
            "max_seconds": float(spec.max_seconds),
            "precision_achieved": _float_or_none(measurement.precision_achieved),
            "imprecise": int(bool(measurement.imprecise)),
            "stop_reason": measurement.stop_reason,
            "isolation": _dumps(dict(measurement.isolation)),
            "data": spec.data,
            **_energy_values(measurement),
        }
        columns = ", ".join(values)
        marks = ", ".join(f":{name}" for name in values)
        try:
            with self.transaction() as conn:
                cursor = conn.execute(f"INSERT INTO cells ({columns}) VALUES ({marks})", values)
        except sqlite3.IntegrityError as exc:
            raise StoreError(f"cannot record {spec.cell_key()} in campaign {campaign_id}: {exc}") from None
        assert cursor.lastrowid is not None
        return int(cursor.lastrowid)

    # -- reading -----------------------------------------------------------------------------

    def measured_keys(self) -> set[str]:
        """Return the cell keys whose latest attempt is measured (status ``ok``).

        ``--resume`` skips these. A key whose latest attempt failed is not in the set,
        so it is measured again, even when an earlier attempt succeeded (the store
        and its exports always show the latest attempt).

        Returns
        -------
        set of str
            `BenchSpec.cell_key` values.
        """
        query = (
            "SELECT c.cell_key FROM cells c "
            "JOIN (SELECT cell_key, MAX(id) AS id FROM cells GROUP BY cell_key) latest ON latest.id = c.id "
            "WHERE c.status = 'ok'"
        )
        with self._locked() as conn:
            return {row[0] for row in conn.execute(query)}

    def _rows(self, *, campaign_id: int | None, latest: bool) -> list[sqlite3.Row]:
        where: list[str] = []
        params: list[Any] = []
        if latest:
            where.append("c.id IN (SELECT MAX(id) FROM cells GROUP BY cell_key)")
        if campaign_id is not None:
            where.append("c.campaign_id = ?")
            params.append(int(campaign_id))
        query = (
            "SELECT c.*, k.versions AS campaign_versions, k.git_commit AS campaign_git_commit "
            "FROM cells c JOIN campaigns k ON k.id = c.campaign_id"
            + (" WHERE " + " AND ".join(where) if where else "")
            + " ORDER BY c.id"
        )
        with self._locked() as conn:
            cursor = conn.execute(query, params)
            cursor.row_factory = sqlite3.Row
            return list(cursor.fetchall())

    @staticmethod
    def _measurement(row: sqlite3.Row) -> Measurement:
        spec = BenchSpec(
            device=row["device"],
            model=row["model"],
            width=float(row["width"]),
            arch_sizes=tuple(int(w) for w in json.loads(row["arch_sizes"])),
            batch=int(row["batch"]),
            backend=row["backend"],
            threads=int(row["threads"]),
            warmup=int(row["warmup"]),
            steps=int(row["steps"]),
            optimizer=row["optimizer"],
            # cells stored before v5 were fixed-count measurements
            precision=0.0 if row["precision"] is None else float(row["precision"]),
            max_seconds=DEFAULT_MAX_SECONDS if row["max_seconds"] is None else float(row["max_seconds"]),
            data=row["data"],
        )
        return Measurement(
            spec=spec,
            status=row["status"],
            message=row["message"],
            step_seconds=tuple(float(s) for s in json.loads(row["step_seconds"])),
            peak_memory_bytes=None if row["peak_memory_bytes"] is None else int(row["peak_memory_bytes"]),
            peak_memory_source=row["peak_memory_source"],
            throttled=bool(row["throttled"]),
            matmul_gflops=None if row["matmul_gflops"] is None else float(row["matmul_gflops"]),
            runner=parse_document(_loads_mapping(row["runner"])),
            facts=_loads_mapping(row["facts"]),
            started_at=float(row["started_at"]),
            finished_at=float(row["finished_at"]),
            versions=_loads_mapping(row["versions"]),
            git_commit=row["git_commit"],
            precision_achieved=_float_or_none(row["precision_achieved"]),
            imprecise=bool(row["imprecise"]),
            stop_reason=row["stop_reason"],
            isolation=_loads_mapping(row["isolation"]),
        )

    def measurements(self, campaign_id: int | None = None, *, latest: bool = False) -> list[Measurement]:
        """Return stored attempts rebuilt as `Measurement` records, oldest first.

        Parameters
        ----------
        campaign_id : int, optional
            Only this campaign's attempts.
        latest : bool
            Only the latest attempt of each cell key.

        Returns
        -------
        list of Measurement
        """
        return [self._measurement(row) for row in self._rows(campaign_id=campaign_id, latest=latest)]

    def latest_cells(self, campaign_id: int | None = None) -> pd.DataFrame:
        """Return one row per cell key (its latest attempt) with derived statistics.

        Parameters
        ----------
        campaign_id : int, optional
            Only cells whose latest attempt belongs to this campaign.

        Returns
        -------
        pandas.DataFrame
            Columns `harness.store_schema.CELL_COLUMNS`, typed by its `CELL_DTYPES`, in
            store order (built by `harness.cell_view`). Latency statistics are per image in
            microseconds, derived from the raw samples by `harness.stats.summarize`
            (NaN, and ``noisy`` / ``n`` missing, for a cell without samples);
            ``robust_cv_low`` is the lower end of the robust CV's 95 % interval (NaN below
            6 samples) and ``noisy`` says whether it exceeds 5 %.
            ``pass_mean_us`` is the mean of the cell's pass medians per image (each pass
            weighs the same; ``median_us`` for a cell of one pass), the level the latency
            model fits (`harness.latency.cell_latency_us`).
            ``cpu_median_us`` is the median CPU time per image of the samples that count
            (`harness.cell_view.cell_cpu_seconds`; NaN where the runner measured none).
            ``train_flops`` is per example from the runner document when it carries
            the manifest counts, else NaN. ``emulated_isa`` comes from the facts
            snapshot (`Measurement.emulated_isa`). ``arch_sizes`` is comma-separated,
            ``versions`` a JSON object; ``git_commit`` and ``versions`` fall back to
            the campaign's; ``export_format`` is the artifacts' export format from
            ``versions`` (``""`` where the cell did not record it). ``precision`` and
            ``max_seconds`` are the cell's target and
            cap (0 and the default for cells stored before adaptive sampling),
            ``precision_achieved`` the runner's (NaN where unknown), ``imprecise`` and
            ``stop_reason`` its verdict; ``alone``, ``concurrent_with`` (comma-separated)
            and ``isolation_reason`` state how the cell was isolated (NA / empty for
            cells stored before the isolation plan). ``energy_j_per_image``,
            ``energy_above_idle_j_per_image`` (above the device's idle draw over the same
            seconds) and ``energy_uncertainty_j_per_image`` are joules per training example
            (NaN where not measured or flagged); ``energy_sensor`` the sensor's kind,
            ``energy_emulated`` whether it was an emulated device's, ``energy_flag`` why a
            measured cell has no energy (``external-power``, ``sensor-slower-than-cell``,
            ``power: <reason>``); all null for a cell measured without energy.
            ``runtime_memory_bytes`` is the process's peak before the model was opened
            (numpy, the runtime, the data) and ``model_memory_bytes`` the cell's peak less
            it (`harness.cell_view.model_memory`); NA for cells whose runner did not read it.
        """
        rows = self._rows(campaign_id=campaign_id, latest=True)
        return cell_frame(
            view_record(
                self._measurement(row),
                cell_key=row["cell_key"],
                campaign_id=int(row["campaign_id"]),
                campaign_versions=_loads_mapping(row["campaign_versions"]),
                campaign_git_commit=row["campaign_git_commit"],
                energy={name: row[name] for name in ENERGY_COLUMNS},
            )
            for row in rows
        )

    def record_round_cost(
        self,
        campaign_id: int,
        cost: RoundCostModel | None = None,
        *,
        failed: Mapping[str, Any] | None = None,
    ) -> int:
        """Store one device's round-cost measurement (or its failure) in its own transaction.

        Parameters
        ----------
        campaign_id : int
            From `start_campaign`.
        cost : RoundCostModel, optional
            A successful measurement.
        failed : mapping, optional
            Instead, a failure: ``device, model, width, batch, backend, optimizer, threads,
            status, message`` (and ``measured_at``).

        Returns
        -------
        int
            The row id.

        Raises
        ------
        StoreError
            If ``campaign_id`` names no campaign, or neither or both of ``cost`` and ``failed`` are given.
        """
        if (cost is None) == (failed is None):
            raise StoreError("record_round_cost needs exactly one of a cost or a failure")
        if cost is not None:
            values: dict[str, Any] = {
                "device": cost.device, "model": cost.model, "width": float(cost.width), "batch": int(cost.batch),
                "backend": cost.backend, "optimizer": cost.optimizer, "threads": int(cost.threads), "status": "ok",
                "message": "", "fixed_s": cost.fixed_s, "step_s": cost.step_s,
                "down_s_per_byte": cost.down_s_per_byte, "down_latency_s": cost.down_latency_s,
                "up_s_per_byte": cost.up_s_per_byte, "up_latency_s": cost.up_latency_s,
                "samples": _dumps(dict(cost.samples)), "measured_at": float(cost.measured_at),
            }  # fmt: skip
        else:
            assert failed is not None
            keys = ("device", "model", "width", "batch", "backend", "optimizer", "threads", "status", "message")
            values = {k: failed[k] for k in keys}
            values["measured_at"] = float(failed.get("measured_at", time.time()))
        values["campaign_id"] = int(campaign_id)
        columns = ", ".join(values)
        marks = ", ".join(f":{name}" for name in values)
        with self._locked() as conn:
            known = conn.execute("SELECT 1 FROM campaigns WHERE id = ?", (int(campaign_id),)).fetchone()
        if known is None:
            raise StoreError(f"cannot record a round cost in campaign {campaign_id}: no such campaign")
        with self.transaction() as conn:
            cursor = conn.execute(f"INSERT INTO round_costs ({columns}) VALUES ({marks})", values)
        assert cursor.lastrowid is not None
        return int(cursor.lastrowid)

    def round_cost_rows(self, *, latest: bool = True) -> list[dict[str, Any]]:
        """Return stored round-cost rows (successful and failed), oldest first.

        Parameters
        ----------
        latest : bool
            Only the latest row per (device, model, batch, backend, optimizer, threads).

        Returns
        -------
        list of dict
            The ``round_costs`` columns; ``samples`` decoded.
        """
        where = (
            " WHERE id IN (SELECT MAX(id) FROM round_costs GROUP BY device, model, batch, backend, optimizer, threads)"
            if latest
            else ""
        )
        with self._locked() as conn:
            cursor = conn.execute(f"SELECT * FROM round_costs{where} ORDER BY id")
            cursor.row_factory = sqlite3.Row
            rows = [dict(row) for row in cursor.fetchall()]
        for row in rows:
            row["samples"] = _loads_mapping(row["samples"])
        return rows

    def round_costs(self, *, latest: bool = True) -> list[RoundCostModel]:
        """Return the successful round-cost measurements (`round_cost_rows` with status ``ok``).

        Parameters
        ----------
        latest : bool
            Only the latest row per configuration; a configuration whose latest attempt
            failed has none.

        Returns
        -------
        list of RoundCostModel
        """
        fields = (
            "fixed_s", "step_s", "down_s_per_byte", "down_latency_s", "up_s_per_byte", "up_latency_s", "measured_at",
        )  # fmt: skip
        return [
            RoundCostModel(
                device=row["device"],
                model=row["model"],
                width=float(row["width"]),
                batch=int(row["batch"]),
                backend=row["backend"],
                optimizer=row["optimizer"],
                threads=int(row["threads"]),
                campaign_id=int(row["campaign_id"]),
                samples=row["samples"],
                **{name: float(row[name]) for name in fields},
            )
            for row in self.round_cost_rows(latest=latest)
            if row["status"] == "ok"
        ]

    def record_model(self, record: ModelRecord) -> None:
        """Record a user's model once (a name is a definition: a second record is ignored).

        Parameters
        ----------
        record : ModelRecord
        """
        row = (record.name, record.source, record.digest, _dumps([list(g) for g in record.groups]),
               _dumps(list(record.notes)), time.time())  # fmt: skip
        with self.transaction() as conn:
            conn.execute(
                "INSERT OR IGNORE INTO models (name, source, digest, groups, notes, recorded_at) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                row,
            )

    def models(self) -> list[ModelRecord]:
        """Return the users' models recorded in this store, by name.

        Returns
        -------
        list of ModelRecord
        """
        with self._locked() as conn:
            rows = conn.execute("SELECT name, source, digest, groups, notes FROM models ORDER BY name").fetchall()
        return [
            ModelRecord(
                name, source, digest, tuple((g, int(k)) for g, k in json.loads(groups)), tuple(json.loads(notes))
            )
            for name, source, digest, groups, notes in rows
        ]

    def campaigns(self) -> pd.DataFrame:
        """Return the campaigns, one row each.

        Returns
        -------
        pandas.DataFrame
            Columns ``id, started_at, fleet, model, versions`` (JSON) ``, git_commit, plan``
            (the isolation plan, JSON) ``, cells`` (number of attempts recorded).
        """
        import pandas as pd

        query = (
            "SELECT k.id, k.started_at, k.fleet, k.model, k.versions, k.git_commit, k.plan, COUNT(c.id) AS cells "
            "FROM campaigns k LEFT JOIN cells c ON c.campaign_id = k.id GROUP BY k.id ORDER BY k.id"
        )
        with self._locked() as conn:
            rows = conn.execute(query).fetchall()
        columns = ["id", "started_at", "fleet", "model", "versions", "git_commit", "plan", "cells"]
        return pd.DataFrame.from_records(rows, columns=columns)
