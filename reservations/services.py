"""Reservation workflows: booking, cancelling, releasing, extending, and the slot boundaries.

Credits: a booking is charged in full when it is made (GPU-hours x the reservation
rate, fixed on the booking). Cancelling before the start refunds everything;
releasing early refunds the unused time from the next slot boundary on. A no-show
keeps its charge (it was paid at booking, as Slurm charges unused reserved time)
and the owner is told. Maintenance bookings cost nothing.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from django.db import IntegrityError, OperationalError, transaction
from django.db.models import Max, Q, QuerySet
from django.utils import formats, timezone
from django.utils.translation import gettext as _
from django.utils.translation import gettext_noop, ngettext

from accounts import services as account_services
from accounts.models import CREDIT_QUANTUM, CreditPolicy
from core.moments import when_with_zone
from jobqueue import executor
from jobqueue import services as job_services
from reservations.errors import (
    BookingNotHonoured,
    BookingRuleViolation,
    GpuNotBookable,
    NotAllowed,
    ReservationConflict,
    ReservationStateError,
)
from reservations.models import BookingRule, BookingRules, Reservation, ReservationSlot, gpu_hours
from reservations.slotfinder import FreeSlot, bookable_gpus, free_slot_earliest
from reservations.timegrid import ceil_to_grid, floor_to_grid, is_on_grid, overlap, weeks_touching
from telemetry.models import GpuSample

if TYPE_CHECKING:
    from jobqueue.models import Job

# Staff book over the category rules, within these bounds: a start up to a day back (to
# record maintenance already under way) and an end within a year. A booking from 1970
# was accepted and charged 1.14 M credits.
STAFF_BACKDATE = timedelta(days=1)
STAFF_HORIZON = timedelta(days=366)
# A GPU counts as used when a sample of it shows at least this utilisation.
NO_SHOW_UTIL_PCT = 5.0


# --- Contracts with accounts and jobqueue ---------------------------------------------


def credit_policy_reservation_rate() -> Decimal:
    return Decimal(str(CreditPolicy.current().reservation_rate))


def credit_policy_no_show_minutes() -> int:
    return int(CreditPolicy.current().no_show_window_minutes)


# --- Helpers ----------------------------------------------------------------------------


def _when(moment: datetime) -> str:
    return when_with_zone(moment)


def _number(value: Decimal) -> str:
    return format(value.normalize(), "f")


def _reservation_url(reservation: Reservation) -> str:
    from django.urls import reverse

    return reverse("reservation_list") + f"#reservation-{reservation.pk}"


def _check_may_act(reservation: Reservation, actor: Any) -> None:
    if actor is None or actor.is_staff or actor.pk == reservation.user_id:
        return
    raise NotAllowed(_("Only the owner or an admin may change this reservation."))


def _locked(reservation_id: int) -> Reservation:
    try:
        return Reservation.objects.select_for_update().get(pk=reservation_id)
    except Reservation.DoesNotExist:
        raise ReservationStateError(_("This reservation does not exist.")) from None


def _suggest(
    *,
    gpu_count: int,
    length: timedelta,
    after: datetime,
    rules: BookingRules,
    now: datetime,
    node_id: int | None = None,
    gpu_ids: list[int] | None = None,
    exclude_reservation_id: int | None = None,
) -> FreeSlot | None:
    """The nearest bookable alternative for a refusal: the same GPUs first, then any on the node."""
    horizon_end = now + timedelta(days=max(rules.max_days_ahead, 1))

    def earliest(count: int, **where: Any) -> FreeSlot | None:
        return free_slot_earliest(
            gpu_count=count,
            length=length,
            after=max(after, now),
            granularity=rules.granularity,
            horizon_end=horizon_end,
            now=now,
            exclude_reservation_id=exclude_reservation_id,
            # A booking may overlap a running job's time limit; suggestions need not avoid it.
            include_running_jobs=False,
            **where,
        )

    if gpu_ids:
        found = earliest(len(gpu_ids), gpu_ids=gpu_ids)
        if found is not None:
            return found
    return earliest(gpu_count, node_id=node_id)


def _check_rules(
    *,
    user: Any,
    rules: BookingRules,
    gpu_count: int,
    start: datetime,
    end: datetime,
    now: datetime,
    exclude_reservation_id: int | None = None,
    new_start: datetime | None = None,
) -> None:
    """Category rules for a booking [start, end); `new_start` marks where new hours begin (extend)."""
    new_start = new_start or start
    if gpu_count > rules.max_gpus_per_booking:
        raise BookingRuleViolation(
            ngettext(
                "Your category may book at most %(max)d GPU at once; you asked for %(asked)d.",
                "Your category may book at most %(max)d GPUs at once; you asked for %(asked)d.",
                rules.max_gpus_per_booking,
            )
            % {"max": rules.max_gpus_per_booking, "asked": gpu_count}
        )
    minutes = int(rules.granularity.total_seconds() // 60)
    if not (is_on_grid(start, rules.granularity) and is_on_grid(end, rules.granularity)):
        raise BookingRuleViolation(
            _("Start and end must fall on the %(minutes)d-minute grid (e.g. %(example)s).")
            % {"minutes": minutes, "example": _when(ceil_to_grid(start, rules.granularity))}
        )
    length = end - start
    if length < rules.min_length:
        raise BookingRuleViolation(
            ngettext(
                "A booking must last at least %(minutes)d minute.",
                "A booking must last at least %(minutes)d minutes.",
                int(rules.min_length.total_seconds() // 60),
            )
            % {"minutes": int(rules.min_length.total_seconds() // 60)}
        )
    if length > rules.max_length:
        raise BookingRuleViolation(
            ngettext(
                "A booking may last at most %(hours)d hour; split longer work into several bookings.",
                "A booking may last at most %(hours)d hours; split longer work into several bookings.",
                int(rules.max_length.total_seconds() // 3600),
            )
            % {"hours": int(rules.max_length.total_seconds() // 3600)}
        )
    latest = now + timedelta(days=rules.max_days_ahead)
    if end > latest:
        raise BookingRuleViolation(
            ngettext(
                "Your category may book at most %(days)d day ahead, so until %(latest)s.",
                "Your category may book at most %(days)d days ahead, so until %(latest)s.",
                rules.max_days_ahead,
            )
            % {"days": rules.max_days_ahead, "latest": _when(latest)}
        )
    counted = Reservation.objects.counted_against_quota().filter(user=user)
    if exclude_reservation_id is not None:
        counted = counted.exclude(pk=exclude_reservation_id)
    for week_begin, week_end in weeks_touching(new_start, end):
        used = Decimal(0)
        for other in counted.filter(start__lt=week_end, end__gt=week_begin).prefetch_related(
            "gpus"
        ):
            used += gpu_hours(
                len(other.gpus.all()), overlap(other.start, other.end, week_begin, week_end)
            )
        if exclude_reservation_id is not None:
            # Extending: the booking's existing hours in this week count as used too.
            used += gpu_hours(gpu_count, overlap(start, new_start, week_begin, week_end))
        needed = gpu_hours(gpu_count, overlap(new_start, end, week_begin, week_end))
        if used + needed > rules.max_gpu_hours_per_week:
            raise BookingRuleViolation(
                _(
                    "This needs %(needed)s GPU-hours in the week of %(week)s, but you have "
                    "%(used)s of your %(cap)s GPU-hours for that week booked already."
                )
                % {
                    "needed": _number(needed),
                    "week": formats.date_format(week_begin, "SHORT_DATE_FORMAT"),
                    "used": _number(used),
                    "cap": _number(rules.max_gpu_hours_per_week),
                }
            )


def _lost_slot_race(error: Exception) -> bool:
    """Whether writing slot rows failed because another booking took the time first.

    The exclusion constraint refuses an overlap with a committed slot (IntegrityError). When
    two bookings write overlapping slots at the same moment, each one's constraint check waits
    for the other's uncommitted row, and PostgreSQL breaks that deadlock by aborting one of
    them (SQLSTATE 40P01): that one lost the race as surely as if the other had committed first.
    """
    if isinstance(error, IntegrityError):
        return True
    cause = error.__cause__
    return isinstance(error, OperationalError) and getattr(cause, "sqlstate", None) == "40P01"


def _insert_slots(reservation: Reservation, gpu_ids: list[int]) -> None:
    """Writes the slot rows; on PostgreSQL the exclusion constraint refuses a racing overlap."""
    try:
        with transaction.atomic():
            ReservationSlot.objects.bulk_create(
                ReservationSlot(
                    reservation=reservation,
                    gpu_id=gpu_id,
                    start=reservation.start,
                    end=reservation.end,
                )
                for gpu_id in gpu_ids
            )
    except (IntegrityError, OperationalError) as error:
        if not _lost_slot_race(error):
            raise
        raise ReservationConflict(
            _("Someone else booked one of these GPUs for an overlapping time a moment ago.")
        ) from None


# --- Booking ----------------------------------------------------------------------------


@transaction.atomic
def reservation_create(
    *,
    user: Any,
    start: datetime,
    end: datetime,
    gpu_ids: list[int] | None = None,
    node: Any = None,
    gpu_count: int | None = None,
    note: str = "",
    maintenance: bool = False,
) -> Reservation:
    """Books whole GPUs (by id, or `gpu_count` of `node`) for [start, end) and charges for them.

    Staff book over the category rules and may mark maintenance. Raises a ReservationError
    that says why, with the nearest free slot where there is one.
    """
    from cluster.models import Node

    user.lock_for_limits()
    now = timezone.now()
    rules = BookingRule.for_user(user)
    if maintenance and not user.is_staff:
        raise NotAllowed(_("Only admins may book maintenance."))
    if (gpu_ids is None) == (node is None):
        raise BookingRuleViolation(_("Choose either GPUs, or a node and a number of GPUs."))
    if end <= start:
        raise BookingRuleViolation(_("The end must be after the start."))
    current_slot = floor_to_grid(now, rules.granularity)
    if start < current_slot and not user.is_staff:
        raise BookingRuleViolation(_("The start is in the past; choose a time from now on."))
    if start < current_slot - STAFF_BACKDATE:
        raise BookingRuleViolation(
            _("The start is more than a day in the past; choose a time from yesterday on.")
        )
    if end > now + STAFF_HORIZON:
        raise BookingRuleViolation(
            _("The end is more than a year ahead; book at most a year in advance.")
        )
    if end <= now:
        raise BookingRuleViolation(_("The slot is already over; choose a time from now on."))

    node_id: int | None = None
    if node is not None:
        node_id = node.pk if isinstance(node, Node) else int(node)
        if not gpu_count or gpu_count < 1:
            raise BookingRuleViolation(_("Book at least one GPU."))
        count = gpu_count
    else:
        gpu_ids = sorted(set(gpu_ids or []))
        if not gpu_ids:
            raise BookingRuleViolation(_("Book at least one GPU."))
        count = len(gpu_ids)

    if not user.is_staff:
        _check_rules(user=user, rules=rules, gpu_count=count, start=start, end=end, now=now)

    if node_id is not None:
        candidates = list(bookable_gpus().filter(node_id=node_id).order_by("index"))
        taken = set(
            ReservationSlot.objects.filter(
                gpu__in=candidates, live=True, start__lt=end, end__gt=start
            ).values_list("gpu_id", flat=True)
        )
        free = [g.pk for g in candidates if g.pk not in taken]
        if len(free) < count:
            if not candidates:
                raise GpuNotBookable(_("This node is not up, or has no bookable GPUs."))
            raise ReservationConflict(
                ngettext(
                    "Only %(free)d of the %(asked)d GPU is free on this node then.",
                    "Only %(free)d of the %(asked)d GPUs are free on this node then.",
                    count,
                )
                % {"free": len(free), "asked": count},
                suggestion=_suggest(
                    gpu_count=count,
                    length=end - start,
                    after=start,
                    rules=rules,
                    now=now,
                    node_id=node_id,
                ),
            )
        gpu_ids = free[:count]
    else:
        assert gpu_ids is not None
        bookable = set(bookable_gpus().filter(pk__in=gpu_ids).values_list("pk", flat=True))
        if bookable != set(gpu_ids):
            raise GpuNotBookable(
                _(
                    "Only whole, available GPUs on nodes that are up can be booked; GPU %(ids)s cannot."
                )
                % {"ids": ", ".join(str(i) for i in sorted(set(gpu_ids) - bookable))}
            )
        if Reservation.objects.overlapping(gpu_ids=gpu_ids, start=start, end=end).exists():
            raise ReservationConflict(
                _("These GPUs are already booked for part of that time."),
                suggestion=_suggest(
                    gpu_count=count,
                    length=end - start,
                    after=start,
                    rules=rules,
                    now=now,
                    gpu_ids=gpu_ids,
                ),
            )

    refusal = executor.current().booking_refusal(
        user=user, gpu_ids=list(gpu_ids), maintenance=maintenance
    )
    if refusal:
        raise BookingNotHonoured(refusal)
    rate = Decimal(0) if maintenance else credit_policy_reservation_rate()
    reservation = Reservation.objects.create(
        user=user,
        start=start,
        end=end,
        note=note,
        is_maintenance=maintenance,
        credit_rate=rate,
    )
    reservation.gpus.set(gpu_ids)
    _insert_slots(reservation, gpu_ids)
    # Time already past when it is booked is not charged (a release refunds from the
    # next slot boundary, so a charge for the past would never come back).
    charged_from = max(start, current_slot)
    cost = (gpu_hours(len(gpu_ids), end - charged_from) * rate).quantize(CREDIT_QUANTUM)
    if cost > 0:
        account_services.ledger_post(
            user=user,
            amount=-cost,
            kind="reservation",
            idempotency_key=f"reservation:{reservation.pk}:book",
            reservation=reservation,
            note=gettext_noop("Booking of %(count)d GPUs, %(start)s – %(end)s"),
            note_params={"count": len(gpu_ids), "start": start, "end": end},
            created_by=user,
        )
        reservation.charged = cost
        reservation.save(update_fields=["charged"])
    return reservation


@transaction.atomic
def reservation_cancel(*, reservation_id: int, actor: Any) -> Reservation:
    """Cancels a booking that has not started yet and refunds all it cost."""
    reservation = _locked(reservation_id)
    _check_may_act(reservation, actor)
    now = timezone.now()
    if reservation.state == Reservation.State.CANCELLED:
        return reservation
    if not reservation.can_cancel(now):
        raise ReservationStateError(
            _(
                "This reservation has already started or ended; release it early instead to get the unused time back."
            )
        )
    _cancel_and_refund(
        reservation,
        now=now,
        why="cancel",
        note=gettext_noop("Cancelled booking refunded"),
        actor=actor,
    )
    return reservation


def _cancel_and_refund(
    reservation: Reservation, *, now: datetime, why: str, note: str, actor: Any = None
) -> None:
    """The booking ends now, unstarted or never held: its slots free, all it cost back."""
    reservation.state = Reservation.State.CANCELLED
    reservation.ended_at = now
    reservation.save(update_fields=["state", "ended_at"])
    reservation.slots.update(live=False)
    if reservation.charged > 0:
        account_services.ledger_post(
            user=reservation.user,
            amount=reservation.charged,
            kind="refund",
            idempotency_key=f"reservation:{reservation.pk}:refund:{why}",
            reservation=reservation,
            note=note,
            note_params={},
            created_by=actor,
        )
        reservation.charged = Decimal(0)
        reservation.save(update_fields=["charged"])


@transaction.atomic
def reservation_refund_unhonoured(*, reservation_id: int, reason: str) -> bool:
    """The executor never held this booking's GPUs (Slurm refused its reservation): it ends
    now, everything it cost is refunded and its owner is told why. Safe to repeat."""
    reservation = _locked(reservation_id)
    if reservation.state in (Reservation.State.CANCELLED, Reservation.State.RELEASED):
        return False
    _cancel_and_refund(
        reservation,
        now=timezone.now(),
        why="unhonoured",
        note=gettext_noop("Booking the cluster could not hold refunded"),
    )
    with account_services.in_language_of(reservation.user):
        account_services.notify(
            user=reservation.user,
            kind="reservation_unhonoured",
            title=_("Your booking could not be held"),
            body=_(
                "The cluster could not reserve the GPUs you booked from %(start)s (%(reason)s). "
                "The booking is cancelled and everything it cost is refunded; book again, or "
                "ask a lab admin."
            )
            % {"start": _when(reservation.start), "reason": reason[:200]},
            url=_reservation_url(reservation),
        )
    return True


@transaction.atomic
def reservation_release_early(*, reservation_id: int, actor: Any) -> Reservation:
    """Ends a running booking at the next slot boundary and refunds the time after it.

    A booking that has not started yet is cancelled instead (everything refunded).
    """
    reservation = _locked(reservation_id)
    _check_may_act(reservation, actor)
    now = timezone.now()
    if reservation.state == Reservation.State.RELEASED:
        return reservation
    if reservation.can_cancel(now):
        return reservation_cancel(reservation_id=reservation_id, actor=actor)
    if not reservation.can_release(now):
        raise ReservationStateError(
            _("Only a reservation that is running now can be released early.")
        )
    rules = BookingRule.for_user(reservation.user)
    new_end = min(ceil_to_grid(now, rules.granularity), reservation.end)
    if new_end <= reservation.start:
        # Released in its very first instant: the first grid step is still charged.
        new_end = min(reservation.start + rules.granularity, reservation.end)
    gpu_count = reservation.gpus.count()
    unused = (
        gpu_hours(gpu_count, reservation.end - new_end) if new_end < reservation.end else Decimal(0)
    )
    refund = min((unused * reservation.credit_rate).quantize(CREDIT_QUANTUM), reservation.charged)
    reservation.booked_end = reservation.end
    if new_end > reservation.start:
        reservation.end = new_end
    reservation.state = Reservation.State.RELEASED
    reservation.ended_at = now
    reservation.save(update_fields=["booked_end", "end", "state", "ended_at"])
    # Released GPUs are free for others straight away.
    reservation.slots.update(live=False, end=reservation.end)
    if refund > 0:
        account_services.ledger_post(
            user=reservation.user,
            amount=refund,
            kind="refund",
            idempotency_key=f"reservation:{reservation.pk}:refund:release",
            reservation=reservation,
            note=gettext_noop("Unused time of a booking released early (from %(from)s)"),
            note_params={"from": new_end},
            created_by=actor,
        )
        reservation.charged -= refund
        reservation.save(update_fields=["charged"])
    return reservation


@transaction.atomic
def reservation_extend(*, reservation_id: int, actor: Any, new_end: datetime) -> Reservation:
    """Moves a live booking's end later, if the GPUs are free and the rules allow; charges the extra."""
    reservation = _locked(reservation_id)
    _check_may_act(reservation, actor)
    now = timezone.now()
    if not reservation.can_extend(now):
        raise ReservationStateError(_("Only a booked or running reservation can be extended."))
    if new_end <= reservation.end:
        raise BookingRuleViolation(_("The new end must be after the current end."))
    user = reservation.user
    user.lock_for_limits()
    rules = BookingRule.for_user(user)
    gpu_ids = sorted(reservation.gpus.values_list("pk", flat=True))
    if not user.is_staff and not (actor is not None and actor.is_staff):
        _check_rules(
            user=user,
            rules=rules,
            gpu_count=len(gpu_ids),
            start=reservation.start,
            end=new_end,
            now=now,
            exclude_reservation_id=reservation.pk,
            new_start=reservation.end,
        )
    if set(bookable_gpus().filter(pk__in=gpu_ids).values_list("pk", flat=True)) != set(gpu_ids):
        raise GpuNotBookable(
            _("One of the booked GPUs is no longer available, so the booking cannot grow.")
        )
    clash = (
        Reservation.objects.overlapping(gpu_ids=gpu_ids, start=reservation.end, end=new_end)
        .exclude(pk=reservation.pk)
        .order_by("start")
        .first()
    )
    if clash is not None:
        raise ReservationConflict(
            _("Someone has booked these GPUs from %(start)s; you can extend until then.")
            % {"start": _when(clash.start)}
        )
    old_end = reservation.end
    reservation.end = new_end
    reservation.end_warned_at = None
    reservation.save(update_fields=["end", "end_warned_at"])
    try:
        with transaction.atomic():
            reservation.slots.update(end=new_end)
    except (IntegrityError, OperationalError) as error:
        if not _lost_slot_race(error):
            raise
        raise ReservationConflict(
            _("Someone booked these GPUs right after your slot a moment ago.")
        ) from None
    extra = (gpu_hours(len(gpu_ids), new_end - old_end) * reservation.credit_rate).quantize(
        CREDIT_QUANTUM
    )
    if extra > 0:
        account_services.ledger_post(
            user=user,
            amount=-extra,
            kind="reservation",
            idempotency_key=f"reservation:{reservation.pk}:extend:{old_end:%Y%m%dT%H%M%S}-{new_end:%Y%m%dT%H%M%S}",
            reservation=reservation,
            note=gettext_noop("Booking extended until %(end)s"),
            note_params={"end": new_end},
            created_by=actor,
        )
        reservation.charged += extra
        reservation.save(update_fields=["charged"])
    return reservation


