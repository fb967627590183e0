"""A campaign's cells: the matrix device x width x batch x backend, and the artifact sets it needs.

`plan_cells` turns a profiling request into `BenchSpec` cells (pure); `export_sets`
exports, once each, the ONNX Runtime training artifact sets those cells train (plus the
TorchScript model for torch cells), keyed by `set_key`; `round_cost_specs` picks the cells
whose configuration also gets a round-cost measurement (`harness.roundcost`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, cast

from devices.fleet import Device, Fleet
from harness.records import Backend, BenchSpec
from harness.runner.protocol import DEFAULT_MAX_SECONDS, DEFAULT_PRECISION

#: Backends `plan_cells` accepts.
BACKENDS: tuple[str, ...] = ("ort", "onnx", "torch")

#: What an artifact set is exported for: ``(model, arch_sizes, batch, optimizer)``.
SetKey = tuple[str, tuple[int, ...], int, str]


def plan_cells(
    fleet: Fleet | Sequence[Device],
    model: str,
    widths: Iterable[float],
    batches: Iterable[int],
    backends: Iterable[str] | Mapping[str, str],
    steps: int,
    warmup: int,
    optimizer: str = "adamw",
    *,
    precision: float = DEFAULT_PRECISION,
    max_seconds: float = DEFAULT_MAX_SECONDS,
    data: str | None = None,
) -> list[BenchSpec]:
    """Return the cells of a campaign, device-major (pure).

    Parameters
    ----------
    fleet : Fleet or sequence of Device
        Devices to measure; each cell uses the device's ``threads``.
    model : str
        Zoo model name (`exporters.zoo.get_model`).
    widths : iterable of float
        Widths in (0, 1].
    batches : iterable of int
        Training batch sizes.
    backends : iterable of str, or mapping of str to str
        Backends measured on every device (``"ort"``, ``"onnx"``, ``"torch"``), or one
        backend per device name; devices the mapping does not name get no cells.
    steps, warmup : int
        Fewest timed samples and most warm-up steps per cell.
    optimizer : str
        ``"adamw"`` or ``"sgd"``.
    precision : float
        Target half-width of the median's 95 % interval (fraction; 0: exactly ``steps``).
    max_seconds : float
        Per-cell cap on warm-up plus sampling.
    data : str, optional
        The bench data's label (`harness.bench_data.bench_data_label`); None: random batches.

    Returns
    -------
    list of BenchSpec
        One per device x width x batch x backend, in that nesting order.

    Raises
    ------
    exporters.userinput.InputError
        For an unknown model or backend.
    """
    from exporters.userinput import InputError
    from exporters.zoo import get_model

    zoo_model = get_model(model)
    devices = fleet.devices if isinstance(fleet, Fleet) else tuple(fleet)
    if isinstance(backends, Mapping):
        per_device = {d.name: [backends[d.name]] for d in devices if d.name in backends}
    else:
        per_device = {d.name: list(backends) for d in devices}
    for backend in {b for listed in per_device.values() for b in listed}:
        if backend not in BACKENDS:
            raise InputError(f"unknown backend {backend!r} (expected one of {', '.join(BACKENDS)})")
    archs = [(width, tuple(zoo_model.arch(width).sizes)) for width in widths]
    return [
        BenchSpec(
            device=device.name,
            model=zoo_model.name,
            width=width,
            arch_sizes=arch_sizes,
            batch=batch,
            backend=cast(Backend, backend),
            threads=device.threads,
            warmup=warmup,
            steps=steps,
            optimizer=optimizer,
            precision=precision,
            max_seconds=max_seconds,
            data=data,
        )
        for device in devices
        if device.name in per_device
        for width, arch_sizes in archs
        for batch in batches
        for backend in per_device[device.name]
    ]


def set_key(spec: BenchSpec) -> SetKey:
    """Return the key of the artifact set ``spec`` trains (`export_sets`)."""
    return (spec.model, spec.arch_sizes, spec.batch, spec.optimizer)


def export_sets(specs: Sequence[BenchSpec], artifacts_dir: Path) -> dict[SetKey, Path]:
    """Export (or find in the cache) every artifact set the cells need, once each.

    Parameters
    ----------
    specs : sequence of BenchSpec
    artifacts_dir : pathlib.Path
        Artifact cache root (`exporters.artifacts.export_artifacts` ``out_dir``).

    Returns
    -------
    dict
        ``(model, arch_sizes, batch, optimizer)`` -> artifact set directory. Sets used
        by a torch cell also hold ``model.pt`` (`exporters.torchscript`).
    """
    from exporters.artifacts import export_artifacts
    from exporters.zoo import get_model

    sets: dict[SetKey, Path] = {}
    torch_sets: set[SetKey] = set()
    for spec in specs:
        key = set_key(spec)
        if spec.backend == "torch":
            torch_sets.add(key)
        if key in sets:
            continue
        model = get_model(spec.model)
        arch = model.arch(spec.width)
        if tuple(arch.sizes) != spec.arch_sizes:
            arch = replace(arch, sizes=spec.arch_sizes)
        exported = export_artifacts(model, arch, batch=spec.batch, optimizer=spec.optimizer, out_dir=artifacts_dir)
        sets[key] = exported.directory
    for key in torch_sets:
        from exporters.torchscript import export_torchscript

        spec = next(s for s in specs if set_key(s) == key)
        model = get_model(spec.model)
        arch = model.arch(spec.width)
        if not (sets[key] / "model.pt").exists():
            export_torchscript(model, arch, sets[key])
    return sets


def round_cost_specs(specs: Sequence[BenchSpec]) -> list[BenchSpec]:
    """Return the cells whose configuration gets a round-cost measurement (pure).

    One per device and configuration (model, batch, backend, optimizer, threads) that FL
    trains with: the widest width of it; torch cells get none (FL trains with the ONNX
    Runtime backends).

    Parameters
    ----------
    specs : sequence of BenchSpec

    Returns
    -------
    list of BenchSpec
        In the order of first appearance.
    """
    widest: dict[tuple[Any, ...], BenchSpec] = {}
    for spec in specs:
        if spec.backend == "torch":
            continue
        key = (spec.device, *round_cost_config(spec))
        if key not in widest or spec.width > widest[key].width:
            widest[key] = spec
    return list(widest.values())


def round_cost_config(spec: BenchSpec) -> tuple[str, int, str, str, int]:
    """Return the ``(model, batch, backend, optimizer, threads)`` a round cost is stored under."""
    return (spec.model, spec.batch, spec.backend, spec.optimizer, spec.threads)
