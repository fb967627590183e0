"""The training backends over one artifact set: ``ort``, ``onnx`` and ``torch``.

Each backend binds a batch's buffers once, runs one training step, loads and returns the
flat parameter vector, and can be reset for a serving runner's next request. Standard
library only at import: the runtimes are imported when a backend opens
(`harness.runner.runtimes`).

Decisions:

* ORT sessions: ``intra_op_num_threads=T``, ``inter_op_num_threads=1``,
  sequential execution. numpy's BLAS gets T threads too
  (`harness.runner.runtimes.import_numpy`); torch gets ``set_num_threads(T)``.
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
"""

from __future__ import annotations

import argparse
import os
from typing import Any

from .artifacts import check_listed
from .failures import bad
from .protocol import INITIAL_PARAMETERS_FILE, STEP_MODEL_FILE, TORCHSCRIPT_FILE
from .runtimes import import_onnxruntime, import_ort_training, import_torch


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
    load_runtime = staticmethod(import_ort_training)

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
    load_runtime = staticmethod(import_torch)

    def __init__(self, directory: str, manifest: dict, threads: int, lr: float | None = None) -> None:
        torch = self.torch = import_torch()
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
    load_runtime = staticmethod(import_onnxruntime)

    def __init__(self, directory: str, manifest: dict, threads: int, lr: float | None = None) -> None:
        import numpy

        self.np = numpy
        self.ort = import_onnxruntime()
        self.directory = directory
        self.manifest = manifest
        self.spec = manifest["step_model"]
        path = check_listed(directory, manifest, STEP_MODEL_FILE)
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
            path = check_listed(self.directory, self.manifest, INITIAL_PARAMETERS_FILE)
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


#: Backend name -> the class that opens it on an artifact set.
BACKEND_CLASSES: dict = {"ort": OrtBackend, "onnx": OnnxBackend, "torch": TorchBackend}


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
    return BACKEND_CLASSES[args.backend](args.artifacts, manifest, args.threads, lr)
