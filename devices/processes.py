"""Processes fleetbench starts: recorded by pid and start time, stopped by pid, waited for.

Every process fleetbench starts and leaves running (an emulated device's sshd, the
phone's endpoint, forwarders, duty-cycle supervisors, an adb server) is recorded as a
`ProcessRecord`: its pid and its start time, field 22 of ``/proc/PID/stat`` (clock
ticks since boot). `stop` is the one way to end such processes. Decisions:

- **Identity.** A pid whose start time differs from the recorded one belongs to another
  process (the pid was reused) and is never signalled. Signals go through a pidfd
  (``os.pidfd_open``): the start time is compared after the pidfd is open, and the
  pidfd refers to that very process, so no reuse can slip in between check and signal.
  A record without a start time (the process was gone before it could be read) is
  never signalled.
- **Never by name.** Only recorded pids, their descendants (parent pids in ``/proc``),
  and pids a caller finds by its own means (``also``: a device's cgroup members, or
  processes carrying the device's marker in their environment, `marked`) are touched.
  This process and its ancestors are never touched.
- **Forks during the stop.** The set is frozen while it is collected (SIGSTOP, then
  collected again until nothing new appears: a stopped process cannot fork), so a child
  forked while ``/proc`` is read cannot escape to init.
- **Order.** SIGTERM to everything while it is frozen (a child forked between a
  parent's SIGCONT and its SIGTERM would escape), then SIGCONT; SIGTERM once more to
  the multi-threaded processes still running after `RETERM_S`; SIGKILL to whatever
  still runs after ``grace``; wait. The second SIGTERM is for multi-threaded programs: a signal pending on a stopped
  process is taken by whichever thread resumes first, and a Python program whose main
  thread blocks (``Event.wait()``) then never runs its handler; sent to a running
  process, the kernel gives it to the main thread. (Measured: without it the phone
  endpoint sometimes needed SIGKILL after the 3 s grace.) A process that something else
  keeps stopping (a duty-cycle supervisor) has the same problem, so callers stop such
  supervisors first.
- **Exited** means ``/proc/PID`` is gone or the process is a zombie: it holds no port,
  no file and no memory any more. A zombie child of this process is reaped. A zombie of
  another parent is that parent's to reap, and `stop` does not wait for it: init adopts
  the processes of a ``fleet up`` that has exited, and an init may reap late or never
  (a second or more after they exited is common), so ``ps`` may list
  ``<defunct>`` entries for a moment after ``fleet down`` although nothing runs.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

#: Seconds SIGTERM gets before SIGKILL.
GRACE_S = 3.0
#: Seconds after the first SIGTERM at which processes still running get a second one.
RETERM_S = 0.2
#: Seconds SIGKILL gets (a process in uninterruptible sleep dies when it leaves it).
KILL_WAIT_S = 5.0
#: Polling interval while waiting.
POLL_S = 0.01


@dataclass(frozen=True)
class ProcessRecord:
    """A process fleetbench started.

    Attributes
    ----------
    role : str
        What it is (``sshd``, ``adb-endpoint``, ``duty-cycle``, ``forwarder``, ``adb-server``).
    pid : int
    start_time : int or None
        Field 22 of ``/proc/PID/stat`` when it was started (guards against pid reuse).
    """

    role: str
    pid: int
    start_time: int | None


@dataclass(frozen=True)
class Stat:
    """The fields of ``/proc/PID/stat`` this module reads.

    Attributes
    ----------
    state : str
        One letter (``R``, ``S``, ``T``, ``Z`` for a zombie, ...).
    ppid : int
    start_time : int
        Clock ticks since boot.
    threads : int
    cpu_ticks : int
        CPU time the process has used (``utime + stime``), in clock ticks.
    """

    state: str
    ppid: int
    start_time: int
    threads: int
    cpu_ticks: int = 0


def parse_stat(text: str) -> Stat:
    """Parse the text of ``/proc/PID/stat``.

    The command name (field 2) may contain spaces and parentheses, so fields are
    counted after its last ``)``.

    Raises
    ------
    ValueError
        If the text is not a stat line.
    """
    try:
        rest = text[text.rindex(")") + 2 :].split()
        return Stat(rest[0], int(rest[1]), int(rest[19]), int(rest[17]), int(rest[11]) + int(rest[12]))
    except IndexError:
        raise ValueError(f"not a /proc/PID/stat line: {text[:80]!r}") from None


def read_stat(pid: int) -> Stat | None:
    """Return ``pid``'s `Stat`, or None when it does not exist."""
    try:
        return parse_stat(Path(f"/proc/{pid}/stat").read_text())
    except (OSError, ValueError):
        return None


