"""The ``fleetbench`` command line: ``models`` and the shared error handling."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from exporters.arch import DEFAULT_WIDTHS, parse_widths
from exporters.userinput import InputError
from exporters.zoo import get_model, model_names
from fleetbench.cli import main


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def test_models_json_lists_every_model_at_default_and_paper_widths(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = run(capsys, "models", "--json")
    assert rc == 0, err
    rows = json.loads(out)
    assert all(set(row) == {"model", "width", "params", "macs", "flops", "train_flops"} for row in rows)
    for name in model_names():
        model = get_model(name)
        widths = sorted(row["width"] for row in rows if row["model"] == name)
        assert widths == sorted(set(DEFAULT_WIDTHS) | set(model.paper_widths))
        full = next(row for row in rows if row["model"] == name and row["width"] == 1.0)
        assert full["params"] == sum(p.numel() for p in model.build().parameters())
        ordered = sorted((row for row in rows if row["model"] == name), key=lambda row: row["width"])
        assert [row["macs"] for row in ordered] == sorted(row["macs"] for row in ordered)
        assert all(row["train_flops"] > row["flops"] > row["macs"] > 0 for row in ordered)


def test_models_table_names_every_model(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = run(capsys, "models")
    assert rc == 0
    for name in model_names():
        assert name in out
    assert "6,603,710" in out  # cfd-cnn at full width, Table 5 of the Coded-FD paper


@pytest.mark.parametrize("argv", [["nonsense"], [], ["models", "--bogus"], ["export", "--widths", "a,b"]])
def test_bad_command_lines_exit_2_with_one_line(capsys: pytest.CaptureFixture[str], argv: list[str]) -> None:
    rc, out, err = run(capsys, *argv)
    assert rc == 2
    assert err.startswith("fleetbench: error:")
    assert err.count("\n") == 1
    assert "Traceback" not in err


def test_parse_widths_keeps_order_and_drops_duplicates() -> None:
    assert parse_widths("0.5,0.25,0.5,1") == (0.5, 0.25, 1.0)
    with pytest.raises(InputError):
        parse_widths("0.5,0")


def test_an_unexpected_error_is_one_line_and_a_log_holding_the_traceback(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import exporters.cli

    def crash(args: object) -> int:
        raise ZeroDivisionError("the numbers went wrong")

    monkeypatch.setattr(exporters.cli, "cmd_models", crash)
    monkeypatch.setenv("FLEETBENCH_LOG_DIR", str(tmp_path / "logs"))
    rc, out, err = run(capsys, "models")
    assert rc == 1 and err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith("fleetbench: internal error: ZeroDivisionError: the numbers went wrong (traceback in ")
    logs = list((tmp_path / "logs").iterdir())
    assert len(logs) == 1 and str(logs[0]) in err
    text = logs[0].read_text()
    assert text.startswith("fleetbench models\n") and "Traceback" in text and "in crash" in text

    rc, out, err = run(capsys, "--debug", "models")
    assert rc == 1 and "Traceback" in err and "in crash" in err
    assert len(list((tmp_path / "logs").iterdir())) == 1  # --debug prints instead of logging


def test_a_termination_python_wrapped_in_another_error_still_ends_the_command_as_terminated(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """SIGTERM while a module defines a dataclass: Python 3.11 wraps what ``__set_name__`` raises."""
    import signal

    import exporters.cli
    from devices.processes import Terminated

    class SignalArrives:
        def __set_name__(self, owner: type, name: str) -> None:
            raise Terminated(signal.SIGTERM)

    def importing(args: object) -> int:
        class Defined:  # what importing a module runs: its class bodies
            field = SignalArrives()

        return 0

    monkeypatch.setattr(exporters.cli, "cmd_models", importing)
    monkeypatch.setenv("FLEETBENCH_LOG_DIR", str(tmp_path / "logs"))
    rc, out, err = run(capsys, "models")
    assert (rc, err) == (128 + signal.SIGTERM, "fleetbench: terminated (SIGTERM)\n")
    assert not (tmp_path / "logs").exists()  # not an internal error


def test_a_failure_of_the_environment_is_one_line_and_exit_1(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    rc, out, err = run(capsys, "fl", "runs", "--db", str(blocker / "sub" / "x.db"))
    assert rc == 2 and "no profile store at" in err  # a missing store named by the user is bad input
    rc, out, err = run(capsys, "profiles", "export", "--db", str(tmp_path / "missing.db"))
    assert rc == 2 and not (tmp_path / "missing.db").exists()
    from harness.store import ProfileStore

    with pytest.raises(OSError):
        ProfileStore(blocker / "sub" / "x.db")
    rc, out, err = run(capsys, "fl", "run", "--dataset", "digits", "--clients", "2", "--db", str(blocker / "x.db"))
    assert rc == 1 and err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith("fleetbench: error: ") and str(blocker) in err


def test_a_locked_store_is_a_failure_of_the_environment(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import sqlite3

    import harness.store
    from harness.store import ProfileStore

    db = tmp_path / "fleetbench.db"
    ProfileStore(db).close()
    monkeypatch.setattr(harness.store, "BUSY_TIMEOUT_S", 0.2)
    holder = sqlite3.connect(db, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")  # another process holds the write lock
    try:
        rc, out, err = run(capsys, "fl", "runs", "--db", str(db))
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert rc == 1 and err.count("\n") == 1
    assert err == f"fleetbench: error: profile store {db}: database is locked\n"


def test_the_command_line_is_built_and_a_fleet_checked_without_importing_torch(tmp_path: Path) -> None:
    """Commands that export nothing start quickly: building the parser and `fleet check` leave torch unimported."""
    import subprocess
    import sys

    example = Path(__file__).resolve().parents[2] / "devices" / "fleets" / "emulated.yaml"
    code = (
        "import sys\n"
        "from fleetbench.cli import main\n"
        f"rc = main(['fleet', 'check', {str(example)!r}])\n"
        "print(rc, sorted(m for m in ('torch', 'onnx', 'onnxruntime') if m in sys.modules))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=tmp_path)
    assert done.stdout.splitlines()[-1] == "0 []", done.stdout + done.stderr
