"""One configuration from profile to round: the profile of each device that matches the run (pure).

A profile cell (and a round-cost measurement) records the configuration it was measured in:
batch, backend, optimizer graph and runner threads. A run trains each device in one
configuration (`ProfileConfig`: the run's batch, the device's backend, the executor's
optimizer, the device's fleet-file threads). Planning a round from a profile of another
configuration predicts another job: a profile of the AdamW graph at 2 threads says little
about SGD at 1 thread.

`match_profile` picks, per device, the measured configuration that matches the run; when
none matches exactly it falls back to the *nearest*, the one that differs in the least
important fields, and names every difference (``optimizer adamw (run: sgd)``) so the caller
can warn. **Decision (what "nearest" means):** a difference costs, in this order of
importance, backend 8, optimizer 4, batch 2, threads 1 (a different runtime changes every
kernel; a different optimizer graph adds or removes a whole update pass; a different batch
changes the per-image cost of the fixed per-step work; threads matter least on the small
models of the zoo, and not at all at one core). Ties go to the configuration with the most
measured widths, then the smallest in sort order, so the choice is deterministic. A field the
run leaves open (None) matches anything. No usable profile of the model at all is an
`InputError` naming the device.

`match_round_cost` applies the same rule to a device's round-cost measurements
(`harness.roundcost.RoundCostModel`); a device without one has none (the caller falls back
to the latency-only cost, with a warning).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from exporters.userinput import InputError
from harness.latency import ProfileRows, profile_rows, usable_rows
from harness.roundcost import RoundCostModel

#: Configuration fields and the cost of a difference in each (see the module docstring).
FIELD_WEIGHTS: Mapping[str, int] = {"backend": 8, "optimizer": 4, "batch": 2, "threads": 1}


@dataclass(frozen=True)
class ProfileConfig:
    """The configuration a device trains with in a run; None leaves a field open.

    Attributes
    ----------
    batch : int or None
    backend : str or None
    optimizer : str or None
    threads : int or None
    """

    batch: int | None = None
    backend: str | None = None
    optimizer: str | None = None
    threads: int | None = None

    def describe(self) -> str:
        """Return ``batch 20, backend ort, ...`` for the fields given."""
        return ", ".join(f"{name} {getattr(self, name)}" for name in FIELD_WEIGHTS if getattr(self, name) is not None)


@dataclass(frozen=True)
class ProfileMatch:
    """The profile of one device chosen for a run.

    Attributes
    ----------
    device : str
    config : dict
        The chosen configuration (``batch, backend, optimizer, threads``).
    rows : tuple of dict
        The device's cells of ``model`` in that configuration (every status).
    differences : tuple of str
        Each field that differs from the run's, as ``"optimizer adamw (run: sgd)"``.
    """

    device: str
    config: Mapping[str, Any]
    rows: tuple[dict[str, Any], ...]
    differences: tuple[str, ...] = ()

    @property
    def exact(self) -> bool:
        """Whether the profile was measured in the run's configuration."""
        return not self.differences

    def warning(self, model: str) -> str:
        """Return the warning line of a fallback ("" when exact)."""
        if self.exact:
            return ""
        return (
            f"device {self.device!r}: no profile of {model} in the run's configuration; planning with the nearest, "
            f"which differs in {', '.join(self.differences)}"
        )


def _config_of(row: Mapping[str, Any]) -> dict[str, Any]:
    out = {}
    for name in FIELD_WEIGHTS:
        value = row.get(name)
        out[name] = None if value is None else (int(value) if name in ("batch", "threads") else str(value))
    return out


def _differences(have: Mapping[str, Any], want: ProfileConfig) -> tuple[str, ...]:
    out = []
    for name in FIELD_WEIGHTS:
        wanted = getattr(want, name)
        if wanted is not None and have.get(name) != wanted:
            out.append(f"{name} {have.get(name)} (run: {wanted})")
    return tuple(out)


