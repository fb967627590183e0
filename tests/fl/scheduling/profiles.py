"""Profile rows the scheduling tests share: latency a line in FLOPs of a synthetic model "m".

Rows carry their own ``train_flops``, ``params`` and ``activation_elements``, so the code
under test takes the counts from them (never from the zoo) and every expectation can be
worked by hand: ``median_us = a + b * train_flops``.
"""

from __future__ import annotations

WIDTHS = (0.25, 0.5, 0.75, 1.0)
# A synthetic model "m": training FLOPs and parameters per example at each width.
FLOPS = {0.25: 1e6, 0.5: 2e6, 0.75: 3e6, 1.0: 4e6}
PARAMS = {0.25: 1e4, 0.5: 2e4, 0.75: 3e4, 1.0: 4e4}


def line_rows(
    device: str,
    a: float,
    b: float,
    *,
    widths: tuple[float, ...] = WIDTHS,
    memory: tuple[float, float] | None = None,
    batch: int = 20,
    backend: str = "ort",
    model: str = "m",
) -> list[dict[str, object]]:
    """Rows with median_us = a + b * FLOPS[w]; peak = c + d * (16 * params) when memory = (c, d)."""
    out: list[dict[str, object]] = []
    for w in widths:
        row: dict[str, object] = {
            "device": device,
            "model": model,
            "width": w,
            "batch": batch,
            "backend": backend,
            "status": "ok",
            "median_us": a + b * FLOPS[w],
            "train_flops": FLOPS[w],
            "params": PARAMS[w],
            "activation_elements": 0,  # footprint = 16 bytes * params
        }
        if memory is not None:
            row["peak_memory_bytes"] = memory[0] + memory[1] * 16 * PARAMS[w]
        out.append(row)
    return out


def failed_rows(device: str, status: str = "timeout") -> list[dict[str, object]]:
    return [
        {"device": device, "model": "m", "width": w, "batch": 20, "backend": "ort", "status": status} for w in WIDTHS
    ]


def store_lines(
    path: object,
    lines: dict[str, tuple[float, float]],
    *,
    model: str = "fjord-cnn",
    batch: int = 20,
    optimizer: str = "adamw",
    threads: int = 1,
) -> int:
    """Write a profile store in which each device measured ``model`` at `WIDTHS`: ``a + b * flops`` us per image.

    ``lines`` maps a device to ``(a, b)``; the zoo's training FLOPs of each width are stored with the
    cell (as the runner reports them), so the fitted line is exactly ``(a, b)``. Returns the campaign id.
    """
    from exporters.flops import count
    from exporters.manifest import EXPORT_FORMAT_VERSION
    from exporters.zoo import get_model
    from harness.document import parse_document
    from harness.records import BenchSpec, Measurement
    from harness.store import ProfileStore

    zoo = get_model(model)
    with ProfileStore(path) as store:  # type: ignore[arg-type]
        versions = {"export_format": str(EXPORT_FORMAT_VERSION)}  # measured on this version's artifacts
        campaign = store.start_campaign(None, model, versions=versions, commit=None)
        for device, (a, b) in lines.items():
            for width in WIDTHS:
                arch = zoo.arch(width)
                flops = count(zoo, arch).train_flops
                spec = BenchSpec(
                    device=device, model=model, width=width, arch_sizes=arch.sizes, batch=batch,
                    backend="ort", threads=threads, warmup=1, steps=3, optimizer=optimizer,  # type: ignore[arg-type]
                )  # fmt: skip
                step = (a + b * flops) * 1e-6 * batch
                store.record(
                    campaign,
                    Measurement(
                        spec=spec,
                        status="ok",
                        step_seconds=(step,) * 3,
                        runner=parse_document({"counts": {"train_flops": flops}}),
                    ),
                )
    return campaign
