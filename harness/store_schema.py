"""The profile store's schema: its migrations, and the columns of its cell view.

`harness.store.ProfileStore` applies `MIGRATIONS` in order when it opens a file (see its
module docstring). Append-only: a released migration is never edited; a change is a new one.
"""

from __future__ import annotations

import sqlite3

#: Ordered schema migrations: entry ``i`` takes a file from version ``i`` to ``i + 1``.
#: Append-only; each script is a sequence of ``;``-terminated statements.
MIGRATIONS: tuple[str, ...] = (
    # v1: campaigns and cells.
    """
    CREATE TABLE campaigns (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        started_at REAL NOT NULL,
        fleet TEXT,
        model TEXT,
        versions TEXT NOT NULL DEFAULT '{}',
        git_commit TEXT
    );
    CREATE TABLE cells (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        campaign_id INTEGER NOT NULL REFERENCES campaigns(id),
        cell_key TEXT NOT NULL,
        device TEXT NOT NULL,
        model TEXT NOT NULL,
        width REAL NOT NULL,
        arch_widths TEXT NOT NULL,
        batch INTEGER NOT NULL,
        backend TEXT NOT NULL,
        threads INTEGER NOT NULL,
        warmup INTEGER NOT NULL,
        steps INTEGER NOT NULL,
        optimizer TEXT NOT NULL,
        status TEXT NOT NULL,
        message TEXT NOT NULL DEFAULT '',
        step_seconds TEXT NOT NULL DEFAULT '[]',
        peak_memory_bytes INTEGER,
        throttled INTEGER NOT NULL DEFAULT 0,
        runner TEXT NOT NULL DEFAULT '{}',
        facts TEXT NOT NULL DEFAULT '{}',
        started_at REAL NOT NULL DEFAULT 0,
        finished_at REAL NOT NULL DEFAULT 0,
        versions TEXT NOT NULL DEFAULT '{}',
        git_commit TEXT
    );
    CREATE INDEX cells_by_key ON cells (cell_key, id);
    """,
    # v2: memory source and the matmul probe (roofline); status lookups for --resume.
    """
    ALTER TABLE cells ADD COLUMN peak_memory_source TEXT;
    ALTER TABLE cells ADD COLUMN matmul_gflops REAL;
    CREATE INDEX cells_by_campaign ON cells (campaign_id, id);
    """,
    # v3: held the FL tables until they moved to their own package (`fl.runlog.FL_MIGRATIONS`,
    # component "fl", written with CREATE TABLE IF NOT EXISTS so files made at this version
    # keep theirs). Nothing to do here any more.
    "",
    # v4: schema versions of the components that keep their tables in this file.
    """
    CREATE TABLE component_schema (
        component TEXT PRIMARY KEY,
        version INTEGER NOT NULL
    );
    """,
    # v5: adaptive sampling (target and cap of the cell, precision achieved, why sampling
    # stopped, the imprecise flag) and isolation (per cell: measured alone or beside which
    # devices, and why; per campaign: the plan). Cells stored before carry NULL / '{}'.
    """
    ALTER TABLE cells ADD COLUMN precision REAL;
    ALTER TABLE cells ADD COLUMN max_seconds REAL;
    ALTER TABLE cells ADD COLUMN precision_achieved REAL;
    ALTER TABLE cells ADD COLUMN imprecise INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE cells ADD COLUMN stop_reason TEXT;
    ALTER TABLE cells ADD COLUMN isolation TEXT NOT NULL DEFAULT '{}';
    ALTER TABLE campaigns ADD COLUMN plan TEXT NOT NULL DEFAULT '{}';
    """,
    # v6: round costs per device (`harness.roundcost`): the fixed cost of a round and the
    # transfer lines each way, with the configuration they were measured in and the raw points.
    # A failed measurement keeps its status and message, its numbers NULL.
    """
    CREATE TABLE round_costs (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        campaign_id INTEGER NOT NULL REFERENCES campaigns(id),
        device TEXT NOT NULL,
        model TEXT NOT NULL,
        width REAL NOT NULL,
        batch INTEGER NOT NULL,
        backend TEXT NOT NULL,
        optimizer TEXT NOT NULL,
        threads INTEGER NOT NULL,
        status TEXT NOT NULL,
        message TEXT NOT NULL DEFAULT '',
        fixed_s REAL,
        step_s REAL,
        down_s_per_byte REAL,
        down_latency_s REAL,
        up_s_per_byte REAL,
        up_latency_s REAL,
        samples TEXT NOT NULL DEFAULT '{}',
        measured_at REAL NOT NULL
    );
    CREATE INDEX round_costs_by_device ON round_costs (device, model, id);
    """,
    # v7: the bench data a cell's steps trained on (`BenchSpec.data`; NULL: a random batch).
    """
    ALTER TABLE cells ADD COLUMN data TEXT;
    """,
    # v8: users' own models: the source and definition hash behind each ``factory@digest`` name.
    """
    CREATE TABLE models (
        name TEXT PRIMARY KEY,
        source TEXT NOT NULL,
        digest TEXT NOT NULL,
        groups TEXT NOT NULL DEFAULT '[]',
        notes TEXT NOT NULL DEFAULT '[]',
        recorded_at REAL NOT NULL
    );
    """,
    # v9: one name per idea: a cell's kept neurons per group are its architecture's sizes.
    """
    ALTER TABLE cells RENAME COLUMN arch_widths TO arch_sizes;
    """,
    # v10: a cell's energy per image (`harness.energy.EnergyReading`): joules, above the idle
    # draw, their uncertainty, the sensor's kind, whether it was emulated, and its flag. A
    # flagged cell keeps only energy_sensor, energy_emulated and energy_flag; a cell measured
    # without energy, and every cell stored before, NULL throughout.
    """
    ALTER TABLE cells ADD COLUMN energy_j_per_image REAL;
    ALTER TABLE cells ADD COLUMN energy_above_idle_j_per_image REAL;
    ALTER TABLE cells ADD COLUMN energy_uncertainty_j_per_image REAL;
    ALTER TABLE cells ADD COLUMN energy_sensor TEXT;
    ALTER TABLE cells ADD COLUMN energy_flag TEXT;
    ALTER TABLE cells ADD COLUMN energy_emulated INTEGER;
    """,
)

