"""The round-cost model (harness/roundcost.py): its fits worked by hand, and a measurement on a real local device."""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest

from devices.fleet import Device
from devices.local import LocalProcess, LocalTransport
from exporters.artifacts import export_artifacts
from exporters.userinput import InputError
from exporters.zoo import get_model
from harness.deploy import deploy_artifact_set, deploy_runner
from harness.latency import fit
from harness.roundcost import (
    RoundCostError,
    RoundCostModel,
    fit_line,
    fit_round_cost,
    measure_round_cost,
    median_line,
    payload_bytes,
    round_cost,
    round_seconds,
    step_counts_for,
)
from harness.runner_archive import archive_path
from tests.fl.scheduling.profiles import line_rows

MODEL = get_model("fjord-cnn")


def test_fit_line_recovers_a_line_and_clamps_noise_below_zero() -> None:
    assert fit_line([1, 2, 4], [3.5, 4.0, 5.0]) == pytest.approx((3.0, 0.5))
    # a falling line: the slope is noise around zero, the intercept the mean
    assert fit_line([1, 2], [2.0, 1.0]) == pytest.approx((1.5, 0.0))
    # a negative intercept: the line through the origin, least squares
    intercept, slope = fit_line([1, 3], [1.0, 5.0])
    assert intercept == 0.0 and slope == pytest.approx((1 * 1 + 3 * 5) / (1 + 9))
    with pytest.raises(InputError, match="two distinct x"):
        fit_line([2, 2], [1.0, 2.0])
    with pytest.raises(InputError, match="finite"):
        fit_line([1, 2], [1.0, float("nan")])


def test_median_line_passes_through_each_size_s_median_so_one_stray_point_moves_nothing() -> None:
    # three transfers per size, one of them delayed 70 ms by the host: the line ignores it
    x = [1000, 1000, 1000, 3000, 3000, 3000]
    y = [0.011, 0.081, 0.011, 0.013, 0.013, 0.012]
    assert median_line(x, y) == pytest.approx((0.01, 1e-6))
    assert fit_line(x, y)[0] > 0.02  # least squares over all points: the intercept more than doubles
    with pytest.raises(InputError, match="two distinct x"):
        median_line([2, 2], [1.0, 2.0])
    with pytest.raises(InputError, match="2 x values for 1"):
        median_line([1, 2], [1.0])


def test_a_stray_request_or_transfer_does_not_set_the_round_cost() -> None:
    # three requests per step count; one 26-step request spent 70 ms outside its steps (host busy)
    train = [
        {"steps": n, "seconds": 0.005 + extra + 0.0045 * n, "step_seconds": 0.0045 * n}
        for n, extra in ((2, 0.0), (26, 0.07), (2, 0.0), (26, 0.0), (2, 0.001), (26, 0.0))
    ]
    up = [{"bytes": b, "seconds": t} for b, t in ((16384, 0.095), (16384, 0.053), (16384, 0.096))]
    up += [{"bytes": 1048576, "seconds": t} for t in (0.106, 0.104, 0.105)]
    cost = fit_round_cost(
        train, up, up, device="d", model="m", width=1.0, batch=20, backend="ort", optimizer="sgd", threads=1
    )
    assert cost.fixed_s == pytest.approx(0.005)
    assert cost.up_latency_s == pytest.approx(0.095 - 16384 * (0.105 - 0.095) / (1048576 - 16384))


def test_a_slow_devices_longer_request_is_held_to_its_budget_and_stays_longer_than_the_short() -> None:
    assert step_counts_for(None) == step_counts_for(float("nan")) == step_counts_for(0.0) == (2, 26)
    assert step_counts_for(0.01) == (2, 26)  # 26 steps fit in 2 s: the defaults
    assert step_counts_for(0.375) == (2, 5)  # 5 x 0.375 s = 1.9 s
    assert step_counts_for(10.0) == (2, 4)  # never down to the short request's count
    assert step_counts_for(0.1, counts=(3, 40), budget_s=1.0) == (3, 10)


