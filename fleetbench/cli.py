"""The ``fleetbench`` command line: one parser over every layer, and one error boundary.

Composition. Each layer declares its own commands in its ``cli`` module
(``register(commands)``) and names each handler as ``"module:function"``; the
handler's module is imported only when its command runs, so ``fleetbench --help``
imports neither torch nor onnxruntime.

Error boundary (`main`). Every command runs inside it:

* bad input (`exporters.userinput.InputError` and its kin, `devices.errors.FleetFileError`,
  an argument argparse refuses) is one line on stderr, ``fleetbench: error: ...``, and
  exit status 2 (`EXIT_USAGE`);
* a failure of the environment (`ENVIRONMENT_ERRORS`: an unreachable device, a missing
  system tool, an emulated device that cannot start, a store that cannot be read or
  written, a refused permission, a full disk) is one line saying what and where, and
  exit status 1 (`EXIT_FAILURE`);
* anything else is a bug: one line naming the exception and the log file that holds
  its traceback (`crash_log_dir`), exit status 1; ``--debug`` (or
  ``FLEETBENCH_DEBUG=1``) prints the traceback instead;
* Ctrl-C is ``fleetbench: interrupted`` and 130; SIGTERM (``kill``) and SIGHUP (a closed
  terminal) take the same path (`devices.processes.terminate_as_interrupt`), so what a
  command started (an emulated fleet, resident runners) is stopped and what it measured
  is stored, then ``fleetbench: terminated (SIGTERM)`` and 128 + the signal's number;
  a closed pipe (``| head``) ends quietly.

Commands check their arguments before any side effect, so a refused command has
created, started and written nothing.
"""

from __future__ import annotations

import argparse
import errno
import importlib
import os
import signal
import sqlite3
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path

from devices.errors import EmulationError, FleetFileError, SshdError, TransportError
from devices.processes import Terminated, terminate_as_interrupt
from exporters.cli import settle_model
from exporters.userinput import InputError
from harness.store_errors import StoreUnavailable

#: Exit status for bad input (unknown model, bad width, malformed fleet file, ...).
EXIT_USAGE = 2

#: Exit status for a failure of the environment, a failed run, or an unexpected error.
EXIT_FAILURE = 1

#: Exit status after Ctrl-C (128 + SIGINT, as shells report it).
EXIT_INTERRUPTED = 130

#: Bad input: exit status 2.
INPUT_ERRORS: tuple[type[BaseException], ...] = (InputError, FleetFileError)

#: Failures of the environment, anticipated: exit status 1 with one line.
ENVIRONMENT_ERRORS: tuple[type[BaseException], ...] = (
    TransportError,
    SshdError,
    EmulationError,
    StoreUnavailable,
    sqlite3.Error,
    OSError,
)

#: Environment variable naming the directory for tracebacks of unexpected errors.
LOG_DIR_ENV = "FLEETBENCH_LOG_DIR"


class _Parser(argparse.ArgumentParser):
    """An argument parser whose errors are an `InputError` (one line, exit status 2)."""

    def error(self, message: str) -> None:  # type: ignore[override]
        """Raise the parse error as bad input."""
        raise InputError(f"{self.prog}: {message}")


def build_parser() -> argparse.ArgumentParser:
    """Return the ``fleetbench`` parser with every layer's commands.

    Returns
    -------
    argparse.ArgumentParser
    """
    from devices.cli import register as register_devices
    from exporters.cli import register as register_exporters
    from fl.cli import register as register_fl
    from fleetbench.demo import register as register_demo
    from harness.cli import register as register_harness
    from reports.cli import register as register_reports

    parser = _Parser(
        prog="fleetbench",
        description="Profile a device fleet for federated learning with sub-models, report it, and train on it.",
    )
    parser.add_argument("--debug", action="store_true", help="print the traceback of an unexpected error")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    register_exporters(commands)
    register_devices(commands)
    register_harness(commands)
    register_demo(commands)
    register_fl(commands)
    register_reports(commands)
    return parser