#: The schema version this code writes.
SCHEMA_VERSION = len(MIGRATIONS)

#: The energy columns of a cell row (schema v10), stored and viewed as they are.
ENERGY_COLUMNS: tuple[str, ...] = (
    "energy_j_per_image",
    "energy_above_idle_j_per_image",
    "energy_uncertainty_j_per_image",
    "energy_sensor",
    "energy_flag",
    "energy_emulated",
)

#: Columns of `ProfileStore.latest_cells` and of ``fleetbench profiles export``, in order.
CELL_COLUMNS: tuple[str, ...] = (
    "device",
    "model",
    "width",
    "batch",
    "backend",
    "status",
    "median_us",
    "pass_mean_us",
    "cpu_median_us",
    "p95_us",
    "p5_us",
    "iqr_us",
    "mean_us",
    "stdev_us",
    "cv",
    "noisy",
    "robust_cv",
    "robust_cv_low",
    "n",
    "precision",
    "precision_achieved",
    "imprecise",
    "stop_reason",
    "max_seconds",
    "alone",
    "concurrent_with",
    "isolation_reason",
    "peak_memory_bytes",
    "peak_memory_source",
    "runtime_memory_bytes",
    "model_memory_bytes",
    "throttled",
    "matmul_gflops",
    "train_flops",
    *ENERGY_COLUMNS,
    "message",
    "arch_sizes",
    "threads",
    "warmup",
    "steps",
    "optimizer",
    "data",
    "cell_key",
    "campaign_id",
    "started_at",
    "finished_at",
    "git_commit",
    "versions",
    "export_format",
    "emulated_isa",
)


#: The latency statistics per image (microseconds, or a ratio) that `harness.stats.summarize`
#: derives from a cell's samples; NaN for a cell without samples.
STAT_COLUMNS: tuple[str, ...] = (
    "median_us", "p95_us", "p5_us", "iqr_us", "mean_us", "stdev_us", "cv", "robust_cv", "robust_cv_low",
)  # fmt: skip

#: The pandas dtype of each typed column of `CELL_COLUMNS` (the others are ``object``: text,
#: or ``None`` where unknown). Nullable dtypes (``Int64``, ``boolean``) mark the columns that
#: cells stored by older schemas or measured without the feature leave empty.
CELL_DTYPES: dict[str, str] = {
    "width": "float64",
    "batch": "int64",
    "threads": "int64",
    "warmup": "int64",
    "steps": "int64",
    "campaign_id": "int64",
    "n": "Int64",
    "noisy": "boolean",
    "throttled": "bool",
    "emulated_isa": "bool",
    "imprecise": "bool",
    "alone": "boolean",
    "precision": "float64",
    "max_seconds": "float64",
    "precision_achieved": "float64",
    "peak_memory_bytes": "Int64",
    "runtime_memory_bytes": "Int64",
    "model_memory_bytes": "Int64",
    "matmul_gflops": "float64",
    "train_flops": "float64",
    "started_at": "float64",
    "finished_at": "float64",
    "pass_mean_us": "float64",
    "cpu_median_us": "float64",
    "energy_j_per_image": "float64",
    "energy_above_idle_j_per_image": "float64",
    "energy_uncertainty_j_per_image": "float64",
    "energy_emulated": "boolean",
    **{name: "float64" for name in STAT_COLUMNS},
}


def split_statements(script: str) -> list[str]:
    """Split an SQL script into complete statements.

    Parameters
    ----------
    script : str
        Statements each terminated by ``;`` (triggers included: completeness is
        judged by `sqlite3.complete_statement`).

    Returns
    -------
    list of str
        The statements in order, stripped.

    Raises
    ------
    ValueError
        If the script ends with an incomplete statement.
    """
    statements: list[str] = []
    pending = ""
    for line in script.splitlines(keepends=True):
        pending += line
        if sqlite3.complete_statement(pending):
            statements.append(pending.strip())
            pending = ""
    if pending.strip():
        raise ValueError(f"incomplete SQL statement: {pending.strip()[:80]!r}")
    return statements
