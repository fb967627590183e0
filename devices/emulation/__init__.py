"""The emulated fleet: devices that run on this host, held to a board's CPU share and memory.

What real devices never need: the SSH server of an emulated board (`sshd`), its CPU and memory
limits (`limits`, `presets`), the arm64 userland under qemu-user (`rootfs`, `qemu`), the phone
behind a real adb (`adb_endpoint`), and `emulate`, which starts and
stops a fleet file's emulated devices (``fleetbench fleet up`` / ``down``).
"""
