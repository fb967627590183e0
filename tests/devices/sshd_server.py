"""Test helper: a real sshd on a free loopback port, with its client-side settings."""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import paramiko

from devices.emulation import sshd
from devices.processes import ProcessRecord
from devices.ssh import SSHTransport


@dataclass
class Server:
    """A running sshd instance and the known_hosts file that trusts it."""

    instance: sshd.SshdInstance
    known_hosts: Path
    listener: ProcessRecord | None = None
    transports: list[SSHTransport] = field(default_factory=list)

    @property
    def pid(self) -> int:
        """The listener's pid."""
        assert self.listener is not None, "sshd is not running"
        return self.listener.pid

    @classmethod
    def launch(cls, state_dir: Path, name: str = "dev") -> Server:
        instance = sshd.prepare(state_dir, name, sshd.free_port())
        known_hosts = state_dir / f"{name}_known_hosts"
        sshd.write_known_hosts(known_hosts, [sshd.known_hosts_line(instance)])
        server = cls(instance, known_hosts)
        server.listener = sshd.start(instance)
        return server

    def stop(self) -> None:
        """Stop the listener and its sessions (waits for them)."""
        if self.listener is not None:
            assert sshd.stop(self.listener) == []
            self.listener = None

    def restart(self) -> None:
        self.stop()
        self.listener = sshd.start(self.instance)

    def transport(self, **overrides: object) -> SSHTransport:
        params: dict[str, object] = {
            "host": "127.0.0.1",
            "port": self.instance.port,
            "key_file": self.instance.user_key,
            "known_hosts": self.known_hosts,
            "connect_timeout": 5.0,
        }
        params.update(overrides)
        transport = SSHTransport(**params)  # type: ignore[arg-type]
        self.transports.append(transport)
        return transport

    def shutdown(self) -> None:
        for transport in self.transports:
            transport.close()
        self.stop()


class LoginCutter:
    """A loopback SSH endpoint that ends the first ``cuts`` logins during authentication.

    Those connections meet a paramiko server holding ``server``'s host key: it completes the
    key exchange, then closes the connection when the client's first authentication request
    arrives, as a loaded or briefly stopped sshd can. Every later connection is relayed byte
    for byte to ``server``'s real sshd. ``known_hosts`` trusts the cutter's own port.
    """

    def __init__(self, server: Server, cuts: int, state_dir: Path) -> None:
        self.server, self.cuts_left, self.connections = server, cuts, 0
        self.host_key = paramiko.Ed25519Key.from_private_key_file(str(server.instance.host_key))
        self.listener = socket.create_server((sshd.LOOPBACK, 0))
        self.port = self.listener.getsockname()[1]
        self.known_hosts = state_dir / "cutter_known_hosts"
        line = sshd.known_hosts_line(server.instance).split(" ", 1)[1]
        sshd.write_known_hosts(self.known_hosts, [f"[{sshd.LOOPBACK}]:{self.port} {line}"])
        self._threads: list[threading.Thread] = []
        self._serve(self._accept)

    def _serve(self, target: Callable[..., None], *args: object) -> None:
        thread = threading.Thread(target=target, args=args, daemon=True)
        thread.start()
        self._threads.append(thread)

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return  # closed
            self.connections += 1
            if self.cuts_left > 0:
                self.cuts_left -= 1
                self._serve(self._cut, conn)
            else:
                upstream = socket.create_connection((sshd.LOOPBACK, self.server.instance.port))
                self._serve(_relay, conn, upstream)
                self._serve(_relay, upstream, conn)

    def _cut(self, conn: socket.socket) -> None:
        transport = paramiko.Transport(conn)
        transport.add_server_key(self.host_key)
        # the cut itself ends the server's side too: its reply to the login finds the socket closed
        with contextlib.suppress(EOFError, paramiko.SSHException):
            transport.start_server(server=_CutAtAuth(conn))
        transport.join(30)
        transport.close()

    def transport(self) -> SSHTransport:
        """A client of the cutter, trusting its port, with the server's user key."""
        return self.server.transport(port=self.port, known_hosts=self.known_hosts)

    def close(self) -> None:
        self.listener.close()


class _CutAtAuth(paramiko.ServerInterface):
    def __init__(self, conn: socket.socket) -> None:
        self.conn = conn

    def get_allowed_auths(self, username: str) -> str:
        return "publickey"

    def check_auth_publickey(self, username: str, key: paramiko.PKey) -> int:
        self.conn.shutdown(socket.SHUT_RDWR)  # the client is waiting for this answer
        return paramiko.AUTH_FAILED


def _relay(source: socket.socket, sink: socket.socket) -> None:
    try:
        while data := source.recv(1 << 16):
            sink.sendall(data)
    except OSError:
        pass
    finally:
        for end in (source, sink):
            try:
                end.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
