"""Fleet files: shipped fleets load, every malformed file names its file, line and field."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from devices.emulation.presets import resolve
from devices.errors import FleetFileError
from devices.fleet import EmulatedPower, Emulation
from devices.fleetfile import ADB_WORKDIR, SSH_CONFIG_ENV, describe_emulation, load_fleet, parse_fleet
from fleetbench.cli import main

REPO = Path(__file__).resolve().parents[2]
FLEETS = REPO / "devices" / "fleets"
SHIPPED = sorted(p.name for p in FLEETS.glob("*.yaml"))


@pytest.fixture(autouse=True)
def _isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Never read the user's ssh config or home; run from a scratch directory."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv(SSH_CONFIG_ENV, str(tmp_path / "no-ssh-config"))
    monkeypatch.chdir(tmp_path)
    return home


def write(tmp_path: Path, text: str, name: str = "fleet.yaml") -> Path:
    path = tmp_path / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def line_of(text: str, marker: str, occurrence: int = 1) -> int:
    """1-based line of the ``occurrence``-th line containing ``marker`` (computed from the test's text)."""
    hits = [i for i, line in enumerate(text.splitlines(), 1) if marker in line]
    assert len(hits) >= occurrence, f"{marker!r} not in test text"
    return hits[occurrence - 1]


def assert_error(path: Path, line: int, field: str, fragment: str) -> FleetFileError:
    with pytest.raises(FleetFileError) as info:
        load_fleet(path)
    error = info.value
    assert (error.path, error.line, error.field) == (str(path), line, field), str(error)
    assert str(error).startswith(f"{path}:{line}: {field}: ")
    assert fragment in error.message, str(error)
    assert "\n" not in str(error)
    return error


# ---------------------------------------------------------------------------- shipped fleets


@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_fleets_load_from_the_repository_root(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO)
    fleet = load_fleet(Path("devices/fleets") / name)
    assert fleet.devices
    assert fleet.state_dir == REPO / ".fleetbench" / Path(name).stem
    assert fleet.path == FLEETS / name


def test_all_three_example_fleets_ship() -> None:
    assert {"emulated.yaml", "local.yaml", "example-real.yaml"} <= set(SHIPPED)


def test_emulated_fleet_is_fast_mid_slow_and_a_phone(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO)
    fleet = load_fleet("devices/fleets/emulated.yaml")
    state = REPO / ".fleetbench" / "emulated"
    ssh = [d for d in fleet.devices if d.kind == "ssh"]
    assert [(d.name, d.host, d.port) for d in ssh] == [
        ("fast", "127.0.0.1", 22201),
        ("mid", "127.0.0.1", 22202),
        ("slow", "127.0.0.1", 22203),
        ("fresh", "127.0.0.1", 22204),
    ]
    assert [d.emulate.preset for d in ssh if d.emulate] == [None, "pi4", "pi3", None]
    shares = [resolve(d.emulate).cpu_share for d in ssh if d.emulate]
    assert shares[0] > shares[1] > shares[2], f"fast / mid / slow CPU shares out of order: {shares}"
    assert [d.tags[0] for d in ssh] == ["fast", "mid", "slow", "fast"]
    # a board as users have it: the distribution's Python, which fleetbench did not prepare
    assert fleet.device("fresh").python == "/usr/bin/python3" and "fresh" in fleet.device("fresh").tags
    for device in ssh:
        assert device.user is None  # the local user at connect time
        assert device.key_file == state / "id_ed25519"
        assert device.known_hosts == state / "known_hosts"
        assert not device.trust_on_first_use
        assert device.workdir == str(state / device.name / "work")
        assert device.python == (sys.executable if device.name != "fresh" else "/usr/bin/python3")
    # fast, mid and slow carry an emulated power sensor each, in a real format of their own
    powers = {d.name: d.emulate.power for d in ssh if d.emulate}
    assert powers == {
        "fast": EmulatedPower("ina3221-hwmon", 2.0, 3.0), "mid": EmulatedPower("rapl", 2.7, 1.6),
        "slow": EmulatedPower("power-supply", 1.4, 1.2), "fresh": None,
    }  # fmt: skip
    for device in ssh:
        assert device.power_root == (str(state / device.name / "power") if powers[device.name] else "/")
    phone = fleet.device("phone")
    assert (phone.kind, phone.serial, phone.workdir) == ("adb", "127.0.0.1:25555", ADB_WORKDIR)
    assert phone.python == "python3"  # its shell finds none: it runs from a pushed runtime bundle
    assert phone.emulate == Emulation(preset="phone-midrange", cpus="0")
    # the slowest device shares cpu 1 only with fresh, a quick one; the others take turns on cpu 0
    assert {d.name: d.emulate.cpus for d in fleet.devices if d.emulate} == {
        "fast": "0", "mid": "0", "slow": "1", "fresh": "1", "phone": "0"
    }  # fmt: skip
    with pytest.raises(dataclasses.FrozenInstanceError):
        phone.name = "other"  # type: ignore[misc]


def test_example_real_fleet_is_not_emulated(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO)
    fleet = load_fleet("devices/fleets/example-real.yaml")
    assert {d.kind for d in fleet.devices} == {"ssh", "adb"}
    assert all(d.emulate is None for d in fleet.devices)
    pi = fleet.device("pi4")
    assert (pi.host, pi.port, pi.workdir) == ("pi4", 22, "~/.fleetbench")  # no alias in an absent config
    jetson = fleet.device("jetson")
    assert jetson.key_file == Path(os.environ["HOME"]) / ".ssh" / "id_ed25519_jetson"


def test_a_local_device_takes_shares_memory_and_pins(tmp_path: Path) -> None:
    text = (
        "state_dir: st\n"
        "devices:\n"
        "  - name: slow\n"
        "    kind: local\n"
        "    emulate: {preset: pi3, cpus: '1'}\n"
        "  - name: plain\n"
        "    kind: local\n"
    )
    slow, plain = load_fleet(write(tmp_path, text)).devices
    assert slow.emulate == Emulation(preset="pi3", cpus="1")
    assert resolve(slow.emulate).cpu_share == 0.14 and resolve(slow.emulate).memory_mb == 1024
    assert slow.state_dir == tmp_path / "st"  # where `fleet up` records the limits it applied
    assert (slow.workdir, slow.python) == (str(tmp_path / "st" / "slow" / "work"), sys.executable)
    assert (plain.emulate, plain.state_dir) == (None, None)


def test_the_local_fleet_is_the_emulated_fleets_fast_mid_slow(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO)
    local = load_fleet("devices/fleets/emulated-local.yaml")
    emulated = load_fleet("devices/fleets/emulated.yaml")
    assert [d.name for d in local.devices] == ["fast", "mid", "slow"]
    for device in local.devices:
        twin = emulated.device(device.name)
        assert device.kind == "local"
        assert (device.emulate, device.threads, device.tags) == (twin.emulate, twin.threads, twin.tags)


# ---------------------------------------------------------------------------- malformed files

GOOD_DEVICE = """\
  - name: good
    kind: local
"""

# (yaml text, marker of the reported line (None: line 0), occurrence, field, message fragment)
MALFORMED = {
    "bad port": (
        "devices:\n" + GOOD_DEVICE + "  - name: pi\n    kind: ssh\n    host: pi\n    port: abc\n",
        "port: abc",
        1,
        "devices[1].port",
        "expected an integer in 1..65535, got 'abc'",
    ),
    "port out of range": (
        "devices:\n  - name: pi\n    kind: ssh\n    host: pi\n    port: 70000\n",
        "port:",
        1,
        "devices[0].port",
        "got 70000",
    ),
    "port null": (
        "devices:\n  - name: pi\n    kind: ssh\n    host: pi\n    port:\n",
        "port:",
        1,
        "devices[0].port",
        "got null",
    ),
    "threads zero": (
        "devices:\n  - name: a\n    kind: local\n    threads: 0\n",
        "threads",
        1,
        "devices[0].threads",
        "expected an integer >= 1",
    ),
    "threads text": (
        "devices:\n  - name: a\n    kind: local\n    threads: many\n",
        "threads",
        1,
        "devices[0].threads",
        "got 'many'",
    ),
    "threads float": (
        "devices:\n  - name: a\n    kind: local\n    threads: 2.5\n",
        "threads",
        1,
        "devices[0].threads",
        "got '2.5'",
    ),
    "trust not a bool": (
        "devices:\n  - name: pi\n    kind: ssh\n    host: pi\n    trust_on_first_use: maybe\n",
        "trust_on_first_use",
        1,
        "devices[0].trust_on_first_use",
        "expected true or false",
    ),
    "tags not a list": (
        "devices:\n  - name: a\n    kind: local\n    tags: fast\n",
        "tags",
        1,
        "devices[0].tags",
        "expected a list of strings",
    ),
    "tag not a string": (
        "devices:\n  - name: a\n    kind: local\n    tags:\n      - fast\n      - {tier: 1}\n",
        "tier",
        1,
        "devices[0].tags[1]",
        "expected a string, got a mapping",
    ),
    "host is a list": (
        "devices:\n  - name: pi\n    kind: ssh\n    host: [a, b]\n",
        "host",
        1,
        "devices[0].host",
        "got a list",
    ),
    "missing host": (
        "devices:\n" + GOOD_DEVICE + "  - name: pi\n    kind: ssh\n    port: 22\n",
        "name: pi",
        1,
        "devices[1].host",
        "missing (required for kind ssh)",
    ),
    "missing serial": (
        "devices:\n  - name: phone\n    kind: adb\n",
        "name: phone",
        1,
        "devices[0].serial",
        "required for kind adb",
    ),
    "missing kind": (
        "devices:\n" + GOOD_DEVICE + "  - name: b\n    host: x\n",
        "name: b",
        1,
        "devices[1].kind",
        "missing",
    ),
    "missing name": (
        "devices:\n  - kind: local\n",
        "kind: local",
        1,
        "devices[0].name",
        "missing",
    ),
    "duplicate name": (
        "devices:\n  - name: a\n    kind: local\n  - name: a\n    kind: local\n",
        "name: a",
        2,
        "devices[1].name",
        "duplicate name 'a' (first on line 2)",
    ),
    "bad name": (
        "devices:\n  - name: my pi\n    kind: local\n",
        "my pi",
        1,
        "devices[0].name",
        "got 'my pi'",
    ),
    "name climbing out of the state dir": (
        "devices:\n  - name: ../x\n    kind: local\n",
        "../x",
        1,
        "devices[0].name",
        "got '../x'",
    ),
    "name with shell metacharacters": (
        "devices:\n  - kind: local\n    name: a;rm -rf ~\n",
        "rm -rf",
        1,
        "devices[0].name",
        "got 'a;rm -rf ~'",
    ),
    "name with a command substitution": (
        "devices:\n  - name: $(touch PWNED)\n    kind: local\n",
        "PWNED",
        1,
        "devices[0].name",
        "got '$(touch PWNED)'",
    ),
    "name starting with a dot": (
        "devices:\n  - name: .hidden\n    kind: local\n",
        ".hidden",
        1,
        "devices[0].name",
        "not starting with '.' or '-'",
    ),
    "name of two dots": (
        "devices:\n  - name: '..'\n    kind: local\n",
        "name:",
        1,
        "devices[0].name",
        "got '..'",
    ),
    "name starting with a dash": (
        "devices:\n  - name: -rf\n    kind: local\n",
        "-rf",
        1,
        "devices[0].name",
        "got '-rf'",
    ),
    "name holding two dots": (
        "devices:\n  - name: a..b\n    kind: local\n",
        "a..b",
        1,
        "devices[0].name",
        "without '..'",
    ),
    "name with a newline": (
        'devices:\n  - kind: local\n    name: "a\\nb"\n',
        "name:",
        1,
        "devices[0].name",
        "got 'a\\nb'",
    ),
    "relative workdir climbing out": (
        "devices:\n  - name: a\n    kind: local\n    workdir: work/../../x\n",
        "workdir",
        1,
        "devices[0].workdir",
        "'..' components",
    ),
    "absolute workdir with dot-dot": (
        "devices:\n  - name: pi\n    kind: ssh\n    host: pi\n    workdir: /srv/fb/../../etc\n",
        "workdir",
        1,
        "devices[0].workdir",
        "'..' components",
    ),
    "home workdir with dot-dot": (
        "devices:\n  - name: p\n    kind: adb\n    serial: X\n    workdir: ~/..\n",
        "workdir",
        1,
        "devices[0].workdir",
        "'..' components",
    ),
    "workdir with a newline": (
        'devices:\n  - name: a\n    kind: local\n    workdir: "w\\n; touch PWNED"\n',
        "workdir",
        1,
        "devices[0].workdir",
        "control characters",
    ),
    "workdir with a colon": (
        "devices:\n  - name: pi\n    kind: ssh\n    host: pi\n    workdir: /srv/a:b\n",
        "workdir",
        1,
        "devices[0].workdir",
        "PYTHONPATH",
    ),
    "empty workdir": (
        "devices:\n  - name: a\n    kind: local\n    workdir: ''\n",
        "workdir",
        1,
        "devices[0].workdir",
        "expected a directory",
    ),
    "serial with a newline": (
        'devices:\n  - name: p\n    kind: adb\n    serial: "R58\\n; reboot"\n',
        "serial",
        1,
        "devices[0].serial",
        "control characters",
    ),
    "empty serial": (
        "devices:\n  - name: p\n    kind: adb\n    serial: ''\n",
        "serial",
        1,
        "devices[0].serial",
        "expected an ADB serial",
    ),
    "emulated sshd on every interface": (
        "devices:\n  - name: e\n    kind: ssh\n    host: 0.0.0.0\n    port: 2222\n    emulate: {}\n",
        "host",
        1,
        "devices[0].host",
        "loopback only",
    ),
    "emulated sshd on a network address": (
        "devices:\n  - name: e\n    kind: ssh\n    host: 192.168.1.5\n    emulate: {preset: pi4}\n",
        "host",
        1,
        "devices[0].host",
        "loopback only",
    ),
    "emulated phone on every interface": (
        "devices:\n  - name: p\n    kind: adb\n    serial: 0.0.0.0:25555\n    emulate: {}\n",
        "serial",
        1,
        "devices[0].serial",
        "listens on 127.0.0.1 only",
    ),
    "bad kind": (
        "devices:\n  - name: a\n    kind: sshh\n    host: x\n",
        "sshh",
        1,
        "devices[0].kind",
        "did you mean 'ssh'?",
    ),
    "unknown device key": (
        "devices:\n  - name: pi\n    kind: ssh\n    host: pi\n    prot: 22\n",
        "prot",
        1,
        "devices[0].prot",
        "unknown key; did you mean 'port'?",
    ),
    "unknown top-level key": (
        "device:\n  - name: a\n    kind: local\n",
        "device:",
        1,
        "device",
        "did you mean 'devices'?",
    ),
    "unknown key without a close match": (
        "devices:\n  - name: a\n    kind: local\n    zzzz: 1\n",
        "zzzz",
        1,
        "devices[0].zzzz",
        "valid keys: name, kind",
    ),
    "unknown emulate key": (
        "devices:\n  - name: e\n    kind: ssh\n    host: 127.0.0.1\n    port: 2222\n    emulate:\n"
        "      preset: pi4\n      cpu_shares: 0.5\n",
        "cpu_shares",
        1,
        "devices[0].emulate.cpu_shares",
        "did you mean 'cpu_share'?",
    ),
    "unknown preset": (
        "devices:\n  - name: e\n    kind: ssh\n    host: 127.0.0.1\n    emulate: {preset: pi5}\n",
        "pi5",
        1,
        "devices[0].emulate.preset",
        "did you mean 'pi4'?",
    ),
    "cpu share zero": (
        "devices:\n  - name: e\n    kind: ssh\n    host: 127.0.0.1\n    emulate:\n      cpu_share: 0\n",
        "cpu_share",
        1,
        "devices[0].emulate.cpu_share",
        "expected a number > 0",
    ),
    "memory not an integer": (
        "devices:\n  - name: e\n    kind: ssh\n    host: 127.0.0.1\n    emulate:\n      memory_mb: 1.5\n",
        "memory_mb",
        1,
        "devices[0].emulate.memory_mb",
        "expected an integer >= 1",
    ),
    "negative delay": (
        "devices:\n  - name: e\n    kind: ssh\n    host: 127.0.0.1\n    emulate:\n      delay_ms: -1\n",
        "delay_ms",
        1,
        "devices[0].emulate.delay_ms",
        "expected a number >= 0",
    ),
    "rate zero": (
        "devices:\n  - name: e\n    kind: ssh\n    host: 127.0.0.1\n    emulate:\n      rate_kbit: 0\n",
        "rate_kbit",
        1,
        "devices[0].emulate.rate_kbit",
        "expected an integer >= 1",
    ),
    "emulate not a mapping": (
        "devices:\n  - name: e\n    kind: ssh\n    host: 127.0.0.1\n    emulate: pi4\n",
        "emulate",
        1,
        "devices[0].emulate",
        "expected a mapping",
    ),
    "serial on an ssh device": (
        "devices:\n  - name: pi\n    kind: ssh\n    host: pi\n    serial: abc\n",
        "serial",
        1,
        "devices[0].serial",
        "does not apply to ssh devices (only to adb)",
    ),
    "host on a local device": (
        "devices:\n  - name: a\n    kind: local\n    host: x\n",
        "host",
        1,
        "devices[0].host",
        "does not apply to local devices",
    ),
    "network delay on a local device": (
        "devices:\n  - name: a\n    kind: local\n    emulate:\n      preset: pi4\n      delay_ms: 20\n",
        "delay_ms",
        1,
        "devices[0].emulate.delay_ms",
        "does not apply to local devices (their commands use this machine's own network",
    ),
    "network rate on a local device": (
        "devices:\n  - name: a\n    kind: local\n    emulate: {rate_kbit: 1000}\n",
        "rate_kbit",
        1,
        "devices[0].emulate.rate_kbit",
        "network shaping needs an ssh device",
    ),
    "arch on a local device": (
        "devices:\n  - name: a\n    kind: local\n    emulate:\n      arch: aarch64\n",
        "arch",
        1,
        "devices[0].emulate.arch",
        "does not apply to local devices (they run this machine's own architecture",
    ),
    "bad share on a local device": (
        "devices:\n  - name: a\n    kind: local\n    emulate:\n      cpu_share: 0\n",
        "cpu_share",
        1,
        "devices[0].emulate.cpu_share",
        "expected a number > 0",
    ),
    "typo in a local device's emulate block": (
        "devices:\n  - name: a\n    kind: local\n    emulate:\n      memory: 512\n",
        "memory",
        1,
        "devices[0].emulate.memory",
        "memory_mb",
    ),
    "emulated phone without host:port": (
        "devices:\n  - name: p\n    kind: adb\n    serial: R58M123\n    emulate: {preset: phone-midrange}\n",
        "serial",
        1,
        "devices[0].serial",
        "HOST:PORT",
    ),
    "two emulated devices on one port": (
        "devices:\n  - name: a\n    kind: ssh\n    host: 127.0.0.1\n    port: 22201\n    emulate: {}\n"
        "  - name: b\n    kind: adb\n    serial: 127.0.0.1:22201\n    emulate: {}\n",
        "name: b",
        1,
        "devices[1].serial",
        "127.0.0.1:22201 is already used by emulated device 'a' (line 2)",
    ),
    "duplicate key": (
        "devices:\n  - name: a\n    kind: local\n    threads: 1\n    threads: 2\n",
        "threads",
        2,
        "devices[0].threads",
        "duplicate key (first on line 4)",
    ),
    "non-string key": (
        "devices:\n  - name: a\n    kind: local\n    [x]: 1\n",
        "[x]",
        1,
        "devices[0]",
        "keys must be names",
    ),
    "yaml syntax error": (
        "devices:\n  - name: a\n    kind: local: x\n",
        "kind: local: x",
        1,
        "yaml",
        "invalid YAML: mapping values are not allowed here",
    ),
    "two yaml documents": (
        "devices: []\n---\ndevices: []\n",
        "---",
        1,
        "yaml",
        "expected a single document",
    ),
    "top level is a list": (
        "- name: a\n  kind: local\n",
        "- name: a",
        1,
        "(top level)",
        "expected a mapping, got a list",
    ),
    "devices missing": (
        "state_dir: here\n",
        "state_dir",
        1,
        "devices",
        "missing",
    ),
    "devices empty": (
        "devices: []\n",
        "devices",
        1,
        "devices",
        "at least one device",
    ),
    "device not a mapping": (
        "devices:\n  - laptop\n",
        "laptop",
        1,
        "devices[0]",
        "expected a mapping, got 'laptop'",
    ),
    "cpus not a cpu list": (
        "devices:\n  - name: e\n    kind: ssh\n    host: h\n    emulate: {cpus: 'first'}\n",
        "cpus",
        1,
        "devices[0].emulate.cpus",
        "expected a cpu list",
    ),
    "cpus range backwards": (
        "devices:\n  - name: e\n    kind: ssh\n    host: h\n    emulate:\n      cpus: 3-1\n",
        "cpus",
        1,
        "devices[0].emulate.cpus",
        "ends below its start",
    ),
    "power format unknown": (
        "devices:\n  - name: e\n    kind: local\n    emulate:\n"
        "      power: {format: ina3221, idle_w: 2, busy_core_w: 1}\n",
        "power",
        1,
        "devices[0].emulate.power.format",
        "expected one of ina3221-hwmon | power-supply | rapl, got 'ina3221' (did you mean 'ina3221-hwmon'?)",
    ),
    "power idle_w missing": (
        "devices:\n  - name: e\n    kind: local\n    emulate:\n      power: {format: rapl, busy_core_w: 1}\n",
        "power",
        1,
        "devices[0].emulate.power.idle_w",
        "missing (an emulated power sensor needs format, idle_w and busy_core_w)",
    ),
    "power busy_core_w negative": (
        "devices:\n  - name: e\n    kind: local\n    emulate:\n"
        "      power: {format: rapl, idle_w: 2, busy_core_w: -1}\n",
        "power",
        1,
        "devices[0].emulate.power.busy_core_w",
        "expected a number >= 0, got -1",
    ),
    "power unknown key": (
        "devices:\n  - name: e\n    kind: local\n    emulate:\n"
        "      power: {format: rapl, idle_w: 2, busy_core_w: 1, busy_w: 3}\n",
        "power",
        1,
        "devices[0].emulate.power.busy_w",
        "unknown key; did you mean 'busy_core_w'?",
    ),
    "power on an aarch64 ssh device": (
        "devices:\n  - name: e\n    kind: ssh\n    host: 127.0.0.1\n    emulate:\n      arch: aarch64\n"
        "      power: {format: rapl, idle_w: 2, busy_core_w: 1}\n",
        "power",
        1,
        "devices[0].emulate.power",
        "does not apply to an aarch64 ssh device",
    ),
    "empty file": ("", None, 1, "file", "empty fleet file"),
    "comments only": ("# nothing here\n", None, 1, "file", "empty fleet file"),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_fleet_names_file_line_and_field(case: str, tmp_path: Path) -> None:
    text, marker, occurrence, field, fragment = MALFORMED[case]
    path = write(tmp_path, text)
    line = 0 if marker is None else line_of(text, marker, occurrence)
    assert_error(path, line, field, fragment)


#: A workdir a user may well write: spaces, quotes and shell metacharacters, kept as data.
ODD_WORKDIR = '/srv/fleet bench/it\'s "here"; $(touch PWNED) `id` | & *'
#: A serial with a space (adb serials are free text, e.g. ``usb:1-1 2``).
ODD_SERIAL = "usb:1-1 2 'x'"


def test_workdirs_and_serials_with_spaces_quotes_and_metacharacters_are_kept_verbatim(tmp_path: Path) -> None:
    text = (
        "devices:\n"
        f"  - {{name: pi, kind: ssh, host: pi, workdir: {json.dumps(ODD_WORKDIR)}}}\n"
        f"  - {{name: phone, kind: adb, serial: {json.dumps(ODD_SERIAL)}, workdir: '/data/local/tmp/a b'}}\n"
        "  - {name: loc, kind: local, workdir: 'rel dir/it''s'}\n"
    )
    fleet = load_fleet(write(tmp_path, text))
    assert fleet.device("pi").workdir == ODD_WORKDIR
    assert (fleet.device("phone").serial, fleet.device("phone").workdir) == (ODD_SERIAL, "/data/local/tmp/a b")
    assert fleet.device("loc").workdir == "rel dir/it's"
    assert not list(tmp_path.rglob("PWNED"))


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.2", "::1", "localhost"])
def test_emulated_ssh_devices_listen_on_any_loopback_address(host: str, tmp_path: Path) -> None:
    text = f"devices:\n  - {{name: e, kind: ssh, host: '{host}', port: 2222, emulate: {{}}}}\n"
    assert load_fleet(write(tmp_path, text)).device("e").host == host


def _inside(path: Path, directory: Path) -> bool:
    resolved, root = Path(os.path.normpath(path)), Path(os.path.normpath(directory))
    return resolved != root and root in resolved.parents


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.text(alphabet="ab.-_/ ;$()`|&\n~*'\"\\", min_size=1, max_size=8))
def test_a_device_name_is_refused_or_stays_inside_the_state_dir(tmp_path: Path, name: str) -> None:
    text = f"state_dir: states\ndevices:\n  - kind: local\n    name: {json.dumps(name)}\n"
    try:
        fleet = parse_fleet(text, "fleet.yaml", cwd=tmp_path)
    except FleetFileError as exc:
        assert (exc.line, exc.field) == (4, "devices[0].name"), str(exc)
        assert str(exc).startswith("fleet.yaml:4: devices[0].name: ") and "\n" not in str(exc)
        return
    device = fleet.devices[0]
    assert device.name == name
    assert _inside(fleet.state_dir / device.name, fleet.state_dir)
    assert Path(device.workdir) == fleet.state_dir / name / "work" and _inside(Path(device.workdir), fleet.state_dir)


def test_missing_file_is_line_zero(tmp_path: Path) -> None:
    assert_error(tmp_path / "absent.yaml", 0, "file", "no such file")


def test_directory_and_binary_files_are_line_zero(tmp_path: Path) -> None:
    assert_error(tmp_path, 0, "file", "cannot read")
    binary = tmp_path / "binary.yaml"
    binary.write_bytes(b"devices:\n  - name: \xff\xfe\n")
    assert_error(binary, 0, "file", "not UTF-8")


def test_the_error_line_is_the_line_of_the_value_not_the_device(tmp_path: Path) -> None:
    text = "# a comment\n\ndevices:\n  - name: a\n    kind: local\n\n  - name: pi\n    kind: ssh\n    host: pi\n"
    text += "    port: abc\n"
    assert line_of(text, "port: abc") == 10
    assert_error(write(tmp_path, text), 10, "devices[1].port", "'abc'")


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.text(alphabet="devics:-_ nmakhostpr{}[]'\"\t\n0123456789!&*<>|#,.", max_size=120))
def test_arbitrary_text_gives_a_fleet_or_a_fleet_file_error(text: str) -> None:
    try:
        parse_fleet(text, "fuzz.yaml", cwd="/tmp")
    except FleetFileError as error:
        assert str(error).startswith(f"fuzz.yaml:{error.line}: ")
        assert "\n" not in str(error)


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_truncated_shipped_fleets_never_raise_anything_else(data: st.DataObject) -> None:
    text = (FLEETS / "emulated.yaml").read_text()
    cut = data.draw(st.integers(0, len(text)))
    drop = data.draw(st.integers(0, 20))
    try:
        parse_fleet(text[:cut] + text[cut + drop :], "cut.yaml", cwd="/tmp")
    except FleetFileError:
        pass


