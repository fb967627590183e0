"""Ports for emulated devices: `devices.emulation.sshd.free_port` and `devices.emulation.sshd.distinct_port`."""

from __future__ import annotations

import socket

import pytest

from devices.emulation import sshd


def test_distinct_port_draws_again_when_the_source_repeats_itself() -> None:
    draws = iter([7000, 7000, 7001, 7000, 7001, 7002])
    taken: set[int] = {7001}
    assert sshd.distinct_port(lambda: next(draws), taken) == 7000
    assert sshd.distinct_port(lambda: next(draws), taken) == 7002  # 7001 was taken before, 7000 by the first call
    assert taken == {7000, 7001, 7002}
    with pytest.raises(OSError, match="after 3 tries"):
        sshd.distinct_port(lambda: 7000, taken, tries=3)


def test_free_port_never_repeats_a_port_the_kernel_hands_out_twice(monkeypatch: pytest.MonkeyPatch) -> None:
    kernel = iter([40100, 40100, 40101])
    monkeypatch.setattr(sshd, "_kernel_free_port", lambda: next(kernel))
    monkeypatch.setattr(sshd, "_handed_out", set())
    assert [sshd.free_port(), sshd.free_port()] == [40100, 40101]


def test_free_port_is_free_to_listen_on() -> None:
    port = sshd.free_port()
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", port))
        sock.listen()
    assert len({sshd.free_port() for _ in range(50)} | {port}) == 51
