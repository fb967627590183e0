"""Fleet files: YAML in, frozen `devices.fleet.Fleet` records out.

A fleet file is one YAML mapping::

    state_dir: .fleetbench/lab          # optional
    devices:
      - name: pi4                       # unique, [A-Za-z0-9_.-]+, not starting with '.' or '-'
        kind: ssh                       # local | ssh | adb
        host: pi4                       # address, or an alias from ~/.ssh/config
        port: 22                        # 1..65535 (default 22)
        user: pi                        # default: the local user name
        key_file: ~/.ssh/id_ed25519
        known_hosts: ~/.ssh/known_hosts
        trust_on_first_use: false
        workdir: ~/.fleetbench
        python: python3
        threads: 4                      # >= 1 (default 1)
        tags: [fast]
      - name: phone
        kind: adb
        serial: R58M123ABCD             # ADB serial, or HOST:PORT
        emulate:                        # start it on this machine (`fleet up`)
          preset: phone-midrange        # pi3 | pi4 | jetson-nano | phone-midrange
          cpu_share: 0.5                # > 0, fraction of one core
          memory_mb: 1024               # > 0
          delay_ms: 10                  # >= 0 (tc netem, root only)
          rate_kbit: 20000              # > 0  (tc netem, root only)
          arch: aarch64                 # arm64 userland (ssh) or shell (adb) under qemu-user
          cpus: "0"                     # host cpus to pin it to (a Linux cpu list: 0, 2-3, 0,2)
          power:                        # an emulated power sensor (`devices.emulation.sensors`)
            format: power-supply        # ina3221-hwmon | power-supply | rapl
            idle_w: 1.2                 # >= 0, watts with no busy cpu
            busy_core_w: 0.9            # >= 0, watts each busy core adds
      - name: slow
        kind: local                     # this machine, through subprocesses
        emulate: {preset: pi3, cpus: "1"}   # its commands run under these limits

Rules, each one enforced with an error that names the file, the line and the field
(`devices.errors.FleetFileError`, e.g. ``fleet.yaml:7: devices[1].port: ...``):

* Unknown keys are errors, with the closest valid key suggested (a typo never passes
  silently); so are keys that do not apply to the device's kind (``serial`` on an SSH
  device, ``host`` on a local one) and ``emulate`` keys a local device cannot honour
  (``delay_ms``, ``rate_kbit``, ``arch``: `LOCAL_EMULATE_REFUSED`).
* ``ssh`` needs ``host``; ``adb`` needs ``serial``; ``local`` needs neither.  An emulated
  ``adb`` device needs a ``127.0.0.1:PORT`` serial (the real adb server attaches to it with
  ``adb connect``; the emulated phone listens on loopback only), an emulated ``ssh`` device
  a loopback ``host`` (``127.x.x.x``, ``::1`` or ``localhost``: its sshd listens there, never
  on a network).  Two emulated devices may not share an address.
* Names, workdirs and serials are checked for what they become (`check_name`,
  `check_workdir`, `check_serial`).  A device name becomes a file name on this machine
  (``<state_dir>/<name>/``, its logs, its cgroup), so it is letters, digits, ``_``, ``.``
  and ``-``, neither starting with ``.`` or ``-`` nor holding ``..``.  A workdir or serial
  may hold spaces, quotes and shell metacharacters (every remote command is an argv list,
  quoted in one place, `devices.transport.quote_argv`), but no control character (a
  newline would split the lines device scripts answer in); a workdir has no ``..``
  component (it never climbs out of where it is put) and no ``:`` (it is put on the
  device's ``PYTHONPATH``, `devices.site`).
* An explicit ``null`` is an error: leave a key out to get its default.  YAML anchors,
  aliases and merge keys (``<<: *defaults``) may be used to share settings; top-level keys
  starting with ``x-`` are ignored, so they can hold such anchors
  (``x-pi: &pi {kind: ssh, threads: 4}``).
* String fields accept plain numbers as written (``serial: 0123456789`` stays that text);
  integer fields accept integers only, boolean fields booleans only.

Defaults and resolution (all decided here, so the rest of fleetbench takes a `Device`
as given):

* Relative local paths (``state_dir``, ``key_file``, ``known_hosts``) resolve against the
  fleet file's directory, after ``~`` is expanded.  The default ``state_dir`` is
  ``.fleetbench/<file stem>`` under the *current* directory (so the fleets shipped inside
  the package never write into it); ``Fleet.state_dir`` is always absolute.
* SSH aliases: for a non-emulated SSH device whose ssh config file exists (``~/.ssh/config``,
  or the file named by ``$FLEETBENCH_SSH_CONFIG`` or the ``ssh_config`` argument),
  ``host`` is looked up with `paramiko.SSHConfig` and its ``HostName``, ``Port``, ``User``
  and first ``IdentityFile`` fill ``host``, ``port``, ``user`` and ``key_file``; fields
  written in the fleet file win.  Emulated devices are never looked up (a ``Host *`` block
  in the user's config must not change where an emulated device is).
* Emulated SSH devices (``kind: ssh`` with an ``emulate`` block): ``key_file`` and
  ``known_hosts`` default to ``<state_dir>/id_ed25519`` and ``<state_dir>/known_hosts``,
  which ``fleetbench fleet up`` generates (the user key) and writes (the host keys of the
  emulated sshds), so host-key verification stays on.  ``user`` stays ``None``, which means
  the local user name at connect time (the emulated sshd runs as the current user;
  paramiko's default username is that user).
* Devices that live on this machine (``local`` devices and emulated SSH devices) get
  ``workdir`` ``<state_dir>/<name>/work`` by default and have ``~`` in an explicit
  ``workdir`` expanded here (the remote shell is not asked to expand it); their ``python``
  defaults to the interpreter running fleetbench, which has numpy and onnxruntime.
* ADB devices (real or emulated) default ``workdir`` to ``/data/local/tmp/fleetbench``,
  the directory Android lets a shell user write; the emulated phone serves it from its
  sandbox.  Real SSH devices keep ``~/.fleetbench``, expanded by the device.  Their
  ``python`` defaults to ``python3``, which a phone's shell does not find (the emulated
  phone's neither, `devices.emulation.adb_endpoint`): provisioning then pushes a runtime bundle
  (`harness.phone_runtime`). A phone with a working Python (Termux) names it here.
* An emulated device with ``arch: aarch64`` runs arm64 code through qemu-user: an SSH
  device an arm64 Debian userland (`devices.emulation.qemu`), whose ``python`` defaults to
  ``python3`` and ``workdir`` to ``~/.fleetbench``, both resolved inside that userland as
  on a real board (host paths mean nothing there); a phone a shell of that userland's
  arm64 commands (`devices.emulation.adb_endpoint`).  ``arch`` is refused for any value but
  ``aarch64`` (`ARCHES`).
* A local device with an ``emulate`` block is confined, not started: ``fleetbench fleet
  up`` creates its limits (CPU share, memory, cpu pins) and every command fleetbench
  runs on it starts inside them (`devices.emulation.emulate.local_confinement`).  Every device with
  an ``emulate`` block carries the fleet's ``state_dir`` (`devices.fleet.Device.state_dir`),
  where ``fleet up`` records what it applied.
* ``emulate.power`` (an emulated power sensor) needs all three of ``format``, ``idle_w``
  and ``busy_core_w``. The device's ``power_root`` (`devices.fleet.Device.power_root`) is
  then ``<state_dir>/<name>/power``, where ``fleet up``'s driver writes the sensor's files
  and where the device's facts probe and runner look for them (``/`` for every other
  device). An aarch64 SSH device refuses it: its sshd is chrooted into the arm64 tree and
  does not see that directory (`POWER_REFUSED`).
* An ``emulate`` block keeps its ``preset`` by name; the preset's values (CPU share, memory)
  are filled in by `devices.emulation.presets` for the fields the block leaves out.

Only `load_fleet` does I/O (it reads the fleet file and the ssh config); `parse_fleet`
is a pure function of texts and paths.
"""

