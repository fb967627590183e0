"""Client capacities (the widths clients may train) from a short spec string (pure).

Specs (`assign`):

``"1"``, ``"0.5"``, ``"1/4"``
    Homogeneous: every client gets that capacity.
``"uniform:1,0.5,0.25,0.125,0.0625"`` (``"uniform"`` alone: HeteroFL's levels a..e)
    Clients spread evenly over the levels: ``n // L`` each, the remaining ``n mod L``
    to the levels listed first, then a seeded shuffle decides who gets which.
``"realworld"``
    FedRolex's emulated real-world distribution (section 4.5, Fig. 7): household income
    groups mapped to capacity levels 1 (> $200k), 1/2 ($150k-200k), 1/4 ($100k-150k),
    1/8 ($75k-100k) and 1/16 (< $75k). The shares 6 / 10 / 11 / 18 / 55 % of levels
    a..e are the figure's; the text copy of the paper this project has lost the
    figure's numbers, so they are taken from the authors' own published run
    configuration of that experiment (``a6-b10-c11-d18-e55``).
``"explicit:1,1,0.5,..."``
    One capacity per client, in client order; the count must equal the number of clients.
``"fjord:K"`` or ``"fjord:K,ds=D"``
    FjORD's uniform-K device tiers with drop scale ``ds`` (paper section 5.1): tier
    ``i`` (``i = 1..K``) has capacity ``i/K``; the K-1 lower tiers hold ``ds/K`` of the
    clients each and the high-end tier the rest, ``1 - (K-1)*ds/K``. ``ds = 1``
    (default) gives equal tiers, ``(0.2, ..., 0.2)`` for K = 5; ``ds = 0.5`` gives
    ``(0.1, 0.1, 0.1, 0.1, 0.6)``. ``ds`` may range over ``[0, K/(K-1)]``.

Shares become client counts by the largest-remainder rule (ties to the level listed
first), then a shuffle seeded by ``seed`` assigns them to clients.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from fractions import Fraction

import numpy as np

from exporters.userinput import InputError

#: HeteroFL / FedRolex capacity levels 'a'..'e'.
LEVELS = (1.0, 1 / 2, 1 / 4, 1 / 8, 1 / 16)

#: FedRolex's real-world shares of levels 'a'..'e' (see the module docstring).
REALWORLD_SHARES = (0.06, 0.10, 0.11, 0.18, 0.55)


def assign(spec: str, num_clients: int, seed: int) -> tuple[float, ...]:
    """Return one capacity per client for a capacity spec.

    Parameters
    ----------
    spec : str
        See the module docstring.
    num_clients : int
        Number of clients (>= 1).
    seed : int
        Seeds the shuffle that maps levels to clients.

    Returns
    -------
    tuple of float
        Capacities in (0, 1], one per client.

    Raises
    ------
    InputError
        If the spec is malformed, a capacity is outside (0, 1] or an explicit list has
        the wrong length.
    """
    if num_clients < 1:
        raise InputError(f"number of clients {num_clients} must be >= 1")
    text = spec.strip()
    kind, sep, rest = text.partition(":")
    kind = kind.strip().lower()
    if kind == "explicit":
        caps = _numbers(rest, spec)
        if len(caps) != num_clients:
            raise InputError(f"capacity spec {spec!r} lists {len(caps)} capacities for {num_clients} clients")
        return tuple(caps)
    if kind == "uniform":
        levels = _numbers(rest, spec) if sep else list(LEVELS)
        if len(set(levels)) != len(levels):
            raise InputError(f"capacity spec {spec!r} repeats a level")
        return _spread(levels, [1.0 / len(levels)] * len(levels), num_clients, seed)
    if kind == "realworld":
        if sep:
            raise InputError(f"capacity spec {spec!r}: 'realworld' takes no arguments")
        return _spread(list(LEVELS), list(REALWORLD_SHARES), num_clients, seed)
    if kind == "fjord":
        levels, shares = fjord_tiers(rest, spec)
        return _spread(levels, shares, num_clients, seed)
    if sep:
        raise InputError(
            f"unknown capacity spec {spec!r}; use a number, uniform:..., realworld, explicit:... or fjord:K[,ds=D]"
        )
    return (_number(text, spec),) * num_clients


def fjord_tiers(args: str, spec: str = "") -> tuple[list[float], list[float]]:
    """Return FjORD's tier capacities ``i/K`` and their client shares for ``"K[,ds=D]"``.

    Parameters
    ----------
    args : str
        ``"5"`` or ``"5,ds=0.5"``.
    spec : str
        The whole spec, for error messages.

    Returns
    -------
    levels : list of float
        ``1/K, 2/K, ..., 1``.
    shares : list of float
        ``ds/K`` for each of the K-1 lower tiers, ``1 - (K-1)*ds/K`` for the top tier.
    """
    spec = spec or f"fjord:{args}"
    parts = [p.strip() for p in args.split(",") if p.strip()]
    if not parts:
        raise InputError(f"capacity spec {spec!r} needs the number of tiers K, e.g. fjord:5")
    try:
        k = int(parts[0])
    except ValueError:
        raise InputError(f"capacity spec {spec!r}: number of tiers {parts[0]!r} is not an integer") from None
    if k < 1:
        raise InputError(f"capacity spec {spec!r}: number of tiers {k} must be >= 1")
    ds = 1.0
    for part in parts[1:]:
        key, eq, value = part.partition("=")
        if key.strip() != "ds" or not eq:
            raise InputError(f"capacity spec {spec!r}: unknown option {part!r} (only ds=D)")
        try:
            ds = float(value)
        except ValueError:
            raise InputError(f"capacity spec {spec!r}: drop scale {value!r} is not a number") from None
    top = 1.0 - (k - 1) * ds / k
    if not math.isfinite(ds) or ds < 0 or top < -1e-12:
        raise InputError(f"capacity spec {spec!r}: drop scale {ds} must lie in [0, K/(K-1)]")
    levels = [i / k for i in range(1, k + 1)]
    shares = [ds / k] * (k - 1) + [max(top, 0.0)]
    return levels, shares


def tiers(capacities: Sequence[float]) -> tuple[int, ...]:
    """Return each client's tier: the rank of its capacity among the distinct ones (0 = largest).

    Parameters
    ----------
    capacities : sequence of float

    Returns
    -------
    tuple of int
        ``tiers([0.5, 1, 0.25, 1])`` is ``(1, 0, 2, 0)``.
    """
    rank = {c: i for i, c in enumerate(sorted(set(capacities), reverse=True))}
    return tuple(rank[c] for c in capacities)


def counts(shares: Sequence[float], num_clients: int) -> list[int]:
    """Turn shares into client counts summing to ``num_clients`` (largest remainder).

    Parameters
    ----------
    shares : sequence of float
        Non-negative shares summing to 1.
    num_clients : int

    Returns
    -------
    list of int
        ``floor(share * n)`` per level, plus one for the levels with the largest
        remainders (ties: the level listed first) until the counts sum to ``n``.
    """
    exact = [s * num_clients for s in shares]
    base = [math.floor(x + 1e-9) for x in exact]
    left = num_clients - sum(base)
    order = sorted(range(len(shares)), key=lambda i: (-(exact[i] - base[i]), i))
    for i in order[:left]:
        base[i] += 1
    return base


def _spread(levels: list[float], shares: list[float], num_clients: int, seed: int) -> tuple[float, ...]:
    pool = [lvl for lvl, n in zip(levels, counts(shares, num_clients), strict=True) for _ in range(n)]
    order = np.random.default_rng(seed).permutation(num_clients)
    return tuple(float(pool[i]) for i in order)


def _numbers(text: str, spec: str) -> list[float]:
    parts = [p.strip() for p in text.split(",")]
    if not text.strip() or any(not p for p in parts):
        raise InputError(f"capacity spec {spec!r} has an empty list entry")
    return [_number(p, spec) for p in parts]


def _number(text: str, spec: str) -> float:
    try:
        value = float(Fraction(text.strip()))
    except (ValueError, ZeroDivisionError):
        raise InputError(f"capacity {text!r} in spec {spec!r} is not a number") from None
    if not 0.0 < value <= 1.0:
        raise InputError(f"capacity {text!r} in spec {spec!r} is outside (0, 1]")
    return value
