"""The user's guide's real-device journey, run verbatim against fresh boards fleetbench did not prepare.

The commands are read from the block of ``docs/real-devices.md`` marked ``real-device journey`` and run as a
user types them, in a directory holding ``my-fleet.yaml``, against two boards:

* x86_64: a plain OpenSSH ``sshd`` this test starts with a standard configuration on a
  loopback port, logged into with a key and a known_hosts file, whose ``python3`` is the
  distribution's own (``/usr/bin/python3``: no numpy, no onnxruntime);
* aarch64: ``pi`` of ``devices/fleets/arm64.yaml``, a Debian arm64 tree with python3 and
  pip only, run through qemu-user (`devices.emulation.rootfs`, `devices.emulation.qemu`).
  It runs the block up to ``report``: the last line, ``fl run``, is the x86 board's to run
  verbatim. The freshly provisioned board then trains in one FL run with an x86 device (ort)
  and a device without Python (skipped): each device trains with its own backend; and its
  provisioned onnxruntime computes a small model as numpy does on the host, while its own
  python3 and the shared tree stay as they were.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import sqlite3
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import yaml

from devices.connect import connect
from devices.emulation import emulate, rootfs
from devices.emulation.sshd import free_port, without_startup_files
from devices.fleet import Device
from devices.fleetfile import load_fleet
from devices.site import python_argv
from devices.transport import RunResult
from tests.devices.conftest import require_tool

REPO = Path(__file__).resolve().parents[2]
#: The distribution's Python, as a freshly flashed board has it.
SYSTEM_PYTHON = "/usr/bin/python3"
MARK = "<!-- real-device journey"


def journey_commands(page: Path = REPO / "docs" / "real-devices.md") -> list[list[str]]:
    """The argv of each line of the page's fenced block after the journey marker."""
    text = page.read_text()
    block = text[text.index(MARK):].split("```sh\n", 1)[1].split("```", 1)[0]
    return [shlex.split(line) for line in block.splitlines() if line.strip() and not line.startswith("#")]


@dataclass
class Board:
    port: int
    key: Path
    known_hosts: Path
    workdir: str
    home_workdir: Path


def _system_python_lacks_numpy() -> bool:
    run = subprocess.run([SYSTEM_PYTHON, "-c", "import numpy"], capture_output=True, check=False)
    return run.returncode != 0


@pytest.fixture
def board(tmp_path: Path) -> Iterator[Board]:
    require_tool("sshd")
    if not Path(SYSTEM_PYTHON).exists():
        pytest.fail(f"{SYSTEM_PYTHON} is missing: the fresh board runs the distribution's Python")
    assert _system_python_lacks_numpy(), f"{SYSTEM_PYTHON} has numpy: the board would not be fresh"
    sshd_dir = tmp_path / "board-sshd"
    sshd_dir.mkdir()
    for name in ("host_ed25519", "user_ed25519"):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(sshd_dir / name)], check=True)
    (sshd_dir / "authorized_keys").write_text((sshd_dir / "user_ed25519.pub").read_text())
    port = free_port()
    # Debian's defaults, with keys only; StrictModes is off because the test's files live under /tmp.
    (sshd_dir / "sshd_config").write_text(
        f"Port {port}\nListenAddress 127.0.0.1\nHostKey {sshd_dir / 'host_ed25519'}\n"
        f"AuthorizedKeysFile {sshd_dir / 'authorized_keys'}\nPasswordAuthentication no\n"
        "KbdInteractiveAuthentication no\nUsePAM no\nStrictModes no\nSubsystem sftp internal-sftp\n"
        f"PidFile {sshd_dir / 'sshd.pid'}\n"
    )
    Path("/run/sshd").mkdir(exist_ok=True)
    host_key = (sshd_dir / "host_ed25519.pub").read_text().split()
    known_hosts = tmp_path / "known_hosts"
    known_hosts.write_text(f"[127.0.0.1]:{port} {host_key[0]} {host_key[1]}\n")
    # a fresh board's root has no shell start-up of the host's tools: its sessions start without them
    argv = without_startup_files(["/usr/sbin/sshd", "-D", "-e", "-f", str(sshd_dir / "sshd_config")], Path.home())
    sshd = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=(sshd_dir / "sshd.log").open("w"))
    name = f".fleetbench-journey-{uuid.uuid4().hex[:8]}"  # in the board user's home, as a user would set it
    home_workdir = Path.home() / name
    try:
        yield Board(port, sshd_dir / "user_ed25519", known_hosts, f"~/{name}", home_workdir)
    finally:
        sshd.terminate()
        sshd.wait(timeout=30)
        subprocess.run(["rm", "-rf", str(home_workdir)], check=False)


