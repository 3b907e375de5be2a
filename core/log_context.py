"""Structured logs: one JSON object a line (LOG_FORMAT=json), each record carrying the
request id, the member and the job it concerns, as operators feed them to Loki or ELK.

The context is kept in context variables, set by RequestContextMiddleware for a request
(the id from a proxy's X-Request-ID, or a new one, echoed in the response) and by a Celery
signal for a task (its id, and the job id a task is given). A record's own ``extra``
(``logger.info(..., extra={"job_id": 7})``) wins over the context.
"""

from __future__ import annotations

import contextvars
import json
import logging
import re
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from django.core.signals import request_finished
from django.http import HttpRequest, HttpResponse

request_id: contextvars.ContextVar[str | None] = contextvars.ContextVar("request_id", default=None)
user_name: contextvars.ContextVar[str | None] = contextvars.ContextVar("user_name", default=None)
job_id: contextvars.ContextVar[int | None] = contextvars.ContextVar("job_id", default=None)
task_id: contextvars.ContextVar[str | None] = contextvars.ContextVar("task_id", default=None)
# The request being served: its member is named once authentication loaded it (never
# loaded for the log: a record must not query the database, which may be the thing down).
current_request: contextvars.ContextVar[HttpRequest | None] = contextvars.ContextVar(
    "current_request", default=None
)

# A proxy's id is kept only if it looks like one (no newlines or quotes into the logs).
REQUEST_ID_RE = re.compile(r"^[A-Za-z0-9._:-]{8,128}$")
_CONTEXT: dict[str, contextvars.ContextVar[Any]] = {
    "request_id": request_id,
    "user": user_name,
    "job_id": job_id,
    "task_id": task_id,
}
# The attributes every LogRecord has; anything else on a record came from ``extra``.
_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    """A record as one line of JSON: time (UTC, ISO 8601), level, logger, message, the
    context (request id, user, job id, task id) where known, extras, and the traceback."""

    def format(self, record: logging.LogRecord) -> str:
        event: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, var in _CONTEXT.items():
            value = var.get()
            if value is not None:
                event[key] = value
        if "user" not in event:
            loaded = getattr(current_request.get(), "_cached_user", None)
            if loaded is not None and loaded.is_authenticated:
                event["user"] = loaded.get_username()
        for key, value in vars(record).items():
            if key not in _STANDARD and not key.startswith("_"):
                event[key] = value if isinstance(value, str | int | float | bool) else str(value)
        if record.exc_info:
            event["exception"] = self.formatException(record.exc_info)
        return json.dumps(event, ensure_ascii=False)


class RequestContextMiddleware:
    """Sets the request's id (and, once authentication loaded them, the member) for every log
    record made while it is served, and answers X-Request-ID so a member's report can be
    found in the logs."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        given = request.headers.get("X-Request-ID", "")
        rid = given if REQUEST_ID_RE.match(given) else uuid.uuid4().hex
        # Kept after the response: Django logs a 4xx/5xx answer once the middleware returned
        # (django.request), and it must carry the id. The next request sets its own;
        # request_finished clears them (clear_context).
        request_id.set(rid)
        user_name.set(None)
        job_id.set(None)
        current_request.set(request)
        response = self.get_response(request)
        response["X-Request-ID"] = rid
        return response


def task_context_from(*, task_id_value: str | None, kwargs: dict[str, Any] | None) -> None:
    """A Celery task's context: its id, and the job it is about (tasks take ``job_id``)."""
    task_id.set(task_id_value)
    value = (kwargs or {}).get("job_id")
    job_id.set(value if isinstance(value, int) else None)
    request_id.set(None)
    user_name.set(None)


def clear_context(**_: Any) -> None:
    """Connected to request_finished: records made after a request carry none of its context."""
    for var in _CONTEXT.values():
        var.set(None)
    current_request.set(None)


request_finished.connect(clear_context, dispatch_uid="labportal-log-context")
