"""Open the right transport for a device record."""

from __future__ import annotations

from devices.fleet import Device
from devices.local import LocalTransport
from devices.ssh import SSHTransport
from devices.transport import Transport


def connect(device: Device, connect_timeout: float = 10.0) -> Transport:
    """Return a transport for ``device`` (connections open lazily, on first use).

    Parameters
    ----------
    device : Device
        ``local`` gives a `LocalTransport` (commands run in the current directory,
        as an SSH command runs in the home directory; with an ``emulate`` block that asks
        for a CPU share, memory or cpus, each starts under the limits ``fleet up`` put in place,
        `devices.emulation.emulate.local_confinement`, and with one that asks for a power
        sensor each carries the device's marker, by which the sensor's driver counts its
        cpu use, `devices.emulation.sensors`); ``ssh`` an `SSHTransport`; ``adb`` a
        ``devices.adb.ADBTransport``.
    connect_timeout : float
        Seconds to reach an SSH device.

    Returns
    -------
    Transport

    Raises
    ------
    ValueError
        For an unknown kind.
    """
    if device.kind == "local":
        from devices.emulation import presets

        limits = None if device.emulate is None else presets.resolve(device.emulate)
        unlimited = limits is None or (limits.cpu_share, limits.memory_mb, limits.cpus) == (None, None, None)
        if unlimited and (limits is None or limits.power is None):
            return LocalTransport()  # no limits to start under (a modelled link only)
        from devices.emulation.emulate import local_confinement

        return LocalTransport(confine=lambda: local_confinement(device))
    if device.kind == "ssh":
        return SSHTransport(device, connect_timeout=connect_timeout)
    if device.kind == "adb":
        from devices.adb import ADBTransport  # imported lazily: adbutils is needed only here

        transport: Transport = ADBTransport.from_device(device)
        return transport
    raise ValueError(f"device {device.name!r}: unknown kind {device.kind!r}")
