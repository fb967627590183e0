"""Report tables: every number checked against values worked by hand from the stored records."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd
import pytest

from harness.store import ProfileStore
from reports import tables
from tests.reports.fixtures import (
    BATCH,
    FLOPS,
    IMPRECISE,
    MATMUL,
    WIDTHS,
    build_store,
    median_us,
    peak_mib,
    runtime_mib,
)

# Sorted step multipliers 0.98, 0.99, 1.00, 1.01, 1.03. NumPy's linear rule, n = 5:
# p5: h = 4 * 0.05 = 0.2 -> 0.98 + 0.2 * (0.99 - 0.98) = 0.982
# p95: h = 4 * 0.95 = 3.8 -> 1.01 + 0.8 * (1.03 - 1.01) = 1.026
# IQR: p75 (h = 3) 1.01 - p25 (h = 1) 0.99 = 0.02
P5, P95, IQR = 0.982, 1.026, 0.02


@pytest.fixture(scope="module")
def cells(tmp_path_factory: pytest.TempPathFactory) -> pd.DataFrame:
    path = build_store(tmp_path_factory.mktemp("store") / "fleetbench.db")
    with ProfileStore(path) as store:
        return store.latest_cells()


def row(frame: pd.DataFrame, **match: object) -> pd.Series:
    hit = frame
    for key, value in match.items():
        hit = hit[hit[key] == value]
    assert len(hit) == 1, f"{len(hit)} rows match {match}"
    return hit.iloc[0]


def test_latency_table_matches_the_raw_steps(cells: pd.DataFrame) -> None:
    lat = tables.latency_table(cells)
    assert len(lat) == 12  # 4 widths x (pi4 ort, jetson ort, jetson torch); the phone failed
    assert "phone" not in set(lat["device"])
    for device, backend in (("pi4", "ort"), ("jetson", "ort"), ("jetson", "torch")):
        for w in WIDTHS:
            r = row(lat, device=device, backend=backend, width=w)
            m = median_us(device, backend, w)
            assert r["median_us"] == pytest.approx(m, rel=1e-9)
            assert r["p5_us"] == pytest.approx(P5 * m, rel=1e-9)
            assert r["p95_us"] == pytest.approx(P95 * m, rel=1e-9)
            assert r["iqr_us"] == pytest.approx(IQR * m, rel=1e-9)
            assert r["peak_memory_mib"] == pytest.approx(peak_mib(device, backend, w))
            assert r["runtime_memory_mib"] == pytest.approx(runtime_mib(device, backend))
            assert r["model_memory_mib"] == pytest.approx(10.0 + 40.0 * w)
            assert r["train_mflops"] == pytest.approx(FLOPS[w] / 1e6)
            assert r["n"] == 5 and r["batch"] == BATCH
    assert bool(row(lat, device="pi4", width=1.0)["throttled"])
    assert not bool(row(lat, device="pi4", width=0.5)["throttled"])


def test_memory_table_parts_the_runtime_from_the_model(cells: pd.DataFrame) -> None:
    split = tables.memory_table(tables.latency_table(cells))
    assert len(split) == 3  # pi4 ort, jetson ort, jetson torch
    for device, backend in (("pi4", "ort"), ("jetson", "ort"), ("jetson", "torch")):
        r = row(split, device=device, backend=backend)
        assert r["runtime_mib"] == pytest.approx(runtime_mib(device, backend))
        assert r["widest"] == max(WIDTHS)
        assert r["model_mib"] == pytest.approx(50.0)  # 10 + 40 x width 1
        assert r["model_share"] == pytest.approx(50.0 / peak_mib(device, backend, 1.0))


def test_memory_table_is_empty_for_cells_whose_runner_did_not_read_the_runtime(cells: pd.DataFrame) -> None:
    older = cells.assign(runtime_memory_bytes=pd.NA, model_memory_bytes=pd.NA)
    lat = tables.latency_table(older)
    assert lat["model_memory_mib"].isna().all() and lat["peak_memory_mib"].notna().all()
    assert tables.memory_table(lat).empty


def test_speedup_is_explained_by_the_fixed_share(cells: pd.DataFrame) -> None:
    speed = tables.speedup_table(cells)
    r = row(speed, device="pi4", backend="ort", width=0.25)
    # pi4: 900 us at width 1, 150 us at 0.25; FLOPs 16e5 / 1e5.
    assert r["measured_speedup"] == pytest.approx(900 / 150)
    assert r["flops_ratio"] == pytest.approx(16.0)
    assert r["efficiency"] == pytest.approx(6.0 / 16.0)
    # Fit a = 100 us: share 100 / 900; Amdahl 1 / (1/9 + (8/9) / 16) = 6 exactly (the data are affine).
    # the latency model's weak prior pulls an exact line by well under 1 %
    assert r["fixed_us"] == pytest.approx(100.0, rel=1e-2)
    assert r["fixed_share"] == pytest.approx(100 / 900, rel=1e-2)
    assert r["modelled_speedup"] == pytest.approx(6.0, rel=1e-2)
    half = row(speed, device="jetson", backend="torch", width=0.5)
    assert half["measured_speedup"] == pytest.approx(300 / 120)
    assert half["flops_ratio"] == pytest.approx(4.0)
    assert row(speed, device="jetson", backend="ort", width=1.0)["measured_speedup"] == pytest.approx(1.0)


def test_amdahl_reproduces_feddrop_table_10() -> None:
    # FedDrop Table 10: 983 us at FLOPs ratio 1, 562 us at 0.5. With L = a + b F: a + b = 983,
    # a + b / 2 = 562 -> b = 842, a = 141, phi = 141 / 983; the model gives 983 / 562 = 1.749x.
    share = 141 / 983
    assert tables.amdahl_speedup(2.0, share) == pytest.approx(983 / 562, rel=1e-9)
    assert tables.amdahl_speedup(4.0, 0.0) == 4.0


def test_roofline_fraction(cells: pd.DataFrame) -> None:
    roof = tables.roofline_table(cells)
    r = row(roof, device="pi4", width=1.0)
    # 1.6e6 FLOPs in 900 us = 1.7778 GFLOP/s; probe 10 GFLOP/s.
    assert r["achieved_gflops"] == pytest.approx(1.6e6 / 900e-6 / 1e9)
    assert r["matmul_gflops"] == MATMUL["pi4"]
    assert r["fraction"] == pytest.approx(1.6e6 / 900e-6 / 1e9 / 10.0)
    small = row(roof, device="jetson", backend="ort", width=0.25)
    assert small["fraction"] == pytest.approx(1e5 / 50e-6 / 1e9 / 20.0)


def test_backend_table_pairs_ort_and_torch(cells: pd.DataFrame) -> None:
    both = tables.backend_table(cells)
    assert set(both["device"]) == {"jetson"}
    assert list(both["width"]) == list(WIDTHS)
    for w in WIDTHS:
        r = row(both, width=w)
        assert r["ort_us"] == pytest.approx(median_us("jetson", "ort", w))
        assert r["torch_us"] == pytest.approx(median_us("jetson", "torch", w))
        assert r["ort_over_torch"] == pytest.approx(median_us("jetson", "ort", w) / median_us("jetson", "torch", w))


def test_device_and_failure_tables(cells: pd.DataFrame) -> None:
    facts = {"pi4": {"platform": "raspberry-pi", "cpu_model": "Cortex-A72", "cores": 4}}
    dev = tables.device_table(cells, facts)
    assert list(dev["device"]) == ["jetson", "phone", "pi4"]
    phone = row(dev, device="phone")
    assert (phone["cells"], phone["ok"], phone["failed"]) == (2, 0, 2)
    assert math.isnan(phone["matmul_gflops"])
    pi4 = row(dev, device="pi4")
    assert (pi4["ok"], pi4["failed"], pi4["throttled"], pi4["noisy"]) == (4, 0, 1, 0)
    assert pi4["cpu"] == "Cortex-A72" and pi4["matmul_gflops"] == 10.0
    assert row(dev, device="jetson")["backends"] == "ort, torch"
    fail = tables.failures_table(cells)
    assert list(zip(fail["width"], fail["status"], strict=True)) == [(0.25, "timeout"), (0.5, "out of memory")]
    assert "VmHWM" in fail.iloc[1]["message"]


def test_precision_and_isolation_are_stated(cells: pd.DataFrame) -> None:
    lat = tables.latency_table(cells)
    flagged = lat[lat["imprecise"]]
    assert [(r.device, r.backend, r.width) for r in flagged.itertuples()] == [IMPRECISE]
    assert row(lat, device="pi4", width=0.5)["precision"] == pytest.approx(0.012)
    assert row(tables.device_table(cells, {}), device="jetson")["imprecise"] == 1
    iso = tables.isolation_table(cells)
    assert list(iso["device"]) == ["jetson", "pi4"]  # the phone has failed cells only
    jetson = row(iso, device="jetson")
    assert (jetson["cells"], jetson["alone"], jetson["concurrent"], jetson["concurrent_with"]) == (8, 0, 8, "pi4")
    assert jetson["reason"] == "concurrent with pi4 (pi4 is another host)"
    # cells stored before isolation was recorded count in neither column
    old = cells.assign(alone=pd.NA, concurrent_with="", isolation_reason="")
    assert tables.isolation_table(old)[["alone", "concurrent"]].to_numpy().sum() == 0


def test_prediction_error_is_zero_on_affine_medians(cells: pd.DataFrame) -> None:
    errors = tables.prediction_error_table(cells)
    assert len(errors) == 12
    assert errors["error"].abs().max() < 5e-3  # the weak prior's pull only
    r = row(errors, device="pi4", width=0.5)
    assert r["measured_us"] == pytest.approx(300.0) and r["predicted_us"] == pytest.approx(300.0, rel=5e-3)
    assert (errors["predicted_std_us"] > 0).all()
    assert list(errors["extrapolated"]) == [True, False, False, True] * 3  # the narrowest and widest lie outside
    summary = tables.prediction_summary(errors)
    assert list(summary["widths"]) == [4, 4, 4]
    by_width = tables.prediction_by_width(errors)
    ort = by_width[by_width["backend"] == "ort"]
    assert list(ort["width"]) == list(WIDTHS) and {"jetson", "pi4"} <= set(by_width.columns)
    assert list(by_width.loc[by_width["backend"] == "torch", "pi4"].isna()) == [True] * 4  # pi4 ran no torch
    ort_errors = errors[errors["backend"] == "ort"]
    assert ort["max_abs_error"].tolist() == pytest.approx(
        [ort_errors.loc[ort_errors["width"] == w, "error"].abs().max() for w in WIDTHS]
    )


def test_prediction_error_sees_a_bent_curve() -> None:
    # Medians 10, 20, 26 us at FLOPs 1, 2, 3 (x 1e5): leaving out the middle width, the line through
    # (1, 10) and (3, 26) (a = 2 >= 0, b = 8) predicts 18 at 2 -> error (18 - 20) / 20 = -10 %.
    frame = pd.DataFrame(
        {
            "device": "d",
            "model": "m",
            "batch": 1,
            "backend": "ort",
            "status": "ok",
            "width": [0.25, 0.5, 0.75],
            "median_us": [10.0, 20.0, 26.0],
            "train_flops": [1e5, 2e5, 3e5],
        }
    )
    errors = tables.prediction_error_table(frame)
    assert row(errors, width=0.5)["error"] == pytest.approx(-0.10, abs=5e-3)


def test_headline(cells: pd.DataFrame) -> None:
    head = tables.headline_table(cells)
    pi4 = row(head, device="pi4")
    assert [pi4[f"w={w:g} us"] for w in WIDTHS] == pytest.approx([150.0, 300.0, 550.0, 900.0])
    assert pi4["speedup"] == pytest.approx(6.0) and pi4["theory"] == pytest.approx(16.0)
    phone = row(head, device="phone")
    assert phone["failed"] == 2 and math.isnan(phone["speedup"])


def test_backend_pairs_table_compares_every_pair_at_the_same_cell(cells: pd.DataFrame) -> None:
    # The portable step model measured on the jetson at 1.1x the training build's latency, 10 MiB more.
    onnx = cells[(cells["device"] == "jetson") & (cells["backend"] == "ort")].copy()
    onnx["backend"] = "onnx"
    onnx["median_us"] = 1.1 * onnx["median_us"]
    onnx["peak_memory_bytes"] = onnx["peak_memory_bytes"] + 10 * 2**20
    pairs = tables.backend_pairs_table(pd.concat([cells, onnx], ignore_index=True))
    assert set(pairs["device"]) == {"jetson"}
    for w in WIDTHS:
        at = pairs[pairs["width"] == w]
        assert [(r.backend, r.baseline) for r in at.itertuples()] == [
            ("ort", "torch"),
            ("onnx", "ort"),
            ("onnx", "torch"),
        ]
        ort, torch = median_us("jetson", "ort", w), median_us("jetson", "torch", w)
        r = row(at, backend="onnx", baseline="ort")
        assert r["backend_us"] == pytest.approx(1.1 * ort) and r["baseline_us"] == pytest.approx(ort)
        assert r["ratio"] == pytest.approx(1.1)
        assert r["backend_mib"] - r["baseline_mib"] == pytest.approx(10.0)
        assert row(at, backend="onnx", baseline="torch")["ratio"] == pytest.approx(1.1 * ort / torch)
        assert row(at, backend="ort", baseline="torch")["ratio"] == pytest.approx(ort / torch)
    # Without onnx cells the pairs table is the ORT/PyTorch comparison only, and backend_table is that view.
    only = tables.backend_pairs_table(cells)
    assert set(zip(only["backend"], only["baseline"], strict=True)) == {("ort", "torch")}
    assert list(tables.backend_table(cells)["ort_over_torch"]) == pytest.approx(list(only["ratio"]))


def test_empty_and_single_width_inputs() -> None:
    empty = pd.DataFrame(columns=["device", "model", "batch", "backend", "width", "status", "median_us"])
    for build in (
        tables.latency_table,
        tables.speedup_table,
        tables.roofline_table,
        tables.backend_table,
        tables.backend_pairs_table,
        tables.prediction_error_table,
        tables.failures_table,
        tables.headline_table,
    ):
        assert build(empty).empty
    single = pd.DataFrame(
        {
            "device": ["d"],
            "model": ["m"],
            "batch": [1],
            "backend": ["ort"],
            "status": ["ok"],
            "width": [1.0],
            "median_us": [5.0],
            "train_flops": [1e5],
        }
    )
    assert tables.speedup_table(single).empty
    assert tables.prediction_error_table(single).empty


def test_fl_tables(tmp_path: Path) -> None:
    from reports.report import load_sources

    src = load_sources(build_store(tmp_path / "s.db"))
    acc = tables.fl_accuracy_table(src.fl_rounds)
    assert len(acc) == 9
    assert row(acc, round=3, width=1.0)["accuracy"] == pytest.approx(0.75)
    assert row(acc, round=1, width=0.25)["loss"] == pytest.approx(2.1)
    tl = tables.fl_timeline_table(src.fl_client_rounds)
    c2 = row(tl, round=1, cid="c2")
    assert c2["total_s"] == pytest.approx(6.0 + 0.5 + 0.5) and bool(c2["straggler"])
    assert row(tl, round=2, cid="c2")["status"] == "timeout"
    tiers = tables.fl_tier_table(src.fl_client_rounds)
    assert (row(tiers, round=1, tier=0)["clients"], row(tiers, round=1, tier=0)["stragglers"]) == (2, 1)
    assert row(tiers, round=3, tier=1)["clients"] == 2


# ---------------------------------------------------------------------------- emulated ISA


@pytest.fixture(scope="module")
def with_qemu(tmp_path_factory: pytest.TempPathFactory) -> pd.DataFrame:
    """The fixture store plus ``pi``: pi4's cells measured again under qemu-user (both backends)."""
    import dataclasses

    from tests.reports.fixtures import ok_measurement

    path = build_store(tmp_path_factory.mktemp("store") / "fleetbench.db", fl=False)
    with ProfileStore(path) as store:
        cid = store.start_campaign(fleet="arm64.yaml", model="fjord-cnn")
        for w in WIDTHS:
            for backend in ("ort", "torch"):
                base = ok_measurement("pi4", "ort", w)
                facts = {**base.facts, "platform": "linux", "emulated_isa": True}
                spec = dataclasses.replace(base.spec, device="pi", backend=backend)
                store.record(cid, dataclasses.replace(base, spec=spec, facts=facts))
        return store.latest_cells()