from __future__ import annotations

import argparse
import difflib
import ipaddress
import os
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import paramiko
import yaml
from yaml.constructor import SafeConstructor
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from devices.emulation.limits import format_cpu_list, parse_cpu_list
from devices.errors import FleetFileError
from devices.fleet import POWER_DIR, POWER_FORMATS, Device, DeviceKind, EmulatedPower, Emulation, Fleet

#: Emulation presets a fleet file may name (their values live in `devices.emulation.presets`).
PRESETS: tuple[str, ...] = ("pi3", "pi4", "jetson-nano", "phone-midrange")

#: Architectures an ``emulate`` block may ask for (run through qemu-user).
ARCHES: tuple[str, ...] = ("aarch64",)

#: Device kinds, as `devices.fleet.DeviceKind`.
KINDS: tuple[str, ...] = ("local", "ssh", "adb")

#: Keys of the top-level mapping.
TOP_KEYS: tuple[str, ...] = ("state_dir", "devices")

#: Keys of a device entry (``KIND_KEYS`` says which apply to which kind).
DEVICE_KEYS: tuple[str, ...] = (
    "name",
    "kind",
    "host",
    "port",
    "user",
    "key_file",
    "known_hosts",
    "trust_on_first_use",
    "serial",
    "workdir",
    "python",
    "threads",
    "tags",
    "emulate",
)

_COMMON_KEYS = frozenset({"name", "kind", "workdir", "python", "threads", "tags"})
_SSH_KEYS = frozenset({"host", "port", "user", "key_file", "known_hosts", "trust_on_first_use"})

#: Keys each kind accepts.
KIND_KEYS: Mapping[str, frozenset[str]] = {
    "local": _COMMON_KEYS | {"emulate"},
    "ssh": _COMMON_KEYS | _SSH_KEYS | {"emulate"},
    "adb": _COMMON_KEYS | {"serial", "emulate"},
}

