"""ONNX Runtime training artifacts, one content-addressed directory per width.

Export path (the one this stack's versions support: onnxruntime-training 1.19.2, onnx 1.16,
torch 2.13 with the TorchScript-based exporter): the zoo module is
exported (in its `exporters.export_forms.export_form`: LSTMs unrolled, same
parameters) with ``torch.onnx.export(..., training=TrainingMode.TRAINING,
do_constant_folding=False, dynamo=False)`` with the loss *outside* the graph and
a variable batch dimension (`BATCH_DIM`), then `onnxruntime.training.artifacts.generate_artifacts`
adds the cross-entropy loss, the gradient graph and the optimizer graph. Every
parameter is trainable; nothing is frozen (BatchNorm in the zoo is static).

Batch: every graph (training, eval, step model) and ``model.pt`` take a batch of any
size, so an epoch's short last batch trains on a device as in PyTorch; the manifest's
``inputs`` name the batch dimension ``"batch"``, and its ``batch`` is the batch the set is
exported for: the one ``bench`` profiles and the one of the set's name and cache key. Two
rewrites make that hold: the export forms (`exporters.export_forms`) take a static
BatchNorm's statistics without the batch size, and the training-build kernels that size
their output by the exported shape are swapped for standard operators
(`exporters.step_model.lower_fixed_shape_kernels`).

One artifact set is a directory holding::

    training_model.onnx  eval_model.onnx  optimizer_model.onnx  checkpoint
    step_model.onnx  initial_parameters.npy  manifest.json

``step_model.onnx`` is the portable training step of `exporters.step_model` (lowered from
the training and optimizer graphs, for the plain ``onnxruntime`` package) and
``initial_parameters.npy`` the set's initial flat parameters; the manifest's ``step_model``
entry describes the step model's inputs and outputs.

named ``<model>-w<width>-b<batch>-<optimizer>-<key[:12]>``. ``manifest.json`` is
written last and records the parameter names and shapes **in the order of ORT's
flat parameter buffer** (`Module.get_contiguous_parameters` /
`copy_buffer_to_parameters`). That order is the order of the parameter inputs of
the training graph; it is *not* the order in which `CheckpointState.parameters`
iterates (which is sorted by name), so the export verifies it by writing a known
buffer through ORT and reading every parameter back by name.

Cache: the key is the sha256 of a canonical JSON document of everything that
determines the artifacts (`cache_key_inputs`). An existing directory whose
manifest carries the same key and whose files all match their recorded sha256 is
returned as is (``cached=True``) and nothing is written. Otherwise the set is
exported into a hidden temporary directory inside ``out_dir`` and renamed into
place, so a crash never leaves a directory that looks valid.

Disk space: before exporting, the set's size is estimated from its parameter count
(`export_bytes`, a lower bound: the checkpoint and the initial parameters each hold every
parameter as float32); a cache whose file system has fewer free bytes is refused at
once, and a write that still finds it full (``ENOSPC``) removes the temporary
directory; both are `exporters.host_disk.DiskFull`, one line naming ``out_dir``.

Exports are reproducible byte for byte: weights are seeded from the arch key
(`seed_for`) without touching the caller's RNG, and onnxblock's process-wide name
counter is restarted for every export.

Eval model: ORT derives it from the same training-mode graph, switching
``training_mode`` off on BatchNormalization/Dropout nodes. Two consequences:

* static BatchNorm exports with the batch statistics as its mean/variance inputs,
  so the eval model still normalises with batch statistics (as PyTorch does with
  ``track_running_stats=False``); its unread running-statistics outputs are
  removed here, else ORT refuses to load the eval model (`_fix_eval_batchnorm`);
* Python branches on ``module.training`` are frozen in their training state: the
  HeteroFL ``Scaler`` (``x / rate`` while training) stays in the eval model. Every
  Scaler there feeds a static BatchNorm, which cancels the scale up to its
  epsilon (measured: eval loss within 3e-6 relative of PyTorch's at width 0.25).

Optimizers are ORT's defaults: AdamW in Hugging Face mode (``adam_mode=1``,
bias correction folded into the learning rate, ``betas=(0.9, 0.999)`` held as
float32, ``eps=1e-6``, ``weight_decay=0``) and plain SGD, both at ORT's initial
learning rate 1e-3 (`exporters.torch_twin.OrtAdamW` is the same AdamW update in PyTorch).

Neighbours: `exporters.manifest` reads and verifies a set (file names, manifest,
the flat parameter order); `exporters.ort_training` trains one on the host with
``onnxruntime.training``; `exporters.torch_twin` holds the PyTorch optimizers that
update exactly like the exported ORT graphs.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import inspect
import io
import json
import os
import platform
import shutil
import tempfile
import threading
import time
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch
from torch import nn

from exporters.arch import Arch
from exporters.errors import ExportError
from exporters.export_forms import export_form, fuse_gradient_sums
from exporters.host_disk import check_room, disk_full, is_disk_full
from exporters.manifest import (
    ARTIFACT_FILES,
    CHECKPOINT,
    EVAL_MODEL,
    EXPORT_FORMAT_VERSION,
    MANIFEST,
    TRAINING_MODEL,
    file_entry,
    load_valid_manifest,
    sha256_file,
    write_json,
)
from exporters.ort_training import session_options
from exporters.step_model import lower_fixed_shape_kernels, write_step_model
from exporters.userinput import InputError
from exporters.zoo import ZooModel

#: ONNX opset of the exported forward graph.
OPSET = 17

#: Optimizers that can be exported (CLI names).
OPTIMIZERS = ("adamw", "sgd")

#: Bytes per parameter an artifact set holds at least: the checkpoint and ``initial_parameters.npy``, float32 each.
EXPORT_BYTES_PER_PARAMETER = 8
#: Bytes an artifact set holds at least beside its parameters (graphs and manifest of the smallest zoo model).
EXPORT_FIXED_BYTES = 32 * 1024

#: The only loss exported: mean cross-entropy of logits ``(N, C)`` against int64 labels ``(N,)``.
LOSS = "cross_entropy"

#: Hyper-parameters ORT 1.19 bakes into its default optimizer graphs (``onnxblock.optim``)
#: and its initial learning rate; recorded in the manifest, matched by `OrtAdamW`.
OPTIMIZER_DEFAULTS: dict[str, dict[str, Any]] = {
    "adamw": {
        "lr": 1e-3,
        "betas": [0.9, 0.999],
        "eps": 1e-6,
        "weight_decay": 0.0,
        "bias_correction": True,
        "mode": "huggingface",
    },
    "sgd": {"lr": 1e-3, "momentum": 0.0, "weight_decay": 0.0},
}

#: Name of the model input in the exported graph; ORT's loss block adds ``labels``.
INPUT_NAME = "input"
OUTPUT_NAME = "logits"
LABELS_NAME = "labels"
#: Symbolic name of the variable batch dimension of the graphs' inputs and outputs.
BATCH_DIM = "batch"

_ONNX_DTYPES = {1: "float32", 6: "int32", 7: "int64", 9: "bool", 11: "float64"}


@dataclass(frozen=True)
class ExportResult:
    """Where one artifact set lives and whether it came from the cache.

    Attributes
    ----------
    directory : pathlib.Path
        The artifact set directory.
    cached : bool
        True when an identical, intact set already existed and nothing was written.
    manifest : dict
        The parsed ``manifest.json``.
    """

    directory: Path
    cached: bool
    manifest: dict[str, Any]


# --------------------------------------------------------------------------- paths


def check_writable(out_dir: Path) -> Path:
    """Create ``out_dir`` if needed and check that files can be written in it.

    Parameters
    ----------
    out_dir : pathlib.Path
        Artifact root directory.

    Returns
    -------
    pathlib.Path
        ``out_dir``.

    Raises
    ------
    InputError
        With one line naming the directory and the reason, if it cannot be
        created or written (a path under a regular file, a read-only file system,
        missing permissions).
    """
    out_dir = Path(out_dir)
    if out_dir.exists() and not out_dir.is_dir():
        raise InputError(f"cannot write artifacts to {out_dir}: it exists and is not a directory")
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        if is_disk_full(exc):
            raise disk_full(out_dir, "the artifact cache", exc) from None
        raise InputError(f"cannot write artifacts to {out_dir}: {exc.strerror or type(exc).__name__}") from None
    # access(2), not a probe file: a cache hit must leave even out_dir's mtime alone.
    if not os.access(out_dir, os.W_OK | os.X_OK):
        raise InputError(f"cannot write artifacts to {out_dir}: permission denied or read-only file system")
    return out_dir


def export_bytes(num_parameters: int) -> int:
    """Return the bytes an artifact set of ``num_parameters`` parameters takes at least (pure).

    Parameters
    ----------
    num_parameters : int

    Returns
    -------
    int
        ``EXPORT_BYTES_PER_PARAMETER * num_parameters + EXPORT_FIXED_BYTES``: never more than
        the set's real size, so a check against it refuses only an export that cannot fit.
    """
    return EXPORT_BYTES_PER_PARAMETER * int(num_parameters) + EXPORT_FIXED_BYTES


def set_name(model: ZooModel, arch: Arch, batch: int, optimizer: str, key: str) -> str:
    """Return the readable directory name of an artifact set.

    Parameters
    ----------
    model : ZooModel
    arch : Arch
    batch : int
    optimizer : str
    key : str
        The cache key (hex); its first 12 characters end the name.

    Returns
    -------
    str
        ``"<model>-w<width>-b<batch>-<optimizer>-<key[:12]>"`` where ``<width>`` is
        the largest two-decimal width with ``model.arch(width) == arch`` (e.g.
        ``0.25``), else the per-group sizes joined by ``.`` (shortened when long).
    """
    return f"{model.name}-w{_width_label(model, arch)}-b{batch}-{optimizer}-{key[:12]}"


def _width_label(model: ZooModel, arch: Arch) -> str:
    # Several widths round to the same sizes (ceil(w*K)); the largest two-decimal one
    # is the one a user asked for (0.25 gives (5, 4) of (20, 15), and so do 0.21..0.24).
    for hundredths in range(100, 0, -1):
        if model.arch(hundredths / 100) == arch:
            return f"{hundredths / 100:g}"
    label = ".".join(str(w) for w in arch.sizes)
    return label if len(label) <= 40 else label[:40] + "_"


# --------------------------------------------------------------------------- cache key


def seed_for(arch: Arch) -> int:
    """Return the deterministic weight seed of ``arch``: 63 bits of sha256(arch key).

    Parameters
    ----------
    arch : Arch

    Returns
    -------
    int
    """
    digest = hashlib.sha256(arch.key().encode()).digest()
    return int.from_bytes(digest[:8], "big") >> 1


def build_seeded(model: ZooModel, arch: Arch) -> nn.Module:
    """Build ``arch``'s torch module with weights seeded by `seed_for`.

    The global torch RNG state is left as it was.

    Parameters
    ----------
    model : ZooModel
    arch : Arch

    Returns
    -------
    torch.nn.Module
        The module in training mode.
    """
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed_for(arch))
        net = model.build(arch)
    return net.train()


def cache_key_inputs(model: ZooModel, arch: Arch, *, batch: int, optimizer: str, net: nn.Module) -> dict[str, Any]:
    """Return the JSON-able description of everything that determines an artifact set.

    Parameters
    ----------
    model : ZooModel
    arch : Arch
    batch : int
    optimizer : str
    net : torch.nn.Module
        The module built for ``arch`` (its structure and source files are hashed).

    Returns
    -------
    dict
        Model name, groups, layouts, input shape and dtype, classes, the module's
        ``repr``, parameter names and shapes, sha256 of the source files of every
        non-torch module class in it, the arch's sizes (neurons per group), seed, batch, optimizer and
        its hyper-parameters, loss, opset, tool versions, `EXPORT_FORMAT_VERSION`
        and the sha256 of this file (so a changed export procedure never reuses
        a stale set).
    """
    exported = export_form(net)
    sources = sorted({_source_digest(type(m)) for m in (*net.modules(), *exported.modules())} - {""})
    return {
        "format_version": EXPORT_FORMAT_VERSION,
        "exporter": sha256_file(Path(__file__)),
        "step_exporter": sha256_file(Path(inspect.getfile(write_step_model))),
        "graph_passes": sha256_file(Path(inspect.getfile(fuse_gradient_sums))),
        "model": model.name,
        "groups": [[name, size] for name, size in model.groups],
        "layouts": {name: _layout_json(layout) for name, layout in sorted(model.layouts.items())},
        "input_shape": list(model.input_shape),
        "input_dtype": model.input_dtype,
        "num_classes": model.num_classes,
        "module": repr(net),
        "parameters": [[name, list(p.shape)] for name, p in net.named_parameters()],
        "sources": sources,
        "sizes": list(arch.sizes),
        "seed": seed_for(arch),
        "batch": batch,
        "optimizer": optimizer,
        "optimizer_defaults": OPTIMIZER_DEFAULTS[optimizer],
        "loss": LOSS,
        "opset": OPSET,
        "versions": {"torch": torch.__version__, **_installed_versions()},
    }


#: Distributions whose versions enter the cache key, by the module they provide (the first
#: installed candidate counts: the training build provides ``onnxruntime`` too).
_KEY_DISTRIBUTIONS = {"onnx": ("onnx",), "onnxruntime": ("onnxruntime-training", "onnxruntime", "onnxruntime-gpu")}


def _installed_versions() -> dict[str, str]:
    """Return the installed versions of onnx and onnxruntime, read from their metadata.

    Importing onnxruntime-training to ask its version would cost most of a second on every
    command that only finds its sets in the cache; the metadata holds the same version.
    """
    from importlib import metadata

    found = {}
    for module, names in _KEY_DISTRIBUTIONS.items():
        for name in names:
            try:
                found[module] = metadata.version(name)
                break
            except metadata.PackageNotFoundError:
                continue
        else:
            raise ModuleNotFoundError(f"{module} is not installed: exporting needs it")
    return found


def cache_key(inputs: Mapping[str, Any]) -> str:
    """Return the sha256 hex digest of the canonical JSON of ``inputs``.

    Parameters
    ----------
    inputs : mapping
        As returned by `cache_key_inputs`.

    Returns
    -------
    str
    """
    text = json.dumps(inputs, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(text.encode()).hexdigest()


def _layout_json(layout: Iterable[Any]) -> list[Any]:
    return [None if d is None else [d.group, d.blocks, d.inner] for d in layout]


def _source_digest(cls: type) -> str:
    module = getattr(cls, "__module__", "") or ""
    if module.split(".")[0] in ("torch", "builtins"):
        return ""
    try:
        path = inspect.getsourcefile(cls)
    except (TypeError, OSError):
        return f"{module}.{cls.__qualname__}"
    if path is None:
        return f"{module}.{cls.__qualname__}"
    return f"{module}:{sha256_file(Path(path))}"


# --------------------------------------------------------------------------- export


def export_artifacts(model: ZooModel, arch: Arch, *, batch: int, optimizer: str, out_dir: Path) -> ExportResult:
    """Export (or find in the cache) the ORT training artifact set of one width.

    Parameters
    ----------
    model : ZooModel
        The zoo model.
    arch : Arch
        The width to export; must belong to ``model``.
    batch : int
        Training batch size (>= 1): the batch the set is profiled with; the graphs take
        any batch size.
    optimizer : {"adamw", "sgd"}
        ORT optimizer graph to generate (ORT defaults, see `OPTIMIZER_DEFAULTS`).
    out_dir : pathlib.Path
        Artifact root; created if missing. The set lands in
        ``out_dir / set_name(...)``.

    Returns
    -------
    ExportResult

    Raises
    ------
    InputError
        On a bad batch, optimizer, arch or an unwritable ``out_dir``.
    ExportError
        If the exported graphs break the artifact contract.
    exporters.host_disk.DiskFull
        If ``out_dir``'s file system has no room for the set (checked before exporting,
        against `export_bytes`, and at every write); nothing of the set is left behind.
    """
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise InputError(f"batch {batch!r} must be an integer of at least 1")
    if optimizer not in OPTIMIZERS:
        raise InputError(f"optimizer {optimizer!r} is not one of {', '.join(OPTIMIZERS)}")
    out_dir = check_writable(Path(out_dir))
    net = build_seeded(model, arch)  # validates arch against the model
    key_inputs = cache_key_inputs(model, arch, batch=batch, optimizer=optimizer, net=net)
    key = cache_key(key_inputs)
    target = out_dir / set_name(model, arch, batch, optimizer, key)

    manifest = load_valid_manifest(target, key)
    if manifest is not None:
        return ExportResult(target, True, manifest)

    def fill(tmp: Path) -> dict[str, Any]:
        with torch.random.fork_rng(devices=[]):  # leave the caller's RNG alone (model builds draw from it)
            return _export_into(tmp, model, arch, net, batch=batch, optimizer=optimizer)

    needed = export_bytes(sum(p.numel() for p in net.parameters()))
    return _write_set(out_dir, target, key, key_inputs, fill, needed)


#: One export at a time in a process: the torch ONNX exporter keeps its state in module globals,
#: and two threads exporting at once (provisioning checks devices concurrently) break each other.
_EXPORTING = threading.RLock()


def _write_set(
    out_dir: Path,
    target: Path,
    key: str,
    key_inputs: Mapping[str, Any],
    fill: Callable[[Path], dict[str, Any]],
    needed: int,
) -> ExportResult:
    """Fill a hidden work directory (``fill(tmp)`` returns the manifest), add the key, move it to ``target``.

    ``needed``: the bytes the set takes at least (`export_bytes`); fewer free bytes, or a
    write that finds the file system full, is `exporters.host_disk.DiskFull`.
    """
    what = f"the artifact set {target.name}"
    _remove_abandoned(out_dir, target.name)
    free = check_room(out_dir, needed, what)
    try:
        tmp = Path(tempfile.mkdtemp(dir=out_dir, prefix=f".tmp-{target.name}-"))
    except OSError as exc:
        if is_disk_full(exc, out_dir):
            raise disk_full(out_dir, what, exc, free) from None
        raise InputError(f"cannot write artifacts to {out_dir}: {exc.strerror or type(exc).__name__}") from None
    try:
        with _EXPORTING:
            manifest = fill(tmp)
        manifest["cache_key"] = key
        manifest["cache_key_inputs"] = dict(key_inputs)
        write_json(tmp / MANIFEST, manifest)
        _move_into_place(tmp, target)
    except Exception as exc:
        if is_disk_full(exc, out_dir):
            raise disk_full(out_dir, what, exc, free) from None
        raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    final = load_valid_manifest(target, key)
    if final is None:  # pragma: no cover - only if another process wrote garbage at once
        raise ExportError(f"{target}: artifact set did not verify after writing")
    return ExportResult(target, False, final)


def export_masked_artifacts(
    model: ZooModel, arch: Arch, *, batch: int, optimizer: str, out_dir: Path, mask_groups: Sequence[str]
) -> ExportResult:
    """Export (or find) an artifact set whose step model takes SyncDrop masks as inputs.

    The set is `export_artifacts`'s with ``step_model.onnx`` built with ``mask_groups``
    (one ``mask.<group>`` float32 input per group, `exporters.step_model`); the other
    files are copied. It lives beside the plain set as ``<plain set>-mask-<key[:8]>``,
    cached the same way (key: the plain set's key and the groups); the manifest's
    ``mask_groups`` names the groups.

    Parameters
    ----------
    model : ZooModel
    arch : Arch
    batch : int
    optimizer : {"adamw", "sgd"}
    out_dir : pathlib.Path
    mask_groups : sequence of str
        Groups produced by one conv or linear layer each (not an LSTM's).

    Returns
    -------
    ExportResult

    Raises
    ------
    InputError
        As `export_artifacts`, or when a group cannot be masked (named in the message).
    """
    from exporters.manifest import unflatten
    from exporters.step_model import INITIAL_PARAMETERS, LoweringError, write_step_model

    base = export_artifacts(model, arch, batch=batch, optimizer=optimizer, out_dir=out_dir)
    groups = [str(g) for g in mask_groups]
    unknown = [g for g in groups if g not in model.group_names]
    if unknown or not groups:
        raise InputError(f"{model.name}: mask groups {groups} must be some of {list(model.group_names)}")
    key_inputs = {**base.manifest["cache_key_inputs"], "plain_set": base.manifest["cache_key"], "mask_groups": groups}
    key = cache_key(key_inputs)
    target = Path(out_dir) / f"{base.directory.name}-mask-{key[:8]}"
    manifest = load_valid_manifest(target, key)
    if manifest is not None:
        return ExportResult(target, True, manifest)

    def fill(tmp: Path) -> dict[str, Any]:
        for name in ARTIFACT_FILES:
            shutil.copyfile(base.directory / name, tmp / name)
        initial = unflatten(base.manifest, np.load(tmp / INITIAL_PARAMETERS, allow_pickle=False))
        group_sizes = dict(zip(model.group_names, arch.sizes, strict=True))
        try:
            step = write_step_model(
                tmp,
                base.manifest["parameters"],
                initial,
                mask_groups=groups,
                layouts=model.layouts,
                group_sizes=group_sizes,
            )
        except LoweringError as exc:
            raise InputError(f"{model.name}: cannot mask {groups}: {exc}") from None
        manifest = dict(base.manifest)
        manifest.update(
            step_model=step, mask_groups=groups, files={name: file_entry(tmp / name) for name in ARTIFACT_FILES}
        )
        return manifest

    return _write_set(Path(out_dir), target, key, key_inputs, fill, export_bytes(base.manifest["num_parameters"]))


#: A temporary directory of a killed export is removed after this many seconds.
ABANDONED_AFTER_S = 3600.0


def _remove_abandoned(out_dir: Path, name: str) -> None:
    """Remove hidden work directories of ``name`` left by exports that were killed."""
    now = time.time()
    for prefix in (".tmp-", ".stale-"):
        for path in out_dir.glob(f"{prefix}{name}-*"):
            try:
                if now - path.stat().st_mtime > ABANDONED_AFTER_S:
                    shutil.rmtree(path, ignore_errors=True)
            except OSError:
                continue


def _export_into(
    directory: Path, model: ZooModel, arch: Arch, net: nn.Module, *, batch: int, optimizer: str
) -> dict[str, Any]:
    import onnx
    import onnxruntime
    from onnxruntime.training import artifacts

    from exporters.flops import count

    x, _ = model.example_batch(batch)
    param_names = [name for name, _ in net.named_parameters()]
    buffer = io.BytesIO()
    with warnings.catch_warnings():
        # Deprecation notices of the legacy exporter, and TracerWarnings from nn.LSTM internals;
        # correctness is checked by the ORT-vs-PyTorch parity tests, not by these.
        warnings.simplefilter("ignore")
        torch.onnx.export(
            export_form(net),
            (x,),
            cast(Any, buffer),  # file-like objects work; the stubs only name paths
            input_names=[INPUT_NAME],
            output_names=[OUTPUT_NAME],
            opset_version=OPSET,
            training=torch.onnx.TrainingMode.TRAINING,
            do_constant_folding=False,
            dynamo=False,
            dynamic_axes={INPUT_NAME: {0: BATCH_DIM}, OUTPUT_NAME: {0: BATCH_DIM}},
        )
    forward = onnx.load_from_string(buffer.getvalue())
    initializers = {init.name for init in forward.graph.initializer}
    missing = [name for name in param_names if name not in initializers]
    if missing:
        raise ExportError(
            f"{arch.key()}: parameters {missing} are not initializers of the exported graph "
            "(unused in forward, or renamed by the exporter)"
        )

    optim = artifacts.OptimType.AdamW if optimizer == "adamw" else artifacts.OptimType.SGD
    with _onnxblock_quiet_and_reproducible():
        artifacts.generate_artifacts(
            forward,
            requires_grad=param_names,
            frozen_params=[],
            loss=artifacts.LossType.CrossEntropyLoss,
            optimizer=optim,
            artifact_directory=directory,
        )

    _fix_eval_batchnorm(directory / EVAL_MODEL)
    training = onnx.load(str(directory / TRAINING_MODEL), load_external_data=False)
    if fuse_gradient_sums(training) + lower_fixed_shape_kernels(training):
        onnx.save(training, str(directory / TRAINING_MODEL))
    shapes = {name: list(p.shape) for name, p in net.named_parameters()}
    order = [i.name for i in training.graph.input if i.name in shapes]
    if sorted(order) != sorted(param_names):
        raise ExportError(f"{arch.key()}: training graph parameter inputs {order} != module parameters")
    user_inputs = [i for i in training.graph.input if i.name not in shapes and i.name in (INPUT_NAME, LABELS_NAME)]
    inputs = [_value_info_json(i) for i in user_inputs]
    if [i["name"] for i in inputs] != [INPUT_NAME, LABELS_NAME]:
        raise ExportError(f"{arch.key()}: training graph inputs {[i['name'] for i in inputs]} lack input/labels")
    labels = inputs[1]
    if labels["dtype"] != "int64" or labels["shape"] != [BATCH_DIM]:
        raise ExportError(f"{arch.key()}: labels input is {labels}, expected int64 [{BATCH_DIM!r}]")
    outputs = [_value_info_json(o) for o in training.graph.output]

    parameters = []
    offset = 0
    for name in order:
        size = int(np.prod(shapes[name], dtype=np.int64))
        parameters.append({"name": name, "shape": shapes[name], "offset": offset, "size": size})
        offset += size
    _verify_flat_order(directory, parameters, offset)
    initial = {name: p.detach().numpy() for name, p in net.named_parameters()}
    step = write_step_model(directory, parameters, initial)

    counts = count(model, arch)
    counts_json = dataclasses.asdict(counts) if dataclasses.is_dataclass(counts) else dict(vars(counts))
    return {
        "format_version": EXPORT_FORMAT_VERSION,
        "model": model.name,
        "paper": model.paper,
        "arch": {
            "key": arch.key(),
            "sizes": list(arch.sizes),
            "groups": list(model.group_names),
            "group_sizes": list(model.group_sizes),
        },
        "batch": batch,
        "optimizer": optimizer,
        "optimizer_defaults": OPTIMIZER_DEFAULTS[optimizer],
        "loss": LOSS,
        "seed": seed_for(arch),
        "opset": OPSET,
        "num_parameters": offset,
        "parameters": parameters,
        "inputs": inputs,
        "outputs": outputs,
        "counts": {k: _json_number(v) for k, v in counts_json.items()},
        "counts_unit": "per example",
        "step_model": step,
        "files": {name: file_entry(directory / name) for name in ARTIFACT_FILES},
        "versions": {
            "torch": torch.__version__,
            "onnx": onnx.__version__,
            "onnxruntime": onnxruntime.__version__,
            "numpy": np.__version__,
            "python": platform.python_version(),
        },
    }


@contextlib.contextmanager
def _onnxblock_quiet_and_reproducible() -> Iterator[None]:
    """Run `generate_artifacts` silently and with reproducible graph names.

    * ``onnxblock._training_graph_utils`` builds the gradient graph with a fresh
      ``SessionOptions()`` whose default severity prints one INFO line per graph
      transformer (hundreds per model); ``set_default_logger_severity`` does not
      reach it, the options' own ``log_severity_level`` does.
    * ``onnxblock._graph_utils`` numbers generated names (``onnx::loss::2``) with a
      process-wide counter, so the second export in a process would differ byte
      for byte from the first; the counter restarts at 0 for every export.
    """
    import onnxruntime
    from onnxruntime.training.onnxblock import _graph_utils as names
    from onnxruntime.training.onnxblock import _training_graph_utils as utils

    token = getattr(names, "_GRAPH_TOKEN", None)
    if isinstance(token, int):
        names._GRAPH_TOKEN = 0
    original = getattr(utils, "SessionOptions", None)
    if original is None:  # pragma: no cover - a different onnxruntime layout
        yield
        return

    def quiet() -> Any:
        options = onnxruntime.SessionOptions()
        options.log_severity_level = 3
        return options

    utils.SessionOptions = quiet
    try:
        yield
    finally:
        utils.SessionOptions = original


def _fix_eval_batchnorm(path: Path) -> None:
    """Drop the unused running-statistics outputs of inference-mode BatchNormalization.

    The zoo's static BatchNorm (``track_running_stats=False``) exports as a
    training-mode ``BatchNormalization`` whose mean and variance inputs are the
    batch statistics (``ReduceMean`` nodes) and whose running-statistics outputs
    nobody reads. `generate_artifacts` switches the eval copy to
    ``training_mode=0`` (normalising with those inputs, i.e. still with batch
    statistics) but keeps three outputs, which ONNX shape inference rejects in
    inference mode ("This number of op outputs should be 1 when Training_mode =
    False"). Removing the unread outputs makes the eval model load and compute
    what PyTorch computes.
    """
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    consumed = {name for node in model.graph.node for name in node.input}
    consumed |= {out.name for out in model.graph.output}
    changed = False
    for node in model.graph.node:
        if node.op_type != "BatchNormalization" or len(node.output) <= 1:
            continue
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        if attrs.get("training_mode", 0) != 0:
            continue
        extra = [name for name in node.output[1:] if name]
        if any(name in consumed for name in extra):
            raise ExportError(f"{path.name}: {node.name} running statistics are read by the graph")
        del node.output[1:]
        changed = True
    if changed:
        onnx.save(model, str(path))


def _verify_flat_order(directory: Path, parameters: list[dict[str, Any]], total: int) -> None:
    """Load the set in ORT, write a known flat buffer and read every parameter back by name.

    The order is the checkpoint's and the training graph's, so the module is built from
    the training graph alone and without graph optimisations: building the eval graph's
    session too and optimising both took most of an LSTM export's check.
    """
    from onnxruntime import GraphOptimizationLevel, OrtValue
    from onnxruntime.training.api import CheckpointState, Module

    state = CheckpointState.load_checkpoint(str(directory / CHECKPOINT))
    options = session_options(1)
    options.graph_optimization_level = GraphOptimizationLevel.ORT_DISABLE_ALL
    module = Module(str(directory / TRAINING_MODEL), state, None, session_options=options)
    size = module.get_parameters_size(trainable_only=True)
    if size != total:
        raise ExportError(f"{directory.name}: ORT holds {size} trainable values, the module {total}")
    probe = np.arange(total, dtype=np.float32) % 65521  # exact in float32, distinct within any window
    module.copy_buffer_to_parameters(OrtValue.ortvalue_from_numpy(probe)._ortvalue, trainable_only=True)
    for p in parameters:
        got = np.asarray(state.parameters[p["name"]].data).reshape(-1)
        want = probe[p["offset"] : p["offset"] + p["size"]]
        if got.shape != want.shape or not np.array_equal(got, want):
            raise ExportError(f"{directory.name}: ORT flat buffer order disagrees at {p['name']!r}")


def _value_info_json(info: Any) -> dict[str, Any]:
    tensor = info.type.tensor_type
    dims: list[int | str] = [d.dim_value if d.HasField("dim_value") else d.dim_param for d in tensor.shape.dim]
    return {"name": info.name, "shape": dims, "dtype": _ONNX_DTYPES.get(tensor.elem_type, str(tensor.elem_type))}


def _json_number(value: Any) -> Any:
    if isinstance(value, (np.integer, np.floating)):
        return value.item()
    return value


def _move_into_place(tmp: Path, target: Path) -> None:
    """Rename ``tmp`` to ``target``; an existing (invalid) ``target`` is replaced."""
    stale: Path | None = None
    if target.exists() or target.is_symlink():
        stale = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".stale-{target.name}-"))
        os.replace(target, stale / "old")
    try:
        os.replace(tmp, target)
    except OSError:
        # Another process put a set there first; keep theirs if it verifies (checked by the caller).
        if not target.exists():
            raise
    finally:
        if stale is not None:
            shutil.rmtree(stale, ignore_errors=True)
