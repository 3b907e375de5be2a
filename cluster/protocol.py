"""The portal's side of the agent's messages: validation into typed records.

Agents are trusted only as far as their token goes, so everything they send is
checked here before a service acts on it. The messages themselves, their limits and
their refusals are defined once, in `protocol.messages`; this module decodes with them
and adds what only the portal does: a refusal becomes `MessageRefused` (a
`RejectedMessage` reason an admin can read) and free text is made storable.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, TypeVar

from msgspec import structs

from cluster.models import RejectedMessage
from protocol import wire
from protocol.messages import (
    MAX_LOG_CHARS,
    GpuReport,
    Heartbeat,
    JobEvent,
    JobLogsReport,
    Message,
)

M = TypeVar("M", bound=Message)

# PostgreSQL refuses NUL in text and JSON, and no database takes a lone surrogate
# (JSON over the broker can carry one: "\ud800").
_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")


class MessageRefused(Exception):
    """An agent message (or one part of it) that the portal will not act on."""

    def __init__(self, reason: RejectedMessage.Reason, detail: str = "") -> None:
        super().__init__(f"{reason.value}: {detail}" if detail else reason.value)
        self.reason = reason
        self.detail = detail


def malformed(detail: str) -> MessageRefused:
    return MessageRefused(RejectedMessage.Reason.MALFORMED, detail)


def db_text(value: str) -> str:
    """`value` with what no database column can hold (NUL, lone surrogates) replaced by U+FFFD."""
    return _UNSTORABLE.sub("\ufffd", value)


def decode(cls: type[M], data: object) -> M:
    """`data` as the protocol's `cls`, or `MessageRefused` (malformed) saying why not."""
    try:
        return wire.decode(cls, data)
    except wire.Refused as exc:
        raise malformed(exc.detail) from None


@dataclass(frozen=True)
class RegisterInfo:
    hostname: str
    agent_version: str
    gpu_backend: str
    runtime: str
    gpus: list[GpuReport]
    # The agent's gateway (sessions, terminals); empty: it has none.
    gateway: str
    # Entries of `gpus` that were malformed, as (detail) strings; the rest register.
    bad_gpus: list[str]

    @property
    def is_simulated(self) -> bool:
        return self.gpu_backend == "simulated" or self.runtime == "local"


def register_info_parse(info: Any) -> RegisterInfo:
    """Validate `node_register`'s info; a malformed GPU entry is set aside, not fatal."""
    try:
        node, bad = wire.node_info_decode(info)
    except wire.Refused as exc:
        raise malformed(exc.detail) from None
    return RegisterInfo(
        hostname=db_text(node.hostname or ""),
        agent_version=db_text(node.agent_version or ""),
        gpu_backend=node.gpu_backend,
        runtime=node.runtime,
        gpus=[structs.replace(gpu, model=db_text(gpu.model)) for gpu in node.gpus],
        gateway=node.gateway or "",
        bad_gpus=bad,
    )


def job_event_parse(event: Any) -> dict[str, Any]:
    """Validate a `job_event`; return it with only the protocol's keys, its text made storable."""
    clean = structs.asdict(decode(JobEvent, event))
    if clean["log_tail"] is not None:
        clean["log_tail"] = db_text(clean["log_tail"][-MAX_LOG_CHARS:])
    if clean["reason"] is not None:
        clean["reason"] = db_text(clean["reason"])
    return clean


@dataclass(frozen=True)
class HeartbeatInfo:
    # None when the agent does not report them (an older agent): nothing is reconciled.
    running_job_ids: frozenset[int] | None
    starting_job_ids: frozenset[int]


def heartbeat_parse(info: Any) -> HeartbeatInfo:
    """Validate `node_heartbeat`'s info: the jobs the node runs and the ones it is starting."""
    heartbeat = decode(Heartbeat, info)
    running = heartbeat.running_job_ids
    return HeartbeatInfo(
        running_job_ids=frozenset(running) if running is not None else None,
        starting_job_ids=frozenset(heartbeat.starting_job_ids or ()),
    )


def job_logs_parse(job_id: Any, text: Any) -> JobLogsReport:
    """Validate `job_logs_report`'s job id and text; the text keeps its storable last 1 MB."""
    report = decode(JobLogsReport, {"job_id": job_id, "text": text})
    return structs.replace(report, text=db_text(report.text[-MAX_LOG_CHARS:]))
