"""Records of the profiling harness: what was measured, and what came back.

`BenchSpec` says what one cell of a campaign measures (device x arch x batch x
backend x settings); `Measurement` holds the raw samples and provenance of one
attempt at it. Statistics are derived from the samples (`harness.stats`), never
stored by hand. The on-device runner's JSON document is the wire format between
the two (see `harness.contract` and `harness.runner.protocol`), read as a
`harness.document.RunnerDocument`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from harness.document import EMPTY_DOCUMENT, RunnerDocument
from harness.runner.protocol import DEFAULT_MAX_SECONDS, DEFAULT_PRECISION

#: Backends the runner can train with.
Backend = Literal["ort", "onnx", "torch"]

#: Status of a cell: measured, or why not.
Status = Literal[
    "ok",
    "unreachable",
    "authentication failed",
    "host key rejected",
    "timeout",
    "out of memory",
    "missing runtime",
    "out of space",
    "unsupported ABI",
    "bad arguments",
    "runner error",
    "connection lost",
]


@dataclass(frozen=True)
class BenchSpec:
    """What one campaign cell measures.

    Attributes
    ----------
    device : str
        Device name from the fleet file.
    model : str
        Zoo model name.
    width : float
        Nominal width the arch was made from.
    arch_sizes : tuple of int
        Kept neurons per group (the `exporters.arch.Arch` sizes).
    batch : int
        Training batch size.
    backend : {"ort", "onnx", "torch"}
    threads : int
        Intra-op threads on the device.
    warmup : int
        Most warm-up steps (the runner stops earlier once step times settle); they never
        enter the statistics.
    steps : int
        Fewest timed samples.
    optimizer : str
        ``adamw`` or ``sgd``.
    precision : float
        Target half-width of the 95 % interval of the median, as a fraction of the median
        (0: exactly ``steps`` samples).
    max_seconds : float
        Cap on warm-up plus timed sampling; a cell that misses ``precision`` by then is
        flagged imprecise.
    data : str or None
        The bench data the steps train on, ``<file name>@<sha256 prefix>``
        (`harness.bench_data.bench_data_label`); None: a random batch.
    """

    device: str
    model: str
    width: float
    arch_sizes: tuple[int, ...]
    batch: int
    backend: Backend
    threads: int
    warmup: int
    steps: int
    optimizer: str = "adamw"
    precision: float = DEFAULT_PRECISION
    max_seconds: float = DEFAULT_MAX_SECONDS
    data: str | None = None

    def cell_key(self) -> str:
        """Return the key that identifies this cell in the store (resume skips measured keys)."""
        widths = ",".join(str(w) for w in self.arch_sizes)
        return (
            f"{self.device}|{self.model}|{widths}|b{self.batch}|{self.backend}|t{self.threads}"
            f"|w{self.warmup}|s{self.steps}|{self.optimizer}|p{self.precision:g}|c{self.max_seconds:g}"
            + (f"|d{self.data}" if self.data else "")
        )


@dataclass(frozen=True)
class Measurement:
    """One attempt at a cell: raw samples or the failure, with provenance.

    Attributes
    ----------
    spec : BenchSpec
    status : str
        ``"ok"`` or a failure kind (see `Status`).
    message : str
        Human-readable detail of a failure ("" when ok).
    step_seconds : tuple of float
        Wall time of every timed step (warm-up excluded).
    peak_memory_bytes : int or None
        Peak resident memory of the runner process.
    peak_memory_source : str or None
        ``"VmHWM"`` or ``"ru_maxrss"``.
    throttled : bool
        CPU frequency dropped or a throttle bit was set during the cell.
    matmul_gflops : float or None
        The device's achievable matmul GFLOP/s (runner's probe), for rooflines.
    runner : RunnerDocument
        The cell's runner document (its passes merged; frequencies, thermal zones,
        versions); its ``raw`` is what a profile store keeps.
    facts : Mapping
        Device facts snapshot taken for the campaign.
    started_at, finished_at : float
        Unix times on this machine.
    versions : Mapping
        Tool versions on the host (fleetbench, torch, onnx, onnxruntime).
    git_commit : str or None
        fleetbench's git commit when run from a checkout.
    precision_achieved : float or None
        Half-width of the 95 % interval of the median sample, as a fraction of the median
        (the runner's ``precision_achieved``; None when too few samples or not measured).
    imprecise : bool
        The cell is measured (status ``ok``) but missed ``spec.precision``; ``message``
        says why.
    stop_reason : str or None
        Why the runner stopped sampling: ``precision``, ``steps``, ``time cap``, ``sample cap``.
    isolation : Mapping
        How the cell was measured with respect to the other devices of the campaign:
        ``alone`` (bool), ``concurrent_with`` (device names), ``cpus`` and ``reason``
        (`harness.isolation.IsolationPlan`).
    """

    spec: BenchSpec
    status: str
    message: str = ""
    step_seconds: tuple[float, ...] = ()
    peak_memory_bytes: int | None = None
    peak_memory_source: str | None = None
    throttled: bool = False
    matmul_gflops: float | None = None
    runner: RunnerDocument = EMPTY_DOCUMENT
    facts: Mapping[str, Any] = field(default_factory=dict)
    started_at: float = 0.0
    finished_at: float = 0.0
    versions: Mapping[str, str] = field(default_factory=dict)
    git_commit: str | None = None
    precision_achieved: float | None = None
    imprecise: bool = False
    stop_reason: str | None = None
    isolation: Mapping[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        """Whether the cell was measured."""
        return self.status == "ok"

    @property
    def emulated_isa(self) -> bool:
        """Whether the device ran under an instruction-set emulator (qemu-user): its times are not a device's.

        Read from the facts snapshot (``emulated_isa``, `devices.facts.DeviceFacts`).
        """
        return bool(self.facts.get("emulated_isa", False))


@dataclass(frozen=True)
class ModelRecord:
    """A user's model as the store keeps it: where it is defined and the hash of its definition.

    Attributes
    ----------
    name : str
        ``factory@digest``, the name its cells and runs carry.
    source : str
        ``file.py:factory`` or ``module:factory``.
    digest : str
        sha256 of the definition.
    groups : tuple of (str, int)
        The channel groups the dependency graph found: root layer and size.
    notes : tuple of str
        Layers kept at full width, BatchNorm made static.
    """

    name: str
    source: str
    digest: str
    groups: tuple[tuple[str, int], ...] = ()
    notes: tuple[str, ...] = ()


def model_record(model: Any) -> ModelRecord | None:
    """Return the store's record of a user's model, ``None`` for a zoo model.

    Parameters
    ----------
    model : exporters.zoo.ZooModel

    Returns
    -------
    ModelRecord or None
    """
    if not model.source:
        return None
    return ModelRecord(model.name, model.source, model.digest, tuple(model.groups), tuple(model.notes))
