"""The emulated aarch64 device: mounts in its own namespace, SSH into the arm64 tree, nothing left behind.

The tree is a fresh board (python3 and pip only), and these tests keep it so. The board
provisioned as a user does it, and its onnxruntime at work, are the real-device journey's
(`tests/fleetbench/test_real_device.py`).
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from devices import processes
from devices.connect import connect
from devices.emulation import emulate, qemu, rootfs
from devices.emulation.sshd import free_port
from devices.facts import collect_facts, probe_device
from devices.fleet import Fleet
from devices.fleetfile import load_fleet
from devices.transport import Transport
from tests.devices.conftest import require_tool

REPO = Path(__file__).resolve().parents[3]

# ---------------------------------------------------------------------------- pure parts


def test_mount_plan_overlays_the_tree_then_mounts_proc_sys_dev(tmp_path: Path) -> None:
    tree, layer = Path("/cache/bookworm-arm64"), tmp_path / "layer"
    plan = qemu.mount_plan(tree, layer)
    assert [m.target for m in plan] == [
        str(tree),
        f"{tree}/proc",
        f"{tree}/proc/cpuinfo",
        f"{tree}/sys",
        f"{tree}/dev",
        f"{tree}/dev/shm",
        f"{tree}/etc/resolv.conf",
        f"{tree}/etc/ssl/certs/ca-certificates.crt",
    ]
    overlay = plan[0]
    assert overlay.argv() == [
        "mount",
        "-t",
        "overlay",
        "overlay",
        str(tree),
        "-o",
        f"lowerdir={tree},upperdir={layer}/upper,workdir={layer}/work",
    ]
    assert plan[2].argv() == ["mount", "--bind", f"{layer}/cpuinfo", f"{tree}/proc/cpuinfo", "-o", "ro"]
    assert plan[4].argv() == ["mount", "--rbind", "/dev", f"{tree}/dev"]
    # the host's network files are bound read-only
    assert plan[6].argv() == ["mount", "--bind", "/etc/resolv.conf", f"{tree}/etc/resolv.conf", "-o", "ro"]
    # the build writes into the tree itself: no overlay; no host file when the host has none
    assert [m.fstype for m in qemu.mount_plan(tree, None, ())] == ["proc", "sysfs", "rbind", "tmpfs"]


def test_enter_argv_keeps_one_pid_through_unshare_and_exec(tmp_path: Path) -> None:
    argv = qemu.enter_argv(Path("/t"), tmp_path, ["/usr/sbin/sshd", "-D"], chroot=False)
    assert argv[:4] == ["unshare", "--mount", "--propagation", "private"]  # no --fork: unshare execs
    assert argv[-3:] == ["--", "/usr/sbin/sshd", "-D"] and "--chroot" not in argv
    assert "--chroot" in qemu.enter_argv(Path("/t"), None, ["true"], chroot=True)


def test_enter_refuses_to_mount_in_the_callers_namespace(tmp_path: Path) -> None:
    target = tmp_path / "tree"
    (target / "proc").mkdir(parents=True)
    done = subprocess.run(
        [sys.executable, "-m", "devices.emulation.qemu", "enter", str(target), "--", "true"],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
    )
    assert done.returncode == 2
    assert "refusing to mount outside a private mount namespace" in done.stdout
    assert qemu.host_mounts_under(target) == []


def test_enter_mounts_in_a_private_namespace_only(tmp_path: Path) -> None:
    require_tool("unshare")
    if os.geteuid() != 0:
        pytest.skip("mounting needs root")  # the aarch64 device tests fail under CI without root
    tree, layer = tmp_path / "tree", tmp_path / "layer"
    for sub in ("proc", "sys", "dev", "etc"):
        (tree / sub).mkdir(parents=True)
    script = "cat /proc/self/mountinfo; echo probe > " + str(tree / "written")
    done = subprocess.run(
        qemu.enter_argv(tree, layer, ["sh", "-c", script], chroot=False),
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    inside = qemu.host_mounts_under(tree, done.stdout)
    planned = qemu.mount_plan(tree, layer, qemu.host_network_files())
    assert {m.target for m in planned} <= set(inside)
    # writes went to the layer, the tree is untouched, and no mount outlived the command
    assert (layer / "upper" / "written").read_text() == "probe\n" and not (tree / "written").exists()
    assert qemu.host_mounts_under(tree) == []


def test_host_mounts_under_reads_mountinfo() -> None:
    info = (
        "22 1 0:21 / / rw - ext4 /dev/vda rw\n"
        "70 22 0:40 / /c/tree rw - overlay overlay rw\n"
        "71 70 0:5 / /c/tree/proc rw - proc proc rw\n"
        "72 22 0:41 / /c/tree-other rw - tmpfs tmpfs rw\n"
    )
    assert qemu.host_mounts_under(Path("/c/tree"), info) == ["/c/tree", "/c/tree/proc"]
    assert qemu.host_mounts_under(Path("/elsewhere"), info) == []


# ---------------------------------------------------------------------------- missing needs


def two_device_fleet(directory: Path) -> Path:
    text = (
        f"state_dir: {directory / 'state'}\n"
        "devices:\n"
        f"  - {{name: pi, kind: ssh, host: 127.0.0.1, port: {free_port()}, emulate: {{arch: aarch64}}}}\n"
        f"  - {{name: x86, kind: ssh, host: 127.0.0.1, port: {free_port()}, emulate: {{}}}}\n"
    )
    path = directory / "fleet.yaml"
    path.write_text(text)
    return path


def test_a_missing_need_is_one_line_and_the_rest_of_the_fleet_comes_up(
    sshd_path: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a PATH without qemu-aarch64-static (nothing is uninstalled)
    empty = tmp_path / "bin"
    empty.mkdir()
    real = rootfs.check_system
    hidden = rootfs.System(which=functools.partial(shutil.which, path=str(empty)), euid=os.geteuid())
    monkeypatch.setattr(rootfs, "check_system", lambda *a, **k: real(hidden, need_debootstrap=False))
    fleet = load_fleet(two_device_fleet(tmp_path))
    lines: list[str] = []
    try:
        result = emulate.up(fleet, say=lines.append)
        assert result.started == ("x86",)
        assert result.failed["pi"].startswith("qemu-aarch64-static is missing (Debian package qemu-user-static)")
        assert all("\n" not in reason for reason in result.failed.values())
        assert "pi: qemu-aarch64-static is missing (Debian package qemu-user-static)" in lines
        assert emulate.load_state(fleet.state_dir).get("pi") is None
        rows = {r.name: r for r in emulate.status(fleet, timeout=10)}
        assert rows["x86"].answers and not rows["pi"].up
    finally:
        assert emulate.down(fleet, say=lambda line: None) == []


# ---------------------------------------------------------------------------- the device


def fleet_file(directory: Path) -> Path:
    """The shipped arm64.yaml on free ports (the board's and the phone's) with its state in ``directory``."""
    text = (REPO / "devices" / "fleets" / "arm64.yaml").read_text()
    assert "port: 22301" in text and "serial: 127.0.0.1:25301" in text
    text = text.replace("port: 22301", f"port: {free_port()}").replace("127.0.0.1:25301", f"127.0.0.1:{free_port()}")
    path = directory / "arm64.yaml"
    path.write_text(f"state_dir: {directory / 'state'}\n" + text)
    return path


@pytest.fixture(scope="module")
def pi(arm64_tree: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    """The shipped aarch64 device, up for the module."""
    require_tool("sshd")
    fleet = load_fleet(fleet_file(tmp_path_factory.mktemp("arm64")))
    try:
        result = emulate.up(fleet, say=lambda line: None)
        assert result.ok, result.failed
        yield fleet
    finally:
        emulate.down(fleet, say=lambda line: None)


@pytest.fixture
def transport(pi: Fleet) -> Iterator[Transport]:
    t = connect(pi.device("pi"))
    yield t
    t.close()


def test_the_device_is_aarch64_over_ssh(transport: Transport) -> None:
    result = transport.run(["uname", "-m"], timeout=60)
    assert (result.rc, result.stdout.strip()) == (0, "aarch64")
    # the shell itself is the tree's arm64 binary, run by the kernel through qemu
    exe = transport.run(["sh", "-c", 'readlink "/proc/$$/exe"'], timeout=60).stdout
    assert "qemu" in exe
    osrel = transport.run(["cat", "/etc/os-release"], timeout=60).stdout
    assert "VERSION_CODENAME=bookworm" in osrel


#: Reads the AT_HWCAP word of the auxiliary vector (pairs of little-endian u64) and prints it.
PRINT_HWCAP = (
    "import struct; pairs = dict(struct.iter_unpack('<QQ', open('/proc/self/auxv', 'rb').read())); print(pairs[16])"
)
#: AT_HWCAP bits of an aarch64 kernel: a Cortex-A72 has FP, ASIMD and CRC32, and no SVE.
HWCAP_FP, HWCAP_ASIMD, HWCAP_CRC32, HWCAP_SVE = 1 << 0, 1 << 1, 1 << 7, 1 << 22


def test_the_device_emulates_the_processor_its_cpuinfo_names(transport: Transport) -> None:
    # what programs pick their kernels by: qemu's default CPU would offer SVE, a Pi 4's has none
    hwcap = int(transport.run(["python3", "-c", PRINT_HWCAP], timeout=120).stdout)
    assert hwcap & (HWCAP_FP | HWCAP_ASIMD | HWCAP_CRC32) == HWCAP_FP | HWCAP_ASIMD | HWCAP_CRC32
    assert not hwcap & HWCAP_SVE, hex(hwcap)
    cpuinfo = transport.run(["cat", "/proc/cpuinfo"], timeout=60).stdout
    assert "CPU part\t: 0xd08" in cpuinfo and "sve" not in cpuinfo  # 0xd08: Cortex-A72


def test_put_and_get_land_in_the_devices_own_layer(pi: Fleet, transport: Transport, tmp_path: Path) -> None:
    payload = os.urandom(70_000)
    (tmp_path / "blob").write_bytes(payload)
    transport.put(tmp_path / "blob", "~/.fleetbench/data/blob")
    transport.get("/root/.fleetbench/data/blob", tmp_path / "back")
    assert (tmp_path / "back").read_bytes() == payload
    listed = transport.run(["sh", "-c", "cd ~/.fleetbench/data && sha256sum blob"], timeout=60).stdout
    assert listed.split()[0] == __import__("hashlib").sha256(payload).hexdigest()
    # the write went to the device's overlay layer on the host, never into the shared tree
    layer = pi.state_dir / "pi" / "rootfs" / "upper"
    assert (layer / "root" / ".fleetbench" / "data" / "blob").read_bytes() == payload
    assert not (rootfs.tree_path() / "root" / ".fleetbench").exists()


def test_mounts_live_only_in_the_devices_namespace(pi: Fleet) -> None:
    state = emulate.load_state(pi.state_dir).get("pi")
    assert state is not None and state.arch == "aarch64" and state.mount_ns
    sshd = next(r for r in state.processes if r.role == "sshd")
    assert qemu.mount_namespace(sshd.pid) == state.mount_ns != qemu.mount_namespace(os.getpid())
    tree = rootfs.tree_path()
    inside = qemu.host_mounts_under(tree, Path(f"/proc/{sshd.pid}/mountinfo").read_text())
    assert set(state.mounts) <= set(inside) and str(tree) in inside and f"{tree}/proc" in inside
    assert qemu.host_mounts_under(tree) == [] and qemu.host_mounts_under(pi.state_dir) == []


def test_the_devices_qemu_processes_are_held_to_its_limits(pi: Fleet, transport: Transport) -> None:
    state = emulate.load_state(pi.state_dir).get("pi")
    assert state is not None and state.memory_mb == 2048  # arm64.yaml: a Pi 4's 2 GB
    if not state.memory.startswith("cgroup"):
        pytest.skip(f"memory held by {state.memory}, not a cgroup")
    unit = emulate.limits.unit_name("pi", pi.state_dir)
    seen = transport.run(["cat", "/proc/self/cgroup"], timeout=60).stdout  # read by the tree's cat, under qemu
    assert f"/{emulate.limits.GROUP}/{unit}" in seen


def test_facts_say_aarch64_and_emulated_isa(pi: Fleet, transport: Transport) -> None:
    probed = probe_device(transport, "python3", timeout=120)  # the probe alone tells
    assert probed.arch == "aarch64" and probed.emulated_isa is True
    # the board's own python3: as the tree was built, fresh
    assert (probed.python.split(".")[:2], probed.numpy, probed.onnxruntime) == (["3", "11"], "missing", "missing")
    assert probed.torch == "missing"
    result = collect_facts(pi, timeout=120)
    assert result.successes["pi"].emulated_isa is True and not result.failures
    rows = emulate.status(pi, timeout=30)
    assert rows[0].up and rows[0].answers and "aarch64 under qemu-user (emulated ISA)" in rows[0].detail


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def test_down_leaves_no_process_and_no_mount(pi: Fleet) -> None:
    state = emulate.load_state(pi.state_dir).get("pi")
    assert state is not None and state.mount_ns
    # a process that left sshd's tree (setsid, reparented) still dies with the namespace
    t = connect(pi.device("pi"))
    try:
        t.run(["sh", "-c", "setsid sleep 600 </dev/null >/dev/null 2>&1 &"], timeout=60)
    finally:
        t.close()
    members = qemu.processes_in(state.mount_ns)
    assert len(members) >= 2
    # Held open, the namespace outlives its processes: the kernel cannot give its number to a
    # namespace another worker's device makes meanwhile, so what carries the number after down is ours.
    held = os.open(f"/proc/{members[0]}/ns/mnt", os.O_RDONLY)
    try:
        assert os.readlink(f"/proc/self/fd/{held}") == state.mount_ns
        assert emulate.down(pi, say=lambda line: None) == []
        left = qemu.processes_in(state.mount_ns)
    finally:
        os.close(held)
    assert left == [], [(pid, processes.read_stat(pid), _cmdline(pid)) for pid in left]
    assert not any(processes.running(r) for r in state.processes)
    assert qemu.host_mounts_under(rootfs.tree_path()) == [] and qemu.host_mounts_under(pi.state_dir) == []
    assert emulate.load_state(pi.state_dir).devices == ()
    # the device's files stay in its layer, as a board keeps its disk
    assert (pi.state_dir / "pi" / "rootfs" / "upper" / "root" / ".fleetbench").is_dir()
