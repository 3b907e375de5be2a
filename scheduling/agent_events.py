"""What LabPortal's agents report about jobs, applied to the job queue: their events
(started, exited, start failed), their logs, the jobs their heartbeats list (reconciled
with what the portal gave them), jobs lost with a node, and stops not confirmed.

cluster/ checks a report's signature and node and then hands it here: directly for a
job event or logs (the Celery tasks in scheduling/tasks.py), and through its signals
``node_reported_jobs`` and ``node_jobs_lost`` for heartbeats and silent nodes.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

from django.conf import settings
from django.core.cache import cache
from django.db import transaction
from django.db.models import Q
from django.dispatch import receiver
from django.utils import timezone
from django.utils.translation import gettext as _
from django.utils.translation import gettext_noop

from cluster import selectors as cluster_selectors
from cluster import signals as cluster_signals
from cluster.models import Node, RejectedMessage
from cluster.protocol import (
    MessageRefused,
    db_text,
    job_event_parse,
    job_logs_parse,
)
from cluster.services import node_known
from jobqueue.events import record_event
from jobqueue.models import Job, JobEvent, SchedulingPolicy
from jobqueue.services import (
    LOG_TAIL_CHARS,
    ended_by_stop_state,
    finish_locked,
    force_end_locked,
    job_locked,
    requeue_locked,
)
from scheduling import dispatch

logger = logging.getLogger(__name__)


def job_event_accept(*, node_name: str, event: object) -> None:
    """Pass a job event on to the job queue, if the job is one this node was given.

    One query asks both (a job's end is on its way to the next job's start); the node's
    own row is read only to say why an event is refused.
    """
    clean = job_event_parse(event)
    if not cluster_selectors.job_is_on_named_node(job_id=clean["job_id"], node_name=node_name):
        node_known(node_name=node_name)
        raise MessageRefused(
            RejectedMessage.Reason.JOB_NOT_ON_NODE, f"job {clean['job_id']} ({clean['kind']})"
        )
    job_event_apply(node_name=node_name, event=clean)


def job_logs_accept(*, node_name: str, job_id: object, text: object) -> None:
    """Store a job's log text, if the job is one this node was given; keeps the last 1 MB."""
    report = job_logs_parse(job_id, text)
    node = node_known(node_name=node_name)
    if not cluster_selectors.job_is_on_node(job_id=report.job_id, node_id=node.pk):
        raise MessageRefused(RejectedMessage.Reason.JOB_NOT_ON_NODE, f"job {report.job_id} (logs)")
    job_logs_store(job_id=report.job_id, text=report.text)


def job_event_apply(*, node_name: str, event: Mapping[str, Any]) -> None:
    """Apply an agent's event (started / exited / start_failed). The same event twice changes nothing.

    The job's row is locked first, then the event looked up: a second copy of the event
    applied at the same time waits for the first and then finds it recorded.
    """
    event_id = str(event.get("event_id") or "")
    job_id = event.get("job_id")
    kind = event.get("kind")
    if (
        not event_id
        or not isinstance(job_id, int)
        or kind not in ("started", "exited", "start_failed")
    ):
        raise MessageRefused(RejectedMessage.Reason.MALFORMED, f"job event {event!r:.200}")
    # No savepoint inside the control task's transaction (two round trips): a refusal is
    # found before anything is written and raised once out of the block, and any other
    # failure rolls the whole message back anyway.
    with transaction.atomic(savepoint=False):
        refusal = _job_event_apply(node_name, event, event_id=event_id, job_id=job_id, kind=kind)
    if refusal is not None:
        raise refusal


