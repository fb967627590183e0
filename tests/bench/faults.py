"""Faults survived, counted: inject each fault into real campaigns and FL runs on the emulated fleet.

Run from the repository root::

    python -m tests.bench.faults [--repeats 10] [--only sshd,kill-campaign,...] [--seed 0]

It copies ``devices/fleets/emulated.yaml`` onto free loopback ports with a private state
directory (two SSH devices, ``fast`` and ``mid``), starts it, and injects each fault
``--repeats`` times at a seeded random point. Per fault it prints how many were injected and
survived, the cells or rounds lost, the median and worst time to recover (from the fault to
the work being whole again), and the error the user saw. The faults:

``sshd``
    a device's ``sshd`` SIGKILLed mid-campaign and started again seconds later: the campaign
    records the device's cells with their reason and goes on; ``--resume`` measures exactly
    the cells that are missing.
``link``
    the device's network link taken down for seconds as a campaign starts pushing it its
    artifacts (its cache emptied first; the device lives in a network namespace, and with
    the link down every packet is dropped): each cell is measured after the link returns or
    fails with its reason, the pushed files are verified by their hash on the device before
    use, and ``--resume`` completes.
``kill-campaign``
    ``fleetbench profile`` SIGKILLed at a random point: the store passes
    ``PRAGMA integrity_check``, every cell printed as finished is stored, ``--resume`` completes.
``kill-fl``
    ``fleetbench fl run`` SIGKILLed at a random point after its first round: the store passes
    its integrity check and the run, resumed from its checkpoint, ends with a global model
    bit-identical to an uninterrupted run's.
``concurrent``
    two campaigns writing one store at once: both finish, every cell is stored once, and
    nothing fails on a locked database.
``resident``
    the resident runner SIGKILLed on a device mid-request of an FL run over the fleet: that
    client fails with its reason, the runner restarts, and the run finishes every round.
``updown``
    ``fleet down`` followed at once by ``fleet up`` on the same ports, twice per injection: no
    failed start, and no process of the fleet left once it is down.
``host-disk``
    the artifact cache on a filesystem too small for the export (a tmpfs; root only): one
    line naming the path, the store intact, and ``--resume`` completes once space is freed.
``device-disk``
    a device's work directory on a filesystem too small for its artifacts: its cells are
    recorded as out of space with the reason, the other device's cells are measured, and
    ``--resume`` completes once the device has room again.
``device-memory``
    a device's memory limit (its cgroup; root only) lowered between what a quarter width
    and the full width of a wide batch need, measured first: the full width's cell is
    recorded as out of memory, the quarter width and the other device are measured, and
    ``--resume`` completes once the limit is back.

A fault is survived when its checks hold; the table's last column is the first line the user
saw about it (the cell's or client's reason, or the command's own error).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import re
import shutil
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import yaml

from devices import processes
from devices.emulation import emulate
from devices.fleet import Fleet
from devices.fleetfile import load_fleet
from tests.devices.conftest import cmdlines, copy_example_fleet

#: The bench's cells: small enough that one campaign takes seconds, wide enough to be a campaign.
PROFILE = ("--model", "fjord-cnn", "--batch", "4", "--steps", "3", "--warmup", "1",
           "--precision", "0", "--passes", "1", "--optimizer", "sgd", "--no-round-cost", "--timeout", "60")  # fmt: skip
#: The FL run the kill and resume is compared on (in-process clients: the fault is the host's).
FL_RUN = ("--strategy", "fjord", "--model", "fjord-cnn", "--dataset", "digits", "--clients", "4", "--seed", "3")
DEVICES = ("fast", "mid")
FAULTS = ("sshd", "link", "kill-campaign", "kill-fl", "concurrent", "resident", "updown", "host-disk", "device-disk",
          "device-memory")  # fmt: skip
#: The memory fault's cells: a batch at which the full width needs some 100 MiB more than a quarter
#: (the runtime's own share is the same), one step each (the first step reaches the peak).
MEMORY_CELLS = ("--batch", "1024", "--widths", "0.25,1", "--steps", "1", "--warmup", "1")
#: What a campaign prints once its store is open and its devices are about to be measured.
CAMPAIGN_STARTED = r"^isolation plan"
CELL_OK = re.compile(r"^\[(\S+)\] \d+/\d+ w(\d\.\d\d) b\d+ \S+ ok\b", re.M)


@dataclass(frozen=True)
class Outcome:
    """One injection of one fault.

    Attributes
    ----------
    survived : bool
        Every check of the fault held.
    lost : int
        Finished cells (or FL rounds) that the fault lost.
    recover_seconds : float
        From the fault to the work being whole again.
    seen : str
        The first line the user saw about the fault ('' when none).
    why : str
        Which check failed, when one did.
    """

    survived: bool
    lost: int
    recover_seconds: float
    seen: str = ""
    why: str = ""


@dataclass(frozen=True)
class Pace:
    """How long the faults that last a while last, and how much work an injection runs.

    The defaults are the bench's; a shorter pace keeps every fault and check, with fewer
    seconds of fault and fewer rounds and cycles around it.

    Attributes
    ----------
    sshd_down : tuple[float, float]
        Range of the seconds a killed ``sshd`` stays down.
    link_down : tuple[float, float]
        Range of the seconds a device's link stays down.
    fl_rounds : int
        Rounds of the FL run that is killed and resumed (it is killed after round 1 to
        ``fl_rounds - 2``).
    resident_rounds : int
        Rounds of the FL run over the fleet whose resident runner is killed in its first round.
    resident_options : tuple[str, ...]
        More ``fl run`` options of that run (``--opt k=2``: FjORD's two widths, two artifact
        sets to export instead of five).
    updown_cycles : int
        ``fleet down`` / ``fleet up`` cycles per injection of the updown fault.
    """

    sshd_down: tuple[float, float] = (1.0, 4.0)
    link_down: tuple[float, float] = (1.0, 5.0)
    fl_rounds: int = 8
    resident_rounds: int = 3
    resident_options: tuple[str, ...] = ()
    updown_cycles: int = 2


@dataclass
class Bench:
    """The emulated fleet the faults are injected into, and the shared artifact cache."""

    work: Path
    fleet_file: Path
    fleet: Fleet
    artifacts: Path
    rng: random.Random
    widths: tuple[float, ...] = (0.25, 0.5, 0.75, 1.0)
    pace: Pace = Pace()
    counter: int = 0
    uninterrupted: dict[str, np.ndarray] = field(default_factory=dict)
    memory_peaks: dict[str, tuple[int | None, int | None]] = field(default_factory=dict)

    def fresh(self, stem: str) -> Path:
        """A new directory for one injection."""
        self.counter += 1
        path = self.work / f"{stem}-{self.counter}"
        path.mkdir()
        return path


def fleetbench(*argv: str, cwd: Path, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    """Run the ``fleetbench`` command line to its end."""
    return subprocess.run([sys.executable, "-m", "fleetbench", *argv], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, check=False)  # fmt: skip


@contextlib.contextmanager
def started(*argv: str, cwd: Path) -> Iterator[subprocess.Popen[str]]:
    """Start the ``fleetbench`` command line; its output goes to ``cwd/out.txt`` and ``cwd/err.txt``."""
    with (cwd / "out.txt").open("w") as out, (cwd / "err.txt").open("w") as err:
        proc = subprocess.Popen([sys.executable, "-m", "fleetbench", *argv], cwd=cwd, stdout=out, stderr=err, text=True)
        try:
            yield proc
        finally:
            if proc.poll() is None:
                proc.kill()
            proc.wait()


def wait_for(path: Path, pattern: str, proc: subprocess.Popen[str], timeout: float = 600) -> bool:
    """Wait until ``pattern`` appears in ``path`` (True) or ``proc`` ends first (False)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if re.search(pattern, path.read_text(), re.M):
            return True
        if proc.poll() is not None:
            return bool(re.search(pattern, path.read_text(), re.M))
        time.sleep(0.05)
    raise TimeoutError(f"{pattern!r} not seen in {path} within {timeout:g} s")


