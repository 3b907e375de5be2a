"""The three kinds of failure labctl expects, each with its exit code; none prints a traceback."""

from __future__ import annotations

from typing import Any

EXIT_OK = 0
EXIT_REFUSED = 1
EXIT_USAGE = 2
EXIT_UNREACHABLE = 3
# The reader of labctl's output went away (`labctl jobs | head`): 128 + SIGPIPE, as a shell says.
EXIT_BROKEN_PIPE = 141


class LabctlError(Exception):
    exit_code = EXIT_REFUSED

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class UsageError(LabctlError):
    """Bad input or missing configuration: the user fixes the command line or runs `labctl login`."""

    exit_code = EXIT_USAGE


class Unreachable(LabctlError):
    """No answer from the portal at all."""

    exit_code = EXIT_UNREACHABLE


class ApiRefusal(LabctlError):
    """The portal answered with an error; `message` is its explanation."""

    exit_code = EXIT_REFUSED

    def __init__(
        self, message: str, *, status: int, code: str | None = None, body: Any = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.body = body
