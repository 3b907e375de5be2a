"""kombu's filesystem transport with atomic message files, for the demo's serverless broker.

kombu writes a message file in place while a consumer may already move and read it,
so a consumer can read an empty file and its worker stops on the JSON error. Here a
message is written under a temporary name and renamed into place, which is atomic on
one filesystem. ``install()`` makes ``filesystem://`` URLs use this transport.
"""

from __future__ import annotations

import os
import uuid
from time import monotonic
from typing import Any

from kombu.exceptions import ChannelError
from kombu.transport import TRANSPORT_ALIASES, filesystem
from kombu.utils.encoding import str_to_bytes
from kombu.utils.json import dumps


class Channel(filesystem.Channel):
    def _put(self, queue: str, payload: Any, **kwargs: Any) -> None:
        name = f"{int(round(monotonic() * 1000))}_{uuid.uuid4()}.{queue}.msg"
        final = os.path.join(self.data_folder_out, name)
        # The temporary name never ends in ".<queue>.msg", so no consumer picks it up.
        partial = os.path.join(self.data_folder_out, f".{uuid.uuid4()}.partial")
        try:
            with open(partial, "wb") as handle:
                handle.write(str_to_bytes(dumps(payload)))
            os.rename(partial, final)
        except OSError as exc:
            raise ChannelError(f"Cannot add file {final!r} to directory: {exc}") from exc


class Transport(filesystem.Transport):
    Channel = Channel


def install() -> None:
    """Route ``filesystem://`` broker URLs to this transport (idempotent)."""
    TRANSPORT_ALIASES["filesystem"] = "agent.fs_broker:Transport"