def profile(bench: Bench, db: Path, *extra: str) -> tuple[str, ...]:
    """The argv of the bench's campaign into ``db``."""
    widths = ",".join(f"{w:g}" for w in bench.widths)
    return ("profile", "--fleet", str(bench.fleet_file), *PROFILE, "--widths", widths, "--db", str(db),
            "--artifacts", str(bench.artifacts), *extra)  # fmt: skip


def integrity(db: Path) -> str:
    """``PRAGMA integrity_check`` of ``db`` (``ok`` when intact)."""
    with contextlib.closing(sqlite3.connect(db)) as con:
        return str(con.execute("PRAGMA integrity_check").fetchone()[0])


def ok_cells(db: Path) -> set[tuple[str, float]]:
    """(device, width) of every cell whose latest row in ``db`` is ok."""
    if not db.exists():
        return set()
    with contextlib.closing(sqlite3.connect(db)) as con:
        rows = con.execute(
            "SELECT device, width, status FROM cells WHERE id IN (SELECT max(id) FROM cells GROUP BY cell_key)"
        ).fetchall()
    return {(d, round(w, 2)) for d, w, status in rows if status == "ok"}


def expected_cells(bench: Bench) -> set[tuple[str, float]]:
    """Every (device, width) of the bench's campaign."""
    return {(d, w) for d in DEVICES for w in bench.widths}


