"""Named refusals of the reservation services."""

from __future__ import annotations

from typing import TYPE_CHECKING

from django.utils.functional import Promise

from core.errors import DomainError, NotAllowed

if TYPE_CHECKING:
    from reservations.slotfinder import FreeSlot


class ReservationError(DomainError):
    """A refusal that may carry the nearest free slot the member could book instead."""

    def __init__(self, message: str | Promise, *, suggestion: FreeSlot | None = None) -> None:
        if suggestion is not None:
            message = f"{message} {suggestion.describe()}"
        super().__init__(message)
        self.suggestion = suggestion


class ReservationConflict(ReservationError):
    code = "reservation_conflict"
    status_code = 409


class BookingRuleViolation(ReservationError):
    code = "booking_rule"


class GpuNotBookable(ReservationError):
    code = "gpu_not_bookable"


class BookingNotHonoured(ReservationError):
    """The executor cannot hold these GPUs for their owner (Slurm reserves whole nodes)."""

    code = "booking_not_honoured"


class ReservationStateError(ReservationError):
    code = "reservation_state"
    status_code = 409


__all__ = [
    "BookingNotHonoured",
    "BookingRuleViolation",
    "GpuNotBookable",
    "NotAllowed",
    "ReservationConflict",
    "ReservationError",
    "ReservationStateError",
]
