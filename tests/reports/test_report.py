"""The report files: what is written, that tables on the page and in CSV match the records, partial stores."""

from __future__ import annotations

import base64
from datetime import datetime, timezone
from pathlib import Path

import pandas as pd
import pytest

from harness.store import ProfileStore
from reports.report import load_sources, write_report
from tests.reports.fixtures import (
    IMPRECISE_MESSAGE,
    PHONE_FAILURES,
    WIDTHS,
    build_store,
    failed_measurement,
    median_us,
)
from tests.reports.pagetools import read_page, table_dicts

NOW = datetime(2026, 11, 22, 3, 0, tzinfo=timezone.utc)
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def full(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("full")
    src = load_sources(build_store(root / "fleetbench.db"))
    path, _ = write_report(src, root / "out", now=NOW)
    return path


def test_every_figure_is_png_and_svg_and_embedded(full: Path) -> None:
    out = full.parent
    stems = {p.stem for p in out.glob("*.png")}
    assert stems == {p.stem for p in out.glob("*.svg")}
    expected = {
        "latency_vs_width",
        "memory_vs_width",
        "speedup",
        "roofline",
        "prediction_error",
        "backend_pairs",
        "fl_run1_accuracy",
        "fl_run1_timeline",
        "fl_run1_tiers",
    }
    assert expected <= stems
    page = read_page(full.read_text())
    assert len(page.images) == len(stems)
    for src in page.images:
        assert src.startswith("data:image/png;base64,"), src[:40]
        assert base64.b64decode(src.split(",", 1)[1]).startswith(PNG_MAGIC)
    for stem in stems:
        assert (out / f"{stem}.png").read_bytes().startswith(PNG_MAGIC)
        assert b"<svg" in (out / f"{stem}.svg").read_bytes()[:2000]


def test_the_page_states_isolation_and_precision(full: Path) -> None:
    text = full.read_text()
    assert "Measurement: isolation and precision" in text
    assert "jetson: 8 of 8 cells measured beside pi4 (concurrent with pi4 (pi4 is another host))." in text
    assert IMPRECISE_MESSAGE in text
    iso = pd.read_csv(full.parent / "isolation.csv")
    assert set(iso["device"]) == {"jetson", "pi4"} and iso["concurrent"].tolist() == [8, 4]
    per_width = pd.read_csv(full.parent / "prediction_by_width.csv")
    assert set(per_width["width"]) == set(WIDTHS)


def test_page_is_self_contained(full: Path) -> None:
    text = full.read_text()
    page = read_page(text)
    assert page.scripts == 0
    assert "http://" not in text.replace("http://www.w3.org", "") and "https://" not in text
    # Links point only at files written next to the page (or data: and in-page anchors).
    for href in page.links:
        assert href.startswith(("#", "data:")) or (full.parent / href).is_file(), href


def test_csv_tables_equal_the_records(full: Path) -> None:
    lat = pd.read_csv(full.parent / "latency.csv")
    for w in WIDTHS:
        r = lat[(lat["device"] == "pi4") & (lat["width"] == w)].iloc[0]
        assert r["median_us"] == pytest.approx(median_us("pi4", "ort", w), rel=1e-12)
        assert r["p95_us"] == pytest.approx(1.026 * median_us("pi4", "ort", w), rel=1e-12)
    fails = pd.read_csv(full.parent / "failures.csv")
    assert sorted(fails["status"]) == sorted(s for s, _ in PHONE_FAILURES.values())
    speed = pd.read_csv(full.parent / "speedup.csv")
    assert speed.loc[(speed["device"] == "pi4") & (speed["width"] == 0.25), "measured_speedup"].item() == pytest.approx(
        6
    )


def test_html_tables_show_the_record_values(full: Path) -> None:
    page = read_page(full.read_text())
    latency = table_dicts(page, "latency")
    shown = {(r["device"], r["backend"], r["width"]): r for r in latency}
    assert len(shown) == 12
    for (device, backend, width), r in shown.items():
        m = median_us(device, backend, float(width))
        assert r["median µs"] == f"{m:,.1f}"
        assert r["p5 µs"] == f"{0.982 * m:,.1f}"
    head = {(r["device"], r["backend"]): r for r in table_dicts(page, "headline")}
    assert head[("pi4", "ort")]["w=1 us"] == "900.0" and head[("pi4", "ort")]["speedup"] == "6.00×"
    assert head[("phone", "ort")]["failed"] == "2"
    both = table_dicts(page, "ort_vs_torch")
    assert [r["ORT / PyTorch"] for r in both] == [
        f"{50 / 75:.2f}×",
        f"{80 / 120:.2f}×",
        f"{130 / 195:.2f}×",
        f"{200 / 300:.2f}×",
    ]
    outcomes = {r["device"]: r for r in table_dicts(page, "device_cells")}
    assert (outcomes["phone"]["ok"], outcomes["phone"]["failed"]) == ("0", "2")
    assert outcomes["pi4"]["throttled"] == "1"
    text = full.read_text()
    assert "phone has failures only" in text and "no answer within 300 s" in text


def test_empty_store_explains(tmp_path: Path) -> None:
    ProfileStore(tmp_path / "empty.db").close()
    path, head = write_report(load_sources(tmp_path / "empty.db"), tmp_path / "out", now=NOW)
    text = path.read_text()
    assert head.empty
    assert "holds no measured cells yet" in text
    assert "No federated learning run is logged" in text
    assert "No campaign is recorded" in text
    assert not list((tmp_path / "out").glob("*.png"))


def test_failures_only_store_explains(tmp_path: Path) -> None:
    with ProfileStore(tmp_path / "f.db") as store:
        cid = store.start_campaign(model="fjord-cnn", versions={}, commit=None)
        for w, (status, message) in PHONE_FAILURES.items():
            store.record(cid, failed_measurement("phone", w, status, message))
    path, _ = write_report(load_sources(tmp_path / "f.db"), tmp_path / "out", now=NOW)
    text = path.read_text()
    assert "No cell was measured successfully" in text
    assert "phone has failures only (2 cells: out of memory, timeout)" in text
    assert "runner exited with code 4" in text
    assert "No configuration was measured at two or more widths" in text


def test_single_width_store_explains(tmp_path: Path) -> None:
    db = build_store(tmp_path / "one.db", widths=(1.0,), fl=False, failures=False)
    path, head = write_report(load_sources(db), tmp_path / "out", now=NOW)
    text = path.read_text()
    assert "Only one width was measured" in text
    assert "No configuration was measured at two or more widths" in text
    assert "Leave-one-out needs at least two measured widths" in text
    assert "No federated learning run is logged" in text
    assert (tmp_path / "out" / "latency_vs_width.png").is_file()
    assert list(head["w=1 us"]) == [200.0, 300.0, 900.0]


def test_rewrite_replaces_files_atomically(full: Path, tmp_path: Path) -> None:
    db = build_store(tmp_path / "s.db", fl=False)
    out = tmp_path / "out"
    write_report(load_sources(db), out, now=NOW)
    write_report(load_sources(db), out, log_scale=True, now=NOW)
    assert not [p for p in out.iterdir() if p.name.startswith(".")]
    assert "logarithmic latency axis" in (out / "report.html").read_text()


def test_speedup_beyond_theory_is_flagged(tmp_path: Path) -> None:
    from reports.report import Sources, build_sections

    src = load_sources(build_store(tmp_path / "s.db", widths=(0.5, 1.0), fl=False, failures=False))
    cells = src.cells.copy()
    slow = (cells["device"] == "pi4") & (cells["width"] == 1.0)
    cells.loc[slow, "median_us"] = 5000.0  # 5000 / 300 = 16.7x measured for a 4x FLOPs ratio
    drafts, _ = build_sections(Sources(cells, src.campaigns))
    speed = next(d for d in drafts if d.key == "speedup")
    assert any(note.startswith("pi4 (ort): a measured speed-up exceeds its FLOPs ratio") for note in speed.notes)
    plain, _ = build_sections(src)
    assert next(d for d in plain if d.key == "speedup").notes == ()


def test_emulated_isa_device_is_marked_on_the_page_and_left_out_of_comparisons(tmp_path: Path) -> None:
    import dataclasses

    from tests.reports.fixtures import ok_measurement

    db = build_store(tmp_path / "q.db", fl=False)
    with ProfileStore(db) as store:
        cid = store.start_campaign(fleet="arm64.yaml", model="fjord-cnn")
        for w in WIDTHS:
            base = ok_measurement("pi4", "ort", w)
            qemu = dataclasses.replace(
                base, spec=dataclasses.replace(base.spec, device="pi"), facts={**base.facts, "emulated_isa": True}
            )
            store.record(cid, qemu)
    path, head = write_report(load_sources(db), tmp_path / "out", now=NOW)
    assert "pi" not in set(head["device"]) and "pi4" in set(head["device"])
    page = read_page(path.read_text())
    latency = [r for r in table_dicts(page, "latency") if r["device"] == "pi"]
    assert len(latency) == len(WIDTHS) and {r["isa"] for r in latency} == {"emulated ISA"}
    assert all(r["device"] != "pi" for r in table_dicts(page, "speedup"))
    assert all(r["device"] != "pi" for r in table_dicts(page, "headline"))
    assert [r["isa"] for r in table_dicts(page, "devices") if r["device"] == "pi"] == ["emulated ISA"]
    assert "pi: emulated ISA (an instruction-set emulator" in path.read_text()


def test_the_memory_section_shows_the_model_apart_from_the_runtime(full: Path) -> None:
    from tests.reports.fixtures import peak_mib, runtime_mib

    split = pd.read_csv(full.parent / "memory.csv")
    jetson_torch = split[(split["device"] == "jetson") & (split["backend"] == "torch")].iloc[0]
    assert jetson_torch["runtime_mib"] == pytest.approx(runtime_mib("jetson", "torch"))
    assert jetson_torch["model_share"] == pytest.approx(50.0 / peak_mib("jetson", "torch", 1.0))
    text = full.read_text()
    assert "Memory the model adds vs width." in text and "did not read the runtime" not in text


def test_cells_of_an_older_runner_keep_the_whole_peak_in_the_memory_section(tmp_path: Path) -> None:
    import dataclasses

    from harness.document import parse_document
    from tests.reports.fixtures import ok_measurement

    db = tmp_path / "m.db"
    with ProfileStore(db) as store:
        cid = store.start_campaign(fleet="emulated.yaml", model="cnn")
        for w in WIDTHS:
            base = ok_measurement("pi4", "ort", w)
            store.record(cid, dataclasses.replace(base, runner=parse_document({"mode": "bench"})))
    path, _ = write_report(load_sources(db), tmp_path / "out", now=NOW)
    text = path.read_text()
    assert "Peak memory vs width." in text and "runner did not read the runtime&#x27;s memory apart" in text
    assert not (path.parent / "memory.csv").exists()


def test_energy_is_charted_against_width_beside_latency_and_against_flops(tmp_path: Path) -> None:
    import dataclasses

    from harness.document import parse_document
    from tests.reports.fixtures import FLOPS, ok_measurement

    db = tmp_path / "e.db"
    with ProfileStore(db) as store:
        cid = store.start_campaign(fleet="emulated.yaml", model="cnn")
        for w in WIDTHS:
            store.record(cid, ok_measurement("pi4", "ort", w))
            base = ok_measurement("jetson", "ort", w)
            energy = {
                "sensor": "ina3221-hwmon", "rails": ["VDD_IN"], "emulated": True, "joules": 2.0 * w,
                "idle_joules": 0.5 * w, "uncertainty_j": 0.01, "seconds": 1.0, "images": 100,
                "external_power": False, "flag": None,
            }  # fmt: skip
            runner = parse_document({"mode": "bench", "counts": {"train_flops": FLOPS[w]}, "energy": energy})
            store.record(cid, dataclasses.replace(base, runner=runner))
            phone = ok_measurement("pi4", "ort", w)
            flagged = {**energy, "sensor": "power-supply", "joules": None, "idle_joules": None, "uncertainty_j": None,
                       "emulated": False, "flag": "external-power"}  # fmt: skip
            runner = parse_document({"mode": "bench", "energy": flagged})
            store.record(cid, dataclasses.replace(phone, spec=dataclasses.replace(phone.spec, device="phone"),
                                                  runner=runner))  # fmt: skip
    path, _ = write_report(load_sources(db), tmp_path / "out", now=NOW)
    out = path.parent
    assert {"energy_vs_width", "energy_vs_flops"} <= {p.stem for p in out.glob("*.png")}
    page = read_page(path.read_text())
    rows = table_dicts(page, "energy")
    jetson = [r for r in rows if r["device"] == "jetson"]
    assert len(jetson) == len(WIDTHS) and {r["emulated"] for r in jetson} == {"emulated sensor"}
    assert [r["flag"] for r in rows if r["device"] == "phone"] == ["external-power"] * len(WIDTHS)
    csv = pd.read_csv(out / "energy.csv")
    widest = csv[(csv["device"] == "jetson") & (csv["width"] == 1.0)].iloc[0]
    assert widest["energy_mj"] == pytest.approx(20.0) and widest["above_idle_mj"] == pytest.approx(15.0)
    text = path.read_text()
    assert "pi4: no energy (no power sensor)" in text and "phone: no energy (external-power)" in text
    assert "jetson: emulated sensor" in text


def clock_only_store(path: Path, clients: int) -> None:
    """A real clock-only population run: fast devices 10 ms a step, slow ones 100 ms, a 1.5 s deadline."""
    from fl.population import VirtualClock, draw_population
    from fl.server import RunConfig, run_clock_only

    def cost(device, arch, steps, down, up):
        return 0.2 + {"fast": 0.01, "slow": 0.1}[device] * steps

    config = RunConfig(
        clients=clients, rounds=3, per_round=min(clients // 2, 20), db=str(path), population="fast=0.5,slow=0.5",
        profiles="p.db", clock_only=True, client_examples=200, overcommit=0.5, deadline_s=1.5, max_failed_rounds=3,
    )  # fmt: skip
    clock = VirtualClock(draw_population({"fast": 0.5, "slow": 0.5}, clients, 0), cost, overcommit=0.5, deadline_s=1.5)
    run_clock_only(config, clock, progress=None)


@pytest.mark.parametrize("clients", [20, 200])
def test_a_population_run_shows_its_virtual_clock(tmp_path: Path, clients: int) -> None:
    clock_only_store(tmp_path / "s.db", clients)
    path, _ = write_report(load_sources(tmp_path / "s.db"), tmp_path / "out", now=NOW)
    stems = {p.stem for p in (tmp_path / "out").glob("*.png")}
    assert "fl_run1_virtual" in stems
    text = path.read_text()
    assert "Virtual clock of the population" in text
    if clients > 40:  # one row per client would not read: the virtual clock shows them all instead
        assert "fl_run1_timeline" not in stems and "clients: more than 40" in text
    else:
        assert "fl_run1_timeline" in stems


def _insert(conn, table: str, row: dict) -> None:  # noqa: ANN001 - a sqlite3 connection
    conn.execute(f"INSERT INTO {table} ({', '.join(row)}) VALUES ({', '.join('?' * len(row))})", list(row.values()))


def _one_round_run(
    tmp_path: Path, strategy: str, round_columns: dict, clients: list[dict]
) -> tuple[Path, int]:
    """A store holding one finished FL run of one evaluated round, its client rounds ``clients`` (column values)."""
    import json

    from fl.runlog import FL_MIGRATIONS

    db = build_store(tmp_path / "s.db", fl=False)
    with ProfileStore(db) as store:
        store.ensure_schema("fl", FL_MIGRATIONS)
        with store.transaction() as conn:
            run_id = conn.execute(
                "INSERT INTO fl_runs (started_at, finished_at, strategy, model, dataset, executor, seed, rounds, "
                "status) VALUES (1, 2, ?, 'fjord-cnn', 'mnist5k', 'devices', 0, 1, 'finished')",
                (strategy,),
            ).lastrowid
            row = {"run_id": run_id, "round": 0, "started_at": 1, "finished_at": 2, "wall_seconds": 1.0,
                   "evaluation": json.dumps({"1.0": {"loss": 1.0, "accuracy": 0.5}}), **round_columns}  # fmt: skip
            _insert(conn, "fl_rounds", row)
            for client in clients:
                _insert(conn, "fl_client_rounds", {
                    "run_id": run_id, "round": 0, "width": 1.0, "tier": 0, "straggler": 0, "status": "ok",
                    "compute_seconds": 1.0, "download_seconds": 0, "upload_seconds": 0, "metrics": "{}", **client,
                })  # fmt: skip
    return db, int(run_id)


def test_a_feddrop_run_on_devices_shows_its_time_beside_its_flops_and_says_masks_save_none(tmp_path: Path) -> None:
    import html
    import json


    clients = []
    for device, expected, measured in (("pi4", 0.5, 1.05), ("jetson", 0.4, 0.95)):
        metrics = {"dense_train_flops": 1e6, "expected_train_flops": expected * 1e6,
                   "sampled_train_flops": expected * 1e6, "profile_predicted_seconds": 1.0}  # fmt: skip
        clients.append({"cid": device, "device": device, "compute_seconds": measured, "metrics": json.dumps(metrics)})
    db, run_id = _one_round_run(tmp_path, "feddrop", {}, clients)
    path, _ = write_report(load_sources(db), tmp_path / "out", now=NOW)
    text = html.unescape(path.read_text())
    assert "masks save no time without sparse kernels" in text
    assert "leave 45% of the dense model's training FLOPs" in text and "took 1.00x the profile's dense" in text
    shown = {r["device"]: r for r in table_dicts(read_page(path.read_text()), f"fl_run{run_id}_feddrop")}
    assert set(shown) == {"pi4", "jetson"}


def test_an_fl_run_shows_its_energy_per_client_round_and_per_fleet_round(tmp_path: Path) -> None:
    import html


    clients = [
        {"cid": device, "device": device, "predicted_energy_j": predicted, "measured_energy_j": measured,
         "energy_emulated": 1}
        for device, predicted, measured in (("pi5", 1.0, 0.8), ("jetson", 0.5, 0.6))
    ]  # fmt: skip
    db, run_id = _one_round_run(
        tmp_path, "heterofl", {"predicted_energy_j": 1.5, "measured_energy_j": 1.4}, clients
    )
    path, _ = write_report(load_sources(db), tmp_path / "out", now=NOW)
    page = read_page(path.read_text())
    clients = {r["device"]: r for r in table_dicts(page, f"fl_run{run_id}_energy_clients")}
    assert set(clients) == {"pi5", "jetson"} and {r["sensor"] for r in clients.values()} == {"emulated"}
    assert [r["measured_j"] for r in table_dicts(page, f"fl_run{run_id}_energy_rounds")] == ["1.4"]
    # |1.0 - 0.8| / 0.8 = 25 %, |0.5 - 0.6| / 0.6 = 16.7 %: the median of two is their mean
    assert "is 20.8% in the median" in html.unescape(path.read_text())


def test_a_users_model_is_listed_with_its_source_and_definition_hash(tmp_path: Path) -> None:
    from harness.records import ModelRecord

    db = build_store(tmp_path / "s.db", fl=False)
    record = ModelRecord("net@0123456789ab", "/src/net.py:net", "0123456789ab" + "f" * 52, (("conv", 8),), ("a note",))
    with ProfileStore(db) as store:
        store.record_model(record)
        store.record_model(ModelRecord(record.name, "/elsewhere.py:net", "0" * 64))  # a name is one definition
        assert store.models() == [record]
    out = tmp_path / "out"
    write_report(load_sources(db), out, now=NOW)
    rows = (out / "models.csv").read_text().splitlines()
    assert len(rows) == 2 and "/src/net.py:net" in rows[1] and record.digest in rows[1] and "a note" in rows[1]
