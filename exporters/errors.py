"""Errors of the exporters that are not the user's: a broken toolchain contract."""


class ExportError(RuntimeError):
    """The toolchain produced artifacts that break the contract (a bug, not bad input)."""