def _run(argv: list[str], cwd: Path) -> str:
    fleetbench = Path(sys.executable).with_name("fleetbench")
    assert argv[0] == ".venv/bin/fleetbench", argv
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANDROID_")}
    run = subprocess.run([str(fleetbench), *argv[1:]], cwd=cwd, capture_output=True, text=True, timeout=900,
                         env=env, check=False)
    out = run.stdout + run.stderr
    assert run.returncode == 0, f"{shlex.join(argv)} exited {run.returncode}:\n{out}"
    return out


def _facts_line(out: str, key: str) -> str:
    return next(line.split(None, 1)[1] for line in out.splitlines() if line.strip().startswith(key + " "))


def _journey(work: Path, until: str | None = None) -> list[str]:
    """Run the journey block in ``work`` (which holds ``my-fleet.yaml``); return each command's output.

    ``until`` names the last command to run (``"report"``); None runs the whole block.
    """
    commands = journey_commands()
    assert [c[1:3] for c in commands[:4]] == [["fleet", "check"], ["fleet", "facts"], ["fleet", "provision"],
                                              ["fleet", "facts"]]
    assert [c[1] for c in commands[4:]] == ["profile", "plan", "report", "fl"]
    if until is not None:
        commands = commands[: [c[1] for c in commands].index(until) + 1]
    return [_run(argv, work) for argv in commands]


def _check_plan(plan: str, device: str, fl_run: str | None = None) -> None:
    """One device: the median device is itself, so it plans full width and the run trains with that plan."""
    assert re.search(rf"^{device}\s+planned\s+1\s+0\s", plan, re.M), plan
    assert "deadline" in plan and "predicted fleet round" in plan, plan
    if fl_run is not None:
        assert re.search(rf"fleetbench: plan: {device}\s+planned\s+1\s+0\s", fl_run), fl_run


def _check_fl_run(fl_run: str) -> None:
    assert re.search(r"FL run \d+ \(fjord, fjord-cnn on mnist5k, 4 clients", fl_run), fl_run
    rounds = re.findall(r"round (\d+)/3: clients ok (\d+) failed (\d+)", fl_run)
    assert [r[0] for r in rounds] == ["1", "2", "3"] and all(r[2] == "0" and int(r[1]) > 0 for r in rounds), fl_run


def test_the_readme_journey_on_a_fresh_board(board: Board, tmp_path: Path) -> None:
    work = tmp_path / "user"
    work.mkdir()
    (work / "my-fleet.yaml").write_text(
        "devices:\n"
        "  - name: board\n    kind: ssh\n    host: 127.0.0.1\n"
        f"    port: {board.port}\n    user: root\n    key_file: {board.key}\n    known_hosts: {board.known_hosts}\n"
        f"    workdir: {board.workdir}\n    python: {SYSTEM_PYTHON}\n    threads: 1\n"
    )
    check, facts, provision, facts_after, profile, plan, report, fl_run = _journey(work)

    _check_plan(plan, "board", fl_run)
    assert "1 device OK" in check
    assert _facts_line(facts, "numpy") == "missing" and _facts_line(facts, "onnxruntime") == "missing"
    assert re.fullmatch(r"3\.\d+\.\d+", _facts_line(facts, "python"))

    row = [c.strip() for c in next(line for line in provision.splitlines() if line.startswith("board ")).split("|")]
    numpy_version = row[4]
    assert re.fullmatch(r"\d+\.\d+\.\d+", numpy_version) and row[5:7] == ["1.19.2", "1.19.2"], provision
    assert row[-2:] == ["ort, onnx", "ort"], provision
    assert re.search(r"board: fetched .*onnxruntime_training-1\.19\.2-cp3\d+-cp3\d+-manylinux\S+x86_64\.whl", provision)
    assert "from the package index" in provision or "from the host's wheel cache" in provision
    home_site = board.home_workdir / "site"
    assert f"board: installed numpy, onnxruntime, onnxruntime-training into {home_site}" in provision, provision

    assert _facts_line(facts_after, "numpy") == numpy_version and _facts_line(facts_after, "onnxruntime") == "1.19.2"
    assert _system_python_lacks_numpy()  # the board's own Python is as it was

    db = sqlite3.connect(work / "fleetbench.db")
    cells = db.execute("SELECT width, backend, status FROM cells WHERE device = 'board' ORDER BY width").fetchall()
    assert cells == [(0.25, "ort", "ok"), (0.5, "ort", "ok"), (1.0, "ort", "ok")], profile
    assert "missing runtime" not in profile and "board: round cost: fixed" in profile, profile

    assert (work / "report" / "report.html").is_file() and "board" in (work / "report" / "report.html").read_text()
    assert "wrote report/report.html" in report

    assert "board: the runner trained one step of fjord-cnn at width 0.25, batch 2, on ort, onnx" in provision
    _check_fl_run(fl_run)


