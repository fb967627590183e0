"""The resident runner: one process per device per run, one JSON request per stdin line, one reply per line.

The protocol is `harness.runner.protocol`'s.

Decisions:

* one process per device per run: the imports (numpy, the runtime), the sessions and
  the shard (kept per path, size and mtime) stay in memory between requests; at most
  ``--max-sessions`` backends are kept, least recently used dropped first.
* a reused backend starts from the set's initial parameters, the request's learning
  rate and dense masks, so a reply equals the one-shot mode's document for the same
  arguments (timings aside). An ``ort`` session of an AdamW set cannot reset its
  optimizer state and is opened anew for every request.
* peak memory per request: before each request ``5`` is written to
  ``/proc/self/clear_refs``, which resets VmHWM to the current resident set, so
  ``peak_memory_bytes`` is the peak during the request (``peak_memory_scope``
  "request"); where that write is refused the value is the process's peak since start
  (scope "process"). Either way it includes the resident interpreter, imports and kept
  sessions, which a one-shot process also holds.
* the request keys are command-line options, so one parser checks both paths.
* ``--cwd``: paths inside request lines reach the runner as data, never through a
  device's shell, so a device that maps paths in its command lines (the emulated
  phone's sandbox) would not map them; the host sends paths relative to the directory
  given on the command line instead, which every device maps.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import sys
import time

from .arguments import build_parser
from .backends import BACKEND_CLASSES
from .failures import bad
from .modes import guarded, run_mode
from .probes import reset_peak_memory
from .protocol import EXIT_CODES, PROTOCOL_VERSION, SERVE_KEYS, new_result
from .runtimes import import_numpy


class Lru:
    """A small least-recently-used map: ``get(key, make)`` returns the kept value or keeps ``make()``.

    Parameters
    ----------
    limit : int
        Values kept; the least recently used is dropped beyond it.
    """

    def __init__(self, limit: int) -> None:
        self.limit = max(1, int(limit))
        self.entries: collections.OrderedDict = collections.OrderedDict()

    def get(self, key, make):
        """Return the value of ``key``, making and keeping it when absent.

        Parameters
        ----------
        key : hashable
        make : callable

        Returns
        -------
        object
        """
        if key in self.entries:
            self.entries.move_to_end(key)
            return self.entries[key]
        value = make()
        self.put(key, value)
        return value

    def put(self, key, value) -> None:
        """Keep ``value`` under ``key`` as the most recently used.

        Parameters
        ----------
        key : hashable
        value : object
        """
        self.entries[key] = value
        self.entries.move_to_end(key)
        while len(self.entries) > self.limit:
            self.entries.popitem(last=False)


class SessionCache:
    """The serving runner's open backends, one per (backend, artifact set, threads, set content).

    A reused backend is `reset` (the set's initial parameters, the request's learning rate,
    dense masks), so a request's document is the same as a fresh process's; an ``ort``
    session over an AdamW set is never reused (its optimizer state cannot be reset) and
    costs its open on every request.

    Parameters
    ----------
    limit : int
        Open backends kept.
    """

    def __init__(self, limit: int) -> None:
        self.kept = Lru(limit)
        self.stats = {"opened": 0, "reused": 0, "open_seconds": 0.0}

    def begin(self) -> None:
        """Start counting a new request's opens and reuses."""
        self.stats = {"opened": 0, "reused": 0, "open_seconds": 0.0}

    def open(self, args: argparse.Namespace, manifest: dict, lr: float | None):
        """Return a ready backend for ``args.artifacts``, reused when one is kept.

        Parameters
        ----------
        args : argparse.Namespace
        manifest : dict
        lr : float or None

        Returns
        -------
        OrtBackend, OnnxBackend or TorchBackend
        """
        files = json.dumps(manifest.get("files") or {}, sort_keys=True)
        key = (args.backend, os.path.realpath(args.artifacts), int(args.threads), files)
        backend = self.kept.entries.get(key)
        if backend is not None:
            self.kept.get(key, lambda: backend)
            backend.reset(lr)
            self.stats["reused"] += 1
            return backend
        start = time.perf_counter()
        backend = BACKEND_CLASSES[args.backend](args.artifacts, manifest, args.threads, lr)
        self.stats["open_seconds"] += time.perf_counter() - start
        self.stats["opened"] += 1
        if backend.reusable:
            self.kept.put(key, backend)
        return backend