# --- Boundaries (driven by beat; each claim is a filter(...).update(...)) -------------------


def jobs_running_in_reservation(reservation: Reservation) -> QuerySet[Job]:
    """Active jobs submitted with the booking, or of its owner on its GPUs."""
    from jobqueue.models import Job

    return (
        Job.objects.filter(state__in=Job.ACTIVE_STATES)
        .filter(
            Q(reservation=reservation)
            | Q(
                owner_id=reservation.user_id,
                allocations__active=True,
                allocations__gpu__in=reservation.gpus.all(),
            )
        )
        .distinct()
        .order_by("pk")
    )


def reservations_start_due(*, now: datetime) -> int:
    """Booked slots whose start has come: active, and the owner is told."""
    started = 0
    due = Reservation.objects.filter(state=Reservation.State.BOOKED, start__lte=now, end__gt=now)
    for reservation_id in due.values_list("pk", flat=True):
        with transaction.atomic():
            claimed = Reservation.objects.filter(
                pk=reservation_id, state=Reservation.State.BOOKED
            ).update(state=Reservation.State.ACTIVE, activated_at=now)
            if not claimed:
                continue
            reservation = Reservation.objects.select_related("user").get(pk=reservation_id)
            labels = ", ".join(g.label for g in reservation.gpus.select_related("node"))
            with account_services.in_language_of(reservation.user):
                account_services.notify(
                    user=reservation.user,
                    kind="reservation_started",
                    title=_("Your reservation has started: %(gpus)s") % {"gpus": labels},
                    body=_(
                        "The GPUs are yours until %(end)s. Submit jobs with this reservation so they run on them ahead of everything else."
                    )
                    % {"end": _when(reservation.end)},
                    url=_reservation_url(reservation),
                    email=False,
                )
            started += 1
    return started


