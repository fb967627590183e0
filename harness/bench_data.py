"""Bench data: the ``.npz`` shard of examples a campaign's cells train on instead of random batches.

Cells planned with bench data carry its label (`bench_data_label`: the file's name and a
digest of its arrays), so the same examples label alike wherever they are written; a
campaign takes the file itself (`bench_data_file`), checks it fits every artifact set that
will train on it (`check_bench_data`) and deploys it once per device.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from harness.records import BenchSpec


@contextlib.contextmanager
def _open_bench_data(path: Path) -> Iterator[Any]:
    """Open a bench data file as an ``NpzFile`` holding ``x`` and ``y``; any other file is an `InputError` naming it."""
    import numpy as np

    from exporters.userinput import InputError

    try:
        with np.load(path, allow_pickle=False) as shard:
            if "x" not in shard or "y" not in shard:
                raise InputError(f"--data {path}: needs arrays x and y, has {sorted(shard.keys())}")
            yield shard
    except InputError:
        raise
    except (OSError, ValueError, EOFError) as exc:  # InputError is a ValueError too: raised as it is, above
        raise InputError(f"--data {path}: not a readable .npz ({exc})") from None


def bench_data_label(path: Path | str) -> str:
    """Return the label cells record for a bench data file: ``<file name>@<sha256 prefix>``.

    The digest is of the arrays (``x`` and ``y``: dtype, shape and bytes), not of the file,
    whose zip members carry their write time: the same examples written twice label alike.

    Parameters
    ----------
    path : path
        An ``.npz`` shard with ``x`` and ``y``.

    Returns
    -------
    str

    Raises
    ------
    exporters.userinput.InputError
        When the file cannot be read as such a shard.
    """
    import hashlib

    import numpy as np

    path = Path(path)
    digest = hashlib.sha256()
    with _open_bench_data(path) as shard:
        for name in ("x", "y"):
            array = np.ascontiguousarray(shard[name])
            digest.update(f"{name}:{array.dtype.str}:{array.shape}".encode())
            digest.update(array.tobytes())
    return f"{path.name}@{digest.hexdigest()[:12]}"


def check_bench_data(path: Path, manifests: Iterable[Mapping[str, Any]]) -> None:
    """Check that a bench data file fits every artifact set that will train on it.

    Parameters
    ----------
    path : pathlib.Path
        An ``.npz`` with ``x`` (examples, then the model's input shape) and integer ``y``.
    manifests : iterable of mapping
        The sets' manifests (``inputs``: the input's shape and the batch).

    Raises
    ------
    exporters.userinput.InputError
        Naming the file and what does not fit: unreadable, no ``x`` / ``y``, an input
        shape other than the model's, fewer examples than a batch, labels that are not
        integers.
    """
    from exporters.userinput import InputError

    with _open_bench_data(path) as shard:
        x_shape, y_shape, y_kind = shard["x"].shape, shard["y"].shape, shard["y"].dtype.kind
    if y_kind not in "iu" or y_shape != x_shape[:1]:
        raise InputError(f"--data {path}: y must be one integer label per example, got {y_shape} of kind {y_kind!r}")
    for manifest in manifests:
        want = tuple(int(d) for d in manifest["inputs"][0]["shape"][1:])
        if tuple(x_shape[1:]) != want:
            raise InputError(
                f"--data {path}: examples of shape {tuple(x_shape[1:])}, {manifest.get('model')} takes {want}"
            )
        if x_shape[0] < int(manifest["batch"]):
            raise InputError(f"--data {path}: {x_shape[0]} examples, fewer than one batch of {manifest['batch']}")


def bench_data_file(specs: Sequence[BenchSpec], data: Path | str | None) -> Path | None:
    """Return the bench data file of ``specs``, checked against the label they were planned with.

    Parameters
    ----------
    specs : sequence of BenchSpec
        The campaign's cells; those planned with bench data carry its label (``data``).
    data : path, optional
        The file given for them.

    Returns
    -------
    pathlib.Path or None
        ``data`` as a path; None when no cell names bench data (random batches).

    Raises
    ------
    exporters.userinput.InputError
        When cells name bench data but no file is given, or the file's label is not theirs.
    """
    from exporters.userinput import InputError

    labels = {s.data for s in specs if s.data}
    if not labels:
        return None
    if data is None:
        raise InputError(f"cells train on bench data {sorted(labels)[0]}; give its file (--data)")
    path = Path(data)
    label = bench_data_label(path)
    if labels != {label}:
        raise InputError(f"--data {path} is {label}; the cells were planned with {', '.join(sorted(labels))}")
    return path
