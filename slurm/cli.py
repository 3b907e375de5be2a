"""The one place that talks to Slurm: slurmrestd with a JWT, or the Slurm commands.

Both clients return the same plain dataclasses, parsed from Slurm 22.05's JSON (the
OpenAPI v0.0.38 shapes, which ``squeue --json``, ``sinfo --json`` and ``sacct --json``
print too), so the services above never see which transport ran.

Why slurmrestd first: the portal submits as the member's unix user with a token it signs
itself (HS256, Slurm's own ``jwt_key``), valid for minutes, so the portal host needs no
munge key, no Slurm commands and no sudo rule. The commands are the fallback for a
cluster without slurmrestd: sbatch and scancel run through ``LABPORTAL_SLURM_RUN_AS``
(``sudo -n -u {user} --`` and a sudoers rule limited to those two commands), never as root.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import subprocess
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import quote

import jwt
import requests
from django.conf import settings
from django.core.cache import cache

REST_VERSION = "v0.0.38"
SLURMDB_VERSION = "v0.0.38"


class SlurmError(Exception):
    """Slurm refused or failed a request; ``str()`` is Slurm's own message."""


class SlurmUnavailable(SlurmError):
    """Slurm (slurmctld, slurmrestd or the commands) could not be reached."""


class SlurmSetupError(SlurmError):
    """The portal host cannot run a Slurm command as the member (no sudo, no sudoers rule,
    no Slurm commands): the portal's setup, not a Slurm outage nor a refusal of the job."""


# What sudo -n prints when it may not run the command without a password (no sudoers rule
# for the portal's user, or not for that target user or command).
_SUDO_REFUSALS = (
    "a password is required",
    "is not allowed to run sudo",
    "is not allowed to execute",
    "a terminal is required",
    "unknown user",
    "is not in the sudoers file",
)


# Slurm's error numbers for "the controller could not be reached" (slurm_errno.h): the
# connection, send, receive and shutdown errors, a socket timeout, zero bytes sent.
UNREACHABLE_ERRNOS = frozenset({1800, 1801, 1802, 1803, 5004, 5005})
UNREACHABLE_MESSAGES = (
    "Unable to contact slurm controller",
    "Connection refused",
    "Socket timed out",
    "Zero Bytes were transmitted",
)


def means_unreachable(message: str, errno: object = None) -> bool:
    """Whether Slurm's error says it could not reach its controller (try again), rather than
    that it refused the request (change it)."""
    return errno in UNREACHABLE_ERRNOS or any(text in message for text in UNREACHABLE_MESSAGES)


# -- whether Slurm answers: every call of either client says so --------------------------

_UNREACHABLE_SINCE = "labportal:slurm:unreachable-since"
# The last command the portal host could not run (sudo, a Slurm command missing). Kept in
# the cache, not the database: the member's submit that met it is rolled back.
_HOST_PROBLEM = "labportal:slurm:host-problem"
_ANSWERED_AT = "labportal:slurm:answered-at"


# A member's submit or cancel within this many seconds of a call that could not reach Slurm
# is answered at once with that call's error (503, try again) instead of waiting out
# slurmrestd's own retries (about 9 s a call) again: one call at most every RETRY_AFTER_S
# tries Slurm, and the first that answers ends the outage for everybody. The periodic sync
# and /healthz always try (``member_call`` is only for what a member waits on).
RETRY_AFTER_S = 10.0
_FAILED = "labportal:slurm:failed"  # the last failed call: its time and error


def _note(*, answered: bool, error: str = "") -> None:
    """Record that Slurm answered (or could not be reached) now, for pages and /healthz.

    A cache that is down must not fail the Slurm call it only reports on."""
    now = datetime.now(tz=UTC).isoformat()
    try:
        if answered:
            cache.set(_ANSWERED_AT, now, timeout=None)
            cache.delete_many([_UNREACHABLE_SINCE, _FAILED])
        else:
            cache.add(_UNREACHABLE_SINCE, now, timeout=None)
            cache.set(_FAILED, {"at": time.time(), "error": error}, timeout=RETRY_AFTER_S)
    except Exception:  # any cache failure: the Slurm call itself stands
        pass


