"""Time training steps of one backend in a process of its own.

Usage: ``python -m tests.bench.worker BACKEND MODEL WIDTH ARTIFACT_DIR DATA_DIR STEPS WARMUP THREADS``
with BACKEND one of ``ort``, ``ort:VARIANT`` (see `ORT_VARIANTS`), ``ort-profile``, ``onnx`` (the
portable step model through the runner's own `harness.runner.backends.OnnxBackend`), ``onnx:VARIANT``
(see `ONNX_VARIANTS`), ``onnx-profile``, ``torch`` and ``torch-profile``, where DATA_DIR holds the
batch as ``x.npy`` and ``y.npy``. The ``onnx`` backends need only numpy and plain ``onnxruntime`` (this module and
`harness.runner` import neither PyTorch nor ``exporters`` on their path), so the training benchmark
also runs them from an environment holding the newest onnxruntime (`tests.bench.ort_latest`).
Prints one JSON document: ``{"backend", "seconds": [per timed step], "loss": last loss, "runtime":
the runtime's version, "baseline_bytes", "peak_bytes", "memory_source"}``: the process's peak
resident set (`harness.runner.probes.peak_memory`) at the end, and the same reading once the runtime
and numpy are imported and the batch loaded, before any model or session exists (`load_runtime`).
Only one runtime is imported per process: two runtimes in one process contend for threads; the
``ort`` backend imports the training build without PyTorch, as the runner does
(`harness.runner.runtimes.import_ort_training`).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

#: File (in DATA_DIR) of ``torch-profile``'s per-operator self CPU microseconds.
TORCH_PROFILE = "torch_profile.json"

#: ORT session variants the knob benchmark compares with the default settings.
ORT_VARIANTS = (
    "default",
    "numpy-inputs",
    "no-spinning",
    "opt-disabled",
    "opt-basic",
    "opt-extended",
    "opt-all",
    "one-thread",
)


def ort_session_options(threads: int, variant: str, profile_dir: Path | None):
    """Return the session options of one ORT variant (see `ORT_VARIANTS`)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1 if variant == "one-thread" else threads
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    if variant == "no-spinning":
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    levels = {
        "opt-disabled": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
        "opt-basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
        "opt-extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
        "opt-all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
    }
    if variant in levels:
        options.graph_optimization_level = levels[variant]
    if profile_dir is not None:
        options.enable_profiling = True
        options.profile_file_prefix = str(profile_dir / "ort")
    return options


def time_ort(
    artifact_dir: Path, x, y, steps: int, warmup: int, threads: int, variant: str, profile_dir: Path | None = None
) -> tuple[list[float], float]:
    """Time ``steps`` ORT training steps (forward, backward, optimizer step) after ``warmup``.

    Inputs are bound once as OrtValues (except in the ``numpy-inputs`` variant). With
    ``profile_dir``, ORT's profiler writes its per-kernel trace there (timings then include
    the profiler's overhead, so use them for shares, not for the ratio).
    """
    from harness.runner.runtimes import import_ort_training

    ort, api = import_ort_training()
    options = ort_session_options(threads, variant, profile_dir)
    state = api.CheckpointState.load_checkpoint(str(artifact_dir / "checkpoint"))
    module = api.Module(str(artifact_dir / "training_model.onnx"), state, session_options=options)
    optimizer = api.Optimizer(str(artifact_dir / "optimizer_model.onnx"), module)
    module.train()
    if variant == "numpy-inputs":
        inputs = (x, y)
    else:
        inputs = (ort.OrtValue.ortvalue_from_numpy(x), ort.OrtValue.ortvalue_from_numpy(y))
    seconds: list[float] = []
    loss = float("nan")
    for step in range(warmup + steps):
        start = time.perf_counter()
        out = module(*inputs)
        optimizer.step()
        module.lazy_reset_grad()
        elapsed = time.perf_counter() - start
        if step >= warmup:
            seconds.append(elapsed)
        loss = float(out.numpy() if hasattr(out, "numpy") else out)
    if profile_dir is not None:
        # ORT writes a session's trace when the session is destroyed, named by the second:
        # the optimizer session goes first, the training session a second later.
        del optimizer
        time.sleep(1.1)
        del module
    return seconds, loss


def time_onnx(
    artifact_dir: Path, x, y, steps: int, warmup: int, threads: int, variant: str, profile_dir: Path | None = None
) -> tuple[list[float], float]:
    """Time ``steps`` steps of the portable step model after ``warmup``, as the runner runs them.

    The session is the runner's (`harness.runner.backends.OnnxBackend`: IO binding, ping-pong
    buffers); a variant only changes its session options (`onnx_session_options`).
    """
    import numpy as np

    from harness.runner import backends
    from harness.runner.artifacts import load_manifest

    options = ort_session_options(threads, variant, profile_dir)
    original = backends.session_options
    backends.session_options = lambda onnxruntime, threads: options
    try:
        manifest = load_manifest(str(artifact_dir), "onnx")
        backend = backends.OnnxBackend(str(artifact_dir), manifest, threads)
    finally:
        backends.session_options = original
    backend.bind(np.ascontiguousarray(x), np.ascontiguousarray(y))
    seconds: list[float] = []
    loss = float("nan")
    for step in range(warmup + steps):
        start = time.perf_counter()
        out = backend.step()
        elapsed = time.perf_counter() - start
        if step >= warmup:
            seconds.append(elapsed)
        loss = backend.loss_value(out)
    if profile_dir is not None:
        del backend
    return seconds, loss


