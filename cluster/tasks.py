"""The control queue's side of the agent protocol (see docs/nodes.md).

Agents send these tasks by name to the `control` queue; the first two arguments
are always the node name and its token. Each task checks the token, then calls a
service. A refused message is logged and counted (admin: rejected agent
messages) and the task returns normally, so the broker never redelivers it.
A message that passes validation but fails to apply (a bug, a value the
database refuses) is rolled back and recorded the same way, as `apply_failed`,
so nothing an agent reports vanishes or crashes the worker. Every task is safe
to run twice.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from celery import shared_task
from django.db import OperationalError, transaction

from cluster import services
from cluster.models import NodeToken, RejectedMessage
from cluster.protocol import MessageRefused, node_name_valid, register_info_parse

log = logging.getLogger(__name__)

# A database that is briefly unreachable should not lose what the agent reported.
RETRY_ON_DATABASE_ERRORS: dict[str, Any] = {
    "autoretry_for": (OperationalError,),
    "max_retries": 5,
    "retry_backoff": True,
    "retry_backoff_max": 60,
}


def _handle(
    message: str,
    node_name: object,
    token: object,
    action: Callable[[str], object],
    *,
    may_retry: bool = False,
) -> str:
    """Check the node's identity, run `action`, and turn a refusal or a failure into a logged rejection.

    The action runs in one transaction: a refusal keeps what was done before it
    (a withdrawn registration, say); any other failure rolls everything back.
    A database that is briefly unreachable raises, for Celery to retry, while
    `may_retry`; after the last retry the message is recorded too.
    """
    if not (
        node_name_valid(node_name)
        and isinstance(token, str)
        and NodeToken.matches(node_name=node_name, secret=token)
    ):
        services.message_reject(
            node_name=node_name,
            message=message,
            reason=RejectedMessage.Reason.BAD_TOKEN,
            detail=f"token {str(token)[:10]!r}… does not match an active token of this node",
        )
        return f"refused: {RejectedMessage.Reason.BAD_TOKEN.value}"
    refusal: MessageRefused | None = None
    try:
        with transaction.atomic():
            try:
                action(node_name)
            except MessageRefused as exc:
                refusal = exc
    except OperationalError as exc:
        if may_retry:
            raise
        refusal = _apply_failed(message, node_name, exc)
    except Exception as exc:
        refusal = _apply_failed(message, node_name, exc)
    if refusal is not None:
        services.message_reject(
            node_name=node_name, message=message, reason=refusal.reason, detail=refusal.detail
        )
        return f"refused: {refusal.reason.value}"
    return "ok"


def _apply_failed(message: str, node_name: str, exc: Exception) -> MessageRefused:
    log.exception("%s from node %s failed to apply", message, node_name)
    return MessageRefused(
        RejectedMessage.Reason.APPLY_FAILED, f"{type(exc).__name__}: {str(exc)[:1500]}"
    )


def _retries_left(task: Any) -> bool:
    return bool(task.request.retries < task.max_retries)


@shared_task(
    name="control.node_register",
    bind=True,
    time_limit=60,
    soft_time_limit=50,
    **RETRY_ON_DATABASE_ERRORS,
)
def node_register(self: Any, node_name: str, token: str, info: dict[str, Any]) -> str:
    return _handle(
        "node_register",
        node_name,
        token,
        lambda name: services.node_register(node_name=name, info=register_info_parse(info)),
        may_retry=_retries_left(self),
    )


@shared_task(name="control.node_heartbeat", time_limit=30, soft_time_limit=20)
def node_heartbeat(node_name: str, token: str, info: dict[str, Any]) -> str:
    # No retry: the next heartbeat, seconds later, says the same thing.
    return _handle(
        "node_heartbeat",
        node_name,
        token,
        lambda name: services.node_heartbeat_record(node_name=name, info=info),
    )


@shared_task(
    name="control.job_event",
    bind=True,
    time_limit=60,
    soft_time_limit=50,
    **RETRY_ON_DATABASE_ERRORS,
)
def job_event(self: Any, node_name: str, token: str, event: dict[str, Any]) -> str:
    return _handle(
        "job_event",
        node_name,
        token,
        lambda name: services.job_event_accept(node_name=name, event=event),
        may_retry=_retries_left(self),
    )


@shared_task(
    name="control.samples_ingest",
    bind=True,
    time_limit=120,
    soft_time_limit=100,
    **RETRY_ON_DATABASE_ERRORS,
)
def samples_ingest(self: Any, node_name: str, token: str, samples: list[dict[str, Any]]) -> str:
    from telemetry.services import samples_ingest as ingest

    return _handle(
        "samples_ingest",
        node_name,
        token,
        lambda name: ingest(node_name=name, samples=samples),
        may_retry=_retries_left(self),
    )


@shared_task(
    name="control.job_logs_report",
    bind=True,
    time_limit=60,
    soft_time_limit=50,
    **RETRY_ON_DATABASE_ERRORS,
)
def job_logs_report(self: Any, node_name: str, token: str, job_id: int, text: str) -> str:
    return _handle(
        "job_logs_report",
        node_name,
        token,
        lambda name: services.job_logs_accept(node_name=name, job_id=job_id, text=text),
        may_retry=_retries_left(self),
    )


@shared_task(name="control.nodes_check_liveness", time_limit=60, soft_time_limit=50)
def nodes_check_liveness() -> dict[str, Any]:
    """Celery beat, every 15 s: silent nodes go down; after the grace, their jobs are lost."""
    report = services.nodes_check_liveness()
    return {"marked_down": report.marked_down, "jobs_lost": report.jobs_lost}