#: Keys of an ``emulate`` block.
EMULATE_KEYS: tuple[str, ...] = (
    "preset",
    "cpu_share",
    "memory_mb",
    "delay_ms",
    "rate_kbit",
    "arch",
    "cpus",
    "power",
)

#: Keys of an ``emulate.power`` block, all required.
POWER_KEYS: tuple[str, ...] = ("format", "idle_w", "busy_core_w")

#: Why an aarch64 SSH device refuses ``emulate.power``.
POWER_REFUSED = (
    "does not apply to an aarch64 ssh device (its sshd is chrooted into the arm64 tree and does not "
    "see the directory the sensor's driver writes); use a local, ssh or adb device of this machine's architecture"
)

#: Keys of an ``emulate`` block that a local device refuses, with the reason.
LOCAL_EMULATE_REFUSED: Mapping[str, str] = {
    "delay_ms": "does not apply to local devices (their commands use this machine's own network; "
    "network shaping needs an ssh device)",
    "rate_kbit": "does not apply to local devices (their commands use this machine's own network; "
    "network shaping needs an ssh device)",
    "arch": "does not apply to local devices (they run this machine's own architecture; "
    "qemu-user needs an ssh or adb device)",
}

#: Environment variable naming the ssh config file used to resolve aliases.
SSH_CONFIG_ENV = "FLEETBENCH_SSH_CONFIG"

#: Default working directory of ADB devices.
ADB_WORKDIR = "/data/local/tmp/fleetbench"

_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
#: Host names an emulated SSH device may listen on besides loopback addresses.
LOOPBACK_NAMES: tuple[str, ...] = ("localhost",)
#: Address an emulated phone listens on (`devices.emulation.adb_endpoint.AdbEndpoint.host`).
PHONE_HOST = "127.0.0.1"
_HOST_PORT = re.compile(r"(?P<host>.+):(?P<port>[0-9]+)")

_STR = "tag:yaml.org,2002:str"
_INT = "tag:yaml.org,2002:int"
_FLOAT = "tag:yaml.org,2002:float"
_BOOL = "tag:yaml.org,2002:bool"
_NULL = "tag:yaml.org,2002:null"
_MERGE = "tag:yaml.org,2002:merge"
#: Builds int, float and bool values from scalar nodes exactly as yaml.safe_load would.
_SCALARS = SafeConstructor()
_TEXT_TAGS = frozenset({_STR, _INT, _FLOAT, "tag:yaml.org,2002:timestamp"})


@dataclass(frozen=True)
class _Context:
    """What parsing needs besides the YAML text (all given, nothing read)."""

    path: str  # as shown in messages
    base_dir: Path  # absolute directory of the fleet file
    cwd: Path  # absolute current directory (for the default state_dir)
    ssh_config: paramiko.SSHConfig | None
    ssh_config_path: str
    local_python: str

    def error(self, line: int | Node, field: str, message: str) -> FleetFileError:
        if isinstance(line, Node):
            line = line.start_mark.line + 1
        return FleetFileError(self.path, line, field, message)


# ---------------------------------------------------------------------------- value rules


def check_name(name: str) -> str | None:
    """Say what is wrong with a device name, or None when it is safe as a file name.

    A name becomes a path component on this machine (the device's directory under the
    fleet's state dir, its logs, its cgroup), so only letters, digits, ``_``, ``.`` and ``-``
    are allowed, it may not start with ``.`` (``.``, ``..``, hidden files) or ``-`` (an
    option to a command) and may not hold ``..``.

    Parameters
    ----------
    name : str

    Returns
    -------
    str or None
        The problem, for a fleet-file message.
    """
    if not _NAME.fullmatch(name) or ".." in name:
        return (
            "expected letters, digits, '_', '.' or '-', not starting with '.' or '-' and without '..' "
            f"(a name becomes a file name under the state dir), got {name!r}"
        )
    return None


def check_workdir(workdir: str) -> str | None:
    """Say what is wrong with a workdir, or None when it is safe to quote and use.

    Spaces, quotes and shell metacharacters are fine (commands are quoted by
    `devices.transport.quote_argv`); refused are the empty string, control characters
    (device scripts answer in lines), ``..`` components (a workdir never climbs out of the
    directory it names) and ``:`` (the workdir's site goes on the device's ``PYTHONPATH``).

    Parameters
    ----------
    workdir : str

    Returns
    -------
    str or None
        The problem, for a fleet-file message.
    """
    if not workdir:
        return "expected a directory, got ''"
    if _CONTROL.search(workdir):
        return f"may not hold control characters such as a newline, got {workdir!r}"
    if ".." in workdir.split("/"):
        return f"may not hold '..' components (a workdir never climbs out of its directory), got {workdir!r}"
    if ":" in workdir:
        return f"may not hold ':' (the workdir's site goes on the device's PYTHONPATH), got {workdir!r}"
    return None


