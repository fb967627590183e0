"""Running an emulated aarch64 device: the arm64 tree behind the host's sshd, through qemu-user.

Design (decided here, with the reasons):

* **sshd with ChrootDirectory.** The device is the host's OpenSSH ``sshd``
  (`devices.emulation.sshd`, as for the other emulated SSH devices) whose config adds
  ``ChrootDirectory <tree>``. After authentication sshd chroots into the arm64 tree and
  runs the user's shell from there: every command is the tree's own aarch64 ``/bin/bash``,
  ``python3`` (and what provisioning installed into the device's workdir), executed by
  qemu-user through binfmt_misc (the ``F`` flag keeps the interpreter usable inside the
  chroot). ``Subsystem sftp internal-sftp``
  is already in the config, so SFTP needs no binary in the tree and ``put`` / ``get`` land
  inside it. This beats running one qemu process per command from a wrapper shell: the
  device is reached, authenticated, limited and stopped exactly like the other emulated
  devices, and nothing on the host side knows about aarch64.
* **A private mount namespace per device.** sshd is started as
  ``unshare --mount --propagation private python -m devices.emulation.qemu enter TREE --overlay DIR
  -- sshd ...``; ``enter`` makes the mounts (`mount_plan`) and then execs sshd, so the pid
  stays sshd's, its CPU/memory limits (`devices.emulation.limits`) cover every qemu process of the
  device, and the mounts exist only inside that namespace. They disappear when the
  device's last process ends, even when fleetbench itself is killed: no mount is ever
  left behind on the host, and ``fleet down`` only has to stop processes. ``down`` stops
  the recorded sshd tree, then every process still in the recorded namespace (one that
  daemonised out of the tree), and checks that no process is left there.
* **One overlay layer per device.** The cached tree (`devices.emulation.rootfs`) is the overlay's
  lower layer, mounted over the tree's own path inside the namespace; each device writes
  into ``<state_dir>/<name>/rootfs/upper``. Devices never see each other's files, the
  shared tree stays as built (its stamp stays true), and a device keeps its files across
  ``down`` / ``up`` as a real board keeps its disk. The chroot path is the tree's path,
  which sshd requires to be root-owned in every component (`devices.emulation.rootfs.chroot_problem`
  says so in one line when it is not).
* **Mounts inside**: the overlay, ``proc`` on /proc, ``sysfs`` on /sys, a recursive bind
  of the host's /dev on /dev with a fresh tmpfs on /dev/shm, and the host's
  /etc/resolv.conf and CA bundle bound read-only over the tree's (`HOST_NETWORK_FILES`):
  the device shares the host's network, as the other emulated devices do, so pip inside
  it resolves names and trusts what the host trusts (a network whose TLS proxy has its
  own CA works in the tree too).
* **An aarch64 ``/proc/cpuinfo``.** qemu-user (7.2, Debian bookworm's) passes the host's
  x86 ``/proc/cpuinfo`` through, and aarch64 programs that parse it crash on it:
  onnxruntime 1.28.0 to 1.32.0 (its cpuinfo library) die with SIGSEGV on import (1.26.0
  still imports; 1.27 not tried). Each device
  gets a Raspberry Pi 4's (Cortex-A72) ``/proc/cpuinfo`` with one entry per host CPU
  (`guest_cpuinfo`), written into its layer directory and bound read-only over
  ``/proc/cpuinfo``; facts still tell the emulation by the probe shell's qemu interpreter.
* **A Cortex-A72 processor** (`GUEST_CPU`, qemu's ``QEMU_CPU`` in the environment of
  everything the device runs: `TREE_ENV`, and every SSH session's). qemu's default CPU,
  ``max``, offers every feature it can emulate, SVE among them, in the auxiliary vector
  (``AT_HWCAP``) that programs read their CPU's features from. onnxruntime 1.32 then runs
  SVE kernels, which qemu emulates several times slower than the NEON ones a Pi 4 runs:
  a fjord-cnn training step at full width took 4 to 7 times as long. The processor the
  device emulates agrees with its ``/proc/cpuinfo``, as on the board.
* **Defaults of such a device** (`devices.fleetfile`): ``python`` is ``python3`` and
  ``workdir`` ``~/.fleetbench``, resolved by the device like a real board's, since host
  paths mean nothing inside the tree.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from devices import processes

#: The processor qemu emulates (``QEMU_CPU``): a Raspberry Pi 4's, as `guest_cpuinfo` lists it.
GUEST_CPU = "cortex-a72"

#: Environment of commands run chrooted in the tree (the host's pip settings name host paths).
TREE_ENV: dict[str, str] = {
    "QEMU_CPU": GUEST_CPU,
    "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "HOME": "/root",
    "LANG": "C.UTF-8",
    "PIP_DISABLE_PIP_VERSION_CHECK": "1",
    "PIP_ROOT_USER_ACTION": "ignore",
    # the host's CA bundle is bound over the tree's (`mount_plan`); pip's own certifi would ignore it
    "PIP_CERT": "/etc/ssl/certs/ca-certificates.crt",
}

#: The host's network configuration that a device shares: resolver and CA bundle (bound read-only).
HOST_NETWORK_FILES: tuple[Path, ...] = (Path("/etc/resolv.conf"), Path("/etc/ssl/certs/ca-certificates.crt"))


@dataclass(frozen=True)
class DeviceRoot:
    """Where an aarch64 device's root comes from.

    Attributes
    ----------
    tree : pathlib.Path
        The cached arm64 tree (`devices.emulation.rootfs.ensure_tree`), the overlay's lower layer
        and the sshd ``ChrootDirectory``.
    layer : pathlib.Path
        The device's own overlay directory (``upper/``, ``work/``).
    """

    tree: Path
    layer: Path


@dataclass(frozen=True)
class Mount:
    """One mount ``enter`` makes.

    Attributes
    ----------
    fstype : str
        ``overlay``, ``proc``, ``sysfs``, ``tmpfs`` or ``bind`` / ``rbind``.
    source : str
    target : str
        Absolute path (inside the tree).
    options : str
        ``-o`` options ("" for none).
    """

    fstype: str
    source: str
    target: str
    options: str = ""

    def argv(self) -> list[str]:
        """Return the ``mount`` command line."""
        if self.fstype in ("bind", "rbind"):
            base = ["mount", f"--{self.fstype}", self.source, self.target]
        else:
            base = ["mount", "-t", self.fstype, self.source, self.target]
        return base + (["-o", self.options] if self.options else [])


def overlay_dirs(layer: Path) -> tuple[Path, Path]:
    """Return the overlay's ``upper`` and ``work`` directories inside a device's layer directory."""
    return layer / "upper", layer / "work"


def host_network_files() -> list[Path]:
    """Return the `HOST_NETWORK_FILES` this host has."""
    return [path for path in HOST_NETWORK_FILES if path.is_file()]


#: One processor of a Raspberry Pi 4 (Cortex-A72) in an aarch64 kernel's ``/proc/cpuinfo``.
_CPUINFO_ENTRY = (
    "processor\t: {index}\nBogoMIPS\t: 108.00\nFeatures\t: fp asimd evtstrm crc32 cpuid\n"
    "CPU implementer\t: 0x41\nCPU architecture: 8\nCPU variant\t: 0x0\nCPU part\t: 0xd08\nCPU revision\t: 3\n\n"
)
#: Name of the guest ``/proc/cpuinfo`` inside a device's layer directory.
CPUINFO_NAME = "cpuinfo"


def guest_cpuinfo(count: int) -> str:
    """Return an aarch64 ``/proc/cpuinfo`` (a Raspberry Pi 4's Cortex-A72) with ``count`` processors (pure).

    Parameters
    ----------
    count : int
        Processors listed (the host's, so that it agrees with ``/sys/devices/system/cpu``).

    Returns
    -------
    str
    """
    return "".join(_CPUINFO_ENTRY.format(index=i) for i in range(max(1, count)))


def mount_plan(tree: Path, layer: Path | None, host_files: Sequence[Path] = HOST_NETWORK_FILES) -> list[Mount]:
    """Return the mounts that make ``tree`` a device root, in mounting order (pure).

    Parameters
    ----------
    tree : pathlib.Path
        The arm64 tree.
    layer : pathlib.Path or None
        The device's overlay directory (its writes go to ``layer/upper``); None mounts
        no overlay (the build writes into the tree itself).
    host_files : sequence of pathlib.Path
        Host files bound read-only over the same paths in the tree.

    Returns
    -------
    list of Mount
        With a layer, its `guest_cpuinfo` file is bound over ``/proc/cpuinfo``.
    """
    mounts = []
    if layer is not None:
        upper, work = overlay_dirs(layer)
        mounts.append(Mount("overlay", "overlay", str(tree), f"lowerdir={tree},upperdir={upper},workdir={work}"))
    mounts += [
        Mount("proc", "proc", str(tree / "proc")),
        *([Mount("bind", str(layer / CPUINFO_NAME), str(tree / "proc" / "cpuinfo"), "ro")] if layer else []),
        Mount("sysfs", "sysfs", str(tree / "sys")),
        Mount("rbind", "/dev", str(tree / "dev")),
        Mount("tmpfs", "tmpfs", str(tree / "dev" / "shm"), "mode=1777"),
    ]
    for path in host_files:
        mounts.append(Mount("bind", str(path), str(tree / path.relative_to("/")), "ro"))
    return mounts


def enter_argv(tree: Path, layer: Path | None, argv: Sequence[str], *, chroot: bool) -> list[str]:
    """Return the argv that runs ``argv`` with `mount_plan` mounted in a private mount namespace.

    Parameters
    ----------
    tree : pathlib.Path
    layer : pathlib.Path or None
        See `mount_plan`.
    argv : sequence of str
        The command (host paths unless ``chroot``).
    chroot : bool
        Chroot into the tree before executing ``argv`` (sshd chroots by itself).

    Returns
    -------
    list of str
        ``unshare --mount --propagation private python -m devices.emulation.qemu enter ...``; the
        pid of the process it starts stays that of ``argv`` (every step execs).
    """
    head = ["unshare", "--mount", "--propagation", "private", sys.executable, "-m", "devices.emulation.qemu", "enter"]
    head.append(str(tree))
    if layer is not None:
        head += ["--overlay", str(layer)]
    if chroot:
        head.append("--chroot")
    return [*head, "--", *argv]


def mount_namespace(pid: int) -> str | None:
    """Return the mount namespace of ``pid`` (``mnt:[4026531841]``), None when unreadable."""
    try:
        return os.readlink(f"/proc/{pid}/ns/mnt")
    except OSError:
        return None


def processes_in(namespace: str, exclude: int | None = None) -> list[int]:
    """Return the pids of the processes in mount namespace ``namespace``.

    Parameters
    ----------
    namespace : str
        As `mount_namespace` returns it.
    exclude : int, optional
        A pid left out of the answer.

    Returns
    -------
    list of int
    """
    found = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit() and int(entry.name) != exclude and mount_namespace(int(entry.name)) == namespace:
            found.append(int(entry.name))
    return found


def stop_namespace(namespace: str, grace: float = 3.0) -> list[int]:
    """SIGKILL every process left in the device's mount namespace and wait for them.

    Parameters
    ----------
    namespace : str
        The device's namespace (recorded at ``up``; never the host's, see `enter`).
    grace : float
        Seconds to wait for them to go.

    Returns
    -------
    list of int
        Pids still there after ``grace`` (empty when the namespace is gone). A process born
        while a sweep froze the others (its fork under way) is swept again, within ``grace``.
    """
    if namespace == mount_namespace(os.getpid()):
        return []  # never signal the processes of our own namespace
    deadline = time.monotonic() + grace
    while True:
        left = processes.stop((), also=lambda: processes_in(namespace), grace=0.0, kill_wait=grace)
        # A process whose fork was under way when the sweep froze the others appears only now.
        late = [pid for pid in processes_in(namespace) if _alive(pid)]
        if left or not late or time.monotonic() >= deadline:
            return left or late


def _alive(pid: int) -> bool:
    stat = processes.read_stat(pid)
    return stat is not None and stat.state not in "ZX"


def host_mounts_under(path: Path, mountinfo: str | None = None) -> list[str]:
    """Return the mount points at or below ``path`` in this process's mount namespace.

    Parameters
    ----------
    path : pathlib.Path
    mountinfo : str, optional
        Text of ``/proc/self/mountinfo`` (read when None).

    Returns
    -------
    list of str
    """
    text = mountinfo if mountinfo is not None else Path("/proc/self/mountinfo").read_text()
    root = str(path).rstrip("/")
    found = []
    for line in text.splitlines():
        fields = line.split()
        if len(fields) > 4:
            point = fields[4].replace("\\040", " ")
            if point == root or point.startswith(root + "/"):
                found.append(point)
    return found


# ---------------------------------------------------------------------------- enter


def _enter(tree: Path, layer: Path | None, chroot: bool, argv: list[str]) -> int:
    parent = mount_namespace(os.getppid())
    if parent is not None and parent == mount_namespace(os.getpid()):
        print("devices.emulation.qemu enter: refusing to mount outside a private mount namespace (run under unshare)")
        return 2
    if layer is not None:
        for directory in overlay_dirs(layer):
            directory.mkdir(parents=True, exist_ok=True)
            directory.chmod(0o755)
        (layer / CPUINFO_NAME).write_text(guest_cpuinfo(os.cpu_count() or 1))
    plan = mount_plan(tree, layer, host_network_files())
    for mount in plan:
        if mount.fstype == "bind":  # a file bound over the tree's: the target must be a file
            target = Path(mount.target)
            if target.is_symlink():
                target.unlink()
            if not target.exists():
                target.parent.mkdir(parents=True, exist_ok=True)
                target.touch()
        done = subprocess.run(mount.argv(), capture_output=True, text=True)
        if done.returncode != 0:
            print(f"devices.emulation.qemu enter: {' '.join(mount.argv())}: {done.stderr.strip()}", file=sys.stderr)
            return 1
    if chroot:
        os.chroot(tree)
        os.chdir("/")
        os.execvpe(argv[0], argv, {**TREE_ENV, **{k: v for k, v in os.environ.items() if k != "PYTHONPATH"}})
    os.execvp(argv[0], argv)
    return 1  # not reached


def main(argv: list[str] | None = None) -> int:
    """``python -m devices.emulation.qemu enter TREE [--overlay DIR] [--chroot] -- COMMAND...``."""
    args_in = sys.argv[1:] if argv is None else argv
    split = args_in.index("--") if "--" in args_in else len(args_in)
    parser = argparse.ArgumentParser(prog="python -m devices.emulation.qemu")
    sub = parser.add_subparsers(dest="command", required=True)
    enter = sub.add_parser("enter", help="mount a device root in this (private) mount namespace, then exec")
    enter.add_argument("tree", type=Path)
    enter.add_argument("--overlay", type=Path, default=None, help="device layer directory (upper/, work/)")
    enter.add_argument("--chroot", action="store_true", help="chroot into the tree before executing")
    args = parser.parse_args(args_in[:split])
    command = args_in[split + 1 :]
    if not command:
        parser.error("a command is required after --")
    return _enter(args.tree, args.overlay, args.chroot, command)


if __name__ == "__main__":
    raise SystemExit(main())
