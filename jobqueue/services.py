"""Job workflows: submit, cancel, requeue, stop, agent events, limits.

Every transition runs in a transaction, writes a JobEvent and is idempotent
against events an agent sends twice.
"""

from __future__ import annotations

import logging
import re
import shlex
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from functools import partial
from typing import Any

from django.conf import settings
from django.core.cache import cache
from django.db import connection, transaction
from django.db.models import Count, Max, Q
from django.utils import timezone
from django.utils.translation import gettext as _
from django.utils.translation import gettext_noop

from accounts import services as account_services
from accounts.models import User
from cluster.models import Gpu, Node, RejectedMessage
from cluster.protocol import MessageRefused, db_text
from core.durations import hours_minutes, lazy_hours_minutes
from core.errors import DomainError
from core.i18n import lazy_text
from jobqueue import executor
from jobqueue.errors import (
    GrantRequired,
    ImageNotAllowed,
    InvalidTransition,
    JobRefused,
    MountNotAllowed,
    NotJobOwner,
    QueueNotFound,
    QuotaExceeded,
    ReservationNotUsable,
    StaffOnly,
    TimeLimitTooLong,
    TooManyGpus,
)
from jobqueue.models import (
    SHELL_PREFIX,
    Allocation,
    ContainerImage,
    Job,
    JobEvent,
    PriorityGrant,
    Queue,
    SchedulingPolicy,
    VolumeMount,
    command_limit_refusal,
    command_text,
    env_limit_refusal,
)
from jobqueue.prediction import job_predict_runtime
from jobqueue.signals import job_ended
from scheduling import dispatch

logger = logging.getLogger(__name__)

ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
RESERVED_ENV = {"CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES", "LABPORTAL_JOB_ID"}
LOG_TAIL_CHARS = 64_000
FIRST_STEP = min(JobEvent.STEPS.values())