# ---------------------------------------------------------------------------- values and defaults


def test_values_defaults_and_yaml_merge_keys(tmp_path: Path) -> None:
    text = """\
devices:
  - &pi
    name: pi-a
    kind: ssh
    host: 10.0.0.1
    threads: 4
    tags: [fast, 2024]
    workdir: ~/bench
    trust_on_first_use: yes
  - <<: *pi
    name: pi-b
    host: 10.0.0.2
    port: 0x16
  - name: phone
    kind: adb
    serial: 0123456789
  - name: here
    kind: local
    workdir: ~/work
"""
    fleet = load_fleet(write(tmp_path, text))
    a, b, phone, here = fleet.devices
    assert (a.host, a.port, a.user, a.threads, a.tags, a.workdir) == (
        "10.0.0.1",
        22,
        None,
        4,
        ("fast", "2024"),
        "~/bench",
    )
    assert a.trust_on_first_use and a.key_file is None and a.known_hosts is None and a.python == "python3"
    assert (b.name, b.host, b.port, b.threads, b.tags) == ("pi-b", "10.0.0.2", 22, 4, ("fast", "2024"))
    assert (a.line, b.line, phone.line) == (line_of(text, "- &pi"), line_of(text, "<<: *pi"), line_of(text, "phone"))
    assert (phone.serial, phone.workdir, phone.python, phone.emulate) == ("0123456789", ADB_WORKDIR, "python3", None)
    assert here.workdir == os.path.expanduser("~/work")  # this machine: expanded here
    assert here.python == sys.executable
    assert fleet.state_dir == tmp_path / ".fleetbench" / "fleet"


