"""The on-device runner's contract, as the host reads it: one module for every caller.

The runner (the `harness.runner` package) is pushed to devices as one file, its zip
application (`harness.runner_archive.archive_path`); this module is everything else the
host needs to drive it, used alike by profiling campaigns (`harness.campaign`) and the FL
devices executor (`fl.executors.devices`):

* `RunnerStart`: how a device starts the runner's Python -- its own interpreter, or a
  runtime bundle's through the bundle's loader (``env PYTHONHOME=B ... B/lib/ld-linux-*
  --library-path B/lib B/bin/python3``, `harness.phone_runtime`), and which backends
  that runtime offers;
* `bench_argv` and `train_argv`: the command line of each mode (the Python given as a
  path or as a `RunnerStart`); `power_options`: whether a device's runs measure energy
  (``--power-root``) and with which sensor;
* `serve_argv`, `bench_request`, `train_request` and `parse_reply`: the resident runner
  (``runner.pyz serve``, protocol in `harness.runner.protocol`): its command line (the
  Python again a path or a `RunnerStart`), one bench or train request (a bench request
  carries the same options as `bench_argv`, `bench_options`), one reply line in and a
  `RunnerOutput` out;
* `RUNNER_EXIT_CODES` and `parse_output`: exit status and JSON document in, one
  status, a one-line message and the document out, parsed once into a
  `harness.document.RunnerDocument` (`parse_reply` and a runner that ended without a
  reply, `ended_output`, give the same statuses; a document with a key of the wrong
  type is a ``"runner error"`` naming the key);
* `write_params` and `read_params`: the flat-parameter wire format (one float32
  vector in the manifest's parameter order, saved with ``np.save`` and
  ``allow_pickle=False``).

Exit codes are defined once, in the runner's shared module
(`harness.runner.protocol.EXIT_CODES`), and inverted here, so the two cannot drift apart.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from devices.errors import says_out_of_space
from devices.site import python_argv, site_path
from devices.transport import MAX_LINE_BYTES
from exporters.manifest import flatten, unflatten
from harness.document import EMPTY_DOCUMENT, DocumentError, RunnerDocument, parse_document
from harness.runner import protocol

if TYPE_CHECKING:
    from devices.fleet import Device

#: Most bytes of one runner document or reply line the host decodes (the transports' `MAX_LINE_BYTES`,
#: 16 MiB: a train reply of a long FjORD run is well under 1 MiB); a longer one is refused unread.
MAX_REPLY_BYTES = MAX_LINE_BYTES

#: Exit status of the runner -> the status it means.
RUNNER_EXIT_CODES: Mapping[int, str] = {code: status for status, code in protocol.EXIT_CODES.items()}

#: Runner statuses -> the FL failure reason of a client (`fl.records.FAILURE_REASONS`).
FAILURE_REASON_OF_STATUS: Mapping[str, str] = {
    "out of memory": "out_of_memory",
    "timeout": "timeout",
    "unreachable": "unreachable",
    "connection lost": "unreachable",
    "missing runtime": "refused",
    "bad arguments": "refused",
    "out of space": "refused",
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


def python_start(python: str, workdir: str, detail: str = "") -> RunnerStart:
    """Return the `RunnerStart` of a device's own interpreter, with its provisioned packages importable.

    Parameters
    ----------
    python : str
        The device's interpreter (``Device.python``).
    workdir : str
        The device's workdir: ``<workdir>/site`` goes first on ``PYTHONPATH``
        (`devices.site.python_argv`).
    detail : str, optional
        What was chosen and why (default: the interpreter and its site).

    Returns
    -------
    RunnerStart
    """
    detail = detail or f"the device's {python} (packages also from {site_path(workdir)})"
    return RunnerStart(tuple(python_argv(python, workdir)), "python", (), detail)


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
    document : RunnerDocument
        The runner's document, parsed (`harness.document.EMPTY_DOCUMENT` when stdout was
        not a JSON object or not a well-formed document).
    """

    status: str
    message: str
    document: RunnerDocument

    @property
    def ok(self) -> bool:
        """Whether the runner succeeded."""
        return self.status == "ok"


