"""Approvals: priority grants for the `high` queue and the emergency channel.

Members apply; only staff decide. Requests and decisions are never deleted: they
are the audit trail. Approved grants lapse at their deadline and approved
emergencies at `expires_at`; beat runs the expiry functions for the bookkeeping
and the notifications, while `is_in_force()` already stops honouring them on time.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from datetime import datetime, timedelta

from django.db import transaction
from django.db.models import Q, QuerySet
from django.urls import NoReverseMatch, reverse
from django.utils import timezone
from django.utils.translation import gettext as _
from django.utils.translation import ngettext

from accounts.models import CreditPolicy, Notification, User
from accounts.services import in_language_of, notify
from core.errors import DomainError, NotAllowed, StaffOnly
from core.moments import when_with_zone
from jobqueue.models import EmergencyRequest, Job, PriorityGrant, Queue

log = logging.getLogger(__name__)

MAX_GRANT_DAYS_AHEAD = 366


class ApprovalRefused(DomainError):
    code = "approval_refused"


class NoGrantQueue(ApprovalRefused):
    code = "no_grant_queue"


class InvalidGrantRequest(ApprovalRefused):
    code = "invalid_grant_request"


class DuplicateRequest(ApprovalRefused):
    code = "duplicate_request"
    status_code = 409


class AlreadyDecided(ApprovalRefused):
    code = "already_decided"
    status_code = 409


class InvalidEmergencyRequest(ApprovalRefused):
    code = "invalid_emergency_request"


class EmergencyLimitReached(ApprovalRefused):
    code = "emergency_limit_reached"
    status_code = 429


class EmergencyJobsFinished(ApprovalRefused):
    code = "emergency_jobs_finished"
    status_code = 409


def _url(name: str) -> str:
    try:
        return reverse(name)
    except NoReverseMatch:
        return ""


def _require_staff(user: User) -> None:
    if not user.is_staff:
        raise StaffOnly(_("Only lab admins (staff) can approve or reject requests."))


def _tell_staff(*, kind: str, title: Callable[[], str], body: str, dedupe_key: str) -> None:
    for admin in User.objects.filter(is_staff=True, is_active=True):
        with in_language_of(admin):
            notify(
                user=admin,
                kind=kind,
                title=title(),
                body=body,
                url=_url("approvals"),
                dedupe_key=dedupe_key,
            )


# --- Reads -------------------------------------------------------------------------


def grants_visible_to(user: User) -> QuerySet[PriorityGrant]:
    """Staff see every grant; members see their own."""
    qs = PriorityGrant.objects.select_related("user", "queue", "decided_by")
    return qs if user.is_staff else qs.filter(user=user)


def emergencies_visible_to(user: User) -> QuerySet[EmergencyRequest]:
    qs = EmergencyRequest.objects.select_related("user", "decided_by").prefetch_related("jobs")
    return qs if user.is_staff else qs.filter(user=user)


def grant_queues() -> QuerySet[Queue]:
    return Queue.objects.filter(requires_grant=True, is_active=True)


def emergency_jobs_eligible(user: User) -> QuerySet[Job]:
    """The member's jobs that an emergency can lift: those still waiting."""
    return Job.objects.filter(owner=user, state__in=Job.WAITING_STATES).select_related("queue")


def emergency_uses_in_period(user: User, *, now: datetime | None = None) -> int:
    """Approved emergencies (including expired ones) decided within the policy's period."""
    policy = CreditPolicy.current()
    since = (now or timezone.now()) - timedelta(days=policy.emergency_period_days)
    return EmergencyRequest.objects.filter(
        user=user,
        state__in=[EmergencyRequest.State.APPROVED, EmergencyRequest.State.EXPIRED],
        decided_at__gte=since,
    ).count()


def emergency_uses_left(user: User, *, now: datetime | None = None) -> int:
    policy = CreditPolicy.current()
    return max(0, policy.emergency_max_uses - emergency_uses_in_period(user, now=now))


# --- Priority grants ---------------------------------------------------------------