def _job_event_apply(
    node_name: str, event: Mapping[str, Any], *, event_id: str, job_id: int, kind: str
) -> MessageRefused | None:
    job = (
        Job.objects.select_for_update(of=("self",))
        .select_related("node", "owner")
        .filter(pk=job_id)
        .first()
    )
    if job is not None and JobEvent.objects.filter(event_id=event_id, job=job).exists():
        # A second copy of an event already applied changes nothing, even if the job has
        # been requeued or given to another node since the first copy arrived.
        return None
    if job is None or job.node is None or job.node.name != node_name:
        # Given to another node, or requeued since: say so, never drop it.
        return MessageRefused(
            RejectedMessage.Reason.JOB_NOT_ON_NODE, f"job {job_id} ({kind}) is not on {node_name}"
        )
    try:
        at = _event_time(event, job)
    except MessageRefused as refused:
        return refused
    log_tail = db_text(str(event.get("log_tail") or "")[-LOG_TAIL_CHARS:])
    if log_tail:
        job.log_tail = log_tail
    if kind == "started":
        if job.state == Job.State.DISPATCHED:
            job.move_to(Job.State.RUNNING)
            job.started_at = at
            job.container_id = db_text(str(event.get("container_id") or ""))[:80]
            job.queue_position = None
            job.unreported_since = None
            fields = ["state", "started_at", "container_id", "queue_position", "unreported_since"]
            job.save(update_fields=fields + (["log_tail"] if log_tail else []))
        if job.stop_requested_at is not None and job.node is not None and not job.is_final:
            # The stop reached the node before its container existed, and found nothing.
            dispatch.send_stop(
                node=job.node,
                job_id=job.pk,
                grace_s=SchedulingPolicy.current().stop_grace_s,
                reason=job.end_reason or "cancelled",
            )
        record_event(
            job,
            "started",
            gettext_noop("Running on %(node)s."),
            params={"node": node_name},
            event_id=event_id,
            at=at,
            data={"container_id": job.container_id},
        )
        return None
    if kind == "start_failed":
        reason = db_text(str(event.get("reason") or _("the container could not start")))[:200]
        record_event(
            job,
            "start_failed",
            gettext_noop("Could not start: %(reason)s"),
            params={"reason": reason},
            event_id=event_id,
            at=at,
        )
        if not job.is_final:
            finish_locked(job, Job.State.FAILED, at=at, reason=reason)
        return None
    # exited
    exit_code = event.get("exit_code")
    exit_code = int(exit_code) if isinstance(exit_code, int) else None
    record_event(
        job,
        "exited",
        gettext_noop("Exited with code %(code)s."),
        params={"code": exit_code},
        event_id=event_id,
        at=at,
        data={"exit_code": exit_code},
    )
    if job.is_final:
        return None
    if job.started_at is None:
        job.started_at = job.dispatched_at or at
    if job.end_reason == "preempted":
        requeue_locked(
            job,
            message=gettext_noop("Preempted and back in the queue with its original place."),
            at=at,
        )
        return None
    if job.end_reason == "timed_out":
        state = Job.State.TIMED_OUT
    elif job.end_reason == "cancelled":
        state = Job.State.CANCELLED
    elif exit_code == 0:
        state = Job.State.COMPLETED
    else:
        state = Job.State.FAILED
    finish_locked(job, state, at=at, exit_code=exit_code)
    return None


def _event_time(event: Mapping[str, Any], job: Job) -> datetime:
    """When the event happened, clamped to the job's run: from its dispatch to now.

    An agent's clock may drift a little (LABPORTAL_CLOCK_SKEW_S); an event dated
    further outside the run is refused, since its time would charge or date the
    job wrongly (a `started` a year ago would cost a year of credits).
    """
    now = timezone.now()
    ts = event.get("ts")
    if not isinstance(ts, int | float):
        return now
    at = datetime.fromtimestamp(float(ts), tz=UTC)
    floor = job.dispatched_at or job.submitted_at
    if job.started_at is not None and event.get("kind") == "exited":
        floor = max(floor, job.started_at)
    skew = timedelta(seconds=settings.LABPORTAL_CLOCK_SKEW_S)
    if not floor - skew <= at <= now + skew:
        raise MessageRefused(
            RejectedMessage.Reason.BAD_TIME,
            f"{event.get('kind')} of job {job.pk} dated {at.isoformat()}, outside its run "
            f"({floor.isoformat()} to {now.isoformat()}); check the node's clock (NTP)",
        )
    return min(max(at, floor), now)