def test_the_readme_journey_on_the_fresh_arm64_tree(arm64_tree: Path, tmp_path: Path) -> None:
    require_tool("sshd")
    work = tmp_path / "user"
    work.mkdir()
    shipped = yaml.safe_load((REPO / "devices" / "fleets" / "arm64.yaml").read_text())
    (pi,) = [device for device in shipped["devices"] if device["name"] == "pi"]  # the phone has its own tests
    document = {"state_dir": str(tmp_path / "state"), "devices": [{**pi, "port": free_port()}]}
    (work / "my-fleet.yaml").write_text(yaml.safe_dump(document, sort_keys=False))
    fleet = load_fleet(work / "my-fleet.yaml")
    try:
        assert emulate.up(fleet, say=lambda line: None).ok
        check, facts, provision, facts_after, profile, plan, report = _journey(work, until="report")
        mixed = _mixed_fleet_run(work, document, tmp_path)
        inferred, bare = _onnxruntime_on_the_board(fleet.device("pi"), tmp_path)
    finally:
        assert emulate.down(fleet, say=lambda line: None) == []

    assert "1 device OK" in check
    assert "aarch64 (emulated ISA" in facts and _facts_line(facts, "numpy") == "missing"
    assert _facts_line(facts, "onnxruntime") == "missing"
    row = [c.strip() for c in next(line for line in provision.splitlines() if line.startswith("pi ")).split("|")]
    assert row[1:4] == ["aarch64", "3.11.2", "python"] and row[-2:] == ["onnx", "onnx"], provision
    numpy_version, ort_version = row[4], row[5]
    assert row[6] == "missing", provision  # onnxruntime-training: no aarch64 wheel
    assert re.fullmatch(r"\d+\.\d+\.\d+", numpy_version) and re.fullmatch(r"1\.\d+\.\d+", ort_version)
    assert re.search(r"pi: fetched .*onnxruntime-1\.\d+\.\d+-cp311-cp311-manylinux\S+_aarch64\.whl", provision)
    assert "pi: installed numpy, onnxruntime into /root/.fleetbench/site" in provision
    assert "pi: the runner trained one step of fjord-cnn at width 0.25, batch 2, on onnx" in provision
    assert "pi: no ort: onnxruntime-training 1.19.2 has no wheel for aarch64" in provision
    assert (_facts_line(facts_after, "numpy"), _facts_line(facts_after, "onnxruntime")) == (numpy_version, ort_version)

    db = sqlite3.connect(work / "fleetbench.db")
    cells = db.execute("SELECT width, backend, status FROM cells WHERE device = 'pi' ORDER BY width").fetchall()
    assert cells == [(0.25, "onnx", "ok"), (0.5, "onnx", "ok"), (1.0, "onnx", "ok")], profile
    assert "pi: round cost: fixed" in profile, profile
    assert "(no headline: the cells of pi ran under an instruction-set emulator" in report
    assert "pi" in (work / "report" / "report.html").read_text()
    _check_plan(plan, "pi")
    _check_mixed_fleet_run(work, mixed)
    assert (inferred["machine"], inferred["numpy"], inferred["ort"]) == ("aarch64", numpy_version, ort_version)
    np.testing.assert_allclose(np.array(inferred["y"], dtype=np.float32), inferred["expected"], rtol=1e-6, atol=1e-6)
    # the packages live in the board's workdir: its own python3 still has none, the shared tree is untouched
    assert bare.rc != 0 and "No module named 'numpy'" in bare.stderr
    assert not (rootfs.tree_path() / "root" / ".fleetbench").exists()