def test_emulated_isa_cells_are_marked_and_kept_out_of_every_comparison(with_qemu: pd.DataFrame) -> None:
    lat = tables.latency_table(with_qemu)
    assert set(lat.loc[lat["device"] == "pi", "isa"]) == {tables.EMULATED_ISA}
    assert len(lat[lat["device"] == "pi"]) == 2 * len(WIDTHS)
    assert set(lat.loc[lat["device"] != "pi", "isa"]) == {""}
    for table in (
        tables.speedup_table(with_qemu),
        tables.roofline_table(with_qemu),
        tables.backend_table(with_qemu),
        tables.headline_table(with_qemu),
    ):
        assert not table.empty and "pi" not in set(table["device"])
    # the real devices' comparisons are the same as without the emulated one
    alone = with_qemu[with_qemu["device"] != "pi"]
    pd.testing.assert_frame_equal(tables.speedup_table(with_qemu), tables.speedup_table(alone))
    pd.testing.assert_frame_equal(tables.headline_table(with_qemu), tables.headline_table(alone))
    devices = tables.device_table(with_qemu, {}).set_index("device")
    assert devices.loc["pi", "isa"] == tables.EMULATED_ISA and devices.loc["pi4", "isa"] == ""
    assert tables.emulated_devices(with_qemu) == ["pi"]