def reservations_warn_ending(*, now: datetime) -> int:
    """Warns the owner once, shortly before the end, about jobs still running in the slot."""
    longest = BookingRule.objects.aggregate(m=Max("warn_before_end_minutes"))["m"] or 0
    window = timedelta(minutes=max(longest, 15))
    candidates = Reservation.objects.filter(
        state=Reservation.State.ACTIVE,
        end_warned_at__isnull=True,
        end__gt=now,
        end__lte=now + window,
    ).select_related("user", "user__category")
    warned = 0
    for reservation in candidates:
        rules = BookingRule.for_user(reservation.user)
        if reservation.end - rules.warn_before_end > now:
            continue
        with transaction.atomic():
            claimed = Reservation.objects.filter(
                pk=reservation.pk, end_warned_at__isnull=True
            ).update(end_warned_at=now)
            if not claimed:
                continue
            jobs = list(jobs_running_in_reservation(reservation))
            if not jobs:
                continue
            with account_services.in_language_of(reservation.user):
                if rules.end_policy == BookingRule.EndPolicy.STOP:
                    consequence = _(
                        "They will be stopped at the end of the slot (SIGTERM, then SIGKILL after a grace period)."
                    )
                else:
                    consequence = _(
                        "They may keep running, but other bookings and jobs may need the GPUs."
                    )
                account_services.notify(
                    user=reservation.user,
                    kind="reservation_ending",
                    title=ngettext(
                        "Your reservation ends at %(end)s; %(count)d job still runs in it",
                        "Your reservation ends at %(end)s; %(count)d jobs still run in it",
                        len(jobs),
                    )
                    % {"end": _when(reservation.end), "count": len(jobs)},
                    body=_("Jobs: %(jobs)s.") % {"jobs": ", ".join(f"#{j.pk}" for j in jobs)}
                    + " "
                    + consequence,
                    url=_reservation_url(reservation),
                )
            warned += 1
    return warned


