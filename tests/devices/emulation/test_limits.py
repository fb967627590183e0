"""CPU and memory limits: detection on fake cgroup trees, and real slow-downs on this machine."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from devices.emulation import limits, presets

# ---------------------------------------------------------------------------- fake trees


def _touch(path: Path, text: str = "") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_parse_proc_cgroup_v1_and_v2_lines() -> None:
    text = "12:cpu,cpuacct:/user/a\n4:memory:/box/b\n1:name=systemd:/\n0::/unified/c\n"
    got = limits.parse_proc_cgroup(text)
    assert got["cpu"] == "/user/a" and got["cpuacct"] == "/user/a"
    assert got["memory"] == "/box/b"
    assert got[""] == "/unified/c"


def test_detect_cgroup_v1_layout(tmp_path: Path) -> None:
    _touch(tmp_path / "cpu" / "cpu.cfs_quota_us", "-1")
    _touch(tmp_path / "memory" / "memory.limit_in_bytes", "9223372036854771712")
    _touch(tmp_path / "memory" / "box" / "b" / "memory.limit_in_bytes", "1073741824")
    proc = "5:cpu:/\n4:memory:/box/b\n0::/\n"
    support = limits.detect(tmp_path, proc, writable=lambda p: True)
    assert (support.cpu_version, support.memory_version) == (1, 1)
    assert support.cpu_parent == tmp_path / "cpu"
    assert support.memory_parent == tmp_path / "memory" / "box" / "b"  # nested under our own cgroup
    p = limits.plan(support, "pi4-x", 0.5, 256)
    assert (p.cpu, p.memory) == ("cgroup-v1", "cgroup-v1")
    assert p.cgroup_dirs == (tmp_path / "cpu" / "fleetbench" / "pi4-x", tmp_path / "memory/box/b/fleetbench/pi4-x")
    writes = {path.name: value for path, value in p.writes}
    assert writes == {
        "cpu.cfs_period_us": str(limits.PERIOD_US),
        "cpu.cfs_quota_us": str(limits.PERIOD_US // 2),
        "memory.limit_in_bytes": str(256 * 1024 * 1024),
    }


def test_detect_cpu_cpuacct_comount(tmp_path: Path) -> None:
    _touch(tmp_path / "cpu,cpuacct" / "cpu.cfs_quota_us", "-1")
    support = limits.detect(tmp_path, "3:cpu,cpuacct:/\n", writable=lambda p: True)
    assert support.cpu_version == 1 and support.cpu_parent == tmp_path / "cpu,cpuacct"
    assert support.memory_version == 0 and "memory" in support.reason


def test_detect_pure_cgroup_v2_delegated_subtree(tmp_path: Path) -> None:
    _touch(tmp_path / "cgroup.controllers", "cpuset cpu io memory pids")
    own = tmp_path / "user.slice" / "me"
    _touch(own / "cgroup.controllers", "cpu memory pids")
    # an unprivileged user: only the delegated subtree is writable
    support = limits.detect(tmp_path, "0::/user.slice/me\n", writable=lambda p: p == own)
    assert (support.cpu_version, support.memory_version) == (2, 2)
    assert support.cpu_parent == own
    # root: the root cgroup (exempt from the no-internal-processes rule)
    assert limits.detect(tmp_path, "0::/user.slice/me\n", writable=lambda p: True).cpu_parent == tmp_path
    p = limits.plan(support, "phone", 1.5, 512)
    assert (p.cpu, p.memory) == ("cgroup-v2", "cgroup-v2")
    assert p.cgroup_dirs == (own / "fleetbench" / "phone",)
    writes = [(str(path.relative_to(own)), value) for path, value in p.writes]
    assert writes == [
        ("cgroup.subtree_control", "+cpu +memory"),
        ("fleetbench/cgroup.subtree_control", "+cpu +memory"),
        ("fleetbench/phone/cpu.max", f"{int(1.5 * limits.PERIOD_US)} {limits.PERIOD_US}"),
        ("fleetbench/phone/memory.max", str(512 * 1024 * 1024)),
    ]
    limits.apply_cgroups(p)  # on the fake tree: directories and files appear
    assert (own / "fleetbench" / "phone" / "cpu.max").read_text() == f"{int(1.5 * limits.PERIOD_US)} {limits.PERIOD_US}"
    assert (own / "cgroup.subtree_control").read_text() == "+cpu +memory"


def test_detect_hybrid_prefers_v1_per_controller(tmp_path: Path) -> None:
    _touch(tmp_path / "cpu" / "cpu.cfs_quota_us", "-1")
    _touch(tmp_path / "unified" / "cgroup.controllers", "memory")
    support = limits.detect(tmp_path, "2:cpu:/\n0::/\n", writable=lambda p: True)
    assert (support.cpu_version, support.memory_version) == (1, 2)
    assert support.memory_parent == tmp_path / "unified"


def test_detect_v2_without_delegated_cpu_falls_back(tmp_path: Path) -> None:
    _touch(tmp_path / "cgroup.controllers", "cpu memory")
    _touch(tmp_path / "u" / "cgroup.controllers", "pids")
    support = limits.detect(tmp_path, "0::/u\n", writable=lambda p: p != tmp_path)
    assert (support.cpu_version, support.memory_version) == (0, 0)
    assert "not delegated" in support.reason
    p = limits.plan(support, "pi3", 0.14, 1024)
    assert (p.cpu, p.memory) == ("duty-cycle", "rlimit") and p.cgroup_dirs == () and p.writes == ()


def test_detect_not_writable_falls_back(tmp_path: Path) -> None:
    _touch(tmp_path / "cpu" / "cpu.cfs_quota_us", "-1")
    _touch(tmp_path / "memory" / "memory.limit_in_bytes", "1")
    support = limits.detect(tmp_path, "2:cpu:/\n3:memory:/\n", writable=lambda p: False)
    assert support.cpu_version == 0 and "not writable" in support.reason
    assert limits.plan(support, "x", 0.5, None).cpu == "duty-cycle"
    assert limits.plan(support, "x", None, None) == limits.Plan("none", "none", None, None)


def test_cpu_lists_parse_and_format() -> None:
    assert limits.parse_cpu_list("0") == frozenset({0})
    assert limits.parse_cpu_list(" 0-2, 5 ,7-8") == frozenset({0, 1, 2, 5, 7, 8})
    assert limits.format_cpu_list({8, 0, 1, 2, 5, 7}) == "0-2,5,7-8"
    assert limits.format_cpu_list(limits.parse_cpu_list("3,1,2")) == "1-3"
    for bad in ("", "a", "1-", "3-1", "-1", "1,,2"):
        with pytest.raises(ValueError):
            limits.parse_cpu_list(bad)


def test_cpuset_plans_v1_v2_and_affinity(tmp_path: Path) -> None:
    _touch(tmp_path / "cpuset" / "cpuset.cpus", "0-3\n")
    _touch(tmp_path / "cpuset" / "cpuset.mems", "0\n")
    _touch(tmp_path / "cpu" / "cpu.cfs_quota_us", "-1")
    support = limits.detect(tmp_path, "5:cpu:/\n3:cpuset:/\n0::/\n", writable=lambda p: True)
    assert (support.cpuset_version, support.cpuset_parent) == (1, tmp_path / "cpuset")
    assert (support.cpuset_cpus, support.cpuset_mems) == ("0-3", "0")
    p = limits.plan(support, "slow", 0.14, None, frozenset({1}))
    assert (p.cpuset, p.cpus) == ("cgroup-v1", frozenset({1}))
    assert p.cgroup_dirs == (tmp_path / "cpu" / "fleetbench" / "slow", tmp_path / "cpuset" / "fleetbench" / "slow")
    root = tmp_path / "cpuset"
    cpuset_writes = [(str(path.relative_to(root)), v) for path, v in p.writes if path.is_relative_to(root)]
    # v1: the shared parent gets the whole machine's cpus and mems first, then the device its own
    assert cpuset_writes == [
        ("fleetbench/cpuset.cpus", "0-3"),
        ("fleetbench/cpuset.mems", "0"),
        ("fleetbench/slow/cpuset.cpus", "1"),
        ("fleetbench/slow/cpuset.mems", "0"),
    ]
    limits.apply_cgroups(p)
    assert (tmp_path / "cpuset" / "fleetbench" / "slow" / "cpuset.cpus").read_text() == "1"
    # cgroup v2: +cpuset on the way down, no mems
    _touch(tmp_path / "v2" / "cgroup.controllers", "cpuset cpu memory")
    v2 = limits.detect(tmp_path / "v2", "0::/\n", writable=lambda p: True)
    p2 = limits.plan(v2, "fast", None, None, frozenset({0, 1}))
    assert [(path.name, v) for path, v in p2.writes] == [
        ("cgroup.subtree_control", "+cpuset"),
        ("cgroup.subtree_control", "+cpuset"),
        ("cpuset.cpus", "0-1"),
    ]
    # nothing permitted: the processes' affinity
    p3 = limits.plan(limits.Support(), "fast", None, None, frozenset({0}))
    assert (p3.cpuset, p3.cgroup_dirs, p3.writes) == ("affinity", (), ())
    assert limits.plan(support, "x", None, None).cpuset == "none"


def test_pure_helpers() -> None:
    assert limits.cpu_knobs(2, 0.25, period_us=100_000) == {"cpu.max": "25000 100000"}
    assert limits.memory_knobs(1, 1) == {"memory.limit_in_bytes": "1048576"}
    assert limits.duty_schedule(0.25, 0.1) == pytest.approx((0.025, 0.075))
    assert limits.duty_schedule(3.0, 0.1) == pytest.approx((0.1, 0.0))
    with pytest.raises(ValueError):
        limits.duty_schedule(0.0)
    assert limits.netns_addresses(0) == ("10.213.0.1", "10.213.0.2")
    assert limits.netns_addresses(64) == ("10.213.1.1", "10.213.1.2")
    assert limits.free_subnet_index(["127.0.0.1", "10.213.0.1", "10.213.0.6"]) == 2
    assert limits.netem_args(20, 1000) == ["netem", "delay", "20ms", "rate", "1000kbit"]
    assert limits.unit_name("pi4", "/a") != limits.unit_name("pi4", "/b")


def test_preset_ratios_follow_benchmark_figures() -> None:
    shares = {name: float(e.cpu_share or 0.0) for name, e in presets.PRESETS.items()}
    assert shares["phone-midrange"] == presets.FASTEST_SHARE <= 2.0
    for name, src in presets.SOURCES.items():
        expected = src.geekbench5_multi / presets.SOURCES["phone-midrange"].geekbench5_multi
        assert shares[name] / shares["phone-midrange"] == pytest.approx(expected, rel=0.05)
    assert shares["pi3"] < shares["jetson-nano"] < shares["pi4"] < shares["phone-midrange"]
    resolved = presets.resolve(presets.Emulation(preset="pi4", memory_mb=100))
    assert resolved.cpu_share == shares["pi4"] and resolved.memory_mb == 100


# ---------------------------------------------------------------------------- real limits

#: Spins for ``argv[1]`` wall seconds and prints the CPU share it got: CPU seconds / wall seconds.
WORKLOAD = textwrap.dedent(
    """
    import sys, time
    seconds = float(sys.argv[1])
    wall, cpu = time.monotonic(), time.process_time()
    x = 0
    while time.monotonic() - wall < seconds:
        for i in range(10000):
            x += i * i
    print((time.process_time() - cpu) / (time.monotonic() - wall))
    """
)

#: Wall seconds a workload spins: fifteen 100 ms quota periods.
SPIN_SECONDS = 1.5


def _achieved_share(
    seconds: float, preexec: Callable[[], None] | None = None, share_duty: float | None = None
) -> float:
    proc = subprocess.Popen(
        [sys.executable, "-c", WORKLOAD, str(seconds)], stdout=subprocess.PIPE, text=True, preexec_fn=preexec
    )
    duty = limits.start_duty_cycle(proc.pid, share_duty) if share_duty else None
    try:
        out, _ = proc.communicate(timeout=60)
    finally:
        if duty is not None:
            duty.terminate()
            duty.wait(10)
    assert proc.returncode == 0
    return float(out)


def check_share(
    share: float, run_limited: Callable[[float], float], attempts: int = 5, *, duty_cycle: bool = False
) -> None:
    """Assert that ``run_limited`` gets ``share`` of a core, whatever else the machine runs.

    The limited workload never gets more than the share (the limit is enforced); it gets about
    the share unless an unlimited workload spinning beside it got less (the machine is busy):
    CFS then divides the cores among all runnable tasks, so the bar is 65 % of the smaller.
    A cgroup quota puts the workload in ``fleetbench/<device>``, and every device of every fleet
    up on the machine shares the weight of ``fleetbench``: the unlimited workload runs in a
    sibling cgroup without a quota, so that it competes as the limited one does.
    A duty cycle (SIGSTOP/SIGCONT) lets the workload run a ``share`` of the time, and in that
    time it gets what the machine leaves, as the unlimited one does: the bar is 60 % of their
    product (its supervisor's own wake-ups are late on a busy machine too).
    """
    beside = None if duty_cycle else _sibling_without_quota()
    seen = []
    try:
        for _ in range(attempts):
            free = subprocess.Popen(
                [sys.executable, "-c", WORKLOAD, str(SPIN_SECONDS)],
                stdout=subprocess.PIPE,
                text=True,
                preexec_fn=None if beside is None else limits.preexec(beside),
            )
            limited = run_limited(SPIN_SECONDS)
            out, _ = free.communicate(timeout=60)
            seen.append((round(limited, 3), round(float(out), 3)))
            assert limited <= share * 1.15 + 0.02, f"share {share}: the limited workload got {limited:.3f} of a core"
            floor = 0.6 * share * float(out) if duty_cycle else 0.65 * min(share, float(out))
            if limited >= floor:
                return
    finally:
        if beside is not None:
            assert limits.remove_cgroups(beside.cgroup_dirs) == []
    pytest.fail(f"share {share}: (limited, unlimited) CPU shares {seen}, expected the limited one near {share}")


def _sibling_without_quota() -> limits.Plan | None:
    """Return a cgroup beside the devices' whose quota is the whole machine, or ``None`` without cgroups."""
    p = limits.plan(limits.detect(), _unique("free"), float(os.cpu_count() or 1), None)
    if p.cpu not in ("cgroup-v1", "cgroup-v2") or _refused(p) is not None:
        return None
    return p


def _refused(p: limits.Plan) -> OSError | None:
    """Create ``p``'s cgroups; on refusal remove what was made and return why (None when created)."""
    try:
        limits.apply_cgroups(p)
    except OSError as exc:
        limits.remove_cgroups(p.cgroup_dirs)
        return exc
    return None


def _unique(tag: str) -> str:
    return f"t{os.getpid()}-{tag}"


def test_duty_cycle_slows_workload_by_share() -> None:
    share = 0.5
    check_share(share, lambda seconds: _achieved_share(seconds, share_duty=share), duty_cycle=True)


def test_duty_cycle_resumes_tree_on_exit() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    duty = limits.start_duty_cycle(proc.pid, 0.1, period=0.2)
    try:
        time.sleep(0.5)
        duty.terminate()
        duty.wait(10)
        time.sleep(0.05)
        state = Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        assert state != "T", "the tree must be left running"
    finally:
        proc.kill()
        proc.wait()


def _real_plan(
    name: str, share: float | None, memory_mb: int | None, cpus: frozenset[int] | None = None
) -> limits.Plan:
    support = limits.detect()
    p = limits.plan(support, name, share, memory_mb, cpus)
    wanted = [(share is not None, p.cpu), (bool(memory_mb), p.memory), (cpus is not None, p.cpuset)]
    if any(asked and not method.startswith("cgroup") for asked, method in wanted):
        pytest.skip(f"cgroups not permitted here: {support.reason}")
    refused = _refused(p)
    if refused is not None:
        pytest.skip(f"cgroups not permitted here: {refused}")
    return p


def test_cgroup_quota_slows_workload_by_share() -> None:
    share = 0.25
    p = _real_plan(_unique("cpu"), share, None)
    try:
        check_share(share, lambda seconds: _achieved_share(seconds, preexec=limits.preexec(p)))
    finally:
        assert limits.remove_cgroups(p.cgroup_dirs) == []
    assert not any(d.exists() for d in p.cgroup_dirs)


def test_cgroup_memory_limit_kills_over_allocation() -> None:
    p = _real_plan(_unique("mem"), None, 64)
    code = "b = bytearray(256 * 1024 * 1024)\nfor i in range(0, len(b), 4096): b[i] = 1\nprint('survived')"
    try:
        proc = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, preexec_fn=limits.preexec(p), timeout=60
        )
        assert proc.returncode != 0 and "survived" not in proc.stdout
        small = subprocess.run(
            [sys.executable, "-c", "b = bytearray(8 << 20); print('ok')"],
            capture_output=True,
            text=True,
            preexec_fn=limits.preexec(p),
            timeout=60,
        )
        assert small.stdout.strip() == "ok"
    finally:
        assert limits.remove_cgroups(p.cgroup_dirs) == []