def resolve_handler(handler: str | Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """Import a ``"module:function"`` handler (callables are returned as they are).

    Parameters
    ----------
    handler : str or callable

    Returns
    -------
    callable
        ``(args) -> exit status``.
    """
    if callable(handler):
        return handler
    module, _, name = handler.partition(":")
    function: Callable[[argparse.Namespace], int] = getattr(importlib.import_module(module), name)
    return function


def describe(exc: BaseException) -> str:
    """Return one line saying what failed and where.

    Parameters
    ----------
    exc : BaseException

    Returns
    -------
    str
        For an `OSError` with a file name: ``"<strerror>: <file>"`` (``errno.ENOSPC``
        adds that the disk is full); otherwise the exception's message, or its type
        when it has none. Newlines become ``"; "``.
    """
    if isinstance(exc, OSError) and exc.filename is not None:
        where = f"{exc.filename}" + (f" -> {exc.filename2}" if exc.filename2 is not None else "")
        text = f"{exc.strerror or type(exc).__name__}: {where}"
        if exc.errno == errno.ENOSPC:
            text += " (the disk is full)"
    elif isinstance(exc, sqlite3.Error):
        text = f"SQLite: {exc}"
    else:
        text = str(exc) or type(exc).__name__
    return "; ".join(line.strip() for line in text.splitlines() if line.strip())


def crash_log_dir() -> Path:
    """Return the directory for tracebacks of unexpected errors.

    Returns
    -------
    pathlib.Path
        ``$FLEETBENCH_LOG_DIR``, else ``$XDG_STATE_HOME/fleetbench/logs``, else
        ``~/.local/state/fleetbench/logs``.
    """
    if os.environ.get(LOG_DIR_ENV):
        return Path(os.environ[LOG_DIR_ENV])
    state = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(state) / "fleetbench" / "logs"


def write_crash_log(exc: BaseException, argv: Sequence[str]) -> Path:
    """Write the command line and traceback of ``exc`` to a new file; return its path.

    Falls back to the system's temporary directory when the log directory cannot be written.

    Parameters
    ----------
    exc : BaseException
    argv : sequence of str

    Returns
    -------
    pathlib.Path
    """
    text = "fleetbench " + " ".join(argv) + "\n\n" + "".join(traceback.format_exception(exc))
    name = f"fleetbench-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.log"
    for directory in (crash_log_dir(), Path(tempfile.gettempdir())):
        try:
            directory.mkdir(parents=True, exist_ok=True)
            path = directory / name
            path.write_text(text, encoding="utf-8")
            return path
        except OSError:
            continue
    raise exc


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``fleetbench`` command line and return its exit status.

    Parameters
    ----------
    argv : sequence of str, optional
        Arguments after the program name (default ``sys.argv[1:]``).

    Returns
    -------
    int
        The command's status; 2 for bad input, 1 for a failure, 130 after Ctrl-C, 143
        after SIGTERM, 129 after SIGHUP.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv or os.environ.get("FLEETBENCH_DEBUG", "") not in ("", "0")
    try:
        with terminate_as_interrupt():
            args = build_parser().parse_args(argv)
            settle_model(args)
            return resolve_handler(args.handler)(args)
    except INPUT_ERRORS as exc:
        _say(f"error: {describe(exc)}", exc, debug)
        return EXIT_USAGE
    except KeyboardInterrupt as exc:  # Ctrl-C, or SIGTERM / SIGHUP as `Terminated`
        return _stopped(exc)
    except BrokenPipeError:
        # The reader went away (`fleetbench ... | head`): stop quietly, as shell tools do.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0
    except ENVIRONMENT_ERRORS as exc:
        _say(f"error: {describe(exc)}", exc, debug)
        return EXIT_FAILURE
    except Exception as exc:  # noqa: BLE001 - the boundary: a bug becomes one line and a log file
        stop = interruption(exc)
        if stop is not None:
            return _stopped(stop)
        if debug:
            traceback.print_exception(exc, file=sys.stderr)
            return EXIT_FAILURE
        path = write_crash_log(exc, argv)
        print(
            f"fleetbench: internal error: {type(exc).__name__}: {describe(exc)} "
            f"(traceback in {path}; --debug prints it)",
            file=sys.stderr,
        )
        return EXIT_FAILURE


def interruption(exc: BaseException) -> KeyboardInterrupt | None:
    """Return the Ctrl-C or termination that ``exc`` was raised from, if any.

    Python wraps some exceptions in another: in 3.11, one raised by a descriptor's
    ``__set_name__`` while a class body runs becomes a ``RuntimeError`` whose cause it is.
    A signal that arrives while a module is being imported can therefore reach the command
    line as such an error; it is still the user's (or the system's) request to stop.

    Parameters
    ----------
    exc : BaseException

    Returns
    -------
    KeyboardInterrupt or None
        The first `KeyboardInterrupt` (`Terminated` included) along the chain of causes.
    """
    seen: set[int] = set()
    cause: BaseException | None = exc
    while cause is not None and id(cause) not in seen:
        if isinstance(cause, KeyboardInterrupt):
            return cause
        seen.add(id(cause))
        cause = cause.__cause__
    return None


def _stopped(exc: KeyboardInterrupt) -> int:
    """Say that the command was stopped, and return its exit status (130, or 128 + the signal)."""
    if isinstance(exc, Terminated):
        print(f"fleetbench: terminated ({signal.Signals(exc.signum).name})", file=sys.stderr)
        return 128 + exc.signum
    print("fleetbench: interrupted", file=sys.stderr)
    return EXIT_INTERRUPTED


def _say(line: str, exc: BaseException, debug: bool) -> None:
    if debug:
        traceback.print_exception(exc, file=sys.stderr)
    print(f"fleetbench: {line}", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