def printed_ok(text: str) -> set[tuple[str, float]]:
    """(device, width) of every cell a campaign's progress printed as finished."""
    return {(d, float(w)) for d, w in CELL_OK.findall(text)}


def first_failure(text: str) -> str:
    """The first line of a campaign's output that reports a failed cell or an error."""
    for line in text.splitlines():
        if line.startswith("[") and " ok" not in line.split(":", 1)[0]:
            return line
        if line.startswith(("fleetbench: error", "error:")):
            return line
    return ""


def resume(bench: Bench, db: Path, cwd: Path) -> tuple[bool, str]:
    """``--resume`` the bench's campaign into ``db``; whether it completed, and what it printed."""
    done = fleetbench(*profile(bench, db, "--resume"), cwd=cwd)
    return done.returncode == 0 and ok_cells(db) == expected_cells(bench), done.stdout + done.stderr


def device_state(bench: Bench, name: str) -> emulate.DeviceState:
    """The emulated device's state (its processes and confinement) as `fleet up` left it."""
    state = emulate.load_state(bench.fleet.state_dir).get(name)
    if state is None:
        raise RuntimeError(f"{name} is not up")
    return state


def forget_deployments(bench: Bench, name: str) -> None:
    """Empty the device's content-addressed cache, its sets and runner, so that the next campaign pushes them."""
    workdir = Path(str(bench.fleet.device(name).workdir))
    for part in ("cas", "sets", "runner"):
        shutil.rmtree(workdir / part, ignore_errors=True)


def bring_up(bench: Bench) -> None:
    """Start every device that is down (those up are kept)."""
    result = emulate.up(bench.fleet, say=lambda line: None)
    if not result.ok:
        raise RuntimeError(f"fleet up failed: {result}")


# --------------------------------------------------------------------------- the faults


def sshd_killed(bench: Bench) -> Outcome:
    """SIGKILL a device's sshd mid-campaign, start it again seconds later, then resume."""
    cwd, victim = bench.fresh("sshd"), bench.rng.choice(DEVICES)
    db, delay, down = cwd / "fleetbench.db", bench.rng.uniform(0.0, 4.0), bench.rng.uniform(*bench.pace.sshd_down)
    with started(*profile(bench, db), cwd=cwd) as proc:
        wait_for(cwd / "err.txt", CAMPAIGN_STARTED, proc)
        time.sleep(delay)
        fault_at = time.monotonic()
        sshd = next(rec for rec in device_state(bench, victim).processes if rec.role == "sshd")
        processes.stop([sshd], grace=0)
        time.sleep(down)
        bring_up(bench)
        rc = proc.wait(timeout=900)
    text = (cwd / "err.txt").read_text()
    before = ok_cells(db)
    lost = len(printed_ok(text) - before)
    if rc not in (0, 1) or integrity(db) != "ok":
        return Outcome(False, lost, 0.0, first_failure(text), f"profile exited {rc}")
    whole, resumed = resume(bench, db, cwd)
    missing = len(expected_cells(bench) - before)
    skipped = re.search(r"(\d+) cell\(s\) were already measured and skipped", resumed)
    exact = missing == len(expected_cells(bench)) - (int(skipped.group(1)) if skipped else 0)
    survived = whole and lost == 0 and exact
    return Outcome(survived, lost, time.monotonic() - fault_at, first_failure(text),
                   "" if survived else f"resume whole={whole} exact={exact}")  # fmt: skip


