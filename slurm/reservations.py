"""Calendar bookings as Slurm reservations (``scontrol create/update/delete reservation``).

Granularity (docs/slurm.md, "Bookings"): Slurm 22.05 reserves whole nodes, or a number of
cores on named nodes (``CoreCnt``); its reservations cannot hold GRES, so a GPU itself
cannot be reserved (23.02 added ``TRES=gres/gpu=N``). Hence:

- a booking of every GPU of a node becomes a reservation of the whole node;
- a booking of some GPUs of a node becomes a reservation of the matching share of the
  node's cores on that node (``CoreCnt``): the member's jobs get those cores, and the
  GPUs they hold are whichever are free; other jobs can still take the node's other
  GPUs. The calendar shows such a booking with the note "cores reserved in Slurm; GPUs
  not fenced", so nobody mistakes it for a hard GPU fence.

Every reservation is ``Users=<member's unix user>`` with ``Flags=MAGNETIC,IGNORE_JOBS``:
the member's jobs (portal or plain sbatch) enter it without ``--reservation``, and a
booking made on the calendar is never refused by Slurm because a job still runs there
(the portal's calendar already kept the slot free of bookings). Bookings that end, are
released early or cancelled lose their Slurm reservation on the next pass; a change of
time or GPUs updates it (a core-based one is replaced: 22.05 cannot update those). The
portal only touches reservations named ``lp-booking-<id>``.
"""

from __future__ import annotations

import logging
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import Count
from django.utils import timezone
from django.utils.translation import gettext, ngettext

from cluster.models import Gpu
from reservations.models import Reservation
from reservations.services import reservation_refund_unhonoured
from slurm.admin_commands import SlurmAdmin, slurm_time
from slurm.cli import SlurmError
from slurm.models import UnixLogin
from slurm.rules_models import SlurmReservation

log = logging.getLogger(__name__)

NAME_PREFIX = "lp-booking-"


def reservation_name(reservation_id: int) -> str:
    return f"{NAME_PREFIX}{reservation_id}"


@dataclass(frozen=True)
class NodeShape:
    gpus: int
    cores: int


@dataclass(frozen=True)
class ReservationSpec:
    """What Slurm is told for one booking; ``key()`` is compared to find changes."""

    name: str
    users: str
    nodes: tuple[str, ...]
    core_counts: tuple[int, ...] | None  # None: whole nodes
    start: str  # "now" once the booking has begun
    end: str
    maintenance: bool = False

    @property
    def granularity(self) -> str:
        return (
            SlurmReservation.Granularity.NODE
            if self.core_counts is None
            else SlurmReservation.Granularity.CORES
        )

    def key(self) -> str:
        cores = ",".join(map(str, self.core_counts)) if self.core_counts else "-"
        return f"{self.users}|{','.join(self.nodes)}|{cores}|{self.end}"

    def arguments(self, *, update: bool) -> list[str]:
        args = [f"ReservationName={self.name}"]
        if not update or self.start != "now":
            args.append(f"StartTime={self.start}")
        args += [f"EndTime={self.end}", f"Users={self.users}", f"Nodes={','.join(self.nodes)}"]
        if self.core_counts is not None:
            args.append(f"CoreCnt={','.join(map(str, self.core_counts))}")
        if not update:
            flags = "MAINT,IGNORE_JOBS" if self.maintenance else "MAGNETIC,IGNORE_JOBS"
            args.append(f"Flags={flags}")
        return args