def test_cells_without_the_emulated_isa_column_count_as_native(cells: pd.DataFrame) -> None:
    bare = cells.drop(columns=["emulated_isa"])
    assert not tables.is_emulated(bare).any()
    assert tables.emulated_devices(bare) == []
    pd.testing.assert_frame_equal(tables.headline_table(bare), tables.headline_table(cells))


def test_fl_virtual_table_places_client_rounds_on_the_run_clock() -> None:
    rounds = pd.DataFrame({"run_id": [1, 1, 2], "round": [0, 1, 0], "virtual_seconds": [2.0, 3.0, None]})
    clients = pd.DataFrame(
        {
            "run_id": [1, 1, 1, 2], "round": [0, 1, 1, 0], "cid": ["c0", "c0", "c1", "c0"], "device": ["a"] * 4,
            "status": ["ok", "ok", "timeout", "ok"], "virtual_seconds": [1.5, 2.5, 4.0, None],
        }
    )  # fmt: skip
    out = tables.fl_virtual_table(rounds, clients)
    assert list(out["round_start_s"]) == [0.0, 2.0, 2.0]  # round 1 starts when round 0 closed
    assert list(out["virtual_s"]) == [1.5, 2.5, 4.0] and list(out["status"]) == ["ok", "ok", "timeout"]
    assert set(out["run_id"]) == {1}  # run 2 has no virtual clock
    assert tables.fl_virtual_table(rounds.drop(columns="virtual_seconds"), clients).empty