def bench_options(
    artifacts: str,
    *,
    backend: str,
    warmup: int,
    steps: int,
    threads: int,
    sample_seconds: float = 0.0,
    precision: float = protocol.DEFAULT_PRECISION,
    max_seconds: float = protocol.DEFAULT_MAX_SECONDS,
    data: str | None = None,
    matmul_seconds: float | None = None,
    power_root: str | None = None,
    power_sensor: str | None = None,
) -> dict[str, Any]:
    """Return the options of one ``bench`` run, by name (what `bench_argv` and `bench_request` send).

    Parameters
    ----------
    artifacts : str
        The deployed artifact set's directory on the device.
    backend : str
        ``"ort"``, ``"torch"`` or ``"onnx"``.
    warmup, steps, threads : int
        Most warm-up steps, fewest timed samples, intra-op threads.
    sample_seconds : float
        Minimum seconds per timed sample (0: every step is a sample).
    precision : float
        Target half-width of the median's 95 % interval, as a fraction of the median
        (0: exactly ``steps`` samples).
    max_seconds : float
        Cap on warm-up plus timed sampling.
    data : str, optional
        A deployed ``.npz`` shard whose batches the steps train on, in ``train``'s order
        (default: a random batch).
    matmul_seconds : float, optional
        Length of the runner's matmul probe (0: none; the runner's default when None).
    power_root : str, optional
        Measure the timed steps' energy with the power sensors below this directory on
        the device (`devices.fleet.Device.power_root`, `power_options`).
    power_sensor : str, optional
        The kind of sensor the device is expected to have (its facts' first).

    Returns
    -------
    dict
        Option names with ``_`` for ``-``; ``data``, ``matmul_seconds``, ``power_root`` and
        ``power_sensor`` only when given.
    """
    options: dict[str, Any] = {
        "artifacts": artifacts, "backend": backend, "warmup": int(warmup), "steps": int(steps),
        "threads": int(threads), "sample_seconds": float(sample_seconds), "precision": float(precision),
        "max_seconds": float(max_seconds),
    }  # fmt: skip
    if data:
        options["data"] = data
    if matmul_seconds is not None:
        options["matmul_seconds"] = float(matmul_seconds)
    options.update(_power(power_root, power_sensor))
    return options


def _power(power_root: str | None, power_sensor: str | None) -> dict[str, str]:
    """Return the power options that are given, by name."""
    given = {"power_root": power_root, "power_sensor": power_sensor if power_root else None}
    return {key: value for key, value in given.items() if value}


def power_options(power_root: str, facts: Mapping[str, Any] | None, emulated_power: bool) -> dict[str, str]:
    """Return the runner's power options for a device: its power root when it has a sensor to read.

    Parameters
    ----------
    power_root : str
        The device's power root (`devices.fleet.Device.power_root`).
    facts : Mapping or None
        The device's facts snapshot (`devices.facts.DeviceFacts.to_dict`): its ``power``
        lists the sensors the probe found.
    emulated_power : bool
        The device's fleet entry has an emulated ``power`` block.

    Returns
    -------
    dict
        ``{"power_root": ..., "power_sensor": kind}`` (the facts' first sensor's kind, where
        they list one) when the facts list a sensor or the device has an emulated one;
        else empty: the runner then measures no energy.
    """
    sensors = (facts or {}).get("power") or []
    kind = next((s.get("kind") for s in sensors if isinstance(s, Mapping) and s.get("kind")), None)
    if kind is None and not emulated_power:
        return {}
    return _power(power_root, kind)


def round_power_options(device: Device) -> dict[str, str]:
    """Return the runner's power options for a ``train`` request on ``device``: an FL client round's.

    A device with an emulated sensor names its kind (a missing one is then a flagged
    reading); any other device gets its power root only, so the runner measures with the
    sensor it finds there (a Jetson's INA3221, a Pi 5's PMIC, a phone's battery, RAPL) and
    reports no energy where there is none. The round-cost measurement sends its requests
    with the same options, so the fixed cost it measures holds the energy meter's idle
    window wherever the rounds it predicts read a sensor.

    Parameters
    ----------
    device : devices.fleet.Device

    Returns
    -------
    dict
        ``power_root`` and, for an emulated sensor, ``power_sensor``.
    """
    emulated = device.emulate is not None and device.emulate.power is not None
    return power_options(device.power_root, None, emulated) or {"power_root": device.power_root}