def _onnxruntime_on_the_board(device: Device, tmp_path: Path) -> tuple[dict, RunResult]:
    """A small ONNX model run by the board's provisioned onnxruntime (its JSON, with the host's answer
    under ``expected``), and ``import numpy`` in the board's own python3."""
    w, b = tiny_model(tmp_path / "tiny.onnx")
    transport = connect(device)
    try:
        transport.put(tmp_path / "tiny.onnx", "~/.fleetbench/tiny.onnx")
        argv = [*python_argv(device.python, device.workdir), "-c", INFER, ".fleetbench/tiny.onnx"]
        result = transport.run(argv, timeout=300)
        assert result.rc == 0, result.stderr
        bare = transport.run(["python3", "-c", "import numpy"], timeout=120)
    finally:
        transport.close()
    expected = np.arange(6, dtype=np.float32).reshape(2, 3) @ w + b
    return {**json.loads(result.stdout), "expected": expected}, bare


def _mixed_fleet_run(work: Path, document: dict, tmp_path: Path) -> str:
    """One FL run over an x86 device, the provisioned board and a device without Python; its output.

    The clients train HeteroFL's quarter-width sub-model: a full-width step takes the emulated
    board about seven times as long, and what is checked (each device trains with its backend)
    is the same.
    """
    devices = [
        {"name": "x86", "kind": "local", "python": sys.executable, "workdir": str(tmp_path / "x86")},
        *document["devices"],
        {"name": "nopy", "kind": "local", "python": "/nonexistent/python3", "workdir": str(tmp_path / "nopy")},
    ]
    (work / "mixed.yaml").write_text(yaml.safe_dump({**document, "devices": devices}, sort_keys=False))
    argv = ".venv/bin/fleetbench fl run --fleet mixed.yaml --model fjord-cnn --strategy heterofl --capacities 0.25"
    return _run([*argv.split(), "--dataset", "digits", "--clients", "2", "--rounds", "1", "--db", "mixed.db"], work)


def _check_mixed_fleet_run(work: Path, out: str) -> None:
    assert "fleetbench: backend of x86: ort (best available)" in out, out
    assert "backend of pi: onnx (best available (ort: onnxruntime-training 1.19.2 has no wheel for aarch64))" in out
    assert "backend of nopy: skipped: no usable backend (ort: no Python on the device" in out
    query = "SELECT cid, device, backend, status, loss, steps, width FROM fl_client_rounds ORDER BY cid"
    rows = sqlite3.connect(work / "mixed.db").execute(query).fetchall()
    assert [row[:4] for row in rows] == [("c0", "x86", "ort", "ok"), ("c1", "pi", "onnx", "ok")], rows
    assert all(0 < row[4] < 10 and row[5] > 0 and row[6] == 0.25 for row in rows), rows


def tiny_model(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """Write ``Y = X @ W + B`` as ONNX (opset 17, IR 8); return ``W`` and ``B``."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    w = rng.standard_normal((3, 4)).astype(np.float32)
    b = rng.standard_normal(4).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["X", "W"], ["XW"]), helper.make_node("Add", ["XW", "B"], ["Y"])],
        "tiny",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [None, 3])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [None, 4])],
        [numpy_helper.from_array(w, "W"), numpy_helper.from_array(b, "B")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.save(model, str(path))
    return w, b


INFER = """
import json, platform, sys
import numpy as np, onnxruntime as ort
session = ort.InferenceSession(sys.argv[1], providers=["CPUExecutionProvider"])
x = np.arange(6, dtype=np.float32).reshape(2, 3)
y = session.run(None, {"X": x})[0]
print(json.dumps({"machine": platform.machine(), "numpy": np.__version__, "ort": ort.__version__, "y": y.tolist()}))
"""
