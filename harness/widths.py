"""Widths chosen by the model (``--widths auto:N``): measure the widths the latency models are least sure of.

`choose_widths` measures the widest and the narrowest candidate width on every device,
fits each device's latency model (`harness.latency`), and then, one round at a time,
measures the candidate whose predicted latency is the most uncertain (relative standard
deviation, averaged over the devices) until N widths are measured: nn-Meter's adaptive
sampling, in one dimension. The widths are chosen for the fleet, not per device, so that
every device is measured at the same widths (tables, tiers and cross-device comparisons
need that); artifact sets are exported between rounds, never while a device is measured.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from devices.fleet import Fleet
from harness.campaign import run_campaign
from harness.device_run import CampaignResult
from harness.records import BenchSpec

if TYPE_CHECKING:
    from harness.store import ProfileStore


#: Widths ``--widths auto:N`` chooses from: multiples of 1/16 from 1/8 to 1.
AUTO_CANDIDATES: tuple[float, ...] = tuple(k / 16 for k in range(2, 17))


def parse_width_request(text: str) -> tuple[float, ...] | int:
    """Parse ``--widths``: a comma-separated list, or ``auto:N`` (the number of widths to choose).

    Parameters
    ----------
    text : str

    Returns
    -------
    tuple of float or int
        The widths, or N for ``auto:N``.

    Raises
    ------
    exporters.userinput.InputError
        For ``auto:`` without a positive whole number, or a bad width list.
    """
    from exporters.arch import parse_widths
    from exporters.userinput import InputError

    head, colon, tail = text.strip().partition(":")
    if colon and head.strip().lower() == "auto":
        try:
            n = int(tail)
        except ValueError:
            n = 0
        if n < 1:
            raise InputError(f"--widths {text!r}: auto:N needs a whole number N >= 1 of widths to measure")
        if n > len(AUTO_CANDIDATES):
            raise InputError(f"--widths {text!r}: at most {len(AUTO_CANDIDATES)} candidate widths (1/8 to 1 in 1/16)")
        return n
    return parse_widths(text)


@dataclass
class WidthChoice:
    """What `choose_widths` measured.

    Attributes
    ----------
    widths : list of float
        In the order they were measured.
    scores : list of float
        Per chosen width after the first round: the mean relative standard deviation of
        its predicted latency over the devices when it was chosen.
    results : list of CampaignResult
        One per round.
    """

    widths: list[float] = field(default_factory=list)
    scores: list[float] = field(default_factory=list)
    results: list[CampaignResult] = field(default_factory=list)

    @property
    def complete(self) -> bool:
        """Whether every round measured every cell."""
        return bool(self.results) and all(r.complete for r in self.results)


def choose_widths(
    fleet: Fleet,
    store: ProfileStore,
    n_widths: int,
    *,
    cells: Callable[[Sequence[float]], list[BenchSpec]],
    candidates: Sequence[float] = AUTO_CANDIDATES,
    say: Callable[[str], None] = lambda line: print(line, file=sys.stderr, flush=True),
    **campaign: Any,
) -> WidthChoice:
    """Measure the ``n_widths`` widths that most reduce the latency models' uncertainty (see the module docstring).

    Parameters
    ----------
    fleet : Fleet
    store : harness.store.ProfileStore
    n_widths : int
        Widths to measure in all (the widest and narrowest candidates first).
    cells : callable
        ``cells(widths) -> specs`` (`harness.cells.plan_cells` for the request's model, batches, backends).
    candidates : sequence of float
        Widths to choose from.
    say : callable
        Receives one line per round.
    **campaign
        Passed to `run_campaign` (``artifacts_dir``, ``timeout``, ``resume``, ...);
        ``round_cost`` only to the first round, which measures the widest width.

    Returns
    -------
    WidthChoice
    """
    from harness.latency import choose_next_width, fit

    round_cost = bool(campaign.pop("round_cost", False))
    ordered = sorted(float(c) for c in candidates)
    first = [ordered[-1]] + ([ordered[0]] if n_widths > 1 else [])
    choice = WidthChoice()
    pending = first
    campaign_id: int | None = None
    while pending:
        say(f"measuring width{'s' if len(pending) > 1 else ''} {', '.join(f'{w:g}' for w in pending)}")
        specs = cells(pending)
        result = run_campaign(fleet, specs, store, campaign_id=campaign_id, round_cost=round_cost, **campaign)
        round_cost = False
        campaign_id = result.campaign_id
        choice.results.append(result)
        choice.widths.extend(pending)
        if result.interrupted or len(choice.widths) >= n_widths:
            break
        keys = {(s.model, s.batch, s.backend) for s in specs}
        models = []
        for device, dm in fit(store.latest_cells()).items():
            if any(s.device == device for s in specs):
                models += [dm.latency[k] for k in keys if k in dm.latency and dm.latency[k].zoo]
        nxt = choose_next_width(models, ordered, choice.widths)
        if nxt is None:
            break
        say(f"next width {nxt[0]:g}: its predicted latency is the most uncertain (+-{100 * nxt[1]:.0f} %, mean)")
        choice.scores.append(nxt[1])
        pending = [nxt[0]]
    return choice