class Server:
    """The serving runner's state: defaults, open sessions and files kept between requests.

    Parameters
    ----------
    threads : int
        The default ``threads`` of requests (numpy's BLAS keeps this count for the process).
    backend : str or None
        The default ``backend`` of requests.
    max_sessions : int
    """

    def __init__(self, threads: int, backend: str | None, max_sessions: int) -> None:
        self.threads = threads
        self.backend = backend
        self.sessions = SessionCache(max_sessions)
        self.files = Lru(max(4, 2 * max_sessions))
        self.requests = 0

    def namespace(self, request: dict, mode: str) -> argparse.Namespace:
        """Turn a request into the namespace of its mode (keys are the options, ``_`` for ``-``).

        Parameters
        ----------
        request : dict
        mode : str

        Returns
        -------
        argparse.Namespace

        Raises
        ------
        RunnerFailure
            "bad arguments" on an unknown key or a value that is not a number or a string.
        """
        argv = [mode]
        options = dict(request)
        options.setdefault("threads", self.threads)
        if self.backend is not None:
            options.setdefault("backend", self.backend)
        for key, value in options.items():
            if key in SERVE_KEYS or value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float, str)):
                raise bad(f"request key {key!r}: expected a number or a string, got {value!r}")
            argv += ["--" + key.replace("_", "-"), str(value)]
        args = build_parser().parse_args(argv)
        for key in ("params_inline", "return_params", "fjord", "syncdrop"):
            setattr(args, key, request.get(key))
        args.sessions, args.files = self.sessions, self.files
        return args

    def handle(self, raw: bytes) -> dict:
        """Answer one request line (never raises).

        Parameters
        ----------
        raw : bytes
            The line as read.

        Returns
        -------
        dict
            The reply document.
        """
        start = time.perf_counter()
        self.requests += 1
        result = new_result()
        result["id"] = None
        result["peak_memory_scope"] = "request" if reset_peak_memory() else "process"
        self.sessions.begin()

        def work() -> None:
            try:
                request = json.loads(raw.decode("utf-8"))
            except ValueError as exc:
                raise bad(f"request {self.requests}: not JSON ({exc})") from None
            if not isinstance(request, dict):
                raise bad(f"request {self.requests}: not a JSON object")
            result["id"] = request.get("id")
            mode = request.get("mode")
            result["mode"] = mode
            if mode in ("ping", "exit"):
                return
            if mode not in ("bench", "train"):
                raise bad(f"request {self.requests}: mode {mode!r} is not bench, train, ping or exit")
            run_mode(self.namespace(request, mode), result)
            result["sessions"] = dict(self.sessions.stats)

        doc = guarded(result, work)
        doc["request_seconds"] = time.perf_counter() - start
        return doc


def serve(argv: list, out) -> int:
    """Serve requests from stdin until its end or an ``exit`` request (see the module docstring).

    Parameters
    ----------
    argv : list of str
        ``serve`` and its options.
    out : file
        Where replies go (the real stdout; file descriptor 1 points at stderr meanwhile).

    Returns
    -------
    int
        0 after ``exit`` or the end of stdin; the status's exit code when start-up failed.
    """
    start = time.perf_counter()
    ready = new_result()
    ready.update(mode="serve", event="ready", protocol=PROTOCOL_VERSION, pid=os.getpid())
    server = None

    def work() -> None:
        nonlocal server
        args = build_parser().parse_args(argv)
        if args.threads < 1 or args.max_sessions < 1:
            raise bad(f"--threads and --max-sessions must be at least 1, got {args.threads}, {args.max_sessions}")
        ready.update(threads=args.threads, backend=args.backend, max_sessions=args.max_sessions)
        if args.cwd is not None:
            try:
                os.chdir(args.cwd)
            except OSError as exc:
                raise bad(f"--cwd {args.cwd}: {exc.strerror or exc}") from None
        ready["cwd"] = os.getcwd()
        import_numpy(args.threads)
        if args.backend is not None:
            BACKEND_CLASSES[args.backend].load_runtime()
        server = Server(args.threads, args.backend, args.max_sessions)

    ready = guarded(ready, work)
    ready["peak_memory_scope"] = "request" if reset_peak_memory() else "process"
    ready["startup_seconds"] = time.perf_counter() - start
    _reply(out, ready)
    if server is None:
        return EXIT_CODES.get(ready["status"], 5)
    stdin = sys.stdin.buffer
    while True:
        raw = stdin.readline()
        if not raw:
            return 0
        if not raw.strip():
            continue
        doc = server.handle(raw)
        _reply(out, doc)
        if doc.get("mode") == "exit" or doc.get("error") == "interrupted":
            return 0


def _reply(out, doc: dict) -> None:
    out.write(json.dumps(doc, allow_nan=False) + "\n")
    out.flush()
