"""Round-cost functions from a real profile store (fl/roundcost.py), worked from the stored lines."""

from __future__ import annotations

import sys
import types

import pytest

from exporters.errors import InputError
from exporters.flops import count
from exporters.zoo import get_model
from fl.roundcost import measured_models, parse_links, round_cost_from_rows, roundcost_module
from harness.latency import fit
from harness.store import ProfileStore
from tests.fl.scheduling.profiles import store_lines

MODEL = get_model("fjord-cnn")
LINES = {"fast": (50.0, 2e-4), "slow": (400.0, 1.5e-3)}


@pytest.fixture
def cells(tmp_path):
    path = tmp_path / "p.db"
    store_lines(path, LINES)
    with ProfileStore(path, create=False) as store:
        return store.latest_cells()


def per_image_us(device: str, width: float) -> float:
    a, b = LINES[device]
    return a + b * count(MODEL, MODEL.arch(width)).train_flops


def test_compute_time_is_steps_times_batch_times_the_fitted_latency(cells):
    cost = round_cost_from_rows(cells, "fjord-cnn", 20, ["fast", "slow"])
    models = fit(cells)
    for device in LINES:
        for width in (0.25, 0.375, 1.0):  # 0.375 was never measured: predicted by the latency model
            latency = models[device].latency[models[device].key("fjord-cnn", 20, "ort")]
            seconds = cost(device, MODEL.arch(width), 7, 0, 0)
            assert seconds == pytest.approx(7 * 20 * latency.predict(MODEL.arch(width)).value, rel=1e-12)
            # the stored cells lie on a line in FLOPs, which the model recovers
            assert seconds == pytest.approx(7 * 20 * per_image_us(device, width) * 1e-6, rel=0.01)
    assert cost("fast", MODEL.arch(1.0), 0, 10**6, 10**6) == 0.0  # no link, no transfer time
    assert cost("slow", MODEL.arch(1.0), 3, 0, 0) > cost("fast", MODEL.arch(1.0), 3, 0, 0)


def test_a_link_adds_bytes_over_rate_plus_delay_each_way(cells):
    links = parse_links("slow=8000:20", ["fast", "slow"])
    assert links == {"slow": (8000.0, 20.0)}
    cost = round_cost_from_rows(cells, "fjord-cnn", 20, ["fast", "slow"], links=links)
    # 1e6 bytes = 8e6 bit at 8e6 bit/s = 1 s, plus 20 ms; 5e5 bytes up = 0.5 s + 20 ms
    assert cost("slow", MODEL.arch(0.5), 0, 10**6, 5 * 10**5) == pytest.approx(1.02 + 0.52)
    assert cost("fast", MODEL.arch(0.5), 0, 10**6, 5 * 10**5) == 0.0
    assert parse_links("1000", ["a", "b"]) == {"a": (1000.0, 0.0), "b": (1000.0, 0.0)}
    assert parse_links(None, ["a"]) == {}


@pytest.mark.parametrize(
    ("spec", "words"),
    [("x=100", "device 'x' is not in the population"), ("a=0", "rate must be positive"), ("a=fast", "not KBIT")],
)
def test_bad_links_are_refused(spec, words):
    with pytest.raises(InputError, match=words):
        parse_links(spec, ["a"])


def test_measured_models_lists_every_device_also_without_usable_cells(cells):
    rows = cells.to_dict("records") + [{"device": "dead", "model": "fjord-cnn", "status": "timeout"}]
    assert measured_models(rows) == {"fast": {"fjord-cnn"}, "slow": {"fjord-cnn"}, "dead": set()}


def test_the_run_batch_is_used_when_measured_else_the_only_one(tmp_path, cells):
    assert round_cost_from_rows(cells, "fjord-cnn", 32, ["fast"])("fast", MODEL.arch(1.0), 1, 0, 0) == pytest.approx(
        32 * per_image_us("fast", 1.0) * 1e-6, rel=0.01  # the batch-20 line, 32 images a step
    )
    path = tmp_path / "two.db"
    store_lines(path, {"fast": (10.0, 1e-4)}, batch=8)
    store_lines(path, {"fast": (20.0, 1e-4)}, batch=20)
    with ProfileStore(path, create=False) as store:
        two = store.latest_cells()
    at_8 = round_cost_from_rows(two, "fjord-cnn", 8, ["fast"])("fast", MODEL.arch(1.0), 1, 0, 0)
    assert at_8 == pytest.approx(8 * (10.0 + 1e-4 * count(MODEL, MODEL.arch(1.0)).train_flops) * 1e-6, rel=0.01)
    with pytest.raises(InputError, match="measured fjord-cnn at batches 8, 20, not at the run's batch 32"):
        round_cost_from_rows(two, "fjord-cnn", 32, ["fast"])
    with pytest.raises(InputError, match="device 'nano' has no usable profile"):
        round_cost_from_rows(cells, "fjord-cnn", 20, ["nano"])


def test_the_round_cost_model_of_the_harness_is_used_when_it_exists(monkeypatch, cells):
    assert roundcost_module() is None or hasattr(roundcost_module(), "round_cost")
    calls = []

    def fake_round_cost(rows, model, batch, backend):
        calls.append((len(rows), model, batch, backend))
        return lambda device, arch, steps, down, up: 42.0

    monkeypatch.setitem(sys.modules, "harness.roundcost", types.SimpleNamespace(round_cost=fake_round_cost))
    cost = round_cost_from_rows(cells, "fjord-cnn", 20, ["fast"])
    assert cost("fast", MODEL.arch(1.0), 1, 0, 0) == 42.0
    assert calls == [(8, "fjord-cnn", 20, None)]
