"""The scheduling pass: load the cluster from the database, call the pure engine, apply the plan.

Passes never overlap: each takes a row lock on the SchedulerLock row (SELECT … FOR
UPDATE on PostgreSQL; SQLite's IMMEDIATE transactions serialise writers). The
partial unique index on active allocations is the last line of defence: a plan
that would give a GPU twice cannot be committed.
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from django.db import connection, transaction
from django.db.models import (
    Exists,
    ExpressionWrapper,
    F,
    FloatField,
    Func,
    OuterRef,
    Q,
    QuerySet,
    Subquery,
    Sum,
    Value,
)
from django.db.models.functions import Cast, Coalesce, Extract, Greatest, Least, Power
from django.utils import timezone
from django.utils.translation import gettext_noop

from accounts.models import Category, User
from accounts.selectors import has_credit
from cluster.models import Gpu, Node
from jobqueue.dependencies import (
    AFTEROK,
    dependency_never_satisfied,
    dependency_satisfied,
)
from jobqueue.events import record_event
from jobqueue.models import (
    Allocation,
    CategoryQueueAllowance,
    EmergencyRequest,
    Job,
    PriorityGrant,
    Queue,
    SchedulerLock,
    SchedulingPolicy,
)
from jobqueue.services import jobs_cancel_for_failed_dependency
from reservations.selectors import reservation_rows_for_scheduler
from scheduler import model as sm
from scheduler.engine import plan as engine_plan
from scheduler.fairshare import UsageRecord, decayed_usage
from scheduling import dispatch

logger = logging.getLogger(__name__)

LOCK_NAME = "main"
REQUEST_ROW = "main:requests"  # the coalescing flag, apart from the lock a pass holds
STORE_ROW = "main:store"  # serialises the storing of places and estimates (see scheduling_pass)
# A waiting job's stored estimate is rewritten only when it moves by more than this (pages
# show minutes), and its priority when it moves by more than PRIORITY_TOLERANCE of itself:
# otherwise every pass would rewrite every waiting row as time goes by.
ESTIMATE_TOLERANCE_S = 30.0
# A pass run at a job's end stores waiting jobs' figures at most this often (see scheduling_pass).
INLINE_STORE_INTERVAL_S = 2.0
# Waiting jobs' figures are never older than this while passes keep being requested.
STORE_MAX_LAG_S = 10.0
PRIORITY_TOLERANCE = 0.005
UNCATEGORISED = "uncategorised"
RESERVATION_HORIZON = timedelta(days=14)
# Usage older than this many half-lives weighs < 1/256 and is not loaded.
USAGE_HALF_LIVES = 8

KIND_TO_ENGINE: dict[str, sm.GpuKind] = {
    Gpu.Kind.WHOLE: sm.GpuKind.WHOLE,
    Gpu.Kind.MIG: sm.GpuKind.MIG,
    Gpu.Kind.SLOT: sm.GpuKind.SLOT,
}


def _category_name(user: User) -> str:
    """The engine's category of `user`: their category's name, or UNCATEGORISED."""
    return user.category.name if user.category is not None else UNCATEGORISED


class EpochSeconds(Func):
    """A timestamp column as float epoch seconds, computed by the database: reading
    thousands of rows, parsing their timestamps in Python costs more than the query."""

    output_field = FloatField()

    def as_postgresql(self, compiler: Any, connection: Any, **extra: Any) -> Any:
        # EXTRACT gives numeric, whose arithmetic is far slower than float8's.
        return self.as_sql(
            compiler, connection, template="EXTRACT(EPOCH FROM %(expressions)s)::float8"
        )

    def as_sqlite(self, compiler: Any, connection: Any, **extra: Any) -> Any:
        return self.as_sql(
            compiler, connection, template="((julianday(%(expressions)s) - 2440587.5) * 86400.0)"
        )


def epoch(value: datetime) -> float:
    return value.timestamp()


def from_epoch(value: float) -> datetime:
    return datetime.fromtimestamp(value, tz=UTC)


@dataclass
class PassResult:
    started: list[int]
    preempted: list[int]
    pending: int
    duration_ms: float


# --- Requests (coalesced) ------------------------------------------------------


def scheduling_pass_request() -> None:
    """Enqueue one pass after commit; while one is already requested, further requests coalesce.

    The flag lives on its own row (REQUEST_ROW), which a pass clears in a short
    transaction of its own *before* it loads the state. So a request either
    finds the flag set by a pass that has not loaded yet (and that pass sees its
    job), or sets it again and enqueues the next pass: no request is lost. The
    row is never held locked for a pass's length, so a submit never waits for one.
    """

    if not _pass_already_asked_in_this_transaction():
        transaction.on_commit(_enqueue_pass)


def _pass_already_asked_in_this_transaction() -> bool:
    # A batch of 50 submits, or a job's end with its follow-ups, asks once per commit.
    return any(entry[1] is _enqueue_pass for entry in connection.run_on_commit)


# Set while a control worker applies an agent's event: a pass it asks for runs right there,
# after the event's commit, instead of going round the broker to a worker that may be busy.
_passes_inline: ContextVar[bool] = ContextVar("passes_inline", default=False)


@contextmanager
def passes_inline() -> Iterator[None]:
    """Within this block, a requested pass runs in this process as soon as the request's
    transaction commits (a job's end starts the next job on its GPUs at once).

    Requests still coalesce: if a pass is already requested and has not loaded yet, that
    one sees the change and nothing runs here (see ``_pass_inline``).
    """
    token = _passes_inline.set(True)
    try:
        yield
    finally:
        _passes_inline.reset(token)


def _enqueue_pass() -> None:
    if _passes_inline.get():
        _pass_inline()
        return
    if _request_claim():
        _send_pass()


def _pass_inline() -> None:
    """Run the pass asked for here, unless one is requested already and has not loaded yet
    (that one sees this transaction's change). The flag is left as it is: a request set
    after this look has enqueued its own pass, which clears it."""
    if _pass_requested():
        return
    try:
        scheduling_pass(inline=True)
    except Exception:  # never lose the request: hand it to a worker as usual
        logger.exception("the scheduling pass after an agent's event failed; queueing one")
        if _request_claim():
            _send_pass()


def _send_pass() -> None:
    from scheduling.tasks import scheduling_pass_task

    try:
        scheduling_pass_task.apply_async()
    except Exception:  # broker away: beat runs a pass every few seconds anyway
        logger.exception("could not enqueue a scheduling pass")
        SchedulerLock.objects.filter(name=REQUEST_ROW).update(pass_requested=False)


def _request_claim() -> bool:
    """Set the request flag; True if this call set it (so it must enqueue the pass)."""
    if connection.vendor == "postgresql":
        # One statement whether or not the row exists yet (a submit pays for each).
        table = SchedulerLock._meta.db_table
        with connection.cursor() as cursor:
            cursor.execute(
                f"""
                INSERT INTO {table} AS l (name, pass_requested) VALUES (%s, true)
                ON CONFLICT (name) DO UPDATE SET pass_requested = true
                WHERE l.pass_requested = false
                RETURNING l.id
                """,
                [REQUEST_ROW],
            )
            return cursor.fetchone() is not None
    if SchedulerLock.objects.filter(name=REQUEST_ROW, pass_requested=False).update(
        pass_requested=True
    ):
        return True
    _row, created = SchedulerLock.objects.get_or_create(
        name=REQUEST_ROW, defaults={"pass_requested": True}
    )
    return created


def _requests_take() -> None:
    """Clear the request flag, committed before the pass reads anything (see above).

    One statement, committed on its own (autocommit): no BEGIN/COMMIT round trips."""
    SchedulerLock.objects.filter(name=REQUEST_ROW, pass_requested=True).update(pass_requested=False)


def _stored_since(now: datetime, seconds: float) -> bool:
    """Whether a pass stored waiting jobs' figures less than `seconds` before `now`."""
    return SchedulerLock.objects.filter(
        name=STORE_ROW, last_pass_at__gt=now - timedelta(seconds=seconds)
    ).exists()


def _pass_requested() -> bool:
    """Whether a pass has been asked for since this one took the requests."""
    return SchedulerLock.objects.filter(name=REQUEST_ROW, pass_requested=True).exists()


# --- Loading the state -----------------------------------------------------------


def share_tree(users: Sequence[User], categories: Sequence[Category]) -> sm.ShareNode:
    """The fair-share tree: the lab, its categories (by weight), their users (equal shares)."""
    by_category: dict[str, list[str]] = defaultdict(list)
    for user in users:
        by_category[_category_name(user)].append(user.username)
    children = []
    for category in categories:
        members = by_category.pop(category.name, [])
        if members:
            children.append(
                sm.ShareNode(
                    name=f"category:{category.name}",
                    shares=float(category.fairshare_weight),
                    children=tuple(sm.ShareNode(name=u, shares=1.0) for u in sorted(members)),
                )
            )
    for name, members in sorted(by_category.items()):
        children.append(
            sm.ShareNode(
                name=f"category:{name}",
                shares=10.0,
                children=tuple(sm.ShareNode(name=u, shares=1.0) for u in sorted(members)),
            )
        )
    return sm.ShareNode(name="lab", shares=1.0, children=tuple(children))


# Fair-share usage is summed over months of jobs, yet moves by a hair per minute: a
# pass reuses it for this long (Slurm recomputes it every PriorityCalcPeriod, 5 min).
USAGE_REUSE_S = 60.0
_usage_memo: dict[str, Any] = {}


def _usage_recent(now: datetime, half_life_s: float) -> dict[str, float]:
    """``_usage`` as of at most USAGE_REUSE_S ago (in this process), decayed to ``now``."""
    memo = _usage_memo.get("value")
    if memo is not None:
        at, memo_half_life, usage = memo
        age = (now - at).total_seconds()
        if memo_half_life == half_life_s and 0 <= age < USAGE_REUSE_S:
            decay = 0.5 ** (age / half_life_s) if half_life_s > 0 else 1.0
            return {user: value * decay for user, value in usage.items()}
    usage = _usage(now, half_life_s)
    _usage_memo["value"] = (now, half_life_s, usage)
    return usage


def usage_forget() -> None:
    """Make the next pass sum usage afresh (after usage changed by hand, and in tests)."""
    _usage_memo.clear()


def _usage(now: datetime, half_life_s: float) -> dict[str, float]:
    """Decayed GPU-seconds per user, from jobs that ran within the last few half-lives."""
    since = now - timedelta(seconds=half_life_s * USAGE_HALF_LIVES)
    jobs = (
        Job.objects.filter(started_at__isnull=False)
        .filter(Q(ended_at__isnull=True) | Q(ended_at__gte=since))
        .exclude(state=Job.State.LOST)
    )
    if connection.vendor == "postgresql":
        # A busy lab has 10^5 such jobs: sum them where they are (one row per user back).
        return _usage_in_sql(jobs, now, half_life_s)
    records = []
    rows = jobs.values_list(
        "owner__username", "started_at", "ended_at", "gpus", "queue__usage_factor"
    )
    for username, started, ended, gpus, usage_factor in rows:
        assert started is not None  # filtered on started_at__isnull=False
        end = ended or now
        seconds = max(0.0, (end - started).total_seconds())
        # Account at the midpoint, so a long job decays as the time it actually used.
        middle = started + (end - started) / 2
        records.append(
            UsageRecord(
                user=username,
                time=epoch(middle),
                gpu_seconds=seconds * gpus,
                usage_factor=usage_factor,
            )
        )
    return decayed_usage(records, epoch(now), half_life_s)


def _usage_in_sql(jobs: QuerySet[Job], now: datetime, half_life_s: float) -> dict[str, float]:
    """``decayed_usage`` of the same records, summed by PostgreSQL (see ``_usage``)."""

    def epoch_of(moment: Any) -> Cast:
        # EXTRACT gives numeric, whose arithmetic (and power) is ~100x slower than float8's.
        return Cast(Extract(moment, "epoch"), FloatField())

    seconds = Greatest(
        Value(0.0),
        epoch_of(Coalesce("ended_at", Value(now))) - epoch_of("started_at"),
        output_field=FloatField(),
    )
    middle = epoch_of("started_at") + seconds / 2
    if half_life_s > 0:
        # Halved per half-life of age; capped so the power cannot underflow.
        halvings = Least(
            Greatest(Value(0.0), (Value(epoch(now)) - middle) / half_life_s), Value(1000.0)
        )
        weight: Any = Power(Value(0.5), halvings)
    else:
        weight = Value(1.0)
    rows = (
        jobs.values("owner__username")
        .annotate(
            usage=Sum(
                ExpressionWrapper(
                    seconds * F("gpus") * F("queue__usage_factor") * weight,
                    output_field=FloatField(),
                )
            )
        )
        .values_list("owner__username", "usage")
    )
    return {username: float(usage or 0.0) for username, usage in rows}


def engine_units(gpus: list[Gpu], all_gpus: list[Gpu]) -> list[sm.Gpu]:
    """The engine's schedulable units for `gpus` (with node and parent loaded).

    A partitioned GPU (one with MIG instances or shared slots among `all_gpus`) is
    scheduled through its children only, so it is left out.
    """
    partitioned = {g.parent_id for g in all_gpus if g.parent_id}
    return [
        sm.Gpu(
            id=g.uuid,
            node=g.node.name,
            model=g.model,
            memory_mb=g.memory_mb,
            kind=KIND_TO_ENGINE[g.kind],
            parent=g.parent.uuid if g.parent is not None else None,
        )
        for g in gpus
        if g.pk not in partitioned
    ]


def _emergency(now: datetime) -> Exists:
    """Whether the job (the outer row) is in an approved emergency request still in force:
    read with the job's row, not in a statement of its own."""
    return Exists(
        EmergencyRequest.objects.filter(
            state=EmergencyRequest.State.APPROVED, expires_at__gt=now, jobs=OuterRef("pk")
        )
    )


def _active_gpu_uuids() -> Any:
    """PostgreSQL: the UUIDs of the GPUs the job (the outer row) holds, as an array."""
    from django.contrib.postgres.expressions import ArraySubquery

    return ArraySubquery(
        Allocation.objects.filter(job=OuterRef("pk"), active=True).values("gpu__uuid")
    )


def _gpus_of_running_jobs() -> dict[int, list[str]]:
    """The GPUs each active job holds, where the running jobs' query cannot bring them."""
    gpus_of_job: dict[int, list[str]] = defaultdict(list)
    for job_id, uuid in Allocation.objects.filter(
        active=True, job__state__in=Job.ACTIVE_STATES
    ).values_list("job_id", "gpu__uuid"):
        gpus_of_job[job_id].append(uuid)
    return gpus_of_job


def engine_policy(
    settings_row: SchedulingPolicy, queues: list[Queue], categories: list[Category]
) -> sm.Policy:
    """The engine's policy from the admin's settings, queues and categories."""
    half_life_s = settings_row.usage_half_life_days * 86400
    allowances = _queue_allowances(categories)
    return sm.Policy(
        weight_age=settings_row.weight_age,
        weight_fairshare=settings_row.weight_fairshare,
        weight_queue=settings_row.weight_queue,
        weight_category=settings_row.weight_category,
        weight_size=settings_row.weight_size,
        max_age_s=settings_row.max_age_days * 86400,
        half_life_s=half_life_s,
        drain_reserve_nodes=settings_row.drain_reserve_nodes,
        weight_attained=settings_row.weight_attained,
        attained_thresholds=settings_row.attained_thresholds_gpus(),
        weight_short=settings_row.weight_short,
        preempt_starving_after_s=_seconds_or_none(settings_row.preempt_starving_after_s),
        preempt_share_after_s=_seconds_or_none(settings_row.preempt_share_after_s),
        preempt_min_run_s=float(settings_row.preempt_min_run_s),
        preempt_max_times=settings_row.preempt_max_times,
        # A victim has the stop grace before SIGKILL: the job it makes room for starts
        # no earlier than that, in its estimate and in the GPUs held for it.
        preemption_grace_s=float(settings_row.stop_grace_s),
        queues={
            q.name: sm.QueuePolicy(
                name=q.name,
                tier=q.tier,
                priority_factor=q.priority_factor,
                usage_factor=q.usage_factor,
                max_gpus_per_job=q.max_gpus_per_job,
                max_wall_s=float(q.max_time_limit_s),
                max_running_jobs_per_user=q.max_running_jobs_per_user,
                max_running_gpus_per_user=q.max_running_gpus_per_user,
            )
            for q in queues
        },
        categories={
            c.name: sm.CategoryPolicy(
                name=c.name,
                factor=c.priority_factor,
                max_gpus_per_user=c.max_concurrent_gpus,
                queues=allowances.get(c.pk, {}),
            )
            for c in categories
        },
    )


def _seconds_or_none(value: int | None) -> float | None:
    return float(value) if value is not None else None


def _queue_allowances(categories: list[Category]) -> dict[int, dict[str, sm.QueueAllowance]]:
    """The categories' own running limits by queue ({category id: {queue name: ...}})."""
    found: dict[int, dict[str, sm.QueueAllowance]] = defaultdict(dict)
    rows = CategoryQueueAllowance.objects.filter(category__in=categories).values_list(
        "category_id", "queue__name", "max_running_jobs_per_user", "max_running_gpus_per_user"
    )
    for category_id, queue_name, jobs, gpus in rows:
        if jobs is not None or gpus is not None:
            found[category_id][queue_name] = sm.QueueAllowance(
                max_running_jobs_per_user=jobs, max_running_gpus_per_user=gpus
            )
    return found


def failed_dependencies() -> dict[int, int]:
    """The waiting jobs whose afterok dependency can never be met ({job: the dependency})."""
    kinds = dict(
        Job.objects.filter(state__in=Job.WAITING_STATES)
        .exclude(dependency_kind="")
        .values_list("pk", "dependency_kind")
    )
    return waiting_dependencies(kinds)[1] if kinds else {}


def waiting_dependencies(
    kinds: dict[int, str],
) -> tuple[dict[int, tuple[int, ...]], dict[int, int]]:
    """For waiting jobs with dependencies ({job id: afterok or afterany}): the ids each
    still waits for, and the jobs whose afterok can never be met ({job: the dependency
    that failed}), also through a chain (C afterok B afterok A, and A failed)."""
    unmet: dict[int, list[int]] = {pk: [] for pk in kinds}
    failed: dict[int, int] = {}
    rows = Job.depends_on.through.objects.filter(from_job_id__in=list(kinds)).values_list(
        "from_job_id", "to_job_id", "to_job__state", "to_job__exit_code"
    )
    for job_id, dep_id, dep_state, dep_exit in rows:
        kind = kinds[job_id]
        if dependency_never_satisfied(kind, dep_state, dep_exit):
            failed.setdefault(job_id, dep_id)
        if not dependency_satisfied(kind, dep_state, dep_exit):
            unmet[job_id].append(dep_id)
    changed = bool(failed)
    while changed:  # a waiting afterok dependency that is cancelled now fails its dependents
        changed = False
        for job_id, deps in unmet.items():
            if job_id in failed or kinds[job_id] != AFTEROK:
                continue
            doomed = next((d for d in deps if d in failed), None)
            if doomed is not None:
                failed[job_id] = doomed
                changed = True
    return {pk: tuple(sorted(deps)) for pk, deps in unmet.items() if deps}, failed


def build_engine_input(now: datetime) -> tuple[sm.ClusterState, sm.Policy, dict[str, Gpu]]:
    """The engine's view of the database at `now`."""
    settings_row = SchedulingPolicy.current()
    queues = list(Queue.objects.all())
    categories = list(Category.objects.all())
    nodes = list(Node.objects.all())
    # A monitor-only agent (runtime "none", a Slurm node's) refuses commands: its GPUs
    # are not the portal's to start jobs on.
    node_state = {
        n.name: sm.NodeState.DOWN
        if n.state == Node.State.DOWN or n.runtime == "none"
        else sm.NodeState.DRAINING
        if (n.state == Node.State.DRAINING or n.drain_requested)
        else sm.NodeState.UP
        for n in nodes
    }
    all_gpus = list(Gpu.objects.select_related("node", "parent").exclude(state=Gpu.State.MISSING))
    gpu_by_uuid = {g.uuid: g for g in all_gpus}
    engine_gpus = tuple(
        engine_units([g for g in all_gpus if g.state == Gpu.State.AVAILABLE], all_gpus)
    )
    emergency = _emergency(now)
    # Plain rows, not model instances, here and below: a pass runs after every job's end.
    # On PostgreSQL each running job's GPUs come in its row (one round trip fewer per pass).
    gpus_in_row = connection.vendor == "postgresql"
    running_rows = Job.objects.filter(state__in=Job.ACTIVE_STATES).annotate(
        is_emergency=emergency,
        gpu_uuids=_active_gpu_uuids() if gpus_in_row else Value(None, output_field=FloatField()),
    )
    gpus_of_job = {} if gpus_in_row else _gpus_of_running_jobs()
    running = [
        sm.RunningJob(
            id=row.pk,
            user=row.owner__username,
            queue=row.queue__name,
            gpu_ids=tuple(row.gpu_uuids if gpus_in_row else gpus_of_job.get(row.pk, ())),
            start_time=epoch(row.started_at or row.dispatched_at or now),
            time_limit_s=float(row.time_limit_s),
            predicted_runtime_s=(
                float(row.predicted_runtime_s) if row.predicted_runtime_s else None
            ),
            preemptible=row.preemptible,
            category=_category(row.owner__category__name),
            reservation_id=row.reservation_id,
            emergency=row.is_emergency,
            preemptions=row.preemption_count,
        )
        for row in running_rows.values_list(
            "pk",
            "owner__username",
            "owner__category__name",
            "queue__name",
            "started_at",
            "dispatched_at",
            "time_limit_s",
            "predicted_runtime_s",
            "preemptible",
            "reservation_id",
            "is_emergency",
            "gpu_uuids",
            "preemption_count",
            named=True,
        )
    ]
    # Plain rows, not model instances: a busy queue has thousands of waiting jobs.
    waiting = (
        Job.objects.filter(state__in=Job.WAITING_STATES)
        # Epoch seconds from the database: parsing 2,000 timestamps costs more than the query.
        .annotate(submit_epoch=EpochSeconds("submitted_at"), is_emergency=emergency)
        .values_list(
            "pk",
            "owner__username",
            "owner__category__name",
            "queue__name",
            "submit_epoch",
            "gpus",
            "shared_slot",
            "min_gpu_memory_mb",
            "gpu_model",
            "time_limit_s",
            "predicted_runtime_s",
            "reservation_id",
            "preemptible",
            "state",
            "is_emergency",
            "dependency_kind",
            named=True,
        )
    )
    waiting_rows = list(waiting)
    # Only the dependencies not yet met go to the engine (one query, only when any waits).
    unmet, _failed = (
        waiting_dependencies(
            {row.pk: row.dependency_kind for row in waiting_rows if row.dependency_kind}
        )
        if any(row.dependency_kind for row in waiting_rows)
        else ({}, {})
    )
    pending = [
        sm.PendingJob(
            id=row.pk,
            user=row.owner__username,
            queue=row.queue__name,
            submit_time=row.submit_epoch,
            gpus=row.gpus,
            shared_slot=row.shared_slot,
            min_memory_mb=row.min_gpu_memory_mb,
            gpu_model=row.gpu_model or None,
            time_limit_s=float(row.time_limit_s),
            predicted_runtime_s=(
                float(row.predicted_runtime_s) if row.predicted_runtime_s else None
            ),
            reservation_id=row.reservation_id,
            emergency=row.is_emergency,
            preemptible=row.preemptible,
            held=row.state == Job.State.HELD,
            category=_category(row.owner__category__name),
            depends_on=unmet.get(row.pk, ()),
        )
        for row in waiting_rows
    ]
    reservations = tuple(
        sm.Reservation(id=pk, user=username, gpu_ids=gpu_ids, start=epoch(start), end=epoch(end))
        for pk, username, gpu_ids, start, end in reservation_rows_for_scheduler(
            now=now, horizon=RESERVATION_HORIZON
        )
    )
    # Whether each member has credit comes with their row (no statement of its own).
    users = list(
        User.objects.filter(is_active=True)
        .select_related("category")
        .annotate(with_credit=has_credit())
    )
    half_life_s = settings_row.usage_half_life_days * 86400
    state = sm.ClusterState(
        nodes=tuple(sm.Node(name=n.name, state=node_state[n.name]) for n in nodes),
        gpus=engine_gpus,
        pending=tuple(pending),
        running=tuple(running),
        reservations=reservations,
        share_tree=share_tree(users, categories),
        usage=_usage_recent(now, half_life_s),
        users_without_credit=frozenset(u.username for u in users if not u.with_credit),
    )
    policy = engine_policy(settings_row, queues, categories)
    return state, policy, gpu_by_uuid


# --- The pass ------------------------------------------------------------------------


def scheduling_pass(*, now: datetime | None = None, inline: bool = False) -> PassResult:
    """Run one pass: decide starts and preemptions and commit them (the starts go out to the
    agents then), then store each waiting job's place and estimate in a transaction of its own.

    An ``inline`` pass (run where a job's end asked for it, see ``_pass_inline``) leaves the
    request flag alone, since it claimed none, and stores the waiting jobs' figures only if
    none were stored in the last INLINE_STORE_INTERVAL_S: while jobs end several times a
    second, every waiting row would otherwise be rewritten at each end. A skipped store is
    made up by the next pass that stores (at the latest beat's, every few seconds)."""
    began = time.perf_counter()
    if not inline:
        _requests_take()
    with transaction.atomic():
        lock, stored_at, grant_queue_waiting = _locked_pass_row()
        now = now or timezone.now()
        # An inline pass within INLINE_STORE_INTERVAL_S of the last store will not store
        # the waiting jobs' figures (see _should_store), so it skips the forecast of
        # their starts too: during a burst of ends, most of the engine's time.
        forecast = not (
            inline
            and stored_at is not None
            and stored_at > now - timedelta(seconds=INLINE_STORE_INTERVAL_S)
        )
        if grant_queue_waiting:
            _move_jobs_whose_grant_lapsed(now)
        state, policy, gpu_by_uuid = build_engine_input(now)
        result = engine_plan(state, policy, epoch(now), estimates=forecast)
        started = _apply_starts(result.starts, gpu_by_uuid, now)
        preempted = _apply_preemptions(result.preemptions)
        # A job whose afterok can never be met still waits on that dependency (its
        # depends_on is not empty), so the lookup runs only while some job waits on one.
        waits = any(job.depends_on for job in state.pending)
        dependency_failed = failed_dependencies() if waits else {}
        if dependency_failed:
            # A job's end is handled here, once, for the jobs that wait for it: an
            # afterok dependency that failed, was cancelled, timed out or was lost cancels
            # them (the engine kept them pending: that dependency is never met).
            jobs_cancel_for_failed_dependency(dependency_failed, at=now)
        plan_ms = (time.perf_counter() - began) * 1000
        SchedulerLock.objects.filter(pk=lock.pk).update(last_pass_at=now, last_pass_ms=plan_ms)
    # An agent never waits for thousands of waiting rows to be written, and the next pass
    # (whose plan needs none of them) may plan while they are. When a further pass is
    # already requested (jobs ending one after another), it will store its own, newer
    # figures: writing these too would only rewrite every waiting row twice.
    # (An inline pass asks about the last store first: during a burst of ends it was
    # recent, and the request flag need not be read at all.)
    if forecast and _should_store(now):
        _store_pending_info_unless_newer(result, now)
    duration_ms = (time.perf_counter() - began) * 1000
    return PassResult(
        started=started, preempted=preempted, pending=len(result.pending), duration_ms=duration_ms
    )


@transaction.atomic
def _store_pending_info_unless_newer(result: sm.Plan, now: datetime) -> None:
    """Store this pass's figures unless a later pass has already stored its own.

    Stores take their own row (STORE_ROW), not the pass lock; its `last_pass_at` says
    whose figures are in the table, so an older pass never overwrites a newer one's.
    (The pass lock's `last_pass_ms` is the time to the plan's commit.)
    """
    row = _locked_row(STORE_ROW)
    if row.last_pass_at is not None and row.last_pass_at > now:
        return
    _store_pending_info(result, now)
    SchedulerLock.objects.filter(pk=row.pk).update(last_pass_at=now)


def _should_store(now: datetime) -> bool:
    """Whether this pass stores the waiting jobs' places and estimates (see scheduling_pass).

    Skipped when a later pass is already requested (it stores newer figures), but never
    for longer than STORE_MAX_LAG_S: while requests keep coming (a long stream of
    submits), every pass would otherwise find one pending and the figures would freeze.
    (An inline pass that stored within INLINE_STORE_INTERVAL_S is ruled out before it
    plans: scheduling_pass asks first, and then skips the forecast too.)"""
    if _pass_requested():
        return not _stored_since(now, STORE_MAX_LAG_S)
    return True


def _locked_pass_row() -> tuple[SchedulerLock, datetime | None, bool]:
    """The pass lock's row, locked for this transaction, and, read in the same round trip:
    when the waiting jobs' figures were last stored (STORE_ROW), and whether any job waits
    in a queue that needs a priority grant (only then are grants checked).

    Both are as of the statement's start: a pass that waited for the lock may take the
    figures for older than they are and forecast once more, never less; and it may miss a
    job that entered a grant-only queue while it waited (its grant was checked at submit,
    and the next pass checks it again).
    """
    stored = SchedulerLock.objects.filter(name=STORE_ROW).values("last_pass_at")[:1]
    row = (
        SchedulerLock.objects.select_for_update()
        .annotate(
            figures_stored_at=Subquery(stored),
            grant_queue_waiting=Exists(
                Job.objects.filter(state__in=Job.WAITING_STATES, queue__requires_grant=True)
            ),
        )
        .filter(name=LOCK_NAME)
        .first()
    )
    if row is None:
        _locked_row(LOCK_NAME)  # made on first use
        return _locked_pass_row()
    return (
        row,
        getattr(row, "figures_stored_at", None),
        bool(getattr(row, "grant_queue_waiting", True)),
    )


def _locked_row(name: str) -> SchedulerLock:
    """The SchedulerLock row `name`, locked for this transaction (made on first use)."""
    row = SchedulerLock.objects.select_for_update().filter(name=name).first()
    if row is None:
        SchedulerLock.objects.get_or_create(name=name)
        row = SchedulerLock.objects.select_for_update().get(name=name)
    return row


def _move_jobs_whose_grant_lapsed(now: datetime) -> list[int]:
    """A waiting job in a grant-only queue whose owner's grant is no longer in force moves to
    the lab's everyday queue (`normal`, else the lowest tier open without a grant): the grant
    is checked at every pass, not only at submit."""
    waiting = list(
        Job.objects.filter(state__in=Job.WAITING_STATES, queue__requires_grant=True).select_related(
            "queue"
        )
    )
    if not waiting:
        return []
    in_force = set(PriorityGrant.objects.in_force(now).values_list("user_id", "queue_id"))
    lapsed = [j for j in waiting if (j.owner_id, j.queue_id) not in in_force]
    if not lapsed:
        return []
    open_queues = Queue.objects.filter(is_active=True, requires_grant=False)
    fallback = open_queues.filter(name="normal").first() or open_queues.order_by("tier").first()
    moved = []
    for job in lapsed:
        if fallback is None:
            continue
        old_queue = job.queue.name
        Job.objects.filter(pk=job.pk).update(queue=fallback)
        record_event(
            job,
            "requeued",
            gettext_noop(
                "The priority grant for the %(old)s queue is no longer in force; moved to %(new)s."
            ),
            params={"old": old_queue, "new": fallback.name},
        )
        moved.append(job.pk)
    return moved


def _category(name: str | None) -> str:
    """The engine's category of a member: their category's name, or the uncategorised one."""
    return name if name is not None else UNCATEGORISED


def _apply_starts(starts: list[sm.Start], gpu_by_uuid: dict[str, Gpu], now: datetime) -> list[int]:
    if not starts:
        return []
    # Only the jobs' rows: locking their owners too (FOR UPDATE of the joined rows) would
    # deadlock with a submit that holds its owner's row for the limit checks.
    jobs = {
        j.pk: j
        for j in Job.objects.select_for_update(of=("self",))
        .filter(pk__in=[s.job_id for s in starts], state=Job.State.PENDING)
        .select_related("owner", "image", "queue")
    }
    started = []
    allocations: list[Allocation] = []
    for start in starts:
        job = jobs.get(start.job_id)
        if job is None:
            continue  # cancelled or held since the state was loaded
        gpus = [gpu_by_uuid[g] for g in start.gpu_ids]
        node = gpus[0].node
        job.move_to(Job.State.DISPATCHED)
        job.node = node
        job.dispatched_at = now
        job.dispatch_count += 1
        job.queue_position = None
        job.pending_reason = ""
        job.save(
            update_fields=[
                "state",
                "node",
                "dispatched_at",
                "dispatch_count",
                "queue_position",
                "pending_reason",
            ]
        )
        allocations.extend(Allocation(job=job, gpu=g, allocated_at=now) for g in gpus)
        record_event(
            job,
            "dispatched",
            gettext_noop("Sent to %(node)s on %(gpus)s."),
            params={"node": node.name, "gpus": ", ".join(g.label for g in gpus)},
            data={"gpu_uuids": list(start.gpu_ids)},
        )
        dispatch.send_start(node=node, spec=dispatch.start_spec(job, gpus))
        started.append(job.pk)
    # One statement: the partial unique index refuses the whole pass if any GPU is taken.
    Allocation.objects.bulk_create(allocations)
    return started


# What a preempted job's owner reads in its events, by the engine's reason.
PREEMPTION_MESSAGES = {
    "emergency": gettext_noop(
        "Preempted for an emergency; it will be requeued with its original place."
    ),
    "reservation": gettext_noop(
        "Preempted for a reservation; it will be requeued with its original place."
    ),
    "starving": gettext_noop(
        "Preempted for a job that had waited past the lab's limit; it will be requeued with "
        "its original place."
    ),
    "share": gettext_noop(
        "Preempted for a member under their fair share, as you are over yours; it will be "
        "requeued with its original place."
    ),
}


def _apply_preemptions(preemptions: list[sm.Preemption]) -> list[int]:
    from jobqueue.services import job_request_stop

    done = []
    for preemption in preemptions:
        job = Job.objects.filter(
            pk=preemption.job_id, preemptible=True, state__in=Job.ACTIVE_STATES
        ).first()
        if job is None or job.stop_requested_at is not None:
            continue
        job_request_stop(job_id=job.pk, reason="preempted")
        record_event(job, "preempting", PREEMPTION_MESSAGES[preemption.reason])
        done.append(job.pk)
    return done


def _store_pending_info(result: sm.Plan, now: datetime) -> None:
    if not result.pending:
        return
    # Every waiting row, read as plain numbers (no 2,000-id IN list, no datetime parsing):
    # the ones the plan placed are compared with what the plan says.
    current = {
        row[0]: row[1:]
        for row in Job.objects.filter(state__in=Job.WAITING_STATES)
        .annotate(estimate_epoch=EpochSeconds("estimated_start"))
        .values_list("pk", "queue_position", "estimate_epoch", "pending_reason", "priority")
        if row[0] in result.pending
    }
    # The engine numbers the whole order, started jobs included; members see their place among those waiting.
    ordered = sorted(current, key=lambda pk: result.pending[pk].position)
    now_epoch = epoch(now)
    changed: list[tuple[int, int, datetime | None, str, float]] = []
    for place, pk in enumerate(ordered, start=1):
        info = result.pending[pk]
        start = max(info.estimated_start, now_epoch) if info.estimated_start is not None else None
        row = (place, start, str(info.reason), round(info.priority, 3))
        if not _same_pending_info(row, current[pk]):
            changed.append((pk, place, from_epoch(start) if start is not None else None, *row[2:]))
    if not changed:
        return
    if connection.vendor == "postgresql":
        # One statement for thousands of rows; bulk_update's CASE per row costs seconds.
        # Rows a pass is starting right now are locked by it: they are no longer waiting,
        # so they are skipped rather than waited for.
        ids, places, starts, reasons, priorities = (list(c) for c in zip(*changed, strict=True))
        table = Job._meta.db_table
        waiting = [str(s) for s in Job.WAITING_STATES]
        with connection.cursor() as cursor:
            cursor.execute(
                f"""
                UPDATE {table} AS j
                SET queue_position = v.place, estimated_start = v.start,
                    pending_reason = v.reason, priority = v.priority
                FROM unnest(%s::bigint[], %s::int[], %s::timestamptz[], %s::varchar[], %s::float8[])
                     AS v(id, place, start, reason, priority)
                WHERE j.id = v.id AND j.id IN (
                    SELECT id FROM {table}
                    WHERE id = ANY(%s::bigint[]) AND state = ANY(%s::varchar[])
                    FOR UPDATE SKIP LOCKED
                )
                """,
                [ids, places, starts, reasons, priorities, ids, waiting],
            )
        return
    jobs = [
        Job(pk=pk, queue_position=place, estimated_start=at, pending_reason=reason, priority=p)
        for pk, place, at, reason, p in changed
    ]
    Job.objects.bulk_update(
        jobs, ["queue_position", "estimated_start", "pending_reason", "priority"], batch_size=500
    )


def _same_pending_info(new: tuple[Any, ...], stored: tuple[Any, ...]) -> bool:
    """Whether `new` (place, estimate as epoch seconds, reason, priority) differs from what is
    stored by nothing a reader would notice."""
    place, start, reason, priority = new
    old_place, old_start, old_reason, old_priority = stored
    if place != old_place or reason != old_reason or (start is None) != (old_start is None):
        return False
    if start is not None and abs(start - old_start) > ESTIMATE_TOLERANCE_S:
        return False
    if old_priority is None:
        return False
    return abs(priority - old_priority) <= PRIORITY_TOLERANCE * max(abs(old_priority), 1e-9)
