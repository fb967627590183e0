"""Which devices a campaign measures at the same time, and their turns (`harness.isolation`)."""

from __future__ import annotations

import math
from pathlib import Path

from devices.emulation import emulate
from devices.emulation.limits import parse_cpu_list
from devices.fleet import Fleet
from harness.isolation import may_take_turn, pinned_cpus, plan_isolation, round_isolation


def _fleet(text: str, tmp_path: Path) -> Fleet:
    from devices.fleetfile import parse_fleet

    return parse_fleet(text, tmp_path / "fleet.yaml", cwd=tmp_path)


PLANNED = """devices:
  - {name: fast, kind: ssh, host: 127.0.0.1, port: 2201, emulate: {cpu_share: 0.6, cpus: "0"}}
  - {name: mid, kind: ssh, host: 127.0.0.1, port: 2202, emulate: {preset: pi4, cpus: "0"}}
  - {name: slow, kind: ssh, host: 127.0.0.1, port: 2203, emulate: {preset: pi3, cpus: "1"}}
  - {name: phone, kind: adb, serial: "127.0.0.1:2204", emulate: {preset: phone-midrange, cpus: "0-1"}}
  - {name: here, kind: local}
  - {name: pi, kind: ssh, host: pi.lab}
  - {name: jetson, kind: ssh, host: 10.0.0.7}
  - {name: loop, kind: ssh, host: localhost}
"""


def test_isolation_plan_from_a_fleet_file(tmp_path: Path) -> None:
    fleet = _fleet(PLANNED, tmp_path)
    pins = {d.name: parse_cpu_list(d.emulate.cpus) for d in fleet.devices if d.emulate and d.emulate.cpus}
    plan = plan_isolation(fleet.devices, pins)
    after = {p.device: p.after for p in plan.placements}
    assert after == {
        "fast": (),
        "mid": ("fast",),  # both on cpu 0
        "slow": (),  # cpu 1 alone
        "phone": ("fast", "mid", "slow"),  # cpus 0-1 overlap all three
        "here": ("fast", "mid", "slow", "phone"),  # a local device has every cpu of this host
        "pi": (),  # other hosts run at the same time
        "jetson": (),
        "loop": ("fast", "mid", "slow", "phone", "here"),  # a loopback address is this host
    }
    assert plan.groups == [["fast", "slow", "pi", "jetson"], ["mid"], ["phone"], ["here"], ["loop"]]
    assert plan.conflict("fast", "mid") and not plan.conflict("fast", "slow") and not plan.conflict("pi", "here")
    lines = plan.describe()
    assert lines[0].startswith("isolation plan") and any("after fast (shares cpus)" in line for line in lines)
    assert plan.to_dict()["devices"]["phone"] == {"on_host": True, "cpus": "0-1", "after": ["fast", "mid", "slow"],
                                                   "group": 3}  # fmt: skip
    # the records a cell gets
    alone = plan.isolation("mid", [])
    assert alone == {"alone": True, "concurrent_with": [], "cpus": "cpus 0",
                     "reason": "measured alone: shares this host's cpus with fast, phone, here, loop"}  # fmt: skip
    beside = plan.isolation("fast", ["slow", "pi", "fast"])
    assert not beside["alone"] and beside["concurrent_with"] == ["pi", "slow"]
    assert beside["reason"] == "concurrent with pi (pi is another host), slow (disjoint cpus 0 | 1)"
    # without pins every device on this host waits for the one before it
    unpinned = plan_isolation(fleet.devices[:4], {})
    assert [p.group for p in unpinned.placements] == [1, 2, 3, 4]
    # FL rounds: every device on this host takes its turn whatever its pins; other hosts train beside
    rounds = round_isolation(fleet)
    assert rounds.groups == [["fast", "pi", "jetson"], ["mid"], ["slow"], ["phone"], ["here"], ["loop"]]
    assert rounds.conflict("fast", "slow") and not rounds.conflict("fast", "pi")


def test_devices_sharing_cpus_take_turns_pass_by_pass(tmp_path: Path) -> None:
    fleet = _fleet(PLANNED, tmp_path)
    pins = {d.name: parse_cpu_list(d.emulate.cpus) for d in fleet.devices if d.emulate and d.emulate.cpus}
    plan = plan_isolation(fleet.devices, pins)
    names = [d.name for d in fleet.devices]
    may = may_take_turn
    nothing = dict.fromkeys(names, 0.0)
    # turn 1: each waits for the earlier devices it shares cpus with, not for later ones
    assert [may(plan, nothing, n, 1) for n in names] == [True, False, True, False, False, True, True, False]
    assert may(plan, {**nothing, "fast": 1}, "mid", 1) and not may(plan, {**nothing, "fast": 1}, "fast", 2)
    # fast's second pass waits for the first pass of every later device on cpu 0 (mid, phone, here, loop)
    firsts = {**nothing, "fast": 1, "mid": 1, "phone": 1, "here": 1}
    assert not may(plan, firsts, "fast", 2) and may(plan, {**firsts, "loop": 1}, "fast", 2)
    assert not may(plan, {**firsts, "loop": 1}, "mid", 2)  # mid's pass 2 follows fast's
    # a device with no more work (inf, or absent) is not waited for
    assert may(plan, {**firsts, "loop": math.inf}, "fast", 2)
    assert may(plan, {n: 1.0 for n in names if n != "loop"}, "fast", 2)
    # played out on four devices that share every cpu: pass 1 of each, then pass 2 of each, ...
    shared = plan_isolation(fleet.devices[:4], {})
    done = dict.fromkeys(["fast", "mid", "slow", "phone"], 0.0)
    order = []
    while min(done.values()) < 3:
        ready = [n for n in done if done[n] < 3 and may(shared, done, n, int(done[n]) + 1)]
        assert len(ready) == 1, (done, ready)  # never two at once
        done[ready[0]] += 1
        order.append(f"{ready[0]}{int(done[ready[0]])}")
    assert order == ["fast1", "mid1", "slow1", "phone1", "fast2", "mid2", "slow2", "phone2",
                     "fast3", "mid3", "slow3", "phone3"]  # fmt: skip


def test_pins_count_only_as_fleet_up_applied_them(tmp_path: Path) -> None:

    fleet = _fleet(PLANNED, tmp_path)
    assert set(pinned_cpus(fleet).values()) == {None}  # nothing is up
    state = emulate.FleetState(
        (
            emulate.DeviceState("fast", "ssh", "127.0.0.1:2201", cpuset="cgroup-v1", cpus="0"),
            emulate.DeviceState("slow", "ssh", "127.0.0.1:2203", cpuset="affinity", cpus="1"),
            emulate.DeviceState("mid", "ssh", "127.0.0.1:2202"),  # asked for, not applied
        )
    )
    emulate.save_state(fleet.state_dir, state)
    pins = pinned_cpus(fleet)
    assert (pins["fast"], pins["slow"], pins["mid"], pins["phone"]) == (frozenset({0}), frozenset({1}), None, None)
