"""Errors raised on bad input to the exporters package."""


class InputError(ValueError):
    """A request that cannot be satisfied as given (unknown model, bad width, ...).

    The CLI prints its message as one line on stderr and exits with status 2.
    """


class ExportError(RuntimeError):
    """The toolchain produced artifacts that break the contract (a bug, not bad input)."""
