"""A user's own model (`exporters.user_model`): the forms of ``--model``, its name, and bad input.

The command-line cases run ``fleetbench``: each bad model gets one line on stderr and exit
status 2, and nothing is written (no artifact directory, no registry entry). What depends on a
fresh process (a name resolved again, a changed file, a module on ``PYTHONPATH``, an unknown
name's exit status) runs it in a subprocess, as a user does; the bad models and the refused
options call its ``main`` in the test's process, which handles errors as the console script does.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

from exporters.arch import static_submodel
from exporters.user_model import ModelOptions, registry_dir, user_model
from exporters.userinput import InputError
from exporters.zoo import get_model
from tests.exporters.examples import ALL, MOBILENET_V2, SMALL_CNN

FLEETBENCH = [sys.executable, "-m", "fleetbench.cli"]

#: The subprocesses' environment on top of the test's: one torch (OpenMP) thread, since the
#: models checked here are small and idle OpenMP threads spin on a busy machine.
ONE_THREAD = {"OMP_NUM_THREADS": "1"}

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # the same, for the models built in the test process

TINY = """
import torch
from torch import nn


class Tiny(nn.Module):
    def __init__(self, hidden=HIDDEN, num_classes=4):
        super().__init__()
        self.conv = nn.Conv2d(1, 6, 3)
        self.hidden = nn.Linear(6 * 4 * 4, hidden)
        self.out = nn.Linear(hidden, num_classes)

    def forward(self, x):
        return self.out(torch.relu(self.hidden(torch.flatten(torch.relu(self.conv(x)), 1))))


def tiny(num_classes=4):
    return Tiny(num_classes=num_classes)


tiny.input_shape = (1, 6, 6)
"""


def _write_tiny(path: Path, hidden: int = 8) -> Path:
    path.write_text(TINY.replace("HIDDEN", str(hidden)))
    return path


def _cli(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*FLEETBENCH, *args],
        capture_output=True,
        text=True,
        env={**os.environ, **ONE_THREAD, **(env or {})},
        cwd=cwd,
        timeout=300,
    )


def _main(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, *args: str, cwd: Path | None = None
) -> tuple[int, str, str]:
    """Run ``fleetbench`` in this process (in ``cwd``); its exit status, stdout and stderr."""
    from fleetbench.cli import main

    if cwd is not None:
        monkeypatch.chdir(cwd)
    capsys.readouterr()
    rc = main(list(args))
    out, err = capsys.readouterr()
    return rc, out, err


def _name_of(result: subprocess.CompletedProcess) -> str:
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)[0]["model"]


def test_a_file_model_is_named_by_its_factory_and_definition_hash() -> None:
    model = user_model(SMALL_CNN)
    factory, _, digest = model.name.partition("@")
    assert factory == "small_cnn" and len(digest) == 12 and model.digest.startswith(digest)
    assert model.source == SMALL_CNN
    assert (model.input_shape, model.input_dtype, model.num_classes) == ((1, 28, 28), "float32", 10)
    assert model.groups == (("features.0", 16), ("features.4", 32), ("hidden", 64))
    assert any("BatchNorm" in note and "2 layers" in note for note in model.notes)
    entry = json.loads((registry_dir() / f"{model.name}.json").read_text())
    assert entry["source"] == SMALL_CNN
    assert get_model(model.name) is model


def test_the_name_resolves_again_in_another_process() -> None:
    model = user_model(MOBILENET_V2)
    code = f"from exporters.zoo import get_model; m = get_model({model.name!r}); print(m.digest, len(m.groups))"
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
        env={**os.environ, **ONE_THREAD},
    )
    assert out.stdout.split() == [model.digest, str(len(model.groups))]


def test_a_changed_model_is_a_new_model_and_its_old_name_is_refused(tmp_path: Path) -> None:
    path = _write_tiny(tmp_path / "tiny.py", hidden=8)
    first = _name_of(_cli("models", "--model", f"{path}:tiny", "--json"))
    _write_tiny(path, hidden=12)
    second = _name_of(_cli("models", "--model", f"{path}:tiny", "--json"))
    assert second != first and second.startswith("tiny@")
    stale = _cli("models", "--model", first)
    assert stale.returncode == 2
    assert "has changed since" in stale.stderr and second in stale.stderr


def test_the_same_file_in_another_place_is_the_same_model(tmp_path: Path) -> None:
    here = _name_of(_cli("models", "--model", f"{_write_tiny(tmp_path / 'a.py')}:tiny", "--json"))
    (tmp_path / "elsewhere").mkdir()
    there = _name_of(_cli("models", "--model", f"{_write_tiny(tmp_path / 'elsewhere' / 'b.py')}:tiny", "--json"))
    assert here == there


def test_module_and_entry_point_forms_name_the_same_model(tmp_path: Path) -> None:
    package = tmp_path / "mymodels"
    package.mkdir()
    _write_tiny(package / "__init__.py")
    info = tmp_path / "mymodels-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: mymodels\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[fleetbench.models]\ntiny = mymodels:tiny\n")
    env = {"PYTHONPATH": f"{tmp_path}{os.pathsep}{Path.cwd()}"}
    by_module = _name_of(_cli("models", "--model", "mymodels:tiny", "--json", env=env))
    by_entry = _name_of(_cli("models", "--model", "tiny", "--json", env=env))
    assert by_module == by_entry and by_module.startswith("tiny@")


def test_flags_give_the_input_and_the_classes(tmp_path: Path) -> None:
    path = tmp_path / "bare.py"
    path.write_text(TINY.replace("HIDDEN", "8").replace("tiny.input_shape = (1, 6, 6)", ""))
    with pytest.raises(InputError, match="input shape unknown"):
        user_model(f"{path}:tiny")
    model = user_model(f"{path}:tiny", ModelOptions(input_shape=(1, 6, 6), num_classes=7))
    assert model.input_shape == (1, 6, 6) and model.num_classes == 7  # num_classes reached the factory
    other = user_model(f"{path}:tiny", ModelOptions(input_shape=(1, 6, 6), num_classes=5))
    assert other.name != model.name  # the options are part of the definition


def test_a_width_is_the_prefix_of_a_fresh_full_model() -> None:
    for spec in ALL:
        model = user_model(spec)
        for rate in (0.25, 0.6):
            arch = model.arch(rate)
            torch.manual_seed(3)
            full = {n: p.detach().numpy() for n, p in model.build().named_parameters()}
            torch.manual_seed(3)
            sub = model.build(arch)
            want = model.extract(full, static_submodel(arch))
            for name, param in sub.named_parameters():
                np.testing.assert_array_equal(param.detach().numpy(), want[name], err_msg=f"{spec} {rate} {name}")


BAD = """
import torch
from torch import nn


