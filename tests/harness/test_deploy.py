"""Deployment through the device's content-addressed cache, on real transports.

Local (subprocess), SSH (a real sshd on loopback) and ADB (the real adb server and the
emulated phone): a real artifact set is pushed whole once and not at all the second
time; a corrupted cache entry is found and replaced; an interrupted push leaves no
wrong cache entry and no half set; the deployed set loads in onnxruntime on the device.
"""

from __future__ import annotations

import hashlib
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

from devices.emulation.adb_endpoint import AdbEndpoint
from devices.errors import ConnectionLost, OutOfSpace
from devices.fleet import Device
from devices.fleetfile import parse_fleet
from devices.local import LocalTransport
from devices.site import python_argv
from devices.transport import RunResult, Transport
from exporters.manifest import ARTIFACT_FILES
from harness.deploy import (
    DeployError,
    deploy_artifact_set,
    deploy_artifact_sets,
    deploy_files,
    deploy_runner,
    sha256_file,
)
from tests.conftest import SmallFileSystems
from tests.devices.sshd_server import Server

PY = sys.executable
HASH_DIR = (
    "import hashlib, json, os, sys\n"
    "d = sys.argv[1]\n"
    "print(json.dumps({n: hashlib.sha256(open(os.path.join(d, n), 'rb').read()).hexdigest()"
    " for n in sorted(os.listdir(d))}))"
)


@dataclass
class Target:
    """A transport, the device record it serves, and where its workdir lies on this host."""

    transport: Transport
    device: Device
    host_dir: Path
    kind: str


