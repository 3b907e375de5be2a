"""A job's life after its submit: cancel, hold and release, stop, requeue, finish, force
end, and the time limits (warn, don't kill). Submitting is jobqueue/submit.py; the audit
trail jobqueue/events.py; what the agents report scheduling/agent_events.py.

Every transition runs in a transaction, goes through ``Job.move_to`` (the lifecycle's
one table), writes a JobEvent and is idempotent against a report that comes twice.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from datetime import datetime, timedelta
from functools import partial
from typing import Any

from django.db import transaction
from django.utils import timezone
from django.utils.translation import gettext as _
from django.utils.translation import gettext_noop

from accounts import services as account_services
from accounts.models import User
from core.durations import hours_minutes, lazy_hours_minutes
from core.errors import StaffOnly
from core.i18n import lazy_text
from jobqueue import executor
from jobqueue.dependencies import DEPENDENCY_FAILED
from jobqueue.errors import (
    InvalidTransition,
    JobRefused,
    NotJobOwner,
)
from jobqueue.events import record_event, record_events
from jobqueue.models import (
    Allocation,
    Job,
    SchedulingPolicy,
    command_text,
)
from jobqueue.signals import job_ended, run_requeued

logger = logging.getLogger(__name__)

LOG_TAIL_CHARS = 64_000


# --- Scheduling triggers ----------------------------------------------------


def request_scheduling_pass() -> None:
    """Ask for a scheduling pass after this transaction commits; requests coalesce.

    Where the executor schedules itself (Slurm), the portal runs no pass.
    """
    executor.current().wake()


# --- Cancel, stop, requeue ---------------------------------------------------


def job_locked(job_id: int) -> Job:
    return (
        Job.objects.select_for_update(of=("self",))
        .select_related("node", "owner", "queue")
        .get(pk=job_id)
    )


@transaction.atomic
def job_cancel(*, job_id: int, actor: User) -> Job:
    """Cancel a job: at once if it waits; a running one is stopped (SIGTERM, grace, SIGKILL)."""
    job = job_locked(job_id)
    if job.owner_id != actor.pk and not actor.is_staff:
        raise NotJobOwner(_("Only the job's owner or an admin can cancel it."))
    if job.is_final:
        raise InvalidTransition(
            _("Job %(id)d has already ended (%(state)s).")
            % {"id": job.pk, "state": job.get_state_display()}
        )
    executor.current().job_cancel(job, actor=actor)
    return job


def cancel_on_agents(job: Job, *, actor: User) -> None:
    """Agents mode: a waiting job ends at once; a running one is stopped (SIGTERM, grace, SIGKILL)."""
    if job.state in Job.WAITING_STATES:
        job.move_to(Job.State.CANCELLED)
        job.ended_at = timezone.now()
        job.end_reason = "cancelled"
        job.queue_position = None
        job.estimated_start = None
        job.save(
            update_fields=["state", "ended_at", "end_reason", "queue_position", "estimated_start"]
        )
        record_event(job, "cancelled", gettext_noop("Cancelled before it started."), actor=actor)
        request_scheduling_pass()
        return
    stop_request_locked(
        job,
        reason="cancelled",
        message=gettext_noop("Cancel requested; stopping the container."),
        actor=actor,
    )


def cancel_many_on_agents(jobs: list[Job], *, actor: User) -> None:
    """Agents mode, for many jobs at once (a whole array), each as ``cancel_on_agents``
    cancels it: the waiting ones end together in a constant number of statements (one
    UPDATE, one read of their latest events, one INSERT of their events, one pass
    request), whatever their number; each running one is stopped on its own."""
    waiting = [job for job in jobs if job.state in Job.WAITING_STATES]
    for job in jobs:
        if job.state not in Job.WAITING_STATES:
            cancel_on_agents(job_locked(job.pk), actor=actor)
    if not waiting:
        return
    now = timezone.now()
    for job in waiting:
        job.move_to(Job.State.CANCELLED)
        job.ended_at, job.end_reason = now, "cancelled"
        job.queue_position = job.estimated_start = None
    Job.objects.filter(pk__in=[job.pk for job in waiting]).update(
        state=Job.State.CANCELLED,
        ended_at=now,
        end_reason="cancelled",
        queue_position=None,
        estimated_start=None,
    )
    record_events(waiting, "cancelled", gettext_noop("Cancelled before it started."), actor=actor)
    request_scheduling_pass()


def _refuse_in_slurm_mode() -> None:
    if not executor.portal_schedules():
        raise InvalidTransition(
            _(
                "Slurm schedules the jobs here: hold or release a job in Slurm (scontrol hold / scontrol release)."
            )
        )


@transaction.atomic
def job_hold(*, job_id: int, actor: User, reason: str) -> Job:
    """An admin keeps a waiting job from starting (it stays in its queue) until released."""
    _refuse_in_slurm_mode()
    job = job_locked(job_id)
    if job.state != Job.State.PENDING:
        raise InvalidTransition(
            _("Only a pending job can be held; job %(id)d is %(state)s.")
            % {"id": job.pk, "state": job.get_state_display()}
        )
    if not reason.strip():
        raise JobRefused(_("Say why the job is held; its owner reads the reason."))
    job.move_to(Job.State.HELD)
    job.hold_reason = reason.strip()[:200]
    job.save(update_fields=["state", "hold_reason"])
    record_event(
        job,
        "held",
        gettext_noop("Held by a lab admin: %(reason)s"),
        params={"reason": job.hold_reason},
        actor=actor,
    )
    request_scheduling_pass()
    return job


@transaction.atomic
def job_release(*, job_id: int, actor: User) -> Job:
    """Let a held job compete for GPUs again, with its original place (submit time)."""
    _refuse_in_slurm_mode()
    job = job_locked(job_id)
    if job.state != Job.State.HELD:
        raise InvalidTransition(
            _("Only a held job can be released; job %(id)d is %(state)s.")
            % {"id": job.pk, "state": job.get_state_display()}
        )
    job.move_to(Job.State.PENDING)
    job.hold_reason = ""
    job.save(update_fields=["state", "hold_reason"])
    record_event(job, "released", gettext_noop("Released by a lab admin."), actor=actor)
    request_scheduling_pass()
    return job


@transaction.atomic
def job_request_stop(*, job_id: int, reason: str, actor: User | None = None) -> Job:
    """Stop a running job (SIGTERM, grace, SIGKILL); `reason` is recorded as its end reason."""
    job = job_locked(job_id)
    if job.state not in Job.ACTIVE_STATES:
        return job
    stop_request_locked(
        job,
        reason=reason,
        message=gettext_noop("Stop requested: %(reason)s."),
        params={"reason": reason},
        actor=actor,
    )
    return job


def stop_request_locked(
    job: Job,
    *,
    reason: str,
    message: str,
    actor: User | None,
    params: Mapping[str, Any] | None = None,
) -> None:
    if job.stop_requested_at is None:
        job.stop_requested_at = timezone.now()
        job.end_reason = reason
        job.save(update_fields=["stop_requested_at", "end_reason"])
        record_event(
            job, "stop_requested", message, params=params, actor=actor, data={"reason": reason}
        )
    grace = SchedulingPolicy.current().stop_grace_s
    executor.current().job_stop(job, grace_s=grace, reason=reason)


@transaction.atomic
def job_requeue(*, job_id: int, reason: str, actor: User | None = None) -> Job:
    """Put a preempted or lost-in-dispatch job back in its queue with its original submit time."""
    job = job_locked(job_id)
    if job.state not in Job.ACTIVE_STATES:
        raise InvalidTransition(_("Only a running job can be requeued."))
    requeue_locked(
        job,
        message=gettext_noop("Back in the queue: %(reason)s."),
        params={"reason": reason},
        actor=actor,
    )
    return job


def requeue_locked(
    job: Job,
    *,
    message: str,
    params: Mapping[str, Any] | None = None,
    at: datetime | None = None,
    actor: User | None = None,
) -> None:
    """Back to pending with its original submit time; everything about the last run is cleared.
    `message` is an untranslated msgid (see `record_event`)."""
    if job.started_at is not None:
        run_requeued.send(
            sender=Job,
            job=job,
            started_at=job.started_at,
            stop_requested_at=job.stop_requested_at,
            preempted=job.end_reason == "preempted",
        )
    if job.end_reason == "preempted":
        job.preemption_count += 1
    allocations_release(job, at)
    job.move_to(Job.State.PENDING)
    job.node = None
    job.started_at = job.dispatched_at = job.stop_requested_at = None
    job.container_id = ""
    job.end_reason = ""
    job.start_sent_at = job.stop_sent_at = job.unreported_since = None
    job.start_resends = job.stop_resends = 0
    job.save()
    record_event(job, "requeued", message, params=params, actor=actor, at=at)
    request_scheduling_pass()


def allocations_release(job: Job, at: datetime | None = None) -> None:
    Allocation.objects.filter(job=job, active=True).update(
        active=False, released_at=at or timezone.now()
    )


def finish_locked(
    job: Job, state: str, *, at: datetime, exit_code: int | None = None, reason: str = ""
) -> None:
    job.move_to(state)
    job.ended_at = at
    job.exit_code = exit_code
    if reason:
        job.end_reason = reason
    allocations_release(job, at)
    job.save()
    request_scheduling_pass()
    _after_final(job)
    _notify_job_end(job)


@transaction.atomic
def jobs_cancel_for_failed_dependency(
    failed: Mapping[int, int], *, at: datetime | None = None
) -> list[int]:
    """Cancel waiting jobs whose afterok dependency can never be met, as
    {job id: the dependency that ended without completing (or a job cancelled for one)}:
    end reason ``dependency_failed``, an event, and a notification to the owner.

    Slurm would keep such a job pending (DependencyNeverSatisfied) unless told
    ``--kill-on-invalid-dep``; a lab wants the GPUs' queue clean and the member told, so
    LabPortal cancels it. Called by the scheduling pass, which finds these jobs."""
    at = at or timezone.now()
    cancelled: list[int] = []
    for job_id, dependency_id in sorted(failed.items()):
        job = job_locked(job_id)
        if job.state not in Job.WAITING_STATES:
            continue
        job.queue_position = None
        job.estimated_start = None
        finish_locked(job, Job.State.CANCELLED, at=at, reason=DEPENDENCY_FAILED)
        params = {"id": job.pk, "dependency": dependency_id}
        record_event(job, "cancelled", _DEPENDENCY_FAILED_BODY, params=params, at=at)
        cancelled.append(job.pk)
        if job.owner.notify_job_end:
            transaction.on_commit(
                partial(
                    account_services.notify,
                    user=job.owner,
                    kind="job_cancelled",
                    title=lazy_text(_DEPENDENCY_FAILED_TITLE, **params),
                    body=lazy_text(_DEPENDENCY_FAILED_BODY, **params),
                    url=f"/jobs/{job.pk}/",
                    dedupe_key=f"job-end:{job.pk}:{job.dispatch_count}",
                ),
                robust=True,
            )
    return cancelled


_DEPENDENCY_FAILED_TITLE = gettext_noop("Job #%(id)s was cancelled: its dependency failed")
_DEPENDENCY_FAILED_BODY = gettext_noop(
    "Job #%(id)s was cancelled without starting: job #%(dependency)s, which it waited for (afterok), ended without completing."
)


# The end states a member waits for; a cancel is their own (or an admin's) doing.
_NOTIFIED_END_STATES = {
    Job.State.COMPLETED: (
        gettext_noop("Job #%(id)s completed"),
        gettext_noop("Job #%(id)s (%(name)s) completed after %(duration)s."),
    ),
    Job.State.FAILED: (
        gettext_noop("Job #%(id)s failed"),
        gettext_noop("Job #%(id)s (%(name)s) failed after %(duration)s: %(reason)s"),
    ),
    Job.State.TIMED_OUT: (
        gettext_noop("Job #%(id)s was stopped at its time limit"),
        gettext_noop(
            "Job #%(id)s (%(name)s) ran for %(duration)s and was stopped at its time limit."
        ),
    ),
    Job.State.LOST: (
        gettext_noop("Job #%(id)s was lost"),
        gettext_noop("Job #%(id)s (%(name)s) was lost with its node; its credits are refunded."),
    ),
}


def _notify_job_end(job: Job) -> None:
    """Tell the owner their job ended, unless they turned it off (`User.notify_job_end`).

    The notification is written after the end's commit, behind the scheduling pass and the
    credit settle that the end asked for (they run in that order): the freed GPUs get their
    next jobs without waiting for it. It runs even if the pass or the settle failed.
    """
    texts = _NOTIFIED_END_STATES.get(Job.State(job.state))
    if texts is None or not job.owner.notify_job_end:
        return
    title, body = texts
    if job.exit_code is not None:
        reason = lazy_text(gettext_noop("exit code %(code)s"), code=job.exit_code)
    else:
        reason = job.end_reason or "?"
    params = {
        "id": job.pk,
        "name": job.name or command_text(job.command)[:60],
        "duration": lazy_hours_minutes(job.duration() or timedelta(0)),
        "reason": reason,
    }
    transaction.on_commit(
        partial(
            account_services.notify,
            user=job.owner,
            kind=f"job_{job.state}",
            title=lazy_text(title, **params),
            body=lazy_text(body, **params),
            url=f"/jobs/{job.pk}/",
            dedupe_key=f"job-end:{job.pk}:{job.dispatch_count}",
        ),
        robust=True,
    )


def _after_final(job: Job) -> None:
    """Tell the apps above (credits settle after the commit) that the job ended.

    Sent after the end's pass request, so a pass run inline (see ``passes_inline``)
    dispatches the next jobs first.
    """
    job_ended.send(sender=Job, job=job)


@transaction.atomic
def job_force_end(*, job_id: int, actor: User) -> Job:
    """An admin's last resort: end an active job in the portal now, whatever its node says.

    Its GPUs are freed and the node is told (again) to stop the container; the
    heartbeat reconcile keeps telling it while the container still runs.
    """
    if not actor.is_staff:
        raise StaffOnly(_("Only an admin can force a job to end."))
    job = job_locked(job_id)
    if job.is_final:
        raise InvalidTransition(
            _("Job %(id)d has already ended (%(state)s).")
            % {"id": job.pk, "state": job.get_state_display()}
        )
    force_end_locked(
        job,
        message=gettext_noop("Ended by %(admin)s (force end)."),
        params={"admin": actor.get_username()},
        actor=actor,
        now=timezone.now(),
    )
    return job


def ended_by_stop_state(job: Job) -> str:
    """The final state of a job ended without its exit: what its stop request asked for."""
    return Job.State.TIMED_OUT if job.end_reason == "timed_out" else Job.State.CANCELLED


def force_end_locked(
    job: Job,
    *,
    message: str,
    actor: User | None,
    now: datetime,
    params: Mapping[str, Any] | None = None,
) -> None:
    state: str = Job.State.CANCELLED
    at = now
    if job.state in Job.ACTIVE_STATES and job.stop_requested_at is not None:
        state = ended_by_stop_state(job)
        # Charged as if the stop had worked: up to its SIGKILL, not to this moment.
        grace = timedelta(seconds=SchedulingPolicy.current().stop_grace_s)
        at = min(now, job.stop_requested_at + grace)
    if job.started_at is not None:
        at = max(at, job.started_at)
    if not job.end_reason:
        job.end_reason = "cancelled"
    record_event(job, "force_ended", message, params=params, actor=actor)
    if job.node is not None and job.state in Job.ACTIVE_STATES:
        executor.current().job_stop(
            job, grace_s=SchedulingPolicy.current().stop_grace_s, reason=job.end_reason
        )
    finish_locked(job, state, at=at)


# --- Time limits ---------------------------------------------------------------


def jobs_enforce_time_limits(*, now: datetime | None = None) -> dict[str, int]:
    """Warn at the soft limit (the time limit); stop at the hard limit (limit + admin's grace)."""
    now = now or timezone.now()
    policy = SchedulingPolicy.current()
    warned = stopped = 0
    running = Job.objects.filter(state=Job.State.RUNNING, started_at__isnull=False)
    for job in running.select_related("owner", "node").only(
        "id",
        "owner",
        "node",
        "started_at",
        "time_limit_s",
        "soft_warned_at",
        "stop_requested_at",
        "name",
        "command",
    ):
        assert job.started_at is not None
        limit_at = job.started_at + timedelta(seconds=job.time_limit_s)
        # Claimed with a conditional update, so a repeated beat warns once.
        if (
            now >= limit_at
            and job.soft_warned_at is None
            and Job.objects.filter(pk=job.pk, soft_warned_at__isnull=True).update(
                soft_warned_at=now
            )
        ):
            warned += 1
            _warn_soft_limit(job, policy)
        if (
            policy.hard_limit_grace_s is not None
            and now >= limit_at + timedelta(seconds=policy.hard_limit_grace_s)
            and job.stop_requested_at is None
        ):
            job_request_stop(job_id=job.pk, reason="timed_out")
            stopped += 1
    return {"warned": warned, "stopped": stopped}


def _warn_soft_limit(job: Job, policy: SchedulingPolicy) -> None:
    if policy.hard_limit_grace_s is None:
        body = gettext_noop(
            "Job #%(id)s reached its time limit. It keeps running; the lab's policy does not stop it."
        )
        params: dict[str, Any] = {"id": job.pk}
    else:
        body = gettext_noop(
            "Job #%(id)s reached its time limit. It will be stopped in %(grace)s unless it ends first; save your work."
        )
        params = {"id": job.pk, "grace": hours_minutes(policy.hard_limit_grace_s)}
    record_event(job, "soft_limit", body, params=params)
    notify_user(
        job.owner,
        kind="soft_limit",
        title=lazy_text(gettext_noop("Job #%(id)s reached its time limit"), id=job.pk),
        body=lazy_text(
            body,
            **{**params, "grace": lazy_hours_minutes(policy.hard_limit_grace_s or 0)},
        ),
        url=f"/jobs/{job.pk}/",
    )


def notify_user(user: User, *, kind: str, title: Any, body: Any, url: str = "") -> None:
    """In the app and by email."""
    account_services.notify(user=user, kind=kind, title=title, body=body, url=url)
