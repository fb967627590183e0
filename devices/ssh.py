"""`SSHTransport`: run commands on and copy files to an SSH device with paramiko.

Host keys are verified against a known_hosts file; authentication is by key only.
Commands run through the remote user's login shell, which must be POSIX (``sh``,
``bash``, ``dash``, ``zsh``...). On a command timeout the command's remote process
group is killed with SIGKILL over a second channel, then its channel is closed
(RFC 4254 ``signal`` requests are not used: OpenSSH refuses them for root logins).
Processes that left the group (``setsid``, daemons) are not killed; they lose their
output pipes and get SIGPIPE at their next write.

A streamed process (`SSHTransport.start`, `SSHProcess`) runs on its own session channel of
the same connection: stdin is the channel, stdout and stderr arrive apart; the shell's pid
tag (see `SSHTransport.run`) is taken off stderr. `SSHProcess.close` sends EOF on the
channel (the process sees the end of its stdin), waits the grace period for its exit
status, then kills its process group over a second channel and waits for the status.
"""

from __future__ import annotations

import getpass
import os
import posixpath
import socket
import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import paramiko

from devices.errors import (
    AuthenticationFailed,
    CommandTimeout,
    ConnectionLost,
    HostKeyRejected,
    TransportError,
    Unreachable,
)
from devices.files import atomic_path
from devices.fleet import Device
from devices.transport import RunResult, StreamingProcess, env_argv, quote_argv, read_capped, too_large

LOGIN_ATTEMPTS = 3


def _no_delay(client: paramiko.SSHClient) -> None:
    """Send the connection's small packets at once (``TCP_NODELAY``).

    With Nagle's algorithm on, an SFTP download's request that follows another small write
    waits for the server's delayed ACK: about 40 ms on Linux, on every other transfer.
    """
    transport = client.get_transport()
    sock = getattr(transport, "sock", None)
    if isinstance(sock, socket.socket) and sock.family in (socket.AF_INET, socket.AF_INET6):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


def _closed_during_login(exc: AuthenticationFailed) -> bool:
    # paramiko's words when the connection ends while it waits for the server's answer to an
    # authentication request; a refusal reads "Authentication failed." or names the methods left
    return "transport shut down or saw EOF" in str(exc)


class _HostKeyPolicy(paramiko.MissingHostKeyPolicy):
    """Refuse unknown host keys, or (trust on first use) accept and append them to the file."""

    def __init__(self, known_hosts: Path, trust_on_first_use: bool) -> None:
        self.known_hosts = known_hosts
        self.trust_on_first_use = trust_on_first_use

    def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey) -> None:
        if not self.trust_on_first_use:
            raise HostKeyRejected(
                f"{hostname}: host key {key.get_name()} {key.fingerprint} is not in {self.known_hosts} "
                "(add it there, or set trust_on_first_use for this device)"
            )
        client.get_host_keys().add(hostname, key.get_name(), key)
        self.known_hosts.parent.mkdir(parents=True, exist_ok=True)
        with open(self.known_hosts, "a") as out:
            out.write(f"{hostname} {key.get_name()} {key.get_base64()}\n")


