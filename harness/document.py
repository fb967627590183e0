"""The on-device runner's JSON document as the host reads it: parsed once into frozen records.

The runner (`harness.runner`) prints one JSON document per run and one reply line per
serve request; its keys are listed in the runner's module docstring. `parse_document`
checks the type of every key the host reads, once, where the document arrives
(`harness.contract.parse_output`, `harness.contract.parse_reply`, and a profile store's
stored document, `harness.store`), and returns a `RunnerDocument`; code past that point
reads attributes, never string keys.

Every key may be absent or null: documents of older runners, of failed runs and those
kept in older profile stores lack some. A key of the wrong type is a `DocumentError`
naming it, and so is a number that is not finite, or negative seconds, bytes or counts.
Keys the host does not read are kept in `RunnerDocument.raw`, the document as received,
which is what a profile store keeps; a document straight from a device
(``from_device``) with a key no runner sends is refused instead.

Besides the runner's own keys, a cell's stored document carries what the host added:
``passes`` and ``pass_medians`` (`harness.passes.merge_passes`) and the artifact set's
analytic counts (``counts``, whose ``train_flops`` is `RunnerDocument.train_flops`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, TypeVar

from harness.energy import EnergyError, EnergyReading, energy_reading

T = TypeVar("T")


class DocumentError(ValueError):
    """A runner document with a key of the wrong type (the message names the key)."""


@dataclass(frozen=True)
class BeforeAfter:
    """One reading per cpu (or per load-average period) before and after the timed work.

    Attributes
    ----------
    before, after : tuple of float or None
        ``loadavg``: the 1, 5 and 15 minute load averages; ``cpu_freq_khz``: each cpu's
        current frequency in kHz (None where unreadable). Empty where the device does not
        report them.
    """

    before: tuple[float | None, ...] = ()
    after: tuple[float | None, ...] = ()


@dataclass(frozen=True)
class Temperatures:
    """The device's thermal zones before and after the timed work.

    Attributes
    ----------
    before, after : Mapping of str to float or None
        Zone type -> degrees Celsius (None where unreadable); empty without thermal zones.
    """

    before: Mapping[str, float | None] = field(default_factory=dict)
    after: Mapping[str, float | None] = field(default_factory=dict)


@dataclass(frozen=True)
class Versions:
    """The runner's Python and the libraries it imported.

    Attributes
    ----------
    python, numpy, onnxruntime, torch : str or None
        Version strings; None when not installed or not imported.
    """

    python: str | None = None
    numpy: str | None = None
    onnxruntime: str | None = None
    torch: str | None = None


@dataclass(frozen=True)
class Sessions:
    """A serving runner's backend sessions, counted since it started.

    Attributes
    ----------
    opened : int
        Sessions opened (artifact sets loaded).
    reused : int
        Requests served by a session kept from an earlier request.
    open_seconds : float
        Wall seconds spent opening sessions.
    """

    opened: int = 0
    reused: int = 0
    open_seconds: float = 0.0


@dataclass(frozen=True)
class RunnerDocument:
    """One runner document (a one-shot run's, a serve reply or a serve ready line), typed.

    Every attribute is None, empty or False where the document lacks the key. Times are
    wall seconds unless named CPU.

    Attributes
    ----------
    mode : str or None
        ``"bench"``, ``"train"``, ``"serve"`` (the ready line) or ``"ping"``.
    status : str or None
        ``"ok"`` or the failure status.
    error : str or None
        The runner's failure message.
    missing : str or None
        The module that could not be imported (status ``"missing runtime"``).
    backend : str or None
    batch, warmup, steps, threads, seed : int or None
        The run's settings (``steps``: steps taken, in train).
    flush_denormals : bool or None
        Whether denormal floats were flushed to zero in the runner's thread.
    step_seconds : tuple of float
        Seconds per step of every timed entry (bench: one entry per sample, the sample's
        time over its steps; train: every step).
    loss : tuple of float or None
        The loss of every entry of ``step_seconds`` (None: not finite).
    peak_memory_bytes : int or None
        Peak resident set of the process, in bytes.
    peak_memory_source : str or None
        ``"VmHWM"`` or ``"ru_maxrss"``.
    peak_memory_scope : str or None
        ``"process"`` or ``"request"`` (serve).
    cpu_freq_khz : BeforeAfter
        Each cpu's frequency in kHz.
    thermal_c : Temperatures
        Thermal zones in degrees Celsius.
    throttled : bool
        Whether the device slowed its cpus while the runner worked.
    matmul_gflops : float or None
        Achievable float32 GFLOP/s of numpy at the run's threads (bench).
    versions : Versions
    energy : EnergyReading or None
        The energy of the timed work per image (`harness.energy.energy_reading`); None where
        the runner measured none.
    precision, max_seconds, sample_seconds : float or None
        Bench settings: the target half-width (a fraction of the median), the time cap and
        the least seconds per sample.
    steps_per_sample : tuple of int
        Bench: the steps each entry of ``step_seconds`` covers.
    cpu_step_seconds : tuple of float
        Bench: the process's CPU seconds per step of every entry of ``step_seconds``.
    disturbed : tuple of int
        Bench: 1 for an entry taken while the cpu was slowed from outside, else 0; empty
        when not judged.
    warmup_steps : int or None
        Bench: warm-up steps run.
    warmup_seconds : tuple of float
        Bench: seconds of each warm-up step.
    warmup_settled : bool or None
        Bench: whether the warm-up rule was met before its cap.
    samples : int or None
        Bench: entries of ``step_seconds``.
    median_ci_seconds : tuple of float or None
        Bench: ``(low, high)``, the 95 % interval of the median undisturbed sample, seconds
        per step (None below the runner's least samples).
    precision_achieved : float or None
        Bench: the interval's half-width as a fraction of the median.
    stop_reason : str or None
        Bench: ``"precision"``, ``"steps"``, ``"time cap"`` or ``"sample cap"`` (a merged
        cell also ``"passes differ"``).
    imprecise : bool
        Bench: the precision target was set and missed.
    timed_seconds : float or None
        Bench: seconds of warm-up plus timed samples.
    loadavg : BeforeAfter
        Bench: the 1, 5 and 15 minute load averages.
    cpus_available : int or None
        Bench: cpus the process may run on.
    bench_data : str or None
        Bench: ``"shard"`` or ``"random"``.
    runtime_memory_bytes : int or None
        Bench: the peak resident set before the model was opened (numpy, the runtime and
        the data loaded); None from runners that did not read it.
    epochs : int or None
        Train: epochs trained.
    lr : float or None
        Train: the learning rate.
    examples : int or None
        Train: examples trained on, all epochs.
    step_examples : tuple of int
        Train: examples of every step in ``step_seconds``.
    num_parameters : int or None
        Train: length of the flat parameter vector.
    out : str or None
        Train: where the trained parameters were saved.
    loop_seconds, loop_cpu_seconds : float or None
        Train: wall and CPU seconds of the whole step loop.
    params_inline : str or None
        Train (serve, ``return_params`` ``"inline"``): base64 of the trained float32 vector.
    id : Any
        Serve: the request's id, echoed.
    request_seconds : float or None
        Serve: the runner's own seconds for the request.
    sessions : Sessions or None
        Serve: the runner's backend sessions so far.
    load_seconds, save_seconds : float or None
        Serve train: seconds loading parameters and data, and saving the result.
    step_sets : tuple of int
        Serve train with FjORD: the artifact set each step drew.
    step_widths : tuple of float
        Serve train with FjORD: the width each step drew.
    switch_seconds : tuple of float
        Serve train with FjORD: seconds of each width switch.
    mask_means : tuple of tuple of float
        Serve train with FedDrop: per step, the kept fraction of each group.
    mask_seconds : float or None
        Serve train with FedDrop: seconds drawing masks.
    event : str or None
        Serve ready line: ``"ready"``.
    protocol : int or None
        Serve ready line: the protocol version.
    pid : int or None
        Serve ready line: the serving process's id on the device.
    max_sessions : int or None
        Serve ready line: the backend sessions the runner keeps open.
    cwd : str or None
        Serve ready line: the directory request paths start from.
    startup_seconds : float or None
        Serve ready line: seconds from start to ready.
    passes : int or None
        Host, a merged cell: the passes pooled.
    pass_medians : tuple of float or None
        Host, a merged cell: the median seconds per step of each pass's samples that count.
    train_flops : float or None
        Host: analytic training FLOPs per example of the artifact set (``counts``'s, or
        in older stores ``train_flops`` or ``manifest``'s ``counts``).
    raw : Mapping
        The document as received, every key included: what a profile store keeps.
    """

    mode: str | None = None
    status: str | None = None
    error: str | None = None
    missing: str | None = None
    backend: str | None = None
    batch: int | None = None
    warmup: int | None = None
    steps: int | None = None
    threads: int | None = None
    seed: int | None = None
    flush_denormals: bool | None = None
    step_seconds: tuple[float, ...] = ()
    loss: tuple[float | None, ...] = ()
    peak_memory_bytes: int | None = None
    peak_memory_source: str | None = None
    peak_memory_scope: str | None = None
    cpu_freq_khz: BeforeAfter = BeforeAfter()
    thermal_c: Temperatures = Temperatures()
    throttled: bool = False
    matmul_gflops: float | None = None
    versions: Versions = Versions()
    energy: EnergyReading | None = None
    precision: float | None = None
    max_seconds: float | None = None
    sample_seconds: float | None = None
    steps_per_sample: tuple[int, ...] = ()
    cpu_step_seconds: tuple[float, ...] = ()
    disturbed: tuple[int, ...] = ()
    warmup_steps: int | None = None
    warmup_seconds: tuple[float, ...] = ()
    warmup_settled: bool | None = None
    samples: int | None = None
    median_ci_seconds: tuple[float, ...] | None = None
    precision_achieved: float | None = None
    stop_reason: str | None = None
    imprecise: bool = False
    timed_seconds: float | None = None
    loadavg: BeforeAfter = BeforeAfter()
    cpus_available: int | None = None
    bench_data: str | None = None
    runtime_memory_bytes: int | None = None
    epochs: int | None = None
    lr: float | None = None
    examples: int | None = None
    step_examples: tuple[int, ...] = ()
    num_parameters: int | None = None
    out: str | None = None
    loop_seconds: float | None = None
    loop_cpu_seconds: float | None = None
    params_inline: str | None = None
    id: Any = None
    request_seconds: float | None = None
    sessions: Sessions | None = None
    load_seconds: float | None = None
    save_seconds: float | None = None
    step_sets: tuple[int, ...] = ()
    step_widths: tuple[float, ...] = ()
    switch_seconds: tuple[float, ...] = ()
    mask_means: tuple[tuple[float, ...], ...] = ()
    mask_seconds: float | None = None
    event: str | None = None
    protocol: int | None = None
    pid: int | None = None
    max_sessions: int | None = None
    cwd: str | None = None
    startup_seconds: float | None = None
    passes: int | None = None
    pass_medians: tuple[float | None, ...] = ()
    train_flops: float | None = None
    raw: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)


# --------------------------------------------------------------------------- value checks


def _fail(key: str, want: str, value: Any) -> DocumentError:
    return DocumentError(f"runner document key {key!r}: expected {want}, got {type(value).__name__} {value!r:.80}")


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _number(key: str, value: Any) -> float:
    if not _is_number(value) or not math.isfinite(value):
        raise _fail(key, "a finite number", value)
    return float(value)


def _duration(key: str, value: Any) -> float:
    number = _number(key, value)
    if number < 0:
        raise _fail(key, "seconds (a number >= 0)", value)
    return number


def _integer(key: str, value: Any) -> int:
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    raise _fail(key, "an integer", value)


def _count(key: str, value: Any) -> int:
    number = _integer(key, value)
    if number < 0:
        raise _fail(key, "a count (an integer >= 0)", value)
    return number


def _text(key: str, value: Any) -> str:
    if not isinstance(value, str):
        raise _fail(key, "a string", value)
    return value


def _flag(key: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    raise _fail(key, "a bool", value)


def _optional(check: Callable[[str, Any], T]) -> Callable[[str, Any], T | None]:
    def read(key: str, value: Any) -> T | None:
        return None if value is None else check(key, value)

    return read


def _sequence(check: Callable[[str, Any], T]) -> Callable[[str, Any], tuple[T, ...]]:
    def read(key: str, value: Any) -> tuple[T, ...]:
        if value is None:
            return ()
        if not isinstance(value, (list, tuple)):
            raise _fail(key, "a list", value)
        return tuple(check(f"{key}[{i}]", v) for i, v in enumerate(value))

    return read


def _mapping(key: str, value: Any) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise _fail(key, "an object", value)
    return value


_numbers = _sequence(_number)
_optional_numbers = _sequence(_optional(_number))
_durations = _sequence(_duration)
_optional_durations = _sequence(_optional(_duration))
_counts = _sequence(_count)


def _before_after(key: str, value: Any) -> BeforeAfter:
    parts = _mapping(key, value)
    return BeforeAfter(*(_optional_numbers(f"{key}.{when}", parts.get(when)) for when in ("before", "after")))


def _temperatures(key: str, value: Any) -> Temperatures:
    parts = _mapping(key, value)
    zones = []
    for when in ("before", "after"):
        readings = _mapping(f"{key}.{when}", parts.get(when))
        zones.append(
            MappingProxyType({str(z): _optional(_number)(f"{key}.{when}.{z}", c) for z, c in readings.items()})
        )
    return Temperatures(*zones)


def _versions(key: str, value: Any) -> Versions:
    parts = _mapping(key, value)
    text = _optional(_text)
    return Versions(*(text(f"{key}.{name}", parts.get(name)) for name in ("python", "numpy", "onnxruntime", "torch")))


def _sessions(key: str, value: Any) -> Sessions:
    parts = _mapping(key, value)
    return Sessions(
        opened=_count(f"{key}.opened", parts.get("opened", 0)),
        reused=_count(f"{key}.reused", parts.get("reused", 0)),
        open_seconds=_duration(f"{key}.open_seconds", parts.get("open_seconds", 0.0)),
    )


def _energy(key: str, value: Any) -> EnergyReading | None:
    try:
        return energy_reading(value)
    except EnergyError as exc:
        raise DocumentError(str(exc)) from None


def _train_flops(raw: Mapping[str, Any]) -> float | None:
    """Return the first number of ``train_flops``, ``counts.train_flops`` and ``manifest.counts.train_flops``."""
    candidates: list[Any] = [raw.get("train_flops")]
    counts = raw.get("counts")
    if isinstance(counts, Mapping):
        candidates.append(counts.get("train_flops"))
    manifest = raw.get("manifest")
    if isinstance(manifest, Mapping) and isinstance(manifest.get("counts"), Mapping):
        candidates.append(manifest["counts"].get("train_flops"))
    return next((float(v) for v in candidates if _is_number(v)), None)


_text_or_none = _optional(_text)
_integer_or_none = _optional(_integer)
_number_or_none = _optional(_number)
_duration_or_none = _optional(_duration)
_count_or_none = _optional(_count)
_flag_or_none = _optional(_flag)

#: Document key -> how its value is read (absent keys read as None).
_READERS: Mapping[str, Callable[[str, Any], Any]] = {
    "mode": _text_or_none,
    "status": _text_or_none,
    "error": _text_or_none,
    "missing": _text_or_none,
    "backend": _text_or_none,
    "batch": _integer_or_none,
    "warmup": _integer_or_none,
    "steps": _integer_or_none,
    "threads": _integer_or_none,
    "seed": _integer_or_none,
    "flush_denormals": _flag_or_none,
    "step_seconds": _durations,
    "loss": _optional_numbers,
    "peak_memory_bytes": _count_or_none,
    "peak_memory_source": _text_or_none,
    "peak_memory_scope": _text_or_none,
    "cpu_freq_khz": _before_after,
    "thermal_c": _temperatures,
    "throttled": lambda key, value: bool(_flag_or_none(key, value)),
    "matmul_gflops": _duration_or_none,
    "versions": _versions,
    "energy": _energy,
    "precision": _number_or_none,
    "max_seconds": _number_or_none,
    "sample_seconds": _number_or_none,
    "steps_per_sample": _counts,
    "cpu_step_seconds": _durations,
    "disturbed": _sequence(lambda key, value: int(_flag(key, value))),
    "warmup_steps": _count_or_none,
    "warmup_seconds": _durations,
    "warmup_settled": _flag_or_none,
    "samples": _count_or_none,
    "median_ci_seconds": lambda key, value: None if value is None else _durations(key, value),
    "precision_achieved": _duration_or_none,
    "stop_reason": _text_or_none,
    "imprecise": lambda key, value: bool(_flag_or_none(key, value)),
    "timed_seconds": _duration_or_none,
    "loadavg": _before_after,
    "cpus_available": _count_or_none,
    "bench_data": _text_or_none,
    "runtime_memory_bytes": _count_or_none,
    "epochs": _integer_or_none,
    "lr": _number_or_none,
    "examples": _count_or_none,
    "step_examples": _counts,
    "num_parameters": _count_or_none,
    "out": _text_or_none,
    "loop_seconds": _duration_or_none,
    "loop_cpu_seconds": _duration_or_none,
    "params_inline": _text_or_none,
    "id": lambda key, value: value,
    "request_seconds": _duration_or_none,
    "sessions": lambda key, value: None if value is None else _sessions(key, value),
    "load_seconds": _duration_or_none,
    "save_seconds": _duration_or_none,
    "step_sets": _counts,
    "step_widths": _numbers,
    "switch_seconds": _durations,
    "mask_means": _sequence(_numbers),
    "mask_seconds": _duration_or_none,
    "event": _text_or_none,
    "protocol": _integer_or_none,
    "pid": _count_or_none,
    "max_sessions": _count_or_none,
    "cwd": _text_or_none,
    "startup_seconds": _duration_or_none,
    "passes": _count_or_none,
    "pass_medians": _optional_durations,
}


#: Keys the host adds to a stored document; a runner never sends them.
HOST_KEYS = frozenset({"passes", "pass_medians", "counts", "train_flops", "manifest"})

#: Every key a runner's document or serve reply may hold (`parse_document` with ``from_device``).
RUNNER_KEYS = frozenset(_READERS) - HOST_KEYS


def parse_document(raw: Mapping[str, Any], *, from_device: bool = False) -> RunnerDocument:
    """Check a runner document's types and ranges once and return it as a `RunnerDocument`.

    Numbers must be finite; seconds, byte sizes and counts must also be at least 0 (a
    device that is broken or lies is refused here, before any of it is used).

    Parameters
    ----------
    raw : Mapping
        The decoded JSON object (a runner's stdout, a serve reply line, or a stored
        document). Absent or null keys read as the attribute's default.
    from_device : bool
        Whether ``raw`` came straight from a device (`harness.contract`): then a key
        outside `RUNNER_KEYS` is refused. The document is versioned (the runner archive
        the host deploys is built from this same tree, and the serve protocol carries
        `harness.runner.protocol.PROTOCOL_VERSION`), so an unknown key is a broken or
        foreign runner, never a newer one. Stored documents (``from_device`` False) keep
        unknown keys, and the host's own, in ``raw`` only.

    Returns
    -------
    RunnerDocument
        Its ``raw`` is a read-only copy of ``raw``.

    Raises
    ------
    DocumentError
        A key of the wrong type (a string where a number belongs, a list of strings where
        seconds belong, ...), a number that is not finite, negative seconds or counts, or
        (``from_device``) an unknown key; the message names the key.
    """
    if not isinstance(raw, Mapping):
        raise DocumentError(f"runner document: expected a JSON object, got {type(raw).__name__}")
    if from_device:
        unknown = sorted(str(k) for k in raw if k not in RUNNER_KEYS)
        if unknown:
            raise DocumentError(f"runner document: unknown keys {', '.join(repr(k) for k in unknown[:5])}"[:300])
    values = {name: read(name, raw.get(name)) for name, read in _READERS.items()}
    return RunnerDocument(**values, train_flops=_train_flops(raw), raw=MappingProxyType(dict(raw)))


#: The document of a run that printed none.
EMPTY_DOCUMENT = RunnerDocument()
