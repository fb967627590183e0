"""The runner's command-line parser: one parser checks the command line and the serving runner's requests."""

from __future__ import annotations

import argparse

from .failures import bad
from .protocol import BACKENDS, DEFAULT_MAX_SECONDS, DEFAULT_MAX_SESSIONS, DEFAULT_PRECISION, MATMUL_SECONDS


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        raise bad(message)


def build_parser() -> argparse.ArgumentParser:
    """Return the command-line parser (errors raise `RunnerFailure`, never exit).

    Returns
    -------
    argparse.ArgumentParser
    """
    parser = _Parser(prog="runner.pyz", description="fleetbench on-device runner")
    sub = parser.add_subparsers(dest="mode")
    common = _Parser(add_help=False)
    common.add_argument("--artifacts", required=True, help="artifact set directory")
    common.add_argument("--backend", required=True, choices=BACKENDS)
    common.add_argument("--threads", type=int, required=True, help="intra-op threads")
    common.add_argument("--seed", type=int, default=0)
    common.add_argument(
        "--power-root", default=None, help="measure the timed steps' energy with the power sensors below this directory"
    )
    common.add_argument("--power-sensor", default=None, help="the kind of power sensor the device is expected to have")
    bench = sub.add_parser("bench", parents=[common], help="time training steps")
    bench.add_argument("--warmup", type=int, required=True, help="most warm-up steps")
    bench.add_argument("--steps", type=int, required=True, help="fewest timed samples")
    bench.add_argument(
        "--sample-seconds", type=float, default=0.0, help="time blocks of consecutive steps lasting at least this"
    )
    bench.add_argument(
        "--precision", type=float, default=DEFAULT_PRECISION, help="target half-width of the median's 95 %% interval"
    )
    bench.add_argument(
        "--max-seconds", type=float, default=DEFAULT_MAX_SECONDS, help="cap on warm-up plus timed sampling"
    )
    bench.add_argument(
        "--data", help=".npz shard with x and y: time steps on its batches, in train's order (default random)"
    )
    bench.add_argument(
        "--matmul-seconds", type=float, default=MATMUL_SECONDS, help="length of the matmul probe (0: none)"
    )
    train = sub.add_parser("train", parents=[common], help="train on a local shard")
    train.add_argument("--params", help="flat float32 .npy in manifest order")
    train.add_argument("--data", required=True, help=".npz shard with x and y")
    train.add_argument("--epochs", type=int, required=True)
    train.add_argument("--lr", type=float, required=True)
    train.add_argument("--out", help="where to write the trained flat .npy")
    train.add_argument("--batch", type=int, default=None, help="must equal the artifact batch")
    serve = sub.add_parser("serve", help="resident: one JSON request per stdin line, one reply per stdout line")
    serve.add_argument("--threads", type=int, default=1, help="numpy threads; the default of requests")
    serve.add_argument("--backend", choices=BACKENDS, default=None, help="import this runtime at start")
    serve.add_argument(
        "--max-sessions", type=int, default=DEFAULT_MAX_SESSIONS, help="open backends kept between requests"
    )
    serve.add_argument("--cwd", default=None, help="work in this directory (relative request paths start here)")
    return parser


def check_threads(args: argparse.Namespace) -> None:
    """Check a mode's ``--threads``.

    Parameters
    ----------
    args : argparse.Namespace

    Raises
    ------
    RunnerFailure
        "bad arguments" below one thread.
    """
    if args.threads < 1:
        raise bad(f"--threads must be at least 1, got {args.threads}")