def start_time(pid: int) -> int | None:
    """Return the start time (clock ticks since boot) of ``pid``, or None if it is gone."""
    stat = read_stat(pid)
    return None if stat is None else stat.start_time


def record(role: str, pid: int) -> ProcessRecord:
    """Return the record of running process ``pid`` (call it right after starting the process)."""
    return ProcessRecord(role, pid, start_time(pid))


def exited(pid: int, started: int | None) -> bool:
    """Whether the process ``pid`` started at ``started`` has exited (a zombie child of ours is reaped).

    A pid now held by a process with another start time counts as exited: the recorded
    process is gone. ``started=None`` means "whatever runs as ``pid``".
    """
    stat = read_stat(pid)
    if stat is None or (started is not None and stat.start_time != started):
        return True
    if stat.state in "ZX":
        if stat.ppid == os.getpid():
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)
        return True
    return False


def running(rec: ProcessRecord) -> bool:
    """Whether recorded process ``rec`` still runs (a record without start time never does)."""
    return rec.start_time is not None and not exited(rec.pid, rec.start_time)


def process_parents() -> dict[int, int]:
    """Return pid -> ppid for every process in ``/proc``."""
    out: dict[int, int] = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit() and (stat := read_stat(int(entry.name))) is not None:
            out[int(entry.name)] = stat.ppid
    return out


def descendants(root: int, parents: Mapping[int, int]) -> list[int]:
    """Return ``root`` and every process below it, given a pid -> ppid map.

    Parameters
    ----------
    root : int
    parents : mapping of int to int

    Returns
    -------
    list of int
        Breadth-first, ``root`` first.
    """
    children: dict[int, list[int]] = {}
    for pid, ppid in parents.items():
        children.setdefault(ppid, []).append(pid)
    out, queue, seen = [], [root], {root}
    while queue:
        pid = queue.pop(0)
        out.append(pid)
        for child in children.get(pid, ()):
            if child not in seen:
                seen.add(child)
                queue.append(child)
    return out


def marked(name: str, value: str) -> list[int]:
    """Return the pids whose environment holds ``name=value``.

    Processes inherit their environment, so a marker put into the environment of
    what fleetbench starts is found again in every process started below it, also in
    one that left the process tree (``setsid``, a double fork). Processes whose
    environment cannot be read (another user's, without privileges) are not found.
    """
    entry = f"{name}={value}".encode()
    found = []
    for item in os.scandir("/proc"):
        if not item.name.isdigit():
            continue
        try:
            environ = Path(item.path, "environ").read_bytes()
        except OSError:
            continue
        if entry in environ.split(b"\0"):
            found.append(int(item.name))
    return found


def _ancestors() -> set[int]:
    """Return this process, its parents up to init, and init: never signalled."""
    out, pid = {1}, os.getpid()
    while pid > 1 and pid not in out:
        out.add(pid)
        stat = read_stat(pid)
        pid = stat.ppid if stat is not None else 1
    return out


def send(pid: int, started: int, sig: int) -> bool:
    """Send ``sig`` to ``pid`` only if it is still the process started at ``started``.

    Returns
    -------
    bool
        Whether the signal was sent.
    """
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return False
    except OSError:  # no pidfd on this kernel: check, then signal by pid
        fd = -1
    try:
        if start_time(pid) != started:
            return False
        if fd >= 0:
            signal.pidfd_send_signal(fd, sig)
        else:
            os.kill(pid, sig)
        return True
    except (ProcessLookupError, PermissionError):
        return False
    finally:
        if fd >= 0:
            os.close(fd)


def _wait(targets: Mapping[int, int], until: Callable[[int, int], bool], seconds: float) -> list[int]:
    """Wait up to ``seconds`` for ``until(pid, start)`` to hold for every target; return the others."""
    deadline = time.monotonic() + seconds
    while True:
        left = [pid for pid, started in targets.items() if not until(pid, started)]
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(POLL_S)