def check_serial(serial: str) -> str | None:
    """Say what is wrong with an ADB serial, or None when it is usable.

    Parameters
    ----------
    serial : str

    Returns
    -------
    str or None
        The problem (empty, or a control character), for a fleet-file message.
    """
    if not serial:
        return "expected an ADB serial, got ''"
    if _CONTROL.search(serial):
        return f"may not hold control characters such as a newline, got {serial!r}"
    return None


def is_loopback(host: str) -> bool:
    """Whether ``host`` names this machine's loopback interface (``127.x.x.x``, ``::1``, ``localhost``)."""
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


# ---------------------------------------------------------------------------- node helpers


def _line(node: Node) -> int:
    return int(node.start_mark.line) + 1


def _describe(node: Node) -> str:
    if isinstance(node, MappingNode):
        return "a mapping"
    if isinstance(node, SequenceNode):
        return "a list"
    if node.tag == _NULL:
        return "null"
    return repr(node.value)


def _entries(ctx: _Context, field: str, node: Node) -> dict[str, tuple[Node, Node]]:
    """Key -> (key node, value node) of a mapping, merge keys flattened, duplicates refused."""
    if not isinstance(node, MappingNode):
        where = field or "(top level)"
        raise ctx.error(node, where, f"expected a mapping, got {_describe(node)}")
    explicit: dict[str, tuple[Node, Node]] = {}
    merged: list[dict[str, tuple[Node, Node]]] = []
    for key_node, value_node in node.value:
        if key_node.tag == _MERGE:
            sources = value_node.value if isinstance(value_node, SequenceNode) else [value_node]
            merged.extend(_entries(ctx, field, source) for source in sources)
            continue
        if not isinstance(key_node, ScalarNode) or key_node.tag not in _TEXT_TAGS:
            raise ctx.error(key_node, field or "(top level)", f"keys must be names, got {_describe(key_node)}")
        key = str(key_node.value)
        if key in explicit:
            first = _line(explicit[key][0])
            raise ctx.error(key_node, _join(field, key), f"duplicate key (first on line {first})")
        explicit[key] = (key_node, value_node)
    for source in merged:  # earlier merge sources win over later ones, explicit keys over all
        for key, pair in source.items():
            explicit.setdefault(key, pair)
    return explicit


def _join(field: str, key: str) -> str:
    return f"{field}.{key}" if field else key


def _check_keys(ctx: _Context, field: str, entries: Mapping[str, tuple[Node, Node]], allowed: tuple[str, ...]) -> None:
    for key, (key_node, _) in entries.items():
        if key in allowed:
            continue
        close = difflib.get_close_matches(key, allowed, n=1, cutoff=0.6)
        hint = f"; did you mean {close[0]!r}?" if close else f"; valid keys: {', '.join(allowed)}"
        raise ctx.error(key_node, _join(field, key), f"unknown key{hint}")


def _not_null(ctx: _Context, field: str, node: Node, expected: str) -> None:
    if isinstance(node, ScalarNode) and node.tag == _NULL:
        raise ctx.error(node, field, f"expected {expected}, got null (leave the key out for the default)")


def _text(ctx: _Context, field: str, node: Node, expected: str = "a string") -> str:
    _not_null(ctx, field, node, expected)
    if not isinstance(node, ScalarNode) or node.tag not in _TEXT_TAGS:
        raise ctx.error(node, field, f"expected {expected}, got {_describe(node)}")
    value = str(node.value)
    if not value.strip():
        raise ctx.error(node, field, f"expected {expected}, got an empty string")
    return value


def _int(ctx: _Context, field: str, node: Node, low: int, high: int | None = None) -> int:
    expected = f"an integer in {low}..{high}" if high is not None else f"an integer >= {low}"
    _not_null(ctx, field, node, expected)
    if not isinstance(node, ScalarNode) or node.tag != _INT:
        raise ctx.error(node, field, f"expected {expected}, got {_describe(node)}")
    value = _SCALARS.construct_yaml_int(node)
    if value < low or (high is not None and value > high):
        raise ctx.error(node, field, f"expected {expected}, got {value}")
    return int(value)


def _float(ctx: _Context, field: str, node: Node, *, positive: bool) -> float:
    expected = "a number > 0" if positive else "a number >= 0"
    _not_null(ctx, field, node, expected)
    if not isinstance(node, ScalarNode) or node.tag not in (_INT, _FLOAT):
        raise ctx.error(node, field, f"expected {expected}, got {_describe(node)}")
    value = float(_SCALARS.construct_yaml_int(node) if node.tag == _INT else _SCALARS.construct_yaml_float(node))
    if value != value or value in (float("inf"), float("-inf")) or value < 0 or (positive and value == 0):
        raise ctx.error(node, field, f"expected {expected}, got {node.value}")
    return value


