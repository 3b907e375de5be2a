"""Job workflows: submit, cancel, requeue, stop, agent events, limits.

Every transition runs in a transaction, writes a JobEvent and is idempotent
against events an agent sends twice.
"""

from __future__ import annotations

import logging
import re
import shlex
from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta
from decimal import Decimal
from functools import partial
from typing import Any

from django.db import connection, transaction
from django.db.models import Count, Max, Q
from django.utils import timezone
from django.utils.translation import gettext as _
from django.utils.translation import gettext_noop

from accounts import services as account_services
from accounts.models import User
from cluster.models import Gpu, Node
from core.durations import hours_minutes, lazy_hours_minutes
from core.errors import DomainError, StaffOnly
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
    return PriorityGrant.objects.in_force().filter(user=owner, queue=queue).exists()


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
    reservation = Job.reservation_model().objects.live().filter(pk=reservation_id).first()
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
