"""The round-cost model of a device: what one FL client round costs, measured by the campaign.

One client round on a device is: the sub-model's parameters go down, the runner trains
``steps`` local steps, the trained parameters come back. Its predicted wall time is::

    seconds = fixed_s
            + steps * batch * latency(arch)                  (harness.latency, any architecture)
            + down_latency_s + bytes_down * down_s_per_byte  (the device's transport, host -> device)
            + up_latency_s   + bytes_up   * up_s_per_byte    (device -> host)

``latency(arch)`` is the device's per-image training time predicted by its latency model
(`harness.latency.LatencyModel.predict`) for the profile configuration (model, batch,
backend) the run trains with; the other terms are a `RoundCostModel`, measured per device
by `measure_round_cost` (a step of ``fleetbench profile``, on by default) and stored with
its provenance (campaign, time, backend, optimizer, threads) in the profile store.

Measurement (decided here)
    *Transfers*: files of two sizes are pushed and pulled through the device's own
    transport (``put`` / ``get``, the calls the FL devices executor makes), ``repeats``
    (`DEFAULT_REPEATS`) times each; the line through each size's median seconds
    (`median_line`) gives, per direction, the seconds per byte (slope) and the
    per-transfer latency (intercept). Two sizes are the fewest that separate the two.
    The campaign sends the model's own payloads, the parameter files of the narrowest
    and the widest set it profiles (`payload_bytes`), which is what FL rounds move: a
    transport's time need not be a line in bytes (adb's sync protocol moves 64 KiB
    chunks, and a file of more than one chunk waits on a delayed acknowledgement; on the
    emulated phone a pull took 54 ms for 16 KiB, 96 ms for 103 KiB, 104 ms for 1 MiB),
    so the line is right where FL needs it. `DEFAULT_TRANSFER_BYTES` (bracketing the
    zoo's small models, tens of kB to a MB) is the default elsewhere. Medians, because
    one transfer or request that the host delayed (another lane's work, a scheduler
    hiccup) would otherwise set the model: with a single point per size, a 70 ms hiccup
    in one request of a 0.2 s round made a fixed cost eight times the real one.
    *Fixed cost*: what a request costs FL rounds on the **resident runner**, on the code
    path the FL devices executor takes: `harness.resident.ResidentRunner.for_device` starts
    ``runner.pyz serve`` through the device's transport (with the cells' backend and
    threads; a profile whose cells took later passes on that runner measures on it rather
    than starting a second one), and `ResidentRunner.train` sends ``train`` requests at
    the profile's widest width on shards of two step counts (`DEFAULT_STEP_COUNTS`: the
    campaign's bench data when it has some, else synthetic), starting from the set's initial parameters; on a
    slow device the longer request's steps are held to `LONG_REQUEST_S` of the widest
    cell's step time (`step_counts_for`). First one
    warm-up request per shard (not fitted; kept in the samples with the runner's start): it
    opens the session and puts the shard in the runner's file cache, as a FL client's first
    round does; rounds after that find both. Then ``repeats`` requests per step count. The
    fixed cost of a resident request is the median, over the fitted requests, of its wall
    time seen from the host (`ResidentRunner.request`'s seconds, what the executor reports
    as a client's compute time) less the time of its steps as the runner timed them: writing
    the request and reading the reply over the transport, loading the parameter file,
    resetting the kept session to them (the session switch of a width seen before), and
    writing the result, and on a device with a power sensor the energy meter's idle window
    before the steps: the requests carry the power options an FL round's do
    (`harness.contract.round_power_options`). (A line of wall time against step count would
    give it as intercept, but on a throttled device the intercept inherits every wobble of
    the step time times the longer request's steps; the line is the fallback for points
    without step times.) The median step time at that width is stored beside it as a check
    on the latency model, not used for prediction: the latency model predicts every
    architecture, the step time only one. Not in the fixed cost: the runner's start (once
    per device and run) and opening a
    session for a width the runner has not held yet (once per width while at most
    ``--max-sessions`` widths are in use). The one-shot ``train`` mode (a process per client
    round, the devices executor's ``resident=False``, kept for comparison) is not measured:
    no prediction uses it. Negative intercepts or slopes (noise around zero) are clamped to
    0.

Fallback
    `round_cost` costs a device without a round-cost measurement from its latency model
    alone (no fixed cost, no transfers) and says so through ``warn``, once per device.

Everything here but `measure_round_cost` is pure.
"""

