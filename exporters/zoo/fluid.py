"""Models of the fluid paper (filled in by the zoo work)."""

from __future__ import annotations

from collections.abc import Callable

from exporters.zoo import ZooModel

MODELS: dict[str, Callable[[], ZooModel]] = {}
