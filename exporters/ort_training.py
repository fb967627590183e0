"""Training an artifact set on the host with ``onnxruntime.training``.

`OrtTrainer` trains a set with ``onnxruntime.training.api`` (train steps, eval
loss, gradients, flat parameters in and out), the host twin of the runner's ``ort``
backend, for tests and executors that must train exactly as the devices do. ORT
1.19's ``Module.copy_buffer_to_parameters`` wrapper passes its argument straight to
C++ and so needs the raw ``OrtValue._ortvalue``.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from exporters.manifest import (
    CHECKPOINT,
    EVAL_MODEL,
    OPTIMIZER_MODEL,
    TRAINING_MODEL,
    flatten,
    read_manifest,
    unflatten,
)
from exporters.userinput import InputError


def session_options(threads: int = 1) -> Any:
    """Return ORT session options for on-device style training.

    Parameters
    ----------
    threads : int
        Intra-op threads (>= 1); inter-op parallelism is off (sequential execution).

    Returns
    -------
    onnxruntime.SessionOptions
    """
    import onnxruntime

    if threads < 1:
        raise InputError(f"threads {threads} must be at least 1")
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.execution_mode = onnxruntime.ExecutionMode.ORT_SEQUENTIAL
    options.log_severity_level = 3
    return options


class OrtTrainer:
    """Train one artifact set with ``onnxruntime.training.api``.

    Parameters
    ----------
    directory : pathlib.Path
        An artifact set written by `export_artifacts`.
    threads : int
        Intra-op threads.
    lr : float, optional
        Learning rate; ORT's initial 1e-3 when ``None``.
    evaluates : bool
        Also load the eval graph, for `eval_loss`. Building its session costs about as
        much again as the training graph's on an unrolled LSTM; a trainer that only
        trains can do without it.

    Attributes
    ----------
    manifest : dict
        The set's manifest.
    state, module, optimizer
        The ORT ``CheckpointState``, ``Module`` and ``Optimizer``.
    """

    def __init__(self, directory: Path, *, threads: int = 1, lr: float | None = None, evaluates: bool = True) -> None:
        from onnxruntime.training.api import CheckpointState, Module, Optimizer

        directory = Path(directory)
        self.directory = directory
        self.manifest = read_manifest(directory)
        self.state = CheckpointState.load_checkpoint(str(directory / CHECKPOINT))
        self.module = Module(
            str(directory / TRAINING_MODEL),
            self.state,
            str(directory / EVAL_MODEL) if evaluates else None,
            session_options=session_options(threads),
        )
        self.evaluates = evaluates
        self.optimizer = Optimizer(str(directory / OPTIMIZER_MODEL), self.module)
        if lr is not None:
            self.optimizer.set_learning_rate(lr)

    @property
    def num_parameters(self) -> int:
        """Number of trainable float32 values (length of the flat buffer)."""
        return int(self.manifest["num_parameters"])

    def train_step(self, x: np.ndarray, y: np.ndarray) -> float:
        """Run forward, backward and one optimizer step on a batch; return the loss.

        Parameters
        ----------
        x : numpy.ndarray
            Inputs of the manifest's input shape and dtype.
        y : numpy.ndarray
            int64 labels of shape ``(batch,)``.

        Returns
        -------
        float
            The loss before the step.
        """
        loss = self.forward_backward(x, y)
        self.step()
        return loss

    def forward_backward(self, x: np.ndarray, y: np.ndarray) -> float:
        """Compute the loss and accumulate gradients, without updating parameters.

        Parameters
        ----------
        x, y : numpy.ndarray
            As for `train_step`.

        Returns
        -------
        float
            The loss.
        """
        self.module.train()
        return float(np.asarray(self.module(*self._feed(x, y))))

    def gradients(self) -> dict[str, np.ndarray]:
        """Return copies of the accumulated gradients by name, in manifest order."""
        params = self.state.parameters
        return {p["name"]: np.array(params[p["name"]].grad, copy=True) for p in self.manifest["parameters"]}

    def step(self) -> None:
        """Apply the optimizer to the accumulated gradients, then clear them (lazily)."""
        self.optimizer.step()
        self.module.lazy_reset_grad()

    def eval_loss(self, x: np.ndarray, y: np.ndarray) -> float:
        """Return the loss of the eval graph on a batch (no update).

        Parameters
        ----------
        x, y : numpy.ndarray
            As for `train_step`.

        Returns
        -------
        float

        Raises
        ------
        InputError
            If the trainer was made without the eval graph (``evaluates=False``).
        """
        if not self.evaluates:
            raise InputError(f"{self.directory.name}: this trainer was made without the eval graph (evaluates=False)")
        self.module.eval()
        try:
            return float(np.asarray(self.module(*self._feed(x, y))))
        finally:
            self.module.train()

    def get_flat(self) -> np.ndarray:
        """Return a copy of all parameters as one float32 vector in manifest order."""
        return np.array(self.module.get_contiguous_parameters(trainable_only=True).numpy(), copy=True)

    def set_flat(self, flat: np.ndarray) -> None:
        """Load all parameters from one float32 vector in manifest order.

        Parameters
        ----------
        flat : numpy.ndarray
            Length `num_parameters`.

        Raises
        ------
        InputError
            If the length is wrong.
        """
        from onnxruntime import OrtValue

        arr = np.ascontiguousarray(flat, dtype=np.float32).reshape(-1)
        if arr.size != self.num_parameters:
            raise InputError(f"flat parameters have {arr.size} values, the set needs {self.num_parameters}")
        self.module.copy_buffer_to_parameters(OrtValue.ortvalue_from_numpy(arr)._ortvalue, trainable_only=True)

    def get_parameters(self) -> dict[str, np.ndarray]:
        """Return every parameter by name, shaped, in manifest order."""
        return unflatten(self.manifest, self.get_flat())

    def set_parameters(self, params: Mapping[str, np.ndarray]) -> None:
        """Load parameters by name (every manifest parameter must be given).

        Parameters
        ----------
        params : mapping of str to numpy.ndarray
        """
        self.set_flat(flatten(self.manifest, params))

    def _feed(self, x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        spec = self.manifest["inputs"][0]
        return (
            np.ascontiguousarray(x, dtype=spec["dtype"]),
            np.ascontiguousarray(y, dtype=np.int64),
        )