def member_call() -> None:
    """Before a call a member waits on: during an outage, raise the last call's
    SlurmUnavailable at once when a call found Slurm unreachable less than RETRY_AFTER_S
    ago; else return, and this call tries Slurm (and may end the outage)."""
    try:
        failed = cache.get(_FAILED)  # kept RETRY_AFTER_S after the failed call
    except Exception:  # the cache is down: not known, so the call tries Slurm
        return
    if not failed:
        return
    raise SlurmUnavailable(
        f"{failed['error'] or 'Slurm could not be reached'} "
        f"(the last try, {max(0, round(time.time() - float(failed['at'])))} s ago; "
        f"the portal tries Slurm again at most every {RETRY_AFTER_S:g} s)"
    )


def _read_time(key: str) -> datetime | None:
    try:
        value = cache.get(key)
    except Exception:  # the cache is down: not known
        return None
    return datetime.fromisoformat(value) if value else None


def _note_host_problem(message: str) -> None:
    # any cache failure: the member's refusal itself stands
    with contextlib.suppress(Exception):
        cache.set(_HOST_PROBLEM, message, timeout=None)


def slurm_host_problem_take() -> str | None:
    """The last command the portal host could not run, once (for the setup check)."""
    try:
        message = cache.get(_HOST_PROBLEM)
        cache.delete(_HOST_PROBLEM)
    except Exception:
        return None
    return str(message) if message else None


def slurm_unreachable_since() -> datetime | None:
    """Since when Slurm has not been reachable (the first failed call), None while it answers."""
    return _read_time(_UNREACHABLE_SINCE)


def slurm_answered_at() -> datetime | None:
    """When Slurm last answered a call of this portal (None: not since the cache was empty)."""
    return _read_time(_ANSWERED_AT)


# -- what Slurm reports, as plain data -------------------------------------------------


@dataclass(frozen=True)
class JobInfo:
    """One job as squeue/slurmrestd (live) or sacct (accounting) reports it."""

    job_id: int
    name: str = ""
    user: str = ""
    state: str = ""  # Slurm's base state, upper case: PENDING, RUNNING, COMPLETED, ...
    reason: str = ""
    partition: str = ""
    qos: str = ""
    account: str = ""
    # The job's --wckey: LabPortal gives a portal job its project's name (a plain sbatch
    # job may name one too); "" for none.
    wckey: str = ""
    nodes: str = ""
    gpus: int = 0
    submitted_at: datetime | None = None
    started_at: datetime | None = None
    ended_at: datetime | None = None
    # For a pending job, Slurm's estimate of its start (squeue --start); else None.
    estimated_start: datetime | None = None
    exit_code: int | None = None
    signal: int | None = None
    time_limit_s: int | None = None
    elapsed_s: int | None = None
    output_path: str = ""
    tres: dict[str, int] = field(default_factory=dict)
    # For a running job: the node's GPU indices Slurm gave it (``gres_detail``'s IDX).
    gpu_indices: tuple[int, ...] = ()
    # A task of a job array: the array's id and the task's index. The array's one record
    # of tasks not yet started has no index: ``array_pending`` lists them ("1-9", "0x3fe").
    array_job_id: int | None = None
    array_task_id: int | None = None
    array_pending: str = ""


@dataclass(frozen=True)
class NodeInfo:
    name: str
    state: str  # Slurm's base state, lower case: idle, mixed, allocated, down, ...
    flags: tuple[str, ...] = ()  # DRAIN, NOT_RESPONDING, ...
    gpus: int = 0
    gpu_type: str = ""
    partitions: tuple[str, ...] = ()
    # Each GRES type and its count, in slurm.conf's order: (("a100", 2), ("l40s", 2)).
    gpu_types: tuple[tuple[str, int], ...] = ()
    cpus: int = 0
    memory_mb: int = 0
    address: str = ""
    reason: str = ""


@dataclass(frozen=True)
class PartitionInfo:
    name: str
    state: str = "UP"
    is_default: bool = False
    max_time_s: int | None = None
    nodes: str = ""


@dataclass(frozen=True)
class SubmitRequest:
    """One batch job to run as ``unix_user``; ``script`` is the whole batch script."""

    unix_user: str
    script: str
    name: str
    output_path: str
    workdir: str
    time_limit_s: int
    gpus: int = 0
    # The GRES type of the GPUs (``--gres=gpu:<type>:N``); "" for any.
    gpu_type: str = ""
    cpus: int = 1
    memory_mb: int = 0
    partition: str = ""
    qos: str = ""
    account: str = ""
    # The portal project the job is charged to, as Slurm's wckey (TrackWCKey: sreport and
    # sacct report by it); "" for none.
    wckey: str = ""
    environment: dict[str, str] = field(default_factory=dict)
    hold: bool = False
    # Slurm's --dependency over Slurm job ids ("afterok:101:102"); a dependency that can
    # never be met cancels the job (--kill-on-invalid-dep), as LabPortal does.
    dependency: str = ""
    # A job array's indices ("0-9,15"): one sbatch, one task per index.
    array: str = ""


