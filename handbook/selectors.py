"""The lab's rules as they are configured right now, for the rules page.

Every value comes from the live settings rows (queues, categories, booking rules, the
credit and scheduling policies). "Last changed" is the latest change an admin saved in
the admin panel (Django's admin log), the latest change to its values in the audit log
(django-auditlog: also those made through the API or a what-if replay), or the row's own
timestamp where it keeps one. Staff follow each section's date to the audit log.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal
from typing import Any

from auditlog.models import LogEntry as AuditLogEntry
from django.contrib.admin.models import LogEntry
from django.contrib.contenttypes.models import ContentType
from django.db.models import Max, Model

from accounts.models import Category, CreditPolicy
from core.audit_log import audit_log_url
from jobqueue.models import CategoryQueueAllowance, Queue, SchedulingPolicy
from reservations.models import BookingRule


@dataclass(frozen=True)
class CategoryRules:
    category: Category
    monthly_grant: Decimal
    booking: BookingRule
    changed: datetime | None


@dataclass(frozen=True)
class QueueRules:
    queue: Queue
    changed: datetime | None
    # The categories whose members have limits of their own in this queue.
    allowances: list[CategoryQueueAllowance] = field(default_factory=list)

    @property
    def max_hours(self) -> float:
        return self.queue.max_time_limit_s / 3600

    @property
    def default_hours(self) -> float:
        return self.queue.default_time_limit_s / 3600


@dataclass(frozen=True)
class LabRules:
    queues: list[QueueRules]
    categories: list[CategoryRules]
    credits: CreditPolicy
    credits_changed: datetime | None
    scheduling: SchedulingPolicy
    scheduling_changed: datetime | None
    last_changed: datetime | None = field(default=None)


@dataclass(frozen=True)
class RulesChangeLog:
    """For staff: the audit log of everything, and of the models behind each section."""

    everything: str
    queues: str
    categories: str
    credits: str
    scheduling: str


def rules_change_log() -> RulesChangeLog:
    return RulesChangeLog(
        everything=audit_log_url(),
        queues=audit_log_url(Queue, CategoryQueueAllowance),
        categories=audit_log_url(Category, BookingRule),
        credits=audit_log_url(CreditPolicy),
        scheduling=audit_log_url(SchedulingPolicy),
    )


def _admin_changes(objects: list[Model]) -> dict[tuple[int, str], datetime]:
    """The latest change of each object in the admin's log or the audit log (a change of
    its values: the row's creation by a migration or a seed is none), keyed by (content
    type id, pk as text)."""
    if not objects:
        return {}
    types = ContentType.objects.get_for_models(*{type(o) for o in objects})
    pks = {str(o.pk) for o in objects}
    admin_rows = (
        LogEntry.objects.filter(content_type__in=types.values(), object_id__in=pks)
        .values("content_type_id", "object_id")
        .annotate(latest=Max("action_time"))
    )
    latest = {(r["content_type_id"], r["object_id"]): r["latest"] for r in admin_rows}
    audit_rows = (
        AuditLogEntry.objects.filter(
            content_type__in=types.values(),
            object_pk__in=pks,
            action=AuditLogEntry.Action.UPDATE,
        )
        .values("content_type_id", "object_pk")
        .annotate(latest=Max("timestamp"))
    )
    for r in audit_rows:
        key = (r["content_type_id"], r["object_pk"])
        if key not in latest or r["latest"] > latest[key]:
            latest[key] = r["latest"]
    return latest


def _latest(*moments: datetime | None) -> datetime | None:
    known = [m for m in moments if m is not None]
    return max(known) if known else None


def lab_rules() -> LabRules:
    """Queues open for submissions, every category with its booking rules, and the policies."""
    queues = list(Queue.objects.filter(is_active=True).order_by("tier", "name"))
    categories = list(Category.objects.order_by("name"))
    bookings = {b.category_id: b for b in BookingRule.objects.filter(category__in=categories)}
    credits = CreditPolicy.current()
    scheduling = SchedulingPolicy.current()
    tracked: list[Model] = [*queues, *categories, *bookings.values(), credits, scheduling]
    changes = _admin_changes(tracked)
    type_ids = {
        model: ct.pk
        for model, ct in ContentType.objects.get_for_models(
            Queue, Category, BookingRule, CreditPolicy, SchedulingPolicy
        ).items()
    }

    def changed(obj: Model | None) -> datetime | None:
        if obj is None or obj.pk is None:
            return None
        return _latest(
            changes.get((type_ids[type(obj)], str(obj.pk))), getattr(obj, "updated_at", None)
        )

    category_rules = []
    for category in categories:
        booking = bookings.get(category.pk)
        category_rules.append(
            CategoryRules(
                category=category,
                monthly_grant=(credits.base_grant * category.credit_multiplier).quantize(
                    Decimal("1")
                ),
                booking=booking or BookingRule(category=category),
                changed=_latest(changed(category), changed(booking)),
            )
        )
    allowances: dict[int, list[CategoryQueueAllowance]] = {}
    for allowance in CategoryQueueAllowance.objects.filter(queue__in=queues).select_related(
        "category", "queue"
    ):
        allowances.setdefault(allowance.queue_id, []).append(allowance)
    queue_rules = [
        QueueRules(queue=q, changed=changed(q), allowances=allowances.get(q.pk, [])) for q in queues
    ]
    rules = LabRules(
        queues=queue_rules,
        categories=category_rules,
        credits=credits,
        credits_changed=changed(credits),
        scheduling=scheduling,
        scheduling_changed=changed(scheduling),
    )
    everything: list[Any] = [
        *(q.changed for q in queue_rules),
        *(c.changed for c in category_rules),
        rules.credits_changed,
        rules.scheduling_changed,
    ]
    return LabRules(**{**rules.__dict__, "last_changed": _latest(*everything)})


@dataclass(frozen=True)
class ChecklistItem:
    key: str
    done: bool


def onboarding_checklist(user: Any) -> list[ChecklistItem] | None:
    """A member's first steps, each ticked from what they did; None once put away or all done."""
    from accounts.models import PersonalAccessToken
    from handbook.models import OnboardingProgress
    from jobqueue.models import Job
    from reservations.models import Reservation

    progress = OnboardingProgress.objects.filter(user=user).first()
    if progress is not None and progress.dismissed_at is not None:
        return None
    # Only what the member did since joining: history recorded for them (jobs imported
    # from Slurm's past, a demo's seeded months) is not a step they took.
    joined = user.date_joined
    items = [
        ChecklistItem("rules", progress is not None and progress.rules_read_at is not None),
        ChecklistItem(
            "debug_job",
            Job.objects.filter(owner=user, queue__name="debug", submitted_at__gte=joined).exists(),
        ),
        ChecklistItem("booking", Reservation.objects.filter(user=user, start__gte=joined).exists()),
        ChecklistItem("api_token", PersonalAccessToken.objects.filter(user=user).exists()),
    ]
    return None if all(item.done for item in items) else items


