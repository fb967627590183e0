"""Phones without Python (`harness.phone_runtime`), on the real adb server and the emulated phone.

Each test gets its own emulated phone (a fresh sandbox, its shell without python3)
attached to a private adb server; the tests that provision the bundle and then use it
share one. The x86_64 runtime bundle is built once per machine
into the user's cache (`tests.devices.conftest._built_bundle`); pushing it to a phone
takes a few seconds.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from devices.adb import ADBTransport
from devices.emulation.adb_endpoint import AdbEndpoint
from devices.errors import ConnectionLost, OutOfSpace
from devices.fleet import Device
from devices.site import python_argv
from devices.transport import Transport
from harness import contract, phone_runtime
from harness.deploy import deploy_artifact_set, deploy_runner
from harness.phone_runtime import UnsupportedAbiError
from harness.runner_archive import archive_path

WORKDIR = "/data/local/tmp/fleetbench"


class Phone:
    """An emulated phone, the device record naming it, and an open transport."""

    def __init__(self, server_port: int, sandbox: Path, python: str = "python3",
                 props: dict[str, str] | None = None) -> None:
        self.endpoint = AdbEndpoint(0, sandbox, props).start()
        self.device = Device("phone", "adb", serial=f"127.0.0.1:{self.endpoint.port}", workdir=WORKDIR, python=python)
        self.transport = ADBTransport(self.device.serial or "", server_port=server_port)

    def host_path(self, device_path: str) -> Path:
        return self.endpoint.sandbox.host_path(device_path)

    def close(self) -> None:
        self.transport.close()
        self.endpoint.stop()
        assert self.endpoint.running() == []


@pytest.fixture
def make_phone(adb_server: tuple[str, int], tmp_path: Path) -> Iterator[Any]:
    phones: list[Phone] = []

    def make(name: str = "phone", **kwargs: Any) -> Phone:
        phones.append(Phone(adb_server[1], tmp_path / name, **kwargs))
        return phones[-1]

    yield make
    for phone in phones:
        phone.close()


@pytest.fixture(scope="module")
def bundled_phone(adb_server: tuple[str, int], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Phone]:
    """One phone for the module's tests that put the bundle on it and then use it.

    The first of them finds it bare (it asserts the first push); the others take it as they
    find it, provisioning it when they run alone.
    """
    phone = Phone(adb_server[1], tmp_path_factory.mktemp("bundled") / "phone")
    yield phone
    phone.close()


@pytest.fixture(scope="module")
def artifact_set(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from exporters.artifacts import export_artifacts
    from exporters.zoo import get_model

    model = get_model("fjord-cnn")
    out = tmp_path_factory.mktemp("artifacts")
    return export_artifacts(model, model.arch(0.25), batch=8, optimizer="sgd", out_dir=out).directory


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _bench(phone: Phone, start: contract.RunnerStart, artifact_set: Path) -> contract.RunnerOutput:
    runner = deploy_runner(phone.transport, phone.device, archive_path())
    remote_set = deploy_artifact_set(phone.transport, phone.device, artifact_set).remote_dir
    argv = contract.bench_argv(start, runner, remote_set, backend="onnx", warmup=1, steps=2, threads=1, precision=0.0)
    run = phone.transport.run(argv, timeout=120)
    return contract.parse_output(run.rc, run.stdout, run.stderr)


def test_the_emulated_phones_shell_finds_no_python(make_phone: Any) -> None:
    phone = make_phone()
    result = phone.transport.run(["sh", "-c", "command -v python3 || echo none; uname -m"], timeout=20)
    assert result.stdout.split() == ["none", os.uname().machine]
    state = phone_runtime.probe(phone.transport, phone.device)
    assert state.python is None and state.abi == "x86_64" and state.runtimes == ()
    assert state.free_bytes is not None and state.free_bytes > 0


def test_a_phone_without_python_gets_the_bundle_and_runs_the_runner(
    bundled_phone: Phone, bundle_x86_64: Any, artifact_set: Path
) -> None:
    phone = bundled_phone
    first = phone_runtime.provision_phone(phone.transport, phone.device, say=lambda line: None)
    assert first.start.runtime == "bundle" and first.start.backends == ("onnx",)
    assert first.pushed_parts == tuple(p.name for p in bundle_x86_64.parts)
    assert first.pushed_bytes == bundle_x86_64.push_bytes and first.unpack_seconds > 0
    # the runtime on the phone is the bundle's tree, file for file
    root = phone.host_path(f"{WORKDIR}/runtime/x86_64-{bundle_x86_64.ident}")
    listing = (root / ".fleetbench-files.sha256").read_text()
    assert listing == (bundle_x86_64.tree / ".fleetbench-files.sha256").read_text()
    assert _sha(root / "lib/python311.zip") == _sha(bundle_x86_64.tree / "lib/python311.zip")
    # the runner starts through the bundle's loader and trains the step model with onnx
    assert first.start.argv[-1] == f"{WORKDIR}/runtime/x86_64-{bundle_x86_64.ident}/bin/python3"
    assert "--library-path" in first.start.argv
    output = _bench(phone, first.start, artifact_set)
    assert output.ok, output.message
    assert output.document.backend == "onnx" and len(output.document.step_seconds) == 2
    # a second provision pushes nothing and says so
    again = phone_runtime.provision_phone(phone.transport, phone.device)
    assert again.pushed_parts == () and again.pushed_bytes == 0 and again.unpack_seconds == 0
    assert "nothing pushed" in again.describe("phone")
    assert phone_runtime.runner_start(phone.transport, phone.device, provision=False) == again.start


def test_the_resident_runner_serves_through_the_bundle_on_the_phones_exec_service(
    bundled_phone: Phone, bundle_x86_64: Any, artifact_set: Path, tmp_path: Path
) -> None:
    import numpy as np

    from harness.deploy import deploy_files
    from harness.resident import ResidentRunner
    from tests.harness.test_runner import learnable_shard

    phone = bundled_phone
    start = phone_runtime.runner_start(phone.transport, phone.device, say=lambda line: None)
    assert start.runtime == "bundle"
    runner = deploy_runner(phone.transport, phone.device, archive_path())
    remote_set = deploy_artifact_set(phone.transport, phone.device, artifact_set).remote_dir
    np.save(tmp_path / "in.npy", np.load(artifact_set / "initial_parameters.npy") + 0.01, allow_pickle=False)
    local = [learnable_shard(tmp_path / "shard.npz", 16), tmp_path / "in.npy"]
    files = deploy_files(phone.transport, phone.device, local)
    shard, params = files.remote_paths["shard.npz"], files.remote_paths["in.npy"]
    options = dict(backend="onnx", params=params, data=shard, epochs=1, lr=0.05, threads=1, seed=3)
    once = phone.transport.run(contract.train_argv(start, runner, remote_set, out=f"{WORKDIR}/once.npy", **options),
                               timeout=120)  # fmt: skip
    assert contract.parse_output(once.rc, once.stdout, once.stderr).ok
    # request paths are relative to --cwd: the emulated phone maps the paths of command lines only
    argv = contract.serve_argv(start, runner, backend="onnx", threads=1, cwd=WORKDIR)
    served = ResidentRunner(phone.transport, argv, start_timeout=120)
    relative = {**options, "params": os.path.relpath(params, WORKDIR), "data": os.path.relpath(shard, WORKDIR)}
    try:
        pids = []
        for i in range(2):
            request = contract.train_request(os.path.relpath(remote_set, WORKDIR), out=f"served-{i}.npy",
                                             request_id=i, **relative)  # fmt: skip
            output, _ = served.request(request, timeout=120)
            assert output.ok, output.message
            pids.append(served.pid)
        # one process, started through the bundle's loader (the phone's shell has no python3)
        assert served.starts == 1 and pids[0] == pids[1] is not None
        cmdline = phone.transport.run(["cat", f"/proc/{pids[0]}/cmdline"], timeout=30).stdout
        assert bundle_x86_64.abi.loader in cmdline and "serve" in cmdline
    finally:
        served.close()
    expected = np.load(phone.host_path(f"{WORKDIR}/once.npy"))
    for i in range(2):
        np.testing.assert_array_equal(np.load(phone.host_path(f"{WORKDIR}/served-{i}.npy")), expected)


class _Interrupting:
    """A transport whose ``put`` fails with a lost connection at the n-th call (1-based)."""

    def __init__(self, inner: Transport, fail_at: int) -> None:
        self.inner, self.fail_at, self.puts = inner, fail_at, 0

    def run(self, argv: Any, timeout: float) -> Any:
        return self.inner.run(argv, timeout)

    def put(self, local: Path, remote: str) -> None:
        self.puts += 1
        if self.puts == self.fail_at:
            raise ConnectionLost("cable pulled")
        self.inner.put(local, remote)

    def get(self, remote: str, local: Path) -> None:
        self.inner.get(remote, local)

    def close(self) -> None:
        pass


def test_an_interrupted_push_resumes_with_the_parts_still_missing(make_phone: Any, bundle_x86_64: Any) -> None:
    phone = make_phone()
    cut = _Interrupting(phone.transport, fail_at=3)
    with pytest.raises(ConnectionLost):
        phone_runtime.provision_phone(cut, phone.device)  # type: ignore[arg-type]
    cas = phone.host_path(f"{WORKDIR}/cas")
    parts = bundle_x86_64.parts
    assert {p.sha256 for p in parts[:2]} <= set(os.listdir(cas))
    assert not [n for n in os.listdir(cas) if n.startswith(".tmp-")]  # the interrupted part left nothing
    assert not phone.host_path(f"{WORKDIR}/runtime/x86_64-{bundle_x86_64.ident}").exists()
    resumed = phone_runtime.provision_phone(phone.transport, phone.device)
    assert resumed.pushed_parts == tuple(p.name for p in parts[2:])
    assert resumed.pushed_bytes == sum(p.size for p in parts[2:])


def test_corrupted_bundle_files_are_found_by_sha256_and_replaced(
    bundled_phone: Phone, bundle_x86_64: Any, artifact_set: Path
) -> None:
    phone = bundled_phone
    phone_runtime.provision_phone(phone.transport, phone.device)
    numpy_part = next(p for p in bundle_x86_64.parts if p.name == "numpy")
    cached = phone.host_path(f"{WORKDIR}/cas/{numpy_part.sha256}")
    cached.chmod(0o644)
    with open(cached, "r+b") as handle:  # one flipped byte in the middle of the part
        handle.seek(numpy_part.size // 2)
        byte = handle.read(1)
        handle.seek(numpy_part.size // 2)
        handle.write(bytes([byte[0] ^ 0xFF]))
    root = phone.host_path(f"{WORKDIR}/runtime/x86_64-{bundle_x86_64.ident}")
    stdlib = root / "lib" / "python311.zip"
    stdlib.write_bytes(b"not a zip")
    repaired = phone_runtime.provision_phone(phone.transport, phone.device)
    assert set(repaired.repaired) == {"numpy", "runtime"}
    assert repaired.pushed_parts == ("numpy",) and repaired.pushed_bytes == numpy_part.size
    assert _sha(cached) == numpy_part.sha256
    assert _sha(stdlib) == _sha(bundle_x86_64.tree / "lib" / "python311.zip")
    assert _bench(phone, repaired.start, artifact_set).ok


def test_too_little_storage_is_one_line_and_the_other_phones_go_on(make_phone: Any, bundle_x86_64: Any) -> None:
    from harness.backends import usable_devices
    from harness.provision import DEFAULT_PACKAGES, choices_from, provision
    from harness.provision_cli import format_table

    small, roomy = make_phone("small"), make_phone("roomy")
    # the small phone's df reports 50 MB free in its workdir (Android's toybox df -Pk format)
    fake_df = small.endpoint.sandbox.root / "bin" / "df"
    fake_df.unlink()
    fake_df.write_text("#!/bin/sh\necho 'Filesystem 1K-blocks Used Available Use% Mounted on'\n"
                       "echo '/dev/block/dm-5 1000000 950000 50000 95% /data'\n")
    fake_df.chmod(0o755)
    small.device = Device("small", "adb", serial=small.device.serial, workdir=WORKDIR)
    roomy.device = Device("roomy", "adb", serial=roomy.device.serial, workdir=WORKDIR)
    transports = {"small": small.transport, "roomy": roomy.transport}

    class _Kept:  # the fixture closes the transports
        def __init__(self, inner: Transport) -> None:
            self.inner = inner

        def __getattr__(self, name: str) -> Any:
            return (lambda: None) if name == "close" else getattr(self.inner, name)

    devices = [small.device, roomy.device]
    result = provision(devices, packages=DEFAULT_PACKAGES[:2], opener=lambda d: _Kept(transports[d.name]),
                       say=lambda line: None)
    assert set(result.successes) == {"roomy"} and set(result.failures) == {"small"}
    failure = result.failures["small"]
    needed = bundle_x86_64.push_bytes + bundle_x86_64.size
    assert failure.kind == "out of space" and "\n" not in failure.message
    assert f"needs {needed} bytes" in failure.message and f"{50000 * 1024} bytes are free" in failure.message
    assert not small.host_path(f"{WORKDIR}/cas").exists() or not os.listdir(small.host_path(f"{WORKDIR}/cas"))
    # the roomy phone's packages were checked with the bundle's Python, and it uses onnx
    roomy_report = result.successes["roomy"]
    assert roomy_report.start is not None and roomy_report.start.runtime == "bundle"
    assert roomy_report.packages["onnxruntime"].importable and roomy_report.python is not None
    assert usable_devices(choices_from(result, devices)) == {"roomy": "onnx", "small": "ort"}  # small: not checked
    lines = format_table(result, devices, DEFAULT_PACKAGES[:2]).splitlines()
    assert lines[2].startswith("small ") and "FAILED: out of space" in lines[2]
    assert lines[3].split(" | ")[3].strip() == "bundle" and lines[3].split(" | ")[-1].strip() == "onnx"
    assert any(line.startswith("roomy: runtime: runtime bundle x86_64") for line in lines)
    assert any(line.startswith("small: out of space: small: the runtime bundle needs") for line in lines)
    with pytest.raises(OutOfSpace):
        phone_runtime.provision_phone(small.transport, small.device)


def test_a_phone_with_a_working_python_keeps_it(make_phone: Any) -> None:
    phone = make_phone(python=sys.executable)  # as Termux would have it
    report = phone_runtime.provision_phone(phone.transport, phone.device)
    site_start = tuple(python_argv(sys.executable, WORKDIR))  # its own Python, with the provisioned site
    assert report.start == contract.RunnerStart(site_start, "python", (), report.start.detail)
    assert f"Python {sys.version.split()[0]}" in report.describe("phone")
    assert not phone.host_path(f"{WORKDIR}/runtime").exists() and report.pushed_bytes == 0


def test_an_unsupported_abi_is_one_line(make_phone: Any) -> None:
    phone = make_phone(props={"ro.product.cpu.abi": "armeabi-v7a"})
    with pytest.raises(UnsupportedAbiError) as caught:
        phone_runtime.provision_phone(phone.transport, phone.device)
    assert str(caught.value).startswith("phone: unsupported ABI: armeabi-v7a") and "\n" not in str(caught.value)


def test_ssh_and_local_devices_start_their_own_python() -> None:
    device = Device("pi", "ssh", host="127.0.0.1", python="/opt/py/bin/python3", workdir="~/.fb")
    start = phone_runtime.runner_start(None, device)  # type: ignore[arg-type] # asks the device nothing
    assert start.argv == tuple(python_argv("/opt/py/bin/python3", "~/.fb"))
    assert start.argv[-2:] == ("~/.fb/site", "/opt/py/bin/python3") and start.offers("ort")
    assert start.backend(None) == "ort"
    argv = contract.bench_argv(start, "r.py", "set", backend="ort", warmup=1, steps=1, threads=1)
    assert argv[: len(start.argv) + 2] == [*start.argv, "r.py", "bench"]
    bare = contract.bench_argv("/opt/py/bin/python3", "r.py", "set", backend="ort", warmup=1, steps=1, threads=1)
    assert argv[len(start.argv) :] == bare[1:]  # the same runner arguments after either start


def test_bundle_start_runs_python_through_the_loader(bundle_x86_64: Any) -> None:
    start = phone_runtime.bundle_start("/data/local/tmp/w/runtime/x", bundle_x86_64)
    root = "/data/local/tmp/w/runtime/x"
    assert start.argv[0] == "env" and f"PYTHONHOME={root}" in start.argv
    i = start.argv.index(f"{root}/lib/{bundle_x86_64.abi.loader}")
    assert start.argv[i:] == (f"{root}/lib/{bundle_x86_64.abi.loader}", "--library-path", f"{root}/lib",
                              f"{root}/bin/python3")
    assert not start.offers("ort") and start.offers("onnx") and start.backend(None) == "onnx"
    assert start.backend("torch") == "torch"  # an explicit choice is kept (and fails on the device, said so)
    assert json.dumps(start.argv)


def _phone_fleet(directory: Path, emulate: str) -> Path:
    from devices.emulation.sshd import free_port

    path = directory / "fleet.yaml"
    path.write_text(f"state_dir: {directory / 'state'}\ndevices:\n  - name: phone\n    kind: adb\n"
                    f"    serial: 127.0.0.1:{free_port()}\n    threads: 1\n    emulate: {emulate}\n")
    return path


@pytest.fixture
def up_fleet(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """Bring a fleet file up (own adb server port); bring it down, leaving nothing, at teardown."""
    from devices.emulation import emulate
    from devices.emulation.sshd import free_port
    from devices.fleetfile import load_fleet
    from tests.devices.conftest import require_tool

    require_tool("adb")
    monkeypatch.setenv("ANDROID_ADB_SERVER_PORT", str(free_port()))
    fleets = []

    def up(path: Path) -> Any:
        fleet = load_fleet(path)
        fleets.append(fleet)
        result = emulate.up(fleet, say=lambda line: None)
        assert result.ok, result.failed
        return fleet

    yield up
    for fleet in fleets:
        assert emulate.down(fleet, say=lambda line: None) == []


def _cells(db: Path) -> dict[str, str]:
    import sqlite3

    rows = sqlite3.connect(db).execute("SELECT backend, status FROM cells").fetchall()
    return dict(rows)


def _profile_argv(path: Path, artifact_set: Path) -> list[str]:
    """``fleetbench profile`` of the phone's one cheap cell, on the module's artifact set (found in its cache)."""
    argv = ["profile", "--fleet", str(path), "--model", "fjord-cnn", "--widths", "0.25", "--batch", "8"]
    argv += ["--optimizer", "sgd", "--steps", "2", "--warmup", "1", "--precision", "0", "--passes", "1"]
    return [*argv, "--artifacts", str(artifact_set.parent)]


def test_fleet_provision_and_profile_on_an_emulated_x86_64_phone(
    up_fleet: Any, bundle_x86_64: Any, artifact_set: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from fleetbench.cli import main

    path = _phone_fleet(tmp_path, "{}")
    up_fleet(path)
    assert main(["fleet", "provision", str(path)]) == 0
    out = capsys.readouterr().out
    assert "phone: runtime: runtime bundle x86_64" in out and f"{bundle_x86_64.push_bytes / 1e6:.1f} MB" in out
    row = [cell.strip() for cell in next(line for line in out.splitlines() if line.startswith("phone ")).split(" | ")]
    assert row[1:4] == ["x86_64", row[2], "bundle"] and row[-2:] == ["onnx", "onnx"]
    assert "phone: no ort: the bundle runtime offers onnx only" in out
    db = tmp_path / "fleetbench.db"
    argv = _profile_argv(path, artifact_set)
    assert main([*argv, "--backend", "onnx,ort", "--no-round-cost", "--db", str(db)]) == 1  # ort cannot run there
    assert _cells(db) == {"onnx": "ok", "ort": "missing runtime"}
    import sqlite3

    (message,) = sqlite3.connect(db).execute("SELECT message FROM cells WHERE backend = 'ort'").fetchone()
    assert message.startswith("phone: the ort backend does not run on runtime bundle x86_64")
    auto = tmp_path / "auto.db"  # --backend auto (the default) chooses onnx for the phone on its bundle
    assert main([*argv, "--db", str(auto)]) == 0  # the round cost too, measured on the bundle
    assert _cells(auto) == {"onnx": "ok"}


def test_the_aarch64_phone_runs_the_arm64_bundle_through_qemu(
    arm64_tree: Path, bundle_arm64: Any, up_fleet: Any, artifact_set: Path, tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from fleetbench.cli import main

    path = _phone_fleet(tmp_path, "{arch: aarch64}")
    up_fleet(path)
    assert main(["fleet", "facts", str(path), "--json"]) == 0
    facts = json.loads(capsys.readouterr().out)
    phone = facts["facts"]["phone"]
    assert phone["arch"] == "aarch64" and phone["emulated_isa"] and phone["python"] == "missing"
    assert phone["platform"] == "android"
    assert main(["fleet", "provision", str(path)]) == 0
    assert "phone: runtime: runtime bundle arm64-v8a" in capsys.readouterr().out
    db = tmp_path / "fleetbench.db"
    # the round cost on a phone's bundle is the x86_64 phone's test: here the arm64 bundle's cell
    argv = [*_profile_argv(path, artifact_set), "--backend", "onnx", "--no-round-cost", "--db", str(db)]
    assert main(argv) == 0
    assert _cells(db) == {"onnx": "ok"}
