"""A resident runner on one device: ``runner.pyz serve`` started once, spoken to in request lines.

`ResidentRunner` holds one device's serving runner (`harness.runner.protocol`'s serve protocol)
through the transport's streaming handle (`devices.transport.Process`) and turns each
request into a `harness.contract.RunnerOutput`, the same as a one-shot run's.

Decisions:

* **Started on first use, again after a failure.** The process starts with the first
  request (or `start`); its ready line is read within the start timeout. A request that
  times out kills the process (`Process.close`), and one whose process ended without a
  reply leaves it closed: either way the next request starts a new process, so a stuck or
  dead runner costs one client, not the run.
* **A timeout is the caller's failure**: `request` raises `devices.errors.CommandTimeout`
  after killing the runner, like ``Transport.run``; a runner that ended mid-request is a
  failed `RunnerOutput` (`harness.contract.ended_output`, SIGKILL read as out of memory;
  over SSH the signal is not known, paramiko ignores ``exit-signal`` and reports -1, so
  there it is a runner error).
  Transport failures (unreachable, connection lost) propagate: the caller drops the
  connection, and a device that comes back gets a new transport and a new runner.
* **Nothing a device sends is trusted**: each line is parsed once at the contract
  boundary (`harness.contract.parse_reply`): one over `harness.contract.MAX_REPLY_BYTES`,
  not a JSON object, holding NaN or Infinity, malformed (`harness.document.parse_document`
  with ``from_device``), or a ready line of another protocol version is a ``"runner
  error"`` with a one-line reason; a refused ready line leaves no process running.
* **A failed reply does not restart the runner** (bad arguments, a missing file): the
  process answered, so it is healthy; an ``"out of memory"`` reply does restart it,
  since a failed allocation can leave a runtime in a state no one has tested.
* **One way to start and to train**: `ResidentRunner.for_device` (the serve command line
  in the device's work directory) and `ResidentRunner.train` (a ``train`` request whose
  device paths are made relative to that directory, `relative_paths`) are what the FL
  devices executor and the round-cost measurement (`harness.roundcost`) both call, so the
  measured fixed cost of a request is that of the requests FL rounds send. Paths go
  relative because request lines reach the runner as data, never through the device's
  shell, so a device that maps the paths of its command lines (the emulated phone's
  sandbox) would not map them; the work directory given on the command line it does map.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from devices.errors import CommandTimeout, ProcessEnded
from devices.transport import Process, Transport
from harness.contract import (
    RunnerOutput,
    RunnerStart,
    bench_request,
    ended_output,
    parse_reply,
    serve_argv,
    train_request,
)
from harness.document import EMPTY_DOCUMENT, RunnerDocument


def relative_paths(workdir: str | None, **paths: str) -> dict[str, str]:
    """Return device ``paths`` relative to ``workdir`` (a serving runner's ``--cwd``) where they lie under it.

    Parameters
    ----------
    workdir : str or None
        The device's work directory (absolute); None leaves every path as it is.
    **paths : str
        Paths on the device, by name.

    Returns
    -------
    dict of str to str
    """
    if workdir is None:
        return dict(paths)
    base = workdir.rstrip("/") + "/"
    return {k: v[len(base) :] if v.startswith(base) else v for k, v in paths.items()}


class ResidentRunner:
    """One device's serving runner (see the module docstring).

    Parameters
    ----------
    transport : Transport
        The device's open transport.
    argv : sequence of str
        The serve command line (`harness.contract.serve_argv`).
    start_timeout : float
        Seconds the ready line may take (imports and start-up on a slow device).
    clock : callable
        Monotonic clock in seconds.
    cwd : str, optional
        The runner's ``--cwd`` on the device: `train` sends paths under it relative to it.
    """

    def __init__(
        self,
        transport: Transport,
        argv: Sequence[str],
        *,
        start_timeout: float,
        clock: Callable[[], float] = time.perf_counter,
        cwd: str | None = None,
    ) -> None:
        self.transport = transport
        self.argv = list(argv)
        self.cwd = cwd
        self.start_timeout = start_timeout
        self.clock = clock
        self.process: Process | None = None
        #: The ready document of the current process (``pid``, ``startup_seconds``, ...).
        self.ready: RunnerDocument = EMPTY_DOCUMENT
        #: Processes started so far, and the host-side seconds each start took (to its ready line).
        self.starts = 0
        self.start_seconds: list[float] = []

    @classmethod
    def for_device(
        cls,
        transport: Transport,
        start: str | RunnerStart,
        runner: str,
        *,
        backend: str,
        threads: int,
        workdir: str,
        start_timeout: float,
        clock: Callable[[], float] = time.perf_counter,
    ) -> ResidentRunner:
        """Return the (not yet started) serving runner of ``device``, working in ``workdir``.

        Parameters
        ----------
        transport : Transport
            The device's open transport.
        start : str or harness.contract.RunnerStart
            How the device starts the runner's Python (its interpreter's path, or a runtime
            bundle's loader; `harness.phone_runtime`).
        runner : str
            The deployed ``runner.pyz`` on the device.
        backend : str
        threads : int
            The runner's defaults (`harness.contract.serve_argv`).
        workdir : str
            The device's work directory: the runner's ``--cwd``.
        start_timeout : float
        clock : callable

        Returns
        -------
        ResidentRunner
        """
        argv = serve_argv(start, runner, backend=backend, threads=threads, cwd=workdir)
        return cls(transport, argv, start_timeout=start_timeout, clock=clock, cwd=workdir)

    @property
    def pid(self) -> int | None:
        """The serving process's pid on the device (from its ready line), None when not running."""
        return self.ready.pid if self.process is not None else None

    def alive(self) -> bool:
        """Whether a serving process is running."""
        return self.process is not None and self.process.alive()

    def start(self) -> RunnerOutput:
        """Start the serving process (a running one is kept) and read its ready line.

        Returns
        -------
        RunnerOutput
            The ready document; not ok when start-up failed (e.g. ``"missing runtime"``),
            and then no process is left running.

        Raises
        ------
        CommandTimeout
            No ready line within ``start_timeout`` (the process is killed).
        TransportError
            The device could not start it.
        """
        if self.alive():
            return RunnerOutput("ok", "", self.ready)
        self.close()
        began = self.clock()
        self.process = self.transport.start(self.argv)
        self.starts += 1
        output = self._reply(self.start_timeout, ready=True)
        self.start_seconds.append(self.clock() - began)
        if output.ok:
            self.ready = output.document
        else:
            self.close()
        return output

    def request(self, doc: Mapping[str, Any], timeout: float) -> tuple[RunnerOutput, float]:
        """Send one request and wait for its reply, starting the process when none runs.

        Parameters
        ----------
        doc : mapping
            The request (`harness.contract.train_request`).
        timeout : float
            Seconds the reply may take once the request is written.

        Returns
        -------
        output : RunnerOutput
        seconds : float
            Host-side wall time from writing the request to reading its reply.

        Raises
        ------
        CommandTimeout
            No reply in time: the process was killed; the next request starts another.
        TransportError
            The device failed (start-up, or the connection under the process).
        """
        if not self.alive():
            ready = self.start()
            if not ready.ok:
                return ready, 0.0
        assert self.process is not None
        line = json.dumps(dict(doc), allow_nan=False)
        began = self.clock()
        try:
            self.process.write_line(line)
        except ProcessEnded as exc:
            self.close()
            return ended_output(exc.returncode, exc.stderr), self.clock() - began
        output = self._reply(timeout)
        seconds = self.clock() - began
        if output.status == "out of memory":
            self.close()
        return output, seconds

    def train(
        self,
        artifacts: str,
        *,
        params: str,
        data: str,
        out: str,
        timeout: float,
        fjord: Mapping[str, Sequence[Any]] | None = None,
        **options: Any,
    ) -> tuple[RunnerOutput, float]:
        """Send one ``train`` request (`harness.contract.train_request`) and wait for its reply.

        Device paths under the runner's ``cwd`` (the artifact sets, the FjORD sets and
        index files included) are sent relative to it (see the module docstring).

        Parameters
        ----------
        artifacts, params, data, out : str
            Paths on the device.
        timeout : float
            As for `request`.
        fjord : mapping, optional
            ``{"sets", "index", "widths"}`` with device paths.
        **options
            The other keywords of `harness.contract.train_request` (``backend``, ``epochs``,
            ``lr``, ``threads``, ``seed``, ``request_id``, ``syncdrop``).

        Returns
        -------
        output : RunnerOutput
        seconds : float
            As for `request`.

        Raises
        ------
        CommandTimeout, TransportError
            As for `request`.
        """
        rel = relative_paths(self.cwd, artifacts=artifacts, params=params, data=data, out=out)
        if fjord is not None:
            fjord = {
                "sets": [relative_paths(self.cwd, p=p)["p"] for p in fjord["sets"]],
                "index": [None if p is None else relative_paths(self.cwd, p=p)["p"] for p in fjord["index"]],
                "widths": list(fjord["widths"]),
            }
        doc = train_request(
            rel["artifacts"], params=rel["params"], data=rel["data"], out=rel["out"], fjord=fjord, **options
        )
        return self.request(doc, timeout)

    def bench(self, artifacts: str, *, timeout: float, data: str | None = None, **options: Any) -> RunnerOutput:
        """Send one ``bench`` request (`harness.contract.bench_request`) and wait for its reply.

        Device paths under the runner's ``cwd`` are sent relative to it, as by `train`.

        Parameters
        ----------
        artifacts : str
            The deployed artifact set on the device.
        timeout : float
            As for `request`.
        data : str, optional
            A deployed bench-data shard on the device.
        **options
            The other keywords of `harness.contract.bench_options` and ``request_id``.

        Returns
        -------
        RunnerOutput

        Raises
        ------
        CommandTimeout, TransportError
            As for `request`.
        """
        rel = relative_paths(self.cwd, artifacts=artifacts, **({"data": data} if data else {}))
        return self.request(bench_request(rel["artifacts"], data=rel.get("data"), **options), timeout)[0]

    def _reply(self, timeout: float, ready: bool = False) -> RunnerOutput:
        assert self.process is not None
        try:
            line = self.process.read_line(timeout)
        except CommandTimeout:
            self.close()
            raise
        except ProcessEnded as exc:
            self.close()
            return ended_output(exc.returncode, exc.stderr)
        return parse_reply(line, ready=ready)

    def close(self) -> None:
        """End the serving process (``exit`` is not needed: closing its stdin ends it) (idempotent)."""
        process, self.process = self.process, None
        self.ready = EMPTY_DOCUMENT
        if process is not None:
            try:
                process.close()
            except Exception:  # noqa: BLE001 - a broken connection must not hide what the caller reports
                pass