# -- parsing ---------------------------------------------------------------------------

_GPU_GRES = re.compile(r"(?:gres[:/])?gpu(?::([A-Za-z0-9_.-]+))?[:=](\d+)")


def _top_level_parts(text: str) -> list[str]:
    """``text`` split at each comma that no ``)`` follows before a ``(`` (the ``,(S:0,1)``
    inside a socket list stays), in one pass from the end: a lookahead for the ``)``
    rescanned the rest of the text at every comma."""
    cuts = []
    closes_next = False  # the nearest parenthesis to the right is a ")"
    for index in range(len(text) - 1, -1, -1):
        char = text[index]
        if char in "()":
            closes_next = char == ")"
        elif char == "," and not closes_next:
            cuts.append(index)
    parts, start = [], 0
    for cut in reversed(cuts):
        parts.append(text[start:cut])
        start = cut + 1
    parts.append(text[start:])
    return parts


def gpu_count(gres: str | None) -> tuple[int, str]:
    """GPUs and their type in a GRES/TRES string: ``gpu:a100:2(S:0)`` → (2, "a100")."""
    total, kind = 0, ""
    for part in _top_level_parts(gres or ""):
        match = _GPU_GRES.match(part.strip())
        if match:
            total += int(match.group(2))
            kind = kind or (match.group(1) or "")
    return total, kind


def gpu_types(gres: str | None) -> tuple[tuple[str, int], ...]:
    """Each typed GPU GRES and its count: ``gpu:a100:2(S:0),gpu:l40s:2`` → (("a100", 2), ("l40s", 2))."""
    counts: dict[str, int] = {}
    for part in _top_level_parts(gres or ""):
        match = _GPU_GRES.match(part.strip())
        if match and match.group(1):
            counts[match.group(1)] = counts.get(match.group(1), 0) + int(match.group(2))
    return tuple(counts.items())


def gres_request(request: SubmitRequest) -> str:
    """The job's GPU GRES: ``gpu:N``, or ``gpu:<type>:N`` for a GPU model."""
    return f"gpu:{request.gpu_type}:{request.gpus}" if request.gpu_type else f"gpu:{request.gpus}"


def _epoch(value: Any) -> datetime | None:
    """Slurm's epoch seconds (0 or null = unset; 22.05 prints plain ints) as an aware datetime."""
    if isinstance(value, dict):  # newer Slurm: {"set": true, "number": N}
        value = value.get("number") if value.get("set", True) else None
    if not isinstance(value, int) or value <= 0:
        return None
    return datetime.fromtimestamp(value, tz=UTC)


def _minutes_s(value: Any) -> int | None:
    if isinstance(value, dict):
        if value.get("infinite") or not value.get("set", True):
            return None
        value = value.get("number")
    return int(value) * 60 if isinstance(value, int) and value >= 0 else None


def _base_state(value: Any) -> str:
    if isinstance(value, list):  # newer Slurm: ["PENDING", ...]
        value = value[0] if value else ""
    return str(value or "").upper()


def expand_output_path(path: str, *, job_id: int, user: str) -> str:
    """The output file Slurm writes for ``path`` (``%j``, ``%u``, ``%x``-free patterns)."""
    return path.replace("%j", str(job_id)).replace("%u", user).replace("%%", "%")


_GRES_IDX = re.compile(r"^gpu[:(].*\(IDX:([0-9,\-]+)\)")


def gres_indices(details: Iterable[str] | None) -> tuple[int, ...]:
    """The GPU indices of ``gres_detail`` (``["gpu:l40s:1(IDX:2)"]``, ``["gpu:2(IDX:0-1,3)"]``)."""
    indices: list[int] = []
    for detail in details or ():
        match = _GRES_IDX.match(str(detail))
        if not match:
            continue
        for part in match.group(1).split(","):
            low, _dash, high = part.partition("-")
            if low.isdigit() and (not high or high.isdigit()):
                indices.extend(range(int(low), int(high or low) + 1))
    return tuple(sorted(set(indices)))


