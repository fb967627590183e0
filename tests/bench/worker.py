"""Time training steps of one backend in a process of its own.

Usage: ``python -m tests.bench.worker ort|ort-profile|torch MODEL WIDTH ARTIFACT_DIR DATA_DIR STEPS WARMUP THREADS``
where DATA_DIR holds the batch as ``x.npy`` and ``y.npy``.
Prints one JSON document: ``{"backend", "seconds": [per timed step], "loss": last loss}``.
Only one runtime is imported per process: two runtimes in one process contend for threads.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path


def time_ort(
    artifact_dir: Path, x, y, steps: int, warmup: int, threads: int, profile_dir: Path | None = None
) -> tuple[list[float], float]:
    """Time ``steps`` ORT training steps (forward, backward, optimizer step) after ``warmup``.

    With ``profile_dir``, ORT's profiler writes its per-kernel trace there (timings then
    include the profiler's overhead, so use them for shares, not for the ratio).
    """
    import onnxruntime as ort
    from onnxruntime.training import api

    options = ort.SessionOptions()
    if profile_dir is not None:
        options.enable_profiling = True
        options.profile_file_prefix = str(profile_dir / "ort")
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    state = api.CheckpointState.load_checkpoint(str(artifact_dir / "checkpoint"))
    module = api.Module(str(artifact_dir / "training_model.onnx"), state, session_options=options)
    optimizer = api.Optimizer(str(artifact_dir / "optimizer_model.onnx"), module)
    module.train()
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


def time_torch(model_name: str, width: float, x, y, steps: int, warmup: int, threads: int) -> tuple[list[float], float]:
    """Time ``steps`` PyTorch eager training steps with AdamW (ORT's defaults) after ``warmup``."""
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
    seconds: list[float] = []
    loss = float("nan")
    for step in range(warmup + steps):
        start = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        out = loss_fn(module(xt), yt)
        out.backward()
        optimizer.step()
        elapsed = time.perf_counter() - start
        if step >= warmup:
            seconds.append(elapsed)
        loss = float(out.detach())
    return seconds, loss


def main(argv: list[str]) -> None:
    """Parse the positional arguments, time one backend and print the JSON document."""
    backend, model_name, width_text, artifact_dir, data_dir, steps, warmup, threads = argv
    import numpy as np

    x = np.load(Path(data_dir) / "x.npy", allow_pickle=False)
    y = np.load(Path(data_dir) / "y.npy", allow_pickle=False)
    if backend in ("ort", "ort-profile"):
        profile_dir = Path(data_dir) if backend == "ort-profile" else None
        seconds, loss = time_ort(Path(artifact_dir), x, y, int(steps), int(warmup), int(threads), profile_dir)
    else:
        seconds, loss = time_torch(model_name, float(width_text), x, y, int(steps), int(warmup), int(threads))
    print(json.dumps({"backend": backend, "seconds": seconds, "loss": loss}))


if __name__ == "__main__":
    main(sys.argv[1:])