def bench_argv(python: str | RunnerStart, runner_path: str, artifacts: str, **options: Any) -> list[str]:
    """Return the command line of ``runner.pyz bench``.

    Parameters
    ----------
    python : str or RunnerStart
        The device's Python interpreter, or how the device starts one.
    runner_path : str
        Where the runner is deployed on the device.
    artifacts : str
        The deployed artifact set's directory on the device.
    **options
        The keywords of `bench_options`.

    Returns
    -------
    list of str
    """
    argv = [*_start_argv(python), runner_path, "bench"]
    for key, value in bench_options(artifacts, **options).items():
        argv += ["--" + key.replace("_", "-"), repr(value) if isinstance(value, float) else str(value)]
    return argv


def bench_request(artifacts: str, *, request_id: Any = None, **options: Any) -> dict[str, Any]:
    """Return one ``bench`` request of the serve protocol (the options of `bench_argv`).

    Parameters
    ----------
    artifacts : str
        The deployed artifact set's directory on the device.
    request_id : JSON value, optional
        Echoed as the reply's ``id``.
    **options
        The keywords of `bench_options`.

    Returns
    -------
    dict
        JSON-ready; one line of it is one request.
    """
    return {"id": request_id, "mode": "bench", **bench_options(artifacts, **options)}


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
    power_root: str | None = None,
    power_sensor: str | None = None,
) -> list[str]:
    """Return the command line of ``runner.pyz train``.

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
    power_root, power_sensor : str, optional
        Measure the round's energy (as for `bench_options`).

    Returns
    -------
    list of str
    """
    argv = [
        *_start_argv(python), runner_path, "train", "--artifacts", artifacts, "--backend", backend,
        "--params", params, "--data", data, "--epochs", str(epochs), "--lr", repr(float(lr)),
        "--threads", str(threads), "--seed", str(seed), "--out", out,
    ]  # fmt: skip
    for key, value in _power(power_root, power_sensor).items():
        argv += ["--" + key.replace("_", "-"), value]
    return argv


def serve_argv(
    python: str | RunnerStart,
    runner_path: str,
    *,
    backend: str,
    threads: int,
    max_sessions: int | None = None,
    cwd: str | None = None,
) -> list[str]:
    """Return the command line of ``runner.pyz serve`` (the resident runner).

    Parameters
    ----------
    python : str or RunnerStart
        As for `bench_argv`.
    runner_path : str
        As for `bench_argv`.
    backend : str
        Imported at start and the default of requests.
    threads : int
        numpy's threads for the process's life, and the default of requests.
    max_sessions : int, optional
        Open backends the runner keeps (its default when None).
    cwd : str, optional
        The runner's working directory on the device; relative request paths start there.

    Returns
    -------
    list of str
    """
    argv = [*_start_argv(python), runner_path, "serve", "--backend", backend, "--threads", str(threads)]
    if max_sessions is not None:
        argv += ["--max-sessions", str(max_sessions)]
    if cwd is not None:
        argv += ["--cwd", cwd]
    return argv


def train_request(
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
    request_id: Any = None,
    fjord: Mapping[str, Sequence[Any]] | None = None,
    syncdrop: Mapping[str, Any] | None = None,
    power_root: str | None = None,
    power_sensor: str | None = None,
) -> dict[str, Any]:
    """Return one ``train`` request of the serve protocol (the options of `train_argv`).

    Parameters
    ----------
    artifacts, backend, params, data, out : str
        As for `train_argv` (paths on the device).
    epochs : int
    lr : float
    threads, seed : int
    request_id : JSON value, optional
        Echoed as the reply's ``id``.
    fjord : mapping, optional
        ``{"sets", "index", "widths"}``: a width per step (runner docstring).
    syncdrop : mapping, optional
        ``{"sync_seed", "scale", "groups"}``: SyncDrop masks per step (runner docstring).
    power_root, power_sensor : str, optional
        Measure the round's energy (as for `bench_options`).

    Returns
    -------
    dict
        JSON-ready; one line of it is one request.
    """
    request: dict[str, Any] = {
        "id": request_id, "mode": "train", "artifacts": artifacts, "backend": backend, "params": params,
        "data": data, "out": out, "epochs": int(epochs), "lr": float(lr), "threads": int(threads), "seed": int(seed),
    }  # fmt: skip
    if fjord is not None:
        request["fjord"] = {k: list(v) for k, v in fjord.items()}
    if syncdrop is not None:
        request["syncdrop"] = dict(syncdrop)
    request.update(_power(power_root, power_sensor))
    return request


