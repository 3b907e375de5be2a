"""Streams each running job's whole output to the portal while it runs.

One thread per job reads the runtime's output stream (``ContainerRuntime.output_stream``:
the container's log stream under Docker, the output file by offset for the local
runtime) and sends it as ``control.job_log_chunk`` reports of at most
``CHUNK_MAX_BYTES``, each carrying the byte offset of its first byte in the job's
output. The portal stores a chunk once whatever the number of copies, and shows a gap
where bytes never arrived, so a resend is harmless.

The offset of the next byte to send is kept under the agent's state dir, one small
file per job, written after each chunk the broker took: a restarted agent resumes
where it stopped (at worst it sends the last chunk again). It is not synced to disk
per chunk: a power cut costs a resend, never a loss.

A chunk that cannot be handed to the broker is retried with a backoff; meanwhile the
job's output waits where the runtime keeps it (the output file, Docker's log), so a
broker outage delays the log and loses nothing. ``drain`` lets the agent send a job's
last bytes before its end event.
"""

from __future__ import annotations

import base64
import contextlib
import json
import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agent.runtime.base import ContainerRuntime
from agent.runtime.output import READ_MAX_BYTES

log = logging.getLogger(__name__)

CHUNK_MAX_BYTES = READ_MAX_BYTES
# A chunk smaller than the maximum waits at most this long for more output.
FLUSH_INTERVAL_S = 0.5
# How long a job's end event waits for its last output to be sent.
DRAIN_TIMEOUT_S = 30.0
SEND_BACKOFF_MAX_S = 10.0

Sender = Callable[[dict[str, Any]], bool]


class OffsetStore:
    """Where each job's stream stands: ``{"stream", "offset", "done"}``, one file per job."""

    def __init__(self, directory: Path | None) -> None:
        self._dir = directory
        self._memory: dict[int, dict[str, Any]] = {}
        if directory is not None:
            directory.mkdir(parents=True, exist_ok=True)

    def _path(self, job_id: int) -> Path | None:
        return None if self._dir is None else self._dir / f"{job_id}.json"

    def get(self, job_id: int, stream: str) -> tuple[int, bool]:
        """The offset to send from and whether the stream was sent whole; (0, False) if new."""
        state = self._memory.get(job_id)
        path = self._path(job_id)
        if state is None and path is not None:
            try:
                state = json.loads(path.read_text())
            except (OSError, ValueError):
                state = None
        if not isinstance(state, dict) or state.get("stream") != stream:
            return 0, False
        offset = state.get("offset")
        if not isinstance(offset, int) or offset < 0:
            return 0, False
        return offset, bool(state.get("done"))

    def put(self, job_id: int, stream: str, offset: int, *, done: bool = False) -> None:
        state = {"stream": stream, "offset": offset, "done": done}
        self._memory[job_id] = state
        path = self._path(job_id)
        if path is not None:
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps(state))
            tmp.replace(path)

    def forget(self, job_id: int) -> None:
        self._memory.pop(job_id, None)
        path = self._path(job_id)
        if path is not None:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()


def chunk_message(
    job_id: int, stream: str, offset: int, data: bytes, *, final: bool
) -> dict[str, Any]:
    """The argument of ``control.job_log_chunk`` (``protocol.messages.JobLogChunk``)."""
    return {
        "job_id": job_id,
        "stream": stream,
        "offset": offset,
        "data": base64.b64encode(data).decode("ascii"),
        "final": final,
    }


