"""Records the tutorial's steps that leave no data of their own: a member opened the page
of one of their jobs, read the log of one of their finished jobs (its page, the log the
page loads, or the download) and opened My credits. Only successful answers count, only
the member's own jobs, and each step once: after that the session remembers it and the
request costs nothing more."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.http import HttpRequest, HttpResponse

from handbook.services import tutorial_view_record
from jobqueue.models import Job

SESSION_KEY = "tutorial_viewed"
JOB_PAGES = {"job_detail", "job-log", "job-log-download"}


class TutorialStepMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        response = self.get_response(request)
        match = getattr(request, "resolver_match", None)
        user = getattr(request, "user", None)
        if (
            match is None
            or response.status_code != 200
            or request.method != "GET"
            or user is None
            or not user.is_authenticated
            or (match.url_name not in JOB_PAGES and match.url_name != "credits")
        ):
            return response
        session = getattr(request, "session", None)
        done: list[str] = list(session.get(SESSION_KEY, [])) if session is not None else []
        steps = self._steps(match.url_name, match.kwargs, user, done)
        for step in steps:
            tutorial_view_record(user=user, step=step)
        if steps and session is not None:
            session[SESSION_KEY] = sorted({*done, *steps})
        return response

    @staticmethod
    def _steps(url_name: str, kwargs: dict[str, Any], user: Any, done: list[str]) -> list[str]:
        if url_name == "credits":
            return [] if "credits" in done else ["credits"]
        wanted = [s for s in ("job_page", "job_log") if s not in done]
        if not wanted:
            return []
        state = Job.objects.filter(pk=kwargs.get("pk", 0), owner=user).values_list(
            "state", flat=True
        )
        found = state.first()
        if found is None:
            return []
        steps = ["job_page"] if url_name == "job_detail" and "job_page" in wanted else []
        if "job_log" in wanted and found in Job.FINAL_STATES:
            steps.append("job_log")
        return steps
