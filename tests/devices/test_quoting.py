"""Hostile arguments and file names pass through every transport byte-exact; nothing runs."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from devices.local import LocalTransport
from devices.transport import Transport
from tests.devices.sshd_server import Server

HOSTILE = [
    "two words",
    "it's",
    'say "hi"',
    "a; touch PWNED",
    "$(touch PWNED)",
    "`touch PWNED`",
    "line1\nline2; touch PWNED",
    "*",
    "$HOME ${PATH} \\ | & > PWNED < /dev/null",
    "",
    "-n",
    "ünïcødé ✓",
]
NASTY_NAME = "a b 'c' \"d\" ;e $(touch PWNED) `touch PWNED` \nf *g"
ECHO_ARGV = ["python3", "-c", "import sys, json; print(json.dumps(sys.argv[1:]))"]


@pytest.fixture(scope="module")
def server(sshd_path: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    srv = Server.launch(tmp_path_factory.mktemp("sshd-quoting"))
    yield srv
    srv.shutdown()


@pytest.fixture(params=["local", "ssh"])
def transport(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Transport]:
    if request.param == "local":
        t: Transport = LocalTransport(workdir=tmp_path)
    else:
        t = request.getfixturevalue("server").transport()
    yield t
    t.close()


def _no_pwned(*dirs: Path) -> None:
    for d in dirs:
        assert not (d / "PWNED").exists(), d
        assert not list(d.rglob("PWNED")), d


def test_arguments_arrive_byte_exact(transport: Transport, tmp_path: Path) -> None:
    r = transport.run([*ECHO_ARGV, *HOSTILE, NASTY_NAME], timeout=20)
    assert r.ok, r.stderr
    assert json.loads(r.stdout) == [*HOSTILE, NASTY_NAME]
    _no_pwned(tmp_path, Path.home(), Path.cwd())


def test_hostile_file_name_round_trip(transport: Transport, tmp_path: Path) -> None:
    src = tmp_path / "src.txt"
    src.write_bytes(b"payload\n")
    sandbox = tmp_path / "sandbox"
    remote = str(sandbox / NASTY_NAME)
    transport.put(src, remote)
    assert os.listdir(sandbox) == [NASTY_NAME]
    listdir = "import os, sys, json; print(json.dumps(os.listdir(sys.argv[1])))"
    r = transport.run(["python3", "-c", listdir, str(sandbox)], timeout=20)
    assert json.loads(r.stdout) == [NASTY_NAME]
    r = transport.run(["cat", "--", remote], timeout=20)
    assert r.stdout == "payload\n"
    transport.get(remote, tmp_path / "back" / NASTY_NAME)
    assert (tmp_path / "back" / NASTY_NAME).read_bytes() == b"payload\n"
    _no_pwned(tmp_path, Path.home(), Path.cwd())