@transaction.atomic
def grant_apply(
    *,
    user: User,
    reason: str,
    deadline: datetime,
    gpus_expected: int,
    queue: Queue | None = None,
) -> PriorityGrant:
    """A member asks to use a grant-only queue (`high`) until `deadline`; staff are told."""
    user.lock_for_limits()
    queue = queue or grant_queues().order_by("tier").first()
    if queue is None or not queue.requires_grant:
        raise NoGrantQueue(
            _(
                "No queue needs a priority grant here, so there is nothing to apply for; submit to the normal queue."
            )
        )
    reason = (reason or "").strip()
    if len(reason) < 10:
        raise InvalidGrantRequest(
            _(
                "Say in a sentence why you need the %(queue)s queue (a paper deadline, a defence, …)."
            )
            % {"queue": queue.name}
        )
    now = timezone.now()
    if deadline <= now:
        raise InvalidGrantRequest(_("The deadline must be in the future."))
    if deadline > now + timedelta(days=MAX_GRANT_DAYS_AHEAD):
        raise InvalidGrantRequest(
            ngettext(
                "The deadline may be at most %(days)d day ahead; apply again later for a longer need.",
                "The deadline may be at most %(days)d days ahead; apply again later for a longer need.",
                MAX_GRANT_DAYS_AHEAD,
            )
            % {"days": MAX_GRANT_DAYS_AHEAD}
        )
    if gpus_expected < 1:
        raise InvalidGrantRequest(_("Say how many GPUs you expect to use: at least 1."))
    if PriorityGrant.objects.filter(
        user=user, queue=queue, state=PriorityGrant.State.PENDING
    ).exists():
        raise DuplicateRequest(
            _(
                "You already have a request for the %(queue)s queue awaiting a decision; withdraw it to apply again."
            )
            % {"queue": queue.name}
        )
    grant = PriorityGrant.objects.create(
        user=user, queue=queue, reason=reason, deadline=deadline, gpus_expected=gpus_expected
    )
    _tell_staff(
        kind="grant_requested",
        title=lambda: (
            _("%(user)s applies for the %(queue)s queue")
            % {"user": user.username, "queue": queue.name}
        ),
        body=reason,
        dedupe_key=f"grant:{grant.pk}:requested",
    )
    return grant


@transaction.atomic
def grant_decide(
    *, grant_id: int, decided_by: User, approve: bool, comment: str = ""
) -> PriorityGrant:
    """Staff approve or reject a pending grant, with an optional comment; the member is told."""
    _require_staff(decided_by)
    grant = (
        PriorityGrant.objects.select_for_update(of=("self",))
        .select_related("user", "queue")
        .get(pk=grant_id)
    )
    if grant.state != PriorityGrant.State.PENDING:
        raise AlreadyDecided(
            _("This request is already %(state)s; only pending requests can be decided.")
            % {"state": grant.get_state_display()}
        )
    now = timezone.now()
    if approve and grant.deadline <= now:
        raise AlreadyDecided(_("This request's deadline has passed, so it can only be rejected."))
    grant.state = PriorityGrant.State.APPROVED if approve else PriorityGrant.State.REJECTED
    grant.decided_by, grant.decided_at, grant.comment = decided_by, now, comment.strip()
    grant.save(update_fields=["state", "decided_by", "decided_at", "comment"])
    with in_language_of(grant.user):
        values = {"queue": grant.queue.name, "deadline": when_with_zone(grant.deadline)}
        _notify_grant_decision(grant, approve, values)
    return grant


def _notify_grant_decision(grant: PriorityGrant, approve: bool, values: dict[str, str]) -> None:
    if approve:
        title = _("Your priority grant for %(queue)s is approved") % values
        body = _("You may submit to the %(queue)s queue until %(deadline)s.") % values
    else:
        title = _("Your priority grant for %(queue)s was rejected") % values
        body = _("Your request to use the %(queue)s queue was not approved.") % values
    if grant.comment:
        body = f"{body}\n\n{_('Comment')}: {grant.comment}"
    notify(
        user=grant.user,
        kind="grant_approved" if approve else "grant_rejected",
        title=title,
        body=body,
        url=_url("grant_apply"),
        dedupe_key=f"grant:{grant.pk}:decided",
    )