def parse_live_job(raw: dict[str, Any]) -> JobInfo:
    """One job of ``squeue --json`` / slurmrestd ``/jobs`` (22.05, v0.0.38)."""
    job_id = int(raw["job_id"])
    state = _base_state(raw.get("job_state"))
    status = raw.get("exit_code")
    exit_code = signal = None
    if isinstance(status, int) and state not in ("PENDING", "RUNNING", "CONFIGURING"):
        # 22.05 prints the raw wait status: code << 8 | signal.
        exit_code, signal = status >> 8, status & 0x7F
    gres = raw.get("tres_per_node") or raw.get("tres_per_job") or ""
    gpus, _ = gpu_count(gres)
    start = _epoch(raw.get("start_time"))
    user = str(raw.get("user_name") or "")
    reason = str(raw.get("state_reason") or "")
    return JobInfo(
        job_id=job_id,
        name=str(raw.get("name") or ""),
        user=user,
        state=state,
        reason="" if reason == "None" else reason,
        partition=str(raw.get("partition") or ""),
        qos=str(raw.get("qos") or ""),
        account=str(raw.get("account") or ""),
        wckey=_wckey(raw.get("wckey")),
        nodes=str(raw.get("nodes") or ""),
        gpus=gpus,
        submitted_at=_epoch(raw.get("submit_time")),
        started_at=start if state != "PENDING" else None,
        ended_at=_epoch(raw.get("end_time")) if state not in ("PENDING", "RUNNING") else None,
        estimated_start=start if state == "PENDING" else None,
        exit_code=exit_code,
        signal=signal,
        time_limit_s=_minutes_s(raw.get("time_limit")),
        output_path=expand_output_path(
            str(raw.get("standard_output") or ""), job_id=job_id, user=user
        ),
        gpu_indices=gres_indices(raw.get("gres_detail")) if state == "RUNNING" else (),
        **_array_fields(
            raw.get("array_job_id"), raw.get("array_task_id"), raw.get("array_task_string")
        ),
    )


def _wckey(value: Any) -> str:
    """The wckey a job named: squeue prints the name, sacct ``{"wckey": name, "flags": [...]}``.
    A wckey Slurm gave a job that named none (its user's default: the ``ASSIGNED_DEFAULT``
    flag, or a leading ``*``) is "": such a job was not charged to a project by its member."""
    if isinstance(value, dict):
        if "ASSIGNED_DEFAULT" in (value.get("flags") or ()):
            return ""
        value = value.get("wckey")
    text = str(value or "")
    return "" if text.startswith("*") else text


def _array_fields(array_job_id: Any, task_id: Any, pending: Any) -> dict[str, Any]:
    """A record's place in a job array (squeue's and sacct's fields), {} for a plain job."""
    if not isinstance(array_job_id, int) or array_job_id <= 0:
        return {}
    # 22.05 prints NO_VAL (0xfffffffe) or null for the record of the tasks not yet started.
    index = task_id if isinstance(task_id, int) and 0 <= task_id < 0xFFFFFFF0 else None
    return {
        "array_job_id": array_job_id,
        "array_task_id": index,
        "array_pending": str(pending or "") if index is None else "",
    }


def array_task_indices(text: str) -> set[int]:
    """The indices of Slurm's task list: "1-3,7", "[1-3]", "0-9:2", "1-9%2" (squeue) or a
    hex bitmap "0x3fe" (sacct); an unreadable list is empty."""
    text = text.strip().strip("[]").split("%", 1)[0]
    if text.lower().startswith("0x"):
        try:
            bits = int(text, 16)
        except ValueError:
            return set()
        return {i for i in range(bits.bit_length()) if bits >> i & 1}
    found: set[int] = set()
    for part in filter(None, text.split(",")):
        span, _colon, step = part.partition(":")
        low, _dash, high = span.partition("-")
        if not low.isdigit() or (high and not high.isdigit()) or (step and not step.isdigit()):
            return set()
        found.update(range(int(low), int(high or low) + 1, int(step or 1) or 1))
    return found


def parse_jobs_json(text: str | dict[str, Any]) -> list[JobInfo]:
    """``squeue --json`` or slurmrestd's ``/jobs`` answer."""
    data = json.loads(text) if isinstance(text, str) else text
    return [parse_live_job(raw) for raw in data.get("jobs", [])]