def test_fl_energy_tables_give_each_client_round_and_each_fleet_round() -> None:
    rounds = pd.DataFrame(
        {"run_id": [1, 1, 2], "round": [0, 1, 0], "predicted_energy_j": [3.0, 2.5, None],
         "measured_energy_j": [2.8, None, None]}
    )  # fmt: skip
    clients = pd.DataFrame(
        {
            "run_id": [1, 1, 1, 2], "round": [0, 0, 1, 0], "cid": ["c1", "c0", "c0", "c0"],
            "device": ["b", "a", "a", "a"], "status": ["ok"] * 4, "predicted_energy_j": [1.0, 2.0, 2.5, None],
            "measured_energy_j": [0.8, 2.0, None, None], "energy_emulated": [1, 0, None, None],
        }
    )  # fmt: skip
    per_client, per_round = tables.fl_energy_tables(rounds, clients)
    assert list(zip(per_client["round"], per_client["cid"], strict=True)) == [(0, "c0"), (0, "c1"), (1, "c0")]
    assert list(per_client["sensor"]) == ["measured", "emulated", "-"]
    assert list(per_client["predicted_j"]) == [2.0, 1.0, 2.5]
    assert list(per_round["round"]) == [0, 1] and set(per_round["run_id"]) == {1}  # run 2 has no energy
    assert per_round["measured_j"].iloc[0] == 2.8 and math.isnan(per_round["measured_j"].iloc[1])
    old_store = tables.fl_energy_tables(rounds.drop(columns="predicted_energy_j"), clients)
    assert old_store[0].empty and old_store[1].empty