def reservations_end_due(*, now: datetime) -> int:
    """Live slots whose end has passed: completed, and the end policy applied to jobs still in them."""
    ended = 0
    due = Reservation.objects.filter(state__in=Reservation.LIVE_STATES, end__lte=now)
    for reservation_id in due.values_list("pk", flat=True):
        with transaction.atomic():
            claimed = Reservation.objects.filter(
                pk=reservation_id, state__in=Reservation.LIVE_STATES
            ).update(state=Reservation.State.COMPLETED, ended_at=now)
            if not claimed:
                continue
            reservation = Reservation.objects.select_related("user", "user__category").get(
                pk=reservation_id
            )
            reservation.slots.update(live=False)
            rules = BookingRule.for_user(reservation.user)
            jobs = list(jobs_running_in_reservation(reservation))
            stopping = rules.end_policy == BookingRule.EndPolicy.STOP
            if stopping:
                for job in jobs:
                    job_services.job_request_stop(
                        job_id=job.pk,
                        reason=_("The reservation it ran in ended at %(end)s.")
                        % {"end": _when(reservation.end)},
                    )
            if jobs:
                with account_services.in_language_of(reservation.user):
                    title = (
                        ngettext(
                            "Your reservation ended; %(count)d job in it is being stopped",
                            "Your reservation ended; %(count)d jobs in it are being stopped",
                            len(jobs),
                        )
                        if stopping
                        else ngettext(
                            "Your reservation ended; %(count)d job in it keeps running",
                            "Your reservation ended; %(count)d jobs in it keep running",
                            len(jobs),
                        )
                    ) % {"count": len(jobs)}
                    account_services.notify(
                        user=reservation.user,
                        kind="reservation_ended",
                        title=title,
                        body=_("Jobs: %(jobs)s.") % {"jobs": ", ".join(f"#{j.pk}" for j in jobs)},
                        url=_reservation_url(reservation),
                    )
            ended += 1
    return ended


