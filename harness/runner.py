"""fleetbench on-device runner: one self-contained file pushed to a device.

Nothing of fleetbench is imported: the device needs Python >= 3.8, numpy and the
backend (``onnxruntime-training`` for ``ort``, the plain ``onnxruntime`` package for
``onnx``, PyTorch for ``torch``). The module top imports the standard library only;
numpy and the backend are imported inside the modes, so a missing one becomes exit
status 3 with a JSON document naming it.

Command line::

    python3 runner.py bench --artifacts DIR --backend ort|onnx|torch --warmup W --steps N
                            --threads T [--seed S] [--sample-seconds S]
                            [--precision P] [--max-seconds M] [--data SHARD.npz]
    python3 runner.py train --artifacts DIR --backend ort|onnx|torch --params IN.npy
                            --data SHARD.npz --epochs E --lr LR --threads T --out OUT.npy
                            [--batch B] [--seed S]

    python3 runner.py serve [--backend ort|onnx|torch] [--threads T] [--max-sessions N] [--cwd DIR]

Output: exactly one JSON document on stdout, always, also on failure (logs and
anything a native library prints go to stderr: file descriptor 1 is pointed at
stderr while the runner works). Keys::

    mode               "bench" | "train" (null if the mode itself was not understood)
    status             "ok" | "bad arguments" | "missing runtime" | "out of memory" | "runner error"
    error              message or null
    missing            the module that could not be imported (status "missing runtime"), else null
    backend, batch, warmup, steps, threads, seed
    flush_denormals    whether denormal floats are flushed to zero in the runner's thread
    step_seconds       wall time of every timed step (bench: warm-up excluded; train: every step);
                       bench with --sample-seconds S > 0: one entry per sample, a block of
                       consecutive steps lasting at least S, as the block's time / its steps
    steps_per_sample   bench: how many steps each entry of step_seconds covers
    cpu_step_seconds   bench: the process's CPU time (all its threads, time.process_time)
                       per step of every entry of step_seconds; beside the wall time it
                       tells a device that did not run the steps (preempted, held to a
                       CPU quota) from steps that cost more CPU (see "cpu time" below)
    disturbed          bench: 1 for an entry of step_seconds taken while something outside
                       the process slowed the cpu (see "Disturbed samples"), else 0; empty
                       when not judged (threads > 1)
    bench only (see "Sampling" below):
      precision, max_seconds, sample_seconds   the settings the run used
      warmup_steps     warm-up steps run (at most --warmup); warmup_seconds: their times
      warmup_settled   whether the warm-up rule was met before its cap
      samples          entries of step_seconds
      median_ci_seconds  [low, high]: the 95 % interval of the median undisturbed sample
                       (null below 6 samples)
      precision_achieved the interval's half-width as a fraction of the median (null below 6)
      stop_reason      "precision" | "steps" | "time cap" | "sample cap"
      imprecise        precision > 0 and the target was not reached
      timed_seconds    wall time of warm-up plus timed samples
      loadavg          {"before": [1, 5, 15 min], "after": [...]} (os.getloadavg; [] where absent)
      cpus_available   cpus this process may run on (its affinity mask)
      bench_data       "shard": the steps train on --data's batches as train does; "random":
                       on a random batch (see "bench data" below)
    loss               loss of every step in step_seconds (before that step's update)
    peak_memory_bytes  peak resident set of the process (VmHWM, else ru_maxrss)
    peak_memory_source "VmHWM" | "ru_maxrss" | null
    peak_memory_scope  "process" (one-shot), "request" or "process" (serve, see below)
    cpu_freq_khz       {"before": [kHz per cpu], "after": [...]} (scaling_cur_freq)
    thermal_c          {"before": {zone type: Celsius}, "after": {...}}
    throttled          bool, see `throttled`
    matmul_gflops      achievable float32 GFLOP/s of numpy at T threads (bench only; null in train
                       and with --matmul-seconds 0)
    versions           {"python", "numpy", "onnxruntime", "torch"} (null when not installed)
    train only:        epochs, lr, examples (examples trained on, all epochs), step_examples (the
                       examples of every step in step_seconds), num_parameters, out,
                       loop_seconds and loop_cpu_seconds: wall and CPU time of the whole step loop
                       (steps, batch copies, width switches); their ratio is the share of a cpu
                       the device got. The CPU clock is read once per loop, not per step: reading
                       it is a system call, where a CPU quota (cgroup) charges the runtime used
                       and throttles, so a read per step would move the throttled time out of
                       the steps' windows.

Serve protocol (version `PROTOCOL_VERSION`; a native runner speaks the same)::

    start     runner.py serve [--backend B] [--threads T] [--max-sessions N] [--cwd DIR]
              (--cwd: relative paths of requests start there)
    ready     the first stdout line: a document with mode "serve", event "ready",
              protocol, pid, cwd, status (not "ok": start-up failed, e.g. "missing runtime"
              for --backend's import, and the process exits with that status),
              startup_seconds, peak_memory_*
    request   one JSON object per stdin line (UTF-8, no newline inside):
                id          any JSON value, echoed in the reply
                mode        "bench" | "train" | "ping" | "exit"
                <option>    every command-line option of the mode, "-" spelled "_"
                            (artifacts, backend, warmup, steps, threads, seed,
                            sample_seconds, params, data, epochs, lr, out, batch);
                            threads and backend default to serve's own
                train only, all optional:
                params_inline  base64 of the little-endian float32 flat vector, instead
                               of params (a file)
                return_params  "inline": the reply carries params_inline (out optional)
                fjord       {"sets": [artifact dir per width], "index": [flat .npy of
                            int positions of that set's parameters in the request's
                            vector, or null for the request's own layout], "widths":
                            [labels]}: each step (each in-process batch, the short last
                            one included) draws a set uniformly with
                            numpy default_rng((seed, 1)), as fl.strategies.fjord does
                syncdrop    {"sync_seed": S, "scale": bool, "groups": [[group, [keep
                            probability per neuron]], ...]} in the model's group order:
                            per step, default_rng((S, step)) draws U(0, 1) thresholds
                            for every group in order, a neuron is kept when its
                            threshold is below its keep probability, and the mask input
                            mask.<group> gets 1/p (scale) or 1 for kept, 0 for dropped
    reply     one JSON line per request, in order: the mode's document as above, plus
              id, request_seconds (the runner's own wall time for the request),
              sessions {opened, reused, open_seconds}, and for train load_seconds,
              save_seconds, and with fjord step_sets, step_widths, switch_seconds,
              with syncdrop mask_means, mask_seconds
    end       after an "exit" request (answered first) or at the end of stdin: exit 0

A failed request is a reply with its status (the exit code the one-shot mode would
have returned is ``EXIT_CODES[status]``) and the runner goes on serving; only a
runner killed from outside (time-out, OOM killer) ends without a reply.

Serve decisions:

* one process per device per run: the imports (numpy, the runtime), the sessions and
  the shard (kept per path, size and mtime) stay in memory between requests; at most
  ``--max-sessions`` backends are kept, least recently used dropped first.
* a reused backend starts from the set's initial parameters, the request's learning
  rate and dense masks, so a reply equals the one-shot mode's document for the same
  arguments (timings aside). An ``ort`` session of an AdamW set cannot reset its
  optimizer state and is opened anew for every request.
* peak memory per request: before each request ``5`` is written to
  ``/proc/self/clear_refs``, which resets VmHWM to the current resident set, so
  ``peak_memory_bytes`` is the peak during the request (``peak_memory_scope``
  "request"); where that write is refused the value is the process's peak since start
  (scope "process"). Either way it includes the resident interpreter, imports and kept
  sessions, which a one-shot process also holds.
* the request keys are command-line options, so one parser checks both paths.
* ``--cwd``: paths inside request lines reach the runner as data, never through a
  device's shell, so a device that maps paths in its command lines (the emulated
  phone's sandbox) would not map them; the host sends paths relative to the directory
  given on the command line instead, which every device maps.

Exit status (`EXIT_CODES`; the host reads it through ``harness.contract``): 0 ok, 2 bad arguments (also
an artifact set that the backend cannot use, a parameter vector of the wrong
length, an empty shard, and a shard smaller than one batch for ``bench --data``
or a set with a fixed batch), 3 missing runtime, 4 out of memory
(``MemoryError``, and ORT / PyTorch allocation failures recognised by their
message), 5 runner error (anything else; the traceback goes to stderr). A runner
killed by the kernel's OOM killer prints nothing: the caller sees the signal
(exit status -9 / 137) and decides (the campaign records it as out of memory).

Sampling (bench):

* **Warm-up** runs single steps until the time per step has settled, by this rule: step
  ``i >= 2`` has settled when it is no more than `WARMUP_TOLERANCE` (5 %) faster than the
  fastest step before it (the first steps of an ORT session allocate and are slower; a
  step that no longer sets a new minimum is past that). Capped at ``--warmup`` steps and
  at `WARMUP_SHARE` of ``--max-seconds``; ``warmup_settled`` says whether the rule or a cap
  ended it. A slower step (a CPU quota's throttled period) counts as settled: the rule
  asks only that the steps stop getting faster.
* **Timed samples** are taken until the 95 % confidence interval of their median is within
  ``+-precision`` of the median (relative half-width ``max(m - lo, hi - m) / m``), with at
  least ``--steps`` samples, or until ``--max-seconds`` (warm-up included) have passed, or
  `MAX_SAMPLES` samples; the run then says which (``stop_reason``) and whether the target
  was missed (``imprecise``). ``--precision 0`` takes exactly ``--steps`` samples (no
  interval test, no cap). The interval is distribution-free, from order statistics: for
  ``n`` samples ``[x_(k), x_(n+1-k)]`` with the largest ``k`` such that
  ``2 P(B <= k - 1) <= 0.05``, ``B ~ Binomial(n, 1/2)`` (`median_ci_ranks`, exact integer
  arithmetic); it covers the median of any continuous distribution with probability at
  least 95 % for a fixed ``n``, and needs ``n >= 6`` (`MIN_SAMPLES`). The test is repeated
  as samples arrive (every sample up to 20, then every 5 % more), so the coverage at the
  sample where it stops is somewhat below the nominal 95 %
  (``tests/harness/test_runner.py`` measures it).
* **Disturbed samples** (one thread): a training step is the same work every time, so its
  CPU time per step varies only when something outside the process slows the cpu (a
  neighbour on a shared host's caches and memory, SMT siblings); a CPU quota's throttled
  periods stop the process but cost it no CPU time. A sample whose CPU time per step is
  more than `DISTURBANCE_LIMIT` (10 %) above the 10th percentile of the run's samples is
  ``disturbed`` (`disturbed_samples`, judged from `DISTURBANCE_MIN_SAMPLES` samples on);
  the median, its interval and the stopping rule use the other samples. With more than
  one thread the CPU time also counts the pool's spinning, so nothing is judged.

Decisions:

* ``--sample-seconds``: a device held to a CPU share by a CFS quota (an emulated
  device) runs at full speed until the period's quota is spent and then not at all,
  so single steps shorter than a period come out bimodal (fast, or fast plus the rest
  of the period) and their median can sit on either mode. Timing blocks of steps that
  span many periods averages the quota out; the campaign asks for it on emulated
  devices (`harness.campaign.sample_seconds_for`).
* denormal floats are flushed to zero (FTZ and DAZ, `flush_denormals`) in the runner's
  thread, where a session with one intra-op thread computes, and in ORT's intra-op
  threads (``session.set_denormal_as_zero``). Training a CNN on MNIST drifts into and
  out of denormal gradients and activations: the same steps of one process then took
  2.8 ms or 4.1 ms for stretches of a run, and one cell's median varied by 17 % (CV)
  across campaigns. Flushed, they held at 2.8 ms. FL training on the devices runs with
  the same setting, so profiles and rounds agree; the document says whether it took
  (``flush_denormals``).
* cpu time: every sample also records the process's CPU time per step. On this
  project's virtual machine the CPU time of the same step rose by up to half in
  stretches of 0.3 s to seconds, throttled or not (a numpy stream over 1 MB slowed the
  same way, with nothing else running in the machine): those samples are the disturbed
  ones above. A device that did not get the cpu (another process, a quota) shows wall
  time above CPU time instead. The campaign says which in an imprecise cell's reason
  (`harness.campaign.imprecision_reason`).
* bench data is ``--data`` (the examples FL trains on: step time depends on the values,
  e.g. a CNN's step on MNIST took 2.8 ms against 4.4 ms on normal noise), stepped through
  as ``train`` does (`shard_batches`: the epoch's permutation from ``--seed``, each step
  copying its batch into buffers bound once, the copy inside the timed step), so a
  profile times the step FL rounds run: on one batch bound once, a ``fjord-cnn`` step at
  width 0.25 was 10 to 13 % faster than ``train``'s on the same shard (the same batch's
  input stays in cache, and no copy). Without ``--data``, one random batch built from
  the manifest's input shapes and dtypes (float inputs standard normal, int64 inputs and
  labels uniform below the model's ``num_classes``), seeded by ``--seed``, bound once as
  ``OrtValue``s; nothing but the artifact set needs to be on the device.
* ORT sessions: ``intra_op_num_threads=T``, ``inter_op_num_threads=1``,
  sequential execution. numpy's BLAS gets T threads too (``OMP_NUM_THREADS``,
  ``OPENBLAS_NUM_THREADS``, ``MKL_NUM_THREADS`` set before numpy is imported,
  unless the caller set them); torch gets ``set_num_threads(T)``.
* the matmul probe (256 x 256 float32, repeated for about ``--matmul-seconds``, 0.2 s
  by default; 0 skips it, as a campaign's later passes of a cell do) runs after the
  timed steps and the "after" readings: BLAS threads spin for a while after a matmul
  and slowed the first steps by up to 45 % (fjord-cnn, 4 ms steps) when it ran first.
* train: the shard is an ``.npz`` with ``x`` (inputs) and ``y`` (int64 labels);
  each epoch visits it in a fresh permutation drawn from ``--seed`` (default 0)
  in batches of the manifest's ``batch``, the last one short where the shard is
  not a whole number of batches, as in-process training (``fl.client``) batches
  it: the graphs take a batch of any size (their inputs name the batch dimension,
  `variable_batch`), so a shard smaller than one batch trains too, and the
  steps, ``examples`` and ``step_examples`` count every example. The short step
  binds the leading rows of the batch buffers and binds the whole buffers again
  after it (both inside its time). An artifact set exported with a fixed batch
  dimension (an older export) skips the short batch and needs at least one batch.
  ``--batch``, when given, must equal the manifest's ``batch``, the batch the set
  was exported and profiled with (``bench`` steps on batches of that size only).
  ``--out`` is written atomically at exactly the given path (``np.save``,
  ``allow_pickle=False``).
* onnx backend (`OnnxBackend`): the set's ``step_model.onnx`` (``exporters.step_model``:
  forward, loss, backward and optimizer update in default-domain ONNX operators) on any
  ``onnxruntime`` build, CPU provider, default graph optimisation (``ORT_ENABLE_ALL``).
  The file must match the manifest's sha256 and its inputs and outputs the manifest's
  ``step_model`` entry, else exit 2; bench starts from ``initial_parameters.npy`` (the
  same values as the checkpoint), so its losses equal the ``ort`` backend's. Parameters
  and optimizer state never leave ORT between steps (two IO bindings over two buffer sets,
  alternated).
* torch backend: the artifact set must hold ``model.pt`` (TorchScript, written by
  ``exporters.torchscript.export_torchscript``); it trains with
  ``torch.optim.AdamW`` / ``SGD`` at the manifest's ``optimizer_defaults`` and the
  mean cross-entropy. ``torch.optim.AdamW`` differs from ORT's AdamW in how
  ``eps`` enters (see ``exporters.torch_twin.OrtAdamW``); SGD matches exactly.
* throttled: true when, on any cpu, the frequency after the run is more than 5 %
  below the frequency before it, or when any thermal zone is at or above one of
  its ``passive`` trip points after the run. A heuristic: governors also lower
  the frequency of idle cpus, so read it with the raw frequencies.
* peak memory is the whole process's (interpreter, runtime, probe, data).
* the ``ort`` and ``onnx`` backends never load PyTorch, although onnxruntime-training 1.19
  imports it by itself where it is installed (see `import_ort_training`): that
  cost about 2 s of start-up and 250 MB of peak memory per cell, and would put a
  second runtime's thread pool into the measured process. ``versions`` reports
  the installed version of a runtime that was not loaded (package metadata).
"""

