"""Measure the host's float32 matmul rate in a process of its own: the training benchmark's hardware limit.

Usage: ``python -m tests.bench.matmul_rate THREADS SECONDS``. numpy's BLAS is held to THREADS
threads (``OMP_NUM_THREADS``, ``OPENBLAS_NUM_THREADS`` and ``MKL_NUM_THREADS``, set here before
numpy is imported, overriding the caller's), as many as every training backend gets. Each of
`SIZES` is probed `REPEATS` times for SECONDS / REPEATS with the runner's own probe
(`harness.runner.probes.matmul_gflops`); the best rate is the limit, since a shared machine
only ever slows a probe down.
Prints one JSON document: ``{"gflops": best rate, "size": its matrix size, "threads"}``.
"""

from __future__ import annotations

import json
import os
import sys

#: Square matrix sizes probed (larger ones amortise the BLAS's threading better).
SIZES = (256, 512, 1024)

#: Probes per size.
REPEATS = 3

#: The environment variables that set numpy's BLAS threads.
THREAD_VARIABLES = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")


def thread_environment(threads: int) -> dict[str, str]:
    """Return the environment variables that hold numpy's BLAS (and OpenMP) to ``threads`` threads.

    Parameters
    ----------
    threads : int

    Returns
    -------
    dict of str to str
    """
    return {name: str(threads) for name in THREAD_VARIABLES}


def main(argv: list[str]) -> None:
    """Measure the best matmul rate at THREADS threads and print the JSON document."""
    threads, seconds = int(argv[0]), float(argv[1])
    os.environ.update(thread_environment(threads))
    import numpy as np

    from harness.runner.probes import matmul_gflops

    rates = [(matmul_gflops(np, seconds=seconds / REPEATS, n=n), n) for n in SIZES for _ in range(REPEATS)]
    best, size = max(rates)
    print(json.dumps({"gflops": best, "size": size, "threads": threads}))


if __name__ == "__main__":
    main(sys.argv[1:])
