"""Importing numpy and the backends' runtimes the runner's way, and the process's floating-point setup.

Standard library only at import (numpy and the runtimes are imported inside the
functions). `harness.provision` runs `torch_blocked`, `import_onnxruntime` and
`import_ort_training` on a device to tell what the runner will be able to import.

Decisions:

* the ``ort`` and ``onnx`` backends never load PyTorch, although onnxruntime-training 1.19
  imports it by itself where it is installed (see `import_ort_training`): that costs
  seconds of start-up and hundreds of MB of peak memory per cell, and would put a
  second runtime's thread pool into the measured process. ``versions`` reports the
  installed version of a runtime that was not loaded (package metadata).
* denormal floats are flushed to zero (FTZ and DAZ, `flush_denormals`) in the runner's
  thread, where a session with one intra-op thread computes, and in ORT's intra-op
  threads (``session.set_denormal_as_zero``). Training a CNN on MNIST drifts into and
  out of denormal gradients and activations, and the same steps of one process then
  run at two speeds for stretches of a run, moving a cell's median between campaigns;
  flushed, they hold at the faster one. FL training on the devices runs with the same
  setting, so profiles and rounds agree; the document says whether it took
  (``flush_denormals``).
* numpy's BLAS gets the run's threads (``OMP_NUM_THREADS``, ``OPENBLAS_NUM_THREADS``,
  ``MKL_NUM_THREADS`` set before numpy is imported, unless the caller set them).
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import os
import sys
import types
from collections.abc import Iterator

from .failures import import_failure


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
    return import_runtime_module("numpy", block_torch=False)


def import_ort_training() -> tuple:
    """Import ``onnxruntime`` and ``onnxruntime.training.api`` without loading PyTorch.

    onnxruntime-training 1.19 imports PyTorch from ``onnxruntime/__init__``
    (a package check for ORTModule, which tolerates its absence) and from
    ``onnxruntime/training/__init__`` (the torch-only ``optim`` and ``amp``
    helpers, which fail without it), although ``onnxruntime.training.api``
    needs neither. Loading PyTorch into an ORT measurement costs about 2 s of
    start-up and 250 MB of peak memory, and would make the runner fail on devices
    without PyTorch. So ``torch`` is blocked (``sys.modules["torch"] = None``)
    while ORT is imported, unless it is already loaded (`import_onnxruntime` then
    skips the ORTModule check too). With torch blocked the training package's
    ``__init__`` can only fail, after importing ``onnx`` for its artifact helpers,
    so ``onnxruntime.training`` is entered at once as a bare namespace of its
    directory and only ``api`` is imported from it. A process that already holds
    the package (torch loaded) imports ``api`` from it.

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
            with ortmodule_check_skipped(blocked):
                import onnxruntime
            training_dir = os.path.join(os.path.dirname(onnxruntime.__file__), "training")
            if blocked and "onnxruntime.training" not in sys.modules:
                if not os.path.isfile(os.path.join(training_dir, "api", "__init__.py")):
                    raise ModuleNotFoundError("No module named 'onnxruntime.training'", name="onnxruntime.training")
                package = types.ModuleType("onnxruntime.training")
                package.__path__ = [training_dir]
                package.__package__ = "onnxruntime.training"
                sys.modules["onnxruntime.training"] = package
            from onnxruntime.training import api
    except ImportError as exc:
        raise import_failure("onnxruntime.training", exc) from None
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


def import_torch():
    """Import ``torch``.

    Returns
    -------
    module

    Raises
    ------
    RunnerFailure
        "missing runtime" (``missing="torch"``) when the import fails.
    """
    return import_runtime_module("torch", block_torch=False)


def import_onnxruntime():
    """Import ``onnxruntime`` (plain or training build) without loading PyTorch.

    The package's ``__init__`` checks whether ORTModule, PyTorch's training wrapper, can be
    imported; with PyTorch blocked it cannot, but the check imports the training package and
    ``onnx`` before it finds out, about half the import's time (seconds on a slow board). So
    while ``torch`` is blocked the check is answered at once (`ortmodule_check_skipped`): the
    same answer, without the imports.

    Returns
    -------
    module

    Raises
    ------
    RunnerFailure
        "missing runtime" (``missing="onnxruntime"``) when the import fails.
    """
    with torch_blocked() as blocked, ortmodule_check_skipped(blocked):
        return import_runtime_module("onnxruntime", block_torch=False)


@contextlib.contextmanager
def ortmodule_check_skipped(blocked: bool) -> Iterator[None]:
    """Answer onnxruntime's ORTModule check at once while PyTorch is blocked.

    Parameters
    ----------
    blocked : bool
        Whether `torch_blocked` blocks ``torch`` around the block; otherwise nothing changes.

    Yields
    ------
    None
    """
    probe = "onnxruntime.training.ortmodule"
    skip = blocked and probe not in sys.modules
    if skip:
        sys.modules[probe] = None  # type: ignore[assignment]
    try:
        yield
    finally:
        if skip and probe in sys.modules and sys.modules[probe] is None:
            del sys.modules[probe]


def import_runtime_module(name: str, *, block_torch: bool):
    """Import module ``name`` as the runner imports a runtime (shipped in provisioning's check too).

    Parameters
    ----------
    name : str
        The module.
    block_torch : bool
        Import it with ``torch`` blocked (`torch_blocked`).

    Returns
    -------
    module

    Raises
    ------
    RunnerFailure
        "missing runtime" (``missing=name``) when the import fails.
    """
    try:
        with torch_blocked() if block_torch else contextlib.nullcontext():
            return importlib.import_module(name)
    except ImportError as exc:
        raise import_failure(name, exc) from None