from __future__ import annotations

import argparse
import base64
import bisect
import collections
import contextlib
import functools
import glob
import hashlib
import json
import math
import os
import platform
import sys
import tempfile
import time
import traceback
import types
from collections.abc import Iterator
from typing import Any

EXIT_CODES = {
    "ok": 0,
    "bad arguments": 2,
    "missing runtime": 3,
    "out of memory": 4,
    "runner error": 5,
}

#: A frequency drop larger than this fraction between before and after counts as throttling.
THROTTLE_DROP = 0.05

#: Substrings (lower case) of ORT / PyTorch / loader messages that mean an allocation failed.
OOM_MESSAGES = (
    "out of memory",
    "bad_alloc",
    "failed to allocate",
    "can't allocate memory",
    "cannot allocate memory",
    "not enough memory",
    "unable to allocate",
    "memoryerror",
)

TORCHSCRIPT_FILE = "model.pt"
STEP_MODEL_FILE = "step_model.onnx"
INITIAL_PARAMETERS_FILE = "initial_parameters.npy"

#: Backends: ORT training artifacts, the portable step model on plain onnxruntime, TorchScript.
BACKENDS = ("ort", "onnx", "torch")

#: Two-sided confidence of the interval of the median that ends the timed sampling.
CONFIDENCE = 0.95

#: Fewest samples for which a distribution-free two-sided 95 % interval of the median exists:
#: the widest one, ``[min, max]``, misses the median with probability ``2 / 2**n``, at most
#: 0.05 from ``n = 6`` on.
MIN_SAMPLES = 6

#: Default ``--precision``: the interval's half-width as a fraction of the median (+-2 %).
DEFAULT_PRECISION = 0.02

#: Default ``--max-seconds``: the cap on warm-up plus timed sampling of one run.
DEFAULT_MAX_SECONDS = 30.0

#: Warm-up rule: a step has settled when it is at most this fraction faster than the fastest before it.
WARMUP_TOLERANCE = 0.05

#: Warm-up may use at most this share of ``--max-seconds``.
WARMUP_SHARE = 0.25

#: Most timed samples of one run (bounds the document: about 25 bytes per sample).
MAX_SAMPLES = 5000

#: The interval test runs after every sample up to this many, then after every 5 % more.
CHECK_EVERY_SAMPLE_UP_TO = 20

#: A sample is disturbed when its CPU time per step exceeds this multiple of the run's low
#: quantile (`DISTURBANCE_QUANTILE`) of CPU time per step.
DISTURBANCE_LIMIT = 1.1

#: The quantile of the run's CPU times per step that stands for an undisturbed step. The
#: median as the base keeps both levels of a cell whose passes the host ran at two speeds,
#: and the cell is then flagged noisy; the low quantile keeps the faster, undisturbed level.
DISTURBANCE_QUANTILE = 0.1

#: Samples are judged disturbed only from this many on (a low quantile needs a few).
DISTURBANCE_MIN_SAMPLES = 10

#: Version of the serve protocol (the ``protocol`` of the ready line).
PROTOCOL_VERSION = 1
#: Open backends (sessions) a serving runner keeps, least recently used dropped first.
DEFAULT_MAX_SESSIONS = 8
#: Seconds of the bench's matmul probe (`matmul_gflops`) by default.
MATMUL_SECONDS = 0.2
#: Keys of a serve request that are not command-line options of its mode.
SERVE_KEYS = ("id", "mode", "params_inline", "return_params", "fjord", "syncdrop")