class ReplyRefused(ValueError):
    """A runner reply the host does not accept (the message is one line saying why)."""


def _refuse_constant(name: str) -> Any:
    raise ReplyRefused(f"holds the non-finite number {name}")


def _decode(text: str) -> Any:
    """Decode one runner document or reply line (`MAX_REPLY_BYTES`, JSON, no NaN or Infinity).

    Raises
    ------
    ReplyRefused
        Too large, not JSON, or holding ``NaN`` / ``Infinity`` (the runner never writes them).
    """
    size = len(text.encode("utf-8", "replace"))
    if size > MAX_REPLY_BYTES:
        raise ReplyRefused(f"is {size} bytes, over the cap of {MAX_REPLY_BYTES}")
    try:
        return json.loads(text, parse_constant=_refuse_constant)
    except ReplyRefused:
        raise
    except ValueError as exc:
        raise ReplyRefused(f"is not JSON ({exc}): {text[:120]!r}") from None


def _one_line(text: str) -> str:
    return " ".join(text.split())[:500]


def parse_reply(line: str, *, ready: bool = False) -> RunnerOutput:
    """Turn one reply line of a serving runner into a `RunnerOutput`.

    Parameters
    ----------
    line : str
        One stdout line (a JSON object of at most `MAX_REPLY_BYTES`).
    ready : bool
        Whether ``line`` is the ready line: then it must be event ``"ready"`` of
        protocol `harness.runner.protocol.PROTOCOL_VERSION`.

    Returns
    -------
    RunnerOutput
        As `parse_output` for a one-shot run that exited with the document's own status;
        a line that is refused (too large, not JSON, not an object, NaN or Infinity, a
        malformed document, another protocol) is a ``"runner error"`` whose one-line
        message says why.
    """
    try:
        doc = _decode(line)
    except ReplyRefused as exc:
        return RunnerOutput("runner error", _one_line(f"serving runner's reply refused: it {exc}"), EMPTY_DOCUMENT)
    if not isinstance(doc, dict):
        message = f"serving runner's reply refused: it is JSON {type(doc).__name__}, not an object: {line[:120]!r}"
        return RunnerOutput("runner error", _one_line(message), EMPTY_DOCUMENT)
    if ready and (doc.get("event") != "ready" or doc.get("protocol") != protocol.PROTOCOL_VERSION):
        message = (
            f"serving runner's ready line refused: event {doc.get('event')!r:.40} of protocol "
            f"{doc.get('protocol')!r:.40}, the host speaks protocol {protocol.PROTOCOL_VERSION}"
        )
        return RunnerOutput("runner error", _one_line(message), EMPTY_DOCUMENT)
    status = str(doc.get("status") or "runner error")
    return _output(protocol.EXIT_CODES.get(status, 5), doc, "")


def ended_output(returncode: int | None, stderr: str) -> RunnerOutput:
    """Return the `RunnerOutput` of a serving runner that ended without replying.

    Parameters
    ----------
    returncode : int or None
        Its exit status when known (negative or ``128 + n``: killed by signal ``n``).
    stderr : str
        The end of its stderr.

    Returns
    -------
    RunnerOutput
        ``"out of memory"`` when SIGKILL ended it (what the kernel's OOM killer sends),
        else as `parse_output` with no document.
    """
    return parse_output(-1 if returncode is None else returncode, "", stderr, during="during the request")


#: Exit statuses of a process SIGKILL ended: negative from a local wait, ``128 + 9`` from a shell.
KILLED = (-9, 128 + 9)