def link_down(bench: Bench) -> Outcome:
    """Take a device's link down for seconds mid-campaign (every packet dropped), then resume what failed."""
    cwd, victim = bench.fresh("link"), bench.rng.choice(DEVICES)
    db, delay, down = cwd / "fleetbench.db", bench.rng.uniform(0.0, 1.0), bench.rng.uniform(*bench.pace.link_down)
    host_if = device_state(bench, victim).host_if
    if host_if is None:
        return Outcome(False, 0, 0.0, "", f"{victim} has no network namespace (run as root)")
    link = ["ip", "link", "set", "dev", host_if]  # the host's end of the device's veth pair
    forget_deployments(bench, victim)  # the campaign then starts by pushing the device everything
    with started(*profile(bench, db), cwd=cwd) as proc:
        wait_for(cwd / "err.txt", CAMPAIGN_STARTED, proc)
        time.sleep(delay)
        fault_at = time.monotonic()
        subprocess.run([*link, "down"], check=True)
        time.sleep(down)
        subprocess.run([*link, "up"], check=True)
        rc = proc.wait(timeout=900)
    text = (cwd / "err.txt").read_text()
    lost = len(printed_ok(text) - ok_cells(db))
    if rc not in (0, 1) or integrity(db) != "ok":
        return Outcome(False, lost, 0.0, first_failure(text), f"profile exited {rc}")
    whole = rc == 0 and ok_cells(db) == expected_cells(bench)
    if not whole:
        whole, _ = resume(bench, db, cwd)
    return Outcome(whole and lost == 0, lost, time.monotonic() - fault_at, first_failure(text),
                   "" if whole else "resume did not complete")  # fmt: skip


def campaign_killed(bench: Bench) -> Outcome:
    """SIGKILL ``fleetbench profile`` at a random point; check the store and resume."""
    cwd = bench.fresh("kill-campaign")
    db, delay = cwd / "fleetbench.db", bench.rng.uniform(0.0, 6.0)
    with started(*profile(bench, db), cwd=cwd) as proc:
        wait_for(cwd / "err.txt", CAMPAIGN_STARTED, proc)
        time.sleep(delay)
        fault_at = time.monotonic()
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    text = (cwd / "err.txt").read_text()
    intact = integrity(db)
    lost = len(printed_ok(text) - ok_cells(db))
    whole, resumed = resume(bench, db, cwd)
    survived = intact == "ok" and lost == 0 and whole
    return Outcome(survived, lost, time.monotonic() - fault_at, f"killed after {len(printed_ok(text))} cell(s)",
                   "" if survived else f"integrity {intact}, whole {whole}: {resumed[-300:]}")  # fmt: skip


def final_global(db: Path) -> dict[str, np.ndarray]:
    """The global model of FL run 1 in ``db``, from its last checkpoint."""
    from fl.runlog import RunLog
    from harness.store import ProfileStore

    with ProfileStore(db) as store:
        checkpoint = RunLog(store).load_checkpoint(1)
    if checkpoint is None:
        raise RuntimeError(f"no checkpoint of run 1 in {db}")
    return {k: np.asarray(v) for k, v in dict(checkpoint[1]["strategy"]["global"]).items()}