class RunnerFailure(Exception):
    """A failure with a known status (bad arguments, missing runtime, out of memory)."""

    def __init__(self, status: str, message: str, missing: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.missing = missing


def bad(message: str) -> RunnerFailure:
    """Return a "bad arguments" failure.

    Parameters
    ----------
    message : str

    Returns
    -------
    RunnerFailure
    """
    return RunnerFailure("bad arguments", message)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        raise bad(message)


def build_parser() -> argparse.ArgumentParser:
    """Return the command-line parser (errors raise `RunnerFailure`, never exit).

    Returns
    -------
    argparse.ArgumentParser
    """
    parser = _Parser(prog="runner.py", description="fleetbench on-device runner")
    sub = parser.add_subparsers(dest="mode")
    common = _Parser(add_help=False)
    common.add_argument("--artifacts", required=True, help="artifact set directory")
    common.add_argument("--backend", required=True, choices=BACKENDS)
    common.add_argument("--threads", type=int, required=True, help="intra-op threads")
    common.add_argument("--seed", type=int, default=0)
    bench = sub.add_parser("bench", parents=[common], help="time training steps")
    bench.add_argument("--warmup", type=int, required=True, help="most warm-up steps")
    bench.add_argument("--steps", type=int, required=True, help="fewest timed samples")
    bench.add_argument(
        "--sample-seconds", type=float, default=0.0, help="time blocks of consecutive steps lasting at least this"
    )
    bench.add_argument(
        "--precision", type=float, default=DEFAULT_PRECISION, help="target half-width of the median's 95 %% interval"
    )
    bench.add_argument(
        "--max-seconds", type=float, default=DEFAULT_MAX_SECONDS, help="cap on warm-up plus timed sampling"
    )
    bench.add_argument(
        "--data", help=".npz shard with x and y: time steps on its batches, in train's order (default random)"
    )
    bench.add_argument(
        "--matmul-seconds", type=float, default=MATMUL_SECONDS, help="length of the matmul probe (0: none)"
    )
    train = sub.add_parser("train", parents=[common], help="train on a local shard")
    train.add_argument("--params", help="flat float32 .npy in manifest order")
    train.add_argument("--data", required=True, help=".npz shard with x and y")
    train.add_argument("--epochs", type=int, required=True)
    train.add_argument("--lr", type=float, required=True)
    train.add_argument("--out", help="where to write the trained flat .npy")
    train.add_argument("--batch", type=int, default=None, help="must equal the artifact batch")
    serve = sub.add_parser("serve", help="resident: one JSON request per stdin line, one reply per stdout line")
    serve.add_argument("--threads", type=int, default=1, help="numpy threads; the default of requests")
    serve.add_argument("--backend", choices=BACKENDS, default=None, help="import this runtime at start")
    serve.add_argument(
        "--max-sessions", type=int, default=DEFAULT_MAX_SESSIONS, help="open backends kept between requests"
    )
    serve.add_argument("--cwd", default=None, help="work in this directory (relative request paths start here)")
    return parser


def new_result() -> dict:
    """Return the JSON document with every key present and nothing measured.

    Returns
    -------
    dict
    """
    return {
        "mode": None,
        "status": "runner error",
        "error": None,
        "missing": None,
        "backend": None,
        "batch": None,
        "warmup": None,
        "steps": None,
        "threads": None,
        "seed": None,
        "flush_denormals": None,
        "step_seconds": [],
        "loss": [],
        "peak_memory_bytes": None,
        "peak_memory_source": None,
        "peak_memory_scope": "process",
        "cpu_freq_khz": {"before": [], "after": []},
        "thermal_c": {"before": {}, "after": {}},
        "throttled": False,
        "matmul_gflops": None,
        "versions": {"python": platform.python_version(), "numpy": None, "onnxruntime": None, "torch": None},
    }


def new_bench_keys() -> dict:
    """Return the bench-only keys of the document, nothing measured yet.

    Returns
    -------
    dict
    """
    return {
        "precision": None,
        "max_seconds": None,
        "sample_seconds": None,
        "steps_per_sample": [],
        "cpu_step_seconds": [],
        "disturbed": [],
        "warmup_steps": 0,
        "warmup_seconds": [],
        "warmup_settled": False,
        "samples": 0,
        "median_ci_seconds": None,
        "precision_achieved": None,
        "stop_reason": None,
        "imprecise": False,
        "timed_seconds": None,
        "loadavg": {"before": [], "after": []},
        "cpus_available": None,
        "bench_data": None,
    }


# --------------------------------------------------------------------------- device facts


def _read(path: str) -> str | None:
    try:
        with open(path) as handle:
            return handle.read().strip()
    except (OSError, ValueError):
        return None


def cpu_frequencies_khz() -> list:
    """Return the current frequency of every cpu in kHz (empty where not exposed).

    Returns
    -------
    list of int or None
        One entry per ``/sys/devices/system/cpu/cpuN``, in N order; ``None`` for
        a cpu without a readable ``scaling_cur_freq`` / ``cpuinfo_cur_freq``.
    """
    cpus = glob.glob("/sys/devices/system/cpu/cpu[0-9]*")
    cpus.sort(key=lambda p: int(os.path.basename(p)[3:]))
    out = []
    for cpu in cpus:
        value = None
        for name in ("scaling_cur_freq", "cpuinfo_cur_freq"):
            text = _read(os.path.join(cpu, "cpufreq", name))
            if text is not None and text.isdigit():
                value = int(text)
                break
        out.append(value)
    return out if any(v is not None for v in out) else []


def thermal_zones() -> tuple:
    """Read every thermal zone's temperature and passive trip points.

    Returns
    -------
    temps : dict of str to float
        Celsius by zone type (``type#N`` for a repeated type).
    passive : dict of str to list of float
        Passive trip points in Celsius by the same keys.
    """
    temps: dict = {}
    passive: dict = {}
    zones = glob.glob("/sys/class/thermal/thermal_zone[0-9]*")
    zones.sort(key=lambda p: int(os.path.basename(p)[len("thermal_zone") :]))
    for zone in zones:
        text = _read(os.path.join(zone, "temp"))
        try:
            celsius = int(text or "") / 1000.0
        except ValueError:
            continue
        kind = _read(os.path.join(zone, "type")) or os.path.basename(zone)
        key, n = kind, 1
        while key in temps:
            n += 1
            key = f"{kind}#{n}"
        temps[key] = celsius
        trips = []
        for trip_type in glob.glob(os.path.join(zone, "trip_point_*_type")):
            if _read(trip_type) == "passive":
                trip = _read(trip_type[: -len("type")] + "temp")
                if trip is not None and trip.lstrip("-").isdigit() and int(trip) > 0:
                    trips.append(int(trip) / 1000.0)
        passive[key] = trips
    return temps, passive


def throttled(freq_before: list, freq_after: list, temps_after: dict, passive: dict) -> bool:
    """Decide whether the device throttled during the run.

    Parameters
    ----------
    freq_before, freq_after : list of int or None
        Per-cpu kHz before and after.
    temps_after : dict of str to float
        Celsius per zone after the run.
    passive : dict of str to list of float
        Passive trip points per zone.

    Returns
    -------
    bool
        True when some cpu's frequency fell by more than `THROTTLE_DROP`, or a
        zone is at or above one of its passive trip points.
    """
    for before, after in zip(freq_before, freq_after):  # noqa: B905 - zip(strict=) needs Python 3.10
        if before and after is not None and after < (1.0 - THROTTLE_DROP) * before:
            return True
    for key, celsius in temps_after.items():
        if any(celsius >= trip for trip in passive.get(key, ())):
            return True
    return False


def peak_memory() -> tuple:
    """Return the process's peak resident set and where it came from.

    Returns
    -------
    bytes : int or None
    source : {"VmHWM", "ru_maxrss"} or None
    """
    text = _read("/proc/self/status")
    if text:
        for line in text.splitlines():
            if line.startswith("VmHWM:"):
                parts = line.split()
                if len(parts) >= 2 and parts[1].isdigit():
                    return int(parts[1]) * 1024, "VmHWM"
    try:
        import resource

        maxrss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    except (ImportError, OSError, AttributeError):
        return None, None
    # Linux reports kilobytes, macOS bytes.
    return int(maxrss) * (1 if sys.platform == "darwin" else 1024), "ru_maxrss"


def _dist_version(*names: str) -> str | None:
    try:
        from importlib import metadata
    except ImportError:  # pragma: no cover - Python < 3.8
        return None
    for name in names:
        try:
            return metadata.version(name)
        except Exception:  # noqa: BLE001 - any metadata problem means "unknown"
            continue
    return None


def versions(result: dict) -> None:
    """Fill ``result["versions"]`` without importing runtimes that are not loaded yet.

    Parameters
    ----------
    result : dict
    """
    v = result["versions"]
    for key, module, dists in (
        ("numpy", "numpy", ("numpy",)),
        ("onnxruntime", "onnxruntime", ("onnxruntime-training", "onnxruntime")),
        ("torch", "torch", ("torch",)),
    ):
        loaded = sys.modules.get(module)
        version = getattr(loaded, "__version__", None) if loaded is not None else None
        v[key] = str(version) if version else _dist_version(*dists)


# --------------------------------------------------------------------------- runtimes


@functools.lru_cache(maxsize=None)  # noqa: UP033 - functools.cache is Python 3.9+; the runner runs on 3.8
def flush_denormals() -> bool:
    """Set flush-to-zero and denormals-are-zero in the calling thread's floating-point unit.

    Once per process (the runner computes in one thread; ``find_library`` alone costs
    milliseconds, too much for every request of a resident runner on a slow device).

    Through the C maths library's ``fegetenv`` / ``fesetenv`` (glibc's libm, the runtime
    bundles' too): on x86_64 the ``fenv_t``'s MXCSR word (byte 28) gains FTZ and DAZ
    (``0x8040``); on aarch64 its FPCR word (byte 0) gains FZ (bit 24). Threads started
    afterwards inherit the setting.

    Returns
    -------
    bool
        Whether the flags are set (False on another machine or C library).
    """
    import ctypes
    import ctypes.util
    import platform

    machine = platform.machine().lower()
    layout = {"x86_64": (28, 0x8040), "amd64": (28, 0x8040), "aarch64": (0, 1 << 24), "arm64": (0, 1 << 24)}
    if machine not in layout:
        return False
    offset, bits = layout[machine]
    try:
        libm = ctypes.CDLL(ctypes.util.find_library("m") or "libm.so.6")  # fenv lives in libm
        env = (ctypes.c_ubyte * 64)()  # larger than fenv_t on both machines
        if libm.fegetenv(env) != 0:
            return False
        word = ctypes.c_uint32.from_buffer(env, offset)
        word.value |= bits
        if libm.fesetenv(env) != 0:
            return False
        check = (ctypes.c_ubyte * 64)()
        libm.fegetenv(check)
        return (ctypes.c_uint32.from_buffer(check, offset).value & bits) == bits
    except (OSError, AttributeError, ValueError):
        return False


def import_numpy(threads: int):
    """Import numpy with its BLAS held to ``threads`` threads.

    Parameters
    ----------
    threads : int

    Returns
    -------
    module

    Raises
    ------
    RunnerFailure
        "missing runtime" when numpy cannot be imported.
    """
    for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(name, str(threads))
    try:
        import numpy
    except ImportError as exc:
        raise _import_failure("numpy", exc) from None
    return numpy


def _import_failure(name: str, exc: BaseException) -> RunnerFailure:
    if is_oom(exc):
        return RunnerFailure("out of memory", f"importing {name}: {exc}")
    return RunnerFailure("missing runtime", f"{name} is not importable: {exc}", missing=name)


def is_oom(exc: BaseException) -> bool:
    """Tell whether an exception is an allocation failure.

    Parameters
    ----------
    exc : BaseException

    Returns
    -------
    bool
        True for ``MemoryError`` and for messages in `OOM_MESSAGES`.
    """
    if isinstance(exc, MemoryError):
        return True
    text = (f"{type(exc).__name__} {exc}").lower()
    return any(m in text for m in OOM_MESSAGES)


def matmul_gflops(np, seconds: float = MATMUL_SECONDS, n: int = 256) -> float:
    """Measure numpy's achievable float32 matmul rate.

    Parameters
    ----------
    np : module
        numpy.
    seconds : float
        Approximate probe duration.
    n : int
        Matrix size.

    Returns
    -------
    float
        GFLOP/s (``2 n**3`` per product).
    """
    rng = np.random.default_rng(0)
    a = rng.standard_normal((n, n), dtype=np.float32)
    b = rng.standard_normal((n, n), dtype=np.float32)
    c = np.empty((n, n), dtype=np.float32)
    np.matmul(a, b, out=c)  # warm the BLAS up
    reps = 0
    start = time.perf_counter()
    elapsed = 0.0
    while elapsed < seconds:
        for _ in range(4):
            np.matmul(a, b, out=c)
        reps += 4
        elapsed = time.perf_counter() - start
    return 2.0 * n**3 * reps / elapsed / 1e9


def load_manifest(directory: str, backend: str) -> dict:
    """Read and check an artifact set's manifest for ``backend``.

    Parameters
    ----------
    directory : str
    backend : {"ort", "onnx", "torch"}

    Returns
    -------
    dict

    Raises
    ------
    RunnerFailure
        "bad arguments" when the directory, a needed file or a manifest field is missing.
    """
    if not os.path.isdir(directory):
        raise bad(f"artifacts {directory}: not a directory")
    try:
        with open(os.path.join(directory, "manifest.json")) as handle:
            manifest = json.load(handle)
    except (OSError, ValueError) as exc:
        raise bad(f"artifacts {directory}: no readable manifest.json ({exc})") from None
    needed = {
        "ort": ["training_model.onnx", "optimizer_model.onnx", "checkpoint"],
        "onnx": [STEP_MODEL_FILE],
        "torch": [TORCHSCRIPT_FILE],
    }[backend]
    for name in needed:
        if not os.path.isfile(os.path.join(directory, name)):
            hint = " (export it with exporters.torchscript.export_torchscript)" if name == TORCHSCRIPT_FILE else ""
            raise bad(f"artifacts {directory}: {name} is missing{hint}")
    try:
        inputs = manifest["inputs"]
        int(manifest["batch"])
        int(manifest["num_parameters"])
        [(p["name"], list(p["shape"])) for p in manifest["parameters"]]
        inputs[0]["shape"], inputs[0]["dtype"], inputs[1]["name"]
    except (KeyError, TypeError, ValueError, IndexError) as exc:
        raise bad(f"artifacts {directory}: manifest lacks {exc}") from None
    if num_classes(manifest) is None:
        raise bad(f"artifacts {directory}: manifest does not say num_classes")
    if backend == "onnx":
        spec = manifest.get("step_model")
        try:
            [(t["name"], list(t["shape"]), t["dtype"]) for t in spec["inputs"] + spec["outputs"]]
            [(a, b) for a, b in spec["carry"]]
            spec["parameters"], spec["batch"][1], spec["learning_rate"], spec["loss"]
        except (KeyError, TypeError, ValueError, IndexError) as exc:
            raise bad(f"artifacts {directory}: manifest has no usable step_model entry ({exc!r}); re-export") from None
    return manifest


def variable_batch(manifest: dict) -> bool:
    """Tell whether a set's graphs take a batch of any size.

    Such a set names its inputs' first dimension (``"batch"``) where a set with a fixed
    batch gives its size; its ``batch`` is the batch it was exported and profiled with.

    Parameters
    ----------
    manifest : dict

    Returns
    -------
    bool
    """
    shape = manifest["inputs"][0]["shape"]
    return bool(shape) and isinstance(shape[0], str)


def num_classes(manifest: dict) -> int | None:
    """Return the model's number of classes (also the vocabulary of int64 inputs).

    Parameters
    ----------
    manifest : dict

    Returns
    -------
    int or None
    """
    for source in (manifest, manifest.get("cache_key_inputs") or {}):
        value = source.get("num_classes")
        if isinstance(value, int) and value > 0:
            return value
    return None


def random_batch(np, manifest: dict, seed: int) -> tuple:
    """Build one random training batch from the manifest's input shapes and dtypes.

    Parameters
    ----------
    np : module
    manifest : dict
    seed : int

    Returns
    -------
    x, y : numpy.ndarray
        C-contiguous inputs and int64 labels below ``num_classes``, ``batch`` examples
        (the manifest's: the profiled batch of a set that takes any).
    """
    rng = np.random.default_rng(seed)
    classes = num_classes(manifest)
    spec = manifest["inputs"][0]
    batch = int(manifest["batch"])
    shape = (batch,) + tuple(int(d) for d in spec["shape"][1:])
    if spec["dtype"] in ("int64", "int32"):
        x = rng.integers(0, classes, size=shape).astype(spec["dtype"])
    else:
        x = rng.standard_normal(shape).astype(spec["dtype"])
    y = rng.integers(0, classes, size=(batch,)).astype(np.int64)
    return np.ascontiguousarray(x), np.ascontiguousarray(y)


def import_ort_training() -> tuple:
    """Import ``onnxruntime`` and ``onnxruntime.training.api`` without loading PyTorch.

    onnxruntime-training 1.19 imports PyTorch from ``onnxruntime/__init__``
    (a package check for ORTModule, which tolerates its absence) and from
    ``onnxruntime/training/__init__`` (the torch-only ``optim`` and ``amp``
    helpers, which fail without it), although ``onnxruntime.training.api``
    needs neither. Loading PyTorch into an ORT measurement costs about 2 s of
    start-up and 250 MB of peak memory, and would make the runner fail on devices
    without PyTorch. So ``torch`` is blocked (``sys.modules["torch"] = None``)
    while ORT is imported, unless it is already loaded; when the training package
    then fails on the block, ``onnxruntime.training`` is entered as a bare
    namespace of its directory and only ``api`` is imported from it.

    Returns
    -------
    onnxruntime : module
    api : module
        ``onnxruntime.training.api``.

    Raises
    ------
    RunnerFailure
        "missing runtime" (``missing="onnxruntime.training"``) when either import fails.
    """
    try:
        with torch_blocked() as blocked:
            import onnxruntime

            try:
                from onnxruntime.training import api
            except ImportError:
                if not blocked:
                    raise
                training_dir = os.path.join(os.path.dirname(onnxruntime.__file__), "training")
                if not os.path.isfile(os.path.join(training_dir, "api", "__init__.py")):
                    raise
                package = types.ModuleType("onnxruntime.training")
                package.__path__ = [training_dir]
                package.__package__ = "onnxruntime.training"
                sys.modules["onnxruntime.training"] = package
                from onnxruntime.training import api
    except ImportError as exc:
        raise _import_failure("onnxruntime.training", exc) from None
    return onnxruntime, api


@contextlib.contextmanager
def torch_blocked() -> Iterator[bool]:
    """Make ``import torch`` fail while the block runs, unless torch is already loaded.

    Yields
    ------
    bool
        Whether torch is blocked.
    """
    blocked = "torch" not in sys.modules
    if blocked:
        sys.modules["torch"] = None  # type: ignore[assignment]
    try:
        yield blocked
    finally:
        if blocked and "torch" in sys.modules and sys.modules["torch"] is None:
            del sys.modules["torch"]


def import_onnxruntime():
    """Import ``onnxruntime`` (plain or training build) without loading PyTorch.

    Returns
    -------
    module

    Raises
    ------
    RunnerFailure
        "missing runtime" (``missing="onnxruntime"``) when the import fails.
    """
    try:
        with torch_blocked():
            import onnxruntime
    except ImportError as exc:
        raise _import_failure("onnxruntime", exc) from None
    return onnxruntime


def session_options(onnxruntime, threads: int):
    """Return the runner's ORT session options: ``threads`` intra-op threads, sequential.

    Parameters
    ----------
    onnxruntime : module
    threads : int

    Returns
    -------
    onnxruntime.SessionOptions
    """
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.add_session_config_entry("session.set_denormal_as_zero", "1")
    options.execution_mode = onnxruntime.ExecutionMode.ORT_SEQUENTIAL
    options.log_severity_level = 3
    return options


class OrtBackend:
    """ORT training session over an artifact set (training and optimizer graphs only).

    Parameters
    ----------
    directory : str
    manifest : dict
    threads : int
    lr : float, optional
    """

    name = "onnxruntime"

    def __init__(self, directory: str, manifest: dict, threads: int, lr: float | None = None) -> None:
        onnxruntime, api = import_ort_training()
        self.ort = onnxruntime
        options = session_options(onnxruntime, threads)
        self.state = api.CheckpointState.load_checkpoint(os.path.join(directory, "checkpoint"))
        self.module = api.Module(os.path.join(directory, "training_model.onnx"), self.state, session_options=options)
        self.optimizer = api.Optimizer(os.path.join(directory, "optimizer_model.onnx"), self.module)
        self.initial_lr = self.optimizer.get_learning_rate()
        if lr is not None:
            self.optimizer.set_learning_rate(lr)
        self.module.train()
        self.inputs: tuple = ()
        # The optimizer's state lives inside ORT and cannot be reset: only a stateless (SGD)
        # session may serve a second request.
        self.reusable = manifest.get("optimizer") == "sgd"
        self.initial = None
        if self.reusable:
            import numpy

            self.initial = self.get_flat(numpy)

    mask_names: tuple = ()

    def set_lr(self, lr: float | None) -> None:
        """Use learning rate ``lr`` from the next step on (the set's own when ``None``).

        Parameters
        ----------
        lr : float or None
        """
        self.optimizer.set_learning_rate(self.initial_lr if lr is None else lr)

    def reset(self, lr: float | None) -> None:
        """Return to the set's initial parameters and learning rate ``lr`` (a reused session).

        Parameters
        ----------
        lr : float or None
        """
        import numpy

        self.set_flat(numpy, self.initial)
        self.set_lr(lr)

    def set_masks(self, values: dict) -> None:
        """Refuse masks: the training artifacts have no mask inputs.

        Parameters
        ----------
        values : dict
        """
        raise bad("the ort backend has no mask inputs (SyncDrop masks need the onnx backend's step model)")

    def bind(self, x, y) -> None:
        """Bind input buffers once; later steps read whatever the buffers hold.

        Parameters
        ----------
        x, y : numpy.ndarray
            C-contiguous buffers (shared with the OrtValues, not copied).
        """
        self.inputs = (self.ort.OrtValue.ortvalue_from_numpy(x), self.ort.OrtValue.ortvalue_from_numpy(y))

    def step(self):
        """Run forward, backward and the optimizer on the bound batch.

        Returns
        -------
        object
            The loss, still as ORT returned it (convert with `loss_value`).
        """
        out = self.module(*self.inputs)
        self.optimizer.step()
        self.module.lazy_reset_grad()
        return out

    @staticmethod
    def loss_value(out) -> float:
        """Convert a step's loss to a float.

        Parameters
        ----------
        out : object

        Returns
        -------
        float
        """
        return float(out.numpy() if hasattr(out, "numpy") else out)

    def set_flat(self, np, flat) -> None:
        """Load the flat float32 parameter vector (manifest order).

        Parameters
        ----------
        np : module
        flat : numpy.ndarray
        """
        value = self.ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(flat, dtype=np.float32))
        # ORT 1.19's wrapper passes its argument to C++ as is: it needs the raw C++ OrtValue.
        self.module.copy_buffer_to_parameters(getattr(value, "_ortvalue", value), trainable_only=True)

    def get_flat(self, np):
        """Return a copy of the flat float32 parameter vector.

        Parameters
        ----------
        np : module

        Returns
        -------
        numpy.ndarray
        """
        return np.array(self.module.get_contiguous_parameters(trainable_only=True).numpy(), dtype=np.float32)


