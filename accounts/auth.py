"""The signed-in member of a request, typed as `User`."""

from __future__ import annotations

from django.http import HttpRequest
from rest_framework.request import Request

from accounts.models import User


def request_user(request: HttpRequest | Request) -> User:
    """`request.user` of a request that a login check has already let through.

    Pages behind `@login_required` (or the admin) and API views behind
    `IsAuthenticated` never see an anonymous user, but the stubs type
    `request.user` as `User | AnonymousUser`; this narrows it at the boundary.
    """
    user = request.user
    assert isinstance(user, User), "request_user() needs an authenticated request"
    return user
