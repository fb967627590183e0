"""The runner's entry point: ``python3 runner.pyz MODE ...`` (or ``python -m harness.runner``)."""

from __future__ import annotations

import json
import os
import sys

from .modes import run
from .protocol import EXIT_CODES
from .serve import serve


def main(argv: list | None = None) -> int:
    """Command-line entry point: print one JSON document on stdout, return the exit status.

    File descriptor 1 is pointed at stderr while the runner works, so that
    nothing a library prints can corrupt the document; ``serve`` keeps it so for its whole
    life and writes its replies to the saved descriptor.

    Parameters
    ----------
    argv : list of str, optional
        Defaults to ``sys.argv[1:]``.

    Returns
    -------
    int
        0 ok, 2 bad arguments, 3 missing runtime, 4 out of memory, 5 runner error, 6 out of space.
    """
    argv = sys.argv[1:] if argv is None else argv
    sys.stdout.flush()
    saved = None
    try:
        saved = os.dup(1)
        os.dup2(2, 1)
    except OSError:
        saved = None
    real_stdout = sys.stdout
    sys.stdout = sys.stderr
    try:
        if argv[:1] == ["serve"]:
            replies = os.fdopen(os.dup(saved), "w", encoding="utf-8") if saved is not None else real_stdout
            try:
                return serve(argv, replies)
            finally:
                replies.flush()
        doc = run(argv)
    finally:
        sys.stdout = real_stdout
        sys.stderr.flush()
        if saved is not None:
            os.dup2(saved, 1)
            os.close(saved)
    text = json.dumps(doc, allow_nan=False)
    sys.stdout.write(text + "\n")
    sys.stdout.flush()
    return EXIT_CODES.get(doc["status"], 5)


if __name__ == "__main__":
    sys.exit(main())
