"""Fixtures for tests that need real devices: system tools are required in CI, skipped elsewhere.

The fixtures are also offered to every test directory through ``tests/conftest.py``.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import sys
import time
from collections.abc import Callable, Collection, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from devices import processes
from devices.adb import ADBTransport
from devices.emulation import emulate
from devices.emulation.adb_endpoint import AdbEndpoint
from devices.emulation.sshd import free_port
from devices.fleet import Fleet
from tests.devices.sshd_server import Server


def require_tool(name: str) -> str:
    """Return the path of system tool ``name``; fail under CI, skip elsewhere, when it is missing.

    ``.ci/run`` installs every tool the tests need, so a missing one in CI is a broken
    CI setup and must not pass silently as a skip.
    """
    path = shutil.which(name) or (f"/usr/sbin/{name}" if os.access(f"/usr/sbin/{name}", os.X_OK) else None)
    if path is None:
        message = f"{name} is not installed (Debian: see .ci/run for the package)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return path


@pytest.fixture(scope="session")
def sshd_path() -> str:
    """Path of OpenSSH's sshd."""
    return require_tool("sshd")


@pytest.fixture(scope="module")
def sshd_server(sshd_path: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """A real sshd on a free loopback port for the module, stopped by pid at teardown."""
    srv = Server.launch(tmp_path_factory.mktemp("sshd"))
    yield srv
    srv.shutdown()


@pytest.fixture(scope="session")
def adb_path() -> str:
    """Path of the real adb client/server binary."""
    return require_tool("adb")


def cmdlines() -> dict[int, str]:
    """The command line of every process on this machine, arguments joined by spaces, by pid."""
    found = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                found[int(entry.name)] = entry.joinpath("cmdline").read_bytes().replace(b"\0", b" ").decode(
                    errors="replace"
                )
            except OSError:
                continue
    return found


def cmdline_running(marker: str) -> bool:
    """Whether any process on this machine has ``marker`` in its command line."""
    return any(marker in line for line in cmdlines().values())


def wait_for(predicate: Callable[[], bool], seconds: float = 10.0) -> None:
    """Poll ``predicate`` until it holds, for at most ``seconds``; fail the test when it never does.

    What another process does (a command started or killed over a transport) shows in ``/proc``
    a moment later, longer on a loaded host: waited for, not slept on.
    """
    deadline = time.monotonic() + seconds
    while not (reached := predicate()) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert reached, "condition not reached"


def copy_example_fleet(
    directory: Path,
    phone_python: str | None = sys.executable,
    fresh: bool = False,
    powered: Collection[str] | None = None,
) -> Path:
    """Write the shipped example fleet into ``directory`` on free ports, with its own state dir.

    ``phone_python`` gives the phone a working Python (as Termux would), so tests of
    campaign and FL mechanics run the ``ort`` backend on every device; None keeps the
    phone as shipped, without Python (it then runs from a pushed runtime bundle).
    ``fresh`` keeps the ``fresh`` board (the distribution's Python, nothing installed: it
    must be provisioned first); by default it is left out, as those tests are not about it.
    ``powered`` names the devices that keep their emulated power sensor (None: all that have
    one): a powered device's runner spends an idle window on every cell, which tests and benches
    that are not about energy need not wait for.
    """
    path = emulate.write_example_fleet(directory, free_port)
    document = yaml.safe_load(path.read_text())
    if not fresh:
        document["devices"] = [d for d in document["devices"] if d["name"] != "fresh"]
    if powered is not None:
        for device in document["devices"]:
            if device["name"] not in powered:
                device.get("emulate", {}).pop("power", None)
    if phone_python is not None:
        (phone,) = [d for d in document["devices"] if d["kind"] == "adb"]
        phone["python"] = phone_python
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return path


def kill_device(fleet: Fleet, name: str) -> None:
    """Crash an emulated device: SIGKILL its sshd and sessions (no SIGTERM first), and wait for them."""
    state = emulate.load_state(fleet.state_dir).get(name)
    assert state is not None, f"{name} is not up"
    sshd = next(rec for rec in state.processes if rec.role == "sshd")
    assert processes.stop([sshd], grace=0) == []


@contextlib.contextmanager
def signals_sent() -> Iterator[list[tuple[int, int]]]:
    """Record every ``(pid, signal)`` that `processes` sends inside the block (and still send it).

    Whether a stop needed SIGKILL is a count of signals, not a time: a loaded machine can
    make a clean SIGTERM stop take longer than the grace would, never send a SIGKILL.
    """
    sent: list[tuple[int, int]] = []
    original = processes.send

    def recording(pid: int, started: int, sig: int) -> bool:
        sent.append((pid, sig))
        return original(pid, started, sig)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(processes, "send", recording)
        yield sent


def sigkills(sent: list[tuple[int, int]]) -> list[int]:
    """The pids in ``sent`` that got SIGKILL."""
    return [pid for pid, sig in sent if sig == signal.SIGKILL]


def listen_addresses(port: int) -> set[str]:
    """Addresses sockets listen on at ``port``, from the kernel's tables (``0.0.0.0`` / ``::``: every interface).

    The real listening sockets, whatever a config file says.
    """
    found = set()
    for table, family in (("/proc/net/tcp", socket.AF_INET), ("/proc/net/tcp6", socket.AF_INET6)):
        try:
            rows = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            local, state = fields[1], fields[3]
            address, _, hex_port = local.rpartition(":")
            if state == "0A" and int(hex_port, 16) == port:  # 0A: TCP_LISTEN
                # the kernel prints the address as 32-bit words in host byte order
                words = (address[i : i + 8] for i in range(0, len(address), 8))
                raw = b"".join(int(word, 16).to_bytes(4, sys.byteorder) for word in words)
                found.add(socket.inet_ntop(family, raw))
    return found


def listening(port: int) -> bool:
    """Whether a socket listens on ``port`` (any address), from the kernel's tables.

    Not by connecting: a connection to a port nothing listens on can connect to itself
    when the kernel picks that same port as its source (TCP simultaneous open).
    """
    return bool(listen_addresses(port))


@pytest.fixture(scope="module")
def adb_server(adb_path: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, int]]:
    """A private adb server on its own port: ``(adb path, port)``; stopped by pid at teardown."""
    port = free_port()
    server = emulate.start_adb_server(port, tmp_path_factory.mktemp("adb") / "adb-server.log")
    try:
        yield adb_path, port
    finally:
        assert processes.stop([server]) == []
        # the server's socket can outlive its pid for a moment (a forked helper still holds it)
        deadline = time.monotonic() + 5.0
        while listening(port) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not listening(port), f"adb server still listening on {port} 5 s after it was stopped"


