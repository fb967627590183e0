"""Emulated sshd instances: free ports, private keys, a quoted config, a loopback-only listener."""

from __future__ import annotations

import os
import socket
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from devices.emulation import sshd
from devices.errors import SshdError
from devices.ssh import SSHTransport
from tests.devices.conftest import listen_addresses


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


# ---------------------------------------------------------------------------- keys, config, address


@pytest.fixture
def permissive_umask() -> Iterator[None]:
    """Files are created world-readable unless their writer says otherwise."""
    old = os.umask(0)
    try:
        yield
    finally:
        os.umask(old)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.mark.usefixtures("permissive_umask")
def test_generated_private_keys_are_readable_by_their_owner_only(sshd_path: str, tmp_path: Path) -> None:
    key = sshd.generate_key(tmp_path / "keys" / "id_ed25519")
    assert mode(key) == 0o600
    assert key.with_name("id_ed25519.pub").read_text().startswith("ssh-ed25519 ")


@pytest.mark.usefixtures("permissive_umask")
def test_a_kept_private_key_is_made_private_again(sshd_path: str, tmp_path: Path) -> None:
    key = sshd.generate_key(tmp_path / "id_ed25519")
    before = key.read_bytes()
    key.chmod(0o644)
    assert sshd.generate_key(key) == key
    assert (key.read_bytes(), mode(key)) == (before, 0o600)


@pytest.mark.usefixtures("permissive_umask")
def test_an_instances_host_and_user_keys_are_private(sshd_path: str, tmp_path: Path) -> None:
    inst = sshd.prepare(tmp_path, "dev", sshd.free_port())
    assert (mode(inst.host_key), mode(inst.user_key)) == (0o600, 0o600)


def test_an_instance_listens_on_loopback_only(sshd_path: str, tmp_path: Path) -> None:
    inst = sshd.prepare(tmp_path, "dev", sshd.free_port())
    assert f"ListenAddress {sshd.LOOPBACK}\n" in inst.config.read_text()
    listener = sshd.start(inst)
    try:
        assert listen_addresses(inst.port) == {"127.0.0.1"}
    finally:
        assert sshd.stop(listener) == []


#: A state dir as a fleet file may name it: spaces, quotes, sshd's ``%`` tokens, shell metacharacters.
ODD_STATE_DIR = "state dir 'x' %h %% $(touch PWNED); `id` &"


def test_an_instance_under_a_state_dir_with_spaces_quotes_and_percent_signs_serves(
    sshd_path: str, tmp_path: Path
) -> None:
    state_dir = tmp_path / ODD_STATE_DIR
    inst = sshd.prepare(state_dir, "dev", sshd.free_port())
    known_hosts = tmp_path / "known_hosts"
    sshd.write_known_hosts(known_hosts, [sshd.known_hosts_line(inst)])
    listener = sshd.start(inst)
    try:
        with SSHTransport(host="127.0.0.1", port=inst.port, key_file=inst.user_key, known_hosts=known_hosts) as t:
            result = t.run(["echo", "in"], timeout=20)
        assert (result.rc, result.stdout) == (0, "in\n"), result.stderr
        assert int(inst.pid_file.read_text()) == listener.pid
    finally:
        assert sshd.stop(listener) == []
    assert not list(tmp_path.rglob("PWNED"))


@pytest.mark.parametrize(
    ("value", "tokens", "written"),
    [
        ("/a b/c", False, '"/a b/c"'),
        ("/a %h/c", False, '"/a %h/c"'),
        ("/a %h/c", True, '"/a %%h/c"'),
        ("/it's", True, '"/it\'s"'),
    ],
)
def test_config_values_are_quoted_and_tokens_escaped(value: str, tokens: bool, written: str) -> None:
    assert sshd.config_value(value, tokens=tokens) == written


@pytest.mark.parametrize("value", ['/a"b', "/a\\b", "/a\nListenAddress 0.0.0.0"])
def test_config_values_sshd_cannot_carry_are_refused(value: str) -> None:
    with pytest.raises(SshdError, match="cannot be written to sshd_config"):
        sshd.config_value(value)


@pytest.mark.parametrize("name", ["..", ".", "", "../x", "a/b"])
def test_an_instance_name_is_one_directory_name(name: str, tmp_path: Path) -> None:
    state_dir = tmp_path / "state"
    with pytest.raises(SshdError, match="not one directory name"):
        sshd.prepare(state_dir, name, sshd.free_port())
    assert not list(tmp_path.iterdir())