class TorchBackend:
    """TorchScript training with the manifest's optimizer and hyper-parameters.

    Parameters
    ----------
    directory : str
    manifest : dict
    threads : int
    lr : float, optional
    """

    name = "torch"

    def __init__(self, directory: str, manifest: dict, threads: int, lr: float | None = None) -> None:
        try:
            import torch
        except ImportError as exc:
            raise _import_failure("torch", exc) from None
        self.torch = torch
        torch.set_num_threads(threads)
        try:
            torch.set_num_interop_threads(1)
        except RuntimeError:  # already set, or parallel work already ran
            pass
        self.manifest = manifest
        self.model = torch.jit.load(os.path.join(directory, TORCHSCRIPT_FILE), map_location="cpu")
        self.model.train()
        named = dict(self.model.named_parameters())
        self.params = []
        for p in manifest["parameters"]:
            tensor = named.get(p["name"])
            if tensor is None or list(tensor.shape) != list(p["shape"]):
                raise bad(f"{TORCHSCRIPT_FILE}: parameter {p['name']} missing or of another shape than the manifest's")
            self.params.append(tensor)
        self.initial = [t.detach().clone() for t in self.params]
        self.reusable = True
        self.optimizer: Any = None
        self._new_optimizer(lr)
        self.loss_fn = torch.nn.CrossEntropyLoss()
        self.x: Any = None
        self.y: Any = None

    mask_names: tuple = ()

    def _new_optimizer(self, lr: float | None) -> None:
        torch, manifest = self.torch, self.manifest
        kind = manifest.get("optimizer", "adamw")
        hyper = dict(manifest.get("optimizer_defaults") or {})
        rate = float(hyper.get("lr", 1e-3) if lr is None else lr)
        if kind == "sgd":
            self.optimizer = torch.optim.SGD(
                self.params,
                lr=rate,
                momentum=float(hyper.get("momentum", 0.0)),
                weight_decay=float(hyper.get("weight_decay", 0.0)),
            )
        elif kind == "adamw":
            betas = hyper.get("betas", [0.9, 0.999])
            self.optimizer = torch.optim.AdamW(
                self.params,
                lr=rate,
                betas=(float(betas[0]), float(betas[1])),
                eps=float(hyper.get("eps", 1e-6)),
                weight_decay=float(hyper.get("weight_decay", 0.0)),
            )
        else:
            raise bad(f"optimizer {kind!r} of the artifact set is not supported by the torch backend")

    def set_lr(self, lr: float | None) -> None:
        """Use learning rate ``lr`` from the next step on (the set's own when ``None``).

        Parameters
        ----------
        lr : float or None
        """
        rate = float((self.manifest.get("optimizer_defaults") or {}).get("lr", 1e-3) if lr is None else lr)
        for group in self.optimizer.param_groups:
            group["lr"] = rate

    def reset(self, lr: float | None) -> None:
        """Return to the initial parameters with a fresh optimizer at ``lr`` (a reused session).

        Parameters
        ----------
        lr : float or None
        """
        with self.torch.no_grad():
            for tensor, initial in zip(self.params, self.initial):  # noqa: B905 - Python 3.8
                tensor.copy_(initial)
        self._new_optimizer(lr)

    def set_masks(self, values: dict) -> None:
        """Refuse masks: TorchScript models have no mask inputs.

        Parameters
        ----------
        values : dict
        """
        raise bad("the torch backend has no mask inputs (SyncDrop masks need the onnx backend's step model)")

    def bind(self, x, y) -> None:
        """Bind input buffers once (shared with numpy, not copied).

        Parameters
        ----------
        x, y : numpy.ndarray
        """
        self.x = self.torch.from_numpy(x)
        self.y = self.torch.from_numpy(y)

    def step(self):
        """Run forward, backward and the optimizer on the bound batch.

        Returns
        -------
        torch.Tensor
            The detached loss.
        """
        self.optimizer.zero_grad(set_to_none=True)
        loss = self.loss_fn(self.model(self.x), self.y)
        loss.backward()
        self.optimizer.step()
        return loss.detach()

    @staticmethod
    def loss_value(out) -> float:
        """Convert a step's loss to a float.

        Parameters
        ----------
        out : torch.Tensor

        Returns
        -------
        float
        """
        return float(out)

    def set_flat(self, np, flat) -> None:
        """Load the flat float32 parameter vector (manifest order).

        Parameters
        ----------
        np : module
        flat : numpy.ndarray
        """
        with self.torch.no_grad():
            for p, tensor in zip(self.manifest["parameters"], self.params):  # noqa: B905 - Python 3.8
                offset, size = int(p["offset"]), int(p["size"])
                chunk = np.ascontiguousarray(flat[offset : offset + size], dtype=np.float32)
                tensor.copy_(self.torch.from_numpy(chunk).reshape(tensor.shape))

    def get_flat(self, np):
        """Return a copy of the flat float32 parameter vector.

        Parameters
        ----------
        np : module

        Returns
        -------
        numpy.ndarray
        """
        parts = [t.detach().cpu().numpy().reshape(-1) for t in self.params]
        return np.concatenate(parts).astype(np.float32) if parts else np.zeros(0, dtype=np.float32)


def sha256_of(path: str) -> str:
    """Return the hex sha256 of a file.

    Parameters
    ----------
    path : str

    Returns
    -------
    str
    """
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _check_listed(directory: str, manifest: dict, name: str) -> str:
    """Return the path of a file of the set after checking it against the manifest's sha256."""
    path = os.path.join(directory, name)
    entry = (manifest.get("files") or {}).get(name)
    if not isinstance(entry, dict) or "sha256" not in entry:
        raise bad(f"artifacts {directory}: the manifest does not list {name}")
    if sha256_of(path) != entry["sha256"]:
        raise bad(f"artifacts {directory}: {name} does not match the manifest's sha256 (not this set's; re-export)")
    return path


_ORT_TYPES = {"float32": "tensor(float)", "int64": "tensor(int64)"}


def _dims(shape) -> list:
    """Return a shape as numbers, and names for the dimensions a run sizes (the batch)."""
    return [d if isinstance(d, str) or d is None else int(d) for d in shape]


