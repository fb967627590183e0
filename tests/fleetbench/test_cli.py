"""The ``fleetbench`` command line: ``models`` and the shared error handling."""

from __future__ import annotations

import json

import pytest

from exporters.errors import InputError
from exporters.zoo import DEFAULT_WIDTHS, get_model, model_names
from harness.cli import main, parse_widths


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
