"""Shards and batches: what ``bench --data`` and ``train`` step through, in the same order.

``train``'s shard is an ``.npz`` with ``x`` (inputs) and ``y`` (int64 labels); each epoch
visits it in a fresh permutation drawn from ``--seed`` (`epoch_orders`), each step copying
its batch into buffers the backend bound once (`BatchFeed`).
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Iterator

from .artifacts import num_classes
from .failures import bad, is_oom


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


def load_shard(np, path: str, manifest: dict):
    """Read a shard's ``x`` and ``y`` and check them against the set's inputs.

    Parameters
    ----------
    np : module
    path : str
        The ``.npz`` (``--data``).
    manifest : dict

    Returns
    -------
    x, y : numpy.ndarray
        Inputs in the set's dtype and int64 labels.

    Raises
    ------
    RunnerFailure
        "bad arguments" for an unreadable file or arrays that do not fit the set.
    """
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


def check_shard(path: str, shard: tuple, batch: int, manifest: dict, whole: bool = True) -> tuple:
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


def cached(args: argparse.Namespace, kind: str, path: str, load):
    """Return ``load()``, kept by the serving runner per file (path, size, mtime) between requests."""
    store = getattr(args, "files", None)
    if store is None:
        return load()
    try:
        info = os.stat(path)
    except OSError:
        return load()
    return store.get((kind, os.path.realpath(path), info.st_size, info.st_mtime_ns), load)
