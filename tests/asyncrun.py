"""Run a coroutine to completion from a synchronous test, whatever else runs in the process.

``asyncio.run`` refuses to start while the thread already has a running loop, as it has
after Playwright's synchronous API ran in the same pytest worker (the browser tests).
A thread of its own always starts with no loop.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


def run_coroutine(coro: Coroutine[Any, Any, T], timeout_s: float | None = None) -> T:
    outcome: dict[str, Any] = {}

    def target() -> None:
        try:
            main = coro if timeout_s is None else asyncio.wait_for(coro, timeout_s)
            outcome["value"] = asyncio.run(main)
        except BaseException as exc:  # re-raised in the caller's thread
            outcome["error"] = exc

    thread = threading.Thread(target=target, name="test-asyncio", daemon=True)
    thread.start()
    thread.join()
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]