def test_payload_bytes_bracket_the_parameter_files_of_the_sets(tmp_path: Path) -> None:
    sets = []
    for name, floats in (("a", 1000), ("b", 250), ("c", 1000)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "initial_parameters.npy").write_bytes(b"x" * (128 + 4 * floats))
        sets.append(tmp_path / name)
    assert payload_bytes(sets) == (128 + 1000, 128 + 4000)
    assert payload_bytes(sets[:1]) == ((128 + 4000) // 4, 128 + 4000)  # one width: a quarter of it too
    with pytest.raises(InputError, match="no artifact set"):
        payload_bytes([])


def test_round_seconds_adds_fixed_cost_steps_and_transfers() -> None:
    cost = fit_round_cost(
        [{"steps": 2, "seconds": 1.2}, {"steps": 10, "seconds": 2.0}],
        [{"bytes": 1000, "seconds": 0.011}, {"bytes": 3000, "seconds": 0.013}],
        [{"bytes": 1000, "seconds": 0.02}, {"bytes": 3000, "seconds": 0.06}],
        device="d", model="m", width=1.0, batch=20, backend="ort", optimizer="sgd", threads=1,
    )  # fmt: skip
    assert (cost.fixed_s, cost.step_s) == pytest.approx((1.0, 0.1))
    assert (cost.down_latency_s, cost.down_s_per_byte) == pytest.approx((0.01, 1e-6))
    assert (cost.up_latency_s, cost.up_s_per_byte) == pytest.approx((0.0, 2e-5))
    # 1.0 fixed + 5 steps x 20 images x 1 ms + (0.01 + 2000 us) down + 2000 x 20 us up
    assert round_seconds(cost, 1e-3, 20, 5, 2000, 2000) == pytest.approx(1.0 + 0.1 + 0.012 + 0.04)
    assert round_seconds(cost, 1e-3, 20, 0, 0, 0) == pytest.approx(1.0)  # nothing sent: no transfer latency
    assert round_seconds(None, 1e-3, 20, 5, 2000, 2000) == pytest.approx(0.1)  # latency alone


def test_the_fixed_cost_is_the_time_outside_the_steps_when_the_runner_timed_them() -> None:
    # a request's wall time = 0.05 s outside + its steps; the 26-step request's steps ran slow once
    train = [
        {"steps": 2, "seconds": 0.05 + 0.04, "step_seconds": 0.04},
        {"steps": 26, "seconds": 0.05 + 0.80, "step_seconds": 0.80},
        {"steps": 2, "seconds": 0.06 + 0.04, "step_seconds": 0.04},
        {"steps": 26, "seconds": 0.05 + 0.52, "step_seconds": 0.52},
    ]
    transfers = [{"bytes": 1000, "seconds": 0.01}, {"bytes": 3000, "seconds": 0.02}]
    cost = fit_round_cost(
        train, transfers, transfers, device="d", model="m", width=1.0, batch=20, backend="ort", optimizer="sgd",
        threads=1,
    )  # fmt: skip
    assert cost.fixed_s == pytest.approx(0.05)  # the line's intercept would be about 0.04 + noise
    assert cost.step_s == pytest.approx(0.02)  # median per-step time of the requests


def test_round_cost_uses_each_device_s_measurement_and_warns_for_the_others() -> None:
    rows = line_rows("A", 100.0, 1e-4, model="fjord-cnn") + line_rows("B", 50.0, 1e-4, model="fjord-cnn")
    flops = MODEL.arch(1.0)
    measured = RoundCostModel("A", "fjord-cnn", 1.0, 20, "ort", "sgd", 1, 2.0, 0.0, 1e-6, 0.1, 2e-6, 0.2)
    warnings: list[str] = []
    cost = round_cost(rows, "fjord-cnn", 20, costs={"A": measured}, warn=warnings.append)
    models = fit(rows)
    for device, extra in (("A", 2.0 + 0.1 + 1.0 + 0.2 + 2.0), ("B", 0.0)):
        per_image = models[device].latency_model("fjord-cnn", 20, "ort").predict(flops).value
        assert cost(device, flops, 3, 10**6, 10**6) == pytest.approx(extra + 3 * 20 * per_image)
    assert len(warnings) == 1 and "'B' has no round-cost measurement" in warnings[0]
    with pytest.raises(InputError, match="'C' has no usable profile"):
        cost("C", flops, 1, 0, 0)
    # a modelled link replaces the measured transfer where it gives a time
    linked = round_cost(rows, "fjord-cnn", 20, costs={"A": measured}, transfer=lambda d, n: 0.5, warn=None)
    assert linked("A", flops, 0, 10, 10) == pytest.approx(2.0 + 0.5 + 0.5)


@pytest.fixture(scope="module")
def local_set(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("artifacts")
    return export_artifacts(MODEL, MODEL.arch(0.5), batch=8, optimizer="sgd", out_dir=out).directory


class _Recording(LocalTransport):
    """A local transport that keeps every process it starts (to see that each was ended)."""

    def __init__(self) -> None:
        super().__init__()
        self.started: list[LocalProcess] = []

    def start(self, argv: Sequence[str], env: Mapping[str, str] | None = None) -> LocalProcess:
        process = super().start(argv, env)
        self.started.append(process)
        return process


def test_measure_round_cost_on_a_local_device(local_set: Path, tmp_path: Path) -> None:
    device = Device("loc", "local", workdir=str(tmp_path / "device"), python=sys.executable)
    transport = _Recording()
    runner = str(deploy_runner(transport, device, archive_path()))
    remote_set = str(deploy_artifact_set(transport, device, local_set).remote_dir)
    common = {
        "runner": runner, "remote_set": remote_set, "set_dir": local_set, "width": 0.5, "scratch": tmp_path / "s",
        "backend": "ort", "optimizer": "sgd", "threads": 1, "timeout": 120.0,
    }  # fmt: skip
    cost = measure_round_cost(transport, device, step_counts=(1, 6), repeats=2, campaign_id=7, **common)
    assert (cost.device, cost.model, cost.width, cost.batch, cost.optimizer, cost.campaign_id) == (
        "loc",
        "fjord-cnn",
        0.5,
        8,
        "sgd",
        7,
    )
    train, warmup = cost.samples["train"], cost.samples["warmup"]
    assert sorted(p["steps"] for p in train) == [1, 1, 6, 6] and len(cost.samples["down"]) == 4
    # one resident runner served every request and was ended: a warm-up per shard opened the
    # session, the fitted requests reused it (the steady state of FL rounds)
    assert len(transport.started) == 1 and not transport.started[0].alive()
    assert len(cost.samples["start"]) == 1
    assert [p["steps"] for p in warmup] == [1, 6] and [p["sessions_opened"] for p in warmup] == [1, 0]
    assert all(p["sessions_opened"] == 0 and p["load_seconds"] > 0 for p in train)
    # the intercept is the request's time outside its training steps: request, parameter load, reset, result
    # (a few ms here, so 10 ms are allowed for a step of the 1-step request slowed by the shared machine)
    outside = sorted(p["seconds"] - p["step_seconds"] for p in train)
    assert 0.5 * outside[0] <= cost.fixed_s <= 1.5 * outside[-1] + 0.01, (cost.fixed_s, outside)
    # no process start in it: a resident request costs a fraction of starting Python, numpy and onnxruntime
    start_s = cost.samples["start"][0]["seconds"]
    assert cost.fixed_s < 0.25 * start_s, (cost.fixed_s, start_s)
    assert cost.down_latency_s >= 0 and cost.up_latency_s >= 0

    # a runner that cannot run fails with its status, never a model, and is ended
    bad = Device("bad", "local", workdir=str(tmp_path / "device"), python=sys.executable)
    with pytest.raises(RoundCostError, match="bad arguments"):
        measure_round_cost(transport, bad, **{**common, "remote_set": str(tmp_path / "missing-set")})
    assert len(transport.started) == 2 and not transport.started[1].alive()
    with pytest.raises(RoundCostError, match="bad arguments.*--threads"):
        measure_round_cost(transport, bad, **{**common, "threads": 0})
    assert len(transport.started) == 3 and not transport.started[2].alive()
    transport.close()


def test_on_a_device_with_a_power_sensor_the_fixed_cost_holds_the_meter_s_idle_window(
    local_set: Path, tmp_path: Path
) -> None:
    """An FL round on a device with a sensor reads an idle window before its steps; so does each request here."""
    from harness.runner.metering import IDLE_WINDOW_S
    from tests.harness.test_runner_energy import hwmon

    power = hwmon(tmp_path / "power", interval_ms=100)
    device = Device("jetson", "local", workdir=str(tmp_path / "device"), python=sys.executable, power_root=str(power))
    transport = _Recording()
    runner = str(deploy_runner(transport, device, archive_path()))
    remote_set = str(deploy_artifact_set(transport, device, local_set).remote_dir)
    cost = measure_round_cost(
        transport, device, runner=runner, remote_set=remote_set, set_dir=local_set, width=0.5, scratch=tmp_path / "s",
        backend="ort", optimizer="sgd", threads=1, timeout=120.0, step_counts=(1, 2), repeats=1,
    )  # fmt: skip
    transport.close()
    # each request settles one sensor update (0.1 s) and reads the idle window; the steps are timed apart
    outside = [p["seconds"] - p["step_seconds"] for p in cost.samples["train"]]
    assert all(s >= IDLE_WINDOW_S + 0.1 for s in outside), outside
    assert cost.fixed_s >= IDLE_WINDOW_S + 0.1, cost.fixed_s