class OnnxBackend:
    """The portable step model (``step_model.onnx``) on the plain ``onnxruntime`` package.

    One session runs forward, loss, backward and the optimizer update. Parameters and
    optimizer state live in two sets of ``OrtValue`` buffers, A and B; two IO bindings are
    made once, A -> B and B -> A, and the steps alternate between them, so nothing is
    bound, allocated or copied to the host per step (except the scalar loss when read).
    The manifest's ``step_model`` entry names the inputs and which output feeds which
    input (``carry``, parameters first in flat order); parameters start from the set's
    ``initial_parameters.npy`` (or `set_flat`), optimizer state from zeros.

    Parameters
    ----------
    directory : str
    manifest : dict
    threads : int
    lr : float, optional
        Learning rate; the manifest's ``optimizer_defaults`` one when ``None``.

    Raises
    ------
    RunnerFailure
        "bad arguments" when the step model does not match the manifest (sha256, or its
        inputs and outputs); "missing runtime" without onnxruntime.
    """

    name = "onnx"

    def __init__(self, directory: str, manifest: dict, threads: int, lr: float | None = None) -> None:
        import numpy

        self.np = numpy
        self.ort = import_onnxruntime()
        self.directory = directory
        self.manifest = manifest
        self.spec = manifest["step_model"]
        path = _check_listed(directory, manifest, STEP_MODEL_FILE)
        self.session = self.ort.InferenceSession(
            path, session_options(self.ort, threads), providers=["CPUExecutionProvider"]
        )
        self._check_signature()
        self.specs = {t["name"]: t for t in self.spec["inputs"]}
        self.default_lr = float((manifest.get("optimizer_defaults") or {}).get("lr", 1e-3))
        # numpy arrays that OrtValues share memory with: the learning rate, A's parameters,
        # the batch and the masks (replaced, never accumulated, so a resident runner holds no garbage)
        self.lr_array = numpy.asarray([self.default_lr if lr is None else lr], dtype=numpy.float32)
        self.lr = self.ort.OrtValue.ortvalue_from_numpy(self.lr_array)
        self.flat_array: Any = None
        self.batch_arrays: tuple = ()
        self.carry = [(a, b) for a, b in self.spec["carry"]]
        self.params = list(self.spec["parameters"])
        # Buffers: A holds the inputs of even steps, B their outputs (and the inputs of odd steps).
        self.a: dict = {}
        self.b = {a: self._empty(a) for a, _ in self.carry}
        self.loss = self.ort.OrtValue.ortvalue_from_shape_and_type([], numpy.float32)
        self.bindings: list = []
        self.parity = 0
        # SyncDrop multipliers (FedDrop): one float32 buffer per mask input, ones (dense) by default.
        self.mask_names = tuple(self.spec.get("masks") or ())
        self.mask_arrays = {
            name: numpy.ones([int(d) for d in self.specs[name]["shape"]], dtype=numpy.float32)
            for name in self.mask_names
        }
        self.mask_values = {n: self.ort.OrtValue.ortvalue_from_numpy(a) for n, a in self.mask_arrays.items()}
        self.reusable = True

    def _check_signature(self) -> None:
        want_in = [(t["name"], _dims(t["shape"]), _ORT_TYPES.get(t["dtype"])) for t in self.spec["inputs"]]
        want_out = [(t["name"], _dims(t["shape"]), _ORT_TYPES.get(t["dtype"])) for t in self.spec["outputs"]]
        got_in = [(i.name, _dims(i.shape), i.type) for i in self.session.get_inputs()]
        got_out = [(o.name, _dims(o.shape), o.type) for o in self.session.get_outputs()]
        for what, want, got in (("inputs", want_in, got_in), ("outputs", want_out, got_out)):
            if want != got:
                pairs = zip(want, got)  # noqa: B905 - zip(strict=) needs Python 3.10
                diff = next((f"{w} != {g}" for w, g in pairs if w != g), f"{len(want)} != {len(got)} tensors")
                raise bad(f"artifacts {self.directory}: {STEP_MODEL_FILE} {what} do not match the manifest ({diff})")
        names = [p["name"] for p in self.manifest["parameters"]]
        if list(self.spec["parameters"]) != names or [a for a, _ in self.spec["carry"][: len(names)]] != names:
            raise bad(f"artifacts {self.directory}: {STEP_MODEL_FILE} parameters are not the manifest's")

    def _empty(self, name: str):
        spec = self.specs[name]
        shape = [int(d) for d in spec["shape"]]
        return self.ort.OrtValue.ortvalue_from_shape_and_type(shape, self.np.dtype(spec["dtype"]).type)

    def set_flat(self, np, flat) -> None:
        """Load the flat float32 parameter vector (manifest order); optimizer state restarts from zeros.

        Once bound, the values are copied into the buffers the next step reads (no new
        buffers, the bindings stay); before that, buffer set A is made over a copy of ``flat``.

        Parameters
        ----------
        np : module
        flat : numpy.ndarray
        """
        if self.bindings:
            current = self.a if self.parity == 0 else self.b
            flat = np.ascontiguousarray(flat, dtype=np.float32)
            for p in self.manifest["parameters"]:
                offset, size = int(p["offset"]), int(p["size"])
                current[p["name"]].update_inplace(flat[offset : offset + size].reshape(p["shape"]))
            for name, _ in self.carry[len(self.params) :]:
                spec = self.specs[name]
                current[name].update_inplace(np.zeros([int(d) for d in spec["shape"]], dtype=spec["dtype"]))
            return
        flat = np.array(flat, dtype=np.float32)  # owned: the A buffers share its memory
        self.flat_array = flat
        self.a = {}
        for p in self.manifest["parameters"]:
            offset, size = int(p["offset"]), int(p["size"])
            self.a[p["name"]] = self.ort.OrtValue.ortvalue_from_numpy(flat[offset : offset + size].reshape(p["shape"]))
        for name, _ in self.carry[len(self.params) :]:
            spec = self.specs[name]
            self.a[name] = self.ort.OrtValue.ortvalue_from_shape_and_type(
                [int(d) for d in spec["shape"]], np.dtype(spec["dtype"]).type
            )
            self.a[name].update_inplace(np.zeros([int(d) for d in spec["shape"]], dtype=spec["dtype"]))
        self.parity = 0

    def bind(self, x, y) -> None:
        """Bind the batch buffers and both ping-pong bindings (parameters from the set when none were loaded).

        Parameters
        ----------
        x, y : numpy.ndarray
            C-contiguous buffers (shared with the OrtValues, not copied).
        """
        np = self.np
        if not self.a:
            path = _check_listed(self.directory, self.manifest, INITIAL_PARAMETERS_FILE)
            flat = np.load(path, allow_pickle=False)
            if flat.shape != (int(self.manifest["num_parameters"]),):
                raise bad(f"artifacts {self.directory}: {INITIAL_PARAMETERS_FILE} has shape {flat.shape}")
            self.set_flat(np, flat)
        self.batch_arrays = (x, y)
        to_value = self.ort.OrtValue.ortvalue_from_numpy
        batch = {self.spec["batch"][0]: to_value(x), self.spec["batch"][1]: to_value(y)}
        self.bindings = [self._binding(batch, self.a, self.b), self._binding(batch, self.b, self.a)]

    def _binding(self, batch: dict, source: dict, target: dict):
        binding = self.session.io_binding()
        for name, value in batch.items():
            binding.bind_ortvalue_input(name, value)
        binding.bind_ortvalue_input(self.spec["learning_rate"], self.lr)
        for name, value in self.mask_values.items():
            binding.bind_ortvalue_input(name, value)
        for name, out in self.carry:
            binding.bind_ortvalue_input(name, source[name])
            binding.bind_ortvalue_output(out, target[name])
        binding.bind_ortvalue_output(self.spec["loss"], self.loss)
        return binding

    def set_lr(self, lr: float | None) -> None:
        """Use learning rate ``lr`` from the next step on (the set's own when ``None``).

        Parameters
        ----------
        lr : float or None
        """
        self.lr_array[0] = self.default_lr if lr is None else lr

    def reset(self, lr: float | None) -> None:
        """Forget the parameters and bindings (the next `bind` starts from the set's) and dense masks.

        Parameters
        ----------
        lr : float or None
        """
        self.a = {}
        self.bindings = []
        self.batch_arrays = ()
        self.flat_array = None
        self.parity = 0
        self.set_lr(lr)
        for array in self.mask_arrays.values():
            array[...] = 1.0

    def set_masks(self, values: dict) -> None:
        """Copy SyncDrop multipliers into the mask buffers the next step reads.

        Parameters
        ----------
        values : dict of str to numpy.ndarray
            By mask input name (``mask.<group>``); inputs not named keep their values.
        """
        for name, value in values.items():
            self.mask_arrays[name][...] = value

    def step(self):
        """Run one training step on the bound batch and swap the buffer sets.

        Returns
        -------
        OrtValue
            The loss buffer (convert with `loss_value`).
        """
        self.session.run_with_iobinding(self.bindings[self.parity])
        self.parity ^= 1
        return self.loss

    @staticmethod
    def loss_value(out) -> float:
        """Convert a step's loss to a float.

        Parameters
        ----------
        out : OrtValue

        Returns
        -------
        float
        """
        return float(out.numpy())

    def get_flat(self, np):
        """Return a copy of the flat float32 parameter vector (after the last step).

        Parameters
        ----------
        np : module

        Returns
        -------
        numpy.ndarray
        """
        current = self.a if self.parity == 0 else self.b
        parts = [current[name].numpy().reshape(-1) for name in self.params]
        return np.concatenate(parts).astype(np.float32) if parts else np.zeros(0, dtype=np.float32)


def open_backend(args: argparse.Namespace, manifest: dict, lr: float | None = None):
    """Load the requested backend on the artifact set.

    Parameters
    ----------
    args : argparse.Namespace
    manifest : dict
    lr : float, optional

    Returns
    -------
    OrtBackend, OnnxBackend or TorchBackend
    """
    sessions = getattr(args, "sessions", None)
    if sessions is not None:
        return sessions.open(args, manifest, lr)
    cls = {"ort": OrtBackend, "onnx": OnnxBackend, "torch": TorchBackend}[args.backend]
    return cls(args.artifacts, manifest, args.threads, lr)


# --------------------------------------------------------------------------- sampling