def fl_killed(bench: Bench) -> Outcome:
    """SIGKILL ``fleetbench fl run`` after its first round; resume; compare with an uninterrupted run."""
    rounds = ("--rounds", str(bench.pace.fl_rounds))
    if not bench.uninterrupted:
        cwd = bench.fresh("fl-reference")
        done = fleetbench("fl", "run", *FL_RUN, *rounds, "--db", str(cwd / "fl.db"), cwd=cwd)
        if done.returncode != 0:
            raise RuntimeError(f"the uninterrupted FL run failed:\n{done.stderr[-2000:]}")
        bench.uninterrupted = final_global(cwd / "fl.db")
    cwd = bench.fresh("kill-fl")
    db = cwd / "fl.db"
    with started("fl", "run", *FL_RUN, *rounds, "--db", str(db), cwd=cwd) as proc:
        wait_for(cwd / "err.txt", rf"^round {bench.rng.randint(1, bench.pace.fl_rounds - 2)}/", proc)
        time.sleep(bench.rng.uniform(0.0, 1.5))
        fault_at = time.monotonic()
        finished = proc.poll() is not None
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    intact = integrity(db)
    done = fleetbench("fl", "run", "--resume", "1", *rounds, "--db", str(db), cwd=cwd)
    if done.returncode != 0 or intact != "ok":
        return Outcome(False, 0, 0.0, done.stderr.strip().splitlines()[-1:][0] if done.stderr.strip() else "",
                       f"resume exited {done.returncode}, integrity {intact}")  # fmt: skip
    got = final_global(db)
    same = got.keys() == bench.uninterrupted.keys() and all(
        np.array_equal(got[k], bench.uninterrupted[k]) for k in got
    )
    logged = len(re.findall(r"^round \d+/", (cwd / "err.txt").read_text(), re.M))
    seen = "the run had finished before the kill" if finished else f"killed after {logged} round(s)"
    return Outcome(same, 0, time.monotonic() - fault_at, seen, "" if same else "not bit-identical")


def concurrent(bench: Bench) -> Outcome:
    """Two campaigns (different widths) write one store at once."""
    cwd = bench.fresh("concurrent")
    db = cwd / "fleetbench.db"
    half = len(bench.widths) // 2
    argvs = []
    for widths in (bench.widths[:half], bench.widths[half:]):
        argv = list(profile(bench, db))
        argv[argv.index("--widths") + 1] = ",".join(f"{w:g}" for w in widths)
        argvs.append(argv)
    start = time.monotonic()
    procs = []
    for i, argv in enumerate(argvs):
        sub = cwd / f"c{i}"
        sub.mkdir()
        procs.append((sub, subprocess.Popen([sys.executable, "-m", "fleetbench", *argv], cwd=sub, text=True,
                                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)))  # fmt: skip
    outputs = [(proc.communicate(timeout=900)[0], proc.returncode) for _, proc in procs]
    locked = [line for text, _ in outputs for line in text.splitlines() if "locked" in line]
    with contextlib.closing(sqlite3.connect(db)) as con:
        counts = con.execute("SELECT count(*) FROM cells GROUP BY cell_key").fetchall()
    once = len(counts) == len(expected_cells(bench)) and all(n == 1 for (n,) in counts)
    survived = all(rc == 0 for _, rc in outputs) and not locked and once and integrity(db) == "ok"
    return Outcome(survived, len(expected_cells(bench) - ok_cells(db)), time.monotonic() - start,
                   locked[0] if locked else "", "" if survived else f"rcs {[rc for _, rc in outputs]}, once {once}")


def _resident_pids(bench: Bench, device: str) -> list[int]:
    workdir = str(bench.fleet.device(device).workdir or "").replace("~", "")
    return [pid for pid, line in cmdlines().items() if "serve" in line and "runner" in line and workdir in line]


def resident_killed(bench: Bench) -> Outcome:
    """SIGKILL the resident runner on a device mid-request of an FL run over the fleet."""
    cwd, victim = bench.fresh("resident"), bench.rng.choice(DEVICES)
    db = cwd / "fl.db"
    argv = ("fl", "run", "--fleet", str(bench.fleet_file), "--artifacts", str(bench.artifacts), *FL_RUN,
            *bench.pace.resident_options, "--rounds", str(bench.pace.resident_rounds), "--db", str(db))  # fmt: skip
    with started(*argv, cwd=cwd) as proc:
        deadline = time.monotonic() + 300
        while not (pids := _resident_pids(bench, victim)) and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(bench.rng.uniform(0.0, 1.0))
        fault_at = time.monotonic()
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        rc = proc.wait(timeout=900)
    last = bench.pace.resident_rounds
    rounds = re.findall(rf"^round (\d+)/{last}: clients ok (\d+) failed (\d+)", (cwd / "err.txt").read_text(), re.M)
    with contextlib.closing(sqlite3.connect(db)) as con:
        failed = con.execute(
            "SELECT device, message FROM fl_client_rounds WHERE status != 'ok' ORDER BY round, cid"
        ).fetchall()
    reasons = [f"{device}: {message}" for device, message in failed if message]
    every_round = [r[0] for r in rounds] == [str(n) for n in range(1, last + 1)]
    survived = rc == 0 and every_round and bool(pids) and len(reasons) == len(failed)
    return Outcome(survived, 0, time.monotonic() - fault_at, reasons[0] if reasons else "",
                   "" if survived else f"rc {rc}, rounds {rounds}, runner pids {pids}, failed {failed}")  # fmt: skip