def parse_accounting_job(raw: dict[str, Any]) -> JobInfo:
    """One job of ``sacct --json`` / slurmrestd ``/slurmdb/.../jobs`` (22.05)."""
    times = raw.get("time") or {}
    state = raw.get("state") or {}
    allocated = (raw.get("tres") or {}).get("allocated") or []
    tres: dict[str, int] = {}
    for item in allocated:
        key = item.get("type", "") + (f"/{item['name']}" if item.get("name") else "")
        if isinstance(item.get("count"), int):
            tres[key] = item["count"]
    exit_info = raw.get("exit_code") or {}
    array = raw.get("array") or {}
    derived = raw.get("derived_exit_code") or {}
    code = exit_info.get("return_code")
    # 22.05 leaves the job's return_code 0 for a failed batch script; the batch step has it.
    if not code and _base_state(state.get("current")) == "FAILED":
        steps = [s.get("exit_code", {}).get("return_code") for s in raw.get("steps") or []]
        code = next((c for c in steps if c), derived.get("return_code") or code)
    started = _epoch(times.get("start"))
    return JobInfo(
        job_id=int(raw["job_id"]),
        name=str(raw.get("name") or ""),
        user=str(raw.get("user") or ""),
        state=_base_state(state.get("current")),
        reason="" if state.get("reason") in (None, "None") else str(state.get("reason")),
        partition=str(raw.get("partition") or ""),
        qos=str(raw.get("qos") or ""),
        account=str(raw.get("account") or ""),
        wckey=_wckey(raw.get("wckey")),
        nodes=str(raw.get("nodes") or ""),
        gpus=tres.get("gres/gpu", 0),
        submitted_at=_epoch(times.get("submission")),
        started_at=started,
        ended_at=_epoch(times.get("end")),
        exit_code=code if isinstance(code, int) else None,
        time_limit_s=_minutes_s(times.get("limit")),
        elapsed_s=times.get("elapsed") if isinstance(times.get("elapsed"), int) else None,
        tres=tres,
        **_array_fields(array.get("job_id"), array.get("task_id"), array.get("task")),
    )


def parse_sacct_json(text: str | dict[str, Any]) -> list[JobInfo]:
    data = json.loads(text) if isinstance(text, str) else text
    return [parse_accounting_job(raw) for raw in data.get("jobs", [])]


def parse_node(raw: dict[str, Any]) -> NodeInfo:
    """One node of ``sinfo --json`` / slurmrestd ``/nodes``."""
    gres = str(raw.get("gres") or "")
    gpus, kind = gpu_count(gres)
    state = raw.get("state")
    flags = tuple(str(f).upper() for f in raw.get("state_flags") or [])
    if isinstance(state, list):  # newer Slurm: ["IDLE", "DRAIN"]
        flags = flags + tuple(str(f).upper() for f in state[1:])
        state = state[0] if state else ""
    return NodeInfo(
        name=str(raw["name"]),
        state=str(state or "").lower(),
        flags=flags,
        gpus=gpus,
        gpu_type=kind,
        partitions=tuple(raw.get("partitions") or ()),
        gpu_types=gpu_types(gres),
        cpus=int(raw.get("cpus") or 0),
        memory_mb=int(raw.get("real_memory") or 0),
        address=str(raw.get("address") or ""),
        reason=str(raw.get("reason") or ""),
    )


def parse_nodes_json(text: str | dict[str, Any]) -> list[NodeInfo]:
    data = json.loads(text) if isinstance(text, str) else text
    return [parse_node(raw) for raw in data.get("nodes", [])]


def parse_partitions_json(text: str | dict[str, Any]) -> list[PartitionInfo]:
    """slurmrestd's ``/partitions`` answer."""
    data = json.loads(text) if isinstance(text, str) else text
    return [
        PartitionInfo(
            name=str(raw["name"]),
            state=str(raw.get("state") or "UP").upper(),
            is_default="default" in [str(f).lower() for f in raw.get("flags") or []],
            max_time_s=_minutes_s(raw.get("max_time_limit")),
            nodes=str(raw.get("nodes") or ""),
        )
        for raw in data.get("partitions", [])
    ]


def parse_scontrol_partitions(text: str) -> list[PartitionInfo]:
    """``scontrol show partitions -o``: one ``Key=Value ...`` line per partition."""
    partitions = []
    for line in text.splitlines():
        fields = dict(item.split("=", 1) for item in shlex.split(line.strip()) if "=" in item)
        if "PartitionName" not in fields:
            continue
        max_time = fields.get("MaxTime", "UNLIMITED")
        partitions.append(
            PartitionInfo(
                name=fields["PartitionName"],
                state=fields.get("State", "UP").upper(),
                is_default=fields.get("Default", "NO").upper() == "YES",
                max_time_s=parse_slurm_duration(max_time),
                nodes=fields.get("Nodes", ""),
            )
        )
    return partitions


