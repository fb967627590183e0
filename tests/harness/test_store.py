"""The profile store: round trips, resume semantics, crash safety, migrations, export."""

from __future__ import annotations

import io
import json
import math
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from exporters.userinput import InputError
from fleetbench.cli import main
from harness.document import parse_document
from harness.provenance import git_commit, host_versions
from harness.records import BenchSpec, Measurement
from harness.roundcost import RoundCostModel
from harness.store import ProfileStore
from harness.store_errors import StoreError, StoreUnavailable
from harness.store_schema import CELL_COLUMNS, MIGRATIONS, SCHEMA_VERSION, split_statements
from tests.conftest import SmallFileSystems
from tests.harness.campaigns import local_fleet_file

REPO = Path(__file__).resolve().parents[2]

# The v1 schema exactly as first released; frozen here so that editing MIGRATIONS[0] is caught.
V1_SCHEMA = """
CREATE TABLE schema_version (version INTEGER NOT NULL);
INSERT INTO schema_version (version) VALUES (1);
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
"""


def spec(device: str = "pi4", width: float = 0.5, batch: int = 20, backend: str = "ort") -> BenchSpec:
    return BenchSpec(
        device=device,
        model="cnn",
        width=width,
        arch_sizes=(int(16 * width), int(32 * width)),
        batch=batch,
        backend=backend,  # type: ignore[arg-type]
        threads=2,
        warmup=3,
        steps=5,
    )


def measurement(
    s: BenchSpec, steps: tuple[float, ...] = (0.011, 0.012, 0.010, 0.013, 0.050), **kw: object
) -> Measurement:
    fields: dict[str, object] = {
        "status": "ok",
        "step_seconds": steps,
        "peak_memory_bytes": 123_456_789,
        "peak_memory_source": "VmHWM",
        "throttled": False,
        "matmul_gflops": 12.5,
        "runner": {"mode": "bench", "freq_khz": [1500000, 1400000], "counts": {"train_flops": 4_000_000}},
        "facts": {"cpu": "Cortex-A72", "cores": 4},
        "started_at": 1_700_000_000.25,
        "finished_at": 1_700_000_003.5,
        "versions": {"fleetbench": "0.1.0", "onnxruntime": "1.19.2"},
        "git_commit": "a" * 40,
    }
    fields.update(kw)
    fields["runner"] = parse_document(fields["runner"])  # type: ignore[arg-type]
    return Measurement(spec=s, **fields)  # type: ignore[arg-type]


def failed(s: BenchSpec, status: str = "timeout") -> Measurement:
    return Measurement(spec=s, status=status, message=f"{status} after 300 s", started_at=1.0, finished_at=2.0)


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "fleetbench.db"


def test_record_and_reopen_round_trips_every_field(db: Path) -> None:
    ok = measurement(spec(), throttled=True, step_seconds=(0.1 + 1e-12, 1 / 3, 2.5e-7))
    bare = Measurement(spec=spec("phone", 1.0, 8, "torch"), status="out of memory", message="killed at step 2")
    with ProfileStore(db) as store:
        cid = store.start_campaign("fleet.yaml", "cnn", versions={"torch": "2.13.0"}, commit="b" * 40)
        store.record(cid, ok)
        store.record(cid, bare)
    with ProfileStore(db) as store:
        assert store.schema_version == SCHEMA_VERSION
        assert store.measurements() == [ok, bare]
        assert store.measurements(cid, latest=True) == [ok, bare]
        campaigns = store.campaigns()
    assert campaigns.loc[0, "fleet"] == "fleet.yaml"
    assert json.loads(campaigns.loc[0, "versions"]) == {"torch": "2.13.0"}
    assert campaigns.loc[0, "git_commit"] == "b" * 40
    assert campaigns.loc[0, "cells"] == 2


def test_wal_mode_and_one_row_per_attempt(db: Path) -> None:
    with ProfileStore(db) as store:
        cid = store.start_campaign()
        store.record(cid, failed(spec()))
        store.record(cid, measurement(spec()))
    con = sqlite3.connect(db)
    assert con.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert con.execute("SELECT COUNT(*) FROM cells").fetchone()[0] == 2
    con.close()