@contextlib.contextmanager
def small_disk(where: Path, size: str, inside: int | None = None) -> Iterator[Path]:
    """A tmpfs of ``size`` mounted on ``where`` for the block (root only); unmounted after it.

    ``inside`` is a pid whose mount namespace gets the mount: a device in a network
    namespace runs in a mount namespace of its own (``ip netns exec`` makes one), where a
    mount made on the host is not seen.
    """
    enter = [] if inside is None else ["nsenter", "-t", str(inside), "-m"]
    where.mkdir(parents=True, exist_ok=True)
    subprocess.run([*enter, "mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)], check=True)
    try:
        yield where
    finally:
        subprocess.run([*enter, "umount", "-l", str(where)], check=False)


def host_disk_full(bench: Bench) -> Outcome:
    """The artifact cache on a filesystem too small for the export; then space is freed and the campaign resumed."""
    cwd = bench.fresh("host-disk")
    db, start = cwd / "fleetbench.db", time.monotonic()
    with small_disk(cwd / "small", "48k") as small:
        argv = list(profile(bench, db))
        argv[argv.index("--artifacts") + 1] = str(small / "artifacts")
        full = fleetbench(*argv, cwd=cwd)
        said = [line for line in full.stderr.splitlines() if line.startswith("fleetbench: error")]
        one_line = full.returncode != 0 and len(said) == 1 and str(small) in said[0]
        intact = not db.exists() or integrity(db) == "ok"
        subprocess.run(["mount", "-o", "remount,size=256m", str(small)], check=True)
        done = fleetbench(*argv, "--resume", cwd=cwd)
        whole = done.returncode == 0 and ok_cells(db) == expected_cells(bench)
    survived = one_line and intact and whole
    return Outcome(survived, 0, time.monotonic() - start, said[0] if said else full.stderr.strip()[-200:],
                   "" if survived else f"one line {one_line}, intact {intact}, resumed {whole}")  # fmt: skip


def device_disk_full(bench: Bench) -> Outcome:
    """A device's work directory on a filesystem too small for its artifacts: its cells are out of space."""
    cwd, victim = bench.fresh("device-disk"), bench.rng.choice(DEVICES)
    db, start = cwd / "fleetbench.db", time.monotonic()
    workdir = Path(str(bench.fleet.device(victim).workdir))
    sshd = next(rec for rec in device_state(bench, victim).processes if rec.role == "sshd")
    with small_disk(workdir, "32k", inside=sshd.pid):
        full = fleetbench(*profile(bench, db), cwd=cwd)
        with contextlib.closing(sqlite3.connect(db)) as con:
            rows = con.execute("SELECT device, status, message FROM cells").fetchall()
    others = {(d, round(w, 2)) for d, w in expected_cells(bench) if d != victim}
    spaced = [message for device, status, message in rows if device == victim and status == "out of space"]
    recorded = len(spaced) == len(bench.widths) and all(spaced)
    others_ok = others <= ok_cells(db)
    whole, _ = resume(bench, db, cwd)  # the device's own work directory again, with room
    survived = full.returncode != 0 and recorded and others_ok and whole and integrity(db) == "ok"
    return Outcome(survived, len(others - ok_cells(db)), time.monotonic() - start, spaced[0] if spaced else "",
                   "" if survived else f"out of space cells {len(spaced)}, others ok {others_ok}, resumed {whole}")


def memory_limit_file(bench: Bench, name: str) -> Path:
    """The cgroup file holding the emulated device's memory limit (v1 or v2)."""
    for directory in device_state(bench, name).cgroups:
        for knob in ("memory.limit_in_bytes", "memory.max"):
            if (Path(directory) / knob).exists():
                return Path(directory) / knob
    raise RuntimeError(f"{name} has no memory cgroup: the memory fault needs root")


def cells(db: Path) -> dict[tuple[str, float], tuple[str, str, int | None]]:
    """(device, width) -> (status, message, peak memory bytes) of each latest cell in ``db``."""
    with contextlib.closing(sqlite3.connect(db)) as con:
        rows = con.execute(
            "SELECT device, width, status, message, peak_memory_bytes FROM cells "
            "WHERE id IN (SELECT max(id) FROM cells GROUP BY cell_key)"
        ).fetchall()
    return {(d, round(w, 2)): (status, message or "", peak) for d, w, status, message, peak in rows}


def device_memory_hit(bench: Bench) -> Outcome:
    """A device's memory limit between what its quarter and its full width need: the full width is out of memory."""
    cwd, victim = bench.fresh("device-memory"), bench.rng.choice(DEVICES)
    start = time.monotonic()
    if victim not in bench.memory_peaks:  # measured once per device: what each width needs
        ran = fleetbench(*profile(bench, cwd / "calibrate.db", *MEMORY_CELLS), cwd=cwd).returncode == 0
        measured = cells(cwd / "calibrate.db") if ran else {}
        for device in DEVICES:
            bench.memory_peaks[device] = (measured.get((device, 0.25), ("", "", None))[2],
                                          measured.get((device, 1.0), ("", "", None))[2])  # fmt: skip
    small, wide = bench.memory_peaks[victim]
    if not small or not wide or wide - small < 64 << 20:
        return Outcome(False, 0, time.monotonic() - start, why=f"peaks {small} and {wide} bytes: too close to part")
    knob = memory_limit_file(bench, victim)
    before = knob.read_text().strip()
    db = cwd / "fleetbench.db"
    knob.write_text(str((small + wide) // 2))  # the cgroup also holds the device's sshd and shells: a few MiB
    try:
        start = time.monotonic()
        fleetbench(*profile(bench, db, *MEMORY_CELLS), cwd=cwd)
    finally:
        knob.write_text(before)
    measured = {(d, w) for d in DEVICES for w in (0.25, 1.0)}
    after = cells(db)
    status, message, _ = after.get((victim, 1.0), ("missing", "", None))
    others = [after.get(key, ("missing", "", None))[0] for key in sorted(measured - {(victim, 1.0)})]
    done = fleetbench(*profile(bench, db, *MEMORY_CELLS, "--resume"), cwd=cwd)
    resumed = cells(db)
    whole = done.returncode == 0 and set(resumed) == measured and all(c[0] == "ok" for c in resumed.values())
    survived = status == "out of memory" and all(o == "ok" for o in others) and whole and integrity(db) == "ok"
    lost = sum(o != "ok" for o in others)
    why = "" if survived else f"full width {status!r}, others {others}, resumed {whole}"
    return Outcome(survived, lost, time.monotonic() - start, f"[{victim}] w1.00 {status}: {message}", why)


def fleet_processes(bench: Bench) -> list[int]:
    """Live processes whose command line names the fleet's state directory."""
    marker = str(bench.fleet.state_dir)
    return [pid for pid, line in cmdlines().items() if marker in line and pid != os.getpid()]


def down_then_up(bench: Bench) -> Outcome:
    """``fleet down`` then at once ``fleet up``, ``pace.updown_cycles`` times: no failed start, nothing left down."""
    cwd = bench.fresh("updown")
    start = time.monotonic()
    failures: list[str] = []
    for _ in range(bench.pace.updown_cycles):
        down = fleetbench("fleet", "down", str(bench.fleet_file), cwd=cwd)
        left = fleet_processes(bench)
        up = fleetbench("fleet", "up", str(bench.fleet_file), cwd=cwd)
        if down.returncode or up.returncode or left:
            said = (up.stdout + up.stderr).strip().splitlines()[-1:]
            failures.append(f"down {down.returncode}, up {up.returncode}, left {left}: {said}")
    return Outcome(not failures, 0, time.monotonic() - start, failures[0] if failures else "",
                   "; ".join(failures))  # fmt: skip


INJECT: dict[str, Callable[[Bench], Outcome]] = {
    "sshd": sshd_killed,
    "link": link_down,
    "kill-campaign": campaign_killed,
    "kill-fl": fl_killed,
    "concurrent": concurrent,
    "resident": resident_killed,
    "updown": down_then_up,
    "host-disk": host_disk_full,
    "device-disk": device_disk_full,
    "device-memory": device_memory_hit,
}


def setup(
    work: Path, seed: int, netns: bool, widths: tuple[float, ...] = (0.25, 0.5, 0.75, 1.0), pace: Pace = Pace()
) -> Bench:
    """Write the bench's fleet (``fast`` and ``mid`` of the example fleet), start it; campaigns measure ``widths``."""
    path = copy_example_fleet(work, powered=())  # faults, not energy: no idle window per cell
    document = yaml.safe_load(path.read_text())
    document["devices"] = [d for d in document["devices"] if d["name"] in DEVICES]
    if netns:  # a delay asks for a network namespace per device: its link can then go down
        for device in document["devices"]:
            device.setdefault("emulate", {})["delay_ms"] = 1
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    fleet = load_fleet(path)
    bench = Bench(work, path, fleet, work / "artifacts", random.Random(seed), widths, pace)
    bring_up(bench)
    return bench


def table(results: dict[str, list[Outcome]]) -> str:
    """The per-fault table: injected, survived, lost, recovery time (median, worst) and what the user saw."""
    lines = [f"{'fault':<14} {'injected':>8} {'survived':>8} {'lost':>5} {'recover s':>14}  seen by the user"]
    for name, outcomes in results.items():
        times = [o.recover_seconds for o in outcomes]
        seen = next((o.seen for o in outcomes if o.seen), "")
        recover = f"{statistics.median(times):.1f} / {max(times):.1f}" if times else "-"
        lines.append(f"{name:<14} {len(outcomes):>8} {sum(o.survived for o in outcomes):>8} "
                     f"{sum(o.lost for o in outcomes):>5} {recover:>14}  {seen[:100]}")  # fmt: skip
        lines += [f"    not survived: {o.why}" for o in outcomes if not o.survived]
    return "\n".join(lines)


def run(faults: list[str], repeats: int, seed: int, work: Path) -> dict[str, list[Outcome]]:
    """Inject each of ``faults`` ``repeats`` times; return the outcomes per fault."""
    bench = setup(work, seed, netns="link" in faults and os.geteuid() == 0)
    results: dict[str, list[Outcome]] = {name: [] for name in faults}
    try:
        for i in range(repeats):
            for name in faults:
                outcome = INJECT[name](bench)
                results[name].append(outcome)
                state = "survived" if outcome.survived else f"NOT survived ({outcome.why})"
                print(f"{name} {i + 1}/{repeats}: {state}; lost {outcome.lost}, "
                      f"{outcome.recover_seconds:.1f} s; {outcome.seen[:120]}", flush=True)  # fmt: skip
    finally:
        emulate.down(bench.fleet, say=lambda line: None)
    return results


def main(argv: list[str] | None = None) -> int:
    """Run the fault-injection bench and print its table; exit 1 unless every fault was survived."""
    parser = argparse.ArgumentParser(prog="python -m tests.bench.faults", description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=10, help="injections of each fault (default 10)")
    parser.add_argument("--only", default=",".join(FAULTS), help="faults, comma-separated (default: all)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the injection points (default 0)")
    args = parser.parse_args(argv)
    faults = args.only.split(",")
    unknown = sorted(set(faults) - set(FAULTS))
    if unknown:
        parser.error(f"unknown fault(s) {', '.join(unknown)}; choose from {', '.join(FAULTS)}")
    print(f"load {os.getloadavg()[0]:.1f} on {os.cpu_count()} cpus", flush=True)
    # A bench stopped with SIGTERM or SIGHUP still brings its fleet down.
    with processes.terminate_as_interrupt(), tempfile.TemporaryDirectory(prefix="fleetbench-faults-") as tmp:
        results = run(faults, args.repeats, args.seed, Path(tmp))
    print(table(results))
    print(f"load {os.getloadavg()[0]:.1f} on {os.cpu_count()} cpus")
    return 0 if all(o.survived for outcomes in results.values() for o in outcomes) else 1


if __name__ == "__main__":
    raise SystemExit(main())
