"""A population of virtual clients drawn from measured devices, and the virtual clock of its rounds (pure).

``fl run --population fast=0.3,mid=0.5,slow=0.2 --profiles DB`` maps the run's clients
onto devices measured in a profile store and advances a virtual clock, round by round,
from the time each client's round would take on its device. This module holds the
logic; the round-cost function ``(device, arch, steps, bytes_down, bytes_up) -> seconds``
is injected (`fl.roundcost.round_cost_from_store` builds it from the store).

Population (`draw_population`)
    Shares become client counts by the largest-remainder rule (`fl.capacity.counts`), and
    a permutation seeded by the run seed decides which client is which device. Every
    client gets a speed factor ``exp(sigma * z)``, ``z ~ N(0, 1)`` (lognormal with median
    1), multiplying its device's whole round time: units of one device class differ
    (thermal state, background load, battery saver). **Decision:** ``sigma`` defaults
    to `DEFAULT_VARIATION` = 0.1, a one-sigma spread of about 10 % between units; it is
    an assumption, not a measurement (the store measures one unit per device), so it is
    a flag (``--variation``, 0 turns it off). Availability: in every round each client
    is online with probability ``availability`` (default 1), drawn independently per
    round from ``(seed, round, AVAILABILITY_STREAM)``.

Sampling (`sample_round`)
    Among the online clients, ``ceil(K * (1 + overcommit))`` are drawn without
    replacement from ``default_rng((seed, round))``, K being the run's clients per
    round. With everyone online and no over-commitment this is exactly
    `fl.server.sample_clients`' draw, so a population run trains the same clients as the
    plain run and only adds virtual times.

The virtual round (`schedule_round`), as FedScale simulates it
    Each sampled client's round time is known before it trains (`client_timing`); the
    round keeps the first K clients to finish, provided they finish by the deadline.
    Clients later than the deadline fail as ``timeout``; over-committed clients that
    finish after the K-th are cut when the round closes (``timeout`` as well: the round
    stopped waiting for them). **Decision:** only the kept clients train: their
    selection depends on virtual times alone, so training the others would change
    nothing but the wall time. The round lasts until its K-th client finishes; with
    fewer than K finishers it lasts until the deadline if someone was cut by it, else
    until its last client finishes.

Timing of one client (`client_timing`)
    From the injected cost and the client's factor: ``fixed = cost(d, a, 0, 0, 0)``,
    ``download = cost(d, a, 0, down, 0) - fixed``, ``upload = cost(d, a, 0, 0, up) -
    fixed``, ``steps = cost(d, a, steps, 0, 0) - fixed``; compute is fixed plus steps.
    The parts let the strategies treat them as they treat measured ones (FLuID scales
    only the steps with the sub-model width).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from exporters.arch import Arch
from exporters.userinput import InputError
from fl.capacity import counts
from harness.roundcost import RoundCost

#: One-sigma spread of the lognormal per-client speed factor (see the module docstring).
DEFAULT_VARIATION = 0.1
#: Tolerance on the sum of the shares.
SHARE_TOL = 1e-6
#: Seed streams (the second element of the seed tuple), apart from the sampling's ``(seed, round)``.
POPULATION_STREAM = 7001
AVAILABILITY_STREAM = 7002


def split_item(item: str, refusal: str) -> tuple[str, str]:
    """Split ``key=value`` at the first ``=``; the key is stripped.

    Parameters
    ----------
    item : str
    refusal : str
        The message of the `InputError` for an item without ``=`` or with an empty key.

    Returns
    -------
    (str, str)

    Raises
    ------
    InputError
    """
    key, sep, value = item.partition("=")
    key = key.strip()
    if not sep or not key:
        raise InputError(refusal)
    return key, value


def parse_population(spec: str) -> dict[str, float]:
    """Parse ``device=share,...``.

    Parameters
    ----------
    spec : str
        ``"fast=0.3,mid=0.5,slow=0.2"``.

    Returns
    -------
    dict of str to float
        Shares by device, in spec order.

    Raises
    ------
    InputError
        On an empty spec, an item without ``=``, a share that is not a number in [0, 1],
        a device named twice, or shares that do not sum to 1.
    """
    shares: dict[str, float] = {}
    items = [item.strip() for item in spec.split(",")]
    if not spec.strip() or any(not item for item in items):
        raise InputError(f"--population {spec!r}: give device=share,... (e.g. fast=0.3,mid=0.5,slow=0.2)")
    for item in items:
        device, text = split_item(item, f"--population {spec!r}: {item!r} is not device=share")
        try:
            share = float(text)
        except ValueError:
            raise InputError(f"--population {spec!r}: share {text.strip()!r} of {device} is not a number") from None
        if not (math.isfinite(share) and 0.0 <= share <= 1.0):
            raise InputError(f"--population {spec!r}: share {share:g} of {device} is outside [0, 1]")
        if device in shares:
            raise InputError(f"--population {spec!r}: device {device} is named twice")
        shares[device] = share
    total = sum(shares.values())
    if abs(total - 1.0) > SHARE_TOL:
        raise InputError(f"--population {spec!r}: shares sum to {total:g}, not 1")
    return shares


def check_devices(shares: Mapping[str, float], measured: Mapping[str, Iterable[str]], model: str, where: str) -> None:
    """Refuse a population device that the store did not measure, or measured without ``model``.

    Parameters
    ----------
    shares : mapping of str to float
        From `parse_population`.
    measured : mapping of str to iterable of str
        Models with a usable profile, by device (every device of the store, also one with none).
    model : str
        The run's model.
    where : str
        The store, for the message.

    Raises
    ------
    InputError
        Naming the first device at fault and what the store has.
    """
    for device in shares:
        if device not in measured:
            known = ", ".join(sorted(measured)) or "none"
            raise InputError(f"--population: unknown device {device!r}; devices measured in {where}: {known}")
        models = set(measured[device])
        if model not in models:
            has = ", ".join(sorted(models)) or "no usable profile"
            raise InputError(f"--population: device {device!r} has no profile of model {model!r} in {where} ({has})")


@dataclass(frozen=True)
class Population:
    """Virtual clients on measured devices.

    Attributes
    ----------
    devices : tuple of str
        The device of client ``i`` (client id ``c{i}``).
    factors : tuple of float
        Client ``i``'s speed factor (its round time over its device's).
    availability : float
        Probability that a client is online in a round.
    variation : float
        The lognormal sigma the factors were drawn with.
    """

    devices: tuple[str, ...]
    factors: tuple[float, ...]
    availability: float = 1.0
    variation: float = DEFAULT_VARIATION

    def __len__(self) -> int:
        return len(self.devices)

    def placement(self) -> dict[str, str]:
        """Return ``{client id: device}``."""
        return {f"c{i}": device for i, device in enumerate(self.devices)}


def draw_population(
    shares: Mapping[str, float],
    num_clients: int,
    seed: int,
    *,
    variation: float = DEFAULT_VARIATION,
    availability: float = 1.0,
) -> Population:
    """Map ``num_clients`` clients onto devices by share and draw their speed factors.

    Parameters
    ----------
    shares : mapping of str to float
        From `parse_population`.
    num_clients : int
    seed : int
        Run seed.
    variation : float
        Lognormal sigma of the per-client speed factor (>= 0).
    availability : float
        Per-round probability that a client is online, in (0, 1].

    Returns
    -------
    Population

    Raises
    ------
    InputError
        On a negative or non-finite variation, or an availability outside (0, 1].
    """
    if not (math.isfinite(variation) and variation >= 0.0):
        raise InputError(f"--variation {variation!r} must be a number >= 0")
    if not (math.isfinite(availability) and 0.0 < availability <= 1.0):
        raise InputError(f"--availability {availability!r} is outside (0, 1]")
    names = list(shares)
    per_device = counts([shares[n] for n in names], num_clients)
    pool = [name for name, n in zip(names, per_device, strict=True) for _ in range(n)]
    rng = np.random.default_rng((seed, POPULATION_STREAM))
    order = rng.permutation(num_clients)
    factors = rng.lognormal(0.0, variation, num_clients) if variation > 0 else np.ones(num_clients)
    return Population(
        tuple(pool[i] for i in order), tuple(float(f) for f in factors), float(availability), float(variation)
    )


def online(population: Population, rnd: int, seed: int) -> np.ndarray:
    """Return the indices of the clients online in round ``rnd`` (all of them at availability 1)."""
    n = len(population)
    if population.availability >= 1.0:
        return np.arange(n)
    draws = np.random.default_rng((seed, rnd, AVAILABILITY_STREAM)).random(n)
    return np.flatnonzero(draws < population.availability)


def sample_round(population: Population, rnd: int, seed: int, per_round: int, overcommit: float = 0.0) -> list[int]:
    """Draw round ``rnd``'s clients among the online ones, over-committed (see the module docstring).

    Parameters
    ----------
    population : Population
    rnd : int
    seed : int
    per_round : int
        K, the clients a round keeps.
    overcommit : float
        ``o >= 0``: ``ceil(K * (1 + o))`` clients are sampled.

    Returns
    -------
    list of int
        Client indices, ascending; fewer when fewer are online.
    """
    candidates = online(population, rnd, seed)
    count = min(math.ceil(per_round * (1.0 + overcommit) - 1e-9), len(candidates))
    if count <= 0:
        return []
    chosen = np.random.default_rng((seed, rnd)).choice(candidates, size=count, replace=False)
    return sorted(int(i) for i in chosen)


@dataclass(frozen=True)
class Timing:
    """One client's virtual round, in seconds.

    Attributes
    ----------
    download, compute, upload : float
        ``compute`` holds the round's fixed cost and its training steps.
    steps : float
        The training steps' part of ``compute``.
    """

    download: float
    compute: float
    upload: float
    steps: float

    @property
    def total(self) -> float:
        """Download + compute + upload."""
        return self.download + self.compute + self.upload


def client_timing(
    cost: RoundCost, device: str, arch: Arch, steps: float, bytes_down: int, bytes_up: int, factor: float = 1.0
) -> Timing:
    """Split a client's round time into its parts (see the module docstring) and scale them by ``factor``.

    Parameters
    ----------
    cost : RoundCost
    device : str
    arch : Arch
        The architecture the client trains.
    steps : float
        Local training work in full-batch steps (`full_batch_steps`).
    bytes_down, bytes_up : int
        Payload sizes each way.
    factor : float
        The client's speed factor.

    Returns
    -------
    Timing
    """
    fixed = cost(device, arch, 0, 0, 0)
    down = cost(device, arch, 0, bytes_down, 0) - fixed
    up = cost(device, arch, 0, 0, bytes_up) - fixed
    train = cost(device, arch, steps, 0, 0) - fixed
    return Timing(factor * down, factor * (fixed + train), factor * up, factor * train)


@dataclass(frozen=True)
class RoundSchedule:
    """Who a virtual round keeps and how long it lasts.

    Attributes
    ----------
    kept : tuple of str
        Clients whose update the round uses, fastest first.
    late : dict of str to float
        Clients past the deadline: their round time.
    cut : dict of str to float
        Over-committed clients that finished after the round closed: their round time.
    seconds : float
        The round's virtual duration.
    """

    kept: tuple[str, ...]
    late: dict[str, float]
    cut: dict[str, float]
    seconds: float


def schedule_round(times: Mapping[str, float], keep: int, deadline_s: float | None = None) -> RoundSchedule:
    """Keep the first ``keep`` clients to finish by the deadline (see the module docstring).

    Parameters
    ----------
    times : mapping of str to float
        Each sampled client's virtual round time.
    keep : int
        K.
    deadline_s : float, optional
        Round deadline in virtual seconds.

    Returns
    -------
    RoundSchedule
        Ties in time go to the client listed first.
    """
    order = sorted(times, key=lambda cid: times[cid])  # stable: ties keep the input order
    in_time = [cid for cid in order if deadline_s is None or times[cid] <= deadline_s]
    late = {cid: float(times[cid]) for cid in order if cid not in set(in_time)}
    kept = tuple(in_time[:keep])
    cut = {cid: float(times[cid]) for cid in in_time[keep:]}
    if len(kept) == keep and kept:
        seconds = float(times[kept[-1]])
    elif late and deadline_s is not None:
        seconds = float(deadline_s)
    else:
        seconds = float(max((times[c] for c in kept), default=0.0))
    return RoundSchedule(kept, late, cut, seconds)


def full_batch_steps(examples: int, batch: int, epochs: int) -> float:
    """Return a round's training work in full batches: ``epochs * examples / batch``.

    Every batch trains, the short last one of an epoch too, and a step's time grows with the
    examples in its batch; so a round trains ``epochs * examples`` images, which the round-cost
    model prices as this many full-batch steps (``steps * batch * latency``).
    """
    return int(epochs) * int(examples) / max(int(batch), 1)


def payload_bytes(parameters: Mapping[str, np.ndarray]) -> int:
    """Return the bytes of a parameter payload (float32 on the wire)."""
    return int(sum(np.asarray(v).size for v in parameters.values())) * 4


class VirtualClock:
    """A population, its round-cost function and the round rules: the virtual clock of a run.

    Parameters
    ----------
    population : Population
    cost : RoundCost
    seed : int
        Run seed.
    overcommit : float
        Over-commitment ``o`` (>= 0).
    deadline_s : float, optional
        Round deadline in virtual seconds.

    Raises
    ------
    InputError
        On a negative over-commitment or a deadline that is not positive.
    """

    def __init__(
        self,
        population: Population,
        cost: RoundCost,
        *,
        seed: int = 0,
        overcommit: float = 0.0,
        deadline_s: float | None = None,
    ) -> None:
        if not (math.isfinite(overcommit) and overcommit >= 0.0):
            raise InputError(f"--overcommit {overcommit!r} must be a number >= 0")
        if deadline_s is not None and not (math.isfinite(deadline_s) and deadline_s > 0):
            raise InputError(f"--deadline {deadline_s!r} must be a positive number of seconds")
        self.population = population
        self.cost = cost
        self.seed = seed
        self.overcommit = overcommit
        self.deadline_s = deadline_s

    def sample(self, rnd: int, per_round: int) -> list[int]:
        """Return round ``rnd``'s sampled client indices (`sample_round`)."""
        return sample_round(self.population, rnd, self.seed, per_round, self.overcommit)

    def timing(self, index: int, arch: Arch, steps: float, bytes_down: int, bytes_up: int) -> Timing:
        """Return client ``index``'s virtual round on its device, with its speed factor."""
        device = self.population.devices[index]
        return client_timing(self.cost, device, arch, steps, bytes_down, bytes_up, self.population.factors[index])

    def schedule(self, times: Mapping[str, float], keep: int) -> RoundSchedule:
        """Return the round's schedule under this clock's deadline (`schedule_round`)."""
        return schedule_round(times, keep, self.deadline_s)


def client_index(cid: str) -> int:
    """Return the index of client id ``c{i}``."""
    return int(cid[1:])


def widths_within(
    timing: Callable[[float], float], widths: Sequence[float], deadline_s: float
) -> float:
    """Return the widest of ``widths`` whose round time meets the deadline (the narrowest when none does).

    Parameters
    ----------
    timing : callable
        ``width -> virtual round seconds`` of one client.
    widths : sequence of float
    deadline_s : float

    Returns
    -------
    float
    """
    fitting = [w for w in widths if timing(w) <= deadline_s]
    return float(max(fitting) if fitting else min(widths))
