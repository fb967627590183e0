"""Round-cost functions for the virtual clock, built from a profile store (the edge of `fl.population`).

`round_cost_from_rows` returns the ``(device, arch, steps, bytes_down, bytes_up) ->
seconds`` function `fl.population.VirtualClock` needs:

    seconds = steps * batch * latency(device, arch) + transfer(bytes_down) + transfer(bytes_up)

``latency`` is the device's per-image training latency predicted for ``arch`` by its fitted
line (`harness.latency.fit`, `harness.latency.predict`: any width or mixed architecture,
measured or not), at the run's batch when the device was measured at it, else at the
one batch it was measured at. A transfer takes ``bytes * 8 / rate + delay`` over the
device's link (`fl.executors.devices.modelled_transfer_seconds`) when ``--link`` gives
one, and no time otherwise. Predictions are cached per (device, architecture).

**One place to switch.** When the measurement side's round-cost model exists
(`harness.roundcost`: the fixed cost of a round on a resident runner, step time per
width through the latency model, transfer time per byte each way, fitted per device),
`round_cost_from_rows` uses it instead: it calls ``harness.roundcost.round_cost(rows,
model, batch, backend)``, which must return a function of the same signature. Nothing
else in `fl` reads a round-cost model.

Backends: a device measured with several backends is costed with the first of
`BACKEND_PREFERENCE` it has (the one the devices executor trains with), unless one is named.
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Iterable, Mapping
from types import ModuleType
from typing import Any

from exporters.arch import Arch
from exporters.errors import InputError
from fl.executors.devices import modelled_transfer_seconds
from fl.population import RoundCost, split_item
from fl.scheduling.rows import profile_rows, select
from harness.latency import DeviceModels, fit, usable_rows

#: Backend chosen when a device was measured with several (first found wins).
BACKEND_PREFERENCE = ("ort", "onnx", "torch")

#: A device's link: rate in kbit/s and one-way delay in milliseconds.
Link = tuple[float, float]


def roundcost_module() -> ModuleType | None:
    """Return `harness.roundcost` when it exists, else None (the one switch; see the module docstring)."""
    try:
        return importlib.import_module("harness.roundcost")
    except ModuleNotFoundError as exc:
        if exc.name == "harness.roundcost":
            return None
        raise


def measured_models(rows: Any) -> dict[str, set[str]]:
    """Return, for every device of the rows, the models it has a usable measurement of (maybe none).

    Parameters
    ----------
    rows : pandas.DataFrame, rows or ``{device: rows}``
        Profile rows (`fl.scheduling.rows.profile_rows` forms).

    Returns
    -------
    dict of str to set of str
    """
    records = profile_rows(rows)
    out: dict[str, set[str]] = {str(r["device"]): set() for r in records}
    for r in usable_rows(records):
        out[str(r["device"])].add(str(r["model"]))
    return out


def parse_links(spec: str | None, devices: Iterable[str]) -> dict[str, Link]:
    """Parse ``--link``: ``KBIT[:DELAY_MS]`` for every device, or ``device=KBIT[:DELAY_MS],...``.

    Parameters
    ----------
    spec : str or None
    devices : iterable of str
        The population's devices.

    Returns
    -------
    dict of str to (float, float)
        ``{device: (kbit/s, delay ms)}``; devices without a link are absent.

    Raises
    ------
    InputError
        On a malformed item, a rate that is not positive, a negative delay or an unknown device.
    """
    names = list(devices)
    if spec is None or not spec.strip():
        return {}
    if "=" not in spec:
        link = _link(spec.strip(), spec)
        return dict.fromkeys(names, link)
    out: dict[str, Link] = {}
    for item in spec.split(","):
        device, text = split_item(item, f"--link {spec!r}: {item.strip()!r} is not device=KBIT[:DELAY_MS]")
        if device not in names:
            raise InputError(f"--link {spec!r}: device {device!r} is not in the population ({', '.join(names)})")
        out[device] = _link(text.strip(), spec)
    return out


def _link(text: str, spec: str) -> Link:
    rate_text, _, delay_text = text.partition(":")
    try:
        rate, delay = float(rate_text), float(delay_text or 0.0)
    except ValueError:
        raise InputError(f"--link {spec!r}: {text!r} is not KBIT[:DELAY_MS]") from None
    if not (math.isfinite(rate) and rate > 0) or not (math.isfinite(delay) and delay >= 0):
        raise InputError(f"--link {spec!r}: rate must be positive and delay >= 0 in {text!r}")
    return rate, delay


def _config(dm: DeviceModels, model: str, batch: int, backend: str | None) -> tuple[str, int, str]:
    """Return the fitted configuration of ``model`` to cost with: the run's batch if measured, else the only one."""
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


def round_cost_from_rows(
    rows: Any,
    model: str,
    batch: int,
    devices: Iterable[str],
    *,
    backend: str | None = None,
    links: Mapping[str, Link] | None = None,
) -> RoundCost:
    """Build the round-cost function of ``devices`` from profile rows (see the module docstring).

    Parameters
    ----------
    rows : pandas.DataFrame, rows or ``{device: rows}``
        The store's latest cells.
    model : str
        The run's model.
    batch : int
        The run's local batch size.
    devices : iterable of str
        Devices to cost (each must have a usable profile of ``model``).
    backend : str, optional
        Only this backend's measurements.
    links : mapping of str to (kbit/s, delay ms), optional

    Returns
    -------
    RoundCost

    Raises
    ------
    InputError
        When a device has no usable profile of ``model``, or several batches and none is the run's.
    """
    names = list(devices)
    chosen = select(profile_rows(rows), model=model, backend=backend)
    module = roundcost_module()
    if module is not None:
        cost: RoundCost = module.round_cost(chosen, model, batch, backend)
        return cost
    models = fit(chosen)
    for device in names:
        if device not in models:
            raise InputError(f"device {device!r} has no usable profile of model {model!r}")
    configs = {device: _config(models[device], model, batch, backend) for device in names}
    link_of = dict(links or {})
    cache: dict[tuple[str, str], float] = {}

    def per_image_seconds(device: str, arch: Arch) -> float:
        key = (device, arch.key())
        if key not in cache:
            _, config_batch, config_backend = configs[device]
            dm = models[device]
            cache[key] = dm.latency[dm.key(model, config_batch, config_backend)].predict(arch).value
        return cache[key]

    def transfer(device: str, nbytes: int) -> float:
        if nbytes <= 0 or device not in link_of:
            return 0.0
        rate, delay = link_of[device]
        return float(modelled_transfer_seconds(nbytes, rate, delay) or 0.0)  # type: ignore[arg-type]

    def round_cost(device: str, arch: Arch, steps: int, bytes_down: int, bytes_up: int) -> float:
        compute = steps * batch * per_image_seconds(device, arch) if steps > 0 else 0.0
        return compute + transfer(device, bytes_down) + transfer(device, bytes_up)

    return round_cost