def test_predicted_against_measured_client_rounds_per_device() -> None:
    import math

    import pandas as pd

    from reports.tables import fl_prediction_table, fl_straggler_table, prediction_errors

    def row(rnd: int, cid: str, device: str, compute: float, predicted: float | None, **kw: object) -> dict:
        return {
            "run_id": 1, "round": rnd, "cid": cid, "device": device, "width": kw.get("width", 1.0), "tier": 0,
            "straggler": kw.get("straggler", 0), "status": kw.get("status", "ok"), "download_seconds": 0.5,
            "compute_seconds": compute, "upload_seconds": 0.5, "wait_seconds": None, "predicted_seconds": predicted,
        }  # fmt: skip

    client_rounds = pd.DataFrame(
        [
            row(0, "c0", "pi4", 3.0, 4.4),  # measured 4.0: error 10 %
            row(1, "c0", "pi4", 4.0, 4.0),  # measured 5.0: error 20 %
            row(0, "c1", "pi3", 9.0, 5.0, straggler=1, width=0.5),  # measured 10.0: error 50 %
            row(1, "c1", "pi3", 1.0, None),  # no prediction: left out
            row(1, "c2", "pi3", 0.0, 3.0, status="timeout"),  # failed: left out
        ]
    )
    table = fl_prediction_table(client_rounds).set_index("device")
    assert table.loc["pi4", "rounds"] == 2 and table.loc["pi3", "rounds"] == 1
    assert table.loc["pi4", "predicted_s"] == pytest.approx(4.2) and table.loc["pi4", "measured_s"] == pytest.approx(
        4.5
    )
    assert table.loc["pi4", "median_error"] == pytest.approx(0.15) and table.loc["pi4", "worst_error"] == pytest.approx(
        0.2
    )
    median, worst, n = prediction_errors(client_rounds)
    assert (median, worst, n) == (pytest.approx(0.2), pytest.approx(0.5), 3)
    assert math.isnan(prediction_errors(client_rounds.drop(columns="predicted_seconds"))[0])

    rounds = pd.DataFrame([{"run_id": 1, "round": 0, "metrics": '{"target_seconds": 8.0}'}])
    [straggler] = fl_straggler_table(rounds, client_rounds).to_dict("records")
    assert (straggler["device"], straggler["width"], straggler["seconds"]) == ("pi3", 0.5, 10.0)
    assert straggler["over_target"] == pytest.approx(10.0 / 8.0) and straggler["predicted_s"] == 5.0


