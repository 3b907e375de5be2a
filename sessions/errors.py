"""Why the proxy opens no path to a job: each maps to one HTTP status and one WebSocket close code."""

from __future__ import annotations

from core.errors import DomainError, NotAllowed


class NotSignedIn(DomainError):
    code = "not_signed_in"
    status_code = 401
    close_code = 4401


class NotYours(NotAllowed):
    code = "not_yours"
    close_code = 4403


class NoSuchSession(DomainError):
    code = "not_found"
    status_code = 404
    close_code = 4404


class NotReachable(DomainError):
    code = "not_reachable"
    status_code = 503
    close_code = 4503


class BadOrigin(NotAllowed):
    code = "bad_origin"
    close_code = 4403
