"""Each fault of the fault-injection bench (`tests/bench/faults.py`), injected once on the emulated fleet.

The bench injects every fault ten times and prints the table; here each is injected once at
a seeded point, and its checks must hold: the campaign or run survives, no finished cell is
lost, the store is intact, a resumed FL run is bit-identical to an uninterrupted one, and a
fleet brought down leaves no process behind. The faults last shorter and the runs around them
are smaller than the bench's (`PACE`, `WIDTHS`); what is checked is the same.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.bench import faults
from tests.devices.conftest import require_tool

#: Seconds of fault, FL rounds and fleet cycles of one injection here: a link or sshd down for
#: under two seconds, an FL run killed after round 1 or 2 of 4, one round after the runner
#: restarts (FjORD with two widths), one down/up cycle.
PACE = faults.Pace(
    sshd_down=(0.25, 1.0), link_down=(0.5, 1.5), fl_rounds=4, resident_rounds=2, resident_options=("--opt", "k=2"),
    updown_cycles=1,
)  # fmt: skip
#: The widths of each fault's campaigns (default: one). The concurrent fault gives each of its two
#: campaigns half of them; the sshd fault's resume must then measure exactly the missing cells
#: of a device that may have some of its cells.
WIDTHS = {"concurrent": (0.25, 0.5), "sshd": (0.25, 0.5)}


@pytest.fixture(scope="module")
def bench(tmp_path_factory: pytest.TempPathFactory) -> Iterator[faults.Bench]:
    require_tool("sshd")
    if os.geteuid() != 0:
        pytest.fail("the link fault takes a device's network namespace down: run as root, as CI does")
    bench = faults.setup(tmp_path_factory.mktemp("faults"), seed=0, netns=True, widths=(0.25,), pace=PACE)
    try:
        yield bench
    finally:
        faults.emulate.down(bench.fleet, say=lambda line: None)


@pytest.mark.parametrize("fault", faults.FAULTS)
def test_the_fault_is_survived_and_loses_nothing(bench: faults.Bench, fault: str) -> None:
    bench.widths = WIDTHS.get(fault, (0.25,))
    outcome = faults.INJECT[fault](bench)
    assert outcome.survived, f"{fault}: {outcome.why}"
    assert outcome.lost == 0
    assert outcome.recover_seconds > 0


def test_the_table_counts_what_was_injected_survived_and_lost() -> None:
    results = {
        "sshd": [faults.Outcome(True, 0, 2.0, "[fast] 2/4 w0.50 b4 ort connection lost: dropped"),
                 faults.Outcome(False, 1, 4.0, "", why="resume whole=False exact=True")],
        "updown": [faults.Outcome(True, 0, 1.0)],
    }  # fmt: skip
    lines = faults.table(results).splitlines()
    assert lines[1].split()[:4] == ["sshd", "2", "1", "1"] and "3.0 / 4.0" in lines[1]
    assert lines[1].endswith("[fast] 2/4 w0.50 b4 ort connection lost: dropped")
    assert lines[2] == "    not survived: resume whole=False exact=True"
    assert lines[3].split()[:4] == ["updown", "1", "1", "0"]


def test_a_cell_counts_as_finished_only_when_printed_ok(tmp_path: Path) -> None:
    printed = (
        "[fast] 1/4 w0.25 b4 ort ok 812 us/img +-1.2 %\n"
        "[mid] 1/4 w0.25 b4 ort connection lost: root@127.0.0.1:2222: dropped\n"
        "[fast] 2/4 w0.50 b4 ort ok 1604 us/img\n"
    )
    assert faults.printed_ok(printed) == {("fast", 0.25), ("fast", 0.5)}
    assert faults.first_failure(printed).startswith("[mid] 1/4 w0.25 b4 ort connection lost")