def job_logs_store(*, job_id: int, text: str) -> None:
    """Keep the latest tail of a job's log that its agent sent."""
    Job.objects.filter(pk=job_id).update(log_tail=db_text(str(text)[-LOG_TAIL_CHARS:]))


@transaction.atomic
def jobs_mark_lost_on_node(*, node_id: int, reason: str) -> int:
    """Jobs on a node that stayed down past the grace period become `lost` (refunded by credits)."""
    now = timezone.now()
    count = 0
    for job in Job.objects.select_for_update().filter(node_id=node_id, state__in=Job.ACTIVE_STATES):
        record_event(job, "lost", gettext_noop("Lost: %(reason)s"), params={"reason": reason})
        finish_locked(job, Job.State.LOST, at=now, reason=reason)
        count += 1
    return count


# --- Jobs against the node's heartbeats --------------------------------------------


@transaction.atomic
def jobs_reconcile_with_node(
    *,
    node_id: int,
    running_ids: frozenset[int],
    starting_ids: frozenset[int] = frozenset(),
    now: datetime | None = None,
) -> dict[str, list[int]]:
    """Compare the jobs given to a node with the ones its heartbeat says it runs or starts.

    A start the node has not acknowledged within LABPORTAL_START_ACK_S is sent again,
    LABPORTAL_START_RETRIES times, then the job is requeued (or failed after
    LABPORTAL_MAX_DISPATCHES dispatches). A job the node stops reporting for
    LABPORTAL_JOB_UNREPORTED_GRACE_S is lost (and refunded), or, if a stop was asked,
    ends as asked. A job the node reports running before its `started` event arrives
    is taken as started; one that ended here but still runs is told to stop again.
    Returns the job ids acted on, by action.
    """
    now = now or timezone.now()
    acted: dict[str, list[int]] = {
        "resent": [],
        "requeued": [],
        "failed": [],
        "lost": [],
        "ended": [],
        "taken_as_started": [],
        "stopped": [],
    }
    jobs = list(
        Job.objects.select_for_update(of=("self",))
        .select_related("node", "owner", "queue", "image")
        .filter(node_id=node_id)
        .filter(Q(state__in=Job.ACTIVE_STATES) | Q(pk__in=running_ids | starting_ids))
    )
    for job in jobs:
        action = _job_reconcile(
            job, runs=job.pk in running_ids, starts=job.pk in starting_ids, now=now
        )
        if action is not None:
            acted[action].append(job.pk)
    strays = (running_ids | starting_ids) - {job.pk for job in jobs}
    if strays:
        acted["stopped"].extend(_strays_stop(node_id=node_id, job_ids=strays))
    for action, ids in acted.items():
        if ids:
            logger.warning("reconcile with node %s: %s %s", node_id, action, ids)
    return acted


def _reports_agree(job: Job, agree: bool, now: datetime) -> None:
    """Note whether the node's report agrees with the job's state; only changes are written."""
    since = None if agree else (job.unreported_since or now)
    if since != job.unreported_since:
        job.unreported_since = since
        job.save(update_fields=["unreported_since"])


