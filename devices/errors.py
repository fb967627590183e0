"""Errors of the devices package: bad fleet files and transport failures."""

from __future__ import annotations

import errno
import os


class FleetFileError(ValueError):
    """A fleet file that cannot be used as written.

    Its message is one line naming the file, the line and the field, e.g.
    ``fleet.yaml:7: devices[1].port: expected an integer in 1..65535, got 'abc'``.

    Parameters
    ----------
    path : str
        The fleet file.
    line : int
        1-based line of the offending value (0 when the file itself is the problem).
    field : str
        Dotted path of the field, e.g. ``devices[1].port``.
    message : str
        What is wrong and what is expected.
    """

    def __init__(self, path: str, line: int, field: str, message: str) -> None:
        self.path, self.line, self.field, self.message = path, line, field, message
        super().__init__(f"{path}:{line}: {field}: {message}")


class TransportError(Exception):
    """A device could not run what was asked; ``kind`` names the failure for records."""

    kind = "runner error"


class Unreachable(TransportError):
    """The device did not answer (refused, no route, name not resolved, connect timeout)."""

    kind = "unreachable"


class AuthenticationFailed(TransportError):
    """The device answered but refused our credentials."""

    kind = "authentication failed"


class HostKeyRejected(TransportError):
    """The device's host key is unknown or changed, and the fleet does not trust it."""

    kind = "host key rejected"


class CommandTimeout(TransportError):
    """A command or transfer did not finish within its timeout (it was stopped)."""

    kind = "timeout"


class ConnectionLost(TransportError):
    """The connection dropped during a command and one reconnect did not help."""

    kind = "connection lost"


class OutOfSpace(TransportError):
    """The device's file system has no room for what was to be written there.

    Its message is one line naming the device or the path, what failed, and the bytes
    needed and free where they are known.
    """

    kind = "out of space"


class OutputTooLarge(TransportError):
    """A one-shot command wrote more than the host keeps (`devices.transport.MAX_OUTPUT_BYTES`).

    The command was stopped; the message names the device, the command and the stream.
    """


#: How a device words a write that found its file system full (C's ``strerror(ENOSPC)``, lower case).
NO_SPACE_TEXT = (os.strerror(errno.ENOSPC).lower(), "enospc")


def says_out_of_space(text: str) -> bool:
    """Tell whether a device's error text says that its file system is full.

    Parameters
    ----------
    text : str
        An error message or the end of a command's stderr.

    Returns
    -------
    bool
        True when ``text`` holds one of `NO_SPACE_TEXT` (in any case).
    """
    lowered = text.lower()
    return any(words in lowered for words in NO_SPACE_TEXT)


class ProcessEnded(TransportError):
    """A process started with ``Transport.start`` ended while it was written to or read from.

    Parameters
    ----------
    message : str
        What ended, with its exit status and the end of its stderr.
    returncode : int, optional
        Its exit status when known (negative: killed by that signal; through a shell,
        ``128 + signal``).
    stderr : str
        The end of its standard error.
    """

    kind = "process ended"

    def __init__(self, message: str, returncode: int | None = None, stderr: str = "") -> None:
        super().__init__(message)
        self.returncode = returncode
        self.stderr = stderr


class SshdError(RuntimeError):
    """sshd is missing, its configuration is invalid, or it did not start."""


class EmulationError(RuntimeError):
    """An emulated device could not be started."""
