"""Hardware-in-the-loop FL end to end: the emulated fleet (real sshd, the phone through the real adb)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import numpy as np

from devices.connect import connect
from devices.emulation import emulate
from devices.fleetfile import load_fleet
from exporters.zoo import get_model
from fl.executors import Shard
from fl.executors.devices import DevicesExecutor
from fl.records import ClientFailure, TrainIns, TrainRes
from fl.runlog import RunLog
from fl.server import RunConfig, run_fl
from harness.store import ProfileStore
from tests.devices.conftest import kill_device


class KillingExecutor:
    """Delegates to the devices executor; kills one device at the start of round ``kill_round``
    and brings it back (`emulate.up`) before the round after."""

    def __init__(self, inner: DevicesExecutor, fleet_file: Path, victim: str, kill_round: int) -> None:
        self.inner, self.fleet_file, self.victim, self.kill_round = inner, fleet_file, victim, kill_round
        self.round = -1
        self.sent: list[dict[str, TrainIns]] = []
        self.returned: list[list[TrainRes]] = []

    def run(
        self, instructions: Mapping[str, TrainIns], shards: Mapping[str, Shard], timeout_s: float | None = None
    ) -> tuple[list[TrainRes], list[ClientFailure]]:
        self.round += 1
        if self.round == self.kill_round:
            kill_device(load_fleet(self.fleet_file), self.victim)
        if self.round == self.kill_round + 1:
            assert emulate.up(load_fleet(self.fleet_file), say=lambda line: None).ok
        results, failures = self.inner.run(instructions, shards, timeout_s)
        self.sent.append(dict(instructions))
        self.returned.append(results)
        return results, failures

    def close(self) -> None:
        self.inner.close()


def test_three_rounds_on_the_fleet_survive_a_device_killed_in_round_two(
    example_fleet_file: Path, tmp_path: Path
) -> None:
    fleet = load_fleet(example_fleet_file)
    model = get_model("fjord-cnn")
    placement = {f"c{i}": device for i, device in enumerate(fleet.devices)}  # c2 is "slow"
    inner = DevicesExecutor(
        model, placement, artifacts_dir=tmp_path / "artifacts", work_dir=tmp_path / "work", batch=20,
        connect=lambda d: connect(d, connect_timeout=5.0), timeout_s=90,
    )  # fmt: skip
    executor = KillingExecutor(inner, example_fleet_file, "slow", kill_round=1)
    config = RunConfig(
        strategy="fedavg", model="fjord-cnn", dataset="mnist5k", clients=4, rounds=3, seed=1,
        executor="devices", db=str(tmp_path / "fl.db"), lr=0.05,
    )  # fmt: skip
    from fl.data import load_federated

    data = load_federated("mnist5k", model, 4, "iid", 1, max_examples=400)
    try:
        with ProfileStore(tmp_path / "fl.db") as store:
            summary = run_fl(
                config, store=store, executor=executor, data=data, progress=None,
                placement={cid: d.name for cid, d in placement.items()},
            )  # fmt: skip
            rows = RunLog(store).client_rounds(summary.run_id)
    finally:
        emulate.up(fleet, say=lambda line: None)  # bring the victim back for the module's other tests

    assert summary.rounds == 3
    status = {(int(r["round"]), r["cid"]): r["status"] for r in rows.to_dict("records")}
    assert all(status[(0, cid)] == "ok" for cid in placement)
    # its sshd and sessions were killed: a lost connection or a refused one, either way unreachable
    assert status[(1, "c2")] == "unreachable"
    assert all(status[(1, cid)] == "ok" for cid in ("c0", "c1", "c3"))
    assert {r["device"] for r in rows.to_dict("records")} == {"fast", "mid", "slow", "phone"}
    # every device that took part sent back parameters that differ from what it was sent
    for sent, returned in zip(executor.sent, executor.returned, strict=True):
        for res in returned:
            before = sent[res.cid].parameters
            assert set(res.parameters) == set(before)
            assert any(not np.array_equal(res.parameters[k], before[k]) for k in before), res.cid
    assert len(executor.returned[1]) == 3
    assert all(status[(2, cid)] == "ok" for cid in placement)  # the failed device is retried and trains again