def _job_reconcile(job: Job, *, runs: bool, starts: bool, now: datetime) -> str | None:
    """One job of `jobs_reconcile_with_node`; returns what was done, if anything."""
    assert job.node is not None
    grace = timedelta(seconds=settings.LABPORTAL_JOB_UNREPORTED_GRACE_S)
    overdue = job.unreported_since is not None and now - job.unreported_since >= grace
    if job.state not in Job.ACTIVE_STATES:
        # Ended here (cancelled, lost, forced) while its container still runs: stop it,
        # again every grace period while the node keeps reporting it.
        if not job.is_final or (job.unreported_since is not None and not overdue):
            return None
        job.unreported_since = now
        job.save(update_fields=["unreported_since"])
        dispatch.send_stop(
            node=job.node,
            job_id=job.pk,
            grace_s=SchedulingPolicy.current().stop_grace_s,
            reason=job.end_reason or "ended",
        )
        return "stopped"
    if job.state == Job.State.RUNNING and runs:
        _reports_agree(job, True, now)
        return None
    if job.state == Job.State.DISPATCHED and runs:
        # Its "started" event is in flight, or was lost: believe the node after the grace.
        if not overdue:
            _reports_agree(job, False, now)
            return None
        job.move_to(Job.State.RUNNING)
        job.started_at = job.unreported_since
        job.queue_position = None
        job.unreported_since = None
        job.save()
        record_event(
            job,
            "started",
            gettext_noop(
                "Running on %(node)s (its node reports it; the start event never arrived)."
            ),
            params={"node": job.node.name},
            at=job.started_at,
        )
        return "taken_as_started"
    if job.state == Job.State.DISPATCHED and starts:
        _reports_agree(job, True, now)
        return None
    # The node has no such job.
    if job.state == Job.State.RUNNING or job.stop_requested_at is not None:
        if not overdue:
            _reports_agree(job, False, now)
            return None
        gone_at = job.unreported_since or now
        if job.stop_requested_at is not None and job.end_reason == "preempted":
            requeue_locked(
                job, message=gettext_noop("Back in the queue: its node no longer has it."), at=now
            )
            return "requeued"
        if job.stop_requested_at is not None:
            record_event(
                job,
                "ended",
                gettext_noop("Ended: its node no longer has it, and a stop was asked."),
            )
            finish_locked(job, ended_by_stop_state(job), at=max(gone_at, job.started_at or gone_at))
            return "ended"
        lost_msgid = gettext_noop(
            "Node %(node)s no longer runs it, and its end was never received."
        )
        reason = lost_msgid % {"node": job.node.name}
        record_event(job, "lost", lost_msgid, params={"node": job.node.name})
        finish_locked(job, Job.State.LOST, at=gone_at, reason=reason)
        return "lost"
    # Dispatched, and the node has neither started it nor is starting it: the start was lost.
    sent = job.start_sent_at or job.dispatched_at or now
    if now - sent < timedelta(seconds=settings.LABPORTAL_START_ACK_S):
        return None
    if job.start_resends < settings.LABPORTAL_START_RETRIES:
        _start_resend(job, now=now)
        return "resent"
    if job.dispatch_count < settings.LABPORTAL_MAX_DISPATCHES:
        requeue_locked(
            job,
            message=gettext_noop("Back in the queue: node %(node)s never acknowledged its start."),
            params={"node": job.node.name},
            at=now,
        )
        return "requeued"
    reason = _(
        "It was sent to a node %(n)d times and never started; ask an admin to check the nodes."
    ) % {"n": job.dispatch_count}
    record_event(job, "start_failed", reason)
    finish_locked(job, Job.State.FAILED, at=now, reason=reason[:200])
    return "failed"


def _strays_stop(*, node_id: int, job_ids: frozenset[int]) -> list[int]:
    """Stop containers of jobs that are not this node's (a start that arrived after a requeue).

    Each is told once per stop grace (the cache remembers), not on every heartbeat.
    """
    node = Node.objects.get(pk=node_id)
    grace = SchedulingPolicy.current().stop_grace_s
    stopped = []
    for job_id in sorted(job_ids):
        if cache.add(f"labportal:stray-stop:{node_id}:{job_id}", 1, timeout=grace + 30):
            dispatch.send_stop(node=node, job_id=job_id, grace_s=grace, reason="not_on_node")
            stopped.append(job_id)
    return stopped


def _start_resend(job: Job, *, now: datetime) -> None:
    assert job.node is not None
    gpus = [a.gpu for a in job.allocations.filter(active=True).select_related("gpu__parent", "gpu")]
    job.start_resends += 1
    job.start_sent_at = now
    job.save(update_fields=["start_resends", "start_sent_at"])
    record_event(
        job,
        "start_resent",
        gettext_noop(
            "Node %(node)s has not acknowledged the start; sent it again (%(n)d of %(max)d)."
        ),
        params={
            "node": job.node.name,
            "n": job.start_resends,
            "max": settings.LABPORTAL_START_RETRIES,
        },
    )
    dispatch.send_start(node=job.node, spec=dispatch.start_spec(job, gpus))


