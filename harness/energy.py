"""A runner document's energy as the host reads it: joules per image, above idle, with the sensor's flag.

The runner measures the energy of its timed work when the host passes ``--power-root``
(`harness.runner.metering`; the document's ``energy`` object, keys in
`harness.runner.protocol`). `energy_reading` checks that object once, where the document
arrives (`harness.document.parse_document`), and turns it into an `EnergyReading` per
image; `merge_energy` pools the objects of a cell's passes (`harness.passes.merge_passes`).

Decisions:

* a flagged object (external power, a sensor slower than the cell, a sensor that could
  not be read) carries no number per image: the flag says why, and nothing unreliable
  is passed off as measured.
* ``above_idle_per_image`` is ``(joules - idle_joules) / images``: what the training itself
  cost beyond the device's idle draw over the same seconds (negative values, within the
  sensor's noise, are kept as measured).
* passes pool by sums: joules, idle joules, seconds and images add up; the passes'
  uncertainties are independent and add in quadrature.

Everything here is pure.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any


class EnergyError(ValueError):
    """A document's ``energy`` object with a key of the wrong type (the message names the key)."""


@dataclass(frozen=True)
class EnergyReading:
    """The energy of one cell's (or one client round's) timed work, per image.

    Attributes
    ----------
    sensor : str
        The sensor's kind (`harness.runner.power.KINDS`; "" where the runner could not say).
    rails : tuple of str
        The rails summed.
    emulated : bool
        An emulated device's sensor: the joules are a model's, not a device's.
    joules_per_image : float or None
        Joules per training example over the timed steps; None when flagged.
    above_idle_per_image : float or None
        The same above the idle draw over the same seconds; None when flagged or without
        an idle window.
    uncertainty_per_image : float or None
        Uncertainty of ``joules_per_image`` (J); None when flagged.
    flag : str or None
        ``"external-power"``, ``"sensor-slower-than-cell"`` or ``"power: <reason>"``; None:
        measured.
    """

    sensor: str
    rails: tuple[str, ...]
    emulated: bool
    joules_per_image: float | None
    above_idle_per_image: float | None
    uncertainty_per_image: float | None
    flag: str | None

    @property
    def measured(self) -> bool:
        """Whether it holds a number per image (no flag)."""
        return self.flag is None and self.joules_per_image is not None


def _fail(key: str, want: str, value: Any) -> EnergyError:
    return EnergyError(f"runner document key 'energy.{key}': expected {want}, got {type(value).__name__} {value!r:.80}")


def _joules(key: str, value: Any, *, signed: bool = False) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise _fail(key, "a finite number", value)
    if not signed and value < 0:
        raise _fail(key, "a number >= 0", value)
    return float(value)


def _text(key: str, value: Any) -> str | None:
    if value is not None and not isinstance(value, str):
        raise _fail(key, "a string", value)
    return value


def _bool(key: str, value: Any) -> bool:
    if value is None:
        return False
    if not isinstance(value, bool):
        raise _fail(key, "a bool", value)
    return value


def _images(value: Any) -> int:
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise _fail("images", "a count (an integer >= 0)", value)
    return value


def _rails(value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, (list, tuple)) or not all(isinstance(rail, str) for rail in value):
        raise _fail("rails", "a list of strings", value)
    return tuple(value)


def energy_reading(document_energy: Mapping[str, Any] | None) -> EnergyReading | None:
    """Check a runner document's ``energy`` object and return it per image.

    Parameters
    ----------
    document_energy : Mapping or None
        The document's ``energy`` (`harness.runner.protocol`); None: not measured.

    Returns
    -------
    EnergyReading or None
        None where the runner measured no energy. A flagged object, or one without
        joules or images, gives a reading whose numbers are None (a measured object
        without images is flagged ``"no images in the energy window"``).

    Raises
    ------
    EnergyError
        A key of the wrong type, a number not finite, negative joules, seconds or images;
        the message names the key.
    """
    if document_energy is None:
        return None
    if not isinstance(document_energy, Mapping):
        raise EnergyError(
            f"runner document key 'energy': expected an object, got {type(document_energy).__name__} "
            f"{document_energy!r:.80}"
        )
    raw = document_energy
    sensor = _text("sensor", raw.get("sensor")) or ""
    rails = _rails(raw.get("rails"))
    emulated = _bool("emulated", raw.get("emulated"))
    joules = _joules("joules", raw.get("joules"))
    idle = _joules("idle_joules", raw.get("idle_joules"))
    uncertainty = _joules("uncertainty_j", raw.get("uncertainty_j"))
    _joules("seconds", raw.get("seconds"))
    images = _images(raw.get("images"))
    _bool("external_power", raw.get("external_power"))
    flag = _text("flag", raw.get("flag"))
    if flag is None and joules is not None and images == 0:
        flag = "no images in the energy window"
    if flag is not None or joules is None:
        return EnergyReading(sensor, rails, emulated, None, None, None, flag)
    above = (joules - idle) / images if idle is not None else None
    spread = uncertainty / images if uncertainty is not None else None
    return EnergyReading(sensor, rails, emulated, joules / images, above, spread, None)


def merge_energy(objects: Sequence[Mapping[str, Any] | None]) -> dict[str, Any] | None:
    """Pool the ``energy`` objects of one cell's passes into the cell's.

    Parameters
    ----------
    objects : sequence of Mapping or None
        Each pass's ``energy``, first pass first.

    Returns
    -------
    dict or None
        None when no pass measured energy; the first flagged (or absent) pass's object
        when any pass is flagged or missing one (the cell's energy is then not
        measured); else the first pass's object with joules, idle joules, seconds and
        images summed and the uncertainties added in quadrature (``idle_joules`` None
        when a pass has none), ``external_power`` when any pass was.
    """
    if all(obj is None for obj in objects):
        return None
    for obj in objects:
        if obj is None:
            first = next(o for o in objects if o is not None)
            return {**first, "joules": None, "idle_joules": None, "uncertainty_j": None,
                    "flag": "power: a pass of the cell measured no energy"}  # fmt: skip
        if obj.get("flag") is not None or obj.get("joules") is None:
            return dict(obj)
    present = [obj for obj in objects if obj is not None]
    idles = [obj.get("idle_joules") for obj in present]
    idle = None if any(v is None for v in idles) else sum(float(v) for v in idles if v is not None)
    merged = dict(present[0])
    merged.update(
        joules=sum(float(obj["joules"]) for obj in present),
        idle_joules=idle,
        uncertainty_j=math.sqrt(sum(float(obj.get("uncertainty_j") or 0.0) ** 2 for obj in present)),
        seconds=sum(float(obj.get("seconds") or 0.0) for obj in present),
        images=sum(int(obj.get("images") or 0) for obj in present),
        external_power=any(bool(obj.get("external_power")) for obj in present),
    )
    return merged