def _bool(ctx: _Context, field: str, node: Node) -> bool:
    _not_null(ctx, field, node, "true or false")
    if not isinstance(node, ScalarNode) or node.tag != _BOOL:
        raise ctx.error(node, field, f"expected true or false, got {_describe(node)}")
    return bool(_SCALARS.construct_yaml_bool(node))


def _choice(ctx: _Context, field: str, node: Node, choices: tuple[str, ...]) -> str:
    expected = " | ".join(choices)
    value = _text(ctx, field, node, f"one of {expected}")
    if value not in choices:
        close = difflib.get_close_matches(value, choices, n=1, cutoff=0.5)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ctx.error(node, field, f"expected one of {expected}, got {value!r}{hint}")
    return value


def _local_path(ctx: _Context, text: str) -> Path:
    path = Path(os.path.expanduser(text))
    if not path.is_absolute():
        path = ctx.base_dir / path
    return Path(os.path.normpath(path))


# ---------------------------------------------------------------------------- records


def _emulation(ctx: _Context, field: str, node: Node) -> Emulation:
    _not_null(ctx, field, node, "a mapping (use {} for no limits)")
    entries = _entries(ctx, field, node)
    _check_keys(ctx, field, entries, EMULATE_KEYS)
    values: dict[str, object] = {}
    for key, (_, value) in entries.items():
        sub = _join(field, key)
        if key == "preset":
            values[key] = _choice(ctx, sub, value, PRESETS)
        elif key == "cpu_share":
            values[key] = _float(ctx, sub, value, positive=True)
        elif key == "delay_ms":
            values[key] = _float(ctx, sub, value, positive=False)
        elif key == "arch":
            values[key] = _choice(ctx, sub, value, ARCHES)
        elif key == "cpus":
            values[key] = _cpus(ctx, sub, value)
        elif key == "power":
            values[key] = _power(ctx, sub, value)
        else:  # memory_mb, rate_kbit
            values[key] = _int(ctx, sub, value, 1)
    return Emulation(**values)  # type: ignore[arg-type]


def _power(ctx: _Context, field: str, node: Node) -> EmulatedPower:
    _not_null(ctx, field, node, "a mapping with format, idle_w and busy_core_w")
    entries = _entries(ctx, field, node)
    _check_keys(ctx, field, entries, POWER_KEYS)
    for key in POWER_KEYS:
        if key not in entries:
            raise ctx.error(
                node, _join(field, key), "missing (an emulated power sensor needs format, idle_w and busy_core_w)"
            )
    return EmulatedPower(
        format=_choice(ctx, _join(field, "format"), entries["format"][1], POWER_FORMATS),
        idle_w=_float(ctx, _join(field, "idle_w"), entries["idle_w"][1], positive=False),
        busy_core_w=_float(ctx, _join(field, "busy_core_w"), entries["busy_core_w"][1], positive=False),
    )


def _cpus(ctx: _Context, field: str, node: Node) -> str:
    expected = 'a cpu list such as "0", "2-3" or "0,2"'
    text = _text(ctx, field, node, expected)
    try:
        return format_cpu_list(parse_cpu_list(text))
    except ValueError as exc:
        raise ctx.error(node, field, f"expected {expected}: {exc}") from None


def _resolve_alias(
    ctx: _Context, field: str, host_node: Node, host: str
) -> tuple[str, int | None, str | None, Path | None]:
    """HostName, Port, User and IdentityFile for ``host`` from the ssh config (None where unset)."""
    assert ctx.ssh_config is not None
    try:
        found = ctx.ssh_config.lookup(host)
    except Exception as exc:  # paramiko raises various errors for configs it cannot evaluate
        raise ctx.error(host_node, field, f"ssh config {ctx.ssh_config_path}: {exc}") from None
    port: int | None = None
    if "port" in found:
        text = str(found["port"])
        if not text.isdigit() or not 1 <= int(text) <= 65535:
            raise ctx.error(
                host_node, field, f"ssh config {ctx.ssh_config_path}: Port {text!r} for {host!r} is not in 1..65535"
            )
        port = int(text)
    identity = found.get("identityfile")
    key_file = Path(os.path.expanduser(str(identity[0]))) if identity else None
    return str(found.get("hostname", host)), port, found.get("user"), key_file


