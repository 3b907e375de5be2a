"""A job's audit trail: every step of its life is a JobEvent, in the order the steps
happened (the member reads it on the job's page)."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any, TypedDict, Unpack

from django.db import connection
from django.db.models import Max
from django.utils import timezone

from accounts.models import User
from jobqueue.models import (
    Job,
    JobEvent,
)

FIRST_STEP = min(JobEvent.STEPS.values())


class EventFields(TypedDict, total=False):
    """An event's optional fields (``record_event``, ``event_for``)."""

    params: Mapping[str, Any] | None
    data: Mapping[str, Any] | None
    actor: User | None
    event_id: str | None
    at: datetime | None


def record_event(job: Job, kind: str, message: str = "", **fields: Unpack[EventFields]) -> JobEvent:
    """Record a job event. `message` is an untranslated msgid (gettext_noop) formatted with
    `params`: stored in English, shown in each reader's language. An event is never dated
    before an event of an earlier step (an agent's clock may lag the portal's)."""
    event = event_for(job, kind, message, **fields)
    step, when = event.step, event.created_at
    if step > FIRST_STEP and connection.vendor == "postgresql":
        _insert_after_earlier_steps(event)
        return event
    if step > FIRST_STEP:  # nothing comes before a submit: no need to ask
        floor = job.events.filter(step__lt=step).aggregate(latest=Max("created_at"))["latest"]
        if floor is not None and floor > when:
            event.created_at = floor
    event.save(force_insert=True)
    return event


def record_events(
    jobs: list[Job], kind: str, message: str = "", **fields: Unpack[EventFields]
) -> list[JobEvent]:
    """``record_event`` for many jobs at once (the same event for each), in two statements
    whatever their number: one read of each job's latest event of an earlier step, one
    INSERT, each event dated no earlier than that."""
    events = [event_for(job, kind, message, **fields) for job in jobs]
    if not events:
        return events
    step = events[0].step
    floors = dict(
        JobEvent.objects.filter(job_id__in=[job.pk for job in jobs], step__lt=step)
        .values("job_id")
        .annotate(latest=Max("created_at"))
        .values_list("job_id", "latest")
    )
    for event in events:
        floor = floors.get(event.job_id)
        if floor is not None and floor > event.created_at:
            event.created_at = floor
    return JobEvent.objects.bulk_create(events)


def event_for(
    job: Job,
    kind: str,
    message: str = "",
    *,
    params: Mapping[str, Any] | None = None,
    data: Mapping[str, Any] | None = None,
    actor: User | None = None,
    event_id: str | None = None,
    at: datetime | None = None,
) -> JobEvent:
    """The event ``record_event`` records, not saved (a submit's first events, saved in bulk)."""
    stored = dict(data or {})
    if message:
        stored["msgid"] = message
        if params:
            stored["params"] = {k: _plain(v) for k, v in params.items()}
    return JobEvent(
        job=job,
        kind=kind,
        message=(message % params) if params else message,
        data=stored,
        actor=actor,
        event_id=event_id,
        step=JobEvent.STEPS.get(kind, 30),
        created_at=at or timezone.now(),
    )


def _insert_after_earlier_steps(event: JobEvent) -> None:
    """Insert `event`, dated no earlier than the job's events of earlier steps, in one round trip.

    The same rule as the two-query form below (read the floor, then insert), with the
    floor read by the INSERT itself (PostgreSQL's GREATEST ignores a NULL: no earlier event).
    """
    meta = JobEvent._meta
    fields = {f.attname: f for f in meta.concrete_fields}
    columns = ["job_id", "kind", "message", "step", "data", "event_id", "actor_id"]
    values = [fields[name].get_db_prep_save(getattr(event, name), connection) for name in columns]
    when = fields["created_at"].get_db_prep_save(event.created_at, connection)
    table = connection.ops.quote_name(meta.db_table)
    sql = (
        f"INSERT INTO {table} ({', '.join(columns)}, created_at) "
        f"VALUES ({', '.join(['%s'] * len(columns))}, GREATEST(%s, "
        f"(SELECT MAX(created_at) FROM {table} WHERE job_id = %s AND step < %s))) "
        "RETURNING id, created_at"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, [*values, when, event.job_id, event.step])
        event.pk, event.created_at = cursor.fetchone()
    event._state.adding = False
    event._state.db = connection.alias


def _plain(value: Any) -> Any:
    return value if isinstance(value, int | float | bool) or value is None else str(value)
