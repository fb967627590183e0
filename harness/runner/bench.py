"""The ``bench`` mode: warm up, then time training steps until the median is precise.

Sampling follows `harness.runner.sampling`; the readings around the timed steps are
`harness.runner.probes`'.

Decisions:

* bench data is ``--data`` (the examples FL trains on: step time depends on the values,
  a CNN's step on MNIST differs from one on normal noise), stepped through as ``train``
  does (`harness.runner.data.shard_batches`: the epoch's permutation from ``--seed``, each
  step copying its batch into buffers bound once, the copy inside the timed step), so a
  profile times the step FL rounds run: one batch bound once keeps the same input in
  cache and copies nothing, and times a faster step than ``train``'s on the same shard.
  Without ``--data``, one random batch built from the manifest's input shapes and dtypes
  (float inputs standard normal, int64 inputs and labels uniform below the model's
  ``num_classes``), seeded by ``--seed``, bound once as ``OrtValue``s; nothing but the
  artifact set needs to be on the device.
* energy (``--power-root``, `harness.runner.metering`): an idle window between the warm-up
  and the timed steps (its seconds count against neither ``--max-seconds`` nor
  ``timed_seconds``), the sensor read while the timed samples run, and steps past them
  until the sensor's window spans its updates.
* the runtime's memory (``runtime_memory_bytes``): the peak resident set once numpy and
  the backend's runtime are imported and the data loaded, before the backend opens its
  model. The cell's peak less it is what the model adds (its session, parameters,
  gradients, optimizer state and the steps' activations): the runtime's own share does
  not shrink with the width, and would flatten a memory-vs-width curve. In a resident
  runner the reading also holds the sessions it keeps from earlier requests.
* the matmul probe runs after the timed steps and the "after" readings: BLAS threads
  spin for a while after a matmul and slow the first steps that follow it.
"""

from __future__ import annotations

import argparse
import math
import time

from .arguments import check_threads
from .artifacts import load_manifest, random_batch
from .backends import BACKEND_CLASSES, open_backend
from .data import BatchFeed, cached, check_shard, load_shard, shard_batches
from .failures import bad
from .metering import open_meter
from .probes import cpus_available, load_average, matmul_gflops, peak_memory, readings_after, readings_before
from .protocol import new_bench_keys
from .runtimes import import_numpy
from .sampling import WARMUP_SHARE, sample_steps, warm_up


def run_bench(args: argparse.Namespace, result: dict) -> None:
    """Warm up, then time training steps on a random batch until precise (see "Sampling"); fill ``result``.

    Parameters
    ----------
    args : argparse.Namespace
    result : dict
    """
    result.update(new_bench_keys())
    result.update(
        warmup=args.warmup,
        steps=args.steps,
        precision=args.precision,
        max_seconds=args.max_seconds,
        sample_seconds=args.sample_seconds,
    )
    check_threads(args)
    if args.warmup < 0:
        raise bad(f"--warmup must be at least 0, got {args.warmup}")
    if args.steps < 1:
        raise bad(f"--steps must be at least 1, got {args.steps}")
    if not (math.isfinite(args.sample_seconds) and args.sample_seconds >= 0):
        raise bad(f"--sample-seconds must be a number of at least 0, got {args.sample_seconds!r}")
    if not (math.isfinite(args.precision) and 0 <= args.precision < 1):
        raise bad(f"--precision must be a fraction in [0, 1), got {args.precision!r}")
    if not (math.isfinite(args.max_seconds) and args.max_seconds > 0):
        raise bad(f"--max-seconds must be a positive number, got {args.max_seconds!r}")
    if not (math.isfinite(args.matmul_seconds) and args.matmul_seconds >= 0):
        raise bad(f"--matmul-seconds must be a number of at least 0, got {args.matmul_seconds!r}")
    manifest = load_manifest(args.artifacts, args.backend)
    result["batch"] = int(manifest["batch"])
    np = import_numpy(args.threads)
    feed = None
    if args.data:
        batch = int(manifest["batch"])
        shard = cached(args, "shard", args.data, lambda: load_shard(np, args.data, manifest))
        x, y = check_shard(args.data, shard, batch, manifest)
        feed = BatchFeed(np, x, y, batch)
    BACKEND_CLASSES[args.backend].load_runtime()
    result["runtime_memory_bytes"] = peak_memory()[0]
    backend = open_backend(args, manifest)
    step = backend.step
    if feed is not None:
        backend.bind(feed.xb, feed.yb)
        batches = shard_batches(np, feed.x.shape[0], feed.batch, args.seed)

        def step():  # train's step: the next batch of the epoch's order into the bound buffers, then the step
            feed.load(next(batches))
            return backend.step()

    else:
        backend.bind(*random_batch(np, manifest, args.seed))
    result["bench_data"] = "shard" if args.data else "random"
    passive = readings_before(result)
    result["loadavg"]["before"] = load_average()
    result["cpus_available"] = cpus_available()
    meter = open_meter(getattr(args, "power_root", None), getattr(args, "power_sensor", None))
    clock = time.perf_counter
    start = clock()
    warm, settled = warm_up(step, clock, args.warmup, WARMUP_SHARE * args.max_seconds)
    result.update(warmup_steps=len(warm), warmup_seconds=warm, warmup_settled=settled)
    idle = meter.idle() if meter is not None else 0.0
    if meter is not None:
        meter.start()
    sampled = sample_steps(
        step,
        clock,
        min_samples=args.steps,
        precision=args.precision,
        max_seconds=max(0.0, args.max_seconds - (clock() - start - idle)),
        sample_seconds=args.sample_seconds,
        loss_of=backend.loss_value,
        cpu_clock=time.process_time,
        judge_disturbed=args.threads == 1,
    )
    result["timed_seconds"] = clock() - start - idle
    if meter is not None:
        # The sensor's window spans at least its updates: steps go on (not as samples) within the cap.
        extra = 0
        while meter.short() and clock() - start - idle < args.max_seconds:
            step()
            extra += 1
        result["energy"] = meter.finish((sum(sampled["steps_per_sample"]) + extra) * result["batch"])
    result["step_seconds"], result["loss"] = sampled["seconds"], sampled["loss"]
    result["cpu_step_seconds"] = sampled["cpu_seconds"]
    result["disturbed"] = [int(flag) for flag in sampled["disturbed"]]
    result["steps_per_sample"], result["samples"] = sampled["steps_per_sample"], len(sampled["seconds"])
    if sampled["low"] is not None:
        result["median_ci_seconds"] = [sampled["low"], sampled["high"]]
    result["precision_achieved"] = sampled["half_width"]
    result["stop_reason"] = sampled["stop_reason"]
    half = sampled["half_width"]
    result["imprecise"] = args.precision > 0 and (half is None or half > args.precision)
    result["loadavg"]["after"] = load_average()
    readings_after(result, passive)
    # After the timed steps: BLAS worker threads keep spinning for a while after a matmul
    # and would compete with the runtime's threads for the first steps.
    if args.matmul_seconds > 0:
        result["matmul_gflops"] = matmul_gflops(np, seconds=args.matmul_seconds)