def parse_slurm_duration(text: str) -> int | None:
    """Slurm's ``[days-]hours:minutes:seconds`` (or minutes) in seconds; None for UNLIMITED."""
    text = text.strip()
    if not text or text.upper() in ("UNLIMITED", "INFINITE", "N/A", "NONE"):
        return None
    days = 0
    if "-" in text:
        head, text = text.split("-", 1)
        days = int(head)
    parts = [int(p) for p in text.split(":")]
    if len(parts) == 1 and not days:
        return parts[0] * 60
    while len(parts) < 3:
        parts.append(0) if days else parts.insert(0, 0)
    hours, minutes, seconds = parts[-3:]
    return ((days * 24 + hours) * 60 + minutes) * 60 + seconds


def parse_squeue_start(text: str) -> dict[int, datetime]:
    """``squeue --start -h -o '%i|%S'``: the estimated start of each pending job Slurm has one for."""
    starts: dict[int, datetime] = {}
    for line in text.splitlines():
        job_id, _, when = line.partition("|")
        when = when.split("|")[0].strip()
        if not job_id.strip().isdigit() or when in ("", "N/A", "Unknown"):
            continue
        # squeue prints the controller's local time without a zone.
        parsed = datetime.fromisoformat(when)
        starts[int(job_id)] = parsed.astimezone(UTC) if parsed.tzinfo else parsed.astimezone()
    return starts


# -- the clients -------------------------------------------------------------------


class SlurmClient(Protocol):
    def submit(self, request: SubmitRequest) -> int: ...
    def cancel(self, job_id: int | str, *, unix_user: str) -> None: ...
    def jobs(self) -> list[JobInfo]: ...
    def accounting_jobs(self, *, since: datetime) -> list[JobInfo]: ...
    def nodes(self) -> list[NodeInfo]: ...
    def partitions(self) -> list[PartitionInfo]: ...


def mint_token(*, key: bytes, unix_user: str, lifetime_s: int) -> str:
    """A Slurm JWT for ``unix_user`` (claim ``sun``), HS256-signed with Slurm's own key."""
    now = int(time.time())
    return jwt.encode({"iat": now, "exp": now + lifetime_s, "sun": unix_user}, key, "HS256")


def _sbatch_script(request: SubmitRequest) -> str:
    """The batch script with the request's options as ``#SBATCH`` lines (for the commands)."""
    lines = ["#!/bin/bash"]
    for flag in _sbatch_flags(request):
        lines.append(f"#SBATCH {flag}")
    body = request.script.split("\n", 1)[1] if request.script.startswith("#!") else request.script
    return "\n".join(lines) + "\n" + body


def _sbatch_flags(request: SubmitRequest) -> list[str]:
    flags = [
        f"--job-name={request.name}",
        f"--output={request.output_path}",
        f"--chdir={request.workdir}",
        f"--time={max(1, -(-request.time_limit_s // 60))}",
        f"--cpus-per-task={request.cpus}",
    ]
    if request.gpus:
        flags.append(f"--gres={gres_request(request)}")
    if request.memory_mb:
        flags.append(f"--mem={request.memory_mb}M")
    for option in ("partition", "qos", "account", "wckey"):
        if value := getattr(request, option):
            flags.append(f"--{option}={value}")
    if request.hold:
        flags.append("--hold")
    if request.dependency:
        flags += [f"--dependency={request.dependency}", "--kill-on-invalid-dep=yes"]
    if request.array:
        flags.append(f"--array={request.array}")
    return flags


