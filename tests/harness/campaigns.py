"""What the campaign tests share: the cells' sizes, fleet loaders and a progress callback that counts."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

from devices.fleet import Fleet
from harness.progress import CellEvent

MODEL, WIDTHS, BATCH, STEPS, WARMUP = "fjord-cnn", (0.25, 0.5, 0.75, 1.0), 4, 3, 1
TIMEOUT = 120.0


def load(path: Path) -> Fleet:
    """The fleet of a fleet file."""
    from devices.fleetfile import load_fleet

    return load_fleet(path)


class Counting:
    """Progress callback that counts cells and runs a hook (e.g. kill a device)."""

    def __init__(self, hook: Callable[[CellEvent], None] | None = None) -> None:
        self.events: list[CellEvent] = []
        self.hook = hook
        self.lock = threading.Lock()

    def __call__(self, event: CellEvent) -> None:
        with self.lock:
            self.events.append(event)
        if self.hook is not None:
            self.hook(event)


def local_fleet_file(tmp_path: Path) -> Path:
    """A fleet file of one local device, ``here``, working in ``tmp_path/work``."""
    fleet_file = tmp_path / "fleet.yaml"
    fleet_file.write_text(f"devices:\n  - name: here\n    kind: local\n    workdir: {tmp_path / 'work'}\n")
    return fleet_file
