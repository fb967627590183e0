"""Unprivileged-style OpenSSH ``sshd`` instances on loopback, for emulated devices and tests.

One instance lives in ``state_dir/name/``: a host key, a user key, an authorized_keys
file, an ``sshd_config``, a pid file and a log. `prepare` writes them, `start` launches
``sshd -D`` as a child process and waits until the port accepts, `stop` ends it and its
sessions by recorded pid (`devices.processes.stop`) and returns once they have exited.

Session environment: `prepare` can give every session a few environment variables
(an emulated device's marker, `devices.processes.marked`). They are set per key in
authorized_keys (``environment="NAME=value"``, allowed by name with
``PermitUserEnvironment NAME``) rather than with sshd_config's ``SetEnv``, which
OpenSSH has only since 8.7.

Shell start-up: sshd runs each command through the user's login shell, and bash started by
sshd reads ``~/.bashrc`` first. The emulated device logs in as the host's user, whose
start-up files set up the host's own tools (a Python version manager, say): work a board
would not do before every command, which would also make each command wait on the host's
tools. `without_startup_files` starts sshd in a mount namespace of its own where those
files read as empty, as a freshly flashed board's do (root only; otherwise they run).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, MutableSet
from dataclasses import dataclass
from pathlib import Path

from devices import processes
from devices.errors import SshdError
from devices.files import atomic_write
from devices.processes import ProcessRecord

#: Only address instances listen on.
LOOPBACK = "127.0.0.1"


@dataclass(frozen=True)
class SshdInstance:
    """Files and address of one sshd instance.

    Attributes
    ----------
    name : str
        Instance name (directory name under the state dir).
    directory : pathlib.Path
        ``state_dir/name``; holds every file below.
    port : int
        Loopback port it listens on.
    host_key : pathlib.Path
        ed25519 host private key (``host_key.pub`` beside it).
    user_key : pathlib.Path
        ed25519 private key a client authenticates with (``user_key.pub`` beside it).
    authorized_keys : pathlib.Path
        Holds the user key's public half.
    config : pathlib.Path
        The ``sshd_config``.
    pid_file : pathlib.Path
        sshd's own PidFile.
    log_file : pathlib.Path
        sshd's log (``-E``).
    session_env : tuple of (str, str)
        Environment variables every session gets (see the module docstring).
    """

    name: str
    directory: Path
    port: int
    host_key: Path
    user_key: Path
    authorized_keys: Path
    config: Path
    pid_file: Path
    log_file: Path
    session_env: tuple[tuple[str, str], ...] = ()

    @property
    def host(self) -> str:
        """Address the instance listens on."""
        return LOOPBACK


def sshd_binary() -> str:
    """Return the path of ``sshd``.

    Raises
    ------
    SshdError
        If OpenSSH's server is not installed.
    """
    path = shutil.which("sshd") or ("/usr/sbin/sshd" if os.access("/usr/sbin/sshd", os.X_OK) else None)
    if path is None:
        raise SshdError("sshd is not installed (Debian: apt-get install openssh-server)")
    return path


#: Draws `distinct_port` makes before it gives up.
DISTINCT_PORT_TRIES = 100
_handed_out: set[int] = set()
_handed_out_lock = threading.Lock()


def distinct_port(draw: Callable[[], int], taken: MutableSet[int], tries: int = DISTINCT_PORT_TRIES) -> int:
    """Return a port from ``draw`` that is not in ``taken``, and add it there.

    Parameters
    ----------
    draw : callable
        Returns a candidate port (e.g. one the kernel says is free now).
    taken : mutable set of int
        Ports already given out; updated.
    tries : int
        Candidates drawn before giving up.

    Returns
    -------
    int

    Raises
    ------
    OSError
        ``draw`` returned only taken ports.
    """
    for _ in range(tries):
        port = draw()
        if port not in taken:
            taken.add(port)
            return port
    raise OSError(f"no port outside the {len(taken)} already given out after {tries} tries")


def _kernel_free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((LOOPBACK, 0))
        return int(sock.getsockname()[1])


def free_port() -> int:
    """Return a TCP port on 127.0.0.1 that is free right now and that this process was not given before.

    The kernel can give one free port to two successive binds; a fleet that asks for a
    port per device needs them distinct.
    """
    with _handed_out_lock:
        return distinct_port(_kernel_free_port, _handed_out)


def generate_key(path: Path, comment: str = "fleetbench", *, overwrite: bool = False) -> Path:
    """Write an ed25519 key pair ``path`` / ``path.pub`` with ``ssh-keygen`` (no passphrase).

    Parameters
    ----------
    path : pathlib.Path
        Private key file.
    comment : str
        Key comment.
    overwrite : bool
        Replace an existing pair; otherwise an existing pair is kept.

    Returns
    -------
    pathlib.Path
        ``path``, a private key readable by its owner only (mode 0600, an existing
        one's mode too).
    """
    if path.exists() and not overwrite:
        path.chmod(0o600)
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    for stale in (path, path.with_name(path.name + ".pub")):
        stale.unlink(missing_ok=True)
    keygen = shutil.which("ssh-keygen") or "/usr/bin/ssh-keygen"
    proc = subprocess.run(
        [keygen, "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)],
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
    )
    if proc.returncode != 0:
        raise SshdError(f"ssh-keygen failed for {path}: {proc.stderr.strip()}")
    path.chmod(0o600)
    return path


def config_value(value: str | Path, *, tokens: bool = False) -> str:
    """Return ``value`` as one ``sshd_config`` argument: double-quoted, ``%`` doubled where sshd expands tokens.

    Paths under a fleet's state dir may hold spaces; sshd splits unquoted arguments at
    them, and expands ``%h``, ``%u``... in ``AuthorizedKeysFile`` and ``ChrootDirectory``.

    Parameters
    ----------
    value : str or pathlib.Path
    tokens : bool
        The keyword expands ``%`` tokens (``%`` is then written ``%%``).

    Returns
    -------
    str

    Raises
    ------
    SshdError
        ``value`` holds a double quote, a backslash or a control character, which
        sshd_config cannot carry in a quoted argument.
    """
    text = str(value)
    if any(c in text for c in '"\\') or any(ord(c) < 32 or ord(c) == 127 for c in text):
        raise SshdError(f"{text!r} cannot be written to sshd_config (a double quote, backslash or control character)")
    return '"' + (text.replace("%", "%%") if tokens else text) + '"'


def prepare(
    state_dir: Path,
    name: str,
    port: int,
    session_env: Mapping[str, str] | None = None,
    *,
    chroot: Path | None = None,
) -> SshdInstance:
    """Write keys, authorized_keys and sshd_config of instance ``name``, and validate them.

    Existing keys are kept (so ``up`` twice keeps host keys stable); the config is
    rewritten. Validation runs ``sshd -t``.

    Parameters
    ----------
    state_dir : pathlib.Path
        Parent directory; the instance lives in ``state_dir/name``.
    name : str
        Instance name.
    port : int
        Loopback port to listen on.
    session_env : mapping of str to str, optional
        Environment variables of every session (names and values without quotes).
    chroot : pathlib.Path, optional
        ``ChrootDirectory`` of every session (the emulated aarch64 device's tree,
        `devices.emulation.qemu`); SFTP is ``internal-sftp``, so it needs no binary there.

    Returns
    -------
    SshdInstance

    Raises
    ------
    SshdError
        If sshd is missing, a key cannot be generated or ``sshd -t`` rejects the config.
    """
    if name in ("", ".", "..") or "/" in name:
        raise SshdError(f"instance name {name!r} is not one directory name (its files live in state_dir/name)")
    directory = Path(state_dir).absolute() / name
    directory.mkdir(parents=True, exist_ok=True)
    inst = SshdInstance(
        name=name,
        directory=directory,
        port=port,
        host_key=directory / "host_ed25519",
        user_key=directory / "user_ed25519",
        authorized_keys=directory / "authorized_keys",
        config=directory / "sshd_config",
        pid_file=directory / "sshd.pid",
        log_file=directory / "sshd.log",
        session_env=tuple(sorted((session_env or {}).items())),
    )
    for key, value in inst.session_env:
        if not key.isidentifier() or '"' in value or "\\" in value:
            raise SshdError(f"session environment {key}={value!r} cannot be written to authorized_keys")
    generate_key(inst.host_key, f"fleetbench-host-{name}")
    generate_key(inst.user_key, f"fleetbench-user-{name}")
    inst.authorized_keys.write_text("")
    authorize(inst, inst.user_key.with_name(inst.user_key.name + ".pub").read_text())
    inst.config.write_text(
        "\n".join(
            [
                f"ListenAddress {LOOPBACK}",
                f"Port {port}",
                f"HostKey {config_value(inst.host_key)}",
                f"AuthorizedKeysFile {config_value(inst.authorized_keys, tokens=True)}",
                "PubkeyAuthentication yes",
                "PasswordAuthentication no",
                "KbdInteractiveAuthentication no",
                "UsePAM no",
                f"PidFile {config_value(inst.pid_file)}",
                "StrictModes no",
                "PermitRootLogin prohibit-password",
                "Subsystem sftp internal-sftp",
                "LogLevel ERROR",
                *([f"ChrootDirectory {config_value(chroot, tokens=True)}"] if chroot is not None else []),
                *([f"PermitUserEnvironment {','.join(k for k, _ in inst.session_env)}"] if inst.session_env else []),
                "",
            ]
        )
    )
    _ensure_privsep_dir()
    proc = subprocess.run(
        [sshd_binary(), "-t", "-f", str(inst.config)], capture_output=True, text=True, stdin=subprocess.DEVNULL
    )
    if proc.returncode != 0:
        raise SshdError(f"sshd rejected {inst.config}: {(proc.stderr or proc.stdout).strip()}")
    return inst


def authorize(instance: SshdInstance, public_key: str) -> None:
    """Let ``public_key`` (an ``ssh-ed25519 AAAA... comment`` line) log in, with the instance's session environment.

    A key already authorised (same key blob) is not added twice.
    """
    key = public_key.strip()
    blob = key.split()[1]
    lines = instance.authorized_keys.read_text().splitlines() if instance.authorized_keys.exists() else []
    if any(blob in line.split() for line in lines):
        return
    options = ",".join(f'environment="{k}={v}"' for k, v in instance.session_env)
    lines.append(f"{options} {key}" if options else key)
    instance.authorized_keys.write_text("".join(f"{line}\n" for line in lines))


#: The files a shell that sshd starts for a command reads before it: bash's and zsh's.
STARTUP_FILES = (".bashrc", ".zshenv")

# Bind /dev/null over each file named by the count-prefixed list, then exec the command.
_EMPTY_STARTUP = (
    'n=$1; shift; while [ "$n" -gt 0 ]; do mount --bind /dev/null "$1" || exit 1; n=$((n - 1)); shift; done; '
    'exec "$@"'
)


def without_startup_files(argv: list[str], home: Path) -> list[str]:
    """Return the argv that runs sshd ``argv`` where ``home``'s shell start-up files read as empty.

    The files (`STARTUP_FILES` that exist in ``home``) are covered by ``/dev/null`` in a
    private mount namespace (``unshare --mount``), so only the emulated device's sessions
    see them empty. Needs root and ``unshare``; without either, or without such files,
    ``argv`` is returned as it is.

    Parameters
    ----------
    argv : list of str
        The sshd command line.
    home : pathlib.Path
        Home directory of the user the device's sessions log in as.

    Returns
    -------
    list of str
        A command whose process becomes sshd (every step execs), so its pid is sshd's.
    """
    files = [str(home / name) for name in STARTUP_FILES if (home / name).is_file()]
    if not files or os.geteuid() != 0 or shutil.which("unshare") is None:
        return argv
    head = ["unshare", "--mount", "--propagation", "private", "/bin/sh", "-c", _EMPTY_STARTUP, "sh"]
    return [*head, str(len(files)), *files, *argv]


def _ensure_privsep_dir() -> None:
    # sshd refuses to start as root without its privilege separation directory.
    if os.geteuid() == 0:
        Path("/run/sshd").mkdir(mode=0o755, parents=True, exist_ok=True)


def start(instance: SshdInstance, timeout: float = 10.0) -> ProcessRecord:
    """Start ``sshd -D`` for ``instance`` as a child process and wait until its port accepts.

    Parameters
    ----------
    instance : SshdInstance
        From `prepare`.
    timeout : float
        Seconds to wait for the port.

    Returns
    -------
    devices.processes.ProcessRecord
        The sshd listener (its own session; stop it with `stop`).

    Raises
    ------
    SshdError
        If sshd exits or the port does not accept within ``timeout``; the log tail is
        in the message.
    """
    _ensure_privsep_dir()
    proc = subprocess.Popen(
        [sshd_binary(), "-D", "-f", str(instance.config), "-E", str(instance.log_file)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    rec = processes.record("sshd", proc.pid)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SshdError(f"sshd {instance.name} exited with {proc.returncode}: {_log_tail(instance)}")
        try:
            with socket.create_connection((LOOPBACK, instance.port), timeout=0.5):
                return rec
        except OSError:
            time.sleep(0.05)
    stop(rec)
    raise SshdError(f"sshd {instance.name} did not accept on {LOOPBACK}:{instance.port} in {timeout:g} s")


def _log_tail(instance: SshdInstance) -> str:
    try:
        return " | ".join(instance.log_file.read_text(errors="replace").strip().splitlines()[-5:]) or "(empty log)"
    except OSError:
        return "(no log)"


def stop(listener: ProcessRecord, grace: float = processes.GRACE_S) -> list[int]:
    """Stop sshd ``listener`` and its sessions (and their commands); return once they have exited.

    Open connections drop. A listener whose pid now belongs to another process is left
    alone.

    Returns
    -------
    list of int
        Pids that still run (empty on success).
    """
    return processes.stop([listener], grace=grace)


def known_hosts_line(instance: SshdInstance) -> str:
    """Return the known_hosts entry of ``instance``: ``[127.0.0.1]:PORT ssh-ed25519 AAAA...``."""
    key_type, blob = instance.host_key.with_name(instance.host_key.name + ".pub").read_text().split()[:2]
    return f"[{LOOPBACK}]:{instance.port} {key_type} {blob}"


def write_known_hosts(path: Path, lines: list[str]) -> None:
    """Add ``lines`` to known_hosts file ``path`` atomically, replacing entries for the same hosts.

    An existing line is dropped when it names a host of a new line (e.g.
    ``[127.0.0.1]:2222``), whatever its key type; other lines are kept in order.

    Parameters
    ----------
    path : pathlib.Path
        The known_hosts file (created with its parent directories).
    lines : list of str
        Entries ``HOSTS KEYTYPE BASE64``.
    """
    path = Path(path)
    new = [line.strip() for line in lines if line.strip()]
    replaced = {host for line in new for host in line.split()[0].split(",")}
    kept = []
    if path.exists():
        for line in path.read_text().splitlines():
            fields = line.split()
            if len(fields) >= 2 and not line.startswith("#"):
                if any(host in replaced for host in fields[0].split(",")):
                    continue
            kept.append(line)
    atomic_write(path, "".join(f"{line}\n" for line in kept + new))
