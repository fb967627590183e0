"""Test helper: a real sshd on a free loopback port, with its client-side settings."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from devices import sshd
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