def parse_output(rc: int, stdout: str, stderr: str, *, during: str = "") -> RunnerOutput:
    """Turn the runner's exit status and output into a `RunnerOutput`.

    Parameters
    ----------
    rc : int
        Exit status of the runner.
    stdout, stderr : str
        Its output; stdout must be one JSON object of at most `MAX_REPLY_BYTES`.
    during : str
        What the runner was doing, for the message of one SIGKILL ended (``"during the request"``).

    Returns
    -------
    RunnerOutput
        The document's status; where the exit status disagrees with an ``"ok"``
        document, the exit status wins; no document from a runner SIGKILL ended (`KILLED`:
        what the kernel's OOM killer sends, as on a device whose memory limit a wide
        sub-model went over) is ``"out of memory"``; no document otherwise is a ``"runner error"``
        whose message quotes the end of stderr (``"out of space"`` when stderr says
        the device's file system is full, `devices.errors.says_out_of_space`), and so is
        a document that is refused: too large, not JSON, not an object, holding NaN or
        Infinity, or malformed (`harness.document.DocumentError`: a key of the wrong type,
        a number not finite, negative seconds or counts, an unknown key; the message names
        the key). Every message is one line.
    """
    tail = stderr.strip()[-300:]
    if not stdout.strip() and rc in KILLED:
        message = " ".join(filter(None, ("runner killed by SIGKILL", during, "(the kernel's OOM killer?)")))
        return RunnerOutput("out of memory", message + (f"; stderr: {tail}" if tail else ""), EMPTY_DOCUMENT)
    if not stdout.strip():
        message = f"runner exited {rc} with no output" + (f"; stderr: {tail}" if tail else "")
        return RunnerOutput(_undocumented_status(rc, tail), message, EMPTY_DOCUMENT)
    try:
        doc = _decode(stdout)
    except ReplyRefused as exc:
        message = f"runner exited {rc}; its output refused: it {exc}" + (f"; stderr: {tail}" if tail else "")
        return RunnerOutput("runner error", _one_line(message), EMPTY_DOCUMENT)
    if not isinstance(doc, dict):
        message = f"runner exited {rc} with output that is not a JSON object" + (f"; stderr: {tail}" if tail else "")
        return RunnerOutput(_undocumented_status(rc, tail), message, EMPTY_DOCUMENT)
    return _output(rc, doc, tail)


def _undocumented_status(rc: int, tail: str) -> str:
    """Return the status of a runner that gave no document: out of space when its stderr says the disk is full."""
    return "out of space" if rc != 0 and says_out_of_space(tail) else "runner error"


def _output(rc: int, doc: Mapping[str, Any], tail: str) -> RunnerOutput:
    """Return the `RunnerOutput` of a decoded document (`parse_output`, `parse_reply`)."""
    try:
        document = parse_document(doc, from_device=True)
    except DocumentError as exc:
        message = _one_line(f"runner exited {rc} with a malformed document: {exc}")
        return RunnerOutput("runner error", message, EMPTY_DOCUMENT)
    status = document.status or RUNNER_EXIT_CODES.get(rc, "runner error")
    if status == "ok" and rc != 0:
        status = RUNNER_EXIT_CODES.get(rc, "runner error")
    if status == "ok":
        return RunnerOutput(status, "", document)
    message = (document.error or "") or (f"runner exited {rc}" + (f"; stderr: {tail}" if tail else ""))
    return RunnerOutput(status, message, document)


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

    The file comes from a device, so it is checked before any of it is used: ``np.load``
    never unpickles (``allow_pickle=False``), the header is read first (a memory map) so
    a file of the wrong shape, dtype or size is refused before its data is read, and
    the values must all be finite.

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
        If the file is not an ``.npy`` array, does not hold one float32 vector of the
        manifest's length, or holds NaN or Inf (one line naming the file and the reason).
    """
    size = int(manifest["num_parameters"])
    try:
        mapped = np.load(path, mmap_mode="r", allow_pickle=False)
    except (ValueError, EOFError) as exc:
        raise ValueError(f"{path}: not an .npy float32 vector ({_one_line(str(exc))[:200]})") from None
    if not isinstance(mapped, np.ndarray) or mapped.ndim != 1 or mapped.size != size or mapped.dtype != np.float32:
        shape, dtype = getattr(mapped, "shape", None), getattr(mapped, "dtype", type(mapped).__name__)
        raise ValueError(f"{path}: parameters of shape {shape} and dtype {dtype}, expected float32 ({size},)")
    flat = np.array(mapped)
    del mapped
    bad = np.flatnonzero(~np.isfinite(flat))
    if bad.size:
        raise ValueError(f"{path}: parameters hold {bad.size} values that are NaN or Inf (the first at {bad[0]})")
    return unflatten(manifest, flat)