def test_record_into_unknown_campaign_is_refused(db: Path) -> None:
    with ProfileStore(db) as store, pytest.raises(StoreError, match="campaign 99"):
        store.record(99, measurement(spec()))


def test_measured_keys_are_latest_ok_attempts(db: Path) -> None:
    a, b, c = spec("pi4"), spec("pi3"), spec("jetson")
    with ProfileStore(db) as store:
        cid = store.start_campaign()
        assert store.measured_keys() == set()
        store.record(cid, measurement(a))
        store.record(cid, failed(b, "unreachable"))
        store.record(cid, measurement(c))
        assert store.measured_keys() == {a.cell_key(), c.cell_key()}
        # resume: the failed cell is measured again, then counts as measured
        cid2 = store.start_campaign()
        store.record(cid2, measurement(b))
        assert store.measured_keys() == {a.cell_key(), b.cell_key(), c.cell_key()}
        # a later failed attempt is what the store shows, so resume measures it again
        store.record(cid2, failed(c, "connection lost"))
        assert store.measured_keys() == {a.cell_key(), b.cell_key()}
        table = store.latest_cells()
    assert len(table) == 3
    assert dict(zip(table["device"], table["status"], strict=True)) == {
        "pi4": "ok",
        "pi3": "ok",
        "jetson": "connection lost",
    }


def test_latest_cells_columns_and_values(db: Path) -> None:
    steps = (0.004, 0.008, 0.012, 0.016, 0.4)
    with ProfileStore(db) as store:
        cid = store.start_campaign(commit="c" * 40, versions={"numpy": "2"})
        store.record(cid, measurement(spec(batch=4), steps=steps))
        store.record(cid, failed(spec("pi3", batch=4), "out of memory"))
        store.record(cid, measurement(spec("pi0", batch=4), runner={}, git_commit=None, versions={}))
        store.record(cid, measurement(spec("pi5", batch=4), versions={"export_format": "7"}))
        table = store.latest_cells()
    assert list(table.columns) == list(CELL_COLUMNS)
    ok, bad, bare, recorded = (table.iloc[i] for i in range(4))
    assert recorded["export_format"] == "7" and bare["export_format"] == ""
    assert ok["median_us"] == pytest.approx(3000.0)  # 0.012 s / 4 images
    assert ok["p95_us"] == pytest.approx((0.016 + 0.8 * (0.4 - 0.016)) / 4 * 1e6)
    assert ok["iqr_us"] == pytest.approx((0.016 - 0.008) / 4 * 1e6)
    assert bool(ok["noisy"]) is False and math.isnan(ok["robust_cv_low"])  # five samples: no interval, no flag
    assert ok["robust_cv"] > 0.05 and ok["n"] == 5
    assert ok["peak_memory_bytes"] == 123_456_789
    assert ok["train_flops"] == 4_000_000
    assert ok["matmul_gflops"] == 12.5
    assert ok["arch_sizes"] == "8,16"
    assert ok["git_commit"] == "a" * 40
    assert bad["status"] == "out of memory" and bad["message"] == "out of memory after 300 s"
    assert math.isnan(bad["median_us"]) and pd.isna(bad["noisy"]) and pd.isna(bad["peak_memory_bytes"])
    assert math.isnan(bad["train_flops"]) and math.isnan(bad["matmul_gflops"])
    # provenance falls back to the campaign's
    assert bare["git_commit"] == "c" * 40
    assert json.loads(bare["versions"]) == {"numpy": "2"}
    assert math.isnan(bare["train_flops"])