def test_top_level_x_keys_hold_anchors(tmp_path: Path) -> None:
    text = (
        "x-pi: &pi {kind: ssh, threads: 4, tags: [arm]}\n"
        "devices:\n  - {<<: *pi, name: a, host: 10.0.0.1}\n  - {<<: *pi, name: b, host: 10.0.0.2, threads: 2}\n"
    )
    a, b = load_fleet(write(tmp_path, text)).devices
    assert (a.kind, a.threads, a.tags, b.host, b.threads) == ("ssh", 4, ("arm",), "10.0.0.2", 2)


def test_emulate_block_keeps_preset_and_overrides(tmp_path: Path) -> None:
    text = (
        "devices:\n  - name: e\n    kind: ssh\n    host: 127.0.0.1\n    port: 2222\n"
        "    emulate: {preset: pi3, cpu_share: 0.25, memory_mb: 512, delay_ms: 20, rate_kbit: 10000}\n"
        "  - name: bare\n    kind: ssh\n    host: 127.0.0.1\n    port: 2223\n    emulate: {}\n"
    )
    e, bare = load_fleet(write(tmp_path, text)).devices
    assert e.emulate == Emulation(preset="pi3", cpu_share=0.25, memory_mb=512, delay_ms=20.0, rate_kbit=10000)
    assert bare.emulate == Emulation()