def record_event(
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
    """Record a job event. `message` is an untranslated msgid (gettext_noop) formatted with
    `params`: stored in English, shown in each reader's language. An event is never dated
    before an event of an earlier step (an agent's clock may lag the portal's)."""
    step = JobEvent.STEPS.get(kind, 30)
    when = at or timezone.now()
    stored = dict(data or {})
    if message:
        stored["msgid"] = message
        if params:
            stored["params"] = {k: _plain(v) for k, v in params.items()}
    event = JobEvent(
        job=job,
        kind=kind,
        message=(message % params) if params else message,
        data=stored,
        actor=actor,
        event_id=event_id,
        step=step,
        created_at=when,
    )
    if step > FIRST_STEP and connection.vendor == "postgresql":
        _insert_after_earlier_steps(event)
        return event
    if step > FIRST_STEP:  # nothing comes before a submit: no need to ask
        floor = job.events.filter(step__lt=step).aggregate(latest=Max("created_at"))["latest"]
        if floor is not None and floor > when:
            event.created_at = floor
    event.save(force_insert=True)
    return event


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


def _parse_command(command: str | Iterable[str]) -> list[str]:
    """A string is shell text, run as typed through `/bin/sh -c`; a list is an exec vector."""
    if not isinstance(command, str):
        command = list(command)
    refusal = command_limit_refusal(command)
    if refusal is not None:
        raise JobRefused(refusal)
    if isinstance(command, str):
        if not command.strip():
            raise JobRefused(
                _("The command is empty. Give the program to run, e.g. python train.py.")
            )
        try:
            # The shell would refuse unbalanced quotes only once the job runs; say so now.
            shlex.split(command)
        except ValueError as exc:
            raise JobRefused(
                _("The command could not be parsed (%(error)s). Check its quotes.") % {"error": exc}
            ) from None
        return [*SHELL_PREFIX, command.strip()]
    argv = [str(part) for part in command]
    if not argv or not argv[0].strip():
        raise JobRefused(_("The command is empty. Give the program to run, e.g. python train.py."))
    if any("\x00" in part for part in argv):
        # No process argument can hold one, and PostgreSQL cannot store it.
        raise JobRefused(_("The command contains a NUL character (\\0); remove it."))
    return argv


def _clean_env(env: Mapping[str, Any] | None) -> dict[str, str]:
    if env is None:
        return {}
    if not isinstance(env, Mapping):
        raise JobRefused(_("The environment must be a list of NAME=value pairs."))
    refusal = env_limit_refusal(dict(env))
    if refusal is not None:
        raise JobRefused(refusal)
    cleaned: dict[str, str] = {}
    for name, value in env.items():
        if not ENV_NAME.match(str(name)):
            raise JobRefused(
                _(
                    "“%(name)s” is not a valid environment variable name: use letters, digits and _, not starting with a digit."
                )
                % {"name": name}
            )
        if name in RESERVED_ENV:
            raise JobRefused(
                _("%(name)s is set by LabPortal to the job's GPUs; remove it from the environment.")
                % {"name": name}
            )
        cleaned[str(name)] = str(value)
    return cleaned


def largest_node_capacity(
    *, shared_slot: bool, min_memory_mb: int, gpu_model: str, unknown_memory_fits: bool = False
) -> int:
    """The most matching GPU units any one node that takes work could ever give a job.

    ``unknown_memory_fits``: a GPU whose memory is unknown (0, a Slurm GRES no agent or
    admin has described) counts as large enough.
    """
    units = Gpu.objects.filter(node__state__in=[Node.State.UP, Node.State.DRAINING]).exclude(
        state=Gpu.State.MISSING
    )
    if shared_slot:
        units = units.filter(kind=Gpu.Kind.SLOT)
    else:
        units = units.exclude(kind=Gpu.Kind.SLOT).filter(children__isnull=True)
    if min_memory_mb:
        enough = Q(memory_mb__gte=min_memory_mb)
        units = units.filter(enough | Q(memory_mb=0) if unknown_memory_fits else enough)
    if gpu_model:
        units = units.filter(model__icontains=gpu_model)
    best = units.values("node").annotate(n=Count("id")).aggregate(m=Max("n"))["m"]
    return int(best or 0)


@transaction.atomic
def job_submit(
    *,
    owner: User,
    queue: str | Queue,
    image: str,
    command: str | Iterable[str],
    gpus: int = 1,
    shared_slot: bool = False,
    env: Mapping[str, Any] | None = None,
    mounts: Iterable[str] = (),
    time_limit_s: int | None = None,
    min_gpu_memory_mb: int = 0,
    gpu_model: str = "",
    cpus: Decimal | float | int = Decimal("4"),
    memory_mb: int = 16384,
    name: str = "",
    reservation_id: int | None = None,
    preemptible: bool = False,
) -> Job:
    """Validate a job against the lab's rules and queue it; every refusal says what to change."""
    owner.lock_for_limits()
    queue_obj = _queue_for_submit(queue)
    image_obj = ContainerImage.objects.filter(reference=image, enabled=True).first()
    if image_obj is None:
        allowed = ", ".join(
            ContainerImage.objects.filter(enabled=True).values_list("reference", flat=True)[:10]
        )
        raise ImageNotAllowed(
            _(
                "The image “%(image)s” is not on the lab's allowlist. Use one of: %(allowed)s — or ask an admin to add it."
            )
            % {"image": image, "allowed": allowed or _("(none yet)")}
        )
    argv = _parse_command(command)
    clean_env = _clean_env(env)
    gpus = int(gpus)
    if shared_slot:
        if not queue_obj.allows_shared_slots:
            raise JobRefused(
                _(
                    "The %(queue)s queue does not use shared GPU slots; submit to the debug queue or ask for whole GPUs."
                )
                % {"queue": queue_obj.name}
            )
        gpus = 1
    if gpus < 1:
        raise JobRefused(_("A job needs at least one GPU."))
    if gpus > queue_obj.max_gpus_per_job:
        raise TooManyGpus(
            _("The %(queue)s queue allows at most %(max)d GPUs per job; ask for fewer.")
            % {"queue": queue_obj.name, "max": queue_obj.max_gpus_per_job}
        )
    category = owner.category
    if category is not None and gpus > category.max_concurrent_gpus:
        raise TooManyGpus(
            _("Your category (%(category)s) may use at most %(max)d GPUs at once; ask for fewer.")
            % {"category": category.name, "max": category.max_concurrent_gpus}
        )
    # In Slurm mode Slurm places the job: a GPU of unknown memory is not a reason to refuse.
    slurm_places = min_gpu_memory_mb > 0 and not executor.portal_schedules()
    capacity = largest_node_capacity(
        shared_slot=shared_slot,
        min_memory_mb=min_gpu_memory_mb,
        gpu_model=gpu_model,
        unknown_memory_fits=slurm_places,
    )
    memory_unchecked = slurm_places and (
        largest_node_capacity(
            shared_slot=shared_slot, min_memory_mb=min_gpu_memory_mb, gpu_model=gpu_model
        )
        < gpus
    )
    if gpus > capacity:
        if capacity == 0:
            raise TooManyGpus(
                _(
                    "No GPU in the lab matches this request (model “%(model)s”, at least %(mem)d MiB%(slot)s). Relax the constraints."
                )
                % {
                    "model": gpu_model or _("any"),
                    "mem": min_gpu_memory_mb,
                    "slot": _(", shared slot") if shared_slot else "",
                }
            )
        raise TooManyGpus(
            _(
                "No node has %(gpus)d matching GPUs; the largest has %(capacity)d. A job's GPUs must be on one node, so ask for at most %(capacity)d."
            )
            % {"gpus": gpus, "capacity": capacity}
        )
    limit = int(time_limit_s) if time_limit_s else queue_obj.default_time_limit_s
    if limit <= 0:
        raise JobRefused(_("The time limit must be positive."))
    if limit > queue_obj.max_time_limit_s:
        raise TimeLimitTooLong(
            _(
                "The %(queue)s queue allows a time limit of at most %(max)s; ask for less, or use another queue."
            )
            % {"queue": queue_obj.name, "max": hours_minutes(queue_obj.max_time_limit_s)}
        )
    if category is not None:
        waiting = Job.objects.filter(owner=owner).pending().count()
        if waiting >= category.max_queued_jobs:
            raise QuotaExceeded(
                _(
                    "You have %(n)d jobs waiting, the most your category allows. Cancel some or wait for them to start."
                )
                % {"n": waiting}
            )
    if queue_obj.requires_grant and not _has_grant(owner, queue_obj):
        raise GrantRequired(
            _(
                "The %(queue)s queue needs an approved priority grant. Apply for one (reason and deadline), or submit to the normal queue."
            )
            % {"queue": queue_obj.name}
        )
    mount_objs = _mounts_for(owner, mounts)
    reservation = _reservation_for(owner, reservation_id, gpus) if reservation_id else None
    try:
        cpus_value = Decimal(str(cpus))
    except ArithmeticError:
        raise JobRefused(_("CPUs must be a number, e.g. 4 or 0.5.")) from None
    if cpus_value <= 0 or memory_mb <= 0:
        raise JobRefused(_("CPUs and memory must be positive."))

    job = Job(
        owner=owner,
        queue=queue_obj,
        name=name[:120],
        image=image_obj,
        command=argv,
        env=clean_env,
        gpus=gpus,
        shared_slot=shared_slot,
        min_gpu_memory_mb=min_gpu_memory_mb,
        gpu_model=gpu_model,
        cpus=cpus_value,
        memory_mb=memory_mb,
        time_limit_s=limit,
        preemptible=preemptible,
        reservation=reservation,
        state=Job.State.PENDING,
        # No reason until the first pass has placed it: pages say "being scheduled".
        pending_reason="",
    )
    job.shape_command()
    job.predicted_runtime_s = job_predict_runtime(job)
    job.save()
    if mount_objs:
        job.mounts.set(mount_objs)
    record_event(
        job,
        "submitted",
        gettext_noop("Submitted to the %(queue)s queue."),
        params={"queue": queue_obj.name},
        actor=owner,
    )
    if memory_unchecked:
        record_event(
            job,
            "gpu_memory_unchecked",
            gettext_noop(
                "LabPortal does not know the memory of the Slurm nodes' GPUs, so the minimum of %(mem)d MiB per GPU was not checked: Slurm places the job."
            ),
            params={"mem": min_gpu_memory_mb},
        )
    executor.current().job_queued(job)
    # A new job has no GPUs yet and only the mounts just set: whoever shows it
    # (the API's answer) need not ask the database again.
    job._prefetched_objects_cache = {  # type: ignore[attr-defined]
        "allocations": Allocation.objects.none(),
        **({} if mount_objs else {"mounts": VolumeMount.objects.none()}),
    }
    # Nor for its Slurm row: the Slurm executor has just made it (and Django cached
    # it on the job); in agents mode there is none.
    slurm_row = Job.slurm.related  # type: ignore[attr-defined]
    if not slurm_row.is_cached(job):
        slurm_row.set_cached_value(job, None)
    return job


MAX_BATCH = 500
BATCH_TOO_LARGE = gettext_noop("A batch holds at most %(max)d jobs; split it into smaller batches.")


@transaction.atomic
def jobs_submit_batch(*, owner: User, specs: list[dict[str, Any]]) -> list[Job]:
    """Submit many jobs at once (like a Slurm job array): all are queued, or none is.

    A refusal names the job it is about (its place in the batch) and says what to change.
    """
    if not specs:
        raise JobRefused(_("The batch is empty: send at least one job."))
    if len(specs) > MAX_BATCH:
        raise JobRefused(_(BATCH_TOO_LARGE) % {"max": MAX_BATCH})
    jobs = []
    # One transaction holds the whole batch and any refusal rolls it all back, so
    # each job needs no savepoint of its own (two statements fewer per job).
    submit_one = job_submit.__wrapped__  # type: ignore[attr-defined]
    for place, spec in enumerate(specs, start=1):
        try:
            jobs.append(submit_one(owner=owner, **spec))
        except DomainError as exc:
            refusal = type(exc)(
                _("Job %(place)d of %(count)d: %(reason)s")
                % {"place": place, "count": len(specs), "reason": exc.message}
            )
            raise refusal from exc
    return jobs


def _queue_for_submit(queue: str | Queue) -> Queue:
    if isinstance(queue, Queue):
        return queue
    queue_obj = Queue.objects.filter(name=queue, is_active=True).first()
    if queue_obj is None:
        names = ", ".join(Queue.objects.filter(is_active=True).values_list("name", flat=True))
        raise QueueNotFound(
            _("There is no open queue called “%(queue)s”. Choose one of: %(names)s.")
            % {"queue": queue, "names": names}
        )
    return queue_obj


def _has_grant(owner: User, queue: Queue) -> bool:
    return PriorityGrant.objects.filter(
        user=owner, queue=queue, state=PriorityGrant.State.APPROVED, deadline__gt=timezone.now()
    ).exists()


def _mounts_for(owner: User, names: Iterable[str]) -> list[VolumeMount]:
    wanted = [n for n in dict.fromkeys(names) if n]
    if not wanted:
        return []
    found = {m.name: m for m in VolumeMount.objects.filter(name__in=wanted, enabled=True)}
    missing = [n for n in wanted if n not in found]
    if missing:
        allowed = ", ".join(VolumeMount.objects.filter(enabled=True).values_list("name", flat=True))
        raise MountNotAllowed(
            _("These mounts are not on the lab's allowlist: %(missing)s. Allowed: %(allowed)s.")
            % {"missing": ", ".join(missing), "allowed": allowed or _("(none)")}
        )
    for mount in found.values():
        try:
            mount.source_for(owner.username)
        except ValueError:
            raise MountNotAllowed(
                _("The mount %(name)s cannot be used with your user name; ask an admin.")
                % {"name": mount.name}
            ) from None
    return [found[n] for n in wanted]


def _reservation_for(owner: User, reservation_id: int, gpus: int) -> Any:
    from reservations.models import Reservation

    reservation = Reservation.objects.live().filter(pk=reservation_id).first()
    if reservation is None or reservation.user_id != owner.pk:
        raise ReservationNotUsable(
            _(
                "Reservation %(id)s is not one of your current bookings. Pick one from My reservations."
            )
            % {"id": reservation_id}
        )
    if reservation.end <= timezone.now():
        raise ReservationNotUsable(_("That reservation has already ended."))
    booked = reservation.gpus.count()
    if gpus > booked:
        raise ReservationNotUsable(
            _("The reservation holds %(booked)d GPUs; ask for at most that many.")
            % {"booked": booked}
        )
    return reservation


# --- Scheduling triggers ----------------------------------------------------


def request_scheduling_pass() -> None:
    """Ask for a scheduling pass after this transaction commits; requests coalesce.

    Where the executor schedules itself (Slurm), the portal runs no pass.
    """
    executor.current().wake()


# --- Cancel, stop, requeue ---------------------------------------------------


def _locked_job(job_id: int) -> Job:
    return (
        Job.objects.select_for_update(of=("self",))
        .select_related("node", "owner", "queue")
        .get(pk=job_id)
    )


@transaction.atomic
def job_cancel(*, job_id: int, actor: User) -> Job:
    """Cancel a job: at once if it waits; a running one is stopped (SIGTERM, grace, SIGKILL)."""
    job = _locked_job(job_id)
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
        job.state = Job.State.CANCELLED
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
    _request_stop(
        job,
        reason="cancelled",
        message=gettext_noop("Cancel requested; stopping the container."),
        actor=actor,
    )


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
    job = _locked_job(job_id)
    if job.state != Job.State.PENDING:
        raise InvalidTransition(
            _("Only a pending job can be held; job %(id)d is %(state)s.")
            % {"id": job.pk, "state": job.get_state_display()}
        )
    if not reason.strip():
        raise JobRefused(_("Say why the job is held; its owner reads the reason."))
    job.state = Job.State.HELD
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
    job = _locked_job(job_id)
    if job.state != Job.State.HELD:
        raise InvalidTransition(
            _("Only a held job can be released; job %(id)d is %(state)s.")
            % {"id": job.pk, "state": job.get_state_display()}
        )
    job.state = Job.State.PENDING
    job.hold_reason = ""
    job.save(update_fields=["state", "hold_reason"])
    record_event(job, "released", gettext_noop("Released by a lab admin."), actor=actor)
    request_scheduling_pass()
    return job


@transaction.atomic
def job_request_stop(*, job_id: int, reason: str, actor: User | None = None) -> Job:
    """Stop a running job (SIGTERM, grace, SIGKILL); `reason` is recorded as its end reason."""
    job = _locked_job(job_id)
    if job.state not in Job.ACTIVE_STATES:
        return job
    _request_stop(
        job,
        reason=reason,
        message=gettext_noop("Stop requested: %(reason)s."),
        params={"reason": reason},
        actor=actor,
    )
    return job


def _request_stop(
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
    job = _locked_job(job_id)
    if job.state not in Job.ACTIVE_STATES:
        raise InvalidTransition(_("Only a running job can be requeued."))
    _requeue(
        job,
        message=gettext_noop("Back in the queue: %(reason)s."),
        params={"reason": reason},
        actor=actor,
    )
    return job


def _requeue(
    job: Job,
    *,
    message: str,
    params: Mapping[str, Any] | None = None,
    at: datetime | None = None,
    actor: User | None = None,
) -> None:
    """Back to pending with its original submit time; everything about the last run is cleared.
    `message` is an untranslated msgid (see `record_event`)."""
    _release(job, at)
    job.state = Job.State.PENDING
    job.node = None
    job.started_at = job.dispatched_at = job.stop_requested_at = None
    job.container_id = ""
    job.end_reason = ""
    job.start_sent_at = job.stop_sent_at = job.unreported_since = None
    job.start_resends = job.stop_resends = 0
    job.save()
    record_event(job, "requeued", message, params=params, actor=actor, at=at)
    request_scheduling_pass()


def _release(job: Job, at: datetime | None = None) -> None:
    Allocation.objects.filter(job=job, active=True).update(
        active=False, released_at=at or timezone.now()
    )


def _finish(
    job: Job, state: str, *, at: datetime, exit_code: int | None = None, reason: str = ""
) -> None:
    job.state = state
    job.ended_at = at
    job.exit_code = exit_code
    if reason:
        job.end_reason = reason
    _release(job, at)
    job.save()
    request_scheduling_pass()
    _after_final(job)
    _notify_job_end(job)


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


# --- Agent events -------------------------------------------------------------


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
            job.state = Job.State.RUNNING
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
            _finish(job, Job.State.FAILED, at=at, reason=reason)
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
        _requeue(
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
    _finish(job, state, at=at, exit_code=exit_code)
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
        _finish(job, Job.State.LOST, at=now, reason=reason)
        count += 1
    return count


# --- Jobs against the node's heartbeats --------------------------------------------


def _settle_as(job: Job) -> str:
    """The final state of a job ended without its exit: what its stop request asked for."""
    return Job.State.TIMED_OUT if job.end_reason == "timed_out" else Job.State.CANCELLED


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
        job.state = Job.State.RUNNING
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
            _requeue(
                job, message=gettext_noop("Back in the queue: its node no longer has it."), at=now
            )
            return "requeued"
        if job.stop_requested_at is not None:
            record_event(
                job,
                "ended",
                gettext_noop("Ended: its node no longer has it, and a stop was asked."),
            )
            _finish(job, _settle_as(job), at=max(gone_at, job.started_at or gone_at))
            return "ended"
        lost_msgid = gettext_noop(
            "Node %(node)s no longer runs it, and its end was never received."
        )
        reason = lost_msgid % {"node": job.node.name}
        record_event(job, "lost", lost_msgid, params={"node": job.node.name})
        _finish(job, Job.State.LOST, at=gone_at, reason=reason)
        return "lost"
    # Dispatched, and the node has neither started it nor is starting it: the start was lost.
    sent = job.start_sent_at or job.dispatched_at or now
    if now - sent < timedelta(seconds=settings.LABPORTAL_START_ACK_S):
        return None
    if job.start_resends < settings.LABPORTAL_START_RETRIES:
        _start_resend(job, now=now)
        return "resent"
    if job.dispatch_count < settings.LABPORTAL_MAX_DISPATCHES:
        _requeue(
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
    _finish(job, Job.State.FAILED, at=now, reason=reason[:200])
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
    job = _locked_job(job_id)
    if job.state not in Job.ACTIVE_STATES:
        return False
    if job.node is None:
        reason = gettext_noop("Its node was removed from the portal.")
        record_event(job, "lost", reason)
        _finish(job, Job.State.LOST, at=now, reason=reason)
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
        _requeue(job, message=gettext_noop("Back in the queue: its node no longer has it."), at=now)
        return True
    _force_end(
        job,
        message=gettext_noop(
            "Ended by the portal: node %(node)s did not confirm the stop after %(n)d tries."
        ),
        params={"node": job.node.name, "n": job.stop_resends + 1},
        actor=None,
        now=now,
    )
    return True


@transaction.atomic
def job_force_end(*, job_id: int, actor: User) -> Job:
    """An admin's last resort: end an active job in the portal now, whatever its node says.

    Its GPUs are freed and the node is told (again) to stop the container; the
    heartbeat reconcile keeps telling it while the container still runs.
    """
    if not actor.is_staff:
        raise StaffOnly(_("Only an admin can force a job to end."))
    job = _locked_job(job_id)
    if job.is_final:
        raise InvalidTransition(
            _("Job %(id)d has already ended (%(state)s).")
            % {"id": job.pk, "state": job.get_state_display()}
        )
    _force_end(
        job,
        message=gettext_noop("Ended by %(admin)s (force end)."),
        params={"admin": actor.get_username()},
        actor=actor,
        now=timezone.now(),
    )
    return job


def _force_end(
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
        state = _settle_as(job)
        # Charged as if the stop had worked: up to its SIGKILL, not to this moment.
        grace = timedelta(seconds=SchedulingPolicy.current().stop_grace_s)
        at = min(now, job.stop_requested_at + grace)
    if job.started_at is not None:
        at = max(at, job.started_at)
    if not job.end_reason:
        job.end_reason = "cancelled"
    record_event(job, "force_ended", message, params=params, actor=actor)
    if job.node is not None and job.state in Job.ACTIVE_STATES:
        dispatch.send_stop(
            node=job.node,
            job_id=job.pk,
            grace_s=SchedulingPolicy.current().stop_grace_s,
            reason=job.end_reason,
        )
    _finish(job, state, at=at)


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
