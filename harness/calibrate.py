"""Calibrate an emulated device's CPU share so it replays a stored device's latency curve.

``fleetbench fleet up FILE --match DEVICE --db PATH``

Semantics (decided here):

* ``DEVICE`` names a device with stored measurements in ``--db`` (typically a real
  board, e.g. a Raspberry Pi measured earlier). Its *target curve* is the per-image
  median latency per width of one configuration (model, batch, backend): the
  configuration with the most successfully measured widths (ties: the first in sorted
  order), see `stored_curve`.
* The fleet of ``FILE`` is brought up (`devices.emulation.emulate.up`), then EVERY emulated SSH
  device of ``FILE`` is calibrated, one after the other, to replay ``DEVICE``: each
  ends with the CPU share that makes its own measured curve match the target. (ADB
  endpoints are skipped: their runner differs and would not replay an SSH board.)
* The share is changed on the running device (`set_share`): its cgroup CPU quota is
  rewritten (cgroup v1 ``cpu.cfs_quota_us``, v2 ``cpu.max``) or, on the duty-cycle
  fallback, its supervisor is restarted with the new share; ``state.json`` records the
  new share. The fleet FILE is not rewritten: the result is printed as an
  ``emulate: {cpu_share: ...}`` line to paste, since ``fleet down`` then ``fleet up``
  starts again from the file's share.
* Each trial measurement is a small campaign (`campaign_measure`: about 1 s of timed
  steps per width, compared by MEAN per-image time, see `window_steps`) whose cells
  go to a scratch store ``<state_dir>/calibrate-<device>.db``, never to ``--db``:
  trial shares must not pass for real profiles.

Algorithm (`calibrate_share`, pure, with an injected ``measure``): starting from the
preset share ``s``, measure the curve at ``s``; the error is the median over common
widths of ``|measured - target| / target``; stop when it is within ``tolerance``
(10 %); otherwise ``s <- s * median(measured / target)`` (for a CPU-bound device
latency is proportional to ``1 / s``, so one step lands on the right share when the
device is ideal). At most ``max_iterations`` measurements; when none is within
tolerance the result says ``converged=False`` and carries the share with the lowest
error seen.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from devices.emulation.emulate import DeviceState
    from devices.fleet import Fleet

#: Curve: width -> per-image latency (any unit, the same for target and measure).
Curve = Mapping[float, float]
Measure = Callable[[float], Curve]

#: Shares are kept in this range while iterating (fraction of one core).
MIN_SHARE = 0.01


@dataclass(frozen=True)
class CalibrationStep:
    """One measurement of the calibration loop.

    Attributes
    ----------
    share : float
        Share the curve was measured at.
    error : float
        Median relative error over widths, ``|measured - target| / target``.
    ratio : float
        Median of ``measured / target`` (the next share is ``share * ratio``).
    measured : dict of float to float
    """

    share: float
    error: float
    ratio: float
    measured: dict[float, float]


@dataclass(frozen=True)
class CalibrationResult:
    """Outcome of `calibrate_share`.

    Attributes
    ----------
    share : float
        The calibrated share: the first one within tolerance, else the best one seen.
    iterations : int
        Measurements made.
    errors : tuple of float
        Median relative error of each measurement, in order.
    converged : bool
        Whether ``share``'s error is within the tolerance.
    steps : tuple of CalibrationStep
    message : str
        One line, in words (why it stopped).
    """

    share: float
    iterations: int
    errors: tuple[float, ...]
    converged: bool
    steps: tuple[CalibrationStep, ...] = ()
    message: str = ""


def curve_error(measured: Curve, target: Curve) -> tuple[float, float]:
    """Compare a measured curve with a target over their common widths.

    Parameters
    ----------
    measured, target : mapping of float to float
        Width -> latency; target values must be positive.

    Returns
    -------
    error : float
        Median of ``|measured - target| / target``.
    ratio : float
        Median of ``measured / target``.

    Raises
    ------
    ValueError
        If the curves share no width or a value is not finite and positive.
    """
    widths = sorted(set(_norm(measured)) & set(_norm(target)))
    if not widths:
        raise ValueError(f"no common width between measured {sorted(measured)} and target {sorted(target)}")
    m, t = _norm(measured), _norm(target)
    meas = np.array([m[w] for w in widths], dtype=float)
    targ = np.array([t[w] for w in widths], dtype=float)
    if not (np.all(np.isfinite(meas)) and np.all(meas > 0) and np.all(np.isfinite(targ)) and np.all(targ > 0)):
        raise ValueError(f"latencies must be finite and positive: measured {meas.tolist()}, target {targ.tolist()}")
    return float(np.median(np.abs(meas - targ) / targ)), float(np.median(meas / targ))


def _norm(curve: Curve) -> dict[float, float]:
    """Round widths so 0.25 from a float column and 0.25 from a literal match."""
    return {round(float(w), 6): float(v) for w, v in curve.items()}


def calibrate_share(
    target_curve: Curve,
    measure: Measure,
    start_share: float,
    tolerance: float = 0.10,
    max_iterations: int = 6,
    max_share: float | None = None,
) -> CalibrationResult:
    """Find the CPU share at which ``measure`` reproduces ``target_curve``.

    Parameters
    ----------
    target_curve : mapping of float to float
        Width -> per-image latency of the device to replay.
    measure : callable
        ``measure(share) -> {width: per-image latency}``, measured with the emulated
        device held at ``share`` (it must apply the share itself).
    start_share : float
        First share to try (the preset's).
    tolerance : float
        Stop when the median relative error over widths is at most this (0.10).
    max_iterations : int
        Most measurements made.
    max_share : float, optional
        Upper bound on the share (default: the number of CPUs of this machine).

    Returns
    -------
    CalibrationResult
        ``converged`` is False when no measurement came within tolerance; ``share``
        is then the best one measured and ``message`` says so.

    Raises
    ------
    ValueError
        If ``start_share``, ``tolerance`` or ``max_iterations`` is not positive, or a
        measured curve shares no width with the target.
    """
    if not (start_share > 0 and math.isfinite(start_share)):
        raise ValueError(f"start share must be positive, got {start_share}")
    if tolerance <= 0 or max_iterations < 1:
        raise ValueError(f"need tolerance > 0 and max_iterations >= 1 (got {tolerance}, {max_iterations})")
    upper = float(max_share if max_share is not None else (os.cpu_count() or 1))
    share = min(max(start_share, MIN_SHARE), upper)
    steps: list[CalibrationStep] = []
    for _ in range(max_iterations):
        measured = dict(measure(share))
        error, ratio = curve_error(measured, target_curve)
        steps.append(CalibrationStep(share, error, ratio, measured))
        if error <= tolerance:
            return CalibrationResult(
                share,
                len(steps),
                tuple(s.error for s in steps),
                True,
                tuple(steps),
                f"converged: share {share:.4g}, median error {error:.1%} after {len(steps)} measurement(s)",
            )
        nxt = min(max(share * ratio, MIN_SHARE), upper)
        if nxt == share:  # pinned at a bound: more iterations cannot help
            break
        share = nxt
    best = min(steps, key=lambda s: s.error)
    bound = ""
    if len(steps) < max_iterations:
        bound = f"; the share is pinned at its bound ({MIN_SHARE} .. {upper:g} cores)"
    return CalibrationResult(
        best.share,
        len(steps),
        tuple(s.error for s in steps),
        False,
        tuple(steps),
        f"NOT converged: median errors {', '.join(f'{s.error:.1%}' for s in steps)} "
        f"(tolerance {tolerance:.0%}){bound}; best share {best.share:.4g} "
        f"(error {best.error:.1%}) - the device's measurements are too noisy or not CPU-bound",
    )


# ---------------------------------------------------------------------------- stored target


@dataclass(frozen=True)
class StoredCurve:
    """A stored device's latency curve in one configuration.

    Attributes
    ----------
    device, model : str
    batch : int
    backend : str
    curve : dict of float to float
        Width -> per-image median latency (us).
    """

    device: str
    model: str
    batch: int
    backend: str
    curve: dict[float, float]


def stored_curve(
    rows: Any,
    device: str,
    model: str | None = None,
    batch: int | None = None,
    backend: str | None = None,
) -> StoredCurve:
    """Pick ``device``'s target curve from store rows.

    Parameters
    ----------
    rows : iterable of mapping or pandas.DataFrame
        ``ProfileStore.latest_cells()`` rows (``device, model, width, batch, backend,
        status, median_us``).
    device : str
    model, batch, backend : optional
        Restrict the configuration; among the remaining ones the one with the most
        measured widths is taken (ties: first in sorted order).

    Returns
    -------
    StoredCurve
        With several rows for a width, their median.

    Raises
    ------
    LookupError
        If ``device`` has no usable row (the message lists the stored devices).
    """
    from harness.latency import usable_rows

    usable = usable_rows(rows)
    mine = [
        r
        for r in usable
        if str(r["device"]) == device
        and (model is None or str(r["model"]) == model)
        and (batch is None or int(r["batch"]) == batch)
        and (backend is None or str(r["backend"]) == backend)
    ]
    if not mine:
        stored = sorted({str(r["device"]) for r in usable})
        raise LookupError(f"no successful measurement of device {device!r} in the store (stored devices: {stored})")
    groups: dict[tuple[str, int, str], dict[float, list[float]]] = {}
    for r in mine:
        key = (str(r["model"]), int(r["batch"]), str(r["backend"]))
        groups.setdefault(key, {}).setdefault(round(float(r["width"]), 6), []).append(float(r["median_us"]))
    key = sorted(groups, key=lambda k: (-len(groups[k]), k))[0]
    curve = {w: float(np.median(v)) for w, v in sorted(groups[key].items())}
    return StoredCurve(device, key[0], key[1], key[2], curve)


# ---------------------------------------------------------------------------- running devices


def cpu_cgroup_dir(dev: DeviceState) -> Path | None:
    """Return the cgroup directory holding ``dev``'s CPU quota (None if it has none).

    Parameters
    ----------
    dev : devices.emulation.emulate.DeviceState

    Returns
    -------
    pathlib.Path or None
    """
    if dev.cpu not in ("cgroup-v1", "cgroup-v2"):
        return None
    knob = "cpu.cfs_quota_us" if dev.cpu == "cgroup-v1" else "cpu.max"
    return next((Path(d) for d in dev.cgroups if (Path(d) / knob).is_file()), None)


def set_share(fleet: Fleet, device: str, share: float) -> DeviceState:
    """Change the CPU share of a running emulated device and record it in ``state.json``.

    Parameters
    ----------
    fleet : devices.fleet.Fleet
    device : str
        Name of an emulated device that ``fleet up`` started.
    share : float
        New fraction of one core.

    Returns
    -------
    devices.emulation.emulate.DeviceState
        The updated state entry.

    Raises
    ------
    LookupError
        If the device is not up.
    RuntimeError
        If it was started without a CPU limit (nothing to change).
    """
    from devices.emulation import emulate, limits
    from devices.processes import record, stop

    state = emulate.load_state(fleet.state_dir)
    dev = state.get(device)
    if dev is None:
        raise LookupError(f"{device} is not up (no entry in {fleet.state_dir / emulate.STATE_FILE})")
    if dev.cpu in ("cgroup-v1", "cgroup-v2"):
        directory = cpu_cgroup_dir(dev)
        if directory is None:
            raise RuntimeError(f"{device}: its CPU cgroup ({dev.cgroups}) is gone")
        version = 1 if dev.cpu == "cgroup-v1" else 2
        for name, value in limits.cpu_knobs(version, share).items():
            (directory / name).write_text(value)
        processes = dev.processes
    elif dev.cpu == "duty-cycle":
        root = next((r for r in dev.processes if r.role in ("sshd", "adb-endpoint")), None)
        if root is None:
            raise RuntimeError(f"{device}: no recorded server process to hold to a duty cycle")
        stop([rec for rec in dev.processes if rec.role == "duty-cycle"])
        new = record("duty-cycle", limits.start_duty_cycle(root.pid, share).pid)
        processes = tuple(r for r in dev.processes if r.role != "duty-cycle") + (new,)
    else:
        raise RuntimeError(f"{device} was started without a CPU limit; give it an emulate block with cpu_share")
    updated = dataclasses.replace(dev, cpu_share=share, processes=processes)
    emulate.save_state(fleet.state_dir, state.with_device(updated))
    return updated


def window_steps(per_image_us: float, batch: int, window_s: float, min_steps: int, max_steps: int) -> int:
    """Return the timed steps that make one cell span about ``window_s`` seconds.

    A cgroup CPU quota is enforced per CFS period (`devices.emulation.limits.PERIOD_US`): a step shorter than the
    period runs at full speed until the period's quota is spent, then stalls. The
    per-step MEDIAN of a few short steps therefore barely sees the share; the MEAN
    over a window of many periods is ``1 / share`` times the unlimited time. This
    sizes the window from the target's latency (the emulated device is being pulled
    towards it).

    Parameters
    ----------
    per_image_us : float
        Expected per-image latency (the target's).
    batch : int
    window_s : float
        Wanted duration of the timed steps.
    min_steps, max_steps : int

    Returns
    -------
    int
    """
    step_s = max(per_image_us, 1e-3) * 1e-6 * batch
    return int(min(max(math.ceil(window_s / step_s), min_steps), max_steps))


def mean_per_image_us(step_seconds: Sequence[float], batch: int) -> float:
    """Return the mean per-image time in microseconds: ``sum(steps) / (n * batch)``.

    Parameters
    ----------
    step_seconds : sequence of float
        Timed step durations (warm-up excluded).
    batch : int

    Returns
    -------
    float
    """
    if not step_seconds or batch <= 0:
        raise ValueError("need at least one step and a positive batch")
    return float(sum(step_seconds)) / (len(step_seconds) * batch) * 1e6


def campaign_measure(
    fleet: Fleet,
    device: str,
    target: StoredCurve,
    db: str | os.PathLike[str],
    *,
    window_s: float = 1.0,
    min_steps: int = 5,
    max_steps: int = 2000,
    warmup: int = 2,
    timeout: float = 300.0,
    artifacts_dir: str | os.PathLike[str] = "artifacts",
    say: Callable[[str], None] = print,
) -> Measure:
    """Return the production ``measure(share)`` for `calibrate_share`.

    Each call sets ``device``'s share (`set_share`), runs a small campaign
    (`harness.campaign.run_campaign`) of ``target.model`` at ``target.batch`` /
    ``target.backend`` over the target's widths on that emulated device, and returns
    width -> MEAN per-image latency (us) of the cells that succeeded. The mean over a
    window of about ``window_s`` seconds per width (`window_steps`) is used, not the
    median step, because a CPU quota stalls a device once per CFS period rather than
    slowing every short step (see `window_steps`); a real board is not throttled so,
    so its stored median is the figure to match.

    Parameters
    ----------
    fleet : devices.fleet.Fleet
    device : str
        The emulated device to measure.
    target : StoredCurve
        What to replay (model, batch, backend, widths).
    db : path
        The profile store holding the target; NOT written: calibration cells go to a
        scratch store ``<state_dir>/calibrate-<device>.db`` so that measurements taken
        at trial shares never mix with real profiles.
    window_s : float
        Seconds of timed steps per width.
    min_steps, max_steps : int
        Bounds on timed steps per width.
    warmup : int
        Warm-up steps per cell.
    timeout : float
        Seconds per cell.
    artifacts_dir : path
        Artifact cache (the ``profile`` command's default, so a warm cache is reused).
    say : callable
        Receives one line per measurement.

    Returns
    -------
    callable
        ``measure(share) -> {width: per-image us}``.
    """
    from harness.campaign import run_campaign
    from harness.cells import plan_cells
    from harness.store import ProfileStore

    del db  # the target was read from it already; trial cells go to the scratch store
    spec_device = fleet.device(device)
    scratch = fleet.state_dir / f"calibrate-{device}.db"
    specs = [
        spec
        for width, us in target.curve.items()
        for spec in plan_cells(
            [spec_device],
            target.model,
            [width],
            [target.batch],
            [target.backend],
            window_steps(us, target.batch, window_s, min_steps, max_steps),
            warmup,
            precision=0.0,  # a fixed window of steps: its mean is what calibration compares
        )
    ]

    def measure(share: float) -> dict[float, float]:
        set_share(fleet, device, share)
        with ProfileStore(scratch) as store:
            result = run_campaign(
                fleet, specs, store, artifacts_dir=Path(artifacts_dir), timeout=timeout, progress=lambda event: None,
                announce=lambda line: None,
            )  # fmt: skip
        curve: dict[float, float] = {}
        failed: list[str] = []
        for m in result.measurements:
            if m.ok and m.step_seconds:
                curve[round(float(m.spec.width), 6)] = mean_per_image_us(m.step_seconds, m.spec.batch)
            else:
                failed.append(f"{m.spec.width:g}: {m.status} {m.message}".strip())
        say(
            f"  {device} at share {share:.3g}: "
            + ", ".join(f"{w:g} -> {v:.0f} us" for w, v in sorted(curve.items()))
            + (f" (failed: {'; '.join(failed)})" if failed else "")
        )
        if not curve:
            raise RuntimeError(f"no width could be measured on {device} at share {share:.3g} ({'; '.join(failed)})")
        return curve

    return measure


def _start_share(fleet: Fleet, device: str) -> float:
    from devices.emulation import emulate, presets

    dev = emulate.load_state(fleet.state_dir).get(device)
    if dev is not None and dev.cpu_share:
        return float(dev.cpu_share)
    spec = next(d for d in fleet.devices if d.name == device)
    resolved = presets.resolve(spec.emulate) if spec.emulate is not None else None
    return float(resolved.cpu_share) if resolved is not None and resolved.cpu_share else 1.0


def cmd_up(args: argparse.Namespace) -> int:
    """``fleetbench fleet up FILE [--match DEVICE --db PATH]``.

    Parameters
    ----------
    args : argparse.Namespace
        ``file``, ``match`` and ``db``.

    Returns
    -------
    int
        `cmd_up_match`'s status with ``--match``, else `devices.emulation.emulate.cmd_up`'s.
    """
    if args.match:
        return cmd_up_match(args)
    from devices.emulation.emulate import cmd_up as plain_up

    return plain_up(args)


def cmd_up_match(
    args: argparse.Namespace,
    measure_factory: Callable[[Fleet, str, StoredCurve, str], Measure] | None = None,
) -> int:
    """``fleetbench fleet up FILE --match DEVICE --db PATH`` (see the module docstring).

    Parameters
    ----------
    args : argparse.Namespace
        ``file``, ``match`` and ``db``.
    measure_factory : callable, optional
        ``(fleet, device, target, db) -> measure`` (default `campaign_measure`); tests
        inject a fake.

    Returns
    -------
    int
        0 when every emulated SSH device converged, else 1.

    Raises
    ------
    InputError
        No store at ``--db``, no stored device ``--match``, or no emulated SSH device.
    """
    from devices.emulation import emulate
    from devices.fleetfile import load_fleet
    from exporters.userinput import InputError
    from harness.store import ProfileStore

    factory = measure_factory or campaign_measure
    fleet = load_fleet(args.file)
    try:
        with ProfileStore(args.db, create=False) as store:
            target = stored_curve(store.latest_cells(), args.match)
    except LookupError as exc:
        raise InputError(exc.args[0] if exc.args else str(exc)) from None
    targets = [d.name for d in fleet.devices if d.emulate is not None and d.kind == "ssh"]
    if not targets:
        raise InputError(f"{args.file}: no emulated SSH device to calibrate")
    result = emulate.up(fleet, say=lambda line: print(line, flush=True))
    widths = ", ".join(f"{w:g}" for w in target.curve)
    print(
        f"target: {target.device} ({target.model}, batch {target.batch}, {target.backend}) at widths {widths}: "
        + ", ".join(f"{v:.0f}" for v in target.curve.values())
        + " us/image"
    )
    ok = True
    for name in targets:
        if name in result.failed:
            print(f"{name}: not calibrated: it did not start ({result.failed[name]})")
            ok = False
            continue
        try:
            outcome = calibrate_share(
                target.curve, factory(fleet, name, target, str(args.db)), _start_share(fleet, name)
            )
        except (NotImplementedError, RuntimeError, LookupError, ValueError, OSError) as exc:
            print(f"{name}: not calibrated: {exc}")
            ok = False
            continue
        set_share(fleet, name, outcome.share)
        print(f"{name}: {outcome.message}")
        print(f"  replay {target.device}: emulate: {{cpu_share: {outcome.share:.3g}}}")
        ok = ok and outcome.converged
    return 0 if ok else 1
