"""The on-device runner's contract, as the host reads it: one module for every caller.

The runner (`harness/runner.py`) is one self-contained file pushed to devices; this
module is everything the host needs to drive it, used alike by profiling campaigns
(`harness.campaign`) and the FL devices executor (`fl.executors.devices`):

* `RUNNER_PATH`: the file to deploy;
* `RunnerStart`: how a device starts the runner's Python -- its own interpreter, or a
  runtime bundle's through the bundle's loader (``env PYTHONHOME=B ... B/lib/ld-linux-*
  --library-path B/lib B/bin/python3``, `harness.phone_runtime`), and which backends
  that runtime offers;
* `bench_argv` and `train_argv`: the command line of each mode (the Python given as a
  path or as a `RunnerStart`);
* `RUNNER_EXIT_CODES` and `parse_output`: exit status and JSON document in, one
  status, a one-line message and the document out;
* `write_params` and `read_params`: the flat-parameter wire format (one float32
  vector in the manifest's parameter order, saved with ``np.save`` and
  ``allow_pickle=False``).

Exit codes are defined once, in the runner (`harness.runner.EXIT_CODES`), and
inverted here, so the two cannot drift apart.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from exporters.manifest import flatten, unflatten
from harness import runner

#: The runner file pushed to devices.
RUNNER_PATH = Path(runner.__file__).resolve()

#: Exit status of the runner -> the status it means.
RUNNER_EXIT_CODES: Mapping[int, str] = {code: status for status, code in runner.EXIT_CODES.items()}

#: Runner statuses -> the FL failure reason of a client (`fl.records.FAILURE_REASONS`).
FAILURE_REASON_OF_STATUS: Mapping[str, str] = {
    "out of memory": "out_of_memory",
    "timeout": "timeout",
    "unreachable": "unreachable",
    "connection lost": "unreachable",
    "missing runtime": "refused",
    "bad arguments": "refused",
}


@dataclass(frozen=True)
class RunnerStart:
    """How a device starts the runner's Python.

    Attributes
    ----------
    argv : tuple of str
        The command that runs Python (the runner's path and arguments follow).
    runtime : str
        ``"python"`` (the device's own interpreter) or ``"bundle"`` (a pushed runtime bundle).
    backends : tuple of str
        The runner backends this runtime offers (empty: whatever the device has installed).
    detail : str
        One line saying what was chosen and why (for provisioning output and logs).
    """

    argv: tuple[str, ...]
    runtime: str = "python"
    backends: tuple[str, ...] = ()
    detail: str = ""

    def offers(self, backend: str) -> bool:
        """Whether ``backend`` can run on this runtime (an unrestricted runtime offers every one)."""
        return not self.backends or backend in self.backends

    def backend(self, wanted: str | None, default: str = "ort") -> str:
        """Return the backend to use: ``wanted`` when given, else the runtime's first, else ``default``."""
        return wanted or (self.backends[0] if self.backends else default)


def python_start(python: str) -> RunnerStart:
    """Return the `RunnerStart` of a device's own interpreter ``python``."""
    return RunnerStart((python,), "python", (), f"the device's {python}")


def _start_argv(python: str | RunnerStart) -> list[str]:
    return list(python.argv) if isinstance(python, RunnerStart) else [python]


@dataclass(frozen=True)
class RunnerOutput:
    """What one runner invocation came back with.

    Attributes
    ----------
    status : str
        ``"ok"`` or a failure status (a key of `FAILURE_REASON_OF_STATUS`, or ``"runner error"``).
    message : str
        One line saying what went wrong ("" when ok).
    document : dict
        The parsed JSON document (empty when stdout was not a JSON object).
    """

    status: str
    message: str
    document: dict[str, Any]

    @property
    def ok(self) -> bool:
        """Whether the runner succeeded."""
        return self.status == "ok"


def bench_argv(
    python: str | RunnerStart,
    runner_path: str,
    artifacts: str,
    *,
    backend: str,
    warmup: int,
    steps: int,
    threads: int,
    sample_seconds: float = 0.0,
) -> list[str]:
    """Return the command line of ``runner.py bench``.

    Parameters
    ----------
    python : str or RunnerStart
        The device's Python interpreter, or how the device starts one.
    runner_path : str
        Where the runner is deployed on the device.
    artifacts : str
        The deployed artifact set's directory on the device.
    backend : str
        ``"ort"``, ``"torch"`` or ``"onnx"``.
    warmup, steps, threads : int
    sample_seconds : float
        Minimum seconds per timed sample (0: every step is a sample).

    Returns
    -------
    list of str
    """
    return [
        *_start_argv(python), runner_path, "bench", "--artifacts", artifacts, "--backend", backend,
        "--warmup", str(warmup), "--steps", str(steps), "--threads", str(threads),
        "--sample-seconds", repr(float(sample_seconds)),
    ]  # fmt: skip


def train_argv(
    python: str | RunnerStart,
    runner_path: str,
    artifacts: str,
    *,
    backend: str,
    params: str,
    data: str,
    out: str,
    epochs: int,
    lr: float,
    threads: int,
    seed: int,
) -> list[str]:
    """Return the command line of ``runner.py train``.

    Parameters
    ----------
    python, runner_path, artifacts : str
        As for `bench_argv`.
    backend : str
    params : str
        The flat parameters to start from, on the device (`write_params`).
    data : str
        The shard (``.npz`` with ``x`` and ``y``) on the device.
    out : str
        Where the runner writes the trained flat parameters.
    epochs : int
    lr : float
    threads, seed : int

    Returns
    -------
    list of str
    """
    return [
        *_start_argv(python), runner_path, "train", "--artifacts", artifacts, "--backend", backend,
        "--params", params, "--data", data, "--epochs", str(epochs), "--lr", repr(float(lr)),
        "--threads", str(threads), "--seed", str(seed), "--out", out,
    ]  # fmt: skip


def parse_output(rc: int, stdout: str, stderr: str) -> RunnerOutput:
    """Turn the runner's exit status and output into a `RunnerOutput`.

    Parameters
    ----------
    rc : int
        Exit status of the runner.
    stdout, stderr : str
        Its output; stdout must be one JSON object.

    Returns
    -------
    RunnerOutput
        The document's status; where the exit status disagrees with an ``"ok"``
        document, the exit status wins; no document at all is a ``"runner error"``
        whose message quotes the end of stderr.
    """
    tail = stderr.strip()[-300:]
    try:
        doc = json.loads(stdout)
    except ValueError:
        doc = None
    if not isinstance(doc, dict):
        what = "no output" if not stdout.strip() else "output that is not a JSON object"
        message = f"runner exited {rc} with {what}" + (f"; stderr: {tail}" if tail else "")
        return RunnerOutput("runner error", message, {})
    status = str(doc.get("status") or RUNNER_EXIT_CODES.get(rc, "runner error"))
    if status == "ok" and rc != 0:
        status = RUNNER_EXIT_CODES.get(rc, "runner error")
    if status == "ok":
        return RunnerOutput(status, "", doc)
    message = str(doc.get("error") or "") or (f"runner exited {rc}" + (f"; stderr: {tail}" if tail else ""))
    return RunnerOutput(status, message, doc)


def write_params(path: Path, manifest: Mapping[str, Any], params: Mapping[str, np.ndarray]) -> int:
    """Write parameters in the wire format: one flat float32 vector in manifest order.

    Parameters
    ----------
    path : pathlib.Path
        The ``.npy`` file to write.
    manifest : mapping
        The artifact set's manifest (parameter names, shapes, offsets).
    params : mapping of str to numpy.ndarray

    Returns
    -------
    int
        Bytes written.
    """
    np.save(path, flatten(manifest, params), allow_pickle=False)
    return path.stat().st_size


def read_params(path: Path, manifest: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """Read a flat parameter vector the runner wrote, as named tensors.

    Parameters
    ----------
    path : pathlib.Path
    manifest : mapping

    Returns
    -------
    dict of str to numpy.ndarray

    Raises
    ------
    ValueError
        If the file does not hold one float vector of the manifest's length.
    """
    flat = np.load(path, allow_pickle=False)
    size = int(manifest["num_parameters"])
    if flat.ndim != 1 or flat.size != size or flat.dtype.kind != "f":
        raise ValueError(f"{path}: parameters of shape {flat.shape} and dtype {flat.dtype}, expected float ({size},)")
    return unflatten(manifest, flat)
