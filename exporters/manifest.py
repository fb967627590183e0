"""The artifact set on disk: its file names, its manifest, and the flat parameter order.

An artifact set (written by `exporters.artifacts.export_artifacts`) is one directory
of `ARTIFACT_FILES` plus ``manifest.json``. The manifest is written last and records
every file's sha256 and size; `load_valid_manifest` accepts a set only when every
file still matches, so a half-written or corrupted set is never used.

The manifest's ``parameters`` list names every trainable tensor in the order of
ORT's flat parameter buffer, with its shape, offset and size. `flatten` and
`unflatten` map named tensors to and from that one float32 vector: the wire format
in which parameters travel to the on-device runner and back (`harness.contract`).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from exporters.step_model import INITIAL_PARAMETERS, STEP_MODEL
from exporters.userinput import InputError

#: What each export format changed, newest last; a format that changes what the export
#: writes gets the next number and a line here.
EXPORT_FORMAT_CHANGES: dict[int, str] = {
    3: "an LSTM's recurrent gradient is one product over all time steps: its steps are up to 1.34x faster",
    4: "the manifest names the arch's neurons per group 'sizes' (was 'widths'); the graphs are unchanged",
}
#: The formats whose change no measured step time can see: a profile measured on the format
#: before one of them still describes its artifacts.
UNTIMED_EXPORT_FORMATS = frozenset({4})
#: The format exported now: part of the cache key, and recorded with every measured cell.
EXPORT_FORMAT_VERSION = max(EXPORT_FORMAT_CHANGES)
#: The first format a cell recorded; a cell without one was measured on an older format.
FIRST_RECORDED_EXPORT_FORMAT = 3


def timed_format_changes() -> dict[int, str]:
    """Return the export format changes a measured step time can see (`EXPORT_FORMAT_CHANGES` less the untimed).

    Returns
    -------
    dict of int to str
    """
    return {n: what for n, what in EXPORT_FORMAT_CHANGES.items() if n not in UNTIMED_EXPORT_FORMATS}

MANIFEST = "manifest.json"
TRAINING_MODEL = "training_model.onnx"
EVAL_MODEL = "eval_model.onnx"
OPTIMIZER_MODEL = "optimizer_model.onnx"
CHECKPOINT = "checkpoint"
#: Every file of a set except the manifest, in the order the manifest lists them.
ARTIFACT_FILES = (TRAINING_MODEL, EVAL_MODEL, OPTIMIZER_MODEL, CHECKPOINT, STEP_MODEL, INITIAL_PARAMETERS)


def read_manifest(directory: Path) -> dict[str, Any]:
    """Read ``manifest.json`` of an artifact set.

    Parameters
    ----------
    directory : pathlib.Path

    Returns
    -------
    dict

    Raises
    ------
    InputError
        If the directory holds no readable manifest.
    """
    path = Path(directory) / MANIFEST
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise InputError(f"{directory}: no readable {MANIFEST} ({exc})") from None
    if not isinstance(data, dict):
        raise InputError(f"{path}: not a JSON object")
    return data


def load_valid_manifest(directory: Path, key: str | None = None) -> dict[str, Any] | None:
    """Return the manifest if the set is complete and intact, else ``None``.

    Parameters
    ----------
    directory : pathlib.Path
    key : str, optional
        Expected cache key; any key is accepted when ``None``.

    Returns
    -------
    dict or None
        The manifest when it parses, carries ``key`` and every listed file
        matches its recorded sha256 and size.
    """
    try:
        manifest = read_manifest(directory)
    except InputError:
        return None
    if key is not None and manifest.get("cache_key") != key:
        return None
    files = manifest.get("files")
    if not isinstance(files, dict) or set(files) != set(ARTIFACT_FILES):
        return None
    for name, entry in files.items():
        path = Path(directory) / name
        try:
            if path.stat().st_size != entry["bytes"] or sha256_file(path) != entry["sha256"]:
                return None
        except (OSError, KeyError, TypeError):
            return None
    return manifest


def file_entry(path: Path) -> dict[str, Any]:
    """Return the manifest entry of one file: its sha256 and size in bytes."""
    return {"sha256": sha256_file(path), "bytes": path.stat().st_size}


def sha256_file(path: Path) -> str:
    """Return the hex sha256 of a file, read in 1 MiB chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def write_json(path: Path, data: Mapping[str, Any]) -> None:
    """Write ``data`` as indented JSON and fsync it (the caller renames it into place)."""
    with open(path, "w") as f:
        json.dump(data, f, indent=1, sort_keys=False)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())


def flatten(manifest: Mapping[str, Any], params: Mapping[str, np.ndarray]) -> np.ndarray:
    """Concatenate named parameters into the flat float32 buffer of a manifest.

    Parameters
    ----------
    manifest : mapping
    params : mapping of str to numpy.ndarray

    Returns
    -------
    numpy.ndarray

    Raises
    ------
    InputError
        If a parameter is missing or has the wrong shape.
    """
    parts = []
    for p in manifest["parameters"]:
        if p["name"] not in params:
            raise InputError(f"parameter {p['name']!r} missing")
        arr = np.asarray(params[p["name"]], dtype=np.float32)
        if list(arr.shape) != list(p["shape"]):
            raise InputError(f"parameter {p['name']!r} has shape {list(arr.shape)}, expected {p['shape']}")
        parts.append(arr.reshape(-1))
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.float32)


def unflatten(manifest: Mapping[str, Any], flat: np.ndarray) -> dict[str, np.ndarray]:
    """Split a flat buffer into named, shaped parameters (copies).

    Parameters
    ----------
    manifest : mapping
    flat : numpy.ndarray

    Returns
    -------
    dict of str to numpy.ndarray
    """
    return {
        p["name"]: np.array(flat[p["offset"] : p["offset"] + p["size"]], dtype=np.float32).reshape(p["shape"])
        for p in manifest["parameters"]
    }