from __future__ import annotations

import math
import statistics
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from exporters.userinput import InputError
from harness.latency import DeviceModels, fit

if TYPE_CHECKING:
    from devices.fleet import Device
    from devices.transport import Transport
    from exporters.arch import Arch
    from harness.contract import RunnerStart
    from harness.resident import ResidentRunner

#: Local step counts of the two ``train`` requests whose intercept is the fixed cost.
DEFAULT_STEP_COUNTS: tuple[int, int] = (2, 26)
#: Seconds the longer request's steps may take on a device whose step time is known
#: (`step_counts_for`): a slow board measures its fixed cost in fewer steps, not for minutes.
LONG_REQUEST_S = 2.0
#: Fitted requests per step count, and transfers per size and direction (their medians are fitted).
DEFAULT_REPEATS = 3
#: Sizes of the files pushed and pulled to fit the transfer lines (bytes).
DEFAULT_TRANSFER_BYTES: tuple[int, int] = (16 * 1024, 1024 * 1024)
#: Backend chosen when a device was measured with several (the one FL trains with first).
BACKEND_PREFERENCE: tuple[str, ...] = ("ort", "onnx", "torch")
#: Learning rate of the measuring ``train`` requests (any positive value times the same).
MEASURE_LR = 0.05

#: ``(device, arch, steps, bytes_down, bytes_up) -> seconds``: the round-cost model's one type,
#: taken by the planner, the server's predictions, the virtual clock, FLuID and FedDrop. ``steps``
#: is the training work in full-batch steps (``epochs * examples / batch``: a short batch counts
#: its share), so the round trains ``steps * batch`` images.
RoundCost = Callable[[str, "Arch", float, int, int], float]
#: ``(device, nbytes) -> seconds`` or None: an override of a device's transfer time.
TransferFn = Callable[[str, int], "float | None"]


def step_counts_for(
    step_seconds: float | None, counts: tuple[int, int] = DEFAULT_STEP_COUNTS, budget_s: float = LONG_REQUEST_S
) -> tuple[int, int]:
    """Return the step counts of the measuring requests on a device whose step takes ``step_seconds`` (pure).

    The fixed cost is a request's wall time less its steps' own time, so it does not need
    long requests; the longer one only has to differ from the shorter. Its steps are held
    to ``budget_s`` seconds, and to at least the shorter count plus two.

    Parameters
    ----------
    step_seconds : float or None
        The device's median step time at the measured width (its cell's), None when unknown.
    counts : tuple of int
        The shorter and the longer request's steps when the step time allows.
    budget_s : float
        Seconds the longer request's steps may take.

    Returns
    -------
    tuple of int
        ``counts``, or the shorter count and fewer steps for the longer request.
    """
    short, long = counts
    if step_seconds is None or not math.isfinite(step_seconds) or step_seconds <= 0:
        return counts
    fitting = int(budget_s / step_seconds)
    return short, max(short + 2, min(long, fitting))