def test_client_rounds_with_more_cpu_per_step_than_their_neighbours_are_flagged_as_host_disturbed() -> None:
    def row(rnd: int, device: str, cpu: float, predicted: float, **kw: object) -> dict:
        metrics = {"loop_cpu_seconds": cpu, "steps": 40, **kw.get("metrics", {})}  # type: ignore[dict-item]
        return {
            "run_id": 1, "round": rnd, "cid": device, "device": device, "width": kw.get("width", 1.0), "tier": 0,
            "straggler": kw.get("straggler", 0), "status": "ok", "download_seconds": 0.0, "compute_seconds": 1.0,
            "upload_seconds": 0.0, "wait_seconds": None, "predicted_seconds": predicted, "arch_sizes": [],
            "metrics": json.dumps(metrics),
        }  # fmt: skip

    mixed = {"steps_at_width": {"0.25": 20, "1": 20}}
    client_rounds = pd.DataFrame(
        [
            row(0, "pi3", 0.52, 0.7, straggler=1),  # 13 ms per step against 10 ms in rounds 1 and 2: disturbed
            row(1, "pi3", 0.40, 1.0, straggler=1),
            row(2, "pi3", 0.43, 1.0, straggler=1),  # 7.5 % above: within the 10 % limit
            row(3, "pi3", 0.10, 1.0, width=0.25),  # another width: compared with nothing, not flagged
            row(0, "pi4", 0.30, 1.0),
            row(1, "pi4", 0.60, 1.0, metrics=mixed),  # FjORD rounds that drew two widths are not judged
            row(2, "pi4", 0.30, 1.0, metrics={"steps_at_width": {"1": 40}}),
        ]
    )
    flags = tables.host_disturbed_rounds(client_rounds)
    assert list(flags) == [True, False, False, False, False, False, False]

    # the disturbed round's 30 % error is left out on request; the others are exact
    assert tables.prediction_errors(client_rounds) == (0.0, pytest.approx(0.3), 7)
    assert tables.prediction_errors(client_rounds, skip_disturbed=True) == (0.0, 0.0, 6)
    table = tables.fl_prediction_table(client_rounds).set_index("device")
    assert table.loc["pi3", "disturbed"] == 1 and table.loc["pi4", "disturbed"] == 0

    rounds = pd.DataFrame([{"run_id": 1, "round": r, "metrics": '{"target_seconds": 1.0}'} for r in (0, 1)])
    stragglers = tables.fl_straggler_table(rounds, client_rounds)
    assert list(stragglers["disturbed"]) == [True, False]
    # without the runner's loop metrics nothing is judged
    assert not tables.host_disturbed_rounds(client_rounds.drop(columns="metrics")).any()