def _device(ctx: _Context, index: int, node: Node, state_dir: Path) -> Device:
    field = f"devices[{index}]"
    entries = _entries(ctx, field, node)
    _check_keys(ctx, field, entries, DEVICE_KEYS)
    for required in ("name", "kind"):
        if required not in entries:
            raise ctx.error(node, _join(field, required), "missing (every device needs a name and a kind)")
    name_node = entries["name"][1]
    name = _text(ctx, f"{field}.name", name_node, "a name of letters, digits, '_', '.' or '-'")
    if (problem := check_name(name)) is not None:
        raise ctx.error(name_node, f"{field}.name", problem)
    kind: DeviceKind = _choice(ctx, f"{field}.kind", entries["kind"][1], KINDS)  # type: ignore[assignment]
    for key, (key_node, _) in entries.items():
        if key not in KIND_KEYS[kind]:
            kinds = [k for k in KINDS if key in KIND_KEYS[k]]
            raise ctx.error(
                key_node, _join(field, key), f"does not apply to {kind} devices (only to {' and '.join(kinds)})"
            )
    for required, needed_by in (("host", "ssh"), ("serial", "adb")):
        if kind == needed_by and required not in entries:
            raise ctx.error(node, _join(field, required), f"missing (required for kind {kind})")

    def get(key: str) -> Node | None:
        pair = entries.get(key)
        return pair[1] if pair else None

    emulate_node = get("emulate")
    emulate = _emulation(ctx, f"{field}.emulate", emulate_node) if emulate_node is not None else None
    if emulate_node is not None and kind == "local":
        for key, (key_node, _) in _entries(ctx, f"{field}.emulate", emulate_node).items():
            if key in LOCAL_EMULATE_REFUSED:
                raise ctx.error(key_node, f"{field}.emulate.{key}", LOCAL_EMULATE_REFUSED[key])
    foreign = emulate is not None and emulate.arch is not None
    if emulate_node is not None and emulate is not None and emulate.power is not None and foreign and kind == "ssh":
        key_node = _entries(ctx, f"{field}.emulate", emulate_node)["power"][0]
        raise ctx.error(key_node, f"{field}.emulate.power", POWER_REFUSED)
    on_this_machine = kind == "local" or (kind == "ssh" and emulate is not None and not foreign)

    host = port = user = key_file = known_hosts = serial = None
    trust = False
    if kind == "ssh":
        host_node = entries["host"][1]
        host = _text(ctx, f"{field}.host", host_node, "a host name, address or ssh alias")
        port = _int(ctx, f"{field}.port", n, 1, 65535) if (n := get("port")) is not None else None
        user = _text(ctx, f"{field}.user", n, "a user name") if (n := get("user")) is not None else None
        if (n := get("key_file")) is not None:
            key_file = _local_path(ctx, _text(ctx, f"{field}.key_file", n, "a path"))
        if (n := get("known_hosts")) is not None:
            known_hosts = _local_path(ctx, _text(ctx, f"{field}.known_hosts", n, "a path"))
        if (n := get("trust_on_first_use")) is not None:
            trust = _bool(ctx, f"{field}.trust_on_first_use", n)
        if emulate is not None:
            if not is_loopback(host):
                raise ctx.error(
                    host_node,
                    f"{field}.host",
                    f"an emulated device listens on loopback only (127.0.0.1, ::1 or localhost), got {host!r}",
                )
            key_file = key_file or state_dir / "id_ed25519"
            known_hosts = known_hosts or state_dir / "known_hosts"
        elif ctx.ssh_config is not None:
            host, alias_port, alias_user, alias_key = _resolve_alias(ctx, f"{field}.host", host_node, host)
            port = port if port is not None else alias_port
            user = user if user is not None else alias_user
            key_file = key_file if key_file is not None else alias_key
        port = port if port is not None else 22
    elif kind == "adb":
        serial_node = entries["serial"][1]
        serial = _text(ctx, f"{field}.serial", serial_node, "an ADB serial")
        if (problem := check_serial(serial)) is not None:
            raise ctx.error(serial_node, f"{field}.serial", problem)
        if emulate is not None:
            match = _HOST_PORT.fullmatch(serial)
            if match is None or not 1 <= int(match["port"]) <= 65535:
                raise ctx.error(
                    serial_node,
                    f"{field}.serial",
                    f"an emulated phone needs a HOST:PORT serial (e.g. 127.0.0.1:25555), got {serial!r}",
                )
            if match["host"] != PHONE_HOST:
                raise ctx.error(
                    serial_node,
                    f"{field}.serial",
                    f"an emulated phone listens on {PHONE_HOST} only, got {serial!r}",
                )

    if (n := get("workdir")) is not None:
        workdir = _text(ctx, f"{field}.workdir", n, "a directory")
        if (problem := check_workdir(workdir)) is not None:
            raise ctx.error(n, f"{field}.workdir", problem)
        if on_this_machine:
            workdir = os.path.expanduser(workdir)
    elif on_this_machine:
        workdir = str(state_dir / name / "work")
    elif kind == "adb":
        workdir = ADB_WORKDIR
    else:
        workdir = Device.workdir
    if (n := get("python")) is not None:
        python = _text(ctx, f"{field}.python", n, "an interpreter path")
    elif on_this_machine:
        python = ctx.local_python
    else:
        python = Device.python
    threads = _int(ctx, f"{field}.threads", n, 1) if (n := get("threads")) is not None else 1
    tags: tuple[str, ...] = ()
    if (n := get("tags")) is not None:
        _not_null(ctx, f"{field}.tags", n, "a list of strings")
        if not isinstance(n, SequenceNode):
            raise ctx.error(n, f"{field}.tags", f"expected a list of strings, got {_describe(n)}")
        tags = tuple(_text(ctx, f"{field}.tags[{i}]", item) for i, item in enumerate(n.value))

    return Device(
        name=name,
        kind=kind,
        host=host,
        port=port,
        user=user,
        key_file=key_file,
        known_hosts=known_hosts,
        trust_on_first_use=trust,
        serial=serial,
        workdir=workdir,
        python=python,
        threads=threads,
        tags=tags,
        emulate=emulate,
        line=_line(node),
        state_dir=state_dir if emulate is not None else None,
        power_root=str(state_dir / name / POWER_DIR) if emulate is not None and emulate.power is not None else "/",
    )


