"""The ``train`` mode: train epochs over a shard from given parameters and write the result.

Decisions:

* each epoch visits the shard in a fresh permutation drawn from ``--seed`` (default 0)
  in batches of the manifest's ``batch``, the last one short where the shard is
  not a whole number of batches, as in-process training (``fl.client``) batches
  it: the graphs take a batch of any size (their inputs name the batch dimension,
  `harness.runner.artifacts.variable_batch`), so a shard smaller than one batch trains
  too, and the steps, ``examples`` and ``step_examples`` count every example. The short
  step binds the leading rows of the batch buffers and binds the whole buffers again
  after it (both inside its time). An artifact set exported with a fixed batch
  dimension (an older export) skips the short batch and needs at least one batch.
  ``--batch``, when given, must equal the manifest's ``batch``, the batch the set
  was exported and profiled with (``bench`` steps on batches of that size only).
  ``--out`` is written atomically at exactly the given path (``np.save``,
  ``allow_pickle=False``).
* energy (``--power-root``, `harness.runner.metering`): an idle window after loading, then
  the sensor read over the whole step loop; ``images`` is ``examples``. A round is never
  lengthened for the sensor: one shorter than its updates is flagged.
* a serving runner's request may train FjORD widths (``fjord``) or SyncDrop masks
  (``syncdrop``) and pass the parameters inline (`harness.runner.protocol`).
"""

from __future__ import annotations

import argparse
import base64
import io
import math
import os
import tempfile
import time

from .arguments import check_threads
from .artifacts import load_manifest, variable_batch
from .backends import open_backend
from .data import BatchFeed, cached, check_shard, epoch_orders, load_shard
from .failures import bad, is_oom, is_out_of_space, out_of_space
from .metering import open_meter
from .probes import readings_after, readings_before
from .runtimes import import_numpy


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


def _save_atomic(np, path: str, flat) -> None:
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".runner-", suffix=".npy")
    try:
        buffer = io.BytesIO()  # numpy's own writes report a full disk as a short write, without ENOSPC
        np.save(buffer, flat, allow_pickle=False)
        with os.fdopen(fd, "wb") as handle:
            handle.write(buffer.getbuffer())
        os.replace(tmp, path)
    except BaseException as exc:
        if os.path.exists(tmp):
            os.unlink(tmp)
        if is_out_of_space(exc):
            raise out_of_space(path, exc) from None
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
            index.append(cached(args, "index", str(path), load))
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
    check_threads(args)
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
    x, y = cached(args, "shard", args.data, lambda: load_shard(np, args.data, manifest))
    variable = variable_batch(manifest)
    check_shard(args.data, (x, y), batch, manifest, whole=not variable)
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
    passive = readings_before(result)
    meter = open_meter(getattr(args, "power_root", None), getattr(args, "power_sensor", None))
    if meter is not None:
        meter.idle()
        meter.start()
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
    if meter is not None:
        result["energy"] = meter.finish(sum(sizes))
    readings_after(result, passive)
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
    """Draw one step's SyncDrop masks as `fl.maths.feddrop` does and load them; return the kept fraction per group.

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