def test_a_round_that_got_less_of_the_cpu_is_host_disturbed_at_any_width() -> None:
    def row(rnd: int, width: float, cpu: float, wall: float) -> dict:
        metrics = {"loop_cpu_seconds": cpu, "loop_seconds": wall, "steps": 40}
        return {
            "run_id": 1, "round": rnd, "cid": "c2", "device": "slow", "width": width, "arch_sizes": [],
            "metrics": json.dumps(metrics),
        }  # fmt: skip

    client_rounds = pd.DataFrame(
        [
            row(0, 1.0, 0.140, 1.00),  # a share of 0.14 of a cpu
            row(1, 0.5, 0.070, 0.51),
            row(2, 0.5, 0.070, 0.50),
            # the only round at 0.75 (no CPU-per-step reference), at 0.083 of a cpu: it waited
            row(3, 0.75, 0.105, 1.26),
        ]
    )
    assert list(tables.host_disturbed_rounds(client_rounds)) == [False, False, False, True]


def test_a_round_above_its_profile_s_cpu_per_step_is_host_disturbed_alone() -> None:
    def row(rnd: int, width: float, vs_profile: float | None) -> dict:
        metrics = {"loop_cpu_seconds": 0.1, "loop_seconds": 0.7, "steps": 40}
        if vs_profile is not None:
            metrics["cpu_vs_profile"] = vs_profile
        return {
            "run_id": 1, "round": rnd, "cid": "c2", "device": "slow", "width": width, "arch_sizes": [],
            "metrics": json.dumps(metrics),
        }  # fmt: skip

    # two rounds at one size, both slowed alike: their neighbours cannot tell, the profile can
    client_rounds = pd.DataFrame([row(0, 1.0, 1.02), row(1, 0.4, 1.27), row(2, 0.4, 1.18), row(3, 0.4, 1.10)])
    assert list(tables.host_disturbed_rounds(client_rounds)) == [False, True, True, False]  # 1.10: at the limit
    unjudged = pd.DataFrame([row(0, 1.0, None), row(1, 0.4, None)])
    assert not tables.host_disturbed_rounds(unjudged).any()


def test_fjord_rounds_that_drew_several_widths_are_judged_against_their_draws_profile() -> None:
    def row(rnd: int, vs_mix: float | None, drawn: dict) -> dict:
        metrics = {"loop_cpu_seconds": 0.1, "loop_seconds": 0.3, "steps": 40, **drawn}
        if vs_mix is not None:
            metrics["cpu_vs_profile_mix"] = vs_mix
        return {
            "run_id": 1, "round": rnd, "cid": "c1", "device": "fast", "width": 1.0, "arch_sizes": [],
            "metrics": json.dumps(metrics),
        }  # fmt: skip

    one = {"steps_at_width": {"0.25": 18, "1": 22}}
    other = {"steps_at_width/0.5": 30, "steps_at_width/1": 10}
    # switching widths puts every round above 1; only the round 25 % above its neighbours was slowed
    client_rounds = pd.DataFrame(
        [row(0, 1.12, one), row(1, 1.08, other), row(2, 1.35, one), row(3, 1.18, other), row(4, None, one)]
    )
    assert list(tables.host_disturbed_rounds(client_rounds)) == [False, False, True, False, False]
    # above 1.10 on its own is not enough: that is what switching costs
    steady = pd.DataFrame([row(r, v, one) for r, v in enumerate((1.21, 1.19, 1.24))])
    assert not tables.host_disturbed_rounds(steady).any()


def test_a_round_whose_transfers_stalled_is_disturbed() -> None:
    def row(rnd: int, width: float, down: float, up: float, nbytes: float | None) -> dict:
        metrics = {} if nbytes is None else {"download_bytes": nbytes, "upload_bytes": nbytes}
        return {
            "run_id": 1, "round": rnd, "cid": "c1", "device": "mid", "width": width, "arch_sizes": [],
            "download_seconds": down, "compute_seconds": 0.42, "upload_seconds": up, "metrics": json.dumps(metrics),
        }  # fmt: skip

    client_rounds = pd.DataFrame(
        [
            row(0, 1.0, 0.002, 0.274, 105_036),  # the upload stalled for 0.27 s of a 0.7 s round
            row(1, 1.0, 0.002, 0.003, 105_036),
            row(2, 0.5, 0.002, 0.002, 26_000),  # a smaller payload at another width: judged too, not flagged
            row(3, 1.0, 0.002, 0.003, None),  # bytes unknown: not judged
        ]
    )
    assert list(tables.host_disturbed_rounds(client_rounds)) == [True, False, False, False]