def test_cpu_median_us_is_the_median_cpu_time_per_image_of_the_samples_that_count(db: Path) -> None:
    wall = [0.020, 0.021, 0.022, 0.030]
    judged = {"step_seconds": wall, "cpu_step_seconds": [0.008, 0.016, 0.010, 0.012], "disturbed": [0, 1, 0, 0]}
    unjudged = {"step_seconds": wall, "cpu_step_seconds": [0.008, 0.016, 0.010, 0.012]}  # no flags: all count
    with ProfileStore(db) as store:
        cid = store.start_campaign()
        store.record(cid, measurement(spec("a", batch=4), steps=(0.020, 0.022, 0.030), runner=judged))
        store.record(cid, measurement(spec("b", batch=4), runner=unjudged))
        store.record(cid, measurement(spec("c", batch=4), runner={"step_seconds": wall}))  # no CPU times
        store.record(cid, measurement(spec("d", batch=4), runner={**judged, "cpu_step_seconds": [0.01]}))
        store.record(cid, failed(spec("e", batch=4)))
        table = store.latest_cells().set_index("device")
    assert table.loc["a", "cpu_median_us"] == pytest.approx(0.010 / 4 * 1e6)  # 0.016 was flagged
    assert table.loc["b", "cpu_median_us"] == pytest.approx(0.011 / 4 * 1e6)  # (0.010 + 0.012) / 2
    for device in ("c", "d", "e"):  # none, not one per sample, or not measured
        assert math.isnan(table.loc[device, "cpu_median_us"]), device


def test_pass_mean_us_weighs_each_pass_the_same_and_falls_back_to_the_median(db: Path) -> None:
    # pass 1 took three samples at 0.010, pass 2 one at 0.014: the pooled median sits on pass 1
    steps = (0.010, 0.010, 0.010, 0.014)
    two = {"step_seconds": list(steps), "passes": 2, "pass_medians": [0.010, 0.014]}
    slowed = {**two, "passes": 3, "pass_medians": [0.010, 0.014, None]}  # a pass without a median
    with ProfileStore(db) as store:
        cid = store.start_campaign()
        store.record(cid, measurement(spec("a", batch=4), steps=steps, runner=two))
        store.record(cid, measurement(spec("b", batch=4), steps=steps, runner=slowed))
        store.record(cid, measurement(spec("c", batch=4), steps=steps, runner={"step_seconds": list(steps)}))
        store.record(cid, failed(spec("d", batch=4)))
        table = store.latest_cells().set_index("device")
    assert table.loc["a", "median_us"] == pytest.approx(0.010 / 4 * 1e6)
    assert table.loc["a", "pass_mean_us"] == pytest.approx(0.012 / 4 * 1e6)
    assert table.loc["b", "pass_mean_us"] == pytest.approx(0.012 / 4 * 1e6)
    assert table.loc["c", "pass_mean_us"] == table.loc["c", "median_us"]  # one pass
    assert math.isnan(table.loc["d", "pass_mean_us"])


def test_emulated_isa_travels_from_the_facts_snapshot_to_the_cells(db: Path) -> None:
    qemu = {"arch": "aarch64", "cores": 2, "emulated_isa": True}
    with ProfileStore(db) as store:
        cid = store.start_campaign()
        store.record(cid, measurement(spec("pi"), facts=qemu))
        store.record(cid, measurement(spec("pi4")))  # a snapshot without the key: a real device
        store.record(cid, measurement(spec("board"), facts={**qemu, "emulated_isa": False}))
    with ProfileStore(db) as store:
        table = store.latest_cells().set_index("device")
        rebuilt = {m.spec.device: m for m in store.measurements()}
    assert table["emulated_isa"].dtype == bool
    assert table["emulated_isa"].to_dict() == {"pi": True, "pi4": False, "board": False}
    assert rebuilt["pi"].emulated_isa and rebuilt["pi"].facts == qemu
    assert not rebuilt["pi4"].emulated_isa and not rebuilt["board"].emulated_isa