@functools.lru_cache(maxsize=4096)
def median_ci_ranks(n: int, confidence: float = CONFIDENCE) -> tuple | None:
    """Return the ranks of the order statistics that bound the median with ``confidence``.

    For ``n`` independent samples of a continuous distribution with median ``m``, the
    number ``B`` of samples below ``m`` is Binomial(n, 1/2), so
    ``P(x_(k) <= m <= x_(n+1-k)) = 1 - 2 P(B <= k - 1)`` whatever the distribution.

    Parameters
    ----------
    n : int
        Number of samples.
    confidence : float
        Two-sided confidence in (0, 1).

    Returns
    -------
    tuple of int or None
        1-based ranks ``(k, n + 1 - k)`` with the largest ``k`` whose coverage
        ``1 - 2 P(B <= k - 1)`` is at least ``confidence`` (exact integer arithmetic);
        None when even ``[x_(1), x_(n)]`` covers less (``n < 6`` at 95 %).
    """
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence {confidence!r} is outside (0, 1)")
    if n < 1:
        return None
    from fractions import Fraction

    alpha = Fraction(1.0 - confidence).limit_denominator(10**9)
    total = 1 << n  # 2**n
    best = 0
    below = 0  # sum of C(n, i) for i < k
    term = 1  # C(n, k - 1)
    for k in range(1, (n + 1) // 2 + 1):
        below += term
        if 2 * below * alpha.denominator > alpha.numerator * total:
            break
        best = k
        term = term * (n - k + 1) // k
    return (best, n + 1 - best) if best else None


def median_of_sorted(values: list) -> float:
    """Return the median of sorted values (the mean of the two middle ones for even counts).

    Parameters
    ----------
    values : list of float
        Sorted, at least one.

    Returns
    -------
    float
        Equal to ``numpy.percentile(values, 50)`` (linear interpolation).
    """
    n = len(values)
    return 0.5 * (values[(n - 1) // 2] + values[n // 2])


def median_interval(values: list, confidence: float = CONFIDENCE) -> tuple:
    """Return the median of sorted samples, its distribution-free interval and their relative width.

    Parameters
    ----------
    values : list of float
        Sorted samples, at least one.
    confidence : float

    Returns
    -------
    median : float
    low, high : float or None
        The order statistics of `median_ci_ranks` (None when ``n`` is too small).
    half_width : float or None
        ``max(median - low, high - median) / median`` (None without an interval or for a
        median of 0).
    """
    median = median_of_sorted(values)
    ranks = median_ci_ranks(len(values), confidence)
    if ranks is None:
        return median, None, None, None
    low, high = values[ranks[0] - 1], values[ranks[1] - 1]
    half = max(median - low, high - median) / median if median > 0 else None
    return median, low, high, half


def has_settled(times: list, tolerance: float = WARMUP_TOLERANCE) -> bool:
    """Apply the warm-up rule to the step times so far.

    Parameters
    ----------
    times : list of float
        Warm-up step times, in order.
    tolerance : float

    Returns
    -------
    bool
        True from the second step on when the last step is at most ``tolerance`` faster
        than the fastest step before it: ``t[-1] >= (1 - tolerance) * min(t[:-1])``.
    """
    return len(times) >= 2 and times[-1] >= (1.0 - tolerance) * min(times[:-1])


def warm_up(step, clock, max_steps: int, max_seconds: float, tolerance: float = WARMUP_TOLERANCE) -> tuple:
    """Run warm-up steps until the time per step settles (`has_settled`) or a cap is reached.

    Parameters
    ----------
    step : callable
        Runs one training step.
    clock : callable
        Seconds (``time.perf_counter``; injected in tests).
    max_steps : int
        Most steps (0: no warm-up).
    max_seconds : float
        Most seconds; checked after each step.
    tolerance : float

    Returns
    -------
    times : list of float
        Every warm-up step's seconds.
    settled : bool
        Whether the rule ended the warm-up (False when a cap did).
    """
    times: list = []
    start = clock()
    while len(times) < max_steps:
        begin = clock()
        step()
        times.append(clock() - begin)
        if has_settled(times, tolerance):
            return times, True
        if clock() - start >= max_seconds:
            break
    return times, False


def disturbed_samples(
    cpu_seconds: list, limit: float = DISTURBANCE_LIMIT, min_samples: int = DISTURBANCE_MIN_SAMPLES
) -> list:
    """Say which samples ran on a cpu slowed from outside: CPU time per step above ``limit`` x the low quantile.

    Parameters
    ----------
    cpu_seconds : list of float
        CPU time per step of each sample, in order.
    limit : float
        Allowed multiple of the `DISTURBANCE_QUANTILE` quantile (lower order statistic).
    min_samples : int
        With fewer samples, none is judged disturbed.

    Returns
    -------
    list of bool
        One flag per sample.
    """
    if len(cpu_seconds) < min_samples:
        return [False] * len(cpu_seconds)
    ordered = sorted(cpu_seconds)
    low = ordered[int(DISTURBANCE_QUANTILE * (len(ordered) - 1))]
    return [value > limit * low for value in cpu_seconds]


def sample_steps(
    step,
    clock,
    *,
    min_samples: int,
    precision: float,
    max_seconds: float,
    sample_seconds: float = 0.0,
    loss_of=float,
    confidence: float = CONFIDENCE,
    max_samples: int = MAX_SAMPLES,
    cpu_clock=None,
    judge_disturbed: bool = False,
) -> dict:
    """Take timed samples until the median's interval is within ``precision`` or a cap is reached.

    Each sample times consecutive steps until at least ``sample_seconds`` have passed (one
    step when 0) and records the time per step. After a sample (every one up to
    `CHECK_EVERY_SAMPLE_UP_TO`, then every 5 % more), with at least ``min_samples``
    samples, the run stops when `median_interval` is within ``precision``; it also stops
    when ``max_seconds`` have passed since the call or ``max_samples`` were taken.
    ``precision == 0`` takes exactly ``min_samples`` samples (no test, no cap).

    Parameters
    ----------
    step : callable
        Runs one training step and returns its output.
    clock : callable
        Seconds.
    min_samples : int
        Fewest samples (at least 1).
    precision : float
        Target relative half-width of the interval (0: fixed count).
    max_seconds : float
        Cap on this call's wall time.
    sample_seconds : float
        Minimum seconds per sample.
    loss_of : callable
        Turns a step's output into a float (called outside the timed region).
    confidence : float
    max_samples : int
    cpu_clock : callable, optional
        CPU seconds of the process (`time.process_time`); when given, each sample's CPU
        time per step is recorded too.
    judge_disturbed : bool
        Leave `disturbed_samples` out of the median and the stopping rule (needs ``cpu_clock``).

    Returns
    -------
    dict
        ``seconds`` (time per step of each sample), ``cpu_seconds`` (CPU time per step of
        each sample; empty without ``cpu_clock``), ``disturbed`` (a flag per sample; empty
        unless judged), ``steps_per_sample``, ``loss``, ``stop_reason``, ``median``,
        ``low``, ``high``, ``half_width`` (of the final undisturbed samples; None where
        undefined), ``elapsed``.
    """
    judge = judge_disturbed and cpu_clock is not None

    def counted() -> tuple:
        """Return the disturbance flags (empty unless judged) and the sorted samples that count."""
        if not judge:
            return [], ordered
        flags = disturbed_samples(cpu_seconds)
        return flags, sorted(value for value, flag in zip(seconds, flags) if not flag)  # noqa: B905 - Python 3.8

    seconds: list = []
    cpu_seconds: list = []
    ordered: list = []
    counts: list = []
    losses: list = []
    start = clock()
    next_check = min_samples
    reason = "steps"
    while True:
        cpu_begin = cpu_clock() if cpu_clock is not None else 0.0
        count, begin = 0, clock()
        while True:
            out = step()
            count += 1
            elapsed = clock() - begin
            if elapsed >= sample_seconds:
                break
        if cpu_clock is not None:
            cpu_seconds.append((cpu_clock() - cpu_begin) / count)
        value = elapsed / count
        seconds.append(value)
        bisect.insort(ordered, value)
        counts.append(count)
        losses.append(loss_of(out))
        n = len(seconds)
        if precision <= 0:
            if n >= min_samples:
                break
            continue
        if n >= next_check:
            half = median_interval(counted()[1], confidence)[3]
            if half is not None and half <= precision:
                reason = "precision"
                break
            next_check = n + 1 if n < CHECK_EVERY_SAMPLE_UP_TO else n + max(1, n // 20)
        if clock() - start >= max_seconds:
            reason = "time cap"
            break
        if n >= max_samples:
            reason = "sample cap"
            break
    flags, values = counted()
    median, low, high, half = median_interval(values, confidence)
    return {
        "seconds": seconds,
        "cpu_seconds": cpu_seconds,
        "disturbed": flags,
        "steps_per_sample": counts,
        "loss": losses,
        "stop_reason": reason,
        "median": median,
        "low": low,
        "high": high,
        "half_width": half,
        "elapsed": clock() - start,
    }


def cpus_available() -> int | None:
    """Return how many cpus this process may run on (its affinity mask, else the cpu count).

    Returns
    -------
    int or None
    """
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count()


def load_average() -> list:
    """Return the 1, 5 and 15 minute load averages (empty where the system has none).

    Returns
    -------
    list of float
    """
    try:
        return [round(v, 2) for v in os.getloadavg()]
    except (AttributeError, OSError):
        return []


# --------------------------------------------------------------------------- modes


def _check_common(args: argparse.Namespace) -> None:
    if args.threads < 1:
        raise bad(f"--threads must be at least 1, got {args.threads}")


def _before(result: dict) -> dict:
    freq = cpu_frequencies_khz()
    temps, passive = thermal_zones()
    result["cpu_freq_khz"]["before"] = freq
    result["thermal_c"]["before"] = temps
    return passive


def _after(result: dict, passive: dict) -> None:
    freq = cpu_frequencies_khz()
    temps, passive_now = thermal_zones()
    result["cpu_freq_khz"]["after"] = freq
    result["thermal_c"]["after"] = temps
    for key, trips in passive_now.items():
        passive.setdefault(key, trips)
    result["throttled"] = throttled(result["cpu_freq_khz"]["before"], freq, temps, passive)


class BatchFeed:
    """A shard and the input buffers a backend binds once, filled with each step's batch.

    ``train`` and ``bench`` step through it alike, so a profile times the step a round runs.
    An epoch's short last batch (``train`` on a set that takes any batch) fills the leading
    rows of the same buffers.

    Parameters
    ----------
    np : module
    x, y : numpy.ndarray
        The shard's inputs and int64 labels.
    batch : int
        The artifact set's batch.
    """

    def __init__(self, np, x, y, batch: int) -> None:
        self.np, self.x, self.y, self.batch = np, x, y, batch
        self.xb = np.empty((batch,) + x.shape[1:], dtype=x.dtype)
        self.yb = np.empty((batch,), dtype=np.int64)

    def load(self, index) -> tuple:
        """Copy the examples at ``index`` (at most ``batch`` positions) into the buffers.

        Returns
        -------
        x, y : numpy.ndarray
            The buffers holding them: the bound ones for a full batch, else views of their
            leading rows (C-contiguous, sharing their memory).
        """
        n = len(index)
        xb, yb = (self.xb, self.yb) if n == self.batch else (self.xb[:n], self.yb[:n])
        self.np.take(self.x, index, axis=0, out=xb)
        self.np.take(self.y, index, axis=0, out=yb)
        return xb, yb


def epoch_orders(np, n: int, seed: int) -> Iterator:
    """Yield the order of a shard's ``n`` examples for each epoch, as ``train`` visits them.

    Parameters
    ----------
    np : module
    n : int
        Examples in the shard.
    seed : int
        ``--seed``.

    Yields
    ------
    numpy.ndarray
        One permutation of ``range(n)`` per epoch from ``numpy.random.default_rng(seed)``.
    """
    rng = np.random.default_rng(seed)
    while True:
        yield rng.permutation(n)


def shard_batches(np, n: int, batch: int, seed: int) -> Iterator:
    """Yield the index arrays of the full batches of ``train``'s epochs, epoch after epoch, without end.

    Parameters
    ----------
    np : module
    n : int
        Examples in the shard (at least ``batch``).
    batch : int
    seed : int

    Yields
    ------
    numpy.ndarray
        ``batch`` example indices. An epoch's short last batch is skipped: ``bench`` times
        steps of the set's batch (``train`` trains the short batch too where the set takes it).
    """
    for order in epoch_orders(np, n, seed):
        for b in range(n // batch):
            yield order[b * batch : (b + 1) * batch]


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
    _check_common(args)
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
        shard = _cached(args, "shard", args.data, lambda: _load_shard(np, args.data, manifest))
        x, y = _check_shard(args.data, shard, batch, manifest)
        feed = BatchFeed(np, x, y, batch)
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
    passive = _before(result)
    result["loadavg"]["before"] = load_average()
    result["cpus_available"] = cpus_available()
    clock = time.perf_counter
    start = clock()
    warm, settled = warm_up(step, clock, args.warmup, WARMUP_SHARE * args.max_seconds)
    result.update(warmup_steps=len(warm), warmup_seconds=warm, warmup_settled=settled)
    sampled = sample_steps(
        step,
        clock,
        min_samples=args.steps,
        precision=args.precision,
        max_seconds=max(0.0, args.max_seconds - (clock() - start)),
        sample_seconds=args.sample_seconds,
        loss_of=backend.loss_value,
        cpu_clock=time.process_time,
        judge_disturbed=args.threads == 1,
    )
    result["timed_seconds"] = clock() - start
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
    _after(result, passive)
    # After the timed steps: BLAS worker threads keep spinning for a while after a matmul
    # and would compete with the runtime's threads for the first steps.
    if args.matmul_seconds > 0:
        result["matmul_gflops"] = matmul_gflops(np, seconds=args.matmul_seconds)


def _load_params(np, path: str, size: int):
    try:
        flat = np.load(path, allow_pickle=False)
    except (OSError, ValueError) as exc:
        if is_oom(exc):
            raise
        raise bad(f"--params {path}: not a readable .npy ({exc})") from None
    if flat.ndim != 1 or flat.size != size or flat.dtype.kind != "f":
        raise bad(f"--params {path}: shape {flat.shape} dtype {flat.dtype}, the set needs float32 ({size},)")
    return np.ascontiguousarray(flat, dtype=np.float32)


def _load_shard(np, path: str, manifest: dict):
    spec = manifest["inputs"][0]
    try:
        with np.load(path, allow_pickle=False) as data:
            if "x" not in data or "y" not in data:
                raise bad(f"--data {path}: needs arrays x and y, has {sorted(data.keys())}")
            x, y = data["x"], data["y"]
    except (OSError, ValueError, EOFError) as exc:
        if is_oom(exc):
            raise
        raise bad(f"--data {path}: not a readable .npz ({exc})") from None
    want = [int(d) for d in spec["shape"][1:]]
    if list(x.shape[1:]) != want or y.shape != (x.shape[0],):
        raise bad(f"--data {path}: x {x.shape} / y {y.shape} do not fit inputs (N, {want}) and labels (N,)")
    if y.dtype.kind not in "iu":
        raise bad(f"--data {path}: labels y must be integers, got {y.dtype}")
    return x.astype(spec["dtype"], copy=False), y.astype(np.int64, copy=False)


def _check_shard(path: str, shard: tuple, batch: int, manifest: dict, whole: bool = True) -> tuple:
    """Return ``shard`` (x, y) when it holds a batch (any example unless ``whole``) and its labels are classes."""
    x, y = shard
    if x.shape[0] < (batch if whole else 1):
        raise bad(
            f"--data {path}: {x.shape[0]} examples, fewer than one batch of {batch}"
            if whole
            else f"--data {path}: no examples"
        )
    if y.size and (int(y.min()) < 0 or int(y.max()) >= num_classes(manifest)):  # type: ignore[operator]
        raise bad(f"--data {path}: labels outside [0, {num_classes(manifest)})")
    return x, y


def _save_atomic(np, path: str, flat) -> None:
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".runner-", suffix=".npy")
    try:
        with os.fdopen(fd, "wb") as handle:
            np.save(handle, flat, allow_pickle=False)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _decode_inline(np, text, size: int):
    """Decode ``params_inline`` (base64 of little-endian float32) into a vector of ``size`` values."""
    if not isinstance(text, str):
        raise bad("params_inline must be a base64 string")
    try:
        raw = base64.b64decode(text.encode("ascii"), validate=True)
    except (ValueError, UnicodeEncodeError) as exc:
        raise bad(f"params_inline: not base64 ({exc})") from None
    if len(raw) != 4 * size:
        raise bad(f"params_inline: {len(raw)} bytes, the set needs {4 * size} (float32 x {size})")
    return np.frombuffer(raw, dtype="<f4").astype(np.float32)


def encode_inline(np, flat) -> str:
    """Return a flat parameter vector as ``params_inline`` text: base64 of little-endian float32.

    Parameters
    ----------
    np : module
    flat : numpy.ndarray

    Returns
    -------
    str
    """
    return base64.b64encode(np.ascontiguousarray(flat, dtype="<f4").tobytes()).decode("ascii")


def _cached(args: argparse.Namespace, kind: str, path: str, load):
    """Return ``load()``, kept by the serving runner per file (path, size, mtime) between requests."""
    store = getattr(args, "files", None)
    if store is None:
        return load()
    try:
        info = os.stat(path)
    except OSError:
        return load()
    return store.get((kind, os.path.realpath(path), info.st_size, info.st_mtime_ns), load)


def _load_index(np, path: str, size: int, outer: int):
    try:
        index = np.load(path, allow_pickle=False)
    except (OSError, ValueError) as exc:
        raise bad(f"fjord index {path}: not a readable .npy ({exc})") from None
    if index.shape != (size,) or index.dtype.kind not in "iu":
        raise bad(f"fjord index {path}: shape {index.shape} dtype {index.dtype}, needs integers ({size},)")
    if size and (int(index.min()) < 0 or int(index.max()) >= outer):
        raise bad(f"fjord index {path}: positions outside the {outer} parameters")
    return index.astype(np.int64, copy=False)


def _train_plan(args: argparse.Namespace, outer_size: int, np) -> tuple:
    """Return the artifact sets a train request trains (FjORD: one per width) and their index arrays.

    Returns
    -------
    sets : list of str
    manifests : list of dict
    index : list of numpy.ndarray or None
        Positions of each set's flat parameters in the request's flat vector (None: the same layout).
    """
    fjord = getattr(args, "fjord", None)
    if fjord is None:
        return [args.artifacts], [load_manifest(args.artifacts, args.backend)], [None]
    if not isinstance(fjord, dict) or not isinstance(fjord.get("sets"), list) or not fjord["sets"]:
        raise bad("fjord must be an object with a non-empty list of artifact sets")
    sets = [str(d) for d in fjord["sets"]]
    paths = fjord.get("index") or [None] * len(sets)
    if not isinstance(paths, list) or len(paths) != len(sets):
        raise bad(f"fjord: {len(sets)} sets need {len(sets)} index entries (null for the request's own layout)")
    manifests = [load_manifest(d, args.backend) for d in sets]
    index: list = []
    for directory, manifest, path in zip(sets, manifests, paths):  # noqa: B905 - Python 3.8
        size = int(manifest["num_parameters"])
        if path is None:
            if size != outer_size:
                raise bad(f"fjord: set {directory} has {size} parameters, the request {outer_size}; give an index")
            index.append(None)
        else:
            load = lambda p=str(path), n=size: _load_index(np, p, n, outer_size)  # noqa: E731
            index.append(_cached(args, "index", str(path), load))
    return sets, manifests, index


def _syncdrop_plan(np, syncdrop, mask_names: tuple) -> tuple:
    """Check a ``syncdrop`` request entry; return (sync seed, scale, [(keep, mask input or None)] per group)."""
    if not isinstance(syncdrop, dict) or not isinstance(syncdrop.get("groups"), list):
        raise bad("syncdrop must be an object with sync_seed, scale and groups [[name, [keep...]], ...]")
    try:
        seed = int(syncdrop.get("sync_seed", 0))
        groups = [(str(name), np.asarray(keep, dtype=np.float64).reshape(-1)) for name, keep in syncdrop["groups"]]
    except (TypeError, ValueError) as exc:
        raise bad(f"syncdrop: malformed ({exc})") from None
    plan: list = []
    for name, keep in groups:
        if not keep.size or not np.all((keep > 0) & (keep <= 1)):
            raise bad(f"syncdrop: keep probabilities of {name!r} must be values in (0, 1]")
        mask: str | None = "mask." + name
        if mask not in mask_names:
            if np.any(keep < 1):
                raise bad(f"syncdrop: group {name!r} drops neurons but the step model has no input {mask!r}")
            mask = None
        plan.append((keep, mask))
    return seed, bool(syncdrop.get("scale", True)), plan


def run_train(args: argparse.Namespace, result: dict) -> None:
    """Train ``epochs`` epochs over a shard from given parameters; fill ``result``.

    Plain requests train one artifact set. A serving runner's request may add ``fjord``
    (a width drawn per step, `_train_plan`) or ``syncdrop`` (FedDrop masks per step), and
    take and return the parameters inline; see the module docstring.

    Parameters
    ----------
    args : argparse.Namespace
    result : dict
    """
    clock = time.perf_counter
    started = clock()
    result.update(
        warmup=0, steps=0, epochs=args.epochs, lr=args.lr, examples=0, step_examples=[], num_parameters=None, out=None
    )
    _check_common(args)
    inline_in = getattr(args, "params_inline", None)
    inline_out = getattr(args, "return_params", None) == "inline"
    fjord, syncdrop = getattr(args, "fjord", None), getattr(args, "syncdrop", None)
    if args.epochs < 1:
        raise bad(f"--epochs must be at least 1, got {args.epochs}")
    if not (math.isfinite(args.lr) and args.lr > 0):
        raise bad(f"--lr must be a positive number, got {args.lr!r}")
    if (args.params is None) == (inline_in is None):
        raise bad("train needs exactly one of --params FILE and (serving) params_inline")
    if args.out is None and not inline_out:
        raise bad("train needs --out FILE (or, serving, return_params: inline)")
    if args.out is not None:
        out_dir = os.path.dirname(os.path.abspath(args.out))
        if not os.path.isdir(out_dir):
            raise bad(f"--out {args.out}: directory {out_dir} does not exist")
    if fjord is not None and syncdrop is not None:
        raise bad("a request trains either fjord widths or syncdrop masks, not both")
    manifest = load_manifest(args.artifacts, args.backend)
    batch = int(manifest["batch"])
    size = int(manifest["num_parameters"])
    result["batch"] = batch
    result["num_parameters"] = size
    if args.batch is not None and args.batch != batch:
        raise bad(f"--batch {args.batch}: the artifact set's batch is {batch}")
    np = import_numpy(args.threads)
    outer = _decode_inline(np, inline_in, size) if inline_in is not None else _load_params(np, args.params, size)
    outer = np.array(outer, dtype=np.float32)
    sets, manifests, index = _train_plan(args, size, np)
    for directory, other in zip(sets, manifests):  # noqa: B905 - Python 3.8
        if int(other["batch"]) != batch or other["inputs"][0] != manifest["inputs"][0]:
            raise bad(f"fjord: set {directory} has another batch or input than {args.artifacts}")
    x, y = _cached(args, "shard", args.data, lambda: _load_shard(np, args.data, manifest))
    variable = variable_batch(manifest)
    _check_shard(args.data, (x, y), batch, manifest, whole=not variable)
    backends = []
    for directory, other in zip(sets, manifests):  # noqa: B905 - Python 3.8
        backend = open_backend(argparse.Namespace(**{**vars(args), "artifacts": directory}), other, lr=args.lr)
        backend.set_lr(args.lr)
        backends.append(backend)
    plan = None
    if syncdrop is not None:
        plan = _syncdrop_plan(np, syncdrop, backends[0].mask_names)
        if not backends[0].mask_names:
            raise bad(f"syncdrop needs a step model with mask inputs (onnx backend); {args.artifacts} has none")
    feed = BatchFeed(np, x, y, batch)
    bound: set = set()

    def switch(leave, enter) -> None:
        """Write the trained width back into the outer vector and load the next one."""
        if leave is not None:
            values = backends[leave].get_flat(np)
            if index[leave] is None:
                outer[:] = values
            else:
                outer[index[leave]] = values
        if enter is not None:
            backends[enter].set_flat(np, outer if index[enter] is None else outer[index[enter]])
            if enter not in bound:
                backends[enter].bind(feed.xb, feed.yb)
                bound.add(enter)

    switch(None, 0 if fjord is None else None)
    orders = epoch_orders(np, x.shape[0], args.seed)
    width_rng = np.random.default_rng((args.seed, 1))
    per_pass = -(-x.shape[0] // batch)  # batches per epoch in process, the short last one included
    seconds, losses, sizes = result["step_seconds"], result["loss"], result["step_examples"]
    switches, picks, mask_means = [], [], []
    mask_seconds = 0.0
    current = None if fjord is not None else 0
    result["load_seconds"] = clock() - started
    passive = _before(result)
    loop_started, loop_cpu_started = clock(), time.process_time()
    for epoch in range(args.epochs):
        order = next(orders)
        for b in range(per_pass):
            # Draws happen for every in-process batch, also a short last one that a fixed-batch
            # graph cannot take, so widths and masks stay those of in-process training step by step.
            pick = int(width_rng.integers(len(backends))) if fjord is not None else 0
            step_index = epoch * per_pass + b
            rows = order[b * batch : (b + 1) * batch]
            short = len(rows) < batch
            if short and not variable:
                continue
            if pick != current:
                start = clock()
                switch(current, pick)
                if current is None:  # the first width's parameters: part of the request's load
                    result["load_seconds"] += clock() - start
                else:
                    switches.append(clock() - start)
                current = pick
            if plan is not None:
                start = clock()
                means = _apply_masks(np, backends[0], plan, step_index)
                mask_seconds += clock() - start
                mask_means.append(means)
            backend = backends[current]
            start = clock()
            xb, yb = feed.load(rows)
            if short:  # the backend takes the leading rows of its buffers for this step only
                backend.bind(xb, yb)
            out = backend.step()
            if short:
                backend.bind(feed.xb, feed.yb)
            elapsed = clock() - start
            seconds.append(elapsed)
            losses.append(backend.loss_value(out))
            picks.append(current)
            sizes.append(len(rows))
    result["loop_cpu_seconds"], result["loop_seconds"] = time.process_time() - loop_cpu_started, clock() - loop_started
    _after(result, passive)
    start = clock()
    switch(current, None)
    result["steps"] = len(seconds)
    result["examples"] = sum(sizes)
    if fjord is not None:
        result["step_sets"] = picks
        result["switch_seconds"] = switches
        widths = fjord.get("widths")
        if isinstance(widths, list) and len(widths) == len(sets):
            result["step_widths"] = [widths[i] for i in picks]
    if plan is not None:
        result["mask_means"] = mask_means
        result["mask_seconds"] = mask_seconds
    if inline_out:
        result["params_inline"] = encode_inline(np, outer)
    if args.out is not None:
        _save_atomic(np, args.out, outer)
        result["out"] = args.out
    result["save_seconds"] = clock() - start


def _apply_masks(np, backend, plan: tuple, step: int) -> list:
    """Draw one step's SyncDrop masks as `fl.feddrop` does and load them; return the kept fraction per group.

    The thresholds ``t ~ U(0, 1)`` of every group come from one ``default_rng((sync_seed, step))``
    in group order; a channel is kept when ``t < p`` and scaled by ``1 / p`` (or by 1 unscaled).
    """
    seed, scale, groups = plan
    rng = np.random.default_rng((seed, step))
    values, means = {}, []
    for keep, mask in groups:
        kept = rng.random(keep.size) < keep
        means.append(float(kept.mean()))
        if mask is not None:
            values[mask] = np.where(kept, 1.0 / keep, 0.0) if scale else kept.astype(np.float64)
    backend.set_masks(values)
    return means


# --------------------------------------------------------------------------- entry point


def _finite(value):
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def run(argv: list) -> dict:
    """Run the runner on ``argv`` and return its JSON document (never raises for failures).

    Parameters
    ----------
    argv : list of str
        Arguments after the program name.

    Returns
    -------
    dict
        The document; ``EXIT_CODES[doc["status"]]`` is the exit status.
    """
    result = new_result()

    def work() -> None:
        args = build_parser().parse_args(argv)
        if args.mode is None:
            raise bad("a mode is required: bench, train or serve")
        if args.mode == "serve":
            raise bad("serve is resident: start it as the program (runner.py serve), not through run()")
        _run_mode(args, result)

    return _guarded(result, work)


def _run_mode(args: argparse.Namespace, result: dict) -> None:
    result.update(mode=args.mode, backend=args.backend, threads=args.threads, seed=args.seed)
    result["flush_denormals"] = flush_denormals()
    if args.mode == "bench":
        run_bench(args, result)
    else:
        run_train(args, result)


def _guarded(result: dict, work) -> dict:
    """Run ``work()``; whatever happens, finish ``result`` (status, error, peak memory, versions)."""
    try:
        work()
        result["status"] = "ok"
    except RunnerFailure as exc:
        result["status"], result["error"], result["missing"] = exc.status, str(exc), exc.missing
    except SystemExit as exc:  # --help
        result["status"] = "ok" if not exc.code else "bad arguments"
        result["mode"] = "help"
    except BaseException as exc:  # noqa: BLE001 - the document must come out whatever happened
        traceback.print_exc(file=sys.stderr)
        result["status"] = "out of memory" if is_oom(exc) else "runner error"
        result["error"] = f"{type(exc).__name__}: {exc}"
        if isinstance(exc, KeyboardInterrupt):
            result["error"] = "interrupted"
    result["peak_memory_bytes"], result["peak_memory_source"] = peak_memory()
    versions(result)
    return _finite(result)


# --------------------------------------------------------------------------- serve


class Lru:
    """A small least-recently-used map: ``get(key, make)`` returns the kept value or keeps ``make()``.

    Parameters
    ----------
    limit : int
        Values kept; the least recently used is dropped beyond it.
    """

    def __init__(self, limit: int) -> None:
        self.limit = max(1, int(limit))
        self.entries: collections.OrderedDict = collections.OrderedDict()

    def get(self, key, make):
        """Return the value of ``key``, making and keeping it when absent.

        Parameters
        ----------
        key : hashable
        make : callable

        Returns
        -------
        object
        """
        if key in self.entries:
            self.entries.move_to_end(key)
            return self.entries[key]
        value = make()
        self.put(key, value)
        return value

    def put(self, key, value) -> None:
        """Keep ``value`` under ``key`` as the most recently used.

        Parameters
        ----------
        key : hashable
        value : object
        """
        self.entries[key] = value
        self.entries.move_to_end(key)
        while len(self.entries) > self.limit:
            self.entries.popitem(last=False)


class SessionCache:
    """The serving runner's open backends, one per (backend, artifact set, threads, set content).

    A reused backend is `reset` (the set's initial parameters, the request's learning rate,
    dense masks), so a request's document is the same as a fresh process's; an ``ort``
    session over an AdamW set is never reused (its optimizer state cannot be reset) and
    costs its open on every request.

    Parameters
    ----------
    limit : int
        Open backends kept.
    """

    def __init__(self, limit: int) -> None:
        self.kept = Lru(limit)
        self.stats = {"opened": 0, "reused": 0, "open_seconds": 0.0}

    def begin(self) -> None:
        """Start counting a new request's opens and reuses."""
        self.stats = {"opened": 0, "reused": 0, "open_seconds": 0.0}

    def open(self, args: argparse.Namespace, manifest: dict, lr: float | None):
        """Return a ready backend for ``args.artifacts``, reused when one is kept.

        Parameters
        ----------
        args : argparse.Namespace
        manifest : dict
        lr : float or None

        Returns
        -------
        OrtBackend, OnnxBackend or TorchBackend
        """
        files = json.dumps(manifest.get("files") or {}, sort_keys=True)
        key = (args.backend, os.path.realpath(args.artifacts), int(args.threads), files)
        backend = self.kept.entries.get(key)
        if backend is not None:
            self.kept.get(key, lambda: backend)
            backend.reset(lr)
            self.stats["reused"] += 1
            return backend
        start = time.perf_counter()
        cls: Any = {"ort": OrtBackend, "onnx": OnnxBackend, "torch": TorchBackend}[args.backend]
        backend = cls(args.artifacts, manifest, args.threads, lr)
        self.stats["open_seconds"] += time.perf_counter() - start
        self.stats["opened"] += 1
        if backend.reusable:
            self.kept.put(key, backend)
        return backend


def reset_peak_memory() -> bool:
    """Reset the process's peak resident set (VmHWM) to its current size.

    Writes ``5`` to ``/proc/self/clear_refs`` (Linux 4.0+); VmHWM then measures from now.

    Returns
    -------
    bool
        Whether the reset worked (else VmHWM is the peak since the process started).
    """
    try:
        with open("/proc/self/clear_refs", "w") as handle:
            handle.write("5")
        return True
    except OSError:
        return False


class Server:
    """The serving runner's state: defaults, open sessions and files kept between requests.

    Parameters
    ----------
    threads : int
        The default ``threads`` of requests (numpy's BLAS keeps this count for the process).
    backend : str or None
        The default ``backend`` of requests.
    max_sessions : int
    """

    def __init__(self, threads: int, backend: str | None, max_sessions: int) -> None:
        self.threads = threads
        self.backend = backend
        self.sessions = SessionCache(max_sessions)
        self.files = Lru(max(4, 2 * max_sessions))
        self.requests = 0

    def namespace(self, request: dict, mode: str) -> argparse.Namespace:
        """Turn a request into the namespace of its mode (keys are the options, ``_`` for ``-``).

        Parameters
        ----------
        request : dict
        mode : str

        Returns
        -------
        argparse.Namespace

        Raises
        ------
        RunnerFailure
            "bad arguments" on an unknown key or a value that is not a number or a string.
        """
        argv = [mode]
        options = dict(request)
        options.setdefault("threads", self.threads)
        if self.backend is not None:
            options.setdefault("backend", self.backend)
        for key, value in options.items():
            if key in SERVE_KEYS or value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float, str)):
                raise bad(f"request key {key!r}: expected a number or a string, got {value!r}")
            argv += ["--" + key.replace("_", "-"), str(value)]
        args = build_parser().parse_args(argv)
        for key in ("params_inline", "return_params", "fjord", "syncdrop"):
            setattr(args, key, request.get(key))
        args.sessions, args.files = self.sessions, self.files
        return args

    def handle(self, raw: bytes) -> dict:
        """Answer one request line (never raises).

        Parameters
        ----------
        raw : bytes
            The line as read.

        Returns
        -------
        dict
            The reply document.
        """
        start = time.perf_counter()
        self.requests += 1
        result = new_result()
        result["id"] = None
        result["peak_memory_scope"] = "request" if reset_peak_memory() else "process"
        self.sessions.begin()

        def work() -> None:
            try:
                request = json.loads(raw.decode("utf-8"))
            except ValueError as exc:
                raise bad(f"request {self.requests}: not JSON ({exc})") from None
            if not isinstance(request, dict):
                raise bad(f"request {self.requests}: not a JSON object")
            result["id"] = request.get("id")
            mode = request.get("mode")
            result["mode"] = mode
            if mode in ("ping", "exit"):
                return
            if mode not in ("bench", "train"):
                raise bad(f"request {self.requests}: mode {mode!r} is not bench, train, ping or exit")
            _run_mode(self.namespace(request, mode), result)
            result["sessions"] = dict(self.sessions.stats)

        doc = _guarded(result, work)
        doc["request_seconds"] = time.perf_counter() - start
        return doc


def serve(argv: list, out) -> int:
    """Serve requests from stdin until its end or an ``exit`` request (see the module docstring).

    Parameters
    ----------
    argv : list of str
        ``serve`` and its options.
    out : file
        Where replies go (the real stdout; file descriptor 1 points at stderr meanwhile).

    Returns
    -------
    int
        0 after ``exit`` or the end of stdin; the status's exit code when start-up failed.
    """
    start = time.perf_counter()
    ready = new_result()
    ready.update(mode="serve", event="ready", protocol=PROTOCOL_VERSION, pid=os.getpid())
    server = None

    def work() -> None:
        nonlocal server
        args = build_parser().parse_args(argv)
        if args.threads < 1 or args.max_sessions < 1:
            raise bad(f"--threads and --max-sessions must be at least 1, got {args.threads}, {args.max_sessions}")
        ready.update(threads=args.threads, backend=args.backend, max_sessions=args.max_sessions)
        if args.cwd is not None:
            try:
                os.chdir(args.cwd)
            except OSError as exc:
                raise bad(f"--cwd {args.cwd}: {exc.strerror or exc}") from None
        ready["cwd"] = os.getcwd()
        import_numpy(args.threads)
        if args.backend == "ort":
            import_ort_training()
        elif args.backend == "onnx":
            import_onnxruntime()
        elif args.backend == "torch":
            try:
                import torch  # noqa: F401
            except ImportError as exc:
                raise _import_failure("torch", exc) from None
        server = Server(args.threads, args.backend, args.max_sessions)

    ready = _guarded(ready, work)
    ready["peak_memory_scope"] = "request" if reset_peak_memory() else "process"
    ready["startup_seconds"] = time.perf_counter() - start
    _reply(out, ready)
    if server is None:
        return EXIT_CODES.get(ready["status"], 5)
    stdin = sys.stdin.buffer
    while True:
        raw = stdin.readline()
        if not raw:
            return 0
        if not raw.strip():
            continue
        doc = server.handle(raw)
        _reply(out, doc)
        if doc.get("mode") == "exit" or doc.get("error") == "interrupted":
            return 0


def _reply(out, doc: dict) -> None:
    out.write(json.dumps(doc, allow_nan=False) + "\n")
    out.flush()


def main(argv: list | None = None) -> int:
    """Command-line entry point: print one JSON document on stdout, return the exit status.

    File descriptor 1 is pointed at stderr while the runner works, so that
    nothing a library prints can corrupt the document; ``serve`` keeps it so for its whole
    life and writes its replies to the saved descriptor.

    Parameters
    ----------
    argv : list of str, optional
        Defaults to ``sys.argv[1:]``.

    Returns
    -------
    int
        0 ok, 2 bad arguments, 3 missing runtime, 4 out of memory, 5 runner error.
    """
    argv = sys.argv[1:] if argv is None else argv
    sys.stdout.flush()
    saved = None
    try:
        saved = os.dup(1)
        os.dup2(2, 1)
    except OSError:
        saved = None
    real_stdout = sys.stdout
    sys.stdout = sys.stderr
    try:
        if argv[:1] == ["serve"]:
            replies = os.fdopen(os.dup(saved), "w", encoding="utf-8") if saved is not None else real_stdout
            try:
                return serve(argv, replies)
            finally:
                replies.flush()
        doc = run(argv)
    finally:
        sys.stdout = real_stdout
        sys.stderr.flush()
        if saved is not None:
            os.dup2(saved, 1)
            os.close(saved)
    text = json.dumps(doc, allow_nan=False)
    sys.stdout.write(text + "\n")
    sys.stdout.flush()
    return EXIT_CODES.get(doc["status"], 5)


if __name__ == "__main__":
    sys.exit(main())
