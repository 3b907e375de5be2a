"""The portal's limit on a command, checked before sending (labctl cannot import the portal).

The numbers and the wording are those of jobqueue.models.command_limit_refusal; a test
holds the two together.
"""

from __future__ import annotations

from collections.abc import Sequence

MAX_COMMAND_CHARS = 8000
MAX_COMMAND_ARGS = 1000


def command_limit_refusal(argv: Sequence[str]) -> str | None:
    """Why the argument vector is over the portal's limit, or None: a list is measured as
    its arguments joined by spaces."""
    if len(argv) > MAX_COMMAND_ARGS:
        return (
            f"The command has {len(argv)} arguments; at most {MAX_COMMAND_ARGS} are allowed. "
            "Put the work in a script and run the script."
        )
    length = sum(len(part) for part in argv) + max(0, len(argv) - 1)
    if length > MAX_COMMAND_CHARS:
        return (
            f"The command is {length} characters long; at most {MAX_COMMAND_CHARS} are allowed. "
            "Put the work in a script and run the script."
        )
    return None
