"""One mode's run into its document: whatever happens, one document with a status comes out."""

from __future__ import annotations

import argparse
import math
import sys
import traceback

from .arguments import build_parser
from .bench import run_bench
from .failures import RunnerFailure, bad, is_oom, is_out_of_space
from .probes import peak_memory, versions
from .protocol import new_result
from .runtimes import flush_denormals
from .train import run_train


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
            raise bad("serve is resident: start it as the program (runner.pyz serve), not through run()")
        run_mode(args, result)

    return guarded(result, work)


def run_mode(args: argparse.Namespace, result: dict) -> None:
    """Run the ``bench`` or ``train`` mode of parsed arguments into ``result``.

    Parameters
    ----------
    args : argparse.Namespace
    result : dict
    """
    result.update(mode=args.mode, backend=args.backend, threads=args.threads, seed=args.seed)
    result["flush_denormals"] = flush_denormals()
    if args.mode == "bench":
        run_bench(args, result)
    else:
        run_train(args, result)


def guarded(result: dict, work) -> dict:
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
        if is_out_of_space(exc):
            result["status"] = "out of space"
        else:
            result["status"] = "out of memory" if is_oom(exc) else "runner error"
        result["error"] = f"{type(exc).__name__}: {exc}"
        if isinstance(exc, KeyboardInterrupt):
            result["error"] = "interrupted"
    result["peak_memory_bytes"], result["peak_memory_source"] = peak_memory()
    versions(result)
    return _finite(result)
