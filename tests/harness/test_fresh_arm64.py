"""The fresh arm64 board, from nothing installed to measured cells, through the CLI as a user types it.

``pi`` of ``devices/fleets/arm64.yaml`` is a freshly flashed board (Debian's python3 and
pip, no numpy, no onnxruntime; `devices.rootfs`). The journey of the README's real
devices: ``fleet facts`` finds no numpy, ``fleet provision FILE --install`` fetches the
aarch64 wheels on the host and installs them into the board's site, ``fleet facts`` then
finds them, and ``profile`` measures on it. Only ``pi`` is brought up: the phone of that
file runs its own runtime bundle and has its own tests. qemu translates every
instruction, so the profile is the smallest that still measures two widths.
"""

from __future__ import annotations

import json
import re
import sqlite3
from pathlib import Path

import pytest
import yaml

from devices import emulate
from devices.fleetfile import load_fleet
from devices.sshd import free_port
from fleetbench.cli import main
from tests.devices.conftest import require_tool

REPO = Path(__file__).resolve().parents[2]
VERSION = re.compile(r"\d+\.\d+(\.\d+)?")


def pi_fleet(directory: Path) -> Path:
    """Write the shipped ``pi`` alone, on a free port, with its state in ``directory``."""
    shipped = yaml.safe_load((REPO / "devices" / "fleets" / "arm64.yaml").read_text())
    (pi,) = [device for device in shipped["devices"] if device["name"] == "pi"]
    path = directory / "arm64-pi.yaml"
    document = {"state_dir": str(directory / "state"), "devices": [{**pi, "port": free_port()}]}
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return path


def facts_of(out: str, name: str) -> dict[str, str]:
    """Read one device's block of ``fleet facts`` (``name (platform)`` then ``  key  value`` lines)."""
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"{name} ("))
    block = {}
    for line in lines[start + 1 :]:
        if not line.startswith("  "):
            break
        key, _, value = line.strip().partition(" ")
        block[key] = value.strip()
    return block


def provision_row(out: str, name: str) -> dict[str, str]:
    """Read one device's row of the ``fleet provision`` table, by the header's column names."""
    lines = out.splitlines()
    header = [cell.strip() for cell in next(line for line in lines if line.startswith("device ")).split(" | ")]
    row = [cell.strip() for cell in next(line for line in lines if line.startswith(f"{name} ")).split(" | ")]
    return dict(zip(header, row + [""] * (len(header) - len(row)), strict=True))


def test_a_fresh_pi_is_provisioned_then_profiled_through_the_cli(
    arm64_tree: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    require_tool("sshd")
    monkeypatch.chdir(tmp_path)
    path = pi_fleet(tmp_path)
    fleet = load_fleet(path)
    profile = ["profile", "--fleet", str(path), "--model", "fjord-cnn", "--widths", "0.25,1", "--steps", "6",
               "--no-round-cost", "--warmup", "1", "--precision", "0", "--passes", "1"]  # fmt: skip
    try:
        assert emulate.up(fleet, say=lambda line: None).ok
        capsys.readouterr()

        assert main(["fleet", "facts", str(path), "--timeout", "120"]) == 0
        fresh = facts_of(capsys.readouterr().out, "pi")
        assert fresh["arch"].startswith("aarch64 (emulated ISA")
        assert fresh["python"].startswith("3.11.")
        assert (fresh["numpy"], fresh["onnxruntime"], fresh["torch"]) == ("missing", "missing", "missing")

        assert main(["fleet", "provision", str(path), "--install"]) == 0
        out = capsys.readouterr().out
        row = provision_row(out, "pi")
        assert (row["machine"], row["runtime"], row["uses"]) == ("aarch64", "python", "onnx")
        assert VERSION.fullmatch(row["numpy"]) and VERSION.fullmatch(row["onnxruntime"]), row
        assert row["onnxruntime-training"] == "missing" and row["torch"] == "missing"
        assert row["can run"] == "onnx"
        assert "pi: installed numpy, onnxruntime into /root/.fleetbench/site" in out
        assert "pi: no ort: onnxruntime-training 1.19.2 has no wheel for aarch64" in out

        assert main(["fleet", "facts", str(path), "--timeout", "120"]) == 0
        provisioned = facts_of(capsys.readouterr().out, "pi")
        assert (provisioned["numpy"], provisioned["onnxruntime"]) == (row["numpy"], row["onnxruntime"])

        assert main(profile) == 0
        table = capsys.readouterr().out
    finally:
        assert emulate.down(fleet, say=lambda line: None) == []
    measured = [line.split() for line in table.splitlines() if line.startswith("pi ")]
    assert [(float(line[1]), line[3], line[-1]) for line in measured] == [(0.25, "onnx", "ok"), (1.0, "onnx", "ok")]
    with sqlite3.connect(tmp_path / "fleetbench.db") as db:
        query = "SELECT device, width, backend, status, step_seconds, runner, facts FROM cells ORDER BY width"
        stored = db.execute(query).fetchall()
    assert [cell[:4] for cell in stored] == [("pi", 0.25, "onnx", "ok"), ("pi", 1.0, "onnx", "ok")]
    for *_, step_seconds, runner, facts in stored:
        assert len(json.loads(step_seconds)) == 6 and all(s > 0 for s in json.loads(step_seconds))
        # measured by the provisioned packages in the board's site, on the emulated ISA
        versions = json.loads(runner)["versions"]
        assert (versions["numpy"], versions["onnxruntime"]) == (row["numpy"], row["onnxruntime"])
        assert json.loads(facts)["emulated_isa"] is True