def reservation_was_used(reservation: Reservation, *, until: datetime) -> bool:
    """Whether the owner ran a job on the GPUs, or the GPUs were busy, in [start, until)."""
    from jobqueue.models import Allocation

    gpu_ids = list(reservation.gpus.values_list("pk", flat=True))
    if reservation.jobs.filter(started_at__isnull=False, started_at__lt=until).exists():
        return True
    if (
        Allocation.objects.filter(
            gpu_id__in=gpu_ids, job__owner_id=reservation.user_id, allocated_at__lt=until
        )
        .filter(Q(released_at__isnull=True) | Q(released_at__gt=reservation.start))
        .exists()
    ):
        return True
    return GpuSample.objects.filter(
        gpu_id__in=gpu_ids, ts__gte=reservation.start, ts__lt=until, util_pct__gte=NO_SHOW_UTIL_PCT
    ).exists()


def reservations_check_no_show(*, now: datetime) -> int:
    """Flags bookings unused in their first N minutes: the charge stands and the owner is told."""
    grace = timedelta(minutes=credit_policy_no_show_minutes())
    due = Reservation.objects.filter(
        state__in=[Reservation.State.ACTIVE, Reservation.State.COMPLETED],
        is_maintenance=False,
        no_show_checked_at__isnull=True,
        start__lte=now - grace,
    )
    flagged = 0
    for reservation_id in due.values_list("pk", flat=True):
        with transaction.atomic():
            claimed = Reservation.objects.filter(
                pk=reservation_id, no_show_checked_at__isnull=True
            ).update(no_show_checked_at=now)
            if not claimed:
                continue
            reservation = Reservation.objects.select_related("user").get(pk=reservation_id)
            if reservation_was_used(
                reservation, until=min(reservation.start + grace, reservation.end)
            ):
                continue
            Reservation.objects.filter(pk=reservation_id).update(no_show=True)
            with account_services.in_language_of(reservation.user):
                account_services.notify(
                    user=reservation.user,
                    kind="reservation_no_show",
                    title=_("Your reserved GPUs are unused"),
                    body=_(
                        "Nothing ran on the GPUs you booked from %(start)s in the first %(minutes)d minutes. "
                        "The booking stays charged; release it early to get the rest of the time refunded "
                        "and let others use the GPUs."
                    )
                    % {
                        "start": _when(reservation.start),
                        "minutes": int(grace.total_seconds() // 60),
                    },
                    url=_reservation_url(reservation),
                )
            flagged += 1
    return flagged


def reservations_tick(*, now: datetime | None = None) -> dict[str, int]:
    """One pass over every boundary; safe to run twice or concurrently."""
    now = now or timezone.now()
    return {
        "ended": reservations_end_due(now=now),
        "started": reservations_start_due(now=now),
        "warned": reservations_warn_ending(now=now),
        "no_shows": reservations_check_no_show(now=now),
    }