def test_cpus_pins_are_normalised_cpu_lists(tmp_path: Path) -> None:
    text = (
        "devices:\n  - name: a\n    kind: ssh\n    host: 127.0.0.1\n    port: 2222\n    emulate: {cpus: 0}\n"
        "  - name: b\n    kind: adb\n    serial: 127.0.0.1:5555\n    emulate: {cpus: '3, 1-2'}\n"
    )
    a, b = load_fleet(write(tmp_path, text)).devices
    assert (a.emulate.cpus, b.emulate.cpus) == ("0", "1-3")  # type: ignore[union-attr]
    assert describe_emulation(b.emulate) == "cpus 1-3"


def test_an_emulated_power_sensor_sets_the_devices_power_root(tmp_path: Path) -> None:
    text = (
        "state_dir: state\ndevices:\n"
        "  - name: a\n    kind: local\n    emulate: {power: {format: ina3221-hwmon, idle_w: 2, busy_core_w: 1.5}}\n"
        "  - name: b\n    kind: local\n    emulate: {}\n"
        "  - name: c\n    kind: adb\n    serial: 127.0.0.1:5555\n"
        "    emulate: {power: {format: power-supply, idle_w: 0.8, busy_core_w: 0}}\n"
    )
    a, b, c = load_fleet(write(tmp_path, text)).devices
    assert a.emulate is not None and a.emulate.power == EmulatedPower("ina3221-hwmon", 2.0, 1.5)
    assert a.power_root == str(tmp_path / "state" / "a" / "power")
    assert (b.power_root, c.power_root) == ("/", str(tmp_path / "state" / "c" / "power"))
    assert describe_emulation(a.emulate) == "ina3221-hwmon sensor 2 W + 1.5 W/core"


