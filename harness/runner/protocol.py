"""What the on-device runner and the host share: the command line, the document, the serve protocol, exit codes.

Standard library only: host modules (`harness.contract`, `harness.campaign`, ...) import
these names, and the device runs them inside the runner's archive.

Command line::

    python3 runner.pyz bench --artifacts DIR --backend ort|onnx|torch --warmup W --steps N
                             --threads T [--seed S] [--sample-seconds S]
                             [--precision P] [--max-seconds M] [--data SHARD.npz]
                             [--matmul-seconds S] [--power-root DIR [--power-sensor KIND]]
    python3 runner.pyz train --artifacts DIR --backend ort|onnx|torch --params IN.npy
                             --data SHARD.npz --epochs E --lr LR --threads T --out OUT.npy
                             [--batch B] [--seed S] [--power-root DIR [--power-sensor KIND]]

    python3 runner.pyz serve [--backend ort|onnx|torch] [--threads T] [--max-sessions N] [--cwd DIR]

Output: exactly one JSON document on stdout, always, also on failure (logs and
anything a native library prints go to stderr: file descriptor 1 is pointed at
stderr while the runner works). Keys::

    mode               "bench" | "train" (null if the mode itself was not understood)
    status             "ok" | "bad arguments" | "missing runtime" | "out of memory" | "out of space"
                       | "runner error"
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
                       CPU quota) from steps that cost more CPU (see `harness.runner.sampling`, "CPU time")
    disturbed          bench: 1 for an entry of step_seconds taken while something outside
                       the process slowed the cpu (see `harness.runner.sampling`, "Disturbed samples"), else 0; empty
                       when not judged (threads > 1)
    bench only (see `harness.runner.sampling`):
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
      runtime_memory_bytes  peak resident set before the model is opened: numpy, the
                       runtime and the data loaded (see `harness.runner.bench`)
      bench_data       "shard": the steps train on --data's batches as train does; "random":
                       on a random batch (see `harness.runner.bench`)
    loss               loss of every step in step_seconds (before that step's update)
    peak_memory_bytes  peak resident set of the process (VmHWM, else ru_maxrss)
    peak_memory_source "VmHWM" | "ru_maxrss" | null
    peak_memory_scope  "process" (one-shot), "request" or "process" (serve, see `harness.runner.serve`)
    cpu_freq_khz       {"before": [kHz per cpu], "after": [...]} (scaling_cur_freq)
    thermal_c          {"before": {zone type: Celsius}, "after": {...}}
    throttled          bool, see `harness.runner.probes.throttled`
    matmul_gflops      achievable float32 GFLOP/s of numpy at T threads (bench only; null in train
                       and with --matmul-seconds 0)
    versions           {"python", "numpy", "onnxruntime", "torch"} (null when not installed)
    energy             bench and train (see `harness.runner.metering`): null without --power-root,
                       or when no sensor was found below it and --power-sensor named none; else
                       {"sensor": kind, "rails": [summed rails], "emulated": bool,
                        "joules": J over the timed steps (train: the step loop),
                        "idle_joules": J of an idle window of the same length just before them,
                        "uncertainty_j": J (of joules), "seconds": s of the energy window,
                        "images": examples trained in it, "external_power": bool,
                        "flag": null | "external-power" | "sensor-slower-than-cell"
                                | "power: <reason>" (joules, idle_joules, uncertainty_j null)}
                       --power-sensor KIND: the kind the device's facts list; none of it
                       found is flagged with the reason (no vcgencmd, no current_now, ...)
    train only:        epochs, lr, examples (examples trained on, all epochs), step_examples (the
                       examples of every step in step_seconds), num_parameters, out,
                       loop_seconds and loop_cpu_seconds: wall and CPU time of the whole step loop
                       (steps, batch copies, width switches); their ratio is the share of a cpu
                       the device got. The CPU clock is read once per loop, not per step: reading
                       it is a system call, where a CPU quota (cgroup) charges the runtime used
                       and throttles, so a read per step would move the throttled time out of
                       the steps' windows.

Serve protocol (version `PROTOCOL_VERSION`; a native runner speaks the same)::

    start     runner.pyz serve [--backend B] [--threads T] [--max-sessions N] [--cwd DIR]
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
                            sample_seconds, params, data, epochs, lr, out, batch,
                            power_root, power_sensor);
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

Exit status (`EXIT_CODES`; the host reads it through ``harness.contract``): 0 ok, 2 bad arguments (also
an artifact set that the backend cannot use, a parameter vector of the wrong
length, an empty shard, and a shard smaller than one batch for ``bench --data``
or a set with a fixed batch), 3 missing runtime, 4 out of memory
(``MemoryError``, and ORT / PyTorch allocation failures recognised by their
message), 5 runner error (anything else; the traceback goes to stderr), 6 out of
space (a write found the device's file system full: ``OSError`` ``ENOSPC``, or a
native library's "No space left on device"; the error names the file). A runner
killed by the kernel's OOM killer prints nothing: the caller sees the signal
(exit status -9 / 137) and decides (the campaign records it as out of memory).
"""

from __future__ import annotations

import platform

#: Status of a document -> the exit status of a one-shot runner.
EXIT_CODES = {
    "ok": 0,
    "bad arguments": 2,
    "missing runtime": 3,
    "out of memory": 4,
    "runner error": 5,
    "out of space": 6,
}

#: Files of an artifact set beside its manifest: the TorchScript model, the step model, its initial parameters.
TORCHSCRIPT_FILE = "model.pt"
STEP_MODEL_FILE = "step_model.onnx"
INITIAL_PARAMETERS_FILE = "initial_parameters.npy"

#: Backends: ORT training artifacts, the portable step model on plain onnxruntime, TorchScript.
BACKENDS = ("ort", "onnx", "torch")

#: Default ``--precision``: the interval's half-width as a fraction of the median (+-2 %).
DEFAULT_PRECISION = 0.02

#: Default ``--max-seconds``: the cap on warm-up plus timed sampling of one run.
DEFAULT_MAX_SECONDS = 30.0

#: Version of the serve protocol (the ``protocol`` of the ready line).
PROTOCOL_VERSION = 1
#: Open backends (sessions) a serving runner keeps, least recently used dropped first.
DEFAULT_MAX_SESSIONS = 8
#: Seconds of the bench's matmul probe (`harness.runner.probes.matmul_gflops`) by default.
MATMUL_SECONDS = 0.2
#: Keys of a serve request that are not command-line options of its mode.
SERVE_KEYS = ("id", "mode", "params_inline", "return_params", "fjord", "syncdrop")


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
        "energy": None,
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
        "runtime_memory_bytes": None,
    }
