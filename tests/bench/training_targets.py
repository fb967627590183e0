"""The training benchmark's figures and targets: ratios per round, the best ONNX form, rates, memory, verdicts.

Pure functions over the timing workers' documents (`tests.bench.worker`), parsed once into
`WorkerRun`; standard library only, so the suite tests them without a runtime.

Decisions:

* every ratio is taken round by round (the processes of one round run back to back), then its
  median reported; the best ONNX form of a round is the fastest of the ONNX backends in it
  (`ONNX_FORMS`), whichever that is.
* a model's ratio targets hold for the median over its widths; the matmul-rate target holds at
  width 1 for the models of `MATMUL_SHARE_MODELS`, on the best ONNX form's rate.
* a model is convolutional when its FLOP count has a ``conv`` layer (`exporters.flops`).
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

#: The backends that run an ONNX form of the model (the training build, the portable step model
#: on it and on the newest onnxruntime).
ONNX_FORMS = ("ort", "onnx", "onnx-latest")

#: The pseudo-backend of the fastest ONNX form in each round.
BEST = "best"

#: The ratios the benchmark prints (numerator, denominator), where both were measured.
RATIOS = (
    ("onnx", "ort"),
    ("ort", "torch"),
    ("onnx", "torch"),
    ("onnx-latest", "onnx"),
    ("onnx-latest", "torch"),
    (BEST, "torch"),
)

#: The best ONNX form may take at most this many times PyTorch's time on every model ...
BEST_OVER_TORCH = 1.0

#: ... and at most this many times on the convolutional models.
BEST_OVER_TORCH_CONV = 0.8

#: The portable step model may take at most this many times the training build's time.
PORTABLE_TARGET = 1.0

#: The best ONNX form reaches at least this share of the host's matmul rate ...
MATMUL_SHARE_TARGET = 0.30

#: ... on these models ...
MATMUL_SHARE_MODELS = ("fjord-cnn", "fluid-cnn")

#: ... at this width.
MATMUL_SHARE_WIDTH = 1.0

MIB = 1024 * 1024


@dataclass(frozen=True)
class WorkerRun:
    """One timing process's result.

    Attributes
    ----------
    seconds : tuple of float
        Per timed step.
    runtime : str
        The runtime's version.
    baseline_bytes, peak_bytes : int or None
        Peak resident set once the runtime was imported and the batch loaded, and at the end.
    """

    seconds: tuple[float, ...]
    runtime: str
    baseline_bytes: int | None
    peak_bytes: int | None

    @property
    def step_seconds(self) -> float:
        """The median step time."""
        return statistics.median(self.seconds)


def parse_worker_output(stdout: str) -> WorkerRun:
    """Parse a worker's standard output (its last line is the JSON document).

    Parameters
    ----------
    stdout : str

    Returns
    -------
    WorkerRun
    """
    document = json.loads(stdout.strip().splitlines()[-1])
    return WorkerRun(
        seconds=tuple(float(s) for s in document["seconds"]),
        runtime=str(document.get("runtime", "?")),
        baseline_bytes=document.get("baseline_bytes"),
        peak_bytes=document.get("peak_bytes"),
    )


def with_best(rounds: Mapping[str, Sequence[float]]) -> dict[str, list[float]]:
    """Add the best ONNX form's step time of every round to per-backend, per-round step times.

    Parameters
    ----------
    rounds : mapping of str to sequence of float
        Step seconds per backend, one per round, rounds in the same order.

    Returns
    -------
    dict of str to list of float
        ``rounds`` and, where an ONNX form was measured, `BEST`: per round the least of their times.
    """
    out = {backend: list(values) for backend, values in rounds.items()}
    forms = [out[b] for b in ONNX_FORMS if b in out]
    if forms:
        out[BEST] = [min(times) for times in zip(*forms, strict=True)]
    return out


def ratio_pairs(backends: Sequence[str]) -> list[tuple[str, str]]:
    """Return the `RATIOS` whose both sides are measured among ``backends`` (`BEST` from any ONNX form).

    Parameters
    ----------
    backends : sequence of str

    Returns
    -------
    list of (str, str)
    """
    have = set(backends) | ({BEST} if set(ONNX_FORMS) & set(backends) else set())
    return [(a, b) for a, b in RATIOS if {a, b} <= have]


def round_ratio(rounds: Mapping[str, Sequence[float]], pair: tuple[str, str]) -> list[float]:
    """Return ``pair``'s time ratio in every round.

    Parameters
    ----------
    rounds : mapping of str to sequence of float
        Step seconds per backend (`with_best`), one per round.
    pair : (str, str)
        Numerator and denominator backends.

    Returns
    -------
    list of float
    """
    a, b = pair
    return [x / y for x, y in zip(rounds[a], rounds[b], strict=True)]


def gflops(step_flops: float, seconds: float) -> float:
    """Return the achieved GFLOP/s of a step of ``step_flops`` FLOPs taking ``seconds``.

    Parameters
    ----------
    step_flops : float
    seconds : float

    Returns
    -------
    float
    """
    return step_flops / seconds / 1e9


def memory_mib(runs: Sequence[WorkerRun]) -> tuple[float | None, float | None]:
    """Return the runtime's baseline and the model's share of the peak (peak - baseline), in MiB.

    Parameters
    ----------
    runs : sequence of WorkerRun
        One backend's processes (medians are taken over them).

    Returns
    -------
    baseline, share : float or None
        None where a process could not read its resident set.
    """
    read = [(r.baseline_bytes, r.peak_bytes) for r in runs if r.baseline_bytes is not None and r.peak_bytes is not None]
    if not read:
        return None, None
    baseline = statistics.median(base for base, _ in read)
    share = statistics.median(peak - base for base, peak in read)
    return baseline / MIB, share / MIB


@dataclass(frozen=True)
class ModelResult:
    """What the targets are checked on, for one model.

    Attributes
    ----------
    name : str
    convolutional : bool
    ratios : mapping of (str, str) to float
        The median over widths of each measured ratio.
    full_width_share : float or None
        The best ONNX form's share of the matmul rate at `MATMUL_SHARE_WIDTH` (None: not measured).
    """

    name: str
    convolutional: bool
    ratios: Mapping[tuple[str, str], float]
    full_width_share: float | None


@dataclass(frozen=True)
class Verdict:
    """One target on one model.

    Attributes
    ----------
    target : str
        The target as printed (``"best/torch <= 0.80"``).
    measured : str
        The value checked, as printed (``"0.93x"``), or ``"-"``.
    met : bool or None
        None when what it needs was not measured.
    """

    target: str
    measured: str
    met: bool | None


def verdicts(result: ModelResult) -> list[Verdict]:
    """Check ``result`` against the targets that apply to its model.

    Parameters
    ----------
    result : ModelResult

    Returns
    -------
    list of Verdict
        best/torch (`BEST_OVER_TORCH`, `BEST_OVER_TORCH_CONV` for a convolutional model),
        onnx/ort (`PORTABLE_TARGET`) and, for `MATMUL_SHARE_MODELS`, the matmul-rate share.
    """
    limit = BEST_OVER_TORCH_CONV if result.convolutional else BEST_OVER_TORCH
    out = []
    for pair, bound in (((BEST, "torch"), limit), (("onnx", "ort"), PORTABLE_TARGET)):
        value = result.ratios.get(pair)
        target = f"{pair[0]}/{pair[1]} <= {bound:.2f}"
        out.append(
            Verdict(target, "-" if value is None else f"{value:.2f}x", None if value is None else value <= bound)
        )
    if result.name in MATMUL_SHARE_MODELS:
        share = result.full_width_share
        target = f"matmul share at width {MATMUL_SHARE_WIDTH:g} >= {MATMUL_SHARE_TARGET:.0%}"
        measured = "-" if share is None else f"{share:.0%}"
        out.append(Verdict(target, measured, None if share is None else share >= MATMUL_SHARE_TARGET))
    return out


def verdict_line(checks: Sequence[Verdict]) -> str:
    """Summarise a model's verdicts: ``ok``, or ``not met:`` and each target missed with its value.

    Targets that could not be checked (a backend not run, width 1 not measured) are named after;
    with none checked, the line says only ``not measured:`` and names them.

    Parameters
    ----------
    checks : sequence of Verdict

    Returns
    -------
    str
    """
    missed = [f"{c.target} (is {c.measured})" for c in checks if c.met is False]
    unmeasured = [c.target for c in checks if c.met is None]
    if len(unmeasured) == len(checks):
        return "not measured: " + ", ".join(unmeasured)
    line = "ok" if not missed else "not met: " + ", ".join(missed)
    if unmeasured:
        line += "; not measured: " + ", ".join(unmeasured)
    return line