def test_feddrop_time_table_puts_measured_time_beside_the_flops_the_masks_leave() -> None:
    def row(rnd: int, device: str, compute: float, expected: float, sampled: float, dense_s: float) -> dict:
        metrics = {
            "dense_train_flops": 2.0e6, "expected_train_flops": expected * 2.0e6,
            "sampled_train_flops": sampled * 2.0e6, "profile_predicted_seconds": dense_s, "mask_seconds": 0.01,
        }  # fmt: skip
        return {
            "run_id": 3, "round": rnd, "cid": device, "device": device, "width": 1.0, "tier": 0, "straggler": 0,
            "status": "ok", "compute_seconds": compute, "download_seconds": 0.1, "upload_seconds": 0.1,
            "wait_seconds": None, "predicted_seconds": 99.0, "metrics": json.dumps(metrics),
        }  # fmt: skip

    plain = {**row(0, "pi4", 1.0, 1, 1, 1.0), "metrics": json.dumps({"steps": 40})}  # a round without masks
    client_rounds = pd.DataFrame(
        [
            row(0, "pi4", 0.8, 0.5, 0.45, 1.0),  # 1.0 s measured against 1.0 s dense: no saving at half the FLOPs
            row(1, "pi4", 1.0, 0.5, 0.55, 1.0),  # 1.2 s
            row(0, "pi3", 1.8, 0.25, 0.3, 2.0),  # 2.0 s against 2.0 s
            {**row(1, "pi3", 9.0, 0.25, 0.3, 2.0), "status": "timeout"},  # failed: left out
            plain,
        ]
    )
    table = tables.fl_feddrop_time_table(client_rounds).set_index("device")
    assert list(table.index) == ["pi3", "pi4"]
    pi4, pi3 = table.loc["pi4"], table.loc["pi3"]
    assert pi4["rounds"] == 2 and pi3["rounds"] == 1
    assert pi4["expected_flops"] == pytest.approx(0.5) and pi4["sampled_flops"] == pytest.approx(0.5)
    assert pi4["measured_s"] == pytest.approx(1.1) and pi4["dense_s"] == pytest.approx(1.0)
    assert pi4["time_ratio"] == pytest.approx(1.1) and pi4["mask_s"] == pytest.approx(0.01)
    assert pi3["expected_flops"] == pytest.approx(0.25) and pi3["time_ratio"] == pytest.approx(1.0)
    assert tables.fl_feddrop_time_table(pd.DataFrame([plain])).empty


def test_fl_plan_table_sets_each_revision_against_the_rounds_it_was_in_force() -> None:
    def plan(width: float, round_s: float) -> str:
        return json.dumps({"devices": [{"device": "d", "status": "planned", "width": width, "round_s": round_s}]})

    plans = pd.DataFrame(
        {"run_id": [1, 1], "revision": [0, 1], "from_round": [0, 2], "plan": [plan(1.0, 2.0), plan(0.5, 1.0)]}
    )
    client_rounds = pd.DataFrame(
        {
            "run_id": [1] * 4, "round": [0, 1, 2, 3], "device": ["d"] * 4, "status": ["ok", "ok", "ok", "error"],
            "width": [1.0, 1.0, 0.5, 0.5], "download_seconds": [0.5] * 4, "compute_seconds": [2.0, 3.0, 0.5, 9.0],
            "upload_seconds": [0.5] * 4,
        }
    )  # fmt: skip
    table = tables.fl_plan_table(plans, client_rounds)
    first, revised = table.to_dict("records")
    assert (first["planned_width"], first["trained_width"], first["rounds"]) == (1.0, 1.0, 2)
    assert first["measured_s"] == pytest.approx(3.5) and first["measured_vs_planned"] == pytest.approx(1.75)
    assert (revised["from_round"], revised["trained_width"], revised["rounds"]) == (2, 0.5, 1)  # round 3 failed
    assert revised["measured_s"] == pytest.approx(1.5)
    assert tables.fl_plan_table(pd.DataFrame(), client_rounds).empty