def test_relative_paths_resolve_against_the_fleet_file(tmp_path: Path, _isolated: Path) -> None:
    text = """\
state_dir: state
devices:
  - name: jetson
    kind: ssh
    host: jetson
    key_file: keys/id_jetson
    known_hosts: ~/kh
  - name: emu
    kind: ssh
    host: 127.0.0.1
    port: 22210
    emulate: {preset: pi4}
  - name: emu2
    kind: ssh
    host: 127.0.0.1
    port: 22211
    key_file: ../other/key
    emulate: {preset: pi4}
"""
    path = write(tmp_path, text, "sub/dir/fleet.yaml")
    fleet = load_fleet(path)
    base = tmp_path / "sub" / "dir"
    assert fleet.state_dir == base / "state"
    jetson, emu, emu2 = fleet.devices
    assert jetson.key_file == base / "keys" / "id_jetson"
    assert jetson.known_hosts == _isolated / "kh"
    assert (emu.key_file, emu.known_hosts) == (base / "state" / "id_ed25519", base / "state" / "known_hosts")
    assert emu.workdir == str(base / "state" / "emu" / "work")
    assert emu2.key_file == tmp_path / "sub" / "other" / "key"  # explicit wins over the emulated default
    assert emu2.known_hosts == base / "state" / "known_hosts"