def time_torch(
    model_name: str, width: float, x, y, steps: int, warmup: int, threads: int, profile_dir: Path | None = None
) -> tuple[list[float], float]:
    """Time ``steps`` PyTorch eager training steps with AdamW (ORT's defaults) after ``warmup``.

    With ``profile_dir``, the timed steps run under PyTorch's profiler and each operator's
    self CPU time (microseconds, summed over the timed steps) is written to
    ``profile_dir / TORCH_PROFILE`` as a JSON object.
    """
    import contextlib

    import torch

    from exporters.zoo import get_model

    torch.set_num_threads(threads)
    torch.set_num_interop_threads(1)
    model = get_model(model_name)
    module = model.build(model.arch(width)).train()
    # The same hyper-parameters as ORT's AdamW graph (exporters.artifacts.OPTIMIZER_DEFAULTS).
    optimizer = torch.optim.AdamW(module.parameters(), lr=1e-3, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.0)
    loss_fn = torch.nn.CrossEntropyLoss()
    xt, yt = torch.from_numpy(x), torch.from_numpy(y)
    loss = float("nan")

    def one_step() -> float:
        nonlocal loss
        start = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        out = loss_fn(module(xt), yt)
        out.backward()
        optimizer.step()
        elapsed = time.perf_counter() - start
        loss = float(out.detach())
        return elapsed

    for _ in range(warmup):
        one_step()
    profiler = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) if profile_dir else None
    with profiler if profiler is not None else contextlib.nullcontext():
        seconds = [one_step() for _ in range(steps)]
    if profiler is not None and profile_dir is not None:
        totals = {e.key: float(e.self_cpu_time_total) for e in profiler.key_averages() if e.self_cpu_time_total > 0}
        (profile_dir / TORCH_PROFILE).write_text(json.dumps(totals))
    return seconds, loss


def load_runtime(backend: str, threads: int) -> str:
    """Import ``backend``'s runtime and numpy the way the runner does; return the runtime's version.

    For ``torch`` the zoo's model code is imported too (`time_torch` builds the module from it),
    so that the baseline reading taken next holds everything but the model itself.

    Parameters
    ----------
    backend : str
        A backend of the usage line (``ort``, ``onnx:VARIANT``, ``torch``, ...).
    threads : int
        numpy's BLAS threads, unless the caller's environment sets them.

    Returns
    -------
    str
    """
    from harness.runner.runtimes import import_numpy, import_onnxruntime, import_ort_training

    import_numpy(threads)
    if backend.startswith("onnx"):
        return str(import_onnxruntime().__version__)
    if backend.startswith("ort"):
        return str(import_ort_training()[0].__version__)
    import torch

    import exporters.zoo  # noqa: F401 - the model's code belongs to the baseline, the model does not

    return str(torch.__version__)


def main(argv: list[str]) -> None:
    """Parse the positional arguments, time one backend and print the JSON document."""
    backend, model_name, width_text, artifact_dir, data_dir, steps, warmup, threads = argv
    from harness.runner.probes import peak_memory

    runtime = load_runtime(backend, int(threads))
    import numpy as np

    x = np.load(Path(data_dir) / "x.npy", allow_pickle=False)
    y = np.load(Path(data_dir) / "y.npy", allow_pickle=False)
    baseline, _ = peak_memory()
    if backend.startswith("onnx"):
        variant = backend.partition(":")[2] or "default"
        profile_dir = Path(data_dir) if backend == "onnx-profile" else None
        seconds, loss = time_onnx(Path(artifact_dir), x, y, int(steps), int(warmup), int(threads), variant, profile_dir)
    elif backend.startswith("ort"):
        # "ort", "ort-profile" or "ort:VARIANT"
        variant = backend.partition(":")[2] or "default"
        profile_dir = Path(data_dir) if backend == "ort-profile" else None
        seconds, loss = time_ort(Path(artifact_dir), x, y, int(steps), int(warmup), int(threads), variant, profile_dir)
    else:
        profile_dir = Path(data_dir) if backend == "torch-profile" else None
        seconds, loss = time_torch(
            model_name, float(width_text), x, y, int(steps), int(warmup), int(threads), profile_dir
        )
    peak, source = peak_memory()
    document = {"backend": backend, "seconds": seconds, "loss": loss, "runtime": runtime}
    document.update(baseline_bytes=baseline, peak_bytes=peak, memory_source=source)
    print(json.dumps(document))


if __name__ == "__main__":
    main(sys.argv[1:])
