"""Node management: registration, heartbeats, liveness, drain, and the agent's job reports.

The Celery tasks in `cluster.tasks` check a message's token and then call these.
A message the portal will not act on raises `MessageRefused`; the task records it
with `message_reject`, where admins see it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import IntegrityError, models, transaction
from django.db.models import Case, F, Value, When
from django.utils import timezone
from django.utils.translation import gettext

from cluster import signals
from cluster.errors import SlotsRefused
from cluster.models import ControlClock, Gpu, Node, RejectedMessage
from cluster.protocol import MessageRefused, RegisterInfo, db_text, heartbeat_parse
from core.executors import portal_schedules
from protocol.messages import MAX_NODE_NAME_CHARS

log = logging.getLogger(__name__)


@transaction.atomic
def node_set_drain(*, node_id: int, drain: bool) -> Node:
    """Drain a node (running jobs finish, nothing new starts) or return it to service."""
    node = Node.objects.select_for_update().get(pk=node_id)
    node.drain_requested = drain
    if drain and node.state == Node.State.UP:
        node.state = Node.State.DRAINING
    elif not drain and node.state == Node.State.DRAINING:
        node.state = Node.State.UP
    node.save(update_fields=["drain_requested", "state"])
    return node


def message_reject(
    *, node_name: object, message: str, reason: RejectedMessage.Reason, detail: str = ""
) -> None:
    """Log a refused agent message and count it where admins see it (admin: rejected messages)."""
    # Whatever the agent sent must fit the log itself: a forged name may hold NUL.
    name = db_text(str(node_name))[:MAX_NODE_NAME_CHARS]
    detail = db_text(detail)[:2000]
    log.warning("refused %s from node %r: %s %s", message, name, reason.value, detail)
    now = timezone.now()
    same_kind = RejectedMessage.objects.filter(node_name=name, message=message, reason=reason)
    changes = {"count": F("count") + 1, "last_at": now, "last_detail": detail}
    if same_kind.update(**changes):
        return
    try:
        with transaction.atomic():
            RejectedMessage.objects.create(
                node_name=name,
                message=message,
                reason=reason,
                first_at=now,
                last_at=now,
                last_detail=detail,
            )
    except IntegrityError:  # another worker created the row between our two statements
        same_kind.update(**changes)


def node_registered(*, node_name: str) -> Node:
    """The node that sent a message, which must have registered; else `MessageRefused`."""
    return _registered(Node.objects.filter(name=node_name).first())


def node_registered_with_gpus(*, node_name: str, uuids: set[str]) -> tuple[Node, dict[str, int]]:
    """`node_registered`, and the ids of its GPUs among `uuids` by UUID, in one query."""
    if not uuids:
        return node_registered(node_name=node_name), {}
    # Raw, as this runs for every batch of samples: the ORM's FilteredRelation took longer
    # to compile than the database takes to answer.
    rows: list[Any] = list(
        Node.objects.raw(
            f"SELECT n.id, n.name, n.registered_at, n.gpu_backend, n.runtime,"
            f" g.uuid AS listed_uuid, g.id AS listed_pk"
            f" FROM {Node._meta.db_table} n LEFT JOIN {Gpu._meta.db_table} g"
            f" ON g.node_id = n.id AND g.uuid IN ({', '.join(['%s'] * len(uuids))})"
            f" WHERE n.name = %s",
            [*uuids, node_name],
        )
    )
    node = _registered(rows[0] if rows else None)
    return node, {row.listed_uuid: row.listed_pk for row in rows if row.listed_pk is not None}


def _registered(node: Node | None) -> Node:
    if node is None or node.registered_at is None:
        raise MessageRefused(
            RejectedMessage.Reason.NOT_REGISTERED,
            "the agent must send node_register first (restart the agent)",
        )
    if node.is_simulated and not settings.LABPORTAL_ALLOW_SIMULATION:
        raise MessageRefused(
            RejectedMessage.Reason.SIMULATION_REFUSED, "node registered as simulated"
        )
    return node


def node_register(*, node_name: str, info: RegisterInfo) -> Node:
    """Create or update the node and upsert its GPUs by UUID; GPUs no longer reported go missing.

    A simulated node is refused unless LABPORTAL_ALLOW_SIMULATION is on; a node
    that was registered before is then taken out of service, since its GPUs can
    no longer be believed.
    """
    if info.is_simulated and not settings.LABPORTAL_ALLOW_SIMULATION:
        _node_registration_withdraw(node_name=node_name)
        raise MessageRefused(
            RejectedMessage.Reason.SIMULATION_REFUSED,
            f"gpu_backend={info.gpu_backend} runtime={info.runtime}; "
            "set LABPORTAL_ALLOW_SIMULATION=true to allow it on purpose",
        )
    for detail in info.bad_gpus:
        message_reject(
            node_name=node_name,
            message="node_register",
            reason=RejectedMessage.Reason.MALFORMED,
            detail=detail,
        )
    return _node_register(node_name=node_name, info=info)


@transaction.atomic
def _node_registration_withdraw(*, node_name: str) -> None:
    now = timezone.now()
    Node.objects.filter(name=node_name).exclude(state=Node.State.DOWN).update(
        state=Node.State.DOWN, down_since=now
    )
    Node.objects.filter(name=node_name).update(registered_at=None)


@transaction.atomic
def _node_register(*, node_name: str, info: RegisterInfo) -> Node:
    now = timezone.now()
    node, _created = Node.objects.select_for_update().get_or_create(name=node_name)
    node.hostname = info.hostname
    node.agent_version = info.agent_version
    node.gpu_backend = info.gpu_backend
    node.runtime = info.runtime
    node.gateway_url = info.gateway
    node.registered_at = now
    node.last_heartbeat = now
    node.state = node.state_when_alive
    node.down_since = None
    node.jobs_lost_at = None
    node.save()

    present = _gpus_upsert(node=node, reports=info)
    _gpus_mark_missing(node=node, present_ids=present)
    log.info(
        "node %s registered: %d device(s), %s/%s",
        node.name,
        len(present),
        info.gpu_backend,
        info.runtime,
    )
    return node


def _gpus_upsert(*, node: Node, reports: RegisterInfo) -> set[int]:
    """Create or update every reported device; return the ids of those now on this node."""
    uuids = [report.uuid for report in reports.gpus]
    known = {gpu.uuid: gpu for gpu in Gpu.objects.select_for_update().filter(uuid__in=uuids)}
    # The rows Slurm's inventory made for this node's GRES (``slurm:<node>:<index>``, no
    # model or memory): the agent's real GPU of the same index takes its row over.
    placeholders = {
        gpu.index: gpu
        for gpu in Gpu.objects.select_for_update().filter(
            node=node, parent__isnull=True, uuid__startswith=f"slurm:{node.name}:"
        )
    }
    here: dict[str, Gpu] = {}
    # Whole GPUs first, so that MIG instances find their parent.
    for report in sorted(reports.gpus, key=lambda r: r.kind == Gpu.Kind.MIG):
        gpu = known.get(report.uuid)
        if gpu is not None and gpu.node_id != node.pk and gpu.state != Gpu.State.MISSING:
            # A device still present on another node is not this node's to claim.
            message_reject(
                node_name=node.name,
                message="node_register",
                reason=RejectedMessage.Reason.GPU_ON_OTHER_NODE,
                detail=f"{report.uuid} is registered on node {gpu.node_id}",
            )
            continue
        parent = None
        if report.kind == Gpu.Kind.MIG:
            parent = here.get(report.parent_uuid or "")
            if parent is None:
                message_reject(
                    node_name=node.name,
                    message="node_register",
                    reason=RejectedMessage.Reason.MALFORMED,
                    detail=f"MIG instance {report.uuid} names parent {report.parent_uuid}, "
                    "which this node did not report",
                )
                continue
        if gpu is None and report.kind == Gpu.Kind.WHOLE:
            gpu = placeholders.pop(report.index, None)
            if gpu is not None:
                log.info("node %s: GPU %s replaces %s", node.name, report.uuid, gpu.uuid)
                gpu.uuid = report.uuid
        if gpu is None:
            gpu = Gpu(uuid=report.uuid)
        moved = gpu.pk is not None and gpu.node_id != node.pk
        gpu.node = node
        gpu.index = report.index
        gpu.model = report.model
        gpu.memory_mb = report.memory_mb
        gpu.kind = report.kind
        gpu.parent = parent
        if gpu.state == Gpu.State.MISSING:
            gpu.state = Gpu.State.AVAILABLE
        gpu.save()
        if moved:  # its shared slots move with it
            Gpu.objects.filter(parent=gpu, kind=Gpu.Kind.SLOT).update(node=node)
        here[gpu.uuid] = gpu
    return {gpu.pk for gpu in here.values()}


def _gpus_mark_missing(*, node: Node, present_ids: set[int]) -> None:
    devices = Gpu.objects.filter(node=node, kind__in=[Gpu.Kind.WHOLE, Gpu.Kind.MIG])
    gone = devices.exclude(pk__in=present_ids).exclude(state=Gpu.State.MISSING)
    for uuid in gone.values_list("uuid", flat=True):
        log.warning("node %s no longer reports GPU %s: marked missing", node.name, uuid)
    gone.update(state=Gpu.State.MISSING)
    slots = Gpu.objects.filter(node=node, kind=Gpu.Kind.SLOT)
    slots.filter(parent__state=Gpu.State.MISSING).update(state=Gpu.State.MISSING)
    for slot in (
        slots.filter(state=Gpu.State.MISSING, parent__state=Gpu.State.AVAILABLE)
        .only("pk", "uuid", "parent__shared_slots")
        .select_related("parent")
    ):
        # A slot the admin removed stays missing; one the GPU still exposes comes back.
        number = _slot_number(slot.uuid)
        if slot.parent is not None and number is not None and number < slot.parent.shared_slots:
            Gpu.objects.filter(pk=slot.pk).update(state=Gpu.State.AVAILABLE)


def node_heartbeat_record(*, node_name: str, info: object) -> None:
    """Note that the node is alive (a down node comes back up, or draining, if asked), then
    reconcile the jobs the portal gave it with the ones it says it runs."""
    if not isinstance(info, dict):
        raise MessageRefused(RejectedMessage.Reason.MALFORMED, "info must be an object")
    node = node_registered(node_name=node_name)
    now = timezone.now()
    Node.objects.filter(pk=node.pk).update(last_heartbeat=now)
    came_back = Node.objects.filter(pk=node.pk, state=Node.State.DOWN).update(
        state=Case(
            When(drain_requested=True, then=Value(Node.State.DRAINING)),
            default=Value(Node.State.UP),
        ),
        down_since=None,
        jobs_lost_at=None,
    )
    if came_back:
        log.info("node %s is back after a silence", node.name)
    # Refused after the liveness is recorded: a bad job list does not make the node silent.
    heartbeat = heartbeat_parse(info)
    # In Slurm mode the agent only monitors: Slurm, not the node's job list, says what runs.
    if heartbeat.running_job_ids is not None and portal_schedules():
        signals.node_reported_jobs.send(
            sender=Node,
            node_id=node.pk,
            running_ids=heartbeat.running_job_ids,
            starting_ids=heartbeat.starting_job_ids,
            now=now,
        )


@dataclass
class LivenessReport:
    marked_down: list[str] = field(default_factory=list)
    jobs_lost: dict[str, int] = field(default_factory=dict)


def nodes_check_liveness(*, now: datetime | None = None) -> LivenessReport:
    """Mark silent nodes down; after the grace period, declare their running jobs lost, once.

    Silence counts only while the control side listens: after a gap between checks (the
    database or the broker away, the worker stopped), no node goes down before
    LABPORTAL_NODE_DOWN_AFTER_S, nor loses its jobs before LABPORTAL_NODE_LOST_GRACE_S,
    have passed since. Each step claims its node with a conditional UPDATE, so two
    overlapping beats (or a heartbeat arriving meanwhile) never act twice.
    """
    now = now or timezone.now()
    report = LivenessReport()
    if not portal_schedules():  # Slurm mode: node states come from Slurm (inventory sync)
        return report
    gap = timedelta(seconds=2 * settings.LABPORTAL_LIVENESS_CHECK_S + 5)
    with transaction.atomic():
        listening_since = ControlClock.tick(now=now, gap=gap)
    down_cutoff = now - timedelta(seconds=settings.LABPORTAL_NODE_DOWN_AFTER_S)
    if listening_since > down_cutoff:
        return report  # not listening long enough to call anyone silent
    for node_id, name in Node.objects.silent_since(down_cutoff).values_list("pk", "name"):
        claimed = (
            Node.objects.silent_since(down_cutoff)
            .filter(pk=node_id)
            .update(state=Node.State.DOWN, down_since=now)
        )
        if claimed:
            log.warning("node %s sent no heartbeat since before %s: marked down", name, down_cutoff)
            report.marked_down.append(name)

    lost_cutoff = now - timedelta(seconds=settings.LABPORTAL_NODE_LOST_GRACE_S)
    if listening_since > lost_cutoff:
        return report
    candidates = Node.objects.down_with_jobs_not_yet_lost(lost_cutoff)
    for node_id, name, last_heartbeat in candidates.values_list("pk", "name", "last_heartbeat"):
        try:
            lost = _node_jobs_declare_lost(
                node_id=node_id,
                name=name,
                last_heartbeat=last_heartbeat,
                cutoff=lost_cutoff,
                now=now,
            )
        except Exception:  # one node's failure must not stop the others; the next beat retries
            log.exception("could not declare the jobs of node %s lost", name)
            continue
        if lost is not None:
            report.jobs_lost[name] = lost
    return report


@transaction.atomic
def _node_jobs_declare_lost(
    *, node_id: int, name: str, last_heartbeat: datetime | None, cutoff: datetime, now: datetime
) -> int | None:
    claimed = (
        Node.objects.down_with_jobs_not_yet_lost(cutoff).filter(pk=node_id).update(jobs_lost_at=now)
    )
    if not claimed:
        return None
    if last_heartbeat is None:
        reason = gettext("Node %(node)s never sent a heartbeat.") % {"node": name}
    else:
        reason = gettext("Node %(node)s has sent no heartbeat since %(since)s.") % {
            "node": name,
            "since": last_heartbeat.strftime("%Y-%m-%d %H:%M:%S %Z"),
        }
    answers = signals.node_jobs_lost.send(sender=Node, node_id=node_id, reason=reason)
    counts: list[object] = [count for _receiver, count in answers]
    lost = sum(count for count in counts if isinstance(count, int))
    log.warning("node %s down past its grace period: %s job(s) marked lost", name, lost)
    return lost


def node_known(*, node_name: str) -> Node:
    # Job reports need not wait for a registration: an agent's restart reconcile may
    # report ends before the portal has processed its node_register.
    node = Node.objects.filter(name=node_name).first()
    if node is None:
        raise MessageRefused(RejectedMessage.Reason.NOT_REGISTERED, "unknown node")
    return node


# --- Shared slots ------------------------------------------------------------------

SLOT_SEPARATOR = "::slot"
MAX_SHARED_SLOTS = 16


def slot_uuid(parent_uuid: str, number: int) -> str:
    """A slot's UUID names its GPU, so an agent can tell which device runs it."""
    return f"{parent_uuid}{SLOT_SEPARATOR}{number}"