def reservation_spec(
    *,
    reservation_id: int,
    unix_user: str,
    booked: dict[str, int],
    shapes: dict[str, NodeShape],
    start: datetime,
    end: datetime,
    now: datetime,
    maintenance: bool = False,
) -> ReservationSpec:
    """The Slurm reservation for a booking of ``booked`` (node → GPUs) from ``start`` to ``end``.

    Whole nodes when every booked node is fully booked, else each node's share of cores
    (rounded up, at least one).
    """
    nodes = tuple(sorted(booked))
    whole = all(booked[n] >= shapes[n].gpus for n in nodes)
    cores = None
    if not whole:
        cores = tuple(
            max(1, -(-shapes[n].cores * booked[n] // max(1, shapes[n].gpus))) for n in nodes
        )
    return ReservationSpec(
        name=reservation_name(reservation_id),
        users=unix_user,
        nodes=nodes,
        core_counts=cores,
        start="now" if start <= now else slurm_time(start),
        end=slurm_time(end),
        maintenance=maintenance,
    )


def parse_node_shapes(text: str) -> dict[str, NodeShape]:
    """``scontrol show node -o``: each node's GPUs (Gres=gpu[:type]:N) and cores."""
    from slurm.cli import gpu_count

    shapes = {}
    for line in text.splitlines():
        fields = dict(part.split("=", 1) for part in line.split() if "=" in part)
        if "NodeName" not in fields:
            continue
        cpus = int(fields.get("CPUTot", "0") or 0)
        threads = int(fields.get("ThreadsPerCore", "1") or 1)
        gpus, _kind = gpu_count(fields.get("Gres", ""))
        shapes[fields["NodeName"]] = NodeShape(gpus=gpus, cores=max(1, cpus // max(1, threads)))
    return shapes


def booking_refusal(*, user: Any, gpu_ids: list[int], maintenance: bool) -> str | None:
    """Why Slurm could not hold a booking of these GPUs for `user`, or None.

    Slurm 22.05 reserves whole nodes (a share of a node's cores holds none of its GPUs:
    another member's job could take them, and the booking would be charged for nothing),
    and a reservation names the unix user whose jobs may enter it."""
    if not maintenance and not UnixLogin.objects.filter(user=user).exists():
        return gettext(
            "Your account has no unix user name on the Slurm cluster yet, so Slurm cannot "
            "keep GPUs for you. Ask a lab admin to set it (admin site → Unix logins), then "
            "book again."
        )
    booked = Counter(Gpu.objects.filter(pk__in=gpu_ids).values_list("node__name", flat=True))
    whole = dict(
        Gpu.objects.filter(kind=Gpu.Kind.WHOLE, node__name__in=list(booked))
        .values("node__name")
        .annotate(n=Count("id"))
        .values_list("node__name", "n")
    )
    for node, count in sorted(booked.items()):
        total = whole.get(node, count)
        if count < total:
            return ngettext(
                "Slurm here reserves whole nodes, so it cannot keep %(count)d of the "
                "%(total)d GPU of %(node)s for you alone: another job could take it. Book "
                "all %(total)d GPU of %(node)s, or submit a job to a queue instead.",
                "Slurm here reserves whole nodes, so it cannot keep %(count)d of the "
                "%(total)d GPUs of %(node)s for you alone: other jobs could take them. Book "
                "all %(total)d GPUs of %(node)s, or submit a job to a queue instead.",
                total,
            ) % {"count": count, "total": total, "node": node}
    return None


# A booking whose reservation Slurm has not held this long after its start ends, refunded
# (a shorter outage heals on the next pass, and the booking stands).
UNHONOURED_AFTER = timedelta(minutes=10)


@dataclass
class ReservationSyncResult:
    created: int = 0
    updated: int = 0
    deleted: int = 0
    errors: list[str] = field(default_factory=list)


def _booked_nodes(reservation: Reservation) -> dict[str, int]:
    booked: dict[str, int] = defaultdict(int)
    for gpu in reservation.gpus.all():
        booked[gpu.node.name] += 1
    return dict(booked)


def slurm_reservations_sync(
    *, admin: SlurmAdmin | None = None, now: datetime | None = None
) -> ReservationSyncResult:
    """Make Slurm's ``lp-booking-*`` reservations match the live bookings; safe to repeat."""
    admin = admin or SlurmAdmin()
    now = now or timezone.now()
    result = ReservationSyncResult()
    in_slurm = {r.name: r for r in admin.reservations() if r.name.startswith(NAME_PREFIX)}
    logins = dict(UnixLogin.objects.values_list("user_id", "username"))
    shapes: dict[str, NodeShape] | None = None
    live = (
        Reservation.objects.live()
        .filter(end__gt=now)
        .prefetch_related("gpus__node")
        .select_related("slurm_reservation")
    )
    wanted: set[str] = set()
    live_ids: list[int] = []
    for reservation in live:
        live_ids.append(reservation.pk)
        name = reservation_name(reservation.pk)
        unix = logins.get(reservation.user_id)
        if reservation.is_maintenance:
            unix = getattr(settings, "LABPORTAL_SLURM_MAINTENANCE_USER", "root")
        booked = _booked_nodes(reservation)
        if not unix or not booked:
            _record(
                reservation, None, error="no unix login for the member" if not unix else "no GPUs"
            )
            continue
        if shapes is None:
            shapes = parse_node_shapes(admin.scontrol("show", "node", "-o"))
        unknown = [n for n in booked if n not in shapes]
        if unknown:
            _record(reservation, None, error=f"nodes not in Slurm: {', '.join(unknown)}")
            continue
        spec = reservation_spec(
            reservation_id=reservation.pk,
            unix_user=unix,
            booked=booked,
            shapes=shapes,
            start=reservation.start,
            end=reservation.end,
            now=now,
            maintenance=reservation.is_maintenance,
        )
        wanted.add(name)
        known = getattr(reservation, "slurm_reservation", None)
        exists = name in in_slurm
        if exists and known is not None and known.spec == spec.key() and not known.error:
            continue
        try:
            if exists and (spec.core_counts is not None or in_slurm[name].core_count):
                # 22.05 refuses to update a core-based reservation: replace it.
                admin.scontrol("delete", f"ReservationName={name}")
                admin.scontrol("create", "reservation", *spec.arguments(update=False))
                result.updated += 1
            elif exists:
                admin.scontrol("update", *spec.arguments(update=True))
                result.updated += 1
            else:
                admin.scontrol("create", "reservation", *spec.arguments(update=False))
                result.created += 1
        except SlurmError as exc:
            result.errors.append(f"{name}: {exc}")
            _record(reservation, spec, error=str(exc)[:500], held=exists)
            continue
        _record(reservation, spec, error="")
    for name in sorted(set(in_slurm) - wanted):
        try:
            admin.scontrol("delete", f"ReservationName={name}")
            result.deleted += 1
        except SlurmError as exc:
            result.errors.append(f"{name}: {exc}")
            continue
    SlurmReservation.objects.exclude(reservation_id__in=live_ids).delete()
    return result


@transaction.atomic
def _record(
    reservation: Reservation, spec: ReservationSpec | None, *, error: str, held: bool = False
) -> None:
    """Note how the booking stands in Slurm; `held`: Slurm has its reservation (an update of
    it failed). One Slurm never held, well after its start, is ended and refunded."""
    if error and not held and not reservation.is_maintenance:
        now = timezone.now()
        if reservation.start <= now - UNHONOURED_AFTER:
            # Slurm never held it: the booking ends and everything it cost comes back.
            reservation_refund_unhonoured(reservation_id=reservation.pk, reason=error)
            return
    defaults: dict[str, object] = {"error": error, "synced_at": timezone.now()}
    if spec is not None:
        defaults.update(spec=spec.key() if not error else "", granularity=spec.granularity)
    SlurmReservation.objects.update_or_create(
        reservation=reservation,
        defaults={"name": reservation_name(reservation.pk), **defaults},
    )
