"""The control queue's side of the agent protocol (see docs/nodes.md).

Agents send these tasks by name to the `control` queue; the first two arguments
are always the node name and a signature over the whole message made with the
node token's key (`protocol.signing`; the token itself never travels on the broker).
Each task checks the signature, then calls a service. A refused message is logged and counted (admin: rejected agent
messages) and the task returns normally, so the broker never redelivers it.
A message that passes validation but fails to apply (a bug, a value the
database refuses) is rolled back and recorded the same way, as `apply_failed`,
so nothing an agent reports vanishes or crashes the worker. A message that is no
task message of ours at all (not JSON, an unknown task, arguments that do not fit)
never reaches a task: `protocol.broker` drops it and `broker_message_dropped` records
it the same way. Every task is safe to run twice.

A report's nonce is recorded in the transaction of its effect (`ReportNonce`), so a
report whose effect was rolled back because the database went away is retried, not
refused as a replay. Such a report is retried, backing off up to
`RETRY_BACKOFF_MAX_S`, until `LABPORTAL_REPORT_RETRY_S` after its agent signed it (at
least the node-lost grace): an outage shorter than that loses no report.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from celery import shared_task
from django.conf import settings
from django.db import (
    InterfaceError,
    OperationalError,
    close_old_connections,
    connection,
    transaction,
)
from django.utils import timezone

from cluster import services
from cluster.models import NodeToken, RejectedMessage
from cluster.protocol import MessageRefused, register_info_parse
from cluster.signing import report_nonce_claim, report_nonces_prune, report_signature_refusal
from protocol.broker import Rejection
from protocol.messages import node_name_valid

log = logging.getLogger(__name__)

# What a database that is away for now raises: stopped or restarting (OperationalError),
# or the connection it dropped, used again (InterfaceError).
DATABASE_AWAY = (OperationalError, InterfaceError)
# Retries wait 1, 2, 4, 8, then 15 s: a report held back by an outage lands within 15 s
# of the database's return, inside the time a job may go unreported by its node before
# it is lost (LABPORTAL_JOB_UNREPORTED_GRACE_S, 60 s by default).
RETRY_BACKOFF_MAX_S = 15


def _handle(
    message: str,
    node_name: object,
    token: object,
    action: Callable[[str], object],
    args: list[Any] | None = None,
    *,
    may_retry: bool = False,
) -> str:
    """Check the node's identity, run `action`, and turn a refusal or a failure into a logged rejection.

    `token` is the signature envelope an agent of this release sends (checked over
    the message's `args`), or a bare token string from an agent of an earlier release.
    The action runs in one transaction: a refusal keeps what was done before it
    (a withdrawn registration, say); any other failure rolls everything back.
    A database that is briefly unreachable raises, for Celery to retry, while
    `may_retry`; after the last retry the message is recorded too.
    """
    if not node_name_valid(node_name):
        services.message_reject(
            node_name=node_name,
            message=message,
            reason=RejectedMessage.Reason.BAD_TOKEN,
            detail=f"node name {str(node_name)[:80]!r} is not a node name",
        )
        return f"refused: {RejectedMessage.Reason.BAD_TOKEN.value}"
    if isinstance(token, dict):
        refusal = report_signature_refusal(
            node_name=node_name, task=f"control.{message}", args=args or [], envelope=token
        )
        if refusal is not None:
            services.message_reject(
                node_name=node_name,
                message=message,
                reason=RejectedMessage.Reason.BAD_TOKEN,
                detail=refusal,
            )
            return f"refused: {RejectedMessage.Reason.BAD_TOKEN.value}"
    elif not (isinstance(token, str) and NodeToken.matches(node_name=node_name, secret=token)):
        services.message_reject(
            node_name=node_name,
            message=message,
            reason=RejectedMessage.Reason.BAD_TOKEN,
            detail="unsigned: the message carries no signature"
            if token is None
            else f"token {str(token)[:10]!r}… does not match an active token of this node",
        )
        return f"refused: {RejectedMessage.Reason.BAD_TOKEN.value}"
    failure: MessageRefused | None = None
    try:
        with transaction.atomic():
            try:
                if isinstance(token, dict) and not report_nonce_claim(
                    node_name=node_name, envelope=token
                ):
                    raise MessageRefused(
                        RejectedMessage.Reason.BAD_TOKEN,
                        "replayed: this report was already received once",
                    )
                action(node_name)
            except MessageRefused as exc:
                failure = exc
    except DATABASE_AWAY as exc:
        if may_retry:
            raise
        failure = _apply_failed(message, node_name, exc)
    except Exception as exc:
        failure = _apply_failed(message, node_name, exc)
    if failure is not None:
        services.message_reject(
            node_name=node_name, message=message, reason=failure.reason, detail=failure.detail
        )
        return f"refused: {failure.reason.value}"
    return "ok"


def broker_message_dropped(rejection: Rejection) -> None:
    """A message on the control queue that was no task message of ours: show it to admins.

    Nothing in it can be believed, so it is filed under no node; `message` is the task
    it named when that task exists, else the kind of message (bounded either way).
    """
    # This runs in the worker's consumer, outside any task: drop a connection the
    # database closed meanwhile, as Celery does around each task. Never inside a
    # transaction (a caller's, or a test's): Django would close its connection.
    if not connection.in_atomic_block:
        close_old_connections()
    services.message_reject(
        node_name="",
        message=(rejection.task or f"({rejection.kind})").removeprefix("control.")[:40],
        reason=RejectedMessage.Reason.MALFORMED,
        detail=f"{rejection.kind} on queue {rejection.queue!r}: {rejection.detail}",
    )


def _apply_failed(message: str, node_name: str, exc: Exception) -> MessageRefused:
    log.exception("%s from node %s failed to apply", message, node_name)
    return MessageRefused(
        RejectedMessage.Reason.APPLY_FAILED, f"{type(exc).__name__}: {str(exc)[:1500]}"
    )


def report_accept(
    task: Any,
    message: str,
    node_name: object,
    token: object,
    action: Callable[[str], object],
    args: list[Any],
) -> str:
    """`_handle` a report; while the database is away, retry it later (see the module)."""
    may_retry = _retry_horizon_left(task, token)
    try:
        return _handle(message, node_name, token, action, args, may_retry=may_retry)
    except DATABASE_AWAY as exc:
        if not may_retry:
            raise
        countdown = min(RETRY_BACKOFF_MAX_S, 2 ** min(task.request.retries, 8))
        log.warning("%s from node %s waits for the database (%s)", message, node_name, exc)
        raise task.retry(exc=exc, countdown=countdown) from exc


def _retry_horizon_left(task: Any, token: object) -> bool:
    """Whether a report may still be retried: until LABPORTAL_REPORT_RETRY_S after it was signed."""
    horizon = settings.LABPORTAL_REPORT_RETRY_S
    signed_at = token.get("ts") if isinstance(token, dict) else None
    if isinstance(signed_at, (int, float)) and not isinstance(signed_at, bool):
        return time.time() - float(signed_at) < horizon
    # A bare token (an agent of an earlier release) says nothing of when it was sent.
    return bool(task.request.retries < horizon // RETRY_BACKOFF_MAX_S + 4)


@shared_task(
    name="control.node_register",
    bind=True,
    max_retries=None,  # retried until LABPORTAL_REPORT_RETRY_S (see report_accept)
    time_limit=60,
    soft_time_limit=50,
)
def node_register(self: Any, node_name: str, token: str, info: dict[str, Any]) -> str:
    return report_accept(
        self,
        "node_register",
        node_name,
        token,
        lambda name: services.node_register(node_name=name, info=register_info_parse(info)),
        [info],
    )


@shared_task(name="control.node_heartbeat", time_limit=30, soft_time_limit=20)
def node_heartbeat(node_name: str, token: str, info: dict[str, Any]) -> str:
    # No retry: the next heartbeat, seconds later, says the same thing.
    return _handle(
        "node_heartbeat",
        node_name,
        token,
        lambda name: services.node_heartbeat_record(node_name=name, info=info),
        [info],
    )


@shared_task(name="control.command_refused", time_limit=30, soft_time_limit=20)
def command_refused(node_name: str, token: str, task: str, reason: str, detail: str) -> str:
    """An agent refused a command (unsigned, forged, expired, replayed): show it to admins."""

    def record(name: str) -> None:
        services.message_reject(
            node_name=name,
            message=f"agent refused {str(task)[:20]}",
            # A monitor-only agent (a Slurm node) refuses every job command, signed or not.
            reason=RejectedMessage.Reason.MONITOR_ONLY
            if reason == RejectedMessage.Reason.MONITOR_ONLY
            else RejectedMessage.Reason.FORGED_COMMAND,
            detail=f"{str(reason)[:40]}: {str(detail)[:1000]}",
        )

    return _handle("command_refused", node_name, token, record, [task, reason, detail])


@shared_task(name="control.nodes_check_liveness", time_limit=60, soft_time_limit=50)
def nodes_check_liveness() -> dict[str, Any]:
    """Celery beat, every LABPORTAL_LIVENESS_CHECK_S: silent nodes go down; after the grace,
    their jobs are lost. Also forgets the nonces of reports too old to be accepted."""
    report = services.nodes_check_liveness()
    report_nonces_prune(now=timezone.now())
    return {"marked_down": report.marked_down, "jobs_lost": report.jobs_lost}