@dataclass(frozen=True)
class RoundCostModel:
    """One device's measured round costs, with provenance.

    Attributes
    ----------
    device, model : str
    width : float
        Width the fixed cost was measured at.
    batch : int
    backend, optimizer : str
    threads : int
        The configuration the ``train`` requests ran with.
    fixed_s : float
        Fixed cost of one round's request on the resident runner (intercept of request time
        against steps).
    step_s : float
        Seconds per local step at ``width`` (slope of that fit; a check, not used to predict).
    down_s_per_byte, down_latency_s : float
        Host -> device transfer: seconds per byte and per transfer.
    up_s_per_byte, up_latency_s : float
        Device -> host transfer.
    campaign_id : int or None
        The campaign that measured it.
    measured_at : float
        Unix time of the measurement.
    samples : mapping
        The raw points: ``{"train": [{"steps", "seconds", "step_seconds", "load_seconds",
        "sessions_opened"}], "down": [{"bytes", "seconds"}], "up": [...]}``, and as measured
        by `measure_round_cost` the warm-up requests (``"warmup"``, as ``"train"``) and the
        resident runner's start (``"start": [{"seconds"}]``), neither fitted.
    """

    device: str
    model: str
    width: float
    batch: int
    backend: str
    optimizer: str
    threads: int
    fixed_s: float
    step_s: float
    down_s_per_byte: float
    down_latency_s: float
    up_s_per_byte: float
    up_latency_s: float
    campaign_id: int | None = None
    measured_at: float = 0.0
    samples: Mapping[str, Any] = field(default_factory=dict)

    def down_seconds(self, nbytes: int) -> float:
        """Return the predicted host -> device transfer time of ``nbytes`` (0 for nothing sent)."""
        return transfer_seconds(nbytes, self.down_s_per_byte, self.down_latency_s)

    def up_seconds(self, nbytes: int) -> float:
        """Return the predicted device -> host transfer time of ``nbytes`` (0 for nothing sent)."""
        return transfer_seconds(nbytes, self.up_s_per_byte, self.up_latency_s)

    def config(self) -> dict[str, Any]:
        """Return the configuration the model was measured in (``batch, backend, optimizer, threads``)."""
        return {"batch": self.batch, "backend": self.backend, "optimizer": self.optimizer, "threads": self.threads}


class RoundCostError(RuntimeError):
    """A round-cost measurement that failed on the device (the runner's status and message)."""

    def __init__(self, status: str, message: str) -> None:
        super().__init__(f"{status}: {message}")
        self.status = status


# --------------------------------------------------------------------------- pure maths


def fit_line(x: Sequence[float], y: Sequence[float]) -> tuple[float, float]:
    """Fit ``y = intercept + slope * x`` by least squares; both clamped to at least 0.

    Parameters
    ----------
    x, y : sequence of float
        Equally long, at least two distinct ``x``.

    Returns
    -------
    (intercept, slope) : (float, float)
        When clamping the slope to 0, the intercept is the mean of ``y``; when clamping the
        intercept to 0, the slope is the least-squares slope through the origin.

    Raises
    ------
    InputError
        On unequal lengths, fewer than two distinct ``x`` or a non-finite value.
    """
    xs, ys = [float(v) for v in x], [float(v) for v in y]
    if len(xs) != len(ys):
        raise InputError(f"fit_line: {len(xs)} x values for {len(ys)} y values")
    if not all(math.isfinite(v) for v in (*xs, *ys)):
        raise InputError("fit_line: values must be finite")
    if len(set(xs)) < 2:
        raise InputError(f"fit_line: needs two distinct x values, got {sorted(set(xs))}")
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((a - mx) ** 2 for a in xs)
    slope = sum((a - mx) * (b - my) for a, b in zip(xs, ys, strict=True)) / sxx
    intercept = my - slope * mx
    if slope < 0:
        return max(my, 0.0), 0.0
    if intercept < 0:
        return 0.0, max(sum(a * b for a, b in zip(xs, ys, strict=True)) / sum(a * a for a in xs), 0.0)
    return intercept, slope


def median_line(x: Sequence[float], y: Sequence[float]) -> tuple[float, float]:
    """Fit `fit_line` through the median ``y`` of each distinct ``x`` (robust to a stray point per ``x``).

    Parameters
    ----------
    x : sequence of float
        Sizes or step counts; repeated values form one group.
    y : sequence of float
        Seconds, one per ``x``.

    Returns
    -------
    (intercept, slope) : (float, float)
        `fit_line` of the groups' medians.

    Raises
    ------
    InputError
        On unequal lengths, or as `fit_line` (fewer than two groups, a non-finite value).
    """
    if len(x) != len(y):
        raise InputError(f"median_line: {len(x)} x values for {len(y)} y values")
    groups: dict[float, list[float]] = {}
    for a, b in zip(x, y, strict=True):
        groups.setdefault(float(a), []).append(float(b))
    xs = sorted(groups)
    return fit_line(xs, [statistics.median(groups[a]) for a in xs])


