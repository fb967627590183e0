"""One configuration from profile to round (fl/scheduling/configs.py): exact matches, the nearest, none."""

from __future__ import annotations

import pytest

from exporters.userinput import InputError
from fl.scheduling.configs import ProfileConfig, match_profile, match_round_cost, matched_profiles
from harness.roundcost import RoundCostModel
from tests.fl.scheduling.profiles import line_rows


def rows_of(device: str, *, optimizer: str, threads: int, backend: str = "ort", batch: int = 20, a: float = 100.0):
    return [
        {**r, "optimizer": optimizer, "threads": threads}
        for r in line_rows(device, a, 1e-4, backend=backend, batch=batch)
    ]


def test_the_matching_configuration_is_chosen_exactly() -> None:
    rows = rows_of("A", optimizer="adamw", threads=2, a=1.0) + rows_of("A", optimizer="sgd", threads=1, a=2.0)
    match = match_profile(rows, "A", "m", ProfileConfig(batch=20, backend="ort", optimizer="sgd", threads=1))
    assert match.exact and match.warning("m") == ""
    assert {r["median_us"] - 1e-4 * r["train_flops"] for r in match.rows} == {2.0}  # only the sgd line


def test_the_nearest_configuration_differs_in_the_least_important_fields() -> None:
    # run: sgd, 1 thread, batch 20, ort. Candidates: sgd at 4 threads (threads: 1) and adamw at 1 thread (optimizer: 4)
    rows = rows_of("A", optimizer="adamw", threads=1, a=1.0) + rows_of("A", optimizer="sgd", threads=4, a=2.0)
    match = match_profile(rows, "A", "m", ProfileConfig(batch=20, backend="ort", optimizer="sgd", threads=1))
    assert match.config == {"backend": "ort", "optimizer": "sgd", "batch": 20, "threads": 4}
    assert match.differences == ("threads 4 (run: 1)",)
    assert "'A'" in match.warning("m") and "threads 4 (run: 1)" in match.warning("m")
    # a batch difference (2) outweighs threads (1) but not an optimizer (4)
    rows = rows_of("A", optimizer="sgd", threads=1, batch=32, a=1.0) + rows_of("A", optimizer="adamw", threads=1)
    match = match_profile(rows, "A", "m", ProfileConfig(batch=20, optimizer="sgd"))
    assert match.config["batch"] == 32 and match.differences == ("batch 32 (run: 20)",)
    # the backend weighs most of all
    rows = rows_of("A", optimizer="adamw", threads=8, batch=8) + rows_of(
        "A", optimizer="sgd", threads=1, backend="torch"
    )
    match = match_profile(rows, "A", "m", ProfileConfig(batch=20, backend="ort", optimizer="sgd", threads=1))
    assert match.config["backend"] == "ort" and len(match.differences) == 3


def test_no_usable_profile_is_a_clear_error_or_left_out() -> None:
    failed = [{**r, "status": "timeout"} for r in rows_of("A", optimizer="sgd", threads=1)]
    with pytest.raises(InputError, match="device 'A' has no measured profile of m"):
        match_profile(failed, "A", "m", ProfileConfig(batch=20))
    warnings: list[str] = []
    rows = rows_of("B", optimizer="adamw", threads=1)
    out = matched_profiles(
        failed + rows, "m", {"A": ProfileConfig(20), "B": ProfileConfig(20, optimizer="sgd")}, warn=warnings.append,
        strict=False,
    )  # fmt: skip
    assert list(out) == ["B"] and len(out["B"]) == 4
    assert any("'A' has no measured profile" in w for w in warnings)
    assert any("'B'" in w and "optimizer adamw (run: sgd)" in w for w in warnings)
    with pytest.raises(InputError, match="'A'"):
        matched_profiles(failed + rows, "m", {"A": ProfileConfig(20)})


def test_round_costs_match_by_the_same_rule() -> None:
    def cost(optimizer: str, threads: int, at: float) -> RoundCostModel:
        return RoundCostModel(
            "A", "m", 1.0, 20, "ort", optimizer, threads, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0, measured_at=at
        )

    costs = [cost("adamw", 1, 1.0), cost("sgd", 2, 2.0), cost("sgd", 2, 3.0)]
    chosen, differences = match_round_cost(costs, "A", "m", ProfileConfig(20, "ort", "sgd", 1))
    assert chosen is costs[2] and differences == ("threads 2 (run: 1)",)  # the newest of the nearest
    assert match_round_cost(costs, "B", "m", ProfileConfig(20)) == (None, ())
