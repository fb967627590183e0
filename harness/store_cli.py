"""``fleetbench profiles export``: the store's cell view as CSV or Parquet."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from devices.files import atomic_path
from exporters.userinput import InputError
from harness.store import ProfileStore
from harness.store_errors import StoreError


def cmd_export(args: argparse.Namespace) -> int:
    """Run ``fleetbench profiles export``: one row per cell (its latest attempt).

    Parameters
    ----------
    args : argparse.Namespace
        ``db`` (store path), ``format`` (``csv`` or ``parquet``), ``out`` (file, or
        None for stdout; Parquet needs a file).

    Returns
    -------
    int
        Exit status 0.

    Raises
    ------
    InputError
        If the store is missing or unusable, Parquet is asked for without ``--out``
        or without pyarrow, or the output directory does not exist.
    """
    db = Path(args.db)
    if not db.is_file():  # before any other check: nothing is created for a refused command
        raise StoreError(f"no profile store at {db}")
    fmt = args.format
    out = None if args.out is None else Path(args.out)
    if fmt == "parquet":
        if out is None:
            raise InputError("parquet export needs --out FILE (Parquet is binary; it is not written to stdout)")
        try:
            import pyarrow  # noqa: F401
        except ImportError:
            raise InputError("parquet export needs pyarrow: pip install 'fleetbench[parquet]'") from None
    if out is not None and not out.parent.is_dir():
        raise InputError(f"cannot write {out}: directory {out.parent} does not exist")
    with ProfileStore(db, create=False) as store:
        frame = store.latest_cells()
    if out is None:
        frame.to_csv(sys.stdout, index=False)
        sys.stdout.flush()
    elif fmt == "csv":
        with atomic_path(out) as path:
            frame.to_csv(path, index=False)
    else:
        with atomic_path(out) as path:
            frame.to_parquet(path, index=False, engine="pyarrow")
    if out is not None:
        print(f"wrote {len(frame)} cells from {db} to {out} ({fmt})", file=sys.stderr)
    return 0
