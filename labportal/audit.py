"""The audit log of the lab's rules (django-auditlog): which models are logged, which of
their fields, and who made each change. docs/manual/en/admin-rules.md, "Who changed what".

The log holds people's changes, not the portal's own churn:
- fields the portal updates by itself (heartbeats, telemetry, timestamps) are left out;
- the first row of a one-row policy is not a change: `current()` makes it with the
  code's defaults for whoever reads it first;
- a member's own job template is theirs, not a rule: only lab-wide ones are logged;
- nodes and GPUs are logged only when a person changes them: their agents register and
  re-register them with no one signed in.
Changes made by the control worker or a management command are logged with no actor,
which the log shows as the portal's.
"""

from __future__ import annotations

from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from auditlog.middleware import AuditlogMiddleware
from auditlog.models import LogEntry
from auditlog.registry import auditlog
from auditlog.signals import pre_log
from django.db.models import Model
from django.http import HttpRequest, HttpResponse
from django.utils.functional import SimpleLazyObject

from accounts.models import Category, CreditPolicy, Project, User
from alerts.models import AlertRule, QueueAlertPolicy
from cluster.models import Gpu, Node
from jobqueue.models import (
    CategoryQueueAllowance,
    ContainerImage,
    EmergencyRequest,
    JobTemplate,
    PriorityGrant,
    Queue,
    SchedulingPolicy,
    VolumeMount,
)
from reports.models import LabProfile
from reservations.models import BookingRule
from slurm.models import QueueMapping, UnixLogin
from telemetry.models import RetentionPolicy


@dataclass(frozen=True)
class Audited:
    model: type[Model]
    include: tuple[str, ...] = ()  # only these fields; empty: every field but `exclude`
    exclude: tuple[str, ...] = ()


AUDITED: tuple[Audited, ...] = (
    # The rules page's settings.
    Audited(Queue),
    Audited(CategoryQueueAllowance),
    Audited(Category),
    Audited(BookingRule),
    Audited(CreditPolicy, exclude=("updated_at",)),
    Audited(SchedulingPolicy),
    # What members may run, and the lab-wide starting points.
    Audited(ContainerImage),
    Audited(VolumeMount),
    Audited(JobTemplate, exclude=("created_at", "updated_at")),
    # Alerts, and how long telemetry is kept.
    Audited(AlertRule),
    Audited(QueueAlertPolicy),
    Audited(RetentionPolicy),
    # Decisions on members' requests: the request as made, then state, decided_by, comment.
    Audited(PriorityGrant, exclude=("created_at",)),
    Audited(EmergencyRequest, exclude=("created_at",)),
    # Slurm mode: where a queue's jobs go, and which unix user a member's jobs run as.
    Audited(QueueMapping),
    Audited(UnixLogin),
    # Projects jobs are charged to, and the lab's profile the usage report opens with.
    Audited(Project),
    Audited(LabProfile),
    # The admin's fields of the machines; the agent reports the rest.
    Audited(
        Node,
        include=("name", "address", "labels", "drain_requested", "purchased_on", "funded_by"),
    ),
    Audited(Gpu, include=("shared_slots", "state")),
)

ONE_ROW_POLICIES: tuple[type[Model], ...] = (CreditPolicy, SchedulingPolicy, RetentionPolicy)
MACHINES: tuple[type[Model], ...] = (Node, Gpu)

# The request being served, for `person_acting` (auditlog's own context outlives it).
_serving: ContextVar[HttpRequest | None] = ContextVar("labportal_audit_request", default=None)


def audited_models_register() -> None:
    """Register AUDITED with auditlog and its filter of the portal's own changes (at start-up)."""
    for item in AUDITED:
        if not auditlog.contains(item.model):
            auditlog.register(
                item.model, include_fields=list(item.include), exclude_fields=list(item.exclude)
            )
    pre_log.connect(_leave_out_the_portals_own, dispatch_uid="labportal.audit")


def person_acting() -> User | None:
    """The signed-in member or admin whose request is being served, if any."""
    request = _serving.get()
    user = getattr(request, "user", None)
    return user if isinstance(user, User) and user.is_authenticated else None


def _leave_out_the_portals_own(
    sender: type[Model], instance: Model, action: int, **_: Any
) -> bool | None:
    """False, and auditlog writes no entry, for a change that is no person's (module docstring)."""
    if sender in ONE_ROW_POLICIES and action == LogEntry.Action.CREATE:
        return False
    if isinstance(instance, JobTemplate) and instance.owner_id is not None:
        return False
    if sender in MACHINES and person_acting() is None:
        return False
    return None


class AuditActorMiddleware(AuditlogMiddleware):
    """auditlog's middleware, with the actor read when an entry is written rather than when
    the request comes in: an API request's user is known only once DRF has checked its
    token, inside the view (DRF then sets it on the request)."""

    @staticmethod
    def _get_actor(request: HttpRequest) -> Any:
        return SimpleLazyObject(lambda: getattr(request, "user", None))

    def __call__(self, request: HttpRequest) -> HttpResponse:
        token = _serving.set(request)
        try:
            response: HttpResponse = super().__call__(request)
            return response
        finally:
            _serving.reset(token)