def test_energy_columns_round_trip_and_stay_null_where_flagged(db: Path) -> None:
    measured = {"sensor": "rapl", "rails": ["package-0"], "emulated": True, "joules": 2.0, "idle_joules": 0.5,
                "uncertainty_j": 0.04, "seconds": 1.0, "images": 40, "external_power": False, "flag": None}  # fmt: skip
    missing = "power: /sys/class/power_supply/battery/current_now: missing"
    flagged = {**measured, "joules": None, "idle_joules": None, "uncertainty_j": None, "emulated": False,
               "sensor": "power-supply", "flag": missing}  # fmt: skip
    with ProfileStore(db) as store:
        cid = store.start_campaign()
        store.record(cid, measurement(spec("fast"), runner={"mode": "bench", "energy": measured}))
        store.record(cid, measurement(spec("phone"), runner={"mode": "bench", "energy": flagged}))
        store.record(cid, measurement(spec("plain")))
        with store.transaction() as conn:
            stored = conn.execute(
                "SELECT device, energy_j_per_image, energy_above_idle_j_per_image, energy_uncertainty_j_per_image, "
                "energy_sensor, energy_flag, energy_emulated FROM cells ORDER BY id"
            ).fetchall()
    assert stored == [
        ("fast", 0.05, 0.0375, 0.001, "rapl", None, 1),
        ("phone", None, None, None, "power-supply", flagged["flag"], 0),
        ("plain", None, None, None, None, None, None),
    ]
    with ProfileStore(db) as store:
        table = store.latest_cells().set_index("device")
        [fast, phone, plain] = store.measurements()
    assert table.loc["fast", "energy_j_per_image"] == pytest.approx(0.05)
    assert table.loc["fast", "energy_above_idle_j_per_image"] == pytest.approx(0.0375)
    assert table.loc["fast", "energy_uncertainty_j_per_image"] == pytest.approx(0.001)
    assert (table.loc["fast", "energy_sensor"], bool(table.loc["fast", "energy_emulated"])) == ("rapl", True)
    assert math.isnan(table.loc["phone", "energy_j_per_image"]) and table.loc["phone", "energy_flag"] == flagged["flag"]
    assert math.isnan(table.loc["plain", "energy_j_per_image"]) and pd.isna(table.loc["plain", "energy_emulated"])
    assert fast.runner.energy is not None and fast.runner.energy.joules_per_image == pytest.approx(0.05)
    assert plain.runner.energy is None


def test_empty_store_has_the_columns(db: Path) -> None:
    with ProfileStore(db) as store:
        table = store.latest_cells()
    assert list(table.columns) == list(CELL_COLUMNS)
    assert len(table) == 0