@transaction.atomic
def grant_withdraw(*, grant_id: int, user: User) -> PriorityGrant:
    """A member withdraws their own pending or approved grant (it stays on record)."""
    grant = PriorityGrant.objects.select_for_update().get(pk=grant_id)
    if grant.user_id != user.pk:
        raise NotAllowed(_("You can only withdraw your own requests."))
    if grant.state not in (PriorityGrant.State.PENDING, PriorityGrant.State.APPROVED):
        raise AlreadyDecided(
            _("This request is already %(state)s.") % {"state": grant.get_state_display()}
        )
    grant.state = PriorityGrant.State.WITHDRAWN
    grant.save(update_fields=["state"])
    return grant


def grants_expire(*, now: datetime | None = None) -> int:
    """Close what the deadline ended: undecided requests are rejected, approved ones lapse (told once).

    Returns how many grants ended. Safe to run repeatedly.
    """
    now = now or timezone.now()
    ended = 0
    stale = PriorityGrant.objects.filter(state=PriorityGrant.State.PENDING, deadline__lte=now)
    for grant_id in list(stale.values_list("pk", flat=True)):
        with transaction.atomic():
            claimed = PriorityGrant.objects.filter(
                pk=grant_id, state=PriorityGrant.State.PENDING
            ).update(
                state=PriorityGrant.State.REJECTED,
                decided_at=now,
                comment=_("The deadline passed before a decision was made."),
            )
            if claimed:
                ended += 1
                grant = PriorityGrant.objects.select_related("user", "queue").get(pk=grant_id)
                with in_language_of(grant.user):
                    notify(
                        user=grant.user,
                        kind="grant_rejected",
                        title=_("Your request for %(queue)s ended undecided")
                        % {"queue": grant.queue.name},
                        body=_("Its deadline passed before an admin decided on it."),
                        url=_url("grant_apply"),
                        dedupe_key=f"grant:{grant.pk}:decided",
                    )
    # Only recent lapses: older ones were announced by earlier runs.
    lapsed = PriorityGrant.objects.filter(
        state=PriorityGrant.State.APPROVED, deadline__lte=now, deadline__gt=now - timedelta(days=7)
    ).select_related("user", "queue")
    for grant in lapsed:
        key = f"grant:{grant.pk}:lapsed"
        if Notification.objects.filter(user=grant.user, dedupe_key=key).exists():
            continue
        ended += 1
        with in_language_of(grant.user):
            notify(
                user=grant.user,
                kind="grant_lapsed",
                title=_("Your priority grant for %(queue)s has lapsed")
                % {"queue": grant.queue.name},
                body=_(
                    "Its deadline has passed; new jobs go to the other queues. Apply again if you need more time."
                ),
                url=_url("grant_apply"),
                dedupe_key=key,
            )
    return ended


# --- The emergency channel ----------------------------------------------------------


@transaction.atomic
def emergency_request_create(
    *, user: User, job_ids: Iterable[int], reason: str, hours: int | None = None
) -> EmergencyRequest:
    """A member asks for top priority for named waiting jobs of their own; staff are told."""
    policy = CreditPolicy.current()
    hours = policy.emergency_default_hours if hours is None else hours
    if not 1 <= hours <= policy.emergency_max_hours:
        raise InvalidEmergencyRequest(
            ngettext(
                "Ask for between 1 and %(max)d hour of top priority.",
                "Ask for between 1 and %(max)d hours of top priority.",
                policy.emergency_max_hours,
            )
            % {"max": policy.emergency_max_hours}
        )
    reason = (reason or "").strip()
    if len(reason) < 10:
        raise InvalidEmergencyRequest(_("Say in a sentence what the emergency is."))
    wanted = sorted(set(job_ids))
    if not wanted:
        raise InvalidEmergencyRequest(_("Name at least one of your waiting jobs."))
    jobs = list(emergency_jobs_eligible(user).filter(pk__in=wanted))
    missing = sorted(set(wanted) - {job.pk for job in jobs})
    if missing:
        raise InvalidEmergencyRequest(
            _("Jobs %(ids)s are not waiting jobs of yours; name only your pending or held jobs.")
            % {"ids": ", ".join(f"#{i}" for i in missing)}
        )
    user.lock_for_limits()
    if emergency_uses_left(user) <= 0:
        raise EmergencyLimitReached(
            ngettext(
                "You have used your %(max)d emergency of the last %(days)d days; ask an admin directly.",
                "You have used all %(max)d emergencies of the last %(days)d days; ask an admin directly.",
                policy.emergency_max_uses,
            )
            % {"max": policy.emergency_max_uses, "days": policy.emergency_period_days}
        )
    if EmergencyRequest.objects.filter(user=user, state=EmergencyRequest.State.PENDING).exists():
        raise DuplicateRequest(_("You already have an emergency request awaiting a decision."))
    request = EmergencyRequest.objects.create(user=user, reason=reason, hours=hours)
    request.jobs.set(jobs)
    _tell_staff(
        kind="emergency_requested",
        title=lambda: _("%(user)s asks for an emergency") % {"user": user.username},
        body=reason,
        dedupe_key=f"emergency:{request.pk}:requested",
    )
    return request