# --- Stops that are not confirmed, and the last resort -------------------------------


def jobs_escalate_stops(*, now: datetime | None = None) -> dict[str, int]:
    """Re-send stops the node has not confirmed; after LABPORTAL_STOP_RETRIES, end the job here.

    A stop is due to be confirmed (by the job's `exited` event) the stop grace plus
    LABPORTAL_STOP_CONFIRM_S after it was sent. A job that has no node any more
    cannot be stopped at all and is ended at once.
    """
    now = now or timezone.now()
    policy = SchedulingPolicy.current()
    wait = timedelta(seconds=policy.stop_grace_s + settings.LABPORTAL_STOP_CONFIRM_S)
    resent = ended = 0
    asked = Job.objects.filter(state__in=Job.ACTIVE_STATES).filter(
        Q(stop_requested_at__isnull=False) | Q(node__isnull=True)
    )
    for job_id, node_id, asked_at, sent_at in asked.values_list(
        "id", "node_id", "stop_requested_at", "stop_sent_at"
    ):
        last = sent_at or asked_at
        if node_id is not None and last is not None and now - last < wait:
            continue
        try:
            if _stop_escalate(job_id=job_id, now=now, wait=wait):
                ended += 1
            else:
                resent += 1
        except Exception:  # one job's failure must not stop the others; the next beat retries
            logger.exception("could not escalate the stop of job %s", job_id)
    return {"stops_resent": resent, "ended_unconfirmed": ended}


@transaction.atomic
def _stop_escalate(*, job_id: int, now: datetime, wait: timedelta) -> bool:
    """One step for one job; True if it ended the job."""
    job = job_locked(job_id)
    if job.state not in Job.ACTIVE_STATES:
        return False
    if job.node is None:
        reason = gettext_noop("Its node was removed from the portal.")
        record_event(job, "lost", reason)
        finish_locked(job, Job.State.LOST, at=now, reason=reason)
        return True
    last = job.stop_sent_at or job.stop_requested_at
    if last is None or now - last < wait:
        return False  # confirmed or re-sent meanwhile
    if job.stop_resends < settings.LABPORTAL_STOP_RETRIES:
        job.stop_resends += 1
        job.stop_sent_at = now
        job.save(update_fields=["stop_resends", "stop_sent_at"])
        record_event(
            job,
            "stop_resent",
            gettext_noop(
                "Node %(node)s has not confirmed the stop; sent it again (%(n)d of %(max)d)."
            ),
            params={
                "node": job.node.name,
                "n": job.stop_resends,
                "max": settings.LABPORTAL_STOP_RETRIES,
            },
        )
        dispatch.send_stop(
            node=job.node,
            job_id=job.pk,
            grace_s=SchedulingPolicy.current().stop_grace_s,
            reason=job.end_reason or "cancelled",
        )
        return False
    if job.end_reason == "preempted":
        # The member did not ask for an end: the job keeps its place in the queue.
        requeue_locked(
            job, message=gettext_noop("Back in the queue: its node no longer has it."), at=now
        )
        return True
    force_end_locked(
        job,
        message=gettext_noop(
            "Ended by the portal: node %(node)s did not confirm the stop after %(n)d tries."
        ),
        params={"node": job.node.name, "n": job.stop_resends + 1},
        actor=None,
        now=now,
    )
    return True


@receiver(cluster_signals.node_reported_jobs, dispatch_uid="scheduling.reconcile")
def _reconcile_on_heartbeat(
    sender: Any,
    *,
    node_id: int,
    running_ids: frozenset[int],
    starting_ids: frozenset[int],
    now: datetime,
    **kwargs: Any,
) -> None:
    jobs_reconcile_with_node(
        node_id=node_id, running_ids=running_ids, starting_ids=starting_ids, now=now
    )


@receiver(cluster_signals.node_jobs_lost, dispatch_uid="scheduling.jobs_lost")
def _jobs_lost_with_node(sender: Any, *, node_id: int, reason: str, **kwargs: Any) -> int:
    return jobs_mark_lost_on_node(node_id=node_id, reason=reason)