@pytest.fixture(scope="module")
def phone(adb_server: tuple[str, int], tmp_path_factory: pytest.TempPathFactory) -> Iterator[AdbEndpoint]:
    """The emulated phone on a free port, stopped (with nothing left running) at teardown."""
    endpoint = AdbEndpoint(0, tmp_path_factory.mktemp("phone")).start()
    yield endpoint
    endpoint.stop()
    assert endpoint.running() == []


@pytest.fixture(scope="module")
def adb_transport(adb_server: tuple[str, int], phone: AdbEndpoint) -> Iterator[ADBTransport]:
    """An ADBTransport to the emulated phone through the private adb server."""
    t = ADBTransport(f"127.0.0.1:{phone.port}", server_port=adb_server[1])
    yield t
    t.close()


@pytest.fixture(scope="module")
def example_fleet_file(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The shipped example fleet (fast / mid / slow SSH devices and the phone), up for the module.

    Its ports are moved to free ones and its state to a temporary directory; the phone is
    attached to a private adb server (its own ANDROID_ADB_SERVER_PORT), so a user's adb
    server is never touched; `emulate.down` stops it. Only ``fast`` keeps its emulated power
    sensor (the campaign tests check its energy); the others measure without the idle windows.
    """
    from devices.fleetfile import load_fleet

    require_tool("sshd")
    require_tool("adb")
    path = copy_example_fleet(tmp_path_factory.mktemp("fleet"), powered=("fast",))
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("ANDROID_ADB_SERVER_PORT", str(free_port()))
        fleet = load_fleet(path)
        assert [d.name for d in fleet.devices] == ["fast", "mid", "slow", "phone"]
        try:
            assert emulate.up(fleet, say=lambda line: None).ok
            yield path
        finally:
            emulate.down(fleet, say=lambda line: None)


def require_root(what: str) -> None:
    """Fail under CI, skip elsewhere, when not running as root (``what`` needs it)."""
    if os.geteuid() != 0:
        message = f"{what} needs root"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)


@pytest.fixture(scope="session")
def arm64_tree() -> Path:
    """The cached arm64 Debian userland (`devices.emulation.rootfs`), built once if missing (minutes).

    Built in the user's cache directory, as ``fleet up`` would, so later sessions reuse it.
    Under CI=true a missing need or a failed build fails; elsewhere a missing need skips.
    """
    import sys

    from devices.emulation import rootfs

    for tool in ("qemu-aarch64-static", "update-binfmts", "debootstrap", "unshare", "sshd"):
        require_tool(tool)
    require_root("the emulated aarch64 device")
    tree = rootfs.tree_path()
    missing = rootfs.check_system(need_debootstrap=rootfs.read_stamp(tree) is None)
    if missing:
        message = "; ".join(missing)
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    try:
        rootfs.ensure_binfmt(say=lambda line: None)
        return rootfs.ensure_tree(say=lambda line: print(line, file=sys.__stderr__, flush=True))
    except rootfs.RootfsError as exc:
        pytest.fail(f"cannot build the arm64 userland: {exc}")


def _built_bundle(abi: str) -> Any:
    """Build (or find in the user's cache) the runtime bundle of ``abi``; fail under CI, skip elsewhere.

    Building needs the network (apt-get download, pip download); a failure under CI=true
    fails the tests that use it, never skips them.
    """
    import sys

    from devices import bundle

    for tool in ("apt-get", "dpkg-deb"):
        require_tool(tool)
    try:
        return bundle.ensure_bundle(abi, say=lambda line: print(line, file=sys.__stderr__, flush=True))
    except bundle.BundleError as exc:
        if os.environ.get("CI"):
            pytest.fail(f"cannot build the {abi} runtime bundle: {exc}")
        pytest.skip(f"cannot build the {abi} runtime bundle: {exc}")


@pytest.fixture(scope="session")
def bundle_x86_64() -> Any:
    """The x86_64 runtime bundle (`devices.bundle`), built once into the user's cache."""
    return _built_bundle("x86_64")


@pytest.fixture(scope="session")
def bundle_arm64(arm64_tree: Path) -> Any:
    """The arm64-v8a runtime bundle, built once from the cached arm64 tree."""
    return _built_bundle("arm64-v8a")