def _distance(have: Mapping[str, Any], want: ProfileConfig) -> int:
    return sum(
        weight
        for name, weight in FIELD_WEIGHTS.items()
        if getattr(want, name) is not None and have.get(name) != getattr(want, name)
    )


def _order(config: Mapping[str, Any]) -> tuple[str, ...]:
    return tuple(str(config[name]) for name in FIELD_WEIGHTS)


def match_profile(rows: ProfileRows, device: str, model: str, want: ProfileConfig) -> ProfileMatch:
    """Return ``device``'s profile of ``model`` in the run's configuration, or the nearest one.

    Parameters
    ----------
    rows : DataFrame, rows or ``{device: rows}``
        Profile cells (`fl.scheduling.rows.profile_rows` forms), any devices.
    device, model : str
    want : ProfileConfig
        The configuration the device trains with in the run.

    Returns
    -------
    ProfileMatch

    Raises
    ------
    InputError
        When ``device`` has no usable (measured, status ``ok``) cell of ``model``.
    """
    mine = [r for r in profile_rows(rows) if r.get("device") == device and r.get("model") == model]
    usable = usable_rows(mine)
    if not usable:
        raise InputError(
            f"device {device!r} has no measured profile of {model}: run `fleetbench profile` on it"
            + (f" ({want.describe()})" if want.describe() else "")
        )
    widths: dict[tuple[str, ...], set[float]] = {}
    configs: dict[tuple[str, ...], dict[str, Any]] = {}
    for r in usable:
        config = _config_of(r)
        key = _order(config)
        configs[key] = config
        widths.setdefault(key, set()).add(float(r["width"]))
    best = min(configs, key=lambda k: (_distance(configs[k], want), -len(widths[k]), k))
    chosen = configs[best]
    kept = tuple(r for r in mine if _order(_config_of(r)) == best)
    return ProfileMatch(device, chosen, kept, _differences(chosen, want))


def match_round_cost(
    costs: Iterable[RoundCostModel], device: str, model: str, want: ProfileConfig
) -> tuple[RoundCostModel | None, tuple[str, ...]]:
    """Return ``device``'s round-cost measurement of ``model`` nearest the run's configuration.

    Parameters
    ----------
    costs : iterable of RoundCostModel
        Stored measurements (`harness.store.ProfileStore.round_costs`), any devices.
    device, model : str
    want : ProfileConfig

    Returns
    -------
    (RoundCostModel or None, differences)
        None (and no differences) when the device has no measurement of ``model``.
    """
    mine = [c for c in costs if c.device == device and c.model == model]
    if not mine:
        return None, ()
    best = min(mine, key=lambda c: (_distance(c.config(), want), -c.measured_at, _order(c.config())))
    return best, _differences(best.config(), want)


def matched_profiles(
    rows: ProfileRows,
    model: str,
    wants: Mapping[str, ProfileConfig],
    *,
    warn: Callable[[str], None] | None = None,
    strict: bool = True,
) -> dict[str, list[dict[str, Any]]]:
    """Return ``{device: rows}`` of every device's matched profile (the strategies' ``Profiles``).

    Parameters
    ----------
    rows : DataFrame, rows or ``{device: rows}``
    model : str
    wants : mapping of str to ProfileConfig
        The devices to plan and the configuration each trains with.
    warn : callable, optional
        Receives one line per fallback to a nearest profile (and per device skipped when not strict).
    strict : bool
        Raise for a device without any profile of ``model``; otherwise leave it out (with a warning).

    Returns
    -------
    dict of str to list of dict

    Raises
    ------
    InputError
        With ``strict``, naming the first device without a usable profile.
    """
    flat = profile_rows(rows)
    out: dict[str, list[dict[str, Any]]] = {}
    for device in sorted(wants):
        try:
            match = match_profile(flat, device, model, wants[device])
        except InputError as exc:
            if strict:
                raise
            if warn is not None:
                warn(f"{exc}; its rounds are planned without a profile")
            continue
        if not match.exact and warn is not None:
            warn(match.warning(model))
        out[device] = list(match.rows)
    return out
