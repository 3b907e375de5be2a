"""The wire format of the agent's messages: validation into typed records.

Agents are trusted only as far as their token goes, so everything they send is
checked here before a service acts on it. A bad message raises `MessageRefused`
with a reason an admin can read.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, TypeGuard

from cluster.models import RejectedMessage

GPU_BACKENDS = ("nvml", "simulated")
RUNTIMES = ("docker", "local")
JOB_EVENT_KINDS = ("started", "exited", "start_failed")
MAX_GPUS_PER_NODE = 1024
MAX_LOG_CHARS = 1_000_000


class MessageRefused(Exception):
    """An agent message (or one part of it) that the portal will not act on."""

    def __init__(self, reason: RejectedMessage.Reason, detail: str = "") -> None:
        super().__init__(f"{reason.value}: {detail}" if detail else reason.value)
        self.reason = reason
        self.detail = detail


def malformed(detail: str) -> MessageRefused:
    return MessageRefused(RejectedMessage.Reason.MALFORMED, detail)


def is_int(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: Any) -> TypeGuard[int | float]:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def text_field(data: dict[str, Any], key: str, *, max_length: int, required: bool = True) -> str:
    value = data.get(key)
    if value is None and not required:
        return ""
    if not isinstance(value, str) or (required and not value.strip()):
        raise malformed(f"{key} must be a non-empty string, got {value!r:.80}")
    if len(value) > max_length:
        raise malformed(f"{key} is longer than {max_length} characters")
    return value


@dataclass(frozen=True)
class GpuReport:
    uuid: str
    index: int
    model: str
    memory_mb: int
    kind: str
    parent_uuid: str | None


@dataclass(frozen=True)
class RegisterInfo:
    hostname: str
    agent_version: str
    gpu_backend: str
    runtime: str
    gpus: list[GpuReport]
    # Entries of `gpus` that were malformed, as (detail) strings; the rest register.
    bad_gpus: list[str]

    @property
    def is_simulated(self) -> bool:
        return self.gpu_backend == "simulated" or self.runtime == "local"


def register_info_parse(info: Any) -> RegisterInfo:
    """Validate `node_register`'s info; a malformed GPU entry is set aside, not fatal."""
    if not isinstance(info, dict):
        raise malformed(f"info must be an object, got {type(info).__name__}")
    backend = info.get("gpu_backend")
    runtime = info.get("runtime")
    if backend not in GPU_BACKENDS:
        raise malformed(
            f"gpu_backend must be one of {', '.join(GPU_BACKENDS)}, got {backend!r:.40}"
        )
    if runtime not in RUNTIMES:
        raise malformed(f"runtime must be one of {', '.join(RUNTIMES)}, got {runtime!r:.40}")
    raw_gpus = info.get("gpus")
    if not isinstance(raw_gpus, list) or len(raw_gpus) > MAX_GPUS_PER_NODE:
        raise malformed(f"gpus must be a list of at most {MAX_GPUS_PER_NODE} entries")
    gpus: list[GpuReport] = []
    bad: list[str] = []
    seen: set[str] = set()
    for position, raw in enumerate(raw_gpus):
        try:
            gpu = _gpu_report_parse(raw)
        except MessageRefused as exc:
            bad.append(f"gpus[{position}]: {exc.detail}")
            continue
        if gpu.uuid in seen:
            bad.append(f"gpus[{position}]: UUID {gpu.uuid} reported twice")
            continue
        seen.add(gpu.uuid)
        gpus.append(gpu)
    return RegisterInfo(
        hostname=text_field(info, "hostname", max_length=255, required=False),
        agent_version=text_field(info, "agent_version", max_length=32, required=False),
        gpu_backend=backend,
        runtime=runtime,
        gpus=gpus,
        bad_gpus=bad,
    )


def _gpu_report_parse(raw: Any) -> GpuReport:
    if not isinstance(raw, dict):
        raise malformed("each GPU must be an object")
    kind = raw.get("kind", "gpu")
    if kind not in ("gpu", "mig"):
        raise malformed(f"kind must be gpu or mig, got {kind!r:.20}")
    index, memory_mb = raw.get("index"), raw.get("memory_mb")
    if not is_int(index) or not 0 <= index < 10_000:
        raise malformed(f"index must be a small non-negative integer, got {index!r:.20}")
    if not is_int(memory_mb) or not 0 <= memory_mb < 2**31:
        raise malformed(f"memory_mb must be a non-negative integer, got {memory_mb!r:.20}")
    parent_uuid = raw.get("parent_uuid")
    if kind == "mig":
        parent_uuid = text_field(raw, "parent_uuid", max_length=96)
    elif parent_uuid is not None:
        raise malformed("a whole GPU has no parent_uuid")
    return GpuReport(
        uuid=text_field(raw, "uuid", max_length=96),
        index=index,
        model=text_field(raw, "model", max_length=120),
        memory_mb=memory_mb,
        kind=kind,
        parent_uuid=parent_uuid,
    )


def job_event_parse(event: Any) -> dict[str, Any]:
    """Validate a `job_event`; return it with only the protocol's keys."""
    if not isinstance(event, dict):
        raise malformed(f"event must be an object, got {type(event).__name__}")
    job_id = event.get("job_id")
    if not is_int(job_id) or job_id <= 0:
        raise malformed(f"job_id must be a positive integer, got {job_id!r:.40}")
    kind = event.get("kind")
    if kind not in JOB_EVENT_KINDS:
        raise malformed(f"kind must be one of {', '.join(JOB_EVENT_KINDS)}, got {kind!r:.40}")
    text_field(event, "event_id", max_length=200)
    for key in ("container_id", "log_tail", "reason"):
        if event.get(key) is not None and not isinstance(event[key], str):
            raise malformed(f"{key} must be a string or null")
    if event.get("exit_code") is not None and not is_int(event["exit_code"]):
        raise malformed("exit_code must be an integer or null")
    if event.get("ts") is not None and not is_number(event["ts"]):
        raise malformed("ts must be a number (epoch seconds) or null")
    keys = ("event_id", "job_id", "kind", "ts", "container_id", "exit_code", "log_tail", "reason")
    return {key: event.get(key) for key in keys}


def job_id_parse(job_id: Any) -> int:
    if not is_int(job_id) or job_id <= 0:
        raise malformed(f"job_id must be a positive integer, got {job_id!r:.40}")
    return int(job_id)