@dataclass(frozen=True)
class TutorialStep:
    key: str
    done_at: datetime | None
    url: str

    @property
    def done(self) -> bool:
        return self.done_at is not None


def tutorial_steps(user: Any) -> list[TutorialStep]:
    """The guided tour's five steps, in order, each done from what the member did since
    joining: a job submitted, a job's page opened, a finished job's log read, a booking
    made, My credits opened; with the link that does each."""
    from django.urls import reverse

    from handbook.hello_gpu import hello_gpu_template
    from handbook.models import OnboardingProgress
    from jobqueue.models import Job
    from reservations.models import Reservation

    joined = user.date_joined
    progress = OnboardingProgress.objects.filter(user=user).first()
    jobs = Job.objects.filter(owner=user, submitted_at__gte=joined)
    first_job = jobs.order_by("submitted_at", "pk").values_list("submitted_at", flat=True).first()
    latest = jobs.order_by("-submitted_at", "-pk").values_list("pk", flat=True).first()
    finished = jobs.filter(state__in=Job.FINAL_STATES).order_by("-submitted_at", "-pk").first()
    booked = (
        Reservation.objects.filter(user=user, start__gte=joined)
        .order_by("created_at")
        .values_list("created_at", flat=True)
        .first()
    )
    template = hello_gpu_template()
    submit_url = reverse("job_submit") + (f"?template={template.pk}" if template else "")
    job_url = reverse("job_detail", args=[latest]) if latest else reverse("job_list")
    log_url = reverse("job_detail", args=[finished.pk]) + "#job-log-title" if finished else job_url

    def seen(field: str) -> datetime | None:
        return getattr(progress, field) if progress is not None else None

    return [
        TutorialStep("submit", first_job, submit_url),
        TutorialStep("watch", seen("job_page_viewed_at"), job_url),
        TutorialStep("logs", seen("job_log_read_at"), log_url),
        TutorialStep("booking", booked, reverse("reservation_calendar")),
        TutorialStep("credits", seen("credits_viewed_at"), reverse("credits")),
    ]