class CommandsClient:
    """The Slurm commands on the portal host (munge and slurm.conf configured there)."""

    def __init__(
        self,
        *,
        slurm_conf: str = "",
        run_as: str = "sudo -n -u {user} --",
        service_token: Callable[[], str] | None = None,
    ):
        self.env = {**os.environ}
        self.env.pop("SLURM_JWT", None)
        if slurm_conf:
            self.env["SLURM_CONF"] = slurm_conf
        self.run_as = run_as
        # LABPORTAL_SLURM_COMMANDS_AUTH=jwt: the portal's own commands carry a fresh token.
        self.service_token = service_token

    def _run(
        self,
        argv: list[str],
        *,
        stdin: str | None = None,
        timeout: float = 60,
        as_member: bool = False,
    ) -> str:
        env = self.env
        if self.service_token is not None and not as_member:
            env = {**self.env, "SLURM_JWT": self.service_token()}
        try:
            done = subprocess.run(
                argv,
                input=stdin,
                env=env,
                capture_output=True,
                text=True,
                timeout=timeout,
                check=False,
            )
        except FileNotFoundError as exc:
            # A missing command (sudo, sbatch) is the portal host's setup, not an outage.
            message = f"{argv[0]} is not installed on the portal host"
            _note_host_problem(message)
            raise SlurmSetupError(message) from exc
        except subprocess.TimeoutExpired as exc:
            message = f"{' '.join(argv[:2])} did not answer in {timeout} s"
            _note(answered=False, error=message)
            raise SlurmUnavailable(message) from exc
        if done.returncode != 0:
            message = done.stderr.strip() or done.stdout.strip() or f"exit {done.returncode}"
            if (
                self.run_as
                and message.startswith("sudo:")
                and any(words in message for words in _SUDO_REFUSALS)
            ):
                _note_host_problem(message)
                raise SlurmSetupError(message)
            if means_unreachable(message):
                _note(answered=False, error=message)
                raise SlurmUnavailable(message)
            _note(answered=True)
            raise SlurmError(message.removeprefix("sbatch: error: "))
        _note(answered=True)
        return done.stdout

    def _as(self, unix_user: str) -> list[str]:
        return shlex.split(self.run_as.format(user=unix_user)) if self.run_as else []

    def submit(self, request: SubmitRequest) -> int:
        env_flags = (
            [
                "--export="
                + ",".join(["NONE", *(f"{k}={v}" for k, v in request.environment.items())])
            ]
            if request.environment
            else []
        )
        out = self._run(
            [*self._as(request.unix_user), "sbatch", "--parsable", *env_flags],
            stdin=_sbatch_script(request),
            as_member=True,
        )
        return int(out.strip().split(";")[0])

    def cancel(self, job_id: int | str, *, unix_user: str) -> None:
        # A number, or one task of an array ("41_3").
        self._run([*self._as(unix_user), "scancel", str(job_id)], as_member=True)

    def jobs(self) -> list[JobInfo]:
        jobs = parse_jobs_json(self._run(["squeue", "-a", "--json"]))
        starts = parse_squeue_start(self._run(["squeue", "-a", "--start", "-h", "-o", "%i|%S"]))
        return [_with_start(job, starts.get(job.job_id)) for job in jobs]

    def accounting_jobs(self, *, since: datetime) -> list[JobInfo]:
        start = since.astimezone().strftime("%Y-%m-%dT%H:%M:%S")
        return parse_sacct_json(self._run(["sacct", "-a", "--json", "-S", start], timeout=300))

    def nodes(self) -> list[NodeInfo]:
        return parse_nodes_json(self._run(["sinfo", "--json"]))

    def partitions(self) -> list[PartitionInfo]:
        return parse_scontrol_partitions(self._run(["scontrol", "show", "partitions", "-o"]))


def _with_start(job: JobInfo, start: datetime | None) -> JobInfo:
    if start is None or job.state != "PENDING":
        return job
    from dataclasses import replace

    return replace(job, estimated_start=start)