def test_relative_fleet_path_and_default_state_dir_follow_the_current_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write(tmp_path, "devices:\n  - name: jetson\n    kind: ssh\n    host: j\n    key_file: k\n", "fleets/lab.yaml")
    work = tmp_path / "elsewhere"
    work.mkdir()
    monkeypatch.chdir(work)
    fleet = load_fleet("../fleets/lab.yaml")
    assert fleet.path == tmp_path / "fleets" / "lab.yaml"
    assert fleet.state_dir == work / ".fleetbench" / "lab"
    assert fleet.devices[0].key_file == tmp_path / "fleets" / "k"


# ---------------------------------------------------------------------------- ssh aliases

SSH_CONFIG = """\
Host pi4
    HostName 192.168.1.40
    Port 2222
    User pi
    IdentityFile ~/.ssh/id_pi

Host *
    User everyone
"""

ALIAS_FLEET = """\
devices:
  - name: pi
    kind: ssh
    host: pi4
  - name: pi-explicit
    kind: ssh
    host: pi4
    port: 2200
    user: alice
    key_file: mykey
  - name: plain
    kind: ssh
    host: 10.0.0.9
  - name: emulated
    kind: ssh
    host: 127.0.0.1
    port: 22201
    emulate: {preset: pi4}
"""


def test_ssh_alias_resolution_explicit_fields_win(tmp_path: Path, _isolated: Path) -> None:
    config = write(tmp_path, SSH_CONFIG, "ssh_config")
    fleet = load_fleet(write(tmp_path, ALIAS_FLEET), ssh_config=config)
    pi, explicit, plain, emulated = fleet.devices
    assert (pi.host, pi.port, pi.user, pi.key_file) == ("192.168.1.40", 2222, "pi", _isolated / ".ssh" / "id_pi")
    assert (explicit.host, explicit.port, explicit.user, explicit.key_file) == (
        "192.168.1.40",
        2200,
        "alice",
        tmp_path / "mykey",
    )
    assert (plain.host, plain.port, plain.user, plain.key_file) == ("10.0.0.9", 22, "everyone", None)
    # emulated devices are never looked up: `Host *` must not change who they are
    assert (emulated.host, emulated.port, emulated.user) == ("127.0.0.1", 22201, None)


