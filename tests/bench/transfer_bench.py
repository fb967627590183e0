"""Transfer times of one FL payload over the real transports, with and without Nagle's algorithm.

Run from the repository root: ``python -m tests.bench.transfer_bench [--bytes N,N] [--repeats R]``.

A real sshd on a loopback port (SFTP put and get through `devices.ssh.SSHTransport`) and the
real adb server with the emulated phone (sync push and pull through `devices.adb.ADBTransport`).
Each transfer is timed with ``TCP_NODELAY`` as the transports set it and, alternately in the
same run, with Nagle's algorithm back on (the SSH socket's option cleared; for adb, adbutils'
own client). The median of each is printed with the ratio Nagle / no delay.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import adbutils

from devices import processes
from devices.adb import ADBTransport
from devices.emulation import emulate
from devices.emulation.adb_endpoint import AdbEndpoint
from devices.emulation.sshd import free_port
from devices.ssh import SSHTransport
from tests.devices.sshd_server import Server


def _timed(action: Callable[[], None]) -> float:
    start = time.perf_counter()
    action()
    return time.perf_counter() - start


def _report(name: str, fast: list[float], nagle: list[float]) -> None:
    quick, slow = statistics.median(fast), statistics.median(nagle)
    print(
        f"{name:<10} no delay {quick * 1e3:7.1f} ms (max {max(fast) * 1e3:6.1f})   "
        f"Nagle {slow * 1e3:7.1f} ms (max {max(nagle) * 1e3:6.1f})   Nagle / no delay {slow / quick:5.2f}"
    )


def bench_ssh(root: Path, payload: Path, repeats: int) -> None:
    """Time SFTP put and get of ``payload`` to a real sshd, alternating the socket option."""
    server = Server.launch(root / "sshd")
    try:
        transport: SSHTransport = server.transport()
        transport.connect()
        assert transport._client is not None
        sock = transport._client.get_transport().sock  # type: ignore[union-attr]
        remote = str(root / "remote.bin")
        times: dict[tuple[str, int], list[float]] = {}
        for _ in range(repeats):
            for nodelay in (1, 0):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, nodelay)
                times.setdefault(("put", nodelay), []).append(_timed(lambda: transport.put(payload, remote)))
                times.setdefault(("get", nodelay), []).append(
                    _timed(lambda: transport.get(remote, root / "back.bin"))
                )
        for what in ("put", "get"):
            _report(f"ssh {what}", times[(what, 1)], times[(what, 0)])
    finally:
        server.shutdown()


def bench_adb(root: Path, payload: Path, repeats: int) -> None:
    """Time sync push and pull of ``payload`` to the emulated phone through the real adb server."""
    port = free_port()
    server = emulate.start_adb_server(port, root / "adb-server.log")
    phone = AdbEndpoint(0, root / "phone").start()
    try:
        quick = ADBTransport(f"127.0.0.1:{phone.port}", server_port=port)
        nagle = ADBTransport(f"127.0.0.1:{phone.port}", server_port=port)
        nagle._client = lambda: adbutils.AdbClient(host="127.0.0.1", port=port)  # type: ignore[method-assign]
        remote = "/data/local/tmp/payload.bin"
        times: dict[tuple[str, bool], list[float]] = {}
        for _ in range(repeats):
            for no_delay, transport in ((True, quick), (False, nagle)):
                times.setdefault(("push", no_delay), []).append(_timed(lambda t=transport: t.put(payload, remote)))
                times.setdefault(("pull", no_delay), []).append(
                    _timed(lambda t=transport: t.get(remote, root / "back.bin"))
                )
        for what in ("push", "pull"):
            _report(f"adb {what}", times[(what, True)], times[(what, False)])
    finally:
        phone.stop()
        processes.stop([server])


def main(argv: list[str] | None = None) -> int:
    """Run both transports' benchmarks and print their medians and ratios."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--bytes", default="4096,105036", help="payload sizes (default: a small file and fjord-cnn's parameters)"
    )
    parser.add_argument("--repeats", type=int, default=30)
    args = parser.parse_args(argv)
    for size in (int(s) for s in args.bytes.split(",")):
        with tempfile.TemporaryDirectory(prefix="fleetbench-transfer-") as tmp:
            root = Path(tmp)
            payload = root / "payload.bin"
            payload.write_bytes(os.urandom(size))
            print(f"payload {size} bytes, {args.repeats} transfers each way per setting, loopback")
            bench_ssh(root, payload, args.repeats)
            bench_adb(root, payload, args.repeats)
    return 0


if __name__ == "__main__":
    from devices.processes import terminate_as_interrupt

    with terminate_as_interrupt():  # kill: stop the fleet it started, as Ctrl-C does
        raise SystemExit(main())