class SSHTransport:
    """Transport for a device reached over SSH.

    Parameters
    ----------
    device : Device, optional
        Supplies ``host``, ``port``, ``user``, ``key_file``, ``known_hosts`` and
        ``trust_on_first_use``; explicit keyword arguments override it.
    host : str, optional
        Host name, address, or an alias from ``~/.ssh/config``.
    port : int, optional
        22 unless given (here or in ``~/.ssh/config``).
    user : str, optional
        Remote user; the current local user when ``None``.
    key_file : pathlib.Path, optional
        Private key; when ``None`` the ssh agent and default keys (``~/.ssh/id_*``) are tried.
    known_hosts : pathlib.Path, optional
        File host keys are verified against (``~/.ssh/known_hosts`` when ``None``).
    trust_on_first_use : bool, optional
        Accept an unknown host key and append it to ``known_hosts``. A changed key is
        always refused.
    connect_timeout : float
        Seconds for TCP connect, SSH banner and authentication.
    io_timeout : float
        Seconds a file transfer may wait for data before `CommandTimeout`.

    Notes
    -----
    The connection opens lazily on first use. If it has dropped when a command or
    transfer starts, it is reopened once; a second failure raises `ConnectionLost`.
    A connection that drops while a command runs raises `ConnectionLost` without
    re-running the command.
    """

    def __init__(
        self,
        device: Device | None = None,
        *,
        host: str | None = None,
        port: int | None = None,
        user: str | None = None,
        key_file: Path | str | None = None,
        known_hosts: Path | str | None = None,
        trust_on_first_use: bool | None = None,
        connect_timeout: float = 10.0,
        io_timeout: float = 60.0,
    ) -> None:
        def pick(explicit: Any, attr: str) -> Any:
            return explicit if explicit is not None else getattr(device, attr, None)

        host = pick(host, "host")
        if not host:
            raise ValueError("SSHTransport needs a host")
        port, user, key_file = pick(port, "port"), pick(user, "user"), pick(key_file, "key_file")
        config_path = Path.home() / ".ssh" / "config"
        if config_path.is_file():
            entry = paramiko.SSHConfig.from_path(str(config_path)).lookup(host)
            host = entry.get("hostname", host)
            port = port if port is not None else (int(entry["port"]) if "port" in entry else None)
            user = user if user is not None else entry.get("user")
            if key_file is None and entry.get("identityfile"):
                key_file = entry["identityfile"][0]
        self.host: str = host
        self.port: int = int(port) if port is not None else 22
        self.user: str = user or getpass.getuser()
        self.key_file = Path(os.path.expanduser(str(key_file))) if key_file is not None else None
        known = pick(known_hosts, "known_hosts")
        self.known_hosts = Path(os.path.expanduser(str(known or "~/.ssh/known_hosts")))
        self.trust_on_first_use = bool(pick(trust_on_first_use, "trust_on_first_use"))
        self.connect_timeout = connect_timeout
        self.io_timeout = io_timeout
        self._client: paramiko.SSHClient | None = None
        self._sftp: paramiko.SFTPClient | None = None

    @property
    def address(self) -> str:
        """``user@host:port``, for messages."""
        return f"{self.user}@{self.host}:{self.port}"

    # -- connection -------------------------------------------------------------------

    def connect(self) -> None:
        """Open the connection now (otherwise it opens on first use).

        A login that the server closes during authentication, rather than refusing it, is
        tried again up to `LOGIN_ATTEMPTS` times in all: a loaded or briefly stopped sshd
        does that, and a refused key is refused every time.

        Raises
        ------
        Unreachable, HostKeyRejected, AuthenticationFailed, TransportError
        """
        for attempt in range(1, LOGIN_ATTEMPTS + 1):
            try:
                self._connect_once()
                return
            except AuthenticationFailed as exc:
                if attempt == LOGIN_ATTEMPTS or not _closed_during_login(exc):
                    if attempt > 1:
                        raise AuthenticationFailed(f"{exc} (after {attempt} attempts)") from exc
                    raise
            time.sleep(0.25 * attempt)

    def _connect_once(self) -> None:
        self.close()
        client = paramiko.SSHClient()
        if self.known_hosts.is_file():
            client.load_host_keys(str(self.known_hosts))
        client.set_missing_host_key_policy(_HostKeyPolicy(self.known_hosts, self.trust_on_first_use))
        if self.key_file is not None and not self.key_file.is_file():
            raise AuthenticationFailed(f"{self.address}: key file {self.key_file} does not exist")
        try:
            client.connect(
                self.host,
                port=self.port,
                username=self.user,
                key_filename=str(self.key_file) if self.key_file is not None else None,
                allow_agent=self.key_file is None,
                look_for_keys=self.key_file is None,
                timeout=self.connect_timeout,
                banner_timeout=self.connect_timeout,
                auth_timeout=self.connect_timeout,
                channel_timeout=self.connect_timeout,
            )
        except TransportError:
            client.close()
            raise
        except paramiko.BadHostKeyException as exc:
            client.close()
            raise HostKeyRejected(
                f"{self.host}:{self.port}: host key CHANGED (got {exc.key.get_name()} {exc.key.fingerprint}, "
                f"{self.known_hosts} has {exc.expected_key.fingerprint}); refused"
            ) from exc
        except paramiko.AuthenticationException as exc:
            client.close()
            raise AuthenticationFailed(f"{self.address}: authentication failed: {exc}") from exc
        except (OSError, EOFError, paramiko.SSHException) as exc:
            # socket errors and timeouts, NoValidConnectionsError, or a peer that is no SSH server
            client.close()
            raise Unreachable(f"{self.address}: {type(exc).__name__}: {exc or 'no answer'}") from exc
        _no_delay(client)
        self._client = client

    def _active(self) -> paramiko.Transport | None:
        if self._client is None:
            return None
        transport = self._client.get_transport()
        return transport if transport is not None and transport.is_active() else None

    def _with_reconnect(self, what: str, action: Any) -> Any:
        """Call ``action()`` on a live connection; reconnect once if it dropped."""
        if self._client is None:
            self.connect()
        try:
            if self._active() is None:
                raise EOFError("connection is not active")
            return action()
        except (EOFError, OSError, paramiko.SSHException) as exc:
            if not self._dropped(exc):
                raise
            reason = f"{type(exc).__name__}: {exc}"
        try:
            self.connect()
            return action()
        except (TransportError, EOFError, OSError, paramiko.SSHException) as exc:
            if not isinstance(exc, TransportError) and not self._dropped(exc):
                raise
            self.close()
            raise ConnectionLost(
                f"{self.address}: {what}: connection dropped ({reason}); reconnect failed: {exc}"
            ) from exc

    def _dropped(self, exc: BaseException) -> bool:
        # an SFTP status error (e.g. no such file) is an OSError on a live connection
        return self._active() is None or isinstance(exc, (EOFError, paramiko.SSHException))

    def close(self) -> None:
        """Close the SFTP session and the connection, and return once the socket is released (idempotent).

        paramiko closes the socket while its reader thread may still sit in ``recv`` on
        it, which keeps the connection open until that ``recv`` times out; joining the
        thread makes ``close`` mean closed.
        """
        if self._sftp is not None:
            self._sftp.close()
            self._sftp = None
        if self._client is not None:
            reader = self._client.get_transport()
            self._client.close()
            self._client = None
            if reader is not None and reader is not threading.current_thread():
                reader.join(timeout=5.0)

    def __enter__(self) -> SSHTransport:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- commands ---------------------------------------------------------------------

    def run(self, argv: Sequence[str], timeout: float) -> RunResult:
        """Run ``argv`` on the device through its login shell, quoted by `quote_argv`.

        Parameters
        ----------
        argv : sequence of str
            Program and arguments.
        timeout : float
            Seconds from the command's start to its exit (connecting, at most
            ``connect_timeout``, comes before).

        Returns
        -------
        RunResult
            ``rc`` is ``128 + n`` when the remote command was killed by signal ``n``: the
            remote shell waits for it and exits with its status, since paramiko ignores
            OpenSSH's ``exit-signal``; ``seconds`` excludes connecting.

        Raises
        ------
        CommandTimeout
            The command did not finish in time; its remote process group was killed.
        OutputTooLarge
            It wrote more than `devices.transport.MAX_OUTPUT_BYTES` to stdout or stderr; its
            remote process group was killed.
        ConnectionLost
            The connection dropped and could not be reopened, or dropped mid-command.
        Unreachable, HostKeyRejected, AuthenticationFailed
            From the first connect.
        """
        chan, tag = self._open_tagged(argv, None, "run", wait=True)
        start = time.monotonic()
        deadline = start + timeout
        (out, err), readers, ended = read_capped([chan.recv, chan.recv_stderr], deadline)
        finished = ended and chan.status_event.wait(max(0.0, deadline - time.monotonic()))
        if not finished:  # over the output cap, past the deadline, or the connection gone
            lost = self._active() is None
            if not lost:
                self._kill_group(_split_pid(err.data(), tag)[0])
            chan.close()
            for reader in readers:
                reader.join(1.0)
            if out.over or err.over:
                raise too_large((out, err), ("stdout", "stderr"), self.address, argv[0])
            if lost:
                self.close()
                raise ConnectionLost(f"{self.address}: connection dropped while running {argv[0]!r}")
            raise CommandTimeout(f"{self.address}: {argv[0]!r} did not finish within {timeout:g} s (killed)")
        rc = chan.recv_exit_status()
        chan.close()
        if self._active() is None and rc == -1:
            self.close()
            raise ConnectionLost(f"{self.address}: connection dropped while running {argv[0]!r}")
        return RunResult(
            rc=rc,
            stdout=out.data().decode("utf-8", "replace"),
            stderr=_split_pid(err.data(), tag)[1].decode("utf-8", "replace"),
            seconds=time.monotonic() - start,
        )

    def start(self, argv: Sequence[str], env: Mapping[str, str] | None = None) -> SSHProcess:
        """Start ``argv`` through the login shell as a streamed process on its own channel.

        Parameters
        ----------
        argv : sequence of str
        env : mapping of str to str, optional
            Set for the command (through ``env NAME=VALUE``).

        Returns
        -------
        SSHProcess

        Raises
        ------
        ConnectionLost, Unreachable, HostKeyRejected, AuthenticationFailed
        """
        chan, tag = self._open_tagged(argv, env, "start")
        return SSHProcess(self, chan, tag, f"{argv[0]} on {self.address}")

    def _open_tagged(
        self, argv: Sequence[str], env: Mapping[str, str] | None, what: str, *, wait: bool = False
    ) -> tuple[paramiko.Channel, str]:
        """Open a session channel running ``argv``; return it and the tag of its pid line on stderr.

        The remote shell reports its pid (sshd made it a process group leader) on a line of
        stderr tagged with a nonce, so the command's whole process group can be killed
        remotely. It then exec-s the command in place, or with ``wait`` runs it and exits with
        its status, so that a command killed by a signal exits ``128 + n`` (the channel's
        ``exit-signal`` is lost to paramiko).
        """
        tag = f"__fleetbench_pid_{uuid.uuid4().hex[:12]}="
        quoted = quote_argv(env_argv(argv, env))
        # "rc=$?; exit $rc" keeps the command from being the shell's last one, which bash would exec
        command = f"echo {tag}$$ >&2; " + (f"{quoted}; rc=$?; exit $rc" if wait else f"exec {quoted}")

        def open_channel() -> paramiko.Channel:
            transport = self._active()
            assert transport is not None
            chan = transport.open_session(timeout=self.connect_timeout)
            chan.exec_command(command)
            return chan

        chan: paramiko.Channel = self._with_reconnect(f"{what} {argv[0]!r}", open_channel)
        return chan, tag

    def _kill_group(self, pid: int | None) -> None:
        """Best effort: SIGKILL remote process group ``pid`` over a new channel."""
        transport = self._active()
        if pid is None or transport is None:
            return
        try:
            # bounded, so that CommandTimeout comes soon after the timeout even on a bad link
            chan = transport.open_session(timeout=min(2.0, self.connect_timeout))
            chan.exec_command(quote_argv(["kill", "-KILL", "--", f"-{pid}"]))
            chan.status_event.wait(1.0)
            chan.close()
        except (OSError, EOFError, paramiko.SSHException):
            pass

    # -- files ------------------------------------------------------------------------

    def _sftp_client(self) -> paramiko.SFTPClient:
        if self._sftp is None or self._sftp.sock.closed:
            assert self._client is not None
            self._sftp = self._client.open_sftp()
            self._sftp.get_channel().settimeout(self.io_timeout)
        return self._sftp

    def _remote_path(self, sftp: paramiko.SFTPClient, remote: str) -> str:
        if remote == "~" or remote.startswith("~/"):
            # SFTP sessions start in the user's home directory
            remote = posixpath.join(sftp.normalize("."), remote[2:])
        return remote

    def put(self, local: Path, remote: str) -> None:
        """Upload ``local`` to ``remote`` atomically (temporary name, then rename).

        Parent directories are created; ``~/`` is the remote user's home; a relative
        path is relative to it.
        """

        def upload() -> None:
            sftp = self._sftp_client()
            target = self._remote_path(sftp, remote)
            _makedirs(sftp, posixpath.dirname(target))
            tmp = f"{target}.tmp-{uuid.uuid4().hex[:8]}"
            try:
                sftp.put(str(local), tmp)
                sftp.chmod(tmp, os.stat(local).st_mode & 0o7777)
                sftp.posix_rename(tmp, target)
            except BaseException:
                try:
                    sftp.remove(tmp)
                except (OSError, paramiko.SSHException, EOFError):
                    pass
                raise

        if not Path(local).is_file():
            raise FileNotFoundError(local)
        try:
            self._with_reconnect(f"put {remote!r}", upload)
        except TimeoutError as exc:
            self.close()
            raise CommandTimeout(f"{self.address}: put {remote!r}: no data for {self.io_timeout:g} s") from exc

    def get(self, remote: str, local: Path) -> None:
        """Download ``remote`` to ``local`` atomically (`devices.files.atomic_path`).

        Raises
        ------
        FileNotFoundError
            If ``remote`` does not exist.
        """
        try:
            with atomic_path(local) as tmp:

                def download() -> None:
                    sftp = self._sftp_client()
                    sftp.get(self._remote_path(sftp, remote), str(tmp))

                self._with_reconnect(f"get {remote!r}", download)
        except TimeoutError as exc:
            self.close()
            raise CommandTimeout(f"{self.address}: get {remote!r}: no data for {self.io_timeout:g} s") from exc