def payload_bytes(set_dirs: Sequence[Path]) -> tuple[int, int]:
    """Return the transfer sizes that bracket the parameter payloads of ``set_dirs``.

    Parameters
    ----------
    set_dirs : sequence of pathlib.Path
        Artifact sets of one model (each holds ``initial_parameters.npy``, the file an FL
        round sends down and gets back at that width).

    Returns
    -------
    (int, int)
        The smallest and largest parameter file; with one size ``S`` only, ``(S // 4, S)``
        (a half-width sub-model has about a quarter of the parameters).

    Raises
    ------
    InputError
        When ``set_dirs`` is empty.
    """
    sizes = sorted({(Path(d) / "initial_parameters.npy").stat().st_size for d in set_dirs})
    if not sizes:
        raise InputError("payload_bytes: no artifact set")
    return (sizes[0], sizes[-1]) if len(sizes) > 1 else (max(1, sizes[0] // 4), sizes[0])


def transfer_seconds(nbytes: int, s_per_byte: float, latency_s: float) -> float:
    """Return ``latency_s + nbytes * s_per_byte``, or 0 when nothing is sent.

    Parameters
    ----------
    nbytes : int
    s_per_byte, latency_s : float

    Returns
    -------
    float
    """
    return 0.0 if nbytes <= 0 else float(latency_s) + float(nbytes) * float(s_per_byte)


def round_seconds(
    cost: RoundCostModel | None, per_image_s: float, batch: int, steps: float, bytes_down: int, bytes_up: int
) -> float:
    """Return the predicted wall time of one client round (the module docstring's equation).

    Parameters
    ----------
    cost : RoundCostModel or None
        None: the latency-only cost (no fixed cost, no transfers).
    per_image_s : float
        Predicted seconds per image at the round's architecture.
    batch : int
    steps : float
        Training work in full-batch steps (`RoundCost`).
    bytes_down, bytes_up : int

    Returns
    -------
    float
    """
    compute = max(float(steps), 0.0) * int(batch) * float(per_image_s)
    if cost is None:
        return compute
    return cost.fixed_s + compute + cost.down_seconds(bytes_down) + cost.up_seconds(bytes_up)


def fit_round_cost(
    train: Sequence[Mapping[str, float]],
    down: Sequence[Mapping[str, float]],
    up: Sequence[Mapping[str, float]],
    *,
    extra: Mapping[str, Sequence[Mapping[str, float]]] | None = None,
    **provenance: Any,
) -> RoundCostModel:
    """Fit a `RoundCostModel` from its raw points (see "Measurement").

    Parameters
    ----------
    train : sequence of mapping
        ``{"steps", "seconds"}`` per ``train`` request (``step_seconds`` optional).
    down, up : sequence of mapping
        ``{"bytes", "seconds"}`` per transfer.
    extra : mapping of str to sequence of mapping, optional
        Points kept in the samples under their key but not fitted (``warmup``, ``start``).
    **provenance
        ``device, model, width, batch, backend, optimizer, threads`` and optionally
        ``campaign_id, measured_at``.

    Returns
    -------
    RoundCostModel
        ``fixed_s``: the median time of a request outside its steps when every point has
        ``step_seconds`` (else the intercept of seconds against steps); ``step_s``: the
        median time per step (else the slope). Lines are `median_line`s.
    """
    fixed, step = median_line([p["steps"] for p in train], [p["seconds"] for p in train])
    if train and all("step_seconds" in p for p in train):
        # The runner times its steps, so each request's time outside them is its fixed cost,
        # observed directly; their median is far steadier than the line's intercept, which
        # inherits every wobble of the step time (x 26 steps) on a throttled device.
        fixed = max(0.0, statistics.median(p["seconds"] - p["step_seconds"] for p in train))
        step = statistics.median(p["step_seconds"] / p["steps"] for p in train if p["steps"] > 0)
    down_lat, down_rate = median_line([p["bytes"] for p in down], [p["seconds"] for p in down])
    up_lat, up_rate = median_line([p["bytes"] for p in up], [p["seconds"] for p in up])
    samples = {"train": [dict(p) for p in train], "down": [dict(p) for p in down], "up": [dict(p) for p in up]}
    for key, points in (extra or {}).items():
        samples[key] = [dict(p) for p in points]
    return RoundCostModel(
        fixed_s=fixed, step_s=step, down_s_per_byte=down_rate, down_latency_s=down_lat, up_s_per_byte=up_rate,
        up_latency_s=up_lat, samples=samples, **provenance,
    )  # fmt: skip


def config_key(dm: DeviceModels, model: str, batch: int, backend: str | None) -> tuple[str, int, str]:
    """Return the fitted configuration of ``model`` to cost a round with.

    The first backend of `BACKEND_PREFERENCE` the device was measured with (unless one is
    named), at the run's batch when measured, else at the only batch measured.

    Parameters
    ----------
    dm : harness.latency.DeviceModels
    model : str
    batch : int
    backend : str or None

    Returns
    -------
    (model, batch, backend)

    Raises
    ------
    InputError
        When the device has no fitted configuration of ``model``, or several batches and
        none is ``batch``.
    """
    keys = [k for k in dm.latency if k[0] == model and (backend is None or k[2] == backend)]
    if not keys:
        raise InputError(f"device {dm.device!r} has no usable profile of model {model!r}")
    backends = [b for b in BACKEND_PREFERENCE if any(k[2] == b for k in keys)] or sorted({k[2] for k in keys})
    keys = [k for k in keys if k[2] == backends[0]]
    at_batch = [k for k in keys if k[1] == batch]
    if at_batch:
        return at_batch[0]
    if len(keys) == 1:
        return keys[0]
    measured = ", ".join(str(k[1]) for k in sorted(keys))
    raise InputError(f"device {dm.device!r} measured {model} at batches {measured}, not at the run's batch {batch}")


def _stderr(line: str) -> None:
    print(f"fleetbench: warning: {line}", file=sys.stderr, flush=True)


def round_cost(
    rows: Any,
    model: str,
    batch: int,
    backend: str | None = None,
    *,
    costs: Mapping[str, RoundCostModel] | None = None,
    transfer: TransferFn | None = None,
    warn: Callable[[str], None] | None = _stderr,
    models: Mapping[str, DeviceModels] | None = None,
) -> RoundCost:
    """Return the ``(device, arch, steps, bytes_down, bytes_up) -> seconds`` function of the rows' devices.

    Parameters
    ----------
    rows : pandas.DataFrame or iterable of mapping
        Profile cells (`harness.latency` rows), one configuration per device.
    model : str
    batch : int
        The run's local batch size.
    backend : str, optional
        Only this backend's cells.
    costs : mapping of str to RoundCostModel, optional
        Each device's measured round costs; a device without one is costed from its latency
        model alone, with a warning.
    transfer : callable, optional
        ``(device, nbytes) -> seconds or None``: a transfer time that replaces the measured
        one where it returns a number (a modelled link of a virtual population).
    warn : callable or None
        Receives each warning line.
    models : mapping of str to DeviceModels, optional
        The rows' fitted models when the caller has fitted them already (a plan fits once).

    Returns
    -------
    callable
        Predictions are cached per (device, architecture). An unknown device raises
        `InputError` naming it.
    """
    models = fit(rows) if models is None else models
    costs = dict(costs or {})
    keys: dict[str, tuple[str, int, str]] = {}
    for device in sorted(models):
        try:
            keys[device] = config_key(models[device], model, batch, backend)
        except InputError:
            continue
        if device not in costs and warn is not None:
            warn(
                f"device {device!r} has no round-cost measurement; its rounds are predicted from per-image latency "
                "alone (no fixed cost, no transfers): run `fleetbench profile` without --no-round-cost"
            )
    cache: dict[tuple[str, str], float] = {}

    def per_image(device: str, arch: Arch) -> float:
        key = (device, arch.key())
        if key not in cache:
            if device not in keys:
                raise InputError(f"device {device!r} has no usable profile of model {model!r}")
            cache[key] = models[device].latency[keys[device]].predict(arch).value
        return cache[key]

    def moved(device: str, nbytes: int, measured: Callable[[int], float] | None) -> float:
        if nbytes <= 0:
            return 0.0
        if transfer is not None:
            modelled = transfer(device, nbytes)
            if modelled is not None:
                return float(modelled)
        return 0.0 if measured is None else measured(nbytes)

    def cost_of(device: str, arch: Arch, steps: float, bytes_down: int, bytes_up: int) -> float:
        measured = costs.get(device)
        compute = round_seconds(None, per_image(device, arch), batch, steps, 0, 0) if steps > 0 else 0.0
        fixed = measured.fixed_s if measured is not None else 0.0
        down = moved(device, bytes_down, None if measured is None else measured.down_seconds)
        up = moved(device, bytes_up, None if measured is None else measured.up_seconds)
        return fixed + compute + down + up

    return cost_of


# --------------------------------------------------------------------------- measurement (I/O)


def _shard(path: Path, manifest: Mapping[str, Any], examples: int, data: Path | None = None) -> Path:
    """Write an ``.npz`` shard of ``examples`` examples for the set's input.

    From ``data`` (its examples in order, repeated as needed) when given, else synthetic:
    standard normal inputs, label 0.
    """
    import numpy as np

    spec = manifest["inputs"][0]
    if data is not None:
        with np.load(data, allow_pickle=False) as shard:
            order = np.arange(examples) % len(shard["y"])
            np.savez(path, x=shard["x"][order].astype(spec["dtype"]), y=shard["y"][order].astype(np.int64))
        return path
    shape = (examples, *[int(d) for d in spec["shape"][1:]])
    x = np.random.default_rng(examples).standard_normal(shape).astype(spec["dtype"])
    np.savez(path, x=x, y=np.zeros(examples, dtype=np.int64))
    return path


def measure_round_cost(
    transport: Transport,
    device: Device,
    *,
    runner: str,
    remote_set: str,
    set_dir: Path,
    width: float,
    scratch: Path,
    backend: str,
    optimizer: str,
    threads: int,
    timeout: float,
    step_counts: Sequence[int] = DEFAULT_STEP_COUNTS,
    transfer_bytes: Sequence[int] = DEFAULT_TRANSFER_BYTES,
    repeats: int = DEFAULT_REPEATS,
    clock: Callable[[], float] = time.perf_counter,
    campaign_id: int | None = None,
    measured_at: float | None = None,
    start: str | RunnerStart | None = None,
    data: Path | None = None,
    resident: ResidentRunner | None = None,
) -> RoundCostModel:
    """Measure one device's `RoundCostModel` through its transport (see "Measurement").

    Parameters
    ----------
    transport : devices.transport.Transport
        An open transport to ``device``.
    device : devices.fleet.Device
    runner : str
        The deployed runner on the device.
    remote_set : str
        The deployed artifact set (its ``initial_parameters.npy`` is the starting point).
    set_dir : pathlib.Path
        The same set on the host (manifest: model, batch, input shape).
    width : float
        The set's width (recorded).
    scratch : pathlib.Path
        A host directory for the shards and transfer files.
    backend, optimizer : str
    threads : int
    timeout : float
        Seconds per remote command, per request and for the resident runner's start.
    step_counts : sequence of int
        Local steps of the ``train`` requests (at least two distinct); one warm-up request
        each precedes the fitted ones.
    transfer_bytes : sequence of int
        Sizes of the transfer files (at least two distinct).
    repeats : int
        Requests per step count and transfers per size and direction.
    clock : callable
        Monotonic clock timing the requests and transfers.
    campaign_id : int, optional
    measured_at : float, optional
        Unix time recorded (default now).
    start : str or harness.contract.RunnerStart, optional
        How the device starts the runner's Python (default: as
        `harness.phone_runtime.runner_start` chooses, its own Python with the provisioned
        site, or a phone's runtime bundle).
    data : pathlib.Path, optional
        The campaign's bench data (``.npz``): the requests train on its examples, as FL
        clients train on theirs (default: synthetic shards).
    resident : harness.resident.ResidentRunner, optional
        The device's resident runner with ``backend`` and ``threads``, already serving the
        campaign's later passes: the requests go to it, and it is left open for its owner.
        Default: one is started here (``start``) and closed at the end. Either way the
        runner's start is not in the fixed cost, and an FL client's rounds, too, go to one
        runner that has served other widths.

    Returns
    -------
    RoundCostModel

    Raises
    ------
    devices.errors.TransportError
        When the device fails (`devices.errors.CommandTimeout`: a request or the runner's
        start ran past ``timeout``).
    RoundCostError
        When the resident runner does not start or a ``train`` request fails (the runner's
        status and message). A runner started here is closed in every case.
    """
    import json

    import numpy as np

    from harness.contract import round_power_options
    from harness.deploy import deploy_files
    from harness.resident import ResidentRunner

    manifest = json.loads((set_dir / "manifest.json").read_text())
    batch = int(manifest["batch"])
    scratch.mkdir(parents=True, exist_ok=True)
    shards = [_shard(scratch / f"roundcost-{n}x{batch}.npz", manifest, int(n) * batch, data) for n in step_counts]
    deployed = deploy_files(transport, device, shards, timeout=timeout)
    workdir = deployed.workdir
    if resident is None:
        if start is None:
            from harness.phone_runtime import runner_start

            start = runner_start(transport, device, timeout=timeout)
        served = ResidentRunner.for_device(
            transport, start, runner, backend=backend, threads=threads, workdir=workdir,
            start_timeout=timeout, clock=clock,
        )  # fmt: skip
    else:
        served = resident

    power: dict[str, Any] = round_power_options(device)

    def request(steps: int, shard: Path) -> dict[str, float]:
        output, seconds = served.train(
            remote_set, params=f"{remote_set}/initial_parameters.npy", data=deployed.remote_paths[shard.name],
            out=f"{workdir}/roundcost-out.npy", timeout=timeout, backend=backend, epochs=1, lr=MEASURE_LR,
            threads=threads, seed=0, **power,
        )  # fmt: skip
        if not output.ok:
            raise RoundCostError(output.status, output.message)
        doc = output.document
        return {
            "steps": float(steps), "seconds": float(seconds),
            "step_seconds": float(sum(doc.step_seconds)),
            "load_seconds": doc.load_seconds or 0.0,
            "sessions_opened": float(doc.sessions.opened if doc.sessions is not None else 0),
        }  # fmt: skip

    train: list[dict[str, float]] = []
    try:
        warmup = [request(int(n), shard) for n, shard in zip(step_counts, shards, strict=True)]
        for _ in range(max(1, repeats)):
            for n, shard in zip(step_counts, shards, strict=True):
                train.append(request(int(n), shard))
    finally:
        if served is not resident:  # started here: closed here
            served.close()
    down: list[dict[str, float]] = []
    up: list[dict[str, float]] = []
    for size in transfer_bytes:
        local = scratch / f"roundcost-{size}.bin"
        local.write_bytes(np.random.default_rng(size).bytes(int(size)))
        back = scratch / f"roundcost-{size}.back"
        remote = f"{workdir}/roundcost-{size}.bin"
        for _ in range(max(1, repeats)):
            t0 = clock()
            transport.put(local, remote)
            down.append({"bytes": float(size), "seconds": clock() - t0})
            t0 = clock()
            transport.get(remote, back)
            up.append({"bytes": float(size), "seconds": clock() - t0})
    return fit_round_cost(
        train, down, up,
        extra={"warmup": warmup, "start": [{"seconds": s} for s in served.start_seconds]},
        device=device.name, model=str(manifest["model"]), width=float(width), batch=batch,
        backend=backend, optimizer=optimizer, threads=int(threads), campaign_id=campaign_id,
        measured_at=time.time() if measured_at is None else measured_at,
    )  # fmt: skip


__all__ = [
    "BACKEND_PREFERENCE",
    "DEFAULT_REPEATS",
    "DEFAULT_STEP_COUNTS",
    "DEFAULT_TRANSFER_BYTES",
    "LONG_REQUEST_S",
    "RoundCostError",
    "RoundCostModel",
    "config_key",
    "fit_line",
    "fit_round_cost",
    "measure_round_cost",
    "median_line",
    "payload_bytes",
    "round_cost",
    "round_seconds",
    "step_counts_for",
    "transfer_seconds",
]
