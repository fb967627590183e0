"""Stopping recorded processes: real process trees, pid-reuse guard, zombies, markers, forks during the stop."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

from devices import processes
from devices.processes import ProcessRecord
from tests.devices.conftest import cmdline_running, listening, sigkills, signals_sent, wait_for


def _spawn(argv: list[str], **env: str) -> tuple[subprocess.Popen[str], ProcessRecord]:
    proc = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True, start_new_session=True,
        env={**os.environ, **env},
    )  # fmt: skip
    return proc, processes.record("test", proc.pid)


def _state(pid: int) -> str | None:
    stat = processes.read_stat(pid)
    return None if stat is None else stat.state


def test_parse_stat_counts_fields_after_the_last_parenthesis() -> None:
    stat = "42 (a (weird) name) S 7 42 42 0 -1 4194560 1 0 0 0 0 0 0 0 20 0 1 0 12345 100 10"
    assert processes.parse_stat(stat) == processes.Stat("S", 7, 12345, 1)
    assert processes.descendants(1, {2: 1, 3: 2, 4: 9, 5: 3}) == [1, 2, 3, 5]
    own = processes.read_stat(os.getpid())
    assert own is not None and own.ppid == os.getppid() and own.state in "RS"


def test_stop_returns_when_a_tree_that_ignores_sigterm_and_is_stopped_has_exited() -> None:
    tag = f"1000.{uuid.uuid4().int % 10**6}"
    # sh ignores SIGTERM and so do its children (an ignored signal stays ignored across exec)
    proc, rec = _spawn(["sh", "-c", f'trap "" TERM; sleep {tag} & sleep {tag} & echo ready; wait'])
    assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
    tree = processes.descendants(proc.pid, processes.process_parents())
    assert len(tree) == 3
    os.kill(tree[1], signal.SIGSTOP)  # as a duty cycle leaves it
    wait_for(lambda: _state(tree[1]) == "T")
    start = time.monotonic()
    assert processes.stop([rec], grace=0.3) == []
    assert time.monotonic() - start >= 0.3  # SIGTERM was ignored: SIGKILL after the grace
    assert not cmdline_running(tag)
    assert all(processes.exited(pid, None) for pid in tree)
    assert processes.read_stat(proc.pid) is None  # our child: reaped, not left a zombie
    assert not processes.running(rec)


def test_a_detached_process_is_found_by_its_marker() -> None:
    tag = f"1000.{uuid.uuid4().int % 10**6}"
    unit = f"unit-{uuid.uuid4().hex[:8]}"
    # the sleep leaves the tree: its parent exits at once and init adopts it
    proc, rec = _spawn(["sh", "-c", f"sleep {tag} </dev/null >/dev/null 2>&1 & echo $!"], FB_TEST_UNIT=unit)
    assert proc.stdout is not None
    orphan = int(proc.stdout.readline())
    proc.wait()
    orphan_rec = processes.record("orphan", orphan)
    assert processes.running(orphan_rec) and processes.read_stat(orphan) is not None
    assert processes.stop([rec]) == []  # its recorded parent is gone: the orphan is not reached
    assert processes.running(orphan_rec)
    assert processes.marked("FB_TEST_UNIT", unit) == [orphan]
    assert processes.stop([rec], also=lambda: processes.marked("FB_TEST_UNIT", unit)) == []
    assert not processes.running(orphan_rec) and not cmdline_running(tag)


def test_a_reused_pid_is_never_signalled() -> None:
    proc, rec = _spawn(["sleep", "1000"])
    assert rec.start_time is not None
    other = ProcessRecord("reused", proc.pid, rec.start_time + 1)  # same pid, another process's start time
    assert not processes.running(other)
    assert not processes.send(proc.pid, rec.start_time + 1, signal.SIGTERM)
    assert processes.stop([other], grace=0.1) == []
    assert processes.stop([ProcessRecord("never seen", proc.pid, None)], grace=0.1) == []
    assert proc.poll() is None and processes.running(rec)  # untouched
    assert processes.stop([rec]) == []
    assert proc.poll() is not None or processes.read_stat(proc.pid) is None


def test_a_zombie_of_another_parent_counts_as_exited() -> None:
    # the child forks a grandchild that exits at once, and never reaps it
    code = "import os, time\npid = os.fork()\nif pid == 0:\n    os._exit(0)\nprint(pid, flush=True)\ntime.sleep(1000)\n"
    proc, rec = _spawn([sys.executable, "-c", code])
    assert proc.stdout is not None
    grandchild = int(proc.stdout.readline())
    wait_for(lambda: _state(grandchild) == "Z")
    zombie = processes.record("zombie", grandchild)
    assert not processes.running(zombie)
    with signals_sent() as sent:
        assert processes.stop([zombie]) == []
    assert sent == []  # nothing to signal, so nothing to wait for
    assert _state(grandchild) == "Z"  # not ours to reap: its parent still holds it
    assert processes.stop([rec]) == []
    assert processes.read_stat(proc.pid) is None


def test_our_zombie_child_is_reaped() -> None:
    proc, rec = _spawn(["true"])
    wait_for(lambda: _state(proc.pid) in ("Z", None))
    assert processes.exited(rec.pid, rec.start_time)
    assert processes.read_stat(proc.pid) is None


def test_children_forked_while_stopping_are_caught() -> None:
    tag = f"1000.{uuid.uuid4().int % 10**6}"
    # a parent that forks a long-lived child every 10 ms and leaves them behind when it ends
    proc, rec = _spawn(["sh", "-c", f"while :; do sleep {tag} & sleep 0.01; done"])
    try:
        wait_for(lambda: len(processes.descendants(proc.pid, processes.process_parents())) > 10)
    finally:
        assert processes.stop([rec]) == []
    wait_for(lambda: not cmdline_running(tag))


def test_a_threaded_program_gets_its_sigterm_in_the_main_thread() -> None:
    """A Python program whose main thread blocks on an Event runs its SIGTERM handler: no SIGKILL needed."""
    code = (
        "import signal, threading, time\n"
        "stop = threading.Event()\n"
        "signal.signal(signal.SIGTERM, lambda *_: stop.set())\n"
        "for _ in range(16):\n"
        "    threading.Thread(target=time.sleep, args=(1000,), daemon=True).start()\n"
        "print('ready', flush=True)\n"
        "stop.wait()\n"
        "print('handled', flush=True)\n"
    )
    proc, rec = _spawn([sys.executable, "-c", code])
    assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
    with signals_sent() as sent:
        assert processes.stop([rec], grace=5.0) == []
    assert sigkills(sent) == [], sent
    assert proc.stdout.read() == "handled\n"


def test_the_phone_endpoint_stops_on_sigterm(tmp_path: Path) -> None:
    """The emulated phone (threads blocked in accept and recv) exits through its SIGTERM handler."""
    from devices.emulation.sshd import free_port

    port, pidfile = free_port(), tmp_path / "endpoint.pid"
    endpoint = [sys.executable, "-m", "devices.emulation.adb_endpoint"]
    argv = [*endpoint, "--port", str(port), "--sandbox", str(tmp_path / "sandbox")]
    proc, rec = _spawn([*argv, "--pidfile", str(pidfile)])
    wait_for(lambda: listening(port))
    assert pidfile.read_text().strip() == str(proc.pid)
    with signals_sent() as sent:
        assert processes.stop([rec], grace=5.0) == []
    assert sigkills(sent) == [], sent
    assert not pidfile.exists()  # removed on the way out: it was not SIGKILLed


def test_terminate_as_interrupt_raises_once_and_restores_the_handlers() -> None:
    import pytest

    before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGHUP)
    seen: list[int] = []
    with pytest.raises(processes.Terminated) as caught, processes.terminate_as_interrupt():
        try:
            os.kill(os.getpid(), signal.SIGHUP)
            time.sleep(5)  # the handler runs at the next bytecode; never reached
        except processes.Terminated as first:
            seen.append(first.signum)
            # cleanup in progress: further signals are ignored, not raised into it
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.05)
            seen.append(-1)
            raise
    assert seen == [signal.SIGHUP, -1]
    assert isinstance(caught.value, KeyboardInterrupt) and str(caught.value) == "SIGHUP"
    assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGHUP)) == before


def test_a_killed_python_runs_its_finally_blocks_inside_terminate_as_interrupt(tmp_path: Path) -> None:
    flag = tmp_path / "cleaned"
    script = (
        "import pathlib, sys, time\n"
        "from devices.processes import terminate_as_interrupt\n"
        "with terminate_as_interrupt():\n"
        "    try:\n"
        "        print('ready', flush=True); time.sleep(30)\n"
        "    finally:\n"
        f"        pathlib.Path({str(flag)!r}).write_text('yes')\n"
    )
    env = {**os.environ, "PYTHONPATH": str(Path(processes.__file__).resolve().parents[1])}
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    assert proc.stdout is not None and proc.stdout.readline() == b"ready\n"
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=10)
    assert flag.read_text() == "yes"
    assert b"Terminated: SIGTERM" in err and proc.returncode == 1
