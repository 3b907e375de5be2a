"""Named refusals of the jobs services; each message says what to change."""

from __future__ import annotations

from core.errors import DomainError, NotAllowed


class JobRefused(DomainError):
    """A submission that cannot be accepted as it is."""

    code = "job_refused"


class QueueNotFound(JobRefused):
    code = "unknown_queue"


class ImageNotAllowed(JobRefused):
    code = "image_not_allowed"


class MountNotAllowed(JobRefused):
    code = "mount_not_allowed"


class TimeLimitTooLong(JobRefused):
    code = "time_limit_too_long"


class TooManyGpus(JobRefused):
    code = "too_many_gpus"


class QuotaExceeded(JobRefused):
    code = "quota_exceeded"
    status_code = 429


class GrantRequired(JobRefused):
    code = "grant_required"
    status_code = 403


class ReservationNotUsable(JobRefused):
    code = "reservation_not_usable"


class InvalidTransition(DomainError):
    """The job is not in a state that allows the action."""

    code = "invalid_state"
    status_code = 409


class NotJobOwner(NotAllowed):
    code = "not_job_owner"
