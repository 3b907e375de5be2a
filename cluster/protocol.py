"""The wire format of the agent's messages: validation into typed records.

Agents are trusted only as far as their token goes, so everything they send is
checked here before a service acts on it. A bad message raises `MessageRefused`
with a reason an admin can read.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any, TypeGuard

from cluster.models import RejectedMessage

GPU_BACKENDS = ("nvml", "simulated")
RUNTIMES = ("docker", "local", "none")  # none: a monitor-only agent (Slurm node)
JOB_EVENT_KINDS = ("started", "exited", "start_failed")
MAX_GPUS_PER_NODE = 1024
MAX_LOG_CHARS = 1_000_000
# The protocol's limits are the columns' limits (a test compares them), so a message
# that passes validation always fits the database.
MAX_EVENT_ID_CHARS = 160  # JobEvent.event_id
MAX_CONTAINER_ID_CHARS = 80  # Job.container_id
MAX_NODE_NAME_CHARS = 63  # Node.name
MAX_GPU_UUID_CHARS = 96  # Gpu.uuid
MIN_EXIT_CODE, MAX_EXIT_CODE = -(2**31), 2**31 - 1  # Job.exit_code (integer)
# Epoch seconds from 2001 to 2100: anything else is a broken clock or a forged message.
MIN_TS, MAX_TS = 1.0e9, 4102444800.0
MAX_JOB_IDS = 10_000
NODE_NAME = re.compile(r"[-a-zA-Z0-9_]{1,63}")
# PostgreSQL refuses NUL in text and JSON, and no database takes a lone surrogate
# (JSON over the broker can carry one: "\ud800").
_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")
_CONTROL = re.compile("[\x00-\x1f\x7f\ud800-\udfff]")


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


def db_text(value: str) -> str:
    """`value` with what no database column can hold (NUL, lone surrogates) replaced by U+FFFD."""
    return _UNSTORABLE.sub("\ufffd", value)


def text_field(data: dict[str, Any], key: str, *, max_length: int, required: bool = True) -> str:
    """Free text (a host name, a GPU model, a log): unstorable characters are replaced."""
    value = data.get(key)
    if value is None and not required:
        return ""
    if not isinstance(value, str) or (required and not value.strip()):
        raise malformed(f"{key} must be a non-empty string, got {value!r:.80}")
    if len(value) > max_length:
        raise malformed(f"{key} is longer than {max_length} characters")
    return db_text(value)


def identifier_field(
    data: dict[str, Any], key: str, *, max_length: int, required: bool = True
) -> str:
    """An identifier (a UUID, an event or container id): control characters refuse it."""
    value = data.get(key)
    if value is None and not required:
        return ""
    if not isinstance(value, str) or not value.strip():
        raise malformed(f"{key} must be a non-empty string, got {value!r:.80}")
    if len(value) > max_length:
        raise malformed(f"{key} is longer than {max_length} characters")
    if _CONTROL.search(value):
        raise malformed(f"{key} contains control characters: {value!r:.80}")
    return value


def node_name_valid(value: object) -> TypeGuard[str]:
    """A node name as the Node model stores it: letters, digits, - and _, at most 63."""
    return isinstance(value, str) and NODE_NAME.fullmatch(value) is not None


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
        parent_uuid = identifier_field(raw, "parent_uuid", max_length=MAX_GPU_UUID_CHARS)
    elif parent_uuid is not None:
        raise malformed("a whole GPU has no parent_uuid")
    return GpuReport(
        uuid=identifier_field(raw, "uuid", max_length=MAX_GPU_UUID_CHARS),
        index=index,
        model=text_field(raw, "model", max_length=120),
        memory_mb=memory_mb,
        kind=kind,
        parent_uuid=parent_uuid,
    )


def job_event_parse(event: Any) -> dict[str, Any]:
    """Validate a `job_event`; return it with only the protocol's keys, its text made storable."""
    if not isinstance(event, dict):
        raise malformed(f"event must be an object, got {type(event).__name__}")
    job_id = job_id_parse(event.get("job_id"))
    kind = event.get("kind")
    if kind not in JOB_EVENT_KINDS:
        raise malformed(f"kind must be one of {', '.join(JOB_EVENT_KINDS)}, got {kind!r:.40}")
    for key in ("log_tail", "reason"):
        if event.get(key) is not None and not isinstance(event[key], str):
            raise malformed(f"{key} must be a string or null")
    exit_code = event.get("exit_code")
    if exit_code is not None and (
        not is_int(exit_code) or not MIN_EXIT_CODE <= exit_code <= MAX_EXIT_CODE
    ):
        raise malformed(
            f"exit_code must be null or an integer from {MIN_EXIT_CODE} to {MAX_EXIT_CODE}, "
            f"got {exit_code!r:.40}"
        )
    ts = event.get("ts")
    if ts is not None and (not is_number(ts) or not MIN_TS <= ts <= MAX_TS):
        raise malformed(
            f"ts must be null or epoch seconds from {MIN_TS:.0f} to {MAX_TS:.0f}, got {ts!r:.40}"
        )
    log_tail = event.get("log_tail")
    if log_tail is not None and len(log_tail) > MAX_LOG_CHARS:
        log_tail = log_tail[-MAX_LOG_CHARS:]
    return {
        "event_id": identifier_field(event, "event_id", max_length=MAX_EVENT_ID_CHARS),
        "job_id": job_id,
        "kind": kind,
        "ts": ts,
        "container_id": identifier_field(
            event, "container_id", max_length=MAX_CONTAINER_ID_CHARS, required=False
        )
        or None,
        "exit_code": exit_code,
        "log_tail": db_text(log_tail) if log_tail is not None else None,
        "reason": db_text(event["reason"]) if event.get("reason") is not None else None,
    }


@dataclass(frozen=True)
class HeartbeatInfo:
    # None when the agent does not report them (an older agent): nothing is reconciled.
    running_job_ids: frozenset[int] | None
    starting_job_ids: frozenset[int]


def heartbeat_parse(info: Any) -> HeartbeatInfo:
    """Validate `node_heartbeat`'s info: the jobs the node runs and the ones it is starting."""
    if not isinstance(info, dict):
        raise malformed(f"info must be an object, got {type(info).__name__}")
    return HeartbeatInfo(
        running_job_ids=_job_ids(info, "running_job_ids"),
        starting_job_ids=_job_ids(info, "starting_job_ids") or frozenset(),
    )


def _job_ids(info: dict[str, Any], key: str) -> frozenset[int] | None:
    value = info.get(key)
    if value is None:
        return None
    if not isinstance(value, list) or len(value) > MAX_JOB_IDS:
        raise malformed(f"{key} must be a list of at most {MAX_JOB_IDS} job ids")
    if not all(is_int(job_id) and 0 < job_id < 2**63 for job_id in value):
        raise malformed(f"{key} must hold positive integers, got {value!r:.80}")
    return frozenset(value)


def job_id_parse(job_id: Any) -> int:
    if not is_int(job_id) or not 0 < job_id < 2**63:
        raise malformed(f"job_id must be a positive integer, got {job_id!r:.40}")
    return int(job_id)