def test_threads_share_one_store(db: Path) -> None:
    with ProfileStore(db) as store:
        cid = store.start_campaign()

        def work(device: str) -> None:
            for w in range(1, 11):
                store.record(cid, measurement(spec(device, w / 10)))

        threads = [threading.Thread(target=work, args=(f"d{i}",)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(store.measured_keys()) == 40


KILLED_WRITER = textwrap.dedent(
    """
    import sys
    from harness.document import parse_document
    from harness.records import BenchSpec, Measurement
    from harness.store import ProfileStore

    store = ProfileStore(sys.argv[1])
    cid = store.start_campaign(commit=None)
    for i in range(100000):
        spec = BenchSpec("dev", "cnn", 1.0, (i, 1), 20, "ort", 2, 1, 200, "adamw")
        steps = tuple(0.001 * (1 + (i + k) % 7) for k in range(200))
        runner = parse_document({"pad": "x" * 20000})
        store.record(cid, Measurement(spec=spec, status="ok", step_seconds=steps, runner=runner))
        print(i, flush=True)
    """
)


def test_killed_process_loses_no_committed_cell(db: Path) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", KILLED_WRITER, str(db)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert proc.stdout is not None
    committed = -1
    try:
        for line in proc.stdout:
            committed = int(line)
            if committed >= 60:
                break
    finally:
        os.kill(proc.pid, signal.SIGKILL)  # mid-write: the writer never pauses between cells
        proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    assert committed >= 60
    con = sqlite3.connect(db)
    assert con.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    con.close()
    with ProfileStore(db) as store:
        stored = store.measurements()
        keys = store.measured_keys()
    indices = sorted(m.spec.arch_sizes[0] for m in stored)
    assert indices == list(range(len(indices)))  # no gap, no partial cell
    assert len(indices) >= committed + 1  # every cell reported committed is there
    assert all(len(m.step_seconds) == 200 for m in stored)
    assert len(keys) == len(indices)


def test_a_full_disk_is_one_line_naming_the_store_and_loses_nothing(
    small_fs: SmallFileSystems, capsys: pytest.CaptureFixture[str]
) -> None:
    db = small_fs.mount("store", "2m") / "fleetbench.db"
    store = ProfileStore(db)
    cid = store.start_campaign(fleet="f", model="cnn")
    store.record(cid, measurement(spec("pi4")))
    filler = small_fs.fill(db.parent)
    big = Measurement(spec=spec("pi3"), status="runner error", message="x" * 200_000, started_at=1.0, finished_at=2.0)
    with pytest.raises(StoreUnavailable) as caught:
        store.record(cid, big)
    message = str(caught.value)
    assert "\n" not in message and str(db) in message and "file system is full" in message and "bytes free" in message
    assert store.measured_keys() == {spec("pi4").cell_key()}  # the stored cell is there, the failed write is not

    filler.unlink()  # space freed: the same store writes again (no transaction was left open)
    store.record(cid, big)
    store.close()
    with ProfileStore(db) as reopened:
        assert reopened._conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        assert len(reopened.measurements()) == 2

    # a store that cannot even be created: one line, exit status 1, naming the file
    small_fs.fill(db.parent)
    fresh = db.parent / "fresh.db"
    fleet = local_fleet_file(small_fs.root)
    argv = ["profile", "--fleet", str(fleet), "--model", "fjord-cnn", "--widths", "1", "--backend", "ort"]
    assert main([*argv, "--db", str(fresh), "--artifacts", str(small_fs.root / "artifacts")]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and str(fresh) in err and "file system is full" in err, err


def make_v1(db: Path) -> None:
    con = sqlite3.connect(db)
    con.executescript(V1_SCHEMA)
    con.execute(
        "INSERT INTO campaigns (started_at, fleet, model, versions, git_commit) VALUES (5.0, 'f', 'cnn', '{}', NULL)"
    )
    con.execute(
        "INSERT INTO cells (campaign_id, cell_key, device, model, width, arch_widths, batch, backend, threads, warmup,"
        " steps, optimizer, status, step_seconds, peak_memory_bytes) VALUES (1, ?, 'pi4', 'cnn', 0.5, '[8, 16]', 20,"
        " 'ort', 2, 3, 5, 'adamw', 'ok', '[0.02, 0.04, 0.06]', 1000)",
        (spec().cell_key(),),
    )
    con.commit()
    con.close()


def test_migrates_a_v1_file_to_the_current_version(db: Path) -> None:
    assert SCHEMA_VERSION >= 2
    make_v1(db)
    with ProfileStore(db) as store:
        assert store.schema_version == SCHEMA_VERSION
        [old] = store.measurements()
        # a cell stored before adaptive sampling was a fixed count of steps: precision 0
        assert old.spec == replace(spec(), precision=0.0)
        assert old.step_seconds == (0.02, 0.04, 0.06)
        assert old.peak_memory_source is None and old.matmul_gflops is None
        assert (old.precision_achieved, old.imprecise, old.stop_reason, dict(old.isolation)) == (None, False, None, {})
        assert store.measured_keys() == {spec().cell_key()}
        assert store.latest_cells().loc[0, "median_us"] == pytest.approx(0.04 / 20 * 1e6)
        assert math.isnan(store.latest_cells().loc[0, "energy_j_per_image"])  # stored before energy: NULL
        store.record(1, measurement(spec("pi3")))
    with ProfileStore(db) as store:  # reopening applies nothing twice
        assert store.schema_version == SCHEMA_VERSION
        assert len(store.measurements()) == 2


def test_a_failing_migration_leaves_the_file_at_its_old_version(db: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import harness.store as store_module

    make_v1(db)
    broken = (*MIGRATIONS, "CREATE TABLE fl_runs (id INTEGER PRIMARY KEY);\nTHIS IS NOT SQL;\n")
    monkeypatch.setattr(store_module, "MIGRATIONS", broken)
    monkeypatch.setattr(store_module, "SCHEMA_VERSION", len(broken))
    with pytest.raises(StoreError):
        ProfileStore(db)
    con = sqlite3.connect(db)
    assert con.execute("SELECT version FROM schema_version").fetchone()[0] == 1
    columns = {row[1] for row in con.execute("PRAGMA table_info(cells)")}
    assert "matmul_gflops" not in columns  # v2 was rolled back with the rest
    assert con.execute("SELECT COUNT(*) FROM sqlite_master WHERE name = 'fl_runs'").fetchone()[0] == 0
    con.close()


def test_a_newer_file_is_refused_clearly(db: Path) -> None:
    with ProfileStore(db):
        pass
    con = sqlite3.connect(db)
    con.execute("UPDATE schema_version SET version = ?", (SCHEMA_VERSION + 5,))
    con.commit()
    con.close()
    with pytest.raises(StoreError, match=rf"schema version {SCHEMA_VERSION + 5}.*upgrade fleetbench"):
        ProfileStore(db)
    assert isinstance(StoreError("x"), InputError)


def test_foreign_files_are_refused(tmp_path: Path) -> None:
    other = tmp_path / "other.db"
    con = sqlite3.connect(other)
    con.execute("CREATE TABLE things (x)")
    con.commit()
    con.close()
    with pytest.raises(StoreError, match="not a fleetbench profile store"):
        ProfileStore(other)
    junk = tmp_path / "junk.db"
    junk.write_bytes(b"this is not sqlite at all" * 100)
    with pytest.raises(StoreError, match="not a usable profile store"):
        ProfileStore(junk)


def test_split_statements() -> None:
    script = "CREATE TABLE a (x);\nCREATE TRIGGER t AFTER INSERT ON a BEGIN\n  DELETE FROM a;\nEND;\n"
    assert split_statements(script) == [
        "CREATE TABLE a (x);",
        "CREATE TRIGGER t AFTER INSERT ON a BEGIN\n  DELETE FROM a;\nEND;",
    ]
    with pytest.raises(ValueError):
        split_statements("CREATE TABLE a (x)")
    # every entry holds statements, but v3, whose FL tables moved to fl.runlog.FL_MIGRATIONS
    assert [i for i, script in enumerate(MIGRATIONS) if not split_statements(script)] == [2]


def test_provenance_helpers() -> None:
    versions = host_versions()
    assert versions["python"].count(".") == 2
    assert {"numpy", "torch"} <= set(versions)
    # reading metadata never imports the heavy modules
    probe = "import sys; from harness.provenance import host_versions; host_versions(); "
    probe += "print(sorted(m for m in ('torch', 'onnx', 'onnxruntime') if m in sys.modules))"
    result = subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"
    commit = git_commit()
    if (REPO / ".git").exists():
        assert commit is not None and len(commit) == 40
    assert git_commit(REPO / "harness") is None  # not a checkout root


# -- export through the CLI ------------------------------------------------------------------


def fill_for_export(db: Path) -> dict[str, tuple[float, ...]]:
    samples = {
        "pi4": (0.010, 0.011, 0.012, 0.013, 0.020),
        "pi3": (0.030, 0.030, 0.031, 0.032),
    }
    with ProfileStore(db) as store:
        cid = store.start_campaign()
        store.record(cid, failed(spec("pi4", batch=10)))  # superseded by the ok attempt below
        for device, steps in samples.items():
            store.record(cid, measurement(spec(device, batch=10), steps=steps))
        store.record(cid, failed(spec("phone", batch=10), "unreachable"))
    return samples


def hand_median_p95_us(steps: tuple[float, ...], batch: int) -> tuple[float, float]:
    xs = sorted(s / batch * 1e6 for s in steps)
    n = len(xs)
    mid = xs[n // 2] if n % 2 else (xs[n // 2 - 1] + xs[n // 2]) / 2
    h = 0.95 * (n - 1)
    lo = int(h)
    p95 = xs[lo] + (h - lo) * (xs[min(lo + 1, n - 1)] - xs[lo])
    return mid, p95


def check_export(frame: pd.DataFrame, samples: dict[str, tuple[float, ...]]) -> None:
    for column in (
        "device",
        "model",
        "width",
        "batch",
        "backend",
        "status",
        "median_us",
        "p95_us",
        "peak_memory_bytes",
    ):
        assert column in frame.columns
    assert len(frame) == 3
    rows = {row["device"]: row for _, row in frame.iterrows()}
    for device, steps in samples.items():
        median, p95 = hand_median_p95_us(steps, 10)
        assert rows[device]["status"] == "ok"
        assert rows[device]["median_us"] == pytest.approx(median)
        assert rows[device]["p95_us"] == pytest.approx(p95)
        assert rows[device]["peak_memory_bytes"] == 123_456_789
        assert rows[device]["batch"] == 10 and rows[device]["width"] == 0.5 and rows[device]["backend"] == "ort"
    assert rows["phone"]["status"] == "unreachable"
    assert pd.isna(rows["phone"]["median_us"])


def test_export_csv_to_stdout_and_file(db: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    samples = fill_for_export(db)
    assert main(["profiles", "export", "--db", str(db)]) == 0
    out, _ = capsys.readouterr()
    check_export(pd.read_csv(io.StringIO(out)), samples)
    target = tmp_path / "cells.csv"
    assert main(["profiles", "export", "--db", str(db), "--format", "csv", "--out", str(target)]) == 0
    _, err = capsys.readouterr()
    assert "wrote 3 cells" in err
    check_export(pd.read_csv(target), samples)


def test_export_parquet(db: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    samples = fill_for_export(db)
    target = tmp_path / "cells.parquet"
    assert main(["profiles", "export", "--db", str(db), "--format", "parquet", "--out", str(target)]) == 0
    frame = pd.read_parquet(target)
    check_export(frame, samples)
    assert list(frame.columns) == list(CELL_COLUMNS)
    assert not list(tmp_path.glob(".cells.parquet.tmp-*"))


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--db", "{missing}"], "no profile store at"),
        (["--db", "{db}", "--format", "parquet"], "parquet export needs --out"),
        (["--db", "{db}", "--out", "{tmp}/no/such/dir/x.csv"], "does not exist"),
    ],
)
def test_export_errors_are_one_line_exit_2(
    db: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    fill_for_export(db)
    filled = [a.format(missing=tmp_path / "nope.db", db=db, tmp=tmp_path) for a in argv]
    started = time.monotonic()
    assert main(["profiles", "export", *filled]) == 2
    out, err = capsys.readouterr()
    assert message in err and err.count("\n") == 1 and out == ""
    assert not (tmp_path / "nope.db").exists()  # export never creates a store
    assert time.monotonic() - started < 10


def _round_cost(device: str = "pi4", **kw: Any) -> RoundCostModel:
    values: dict[str, Any] = {
        "device": device, "model": "fjord-cnn", "width": 1.0, "batch": 20, "backend": "ort", "optimizer": "sgd",
        "threads": 1, "fixed_s": 1.5, "step_s": 0.02, "down_s_per_byte": 1e-8, "down_latency_s": 0.03,
        "up_s_per_byte": 2e-8, "up_latency_s": 0.04, "measured_at": 1_700_000_010.0,
        "samples": {"train": [{"steps": 2, "seconds": 1.54, "step_seconds": 0.04}], "down": [], "up": []},
    }  # fmt: skip
    values.update(kw)
    return RoundCostModel(**values)


def test_round_costs_are_stored_with_provenance_latest_per_configuration(db: Path) -> None:
    make_v1(db)  # a file from before round costs gains the table
    with ProfileStore(db) as store:
        campaign = store.start_campaign(None, "fjord-cnn", versions={}, commit=None)
        store.record_round_cost(campaign, _round_cost(fixed_s=9.0))
        store.record_round_cost(campaign, _round_cost())  # the latest of the same configuration wins
        store.record_round_cost(campaign, _round_cost(optimizer="adamw", fixed_s=2.5))
        failed_id = store.record_round_cost(
            campaign,
            failed={
                "device": "pi3", "model": "fjord-cnn", "width": 1.0, "batch": 20, "backend": "ort",
                "optimizer": "sgd", "threads": 1, "status": "timeout", "message": "train request timed out",
            },
        )  # fmt: skip
        with pytest.raises(StoreError, match="no such campaign"):
            store.record_round_cost(campaign + 10, _round_cost())
        with pytest.raises(StoreError, match="exactly one"):
            store.record_round_cost(campaign)
    with ProfileStore(db) as store:
        costs = store.round_costs()
        assert [(c.optimizer, c.fixed_s) for c in costs] == [("sgd", 1.5), ("adamw", 2.5)]
        assert costs[0] == _round_cost(campaign_id=campaign)  # every field, the raw points too
        assert len(store.round_costs(latest=False)) == 3
        rows = store.round_cost_rows()
        [failure] = [r for r in rows if r["status"] != "ok"]
        assert failure["id"] == failed_id and failure["device"] == "pi3" and failure["fixed_s"] is None
        assert "timed out" in failure["message"]