@pytest.fixture(scope="module")
def artifact_set(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from exporters.artifacts import export_artifacts
    from exporters.zoo import get_model

    model = get_model("cfd-cnn")
    out = tmp_path_factory.mktemp("artifacts")
    return export_artifacts(model, model.arch(0.25), batch=4, optimizer="adamw", out_dir=out).directory


def make_target(request: pytest.FixtureRequest, kind: str, tmp_path: Path) -> Target:
    """Build a `Target` of ``kind`` whose workdir is a fresh directory."""
    if kind == "local":
        host_dir = tmp_path / "device"
        return Target(LocalTransport(), Device("loc", "local", workdir=str(host_dir), python=PY), host_dir, kind)
    if kind == "ssh":
        host_dir = tmp_path / "device"
        server: Server = request.getfixturevalue("sshd_server")
        device = Device("ssh", "ssh", host="127.0.0.1", port=server.instance.port, workdir=str(host_dir), python=PY)
        return Target(server.transport(), device, host_dir, kind)
    endpoint: AdbEndpoint = request.getfixturevalue("phone")
    name = f"fb-{tmp_path.name}"
    device = Device("phone", "adb", serial=f"127.0.0.1:{endpoint.port}", workdir=f"/data/local/tmp/{name}", python=PY)
    host_dir = endpoint.sandbox.root / "data" / "local" / "tmp" / name
    return Target(request.getfixturevalue("adb_transport"), device, host_dir, kind)


@pytest.fixture(params=["local", "ssh", "adb"])
def target(request: pytest.FixtureRequest, tmp_path: Path) -> Target:
    return make_target(request, request.param, tmp_path)


def manifest_hashes(set_dir: Path) -> dict[str, str]:
    files = json.loads((set_dir / "manifest.json").read_text())["files"]
    return {name: entry["sha256"] for name, entry in files.items()} | {
        "manifest.json": sha256_file(set_dir / "manifest.json")
    }


def hashes_on_device(target: Target, remote_dir: str) -> dict[str, str]:
    result = target.transport.run([PY, "-c", HASH_DIR, remote_dir], timeout=30)
    assert result.ok, result.stdout + result.stderr
    return dict(json.loads(result.stdout.strip().splitlines()[-1]))


def assert_cas_clean(host_dir: Path) -> None:
    """Every cache entry's content matches its name and no temporary file is left."""
    for entry in (host_dir / "cas").iterdir():
        assert not entry.name.startswith(".tmp-"), entry
        assert sha256_file(entry) == entry.name, entry


def test_second_deployment_pushes_zero_bytes(target: Target, artifact_set: Path) -> None:
    expected = manifest_hashes(artifact_set)
    total = sum((artifact_set / name).stat().st_size for name in expected)
    first = deploy_artifact_set(target.transport, target.device, artifact_set)
    assert sorted(first.pushed_files) == sorted(expected)
    assert (first.pushed_bytes, first.reused_files, first.repaired_files) == (total, (), ())
    assert first.remote_dir == f"{target.device.workdir}/sets/{artifact_set.name}"
    second = deploy_artifact_set(target.transport, target.device, artifact_set)
    assert (second.pushed_bytes, second.pushed_files) == (0, ())
    assert sorted(second.reused_files) == sorted(expected)
    assert hashes_on_device(target, second.remote_dir) == expected
    assert_cas_clean(target.host_dir)


def test_corrupted_cache_entry_is_detected_and_replaced(target: Target, artifact_set: Path) -> None:
    expected = manifest_hashes(artifact_set)
    deploy_artifact_set(target.transport, target.device, artifact_set)
    entry = target.host_dir / "cas" / expected["checkpoint"]
    data = bytearray(entry.read_bytes())
    data[len(data) // 2] ^= 0xFF  # same size, one byte flipped: only a hash notices
    entry.chmod(0o644)
    entry.write_bytes(bytes(data))
    result = deploy_artifact_set(target.transport, target.device, artifact_set)
    assert result.repaired_files == ("checkpoint",)
    assert result.pushed_files == ("checkpoint",)
    assert result.pushed_bytes == (artifact_set / "checkpoint").stat().st_size
    assert hashes_on_device(target, result.remote_dir) == expected
    assert_cas_clean(target.host_dir)


class InterruptedTransport:
    """A real transport whose ``fail_at``-th put sends half the file, then loses the connection."""

    def __init__(self, inner: Transport, fail_at: int, scratch: Path) -> None:
        self.inner, self.fail_at, self.scratch, self.puts = inner, fail_at, scratch, 0

    def run(self, argv: Sequence[str], timeout: float) -> RunResult:
        return self.inner.run(argv, timeout)

    def put(self, local: Path, remote: str) -> None:
        self.puts += 1
        if self.puts == self.fail_at:
            half = self.scratch / "half"
            half.write_bytes(local.read_bytes()[: local.stat().st_size // 2])
            self.inner.put(half, remote)
            raise ConnectionLost("connection dropped mid-push (test)")
        self.inner.put(local, remote)

    def get(self, remote: str, local: Path) -> None:
        self.inner.get(remote, local)

    def close(self) -> None:
        self.inner.close()


def test_interrupted_push_leaves_no_bad_entry_and_no_half_set(
    target: Target, artifact_set: Path, tmp_path: Path
) -> None:
    flaky = InterruptedTransport(target.transport, fail_at=3, scratch=tmp_path)
    with pytest.raises(ConnectionLost):
        deploy_artifact_set(flaky, target.device, artifact_set)
    assert_cas_clean(target.host_dir)
    assert list((target.host_dir / "cas").iterdir()) == []  # nothing was committed
    assert not (target.host_dir / "sets").exists() or list((target.host_dir / "sets").iterdir()) == []
    again = deploy_artifact_set(target.transport, target.device, artifact_set)
    assert len(again.pushed_files) == len(ARTIFACT_FILES) + 1  # and the manifest
    assert hashes_on_device(target, again.remote_dir) == manifest_hashes(artifact_set)


class CorruptingTransport(InterruptedTransport):
    """A real transport whose puts arrive with one byte changed (and no error)."""

    def put(self, local: Path, remote: str) -> None:
        data = bytearray(local.read_bytes())
        data[0] ^= 0xFF
        bad = self.scratch / "bad"
        bad.write_bytes(bytes(data))
        self.inner.put(bad, remote)


def test_content_that_arrives_wrong_is_never_committed(
    request: pytest.FixtureRequest, artifact_set: Path, tmp_path: Path
) -> None:
    target = make_target(request, "local", tmp_path)  # the commit check runs the same on every transport
    with pytest.raises(DeployError, match="did not verify"):
        deploy_artifact_set(CorruptingTransport(target.transport, 0, tmp_path), target.device, artifact_set)
    assert list((target.host_dir / "cas").iterdir()) == []
    assert not (target.host_dir / "sets").exists()


@pytest.mark.parametrize("kind", ["local", "ssh"])
def test_deployed_set_loads_in_onnxruntime_on_the_device(
    request: pytest.FixtureRequest, kind: str, tmp_path: Path, artifact_set: Path
) -> None:
    target = make_target(request, kind, tmp_path)
    remote = deploy_artifact_set(target.transport, target.device, artifact_set).remote_dir
    script = (
        "import sys, onnxruntime.training.api as a\n"
        "d = sys.argv[1]\n"
        "s = a.CheckpointState.load_checkpoint(d + '/checkpoint')\n"
        "m = a.Module(d + '/training_model.onnx', s, d + '/eval_model.onnx')\n"
        "a.Optimizer(d + '/optimizer_model.onnx', m)\n"
        "print('loaded')"
    )
    result = target.transport.run([PY, "-c", script, remote], timeout=60)
    assert (result.rc, result.stdout.strip()) == (0, "loaded"), result.stderr


class CountingTransport:
    """A real transport that counts the remote commands it runs."""

    def __init__(self, inner: Transport) -> None:
        self.inner, self.commands = inner, 0

    def run(self, argv: Sequence[str], timeout: float) -> RunResult:
        self.commands += 1
        return self.inner.run(argv, timeout)

    def put(self, local: Path, remote: str) -> None:
        self.inner.put(local, remote)

    def get(self, remote: str, local: Path) -> None:
        self.inner.get(remote, local)

    def close(self) -> None:
        self.inner.close()


def test_several_sets_deploy_in_three_commands(target: Target, artifact_set: Path, tmp_path: Path) -> None:
    from exporters.artifacts import export_artifacts
    from exporters.zoo import get_model

    model = get_model("cfd-cnn")
    other = export_artifacts(model, model.arch(0.5), batch=4, optimizer="adamw", out_dir=tmp_path).directory
    counting = CountingTransport(target.transport)
    first = deploy_artifact_sets(counting, target.device, [artifact_set, other])
    assert counting.commands == 3  # check, commit, materialise: for both sets together
    assert [r.remote_dir for r in first] == [f"{target.device.workdir}/sets/{d.name}" for d in (artifact_set, other)]
    for result, set_dir in zip(first, (artifact_set, other), strict=True):
        assert hashes_on_device(target, result.remote_dir) == manifest_hashes(set_dir)
    # a content both sets hold is pushed (and counted) once
    shared = set(manifest_hashes(artifact_set).values()) & set(manifest_hashes(other).values())
    total = sum(sources.stat().st_size for sources in {
        sha: d / name for d in (artifact_set, other) for name, sha in manifest_hashes(d).items()
    }.values())  # fmt: skip
    assert sum(r.pushed_bytes for r in first) == total
    assert not shared or not set(first[1].pushed_files) & {
        n for n, sha in manifest_hashes(other).items() if sha in shared
    }
    counting.commands = 0
    again = deploy_artifact_sets(counting, target.device, [artifact_set, other])
    assert counting.commands == 2 and all(r.pushed_bytes == 0 for r in again)  # nothing to commit
    assert_cas_clean(target.host_dir)
    with pytest.raises(ValueError, match="same name"):
        deploy_artifact_sets(counting, target.device, [artifact_set, artifact_set])


def test_device_without_python_falls_back_to_sha256sum(tmp_path: Path, artifact_set: Path) -> None:
    host_dir = tmp_path / "device"
    device = Device("toybox", "local", workdir=str(host_dir), python="/nonexistent/python3")
    transport = LocalTransport()
    first = deploy_artifact_set(transport, device, artifact_set)
    assert len(first.pushed_files) == len(ARTIFACT_FILES) + 1  # and the manifest
    entry = host_dir / "cas" / manifest_hashes(artifact_set)["training_model.onnx"]
    entry.chmod(0o644)
    entry.write_bytes(b"x" + entry.read_bytes()[1:])
    second = deploy_artifact_set(transport, device, artifact_set)
    assert second.repaired_files == ("training_model.onnx",)
    assert second.pushed_bytes == (artifact_set / "training_model.onnx").stat().st_size
    third = deploy_artifact_set(transport, device, artifact_set)
    assert third.pushed_bytes == 0
    on_device = {p.name: sha256_file(p) for p in Path(third.remote_dir).iterdir()}
    assert on_device == manifest_hashes(artifact_set)
    assert_cas_clean(host_dir)


def test_tilde_workdir_is_expanded_on_the_device(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    payload = tmp_path / "payload.bin"
    payload.write_bytes(b"payload")
    device = Device("loc", "local", workdir="~/fb", python=PY)
    result = deploy_files(LocalTransport(), device, [payload])
    sha = hashlib.sha256(b"payload").hexdigest()
    assert result.workdir == str(tmp_path / "home" / "fb")
    assert result.remote_paths == {"payload.bin": f"{tmp_path}/home/fb/cas/{sha}"}
    assert (tmp_path / "home" / "fb" / "cas" / sha).read_bytes() == b"payload"
    assert not (tmp_path / "~").exists()


def test_runner_is_deployed_through_the_cache(target: Target, tmp_path: Path) -> None:
    runner = tmp_path / "runner.py"
    runner.write_text("import sys\nprint('runner', sys.argv[1])\n")
    path = deploy_runner(target.transport, target.device, runner)
    assert path.startswith(f"{target.device.workdir}/runner/") and path.endswith("/runner.py")
    assert deploy_runner(target.transport, target.device, runner) == path
    result = target.transport.run([PY, path, "ok"], timeout=30)
    assert (result.rc, result.stdout.strip()) == (0, "runner ok")


def test_a_local_set_that_does_not_match_its_manifest_is_refused(tmp_path: Path, artifact_set: Path) -> None:
    broken = tmp_path / "broken"
    broken.mkdir()
    for item in artifact_set.iterdir():
        (broken / item.name).write_bytes(item.read_bytes())
    (broken / "eval_model.onnx").write_bytes(b"not a model")
    device = Device("loc", "local", workdir=str(tmp_path / "device"), python=PY)
    with pytest.raises(ValueError, match="eval_model.onnx"):
        deploy_artifact_set(LocalTransport(), device, broken)
    assert not (tmp_path / "device").exists()


#: A workdir directory name with spaces, quotes and shell metacharacters: every one must stay data.
ODD_WORKDIR = "work dir 'it''s' \"q\" $(touch PWNED); `touch PWNED` & | *"


@pytest.mark.parametrize("kind", ["local", "ssh"])
def test_a_workdir_with_spaces_quotes_and_metacharacters_works_end_to_end(
    request: pytest.FixtureRequest, kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    host_dir = tmp_path / ODD_WORKDIR
    if kind == "local":
        entry = {"name": "loc", "kind": "local", "workdir": str(host_dir), "python": PY}
        transport: Transport = LocalTransport()
    else:
        server: Server = request.getfixturevalue("sshd_server")
        entry = {"name": "pi", "kind": "ssh", "host": "127.0.0.1", "port": server.instance.port,
                 "workdir": str(host_dir), "python": PY}  # fmt: skip
        transport = server.transport()
    device = parse_fleet(json.dumps({"devices": [entry]}), "fleet.yaml", cwd=tmp_path).devices[0]
    assert device.workdir == str(host_dir)
    runner = tmp_path / "runner.py"
    runner.write_text("import sys\nprint('runner', sys.argv[1])\n")
    path = deploy_runner(transport, device, runner)
    assert path.startswith(f"{host_dir}/runner/") and Path(path).read_text() == runner.read_text()
    result = transport.run([*python_argv(device.python, device.workdir), path, "o'k $(x)"], timeout=30)
    assert (result.rc, result.stdout.strip()) == (0, "runner o'k $(x)"), result.stderr
    assert not list(tmp_path.rglob("PWNED")) and not (Path.home() / "PWNED").exists()


@pytest.mark.parametrize("python", [PY, "/nonexistent/python3"], ids=["python", "sh"])
def test_a_device_without_room_is_out_of_space_before_anything_is_pushed(
    artifact_set: Path, small_fs: SmallFileSystems, python: str
) -> None:
    workdir = small_fs.mount("device", "16k")
    device = Device("tiny", "local", workdir=str(workdir), python=python)
    with pytest.raises(OutOfSpace) as caught:
        deploy_artifact_set(LocalTransport(), device, artifact_set)
    message = str(caught.value)
    assert caught.value.kind == "out of space" and "\n" not in message
    assert message.startswith("tiny: pushing ") and f"to {workdir}/cas needs " in message
    assert "bytes are free" in message
    assert list((workdir / "cas").iterdir()) == [] and not (workdir / "sets").exists()


def test_a_remote_step_that_finds_the_disk_full_is_out_of_space(artifact_set: Path, tmp_path: Path) -> None:
    class FullAfterPush:
        """A local device whose commit step answers as a full disk does."""

        def __init__(self) -> None:
            self.inner = LocalTransport()

        def run(self, argv: Sequence[str], timeout: float) -> RunResult:
            if '"pushed"' in argv[-1]:  # the commit step's arguments
                return RunResult(1, "", "OSError: [Errno 28] No space left on device", 0.0)
            return self.inner.run(argv, timeout)

        def __getattr__(self, name: str) -> object:
            return getattr(self.inner, name)

    device = Device("full", "local", workdir=str(tmp_path / "device"), python=PY)
    with pytest.raises(OutOfSpace, match=r"^full: cannot commit pushed files: exit 1: OSError: \[Errno 28\] No space"):
        deploy_artifact_set(FullAfterPush(), device, artifact_set)  # type: ignore[arg-type]