class RestClient:
    """slurmrestd (``rest_auth/jwt``): each call carries a token for the user it acts as."""

    def __init__(self, *, url: str, key: bytes, service_user: str, lifetime_s: int = 300):
        self.url = url.rstrip("/")
        self.key = key
        self.service_user = service_user
        self.lifetime_s = lifetime_s
        self.session = requests.Session()

    def _call(
        self, method: str, path: str, *, user: str, body: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        headers = {
            "X-SLURM-USER-NAME": user,
            "X-SLURM-USER-TOKEN": mint_token(
                key=self.key, unix_user=user, lifetime_s=self.lifetime_s
            ),
        }
        try:
            response = self.session.request(
                method, self.url + path, json=body, headers=headers, timeout=60
            )
        except requests.RequestException as exc:
            message = f"slurmrestd at {self.url} did not answer: {exc}"
            _note(answered=False, error=message)
            raise SlurmUnavailable(message) from exc
        try:
            data: dict[str, Any] = response.json()
        except ValueError:
            data = {}
        errors = [e for e in data.get("errors") or [] if isinstance(e, dict)]
        messages = [
            str(e.get("description") or e.get("error"))
            for e in errors
            if e.get("description") or e.get("error")
        ]
        text = "; ".join(messages)
        unreachable = response.status_code >= 500 and (
            not messages
            # A read is never refused for what the member asked: slurmrestd failing one
            # ("Unspecified error", "slurmctld config is unable to load") could not reach
            # slurmctld. A submit or cancel says so by its error number.
            or method == "GET"
            or any(means_unreachable(text, e.get("error_code")) for e in errors)
        )
        if unreachable:
            message = text or f"slurmrestd answered {response.status_code}"
            _note(answered=False, error=message)
            raise SlurmUnavailable(message)
        _note(answered=True)
        if response.status_code >= 400 or messages:
            raise SlurmError(text or f"slurmrestd answered {response.status_code}")
        return data

    def submit(self, request: SubmitRequest) -> int:
        job: dict[str, Any] = {
            "name": request.name,
            "current_working_directory": request.workdir,
            "standard_output": request.output_path,
            "time_limit": max(1, -(-request.time_limit_s // 60)),
            "cpus_per_task": request.cpus,
            "environment": {"PATH": "/usr/local/bin:/usr/bin:/bin", **request.environment},
        }
        if request.gpus:
            job["gres"] = gres_request(request)
        if request.memory_mb:
            job["memory_per_node"] = request.memory_mb
        for option in ("partition", "qos", "account", "wckey"):
            if value := getattr(request, option):
                job[option] = value
        if request.hold:
            job["hold"] = True
        if request.dependency:
            job["dependency"] = request.dependency
            job["kill_on_invalid_dependency"] = True
        if request.array:
            job["array"] = request.array
        data = self._call(
            "POST",
            f"/slurm/{REST_VERSION}/job/submit",
            user=request.unix_user,
            body={"job": job, "script": request.script},
        )
        if not data.get("job_id"):
            raise SlurmError(
                "; ".join(str(e.get("error", "")) for e in data.get("errors") or [])
                or "slurmrestd accepted no job"
            )
        return int(data["job_id"])

    def cancel(self, job_id: int | str, *, unix_user: str) -> None:
        self._call("DELETE", f"/slurm/{REST_VERSION}/job/{job_id}", user=unix_user)

    def jobs(self) -> list[JobInfo]:
        return parse_jobs_json(
            self._call("GET", f"/slurm/{REST_VERSION}/jobs", user=self.service_user)
        )

    def accounting_jobs(self, *, since: datetime) -> list[JobInfo]:
        data = self._call(
            "GET",
            f"/slurmdb/{SLURMDB_VERSION}/jobs?start_time={quote(f'{since.astimezone():%Y-%m-%dT%H:%M:%S}')}",
            user=self.service_user,
        )
        return parse_sacct_json(data)

    def nodes(self) -> list[NodeInfo]:
        return parse_nodes_json(
            self._call("GET", f"/slurm/{REST_VERSION}/nodes", user=self.service_user)
        )

    def partitions(self) -> list[PartitionInfo]:
        return parse_partitions_json(
            self._call("GET", f"/slurm/{REST_VERSION}/partitions", user=self.service_user)
        )


def client_from_settings() -> SlurmClient:
    """slurmrestd when LABPORTAL_SLURM_REST_URL is set, else the commands on this host."""
    if settings.LABPORTAL_SLURM_REST_URL:
        return RestClient(
            url=settings.LABPORTAL_SLURM_REST_URL,
            key=Path(settings.LABPORTAL_SLURM_JWT_KEY_FILE).read_bytes(),
            service_user=settings.LABPORTAL_SLURM_SERVICE_USER,
            lifetime_s=settings.LABPORTAL_SLURM_JWT_LIFETIME_S,
        )
    return CommandsClient(
        slurm_conf=settings.LABPORTAL_SLURM_CONF,
        run_as=settings.LABPORTAL_SLURM_RUN_AS,
        service_token=service_token_from_settings(),
    )


def portal_commands() -> CommandsClient:
    """The Slurm commands the portal runs as itself (no member), with the portal's
    slurm.conf and, with LABPORTAL_SLURM_COMMANDS_AUTH=jwt, the service user's token."""
    return CommandsClient(
        slurm_conf=getattr(settings, "LABPORTAL_SLURM_CONF", ""),
        run_as="",
        service_token=service_token_from_settings(),
    )


def service_token_from_settings() -> Callable[[], str] | None:
    """With LABPORTAL_SLURM_COMMANDS_AUTH=jwt: a maker of LABPORTAL_SLURM_SERVICE_USER's
    token (the key read once); None with munge."""
    if getattr(settings, "LABPORTAL_SLURM_COMMANDS_AUTH", "munge") != "jwt":
        return None
    key = Path(settings.LABPORTAL_SLURM_JWT_KEY_FILE).read_bytes()
    user = settings.LABPORTAL_SLURM_SERVICE_USER
    lifetime_s = settings.LABPORTAL_SLURM_JWT_LIFETIME_S
    return lambda: mint_token(key=key, unix_user=user, lifetime_s=lifetime_s)