@transaction.atomic
def emergency_decide(
    *,
    request_id: int,
    decided_by: User,
    approve: bool,
    comment: str = "",
    now: datetime | None = None,
) -> EmergencyRequest:
    """Staff approve (top priority until now + hours) or reject a pending emergency; the member is told."""
    _require_staff(decided_by)
    request = (
        EmergencyRequest.objects.select_for_update(of=("self",))
        .select_related("user")
        .get(pk=request_id)
    )
    if request.state != EmergencyRequest.State.PENDING:
        raise AlreadyDecided(
            _("This request is already %(state)s; only pending requests can be decided.")
            % {"state": request.get_state_display()}
        )
    now = now or timezone.now()
    if approve and not request.jobs.exclude(state__in=Job.FINAL_STATES).exists():
        raise EmergencyJobsFinished(
            _(
                "Every job of this request has already ended, so top priority would change nothing; reject it instead. It would not count against the member's emergencies."
            )
        )
    if approve and emergency_uses_left(request.user, now=now) <= 0:
        raise EmergencyLimitReached(
            _(
                "%(user)s has no emergencies left in this period; reject it, or raise the limit in the credit policy."
            )
            % {"user": request.user.username}
        )
    request.state = EmergencyRequest.State.APPROVED if approve else EmergencyRequest.State.REJECTED
    request.decided_by, request.decided_at, request.comment = decided_by, now, comment.strip()
    if approve:
        request.expires_at = now + timedelta(hours=request.hours)
    request.save(update_fields=["state", "decided_by", "decided_at", "comment", "expires_at"])
    if approve:
        transaction.on_commit(_request_scheduling_pass)
    with in_language_of(request.user):
        _notify_emergency_decision(request, approve)
    return request


def _notify_emergency_decision(request: EmergencyRequest, approve: bool) -> None:
    ids = ", ".join(f"#{pk}" for pk in request.jobs.order_by("pk").values_list("pk", flat=True))
    if approve:
        assert request.expires_at is not None
        until = when_with_zone(request.expires_at)
        title = _("Your emergency request is approved")
        body = _("Jobs %(ids)s have top priority until %(until)s.") % {"ids": ids, "until": until}
    else:
        title = _("Your emergency request was rejected")
        body = _("Jobs %(ids)s keep their normal priority.") % {"ids": ids}
    if request.comment:
        body = f"{body}\n\n{_('Comment')}: {request.comment}"
    notify(
        user=request.user,
        kind="emergency_approved" if approve else "emergency_rejected",
        title=title,
        body=body,
        url=_url("emergency_apply"),
        dedupe_key=f"emergency:{request.pk}:decided",
    )


def _request_scheduling_pass() -> None:
    from jobqueue.services import request_scheduling_pass

    request_scheduling_pass()


def emergencies_expire(*, now: datetime | None = None) -> int:
    """Mark approved emergencies past `expires_at` as expired; returns how many. Safe to repeat."""
    now = now or timezone.now()
    return EmergencyRequest.objects.filter(
        Q(state=EmergencyRequest.State.APPROVED) & Q(expires_at__lte=now)
    ).update(state=EmergencyRequest.State.EXPIRED)