class LogStreamer:
    """Follows the output of every job the agent runs; see the module docstring."""

    def __init__(
        self,
        runtime: ContainerRuntime,
        send: Sender,
        *,
        state_dir: Path | None = None,
        chunk_max_bytes: int = CHUNK_MAX_BYTES,
        flush_interval_s: float = FLUSH_INTERVAL_S,
    ) -> None:
        self._runtime = runtime
        self._send = send
        self._offsets = OffsetStore(state_dir)
        self._chunk = chunk_max_bytes
        self._flush_s = flush_interval_s
        self._lock = threading.Lock()
        self._threads: dict[int, tuple[str, threading.Thread]] = {}
        self._stopping = threading.Event()
        # Jobs whose last chunk the broker is refusing now (it is down).
        self._failing: set[int] = set()

    def follow(self, job_id: int, stream: str) -> None:
        """Start sending job ``job_id``'s output (its container ``stream``) unless already."""
        with self._lock:
            known = self._threads.get(job_id)
            if known is not None and known[0] == stream and known[1].is_alive():
                return
            if self._offsets.get(job_id, stream)[1] or self._stopping.is_set():
                return
            thread = threading.Thread(
                target=self._run, args=(job_id, stream), name=f"job-{job_id}-log", daemon=True
            )
            self._threads[job_id] = (stream, thread)
            thread.start()

    def drain(self, job_id: int, stream: str, timeout_s: float = DRAIN_TIMEOUT_S) -> bool:
        """Send the rest of an ended job's output; True once all of it went to the broker."""
        self.follow(job_id, stream)
        with self._lock:
            known = self._threads.get(job_id)
        if known is not None and known[0] == stream:
            deadline = time.monotonic() + timeout_s
            while known[1].is_alive() and time.monotonic() < deadline:
                if job_id in self._failing:
                    # The broker is down: the end event must not wait for it too (it has
                    # its own outbox); the stream's thread keeps retrying, and the portal
                    # stores a chunk that comes after the end as any other, by offset.
                    break
                known[1].join(0.05)
        return self._offsets.get(job_id, stream)[1]

    def forget(self, job_id: int) -> None:
        """The job's container is removed: its stream's state goes with it."""
        self._offsets.forget(job_id)

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop following (the agent exits); the offsets let the next agent resume."""
        self._stopping.set()
        with self._lock:
            threads = [t for _s, t in self._threads.values()]
        deadline = time.monotonic() + timeout_s
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))

    def _run(self, job_id: int, stream: str) -> None:
        try:
            self._stream(job_id, stream)
        except Exception:  # never take the agent down; the next adoption retries
            log.exception("streaming the output of job %s failed", job_id)

    def _stream(self, job_id: int, stream: str) -> None:
        offset, done = self._offsets.get(job_id, stream)
        if done:
            return
        source = self._runtime.output_stream(job_id, offset)
        if source is None:
            return
        buffer = bytearray()
        last_sent = time.monotonic()
        try:
            for data in source:
                if self._stopping.is_set():
                    return
                buffer += data
                while len(buffer) >= self._chunk:
                    if not self._deliver(job_id, stream, offset, bytes(buffer[: self._chunk])):
                        return
                    offset += self._chunk
                    del buffer[: self._chunk]
                    last_sent = time.monotonic()
                if buffer and (not data or time.monotonic() - last_sent >= self._flush_s):
                    if not self._deliver(job_id, stream, offset, bytes(buffer)):
                        return
                    offset += len(buffer)
                    buffer.clear()
                    last_sent = time.monotonic()
        finally:
            close = getattr(source, "close", None)
            if close is not None:
                close()
        # The stream ended: the job has ended and every byte was read.
        if self._deliver(job_id, stream, offset, bytes(buffer), final=True):
            self._offsets.put(job_id, stream, offset + len(buffer), done=True)

    def _deliver(
        self, job_id: int, stream: str, offset: int, data: bytes, *, final: bool = False
    ) -> bool:
        """Send one chunk, retrying with a backoff until the broker takes it or the agent stops."""
        message = chunk_message(job_id, stream, offset, data, final=final)
        delay = 0.5
        while not self._send(message):
            self._failing.add(job_id)
            if self._stopping.wait(delay):
                return False
            delay = min(SEND_BACKOFF_MAX_S, delay * 2)
        self._failing.discard(job_id)
        self._offsets.put(job_id, stream, offset + len(data), done=final)
        return True
