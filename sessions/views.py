"""The session pages: start one, watch it start, open it; a terminal in any running job."""

from __future__ import annotations

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.utils.translation import gettext as _

from accounts.auth import request_user
from core.errors import DomainError
from core.form_pages import form_page_status
from jobqueue.models import Job
from sessions import services
from sessions.errors import NoSuchSession, NotYours
from sessions.forms import SessionStartForm
from sessions.selectors import job_reachable_by
from sessions.status import session_status


@login_required
def session_list(request: HttpRequest) -> HttpResponse:
    user = request_user(request)
    sessions = (
        Job.objects.filter(owner=user)
        .exclude(kind=Job.Kind.BATCH)
        .select_related("queue", "node")
        .order_by("-submitted_at")[:50]
    )
    return render(request, "sessions/list.html", {"sessions": sessions})


@login_required
def session_new(request: HttpRequest) -> HttpResponse:
    user = request_user(request)
    form = SessionStartForm(request.POST or None, user=user)
    if request.method == "POST" and form.is_valid():
        try:
            job = services.session_start(owner=user, **form.start_arguments())
        except DomainError as exc:
            form.add_error(None, str(exc.message))
        else:
            messages.success(request, _("Session #%(id)d is queued.") % {"id": job.pk})
            return redirect("session_detail", pk=job.pk)
    return render(
        request, "sessions/new.html", {"form": form}, status=form_page_status(request, form)
    )


def _job_for(request: HttpRequest, pk: int) -> Job:
    try:
        return job_reachable_by(request_user(request), pk)
    except NoSuchSession:
        raise Http404 from None
    except NotYours:
        raise PermissionDenied from None


@login_required
def session_detail(request: HttpRequest, pk: int) -> HttpResponse:
    job = _job_for(request, pk)
    if not job.is_session:
        return redirect("job_detail", pk=job.pk)
    context = _status_context(request, job)
    return render(request, "sessions/detail.html", context)


@login_required
def session_status_view(request: HttpRequest, pk: int) -> HttpResponse:
    """The live part of the session page (htmx polls it); 286 stops the polling."""
    job = _job_for(request, pk)
    context = _status_context(request, job)
    done = job.is_final or context["ready"]
    return render(request, "sessions/_status.html", context, status=286 if done else 200)


def _status_context(request: HttpRequest, job: Job) -> dict[str, object]:
    ready = False
    if job.state == Job.State.RUNNING:
        ready = session_status(job, username=request_user(request).username, activity=False).ready
    return {"job": job, "ready": ready}


@login_required
def terminal_page(request: HttpRequest, pk: int) -> HttpResponse:
    job = _job_for(request, pk)
    response = render(request, "sessions/terminal.html", {"job": job})
    if settings.LABPORTAL_CONTENT_SECURITY_POLICY:
        response["Content-Security-Policy"] = settings.LABPORTAL_TERMINAL_CONTENT_SECURITY_POLICY
    return response