def _slot_number(uuid: str) -> int | None:
    _parent, sep, number = uuid.rpartition(SLOT_SEPARATOR)
    return int(number) if sep and number.isdigit() else None


def gpu_shared_slots_check(*, gpu: Gpu, slots: int) -> None:
    """Raise `SlotsRefused` if the GPU cannot be exposed as `slots` shared slots now."""
    if slots < 0 or slots > MAX_SHARED_SLOTS or slots == 1:
        raise SlotsRefused(
            gettext("Shared slots must be 0 (whole GPU) or 2 to %(max)d.")
            % {"max": MAX_SHARED_SLOTS}
        )
    if slots and gpu.kind != Gpu.Kind.WHOLE:
        raise SlotsRefused(gettext("Only a whole GPU can be shared; a MIG instance cannot."))
    if slots == gpu.shared_slots:
        return
    # The job queue's allocations, through their reverse relation (cluster imports nothing above).
    in_use = Gpu.objects.filter(
        models.Q(pk=gpu.pk) | models.Q(parent=gpu, kind=Gpu.Kind.SLOT), allocations__active=True
    )
    if in_use.exists():
        jobs = sorted(set(in_use.values_list("allocations__job_id", flat=True)))
        raise SlotsRefused(
            gettext(
                "%(gpu)s is in use by job(s) %(jobs)s; change its shared slots when it is free "
                "(drain it first so that nothing new starts)."
            )
            % {"gpu": gpu.label, "jobs": ", ".join(f"#{j}" for j in jobs)}
        )