def stop(
    records: Iterable[ProcessRecord],
    *,
    also: Callable[[], Iterable[int]] | None = None,
    grace: float = GRACE_S,
    kill_wait: float = KILL_WAIT_S,
) -> list[int]:
    """Stop recorded processes, their descendants and what ``also`` finds; return when they have exited.

    Parameters
    ----------
    records : iterable of ProcessRecord
        Processes to stop; one whose start time no longer matches is left alone.
    also : callable, optional
        Returns further pids that belong to the same unit (cgroup members, marked
        processes); called again on each collection pass.
    grace : float
        Seconds between SIGTERM and SIGKILL; 0 sends SIGKILL right away (a crash).
    kill_wait : float
        Seconds to wait for SIGKILLed processes.

    Returns
    -------
    list of int
        Pids that still run (empty on success).
    """
    keep = _ancestors()
    targets: dict[int, int] = {}
    for rec in records:
        if rec.start_time is not None and not exited(rec.pid, rec.start_time) and rec.pid not in keep:
            targets[rec.pid] = rec.start_time

    def collect() -> None:
        """Freeze every target, adding descendants and ``also`` pids until no new one appears."""
        for _ in range(50):
            for pid, started in list(targets.items()):
                send(pid, started, signal.SIGSTOP)
            parents = process_parents()
            found = {child for pid in targets for child in descendants(pid, parents)}
            found.update(also() if also is not None else ())
            new = {}
            for pid in found - targets.keys() - keep:
                stat = read_stat(pid)
                if stat is not None and stat.state not in "ZX":
                    new[pid] = stat.start_time
            if not new:
                return
            targets.update(new)

    collect()
    if not targets:
        return []
    if grace > 0:
        for sig in (signal.SIGTERM, signal.SIGCONT):
            for pid, started in targets.items():
                send(pid, started, sig)
        _wait(targets, exited, min(RETERM_S, grace))
        for pid, started in targets.items():
            stat = read_stat(pid)
            if stat is not None and stat.start_time == started and stat.state not in "ZX" and stat.threads > 1:
                send(pid, started, signal.SIGTERM)
        _wait(targets, exited, max(grace - RETERM_S, 0.0))
        collect()  # a handler may have forked
    for pid, started in targets.items():
        if not exited(pid, started):
            send(pid, started, signal.SIGKILL)
    return _wait(targets, exited, kill_wait)


class Terminated(KeyboardInterrupt):
    """Raised in the main thread when this process is asked to end (`terminate_as_interrupt`).

    A subclass of KeyboardInterrupt, so every path that already cleans up after Ctrl-C
    (stopping an emulated fleet, storing what a campaign measured, printing how to
    resume) does the same after ``kill`` or a closed terminal.

    Parameters
    ----------
    signum : int
        The signal received.
    """

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


#: Signals `terminate_as_interrupt` turns into `Terminated`: ``kill``'s default and a closed terminal.
TERMINATING_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


@contextlib.contextmanager
def terminate_as_interrupt(signals: Iterable[int] = TERMINATING_SIGNALS) -> Iterator[None]:
    """Turn ``signals`` into `Terminated` in the main thread while the block runs.

    Python's default for SIGTERM and SIGHUP is to die at once, without ``finally``
    blocks: processes this one started (an emulated fleet, resident runners) would be
    left running. Inside the block the first such signal raises `Terminated` where the
    main thread is; later ones are ignored, so the cleanup it starts runs to its end (a
    Python handler, not ``SIG_IGN``: ignored signals would be inherited by the processes
    the cleanup starts). The previous handlers come back after the block. Outside the main
    thread, where no handler can be set, the block runs unchanged.

    Parameters
    ----------
    signals : iterable of int
        Default `TERMINATING_SIGNALS`.

    Yields
    ------
    None
    """
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    chosen = tuple(signals)
    raised = False

    def handler(signum: int, frame: object) -> None:
        nonlocal raised
        if not raised:
            raised = True
            raise Terminated(signum)

    previous = {sig: signal.signal(sig, handler) for sig in chosen}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