def test_ssh_config_from_environment_and_absent_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write(tmp_path, ALIAS_FLEET)
    assert load_fleet(path).devices[0].host == "pi4"  # the fixture's config does not exist
    monkeypatch.setenv(SSH_CONFIG_ENV, str(write(tmp_path, SSH_CONFIG, "cfg")))
    assert load_fleet(path).devices[0].host == "192.168.1.40"


def test_bad_port_in_ssh_config_points_at_the_host_line(tmp_path: Path) -> None:
    config = write(tmp_path, "Host pi4\n    Port twenty\n", "ssh_config")
    path = write(tmp_path, ALIAS_FLEET)
    with pytest.raises(FleetFileError) as info:
        load_fleet(path, ssh_config=config)
    assert (info.value.line, info.value.field) == (line_of(ALIAS_FLEET, "host: pi4"), "devices[0].host")
    assert "Port 'twenty'" in info.value.message


# ---------------------------------------------------------------------------- CLI


def test_cli_check_lists_devices(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO)
    assert main(["fleet", "check", "devices/fleets/emulated.yaml"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[-1].startswith("5 devices OK")
    assert len(out) == 6
    fast = next(line for line in out if line.startswith("fast "))
    for word in ("ssh", "127.0.0.1:22201", "1 thread", "cpu 0.6, 4096 MB", str(REPO / ".fleetbench")):
        assert word in fast
    assert "preset pi4" in next(line for line in out if line.startswith("mid "))
    assert "adb 127.0.0.1:25555" in next(line for line in out if line.startswith("phone "))


def test_cli_check_malformed_file_is_one_line_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    text = "devices:\n  - name: pi\n    kind: ssh\n    host: pi\n    port: abc\n"
    path = write(tmp_path, text)
    assert main(["fleet", "check", str(path)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.splitlines()
    assert len(lines) == 1
    assert lines[0].startswith(f"fleetbench: error: {path}:{line_of(text, 'port')}: devices[0].port: ")


@pytest.mark.parametrize("name", SHIPPED)
def test_cli_subprocess_check_shipped_fleets(name: str, tmp_path: Path) -> None:
    env = {**os.environ, SSH_CONFIG_ENV: str(tmp_path / "none"), "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [sys.executable, "-m", "fleetbench", "fleet", "check", f"devices/fleets/{name}"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert " OK (state dir " in done.stdout.splitlines()[-1]


def test_cli_subprocess_malformed_file_no_traceback(tmp_path: Path) -> None:
    text = "devices:\n  - name: a\n    kind: local\n  - name: a\n    kind: local\n"
    path = write(tmp_path, text)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [sys.executable, "-m", "fleetbench", "fleet", "check", str(path)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr.splitlines() == [
        f"fleetbench: error: {path}:{line_of(text, 'name: a', 2)}: devices[1].name: "
        "duplicate name 'a' (first on line 2)"
    ]
    assert "Traceback" not in done.stderr


# ---------------------------------------------------------------------------- emulate.arch


def test_arm64_fleet_ships_one_aarch64_ssh_device_named_pi(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO)
    fleet = load_fleet("devices/fleets/arm64.yaml")
    pi = fleet.device("pi")
    assert (pi.name, pi.kind) == ("pi", "ssh")
    assert pi.emulate is not None and pi.emulate.arch == "aarch64"


def test_aarch64_device_resolves_python_and_workdir_inside_its_userland(tmp_path: Path) -> None:
    text = (
        "devices:\n"
        "  - {name: pi, kind: ssh, host: 127.0.0.1, port: 2301, emulate: {arch: aarch64}}\n"
        "  - {name: x86, kind: ssh, host: 127.0.0.1, port: 2302, emulate: {}}\n"
    )
    fleet = load_fleet(write(tmp_path, text))
    pi, x86 = fleet.devices
    # host paths mean nothing inside the arm64 tree: the device resolves both, like a board
    assert (pi.python, pi.workdir) == ("python3", "~/.fleetbench")
    assert x86.python == sys.executable and x86.workdir == str(fleet.state_dir / "x86" / "work")
    # keys and known_hosts stay the fleet's own, so host-key verification stays on
    assert pi.key_file == fleet.state_dir / "id_ed25519" and pi.known_hosts == fleet.state_dir / "known_hosts"
    assert resolve(pi.emulate or Emulation()).arch == "aarch64"


@pytest.mark.parametrize(
    ("block", "fragment"),
    [
        ("{arch: arm64}", "expected one of aarch64, got 'arm64'"),
        ("{arch: riscv64}", "expected one of aarch64, got 'riscv64'"),
        ("{arch: 64}", "expected one of aarch64, got '64'"),
        ("{arch: null}", "got null"),
        ("{arch: [aarch64]}", "expected one of aarch64, got a list"),
    ],
)
def test_unknown_arch_values_are_refused_with_file_line_and_field(block: str, fragment: str, tmp_path: Path) -> None:
    text = f"devices:\n  - name: pi\n    kind: ssh\n    host: 127.0.0.1\n    emulate: {block}\n"
    assert_error(write(tmp_path, text), line_of(text, "emulate"), "devices[0].emulate.arch", fragment)


def test_an_emulated_aarch64_phone_has_no_python_of_its_own(tmp_path: Path) -> None:
    text = "devices:\n  - name: phone\n    kind: adb\n    serial: 127.0.0.1:25555\n    emulate:\n      arch: aarch64\n"
    (phone,) = load_fleet(write(tmp_path, text)).devices
    assert phone.emulate is not None and phone.emulate.arch == "aarch64"
    # like a real phone's: a name its shell does not find, so provisioning pushes a bundle
    assert (phone.python, phone.workdir) == ("python3", ADB_WORKDIR)


def test_arm64_fleet_ships_an_aarch64_phone(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO)
    phone = load_fleet("devices/fleets/arm64.yaml").device("phone")
    assert phone.kind == "adb" and phone.emulate is not None and phone.emulate.arch == "aarch64"
    assert "emulated-isa" in phone.tags