_AFFINITY = "import os; print(sorted(os.sched_getaffinity(0)))"


def test_pinning_by_affinity_holds_the_child_and_its_children() -> None:
    p = limits.plan(limits.Support(), "pin", None, None, frozenset({0}))
    code = f"import subprocess, sys; subprocess.run([sys.executable, '-c', {_AFFINITY!r}])"
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, preexec_fn=limits.preexec(p), timeout=60
    )
    assert proc.stdout.strip() == "[0]"


def test_cgroup_cpuset_pins_the_child() -> None:
    available = sorted(os.sched_getaffinity(0))
    p = _real_plan(_unique("cpuset"), None, None, frozenset({available[-1]}))
    try:
        proc = subprocess.run(
            [sys.executable, "-c", _AFFINITY], capture_output=True, text=True, preexec_fn=limits.preexec(p), timeout=60
        )
        assert proc.stdout.strip() == f"[{available[-1]}]"
    finally:
        assert limits.remove_cgroups(p.cgroup_dirs) == []


def test_rlimit_as_makes_over_allocation_fail() -> None:
    p = limits.plan(limits.Support(), "rl", None, 300)
    assert p.memory == "rlimit"
    code = (
        "import sys\n"
        "ok = bytearray(32 << 20)\n"
        "try:\n    bytearray(600 << 20)\nexcept MemoryError:\n    print('MemoryError'); sys.exit(3)\n"
        "print('allocated')\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, preexec_fn=limits.preexec(p), timeout=60
    )
    assert proc.returncode == 3 and "MemoryError" in proc.stdout