def _emulated_address(device: Device) -> tuple[str, int, str] | None:
    """(host, port, field) that an emulated device listens on, None for other devices."""
    if device.emulate is None:
        return None
    if device.kind == "ssh" and device.host is not None and device.port is not None:
        return device.host, device.port, "port"
    if device.kind == "adb" and device.serial is not None:
        host, _, port = device.serial.rpartition(":")
        return host, int(port), "serial"
    return None


def parse_fleet(
    text: str,
    path: str | os.PathLike[str],
    *,
    cwd: str | os.PathLike[str],
    ssh_config_text: str | None = None,
    ssh_config_path: str = "~/.ssh/config",
    local_python: str = "python3",
) -> Fleet:
    """Validate the text of a fleet file into a `Fleet` (pure: reads no file).

    Parameters
    ----------
    text : str
        The YAML text.
    path : str or os.PathLike
        The file the text came from: shown in messages, and its directory is where
        relative paths resolve.  Made absolute against ``cwd``.
    cwd : str or os.PathLike
        The current directory (the default ``state_dir`` lies under it).
    ssh_config_text : str or None
        Text of the ssh config used to resolve host aliases; ``None`` resolves none.
    ssh_config_path : str
        Where that text came from (for messages).
    local_python : str
        Interpreter for devices on this machine (local and emulated ones).

    Returns
    -------
    Fleet
        Devices in file order; see the module docstring for every default.

    Raises
    ------
    FleetFileError
        On any problem, naming the file, the line and the field.
    """
    shown = os.fspath(path)
    cwd_path = Path(os.path.abspath(cwd))
    file_path = Path(os.path.normpath(cwd_path / Path(shown)))
    ssh_config = None
    if ssh_config_text is not None:
        try:
            ssh_config = paramiko.SSHConfig.from_text(ssh_config_text)
        except Exception as exc:  # paramiko.ssh_exception.ConfigParseError and friends
            raise FleetFileError(shown, 0, "ssh config", f"cannot parse {ssh_config_path}: {exc}") from None
    ctx = _Context(shown, file_path.parent, cwd_path, ssh_config, ssh_config_path, local_python)

    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark is not None else 0
        problem = " ".join(part for part in (exc.context, exc.problem) if part)
        raise ctx.error(line, "yaml", f"invalid YAML: {problem}") from None
    except yaml.YAMLError as exc:
        raise ctx.error(0, "yaml", f"invalid YAML: {' '.join(str(exc).split())}") from None
    if root is None or (isinstance(root, ScalarNode) and root.tag == _NULL):
        raise ctx.error(0, "file", "empty fleet file: expected a mapping with a 'devices' list")
    entries = _entries(ctx, "", root)
    _check_keys(ctx, "", {k: v for k, v in entries.items() if not k.startswith("x-")}, TOP_KEYS)

    if "state_dir" in entries:
        state_dir = _local_path(ctx, _text(ctx, "state_dir", entries["state_dir"][1], "a directory"))
    else:
        state_dir = cwd_path / ".fleetbench" / file_path.stem
    if "devices" not in entries:
        raise ctx.error(root, "devices", "missing: expected a list of devices")
    devices_node = entries["devices"][1]
    _not_null(ctx, "devices", devices_node, "a list of devices")
    if not isinstance(devices_node, SequenceNode):
        raise ctx.error(devices_node, "devices", f"expected a list of devices, got {_describe(devices_node)}")
    if not devices_node.value:
        raise ctx.error(devices_node, "devices", "expected at least one device")

    devices: list[Device] = []
    names: dict[str, int] = {}
    addresses: dict[tuple[str, int], Device] = {}
    for index, item in enumerate(devices_node.value):
        device = _device(ctx, index, item, state_dir)
        name_node = _entries(ctx, f"devices[{index}]", item)["name"][1]
        if device.name in names:
            first = names[device.name]
            raise ctx.error(
                name_node, f"devices[{index}].name", f"duplicate name {device.name!r} (first on line {first})"
            )
        names[device.name] = _line(name_node)
        address = _emulated_address(device)
        if address is not None:
            host, port, key = address
            other = addresses.get((host, port))
            if other is not None:
                raise ctx.error(
                    device.line,
                    f"devices[{index}].{key}",
                    f"{host}:{port} is already used by emulated device {other.name!r} (line {other.line})",
                )
            addresses[(host, port)] = device
        devices.append(device)
    return Fleet(path=file_path, devices=tuple(devices), state_dir=state_dir)