@transaction.atomic
def gpu_set_shared_slots(*, gpu_id: int, slots: int) -> Gpu:
    """Expose a whole GPU as `slots` shared slots (0: whole again); never while it is in use.

    Slots keep their UUIDs across changes. A slot that goes away is deleted, or
    marked missing when past jobs ran on it (their history keeps pointing at it).
    """
    gpu = Gpu.objects.select_for_update().select_related("node").get(pk=gpu_id)
    gpu_shared_slots_check(gpu=gpu, slots=slots)
    gpu.shared_slots = slots
    gpu.save(update_fields=["shared_slots"])
    existing = {
        _slot_number(s.uuid): s
        for s in Gpu.objects.select_for_update().filter(parent=gpu, kind=Gpu.Kind.SLOT)
    }
    share_mb = gpu.memory_mb // slots if slots else 0
    state = Gpu.State.AVAILABLE if gpu.state == Gpu.State.AVAILABLE else gpu.state
    for number in range(slots):
        slot = existing.pop(number, None) or Gpu(
            uuid=slot_uuid(gpu.uuid, number), kind=Gpu.Kind.SLOT, parent=gpu
        )
        slot.node, slot.index, slot.model = gpu.node, gpu.index, gpu.model
        slot.memory_mb, slot.state = share_mb, state
        slot.save()
    for slot in existing.values():
        if slot.allocations.exists():
            slot.state = Gpu.State.MISSING
            slot.save(update_fields=["state"])
        else:
            slot.delete()
    log.info("%s now has %d shared slot(s)", gpu.label, slots)
    return gpu
