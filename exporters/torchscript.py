"""TorchScript twin of an artifact set, for the runner's ``torch`` backend.

`export_torchscript` traces the zoo module of an arch, built with exactly the
seeded weights of the ORT checkpoint (`exporters.artifacts.build_seeded`), and
saves it as ``model.pt`` inside an artifact set directory. The traced module
keeps the zoo module's parameter names (``nn.LSTM`` stays the native, fused
LSTM: `exporters.export_forms` only rewrites the ONNX export), so the runner can
load the flat parameter vector into it by the manifest's names and shapes.

The trace is taken in training mode on a batch of the manifest's ``batch``; the
traced module takes any batch size (the zoo modules size nothing by the batch),
as the runner's short last batch of an epoch needs. ``model.pt`` is not part of the
manifest's file list (the set's cache key and sha256 check are unchanged); it is
written atomically, so a crash never leaves a partial file.
"""

from __future__ import annotations

import json
import os
import tempfile
import warnings
from pathlib import Path

import torch

from exporters.arch import Arch
from exporters.artifacts import ExportError, build_seeded
from exporters.host_disk import disk_full, is_disk_full
from exporters.manifest import MANIFEST
from exporters.userinput import InputError
from exporters.zoo import ZooModel

#: File name of the TorchScript module inside an artifact set (the runner reads this name).
TORCHSCRIPT_FILE = "model.pt"


def export_torchscript(model: ZooModel, arch: Arch, directory: Path) -> Path:
    """Trace ``arch``'s seeded module and save it as ``model.pt`` in an artifact set.

    Parameters
    ----------
    model : ZooModel
        The zoo model.
    arch : Arch
        The width; must be the arch the artifact set was exported for.
    directory : pathlib.Path
        An artifact set directory written by `exporters.artifacts.export_artifacts`.

    Returns
    -------
    pathlib.Path
        The path of ``model.pt``.

    Raises
    ------
    InputError
        If the directory has no readable manifest, or the manifest is for another
        model or arch.
    ExportError
        If the traced module's parameters differ from the manifest's names and shapes.
    exporters.host_disk.DiskFull
        If the directory's file system has no room for ``model.pt`` (nothing is left behind).
    """
    directory = Path(directory)
    try:
        manifest = json.loads((directory / MANIFEST).read_text())
    except (OSError, ValueError) as exc:
        raise InputError(f"{directory}: no readable {MANIFEST} ({exc})") from None
    if manifest.get("model") != model.name or manifest.get("arch", {}).get("key") != arch.key():
        raise InputError(
            f"{directory}: artifact set is for {manifest.get('model')!r} {manifest.get('arch')}, not {arch.key()}"
        )
    net = build_seeded(model, arch)
    x, _ = model.example_batch(int(manifest["batch"]))
    with warnings.catch_warnings(), torch.random.fork_rng(devices=[]):
        warnings.simplefilter("ignore")  # TracerWarnings from nn.LSTM internals; parity is tested
        traced = torch.jit.trace(net, (x,), check_trace=False)
    shapes = [(name, list(p.shape)) for name, p in traced.named_parameters()]
    expected = [(p["name"], list(p["shape"])) for p in manifest["parameters"]]
    if sorted(shapes) != sorted(expected):
        raise ExportError(f"{directory}: traced parameters {shapes} differ from the manifest's {expected}")
    target = directory / TORCHSCRIPT_FILE
    tmp = ""
    try:
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=".model-", suffix=".pt")
        os.close(fd)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # torch 2.13 deprecates TorchScript; still loads
            torch.jit.save(traced, tmp)
        os.replace(tmp, target)
    except Exception as exc:
        if is_disk_full(exc, directory):
            raise disk_full(directory, f"the TorchScript model {TORCHSCRIPT_FILE}", exc) from None
        raise
    finally:
        if tmp and os.path.exists(tmp):
            os.unlink(tmp)
    return target