def load_fleet(path: str | os.PathLike[str], *, ssh_config: str | os.PathLike[str] | None = None) -> Fleet:
    """Read and validate a fleet file.

    Parameters
    ----------
    path : str or os.PathLike
        The fleet YAML file.
    ssh_config : str or os.PathLike or None
        ssh config used to resolve host aliases; default ``$FLEETBENCH_SSH_CONFIG`` if set,
        else ``~/.ssh/config``.  A file that does not exist resolves no alias.

    Returns
    -------
    Fleet
        The validated fleet (see the module docstring for defaults and resolution).

    Raises
    ------
    FleetFileError
        If the file is missing or unreadable (line 0) or invalid (its line and field).
    """
    shown = os.fspath(path)
    try:
        text = Path(shown).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise FleetFileError(shown, 0, "file", "no such file") from None
    except UnicodeDecodeError as exc:
        raise FleetFileError(shown, 0, "file", f"not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    except OSError as exc:
        raise FleetFileError(shown, 0, "file", f"cannot read: {exc.strerror or exc}") from None
    config_path = os.fspath(ssh_config) if ssh_config is not None else os.environ.get(SSH_CONFIG_ENV, "~/.ssh/config")
    config_text = None
    try:
        config_text = Path(os.path.expanduser(config_path)).read_text(encoding="utf-8")
    except FileNotFoundError:
        pass
    except (OSError, UnicodeDecodeError) as exc:
        raise FleetFileError(shown, 0, "ssh config", f"cannot read {config_path}: {exc}") from None
    return parse_fleet(
        text,
        shown,
        cwd=os.getcwd(),
        ssh_config_text=config_text,
        ssh_config_path=config_path,
        local_python=sys.executable or "python3",
    )


# ---------------------------------------------------------------------------- CLI


def describe_emulation(emulate: Emulation | None) -> str:
    """Summarise an ``emulate`` block in a few words (``-`` when the device is real).

    Parameters
    ----------
    emulate : Emulation or None
        The block.

    Returns
    -------
    str
        E.g. ``"preset pi4, cpu 0.5, 512 MB"``; ``"no limits"`` for an empty block.
    """
    if emulate is None:
        return "-"
    parts = []
    if emulate.preset is not None:
        parts.append(f"preset {emulate.preset}")
    if emulate.cpu_share is not None:
        parts.append(f"cpu {emulate.cpu_share:g}")
    if emulate.memory_mb is not None:
        parts.append(f"{emulate.memory_mb} MB")
    if emulate.delay_ms is not None:
        parts.append(f"delay {emulate.delay_ms:g} ms")
    if emulate.rate_kbit is not None:
        parts.append(f"{emulate.rate_kbit} kbit/s")
    if emulate.arch is not None:
        parts.append(f"{emulate.arch} (qemu-user)")
    if emulate.cpus is not None:
        parts.append(f"cpus {emulate.cpus}")
    if emulate.power is not None:
        power = emulate.power
        parts.append(f"{power.format} sensor {power.idle_w:g} W + {power.busy_core_w:g} W/core")
    return ", ".join(parts) if parts else "no limits"


def describe_address(device: Device) -> str:
    """Where a device is reached: ``user@host:port``, the ADB serial, or ``this machine``.

    Parameters
    ----------
    device : Device
        The device.

    Returns
    -------
    str
        The address in the form its kind uses.
    """
    if device.kind == "ssh":
        user = f"{device.user}@" if device.user else ""
        return f"{user}{device.host}:{device.port}"
    if device.kind == "adb":
        return f"adb {device.serial}"
    return "this machine"


def cmd_check(args: argparse.Namespace) -> int:
    """``fleetbench fleet check FILE``: validate a fleet file and list its devices.

    Parameters
    ----------
    args : argparse.Namespace
        ``args.file`` is the fleet file.

    Returns
    -------
    int
        0 when the file is valid.

    Raises
    ------
    FleetFileError
        When it is not (the CLI prints the one-line message and exits 2).
    """
    fleet = load_fleet(args.file)
    rows = [
        (
            d.name,
            d.kind,
            describe_address(d),
            d.workdir,
            f"{d.threads} thread{'s' if d.threads != 1 else ''}",
            ",".join(d.tags) or "-",
            describe_emulation(d.emulate),
        )
        for d in fleet.devices
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    for row in rows:
        print("  ".join(cell.ljust(width) for cell, width in zip(row[:-1], widths, strict=True)) + "  " + row[-1])
    count = len(fleet.devices)
    print(f"{count} device{'s' if count != 1 else ''} OK (state dir {fleet.state_dir})")
    return 0
