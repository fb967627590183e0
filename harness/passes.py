"""From the runner's documents to a cell's `Measurement`: passes pooled, samples judged, imprecision explained.

A cell's samples may come from several passes (`DEFAULT_PASSES`): its first in a process
of its own, the rest as requests to the device's resident runner. `merge_passes` pools
their documents into one and judges the pool for disturbance again; `measurement_from_doc`
turns the cell's document into the stored `Measurement`, keeping only the samples that
count (`counted_steps`).

Precision
    A cell is measured until the 95 % interval of its median is within ``+-precision``
    or until ``max_seconds`` (`BenchSpec`); one that misses is stored with status ``ok``,
    ``imprecise`` set and a message that says by how much and what its runner saw
    (`imprecision_reason`): a device kept from its cpu, samples disturbed, work that cost
    more at times, or a load average above the cpus it may use. The campaign goes on.

Everything here is pure.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from harness.document import RunnerDocument, parse_document
from harness.energy import merge_energy
from harness.records import BenchSpec, Measurement
from harness.runner.sampling import (
    DISTURBANCE_LIMIT,
    MIN_SAMPLES,
    counted_samples,
    disturbed_samples,
    median_interval,
    median_of_sorted,
)


def measurement_from_doc(
    spec: BenchSpec,
    status: str,
    message: str,
    doc: RunnerDocument,
    *,
    facts: Mapping[str, Any],
    started_at: float,
    finished_at: float,
    versions: Mapping[str, str],
    git_commit: str | None,
    isolation: Mapping[str, Any] | None = None,
    share: float | None = None,
) -> Measurement:
    """Build the `Measurement` of one cell from the runner's document (pure).

    Parameters
    ----------
    spec : BenchSpec
    status, message : str
        From `harness.contract.parse_output` (or a transport failure).
    doc : RunnerDocument
        The runner's document (may be empty).
    facts : Mapping
        The device's facts snapshot.
    started_at, finished_at : float
        Unix times from the campaign's clock.
    versions : Mapping
        Host tool versions.
    git_commit : str or None
    isolation : Mapping, optional
        How the cell was isolated (`harness.isolation.IsolationPlan.isolation`).
    share : float, optional
        The device's emulated CPU share (`harness.device_run.quota_share`), for `imprecision_reason`.

    Returns
    -------
    Measurement
        Its ``step_seconds`` are the samples that count (`counted_steps`). A measured cell
        that missed its precision keeps status ``ok``, with ``imprecise`` set and
        `imprecision_reason` as its message.
    """
    steps = tuple(counted_steps(doc)) if status == "ok" else ()
    imprecise = status == "ok" and doc.imprecise
    if imprecise and not message:
        message = imprecision_reason(spec, doc, share)
    return Measurement(
        spec=spec,
        status=status,
        message=message,
        step_seconds=steps,
        peak_memory_bytes=doc.peak_memory_bytes,
        peak_memory_source=doc.peak_memory_source,
        throttled=doc.throttled,
        matmul_gflops=doc.matmul_gflops,
        runner=doc,
        facts=dict(facts),
        started_at=started_at,
        finished_at=finished_at,
        versions=dict(versions),
        git_commit=git_commit,
        precision_achieved=doc.precision_achieved,
        imprecise=imprecise,
        stop_reason=doc.stop_reason if status == "ok" else None,
        isolation=dict(isolation or {}),
    )


def counted_steps(doc: RunnerDocument) -> list[float]:
    """Return the runner's step samples that count: those it did not find disturbed (pure).

    Parameters
    ----------
    doc : RunnerDocument
        The runner's document (``step_seconds``; ``disturbed``, a 0/1 flag per sample,
        where the runner judged them).

    Returns
    -------
    list of float
        Every sample when the runner judged none (no flags, or not one per sample).
    """
    return undisturbed(list(doc.step_seconds), doc)


def undisturbed(values: list[float], doc: RunnerDocument) -> list[float]:
    """Return the entries of ``values`` (one per runner sample) that the runner did not flag disturbed (pure).

    Parameters
    ----------
    values : list of float
        One value per sample of ``doc`` (its wall or its CPU seconds per step).
    doc : RunnerDocument
        The runner's document (``disturbed``, a 0/1 flag per sample).

    Returns
    -------
    list of float
        Every value when the flags are not one per value: they are trusted only then.
    """
    return _unflagged(values, doc.disturbed)


def _unflagged(values: list[float], flags: Sequence[int]) -> list[float]:
    if len(flags) != len(values):
        return values
    return counted_samples(values, list(flags))


#: Passes a cell's samples are spread over by default (`harness.campaign.run_campaign`): its first in a
#: process of its own, the rest as requests to the device's resident runner, each pass
#: of every cell after the previous pass of all the device's cells.
DEFAULT_PASSES = 4


def merge_passes(docs: Sequence[RunnerDocument], precision: float) -> RunnerDocument:
    """Merge the runner documents of one cell's passes into the cell's document (pure).

    The samples of every pass are pooled; where every pass judged its samples
    (``disturbed``, one flag per sample), the pool is judged again as one
    (`harness.runner.sampling.disturbed_samples`, from `MIN_SAMPLES` samples on), so
    a pass the host slowed as a whole, or a first pass still cold, stands out against the
    others. The median and its interval are those of the pooled samples that
    count.

    Parameters
    ----------
    docs : sequence of RunnerDocument
        The passes' documents, first pass first (each with status ``ok``). The first
        pass ran in a process of its own: its peak memory, warm-up and matmul rate are
        the cell's.
    precision : float
        The cell's target half-width (0: a fixed count, never imprecise).

    Returns
    -------
    RunnerDocument
        The first pass's document with the pooled ``step_seconds``, ``cpu_step_seconds``,
        ``disturbed``, ``steps_per_sample``, ``loss``, ``samples``, ``timed_seconds``,
        ``median_ci_seconds``, ``precision_achieved``, ``imprecise`` and ``stop_reason``
        (``"precision"`` when the pool reaches it, else ``"time cap"`` when a pass hit its
        cap, else ``"passes differ"``); ``throttled`` when any pass was; the last pass's
        load average after; the passes' ``energy`` pooled (`harness.energy.merge_energy`); and
        ``passes`` and ``pass_medians`` (the median of each
        pass's samples that count by its own flags, seconds per step: each pass stands for
        its stretch of the host's speed, which every cell of the device went through).
    """
    if not docs:
        raise ValueError("merge_passes needs at least one pass")
    first = docs[0]
    seconds = [v for doc in docs for v in doc.step_seconds]
    cpu = [v for doc in docs for v in doc.cpu_step_seconds]
    judged = all(len(doc.disturbed) == len(doc.step_seconds) for doc in docs)
    # A pool's samples come from stretches of time apart, so it is judged from `MIN_SAMPLES` on (a
    # single run from `harness.runner.sampling.DISTURBANCE_MIN_SAMPLES`): a device held to a small CPU share
    # takes few, long samples.
    flags = disturbed_samples(cpu, min_samples=MIN_SAMPLES) if judged and len(cpu) == len(seconds) else []
    merged: dict[str, Any] = dict(first.raw)
    merged.update(
        step_seconds=seconds,
        cpu_step_seconds=cpu if len(cpu) == len(seconds) else [],
        disturbed=[int(flag) for flag in flags],
        steps_per_sample=[n for doc in docs for n in doc.steps_per_sample],
        loss=[v for doc in docs for v in doc.loss],
        samples=len(seconds),
        timed_seconds=sum(doc.timed_seconds or 0.0 for doc in docs),
        throttled=any(doc.throttled for doc in docs),
        passes=len(docs),
        pass_medians=[median_of_sorted(sorted(c)) if (c := counted_steps(doc)) else None for doc in docs],
    )
    merged["loadavg"] = {"before": list(first.loadavg.before), "after": list(docs[-1].loadavg.after)}
    merged["energy"] = merge_energy([doc.raw.get("energy") for doc in docs])
    counted = sorted(_unflagged(seconds, merged["disturbed"]))
    _, low, high, half = median_interval(counted) if counted else (None, None, None, None)
    merged.pop("median_ci_seconds", None)
    if low is not None:
        merged["median_ci_seconds"] = [low, high]
    merged["precision_achieved"] = half
    merged["imprecise"] = precision > 0 and (half is None or half > precision)
    if precision <= 0:
        merged["stop_reason"] = "steps"
    elif not merged["imprecise"]:
        merged["stop_reason"] = "precision"
    elif any(doc.stop_reason in ("time cap", "sample cap") for doc in docs):
        merged["stop_reason"] = "time cap"
    else:
        merged["stop_reason"] = "passes differ"
    return parse_document(merged)


def device_busy(doc: RunnerDocument) -> str:
    """Say whether the runner saw a busy device: a load average above the cpus it may use.

    Parameters
    ----------
    doc : RunnerDocument
        The runner's document (``loadavg``, ``cpus_available``).

    Returns
    -------
    str
        ``"load average 3.2 on 2 cpus"`` when the larger 1-minute load average (before or
        after) exceeds the available cpus, else "".
    """
    values = [v[0] for v in (doc.loadavg.before, doc.loadavg.after) if v and v[0] is not None]
    cpus = doc.cpus_available
    if not values or cpus is None or cpus < 1:
        return ""
    worst = max(values)
    return f"load average {worst:.1f} on {cpus} cpu{'s' if cpus != 1 else ''}" if worst > cpus else ""


#: A runner that had less than this fraction of the cpu it could have (one cpu, or its
#: emulated share) while sampling was kept from running: the device was busy.
BUSY_CPU_FRACTION = 0.9


def cpu_time_findings(doc: RunnerDocument, share: float | None = None) -> list[str]:
    """Say what the runner's CPU time per step shows about a cell's samples (pure).

    Parameters
    ----------
    doc : RunnerDocument
        The runner's document (``step_seconds``, ``cpu_step_seconds``).
    share : float, optional
        The device's emulated CPU share in cores (`harness.device_run.quota_share`), what its runner could
        have at most; one cpu otherwise.

    Returns
    -------
    list of str
        ``"device busy: the runner ran 61 % of the time (at most 100 %)"`` when the CPU
        time per wall second is below `BUSY_CPU_FRACTION` of what it could be; ``"412 of
        655 samples disturbed: their CPU time per step rose over 10 %, the cpu was slowed
        from outside the runner"`` when the runner flagged any; and ``"its steps' own CPU
        time varied +-12.0 % (robust CV): the work cost more at times"`` when that of the
        samples that count exceeds the noisy threshold. Empty without CPU times (a runner
        that does not report them) or when none holds.
    """
    from harness.stats import NOISY_CV_THRESHOLD, summarize

    wall = list(doc.step_seconds)
    cpu = list(doc.cpu_step_seconds)
    if not cpu or len(cpu) != len(wall) or not all(v > 0 for v in wall):
        return []
    findings = []
    ran = sorted(c / w for c, w in zip(cpu, wall, strict=True))[len(wall) // 2]
    could = min(share, 1.0) if share is not None and share > 0 else 1.0
    if ran < BUSY_CPU_FRACTION * could:
        findings.append(f"device busy: the runner ran {100 * ran:.0f} % of the time (at most {100 * could:.0f} %)")
    counted = undisturbed(cpu, doc)
    if len(counted) < len(cpu):
        why = "the cpu was slowed from outside the runner"
        if (doc.passes or 1) > 1:
            why = f"over the cell's {doc.passes} passes: a pass the host slowed, or the first pass still cold"
        findings.append(
            f"{len(cpu) - len(counted)} of {len(cpu)} samples disturbed: their CPU time per step rose "
            f"over {100 * (DISTURBANCE_LIMIT - 1):.0f} %, {why}"
        )
        cpu = counted
    varied = summarize(cpu, 1).robust_cv if all(v > 0 for v in cpu) else 0.0
    if varied > NOISY_CV_THRESHOLD:
        findings.append(
            f"its steps' own CPU time varied +-{100 * varied:.1f} % (robust CV): the work cost more at times"
        )
    return findings


def imprecision_reason(spec: BenchSpec, doc: RunnerDocument, share: float | None = None) -> str:
    """Return the stored reason of a cell that missed its precision (one line).

    What kept it imprecise comes from the runner's CPU time per step
    (`cpu_time_findings`); a runner that reports none is judged by the load average
    (`device_busy`).

    Parameters
    ----------
    spec : BenchSpec
    doc : RunnerDocument
        The runner's document.
    share : float, optional
        The device's emulated CPU share (`harness.device_run.quota_share`).

    Returns
    -------
    str
        E.g. ``imprecise: 95 % interval of the median +-3.4 % after 812 samples in 30.0 s
        (target +-2 %, time cap); device busy: the runner ran 61 % of the time (at most
        100 %)``.
    """
    achieved = doc.precision_achieved
    samples = doc.samples or len(doc.step_seconds)
    seconds = doc.timed_seconds
    reached = f"+-{100 * achieved:.1f} %" if achieved is not None else "no interval"
    took = f" in {seconds:.1f} s" if seconds is not None else ""
    text = (
        f"imprecise: 95 % interval of the median {reached} after {samples} samples{took} "
        f"(target +-{100 * spec.precision:g} %, {doc.stop_reason or 'stopped'})"
    )
    if doc.cpu_step_seconds:
        return "; ".join([text, *cpu_time_findings(doc, share)])
    busy = device_busy(doc)
    return text + (f"; device busy: {busy}" if busy else "")
