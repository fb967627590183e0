"""An artifact set on the device: its manifest, its files checked against it, a random batch from its shapes."""

from __future__ import annotations

import hashlib
import json
import os

from .failures import bad
from .protocol import STEP_MODEL_FILE, TORCHSCRIPT_FILE


def load_manifest(directory: str, backend: str) -> dict:
    """Read and check an artifact set's manifest for ``backend``.

    Parameters
    ----------
    directory : str
    backend : {"ort", "onnx", "torch"}

    Returns
    -------
    dict

    Raises
    ------
    RunnerFailure
        "bad arguments" when the directory, a needed file or a manifest field is missing.
    """
    if not os.path.isdir(directory):
        raise bad(f"artifacts {directory}: not a directory")
    try:
        with open(os.path.join(directory, "manifest.json")) as handle:
            manifest = json.load(handle)
    except (OSError, ValueError) as exc:
        raise bad(f"artifacts {directory}: no readable manifest.json ({exc})") from None
    needed = {
        "ort": ["training_model.onnx", "optimizer_model.onnx", "checkpoint"],
        "onnx": [STEP_MODEL_FILE],
        "torch": [TORCHSCRIPT_FILE],
    }[backend]
    for name in needed:
        if not os.path.isfile(os.path.join(directory, name)):
            hint = " (export it with exporters.torchscript.export_torchscript)" if name == TORCHSCRIPT_FILE else ""
            raise bad(f"artifacts {directory}: {name} is missing{hint}")
    try:
        inputs = manifest["inputs"]
        int(manifest["batch"])
        int(manifest["num_parameters"])
        [(p["name"], list(p["shape"])) for p in manifest["parameters"]]
        inputs[0]["shape"], inputs[0]["dtype"], inputs[1]["name"]
    except (KeyError, TypeError, ValueError, IndexError) as exc:
        raise bad(f"artifacts {directory}: manifest lacks {exc}") from None
    if num_classes(manifest) is None:
        raise bad(f"artifacts {directory}: manifest does not say num_classes")
    if backend == "onnx":
        spec = manifest.get("step_model")
        try:
            [(t["name"], list(t["shape"]), t["dtype"]) for t in spec["inputs"] + spec["outputs"]]
            [(a, b) for a, b in spec["carry"]]
            spec["parameters"], spec["batch"][1], spec["learning_rate"], spec["loss"]
        except (KeyError, TypeError, ValueError, IndexError) as exc:
            raise bad(f"artifacts {directory}: manifest has no usable step_model entry ({exc!r}); re-export") from None
    return manifest


def variable_batch(manifest: dict) -> bool:
    """Tell whether a set's graphs take a batch of any size.

    Such a set names its inputs' first dimension (``"batch"``) where a set with a fixed
    batch gives its size; its ``batch`` is the batch it was exported and profiled with.

    Parameters
    ----------
    manifest : dict

    Returns
    -------
    bool
    """
    shape = manifest["inputs"][0]["shape"]
    return bool(shape) and isinstance(shape[0], str)


def num_classes(manifest: dict) -> int | None:
    """Return the model's number of classes (also the vocabulary of int64 inputs).

    Parameters
    ----------
    manifest : dict

    Returns
    -------
    int or None
    """
    for source in (manifest, manifest.get("cache_key_inputs") or {}):
        value = source.get("num_classes")
        if isinstance(value, int) and value > 0:
            return value
    return None


def random_batch(np, manifest: dict, seed: int) -> tuple:
    """Build one random training batch from the manifest's input shapes and dtypes.

    Parameters
    ----------
    np : module
    manifest : dict
    seed : int

    Returns
    -------
    x, y : numpy.ndarray
        C-contiguous inputs and int64 labels below ``num_classes``, ``batch`` examples
        (the manifest's: the profiled batch of a set that takes any).
    """
    rng = np.random.default_rng(seed)
    classes = num_classes(manifest)
    spec = manifest["inputs"][0]
    batch = int(manifest["batch"])
    shape = (batch,) + tuple(int(d) for d in spec["shape"][1:])
    if spec["dtype"] in ("int64", "int32"):
        x = rng.integers(0, classes, size=shape).astype(spec["dtype"])
    else:
        x = rng.standard_normal(shape).astype(spec["dtype"])
    y = rng.integers(0, classes, size=(batch,)).astype(np.int64)
    return np.ascontiguousarray(x), np.ascontiguousarray(y)


def sha256_of(path: str) -> str:
    """Return the hex sha256 of a file.

    Parameters
    ----------
    path : str

    Returns
    -------
    str
    """
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def check_listed(directory: str, manifest: dict, name: str) -> str:
    """Return the path of a file of the set after checking it against the manifest's sha256."""
    path = os.path.join(directory, name)
    entry = (manifest.get("files") or {}).get(name)
    if not isinstance(entry, dict) or "sha256" not in entry:
        raise bad(f"artifacts {directory}: the manifest does not list {name}")
    if sha256_of(path) != entry["sha256"]:
        raise bad(f"artifacts {directory}: {name} does not match the manifest's sha256 (not this set's; re-export)")
    return path
