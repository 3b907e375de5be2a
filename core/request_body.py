"""Views that take request bodies larger than LABPORTAL_MAX_REQUEST_BYTES (file uploads).

``labportal.middleware.BoundedRequestBodyMiddleware`` refuses a large body from its
Content-Length before anything reads it; a view marked here states its own limit and
the refusal over it, which the middleware applies instead, still before the body is read.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

View = TypeVar("View", bound=Callable[..., Any])


def takes_bodies_up_to(
    limit: Callable[[], int], too_large: Callable[[int], str]
) -> Callable[[View], View]:
    """``limit()`` is the largest body in bytes; ``too_large(size)`` says why a larger one is refused."""

    def mark(view: View) -> View:
        view.body_limit = limit  # type: ignore[attr-defined]
        view.body_too_large = too_large  # type: ignore[attr-defined]
        return view

    return mark


def body_limit_of(view: Any) -> tuple[Callable[[], int], Callable[[int], str]] | None:
    limit, too_large = getattr(view, "body_limit", None), getattr(view, "body_too_large", None)
    if limit is None or too_large is None:
        return None
    return limit, too_large


def form_checks_nul_in(*fields: str) -> Callable[[View], View]:
    """The page's form refuses a NUL character in these text fields itself (Django's
    CharField does: "Null characters are not allowed."), so that the member keeps what
    they typed, with the error by the field; a NUL anywhere else is still refused by
    ``labportal.middleware.RejectNulCharactersMiddleware`` before the view runs."""

    def mark(view: View) -> View:
        view.nul_checked_fields = frozenset(fields)  # type: ignore[attr-defined]
        return view

    return mark


def nul_checked_fields_of(view: Any) -> frozenset[str]:
    return frozenset(getattr(view, "nul_checked_fields", ()))
