"""The error of a request that cannot be satisfied as given, whichever layer finds it."""


class InputError(ValueError):
    """A request that cannot be satisfied as given (unknown model, bad width, ...).

    The CLI prints its message as one line on stderr and exits with status 2.
    """