def _split_pid(err: bytes, tag: str) -> tuple[int | None, bytes]:
    """Return the pid reported on the line tagged ``tag`` and stderr without that line."""
    marker = tag.encode()
    at = err.find(marker)
    if at < 0 or (at > 0 and err[at - 1 : at] != b"\n"):
        return None, err
    end = err.find(b"\n", at)
    if end < 0:
        return None, err
    value = err[at + len(marker) : end]
    return (int(value) if value.isdigit() else None), err[:at] + err[end + 1 :]


def _makedirs(sftp: paramiko.SFTPClient, directory: str) -> None:
    if not directory or directory in ("/", "."):
        return
    try:
        sftp.stat(directory)
        return
    except FileNotFoundError:
        pass
    _makedirs(sftp, posixpath.dirname(directory))
    try:
        sftp.mkdir(directory)
    except OSError:
        sftp.stat(directory)  # created concurrently: fine; otherwise re-raise


class SSHProcess(StreamingProcess):
    """A `devices.transport.Process` on an SSH device (see `SSHTransport.start`).

    Parameters
    ----------
    transport : SSHTransport
        The connection the channel belongs to (used to kill the process group).
    chan : paramiko.Channel
        The session channel running the command.
    tag : str
        The pid tag the remote shell prints on stderr before ``exec``.
    description : str
    """

    def __init__(self, transport: SSHTransport, chan: paramiko.Channel, tag: str, description: str) -> None:
        self.transport = transport
        self.chan = chan
        self.pid: int | None = None
        self._tag = tag.encode()
        self._head = b""
        self._pid_seen = threading.Event()
        super().__init__(description, chan.sendall, chan.recv, chan.recv_stderr)

    def _filter_err(self, data: bytes) -> bytes:
        if self._pid_seen.is_set():
            return data
        self._head += data
        if b"\n" not in self._head:
            return b""
        pid, rest = _split_pid(self._head, self._tag.decode())
        self.pid = pid
        self._head = b""
        self._pid_seen.set()
        return rest

    def _alive(self) -> bool:
        return not self.chan.exit_status_ready() and not self.chan.closed and self.transport._active() is not None

    def _returncode(self) -> int | None:
        return self.chan.exit_status if self.chan.exit_status_ready() else None

    def _wait_returncode(self) -> int | None:
        self.chan.status_event.wait(1.0)
        return self._returncode()

    def _ended(self, what: str) -> TransportError:
        if self.transport._active() is None:
            return ConnectionLost(f"{self.description}: connection dropped ({what})")
        return super()._ended(what)

    def _terminate(self, grace: float) -> None:
        try:
            self.chan.shutdown_write()
        except (OSError, EOFError, paramiko.SSHException):
            pass
        if not self.chan.status_event.wait(grace):
            self._pid_seen.wait(1.0)
            self.transport._kill_group(self.pid)
            self.chan.status_event.wait(5.0)
        self.chan.close()