def _stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    proc.wait(10)


def test_latency_hold_writes_a_zero_request_and_keeps_it_until_stopped(tmp_path: Path) -> None:
    request = tmp_path / "qos"
    request.write_bytes(b"")
    proc, reason = limits.start_latency_hold(dict(os.environ), request)
    assert proc is not None, reason
    try:
        assert request.read_bytes() == (0).to_bytes(4, sys.byteorder, signed=True)
        time.sleep(0.2)
        assert proc.poll() is None, "the request must stay held until the process is stopped"
        held = [os.readlink(f"/proc/{proc.pid}/fd/{fd}") for fd in os.listdir(f"/proc/{proc.pid}/fd")]
        assert str(request) in held
    finally:
        _stop(proc)


def test_latency_hold_that_cannot_hold_says_why(tmp_path: Path) -> None:
    missing, reason = limits.start_latency_hold(dict(os.environ), tmp_path / "absent")
    assert missing is None and reason == f"{tmp_path / 'absent'} does not exist"
    refused, reason = limits.start_latency_hold(dict(os.environ), tmp_path)  # a directory: open() fails in the child
    assert refused is None
    assert reason.startswith(f"holding {tmp_path} failed: ") and "IsADirectoryError" in reason


@pytest.mark.skipif(os.geteuid() != 0, reason="the CPU latency QoS device is root only")
def test_latency_hold_sets_the_kernels_cpu_latency_target_to_zero() -> None:
    if not limits.CPU_LATENCY_QOS.exists():
        pytest.skip(f"this kernel has no {limits.CPU_LATENCY_QOS}")

    def target() -> int:  # reading the device gives the aggregate of every holder's request
        return int.from_bytes(limits.CPU_LATENCY_QOS.read_bytes()[:4], sys.byteorder, signed=True)

    proc, reason = limits.start_latency_hold(dict(os.environ))
    assert proc is not None, reason
    try:
        assert target() == 0
    finally:
        _stop(proc)
    if not any(b"hold-latency" in _cmdline(pid) for pid in os.listdir("/proc") if pid.isdigit()):  # no other holder
        assert target() > 0, "the request must end with its process"


def _cmdline(pid: str) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:  # it exited meanwhile
        return b""