def raises():
    raise RuntimeError("weights file missing")


def not_a_module():
    return 3


def wrong_shape():
    return nn.Sequential(nn.Conv2d(3, 8, 3), nn.Flatten(), nn.Linear(8 * 30 * 30, 10))


wrong_shape.input_shape = (1, 28, 28)


def nothing():
    return nn.Sequential(nn.Flatten(), nn.Linear(784, 10))


nothing.input_shape = (1, 28, 28)


class Grouped(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 16, 3, padding=1)
        self.grouped = nn.Conv2d(16, 16, 3, padding=1, groups=4)
        self.fc = nn.Linear(16, 10)

    def forward(self, x):
        return self.fc(torch.relu(self.grouped(torch.relu(self.stem(x)))).mean((2, 3)))


def grouped():
    return Grouped()


grouped.input_shape = (3, 8, 8)
"""


@pytest.mark.parametrize(
    ("factory", "message"),
    [
        ("missing.py:net", r"no such file .*missing\.py"),
        ("bad.py:absent", r"has no callable 'absent'"),
        ("bad.py:raises", r"the factory raised RuntimeError: weights file missing"),
        ("bad.py:not_a_module", r"returned int, not a torch.nn.Module"),
        ("bad.py:wrong_shape", r"forward pass fails on input shape \(1, 28, 28\)"),
        ("bad.py:nothing", r"no prunable channel group"),
        (
            "bad.py:grouped",
            r"layer '(stem|grouped)' cannot be sliced: .*meet grouped, a grouped convolution \(groups 4\)",
        ),
    ],
)
def test_a_bad_model_gets_one_line_and_nothing_is_written(
    tmp_path: Path, factory: str, message: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "bad.py").write_text(BAD)
    registry = tmp_path / "registry"
    monkeypatch.setenv("FLEETBENCH_MODELS_DIR", str(registry))
    rc, _, err = _main(capsys, monkeypatch, "export", "--model", factory, "--out", "out", cwd=tmp_path)
    assert rc == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("fleetbench: error: ")
    assert re.search(message, lines[0]), lines[0]
    assert not (tmp_path / "out").exists() and not registry.exists()


def test_an_unknown_name_lists_the_zoo_and_the_file_form() -> None:
    result = _cli("models", "--model", "no-such-model")
    assert result.returncode == 2
    assert "fjord-cnn" in result.stderr and "FILE.py:FACTORY" in result.stderr


def test_the_options_are_refused_for_a_zoo_model(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    rc, _, err = _main(capsys, monkeypatch, "models", "--model", "fjord-cnn", "--input-shape", "1,28,28")
    assert rc == 2 and "for your own model" in err


def test_keep_names_the_layers_kept_full(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "mixed.py"
    path.write_text(
        textwrap.dedent(
            """
            import torch
            from torch import nn


            class Mixed(nn.Module):
                def __init__(self):
                    super().__init__()
                    self.stem = nn.Conv2d(3, 8, 3, padding=1)
                    self.wide = nn.Conv2d(8, 16, 3, padding=1)
                    self.grouped = nn.Conv2d(16, 16, 3, padding=1, groups=4)
                    self.fc = nn.Linear(16, 10)

                def forward(self, x):
                    x = torch.relu(self.wide(torch.relu(self.stem(x))))
                    return self.fc(torch.relu(self.grouped(x)).mean((2, 3)))


            def mixed():
                return Mixed()


            mixed.input_shape = (3, 8, 8)
            """
        )
    )
    rc, _, err = _main(capsys, monkeypatch, "models", "--model", f"{path}:mixed")
    assert rc == 2 and "a grouped convolution" in err
    rc, out, err = _main(capsys, monkeypatch, "models", "--model", f"{path}:mixed", "--unsliceable", "keep")
    assert rc == 0, err
    assert "1 channel groups: stem (8)" in out
    assert out.count("kept at full width") == 2
