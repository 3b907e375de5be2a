"""Readers of a job's output as it is written: the runtimes' side of log streaming.

``ContainerRuntime.output_stream`` returns one of these; ``agent.logstream`` sends what
they yield. Here, under the runtimes, so that the streamer may import the runtime
interface and the runtimes these readers, with no circle between the two.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

log = logging.getLogger(__name__)

# The most read from a file at once: the streamer's largest chunk.
READ_MAX_BYTES = 256 * 1024


def file_output_stream(
    path: Path | str, offset: int, ended: Callable[[], bool], *, poll_s: float = 0.2
) -> Iterator[bytes]:
    """A growing file's bytes from ``offset``: ``b""`` while it waits, until ``ended()`` and EOF."""
    read_size = READ_MAX_BYTES
    try:
        handle = open(path, "rb")  # noqa: SIM115 - held across the generator's yields
    except OSError:
        return
    with handle:
        handle.seek(offset)
        while True:
            data = handle.read(read_size)
            if data:
                yield data
                continue
            if ended():
                # Ended: what it wrote before its end is in the file; read to its end.
                while data := handle.read(read_size):
                    yield data
                return
            yield b""
            time.sleep(poll_s)


def waiting_stream(frames: Iterator[bytes], *, wait_s: float = 0.2) -> Iterator[bytes]:
    """``frames`` (a blocking stream, such as Docker's log) read by a thread of its own, with
    ``b""`` whenever nothing came for ``wait_s``, so its reader can send what it holds."""
    pipe: queue.Queue[bytes | None] = queue.Queue(maxsize=256)

    def read() -> None:
        try:
            for frame in frames:
                pipe.put(frame)
        except Exception:
            log.exception("the output stream broke off")
        finally:
            pipe.put(None)

    threading.Thread(target=read, name="output-stream", daemon=True).start()
    while True:
        try:
            frame = pipe.get(timeout=wait_s)
        except queue.Empty:
            yield b""
            continue
        if frame is None:
            return
        yield frame


def skip_bytes(stream: Iterator[bytes], count: int) -> Iterator[bytes]:
    """``stream`` without its first ``count`` bytes (those already sent)."""
    for data in stream:
        if count > 0 and data:
            cut = min(count, len(data))
            count -= cut
            data = data[cut:]
            if not data:
                continue
        yield data
