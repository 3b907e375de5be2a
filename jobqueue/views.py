from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.paginator import Paginator
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.utils import timezone
from django.utils.translation import gettext as _
from django.views.decorators.http import require_POST

from accounts.auth import request_user
from accounts.selectors import credits_charged_for_job
from core.errors import DomainError
from core.form_pages import form_page_status
from jobqueue import executor, selectors, services, submit
from jobqueue.extensions import job_page_context
from jobqueue.forms import JobSubmitForm
from jobqueue.models import Job, SchedulingPolicy


@login_required
def job_submit(request: HttpRequest) -> HttpResponse:
    user = request_user(request)
    # Links (e.g. the first-steps checklist) may prefill a few fields: ?queue=debug&command=...
    prefill = {
        k: v for k, v in request.GET.items() if k in ("queue", "command", "time_limit_hours")
    }
    form = JobSubmitForm(request.POST or None, user=user, initial=prefill)
    if request.method == "POST" and form.is_valid():
        data = form.cleaned_data
        hours = data["time_limit_hours"]
        try:
            job = submit.job_submit(
                owner=user,
                queue=data["queue"],
                image=data["image"].reference,
                command=data["command"],
                gpus=data["gpus"],
                shared_slot=data["shared_slot"],
                env=data["env"],
                mounts=[m.name for m in data.get("mounts", [])],
                time_limit_s=int(hours * 3600) if hours else None,
                min_gpu_memory_mb=(data["min_gpu_memory_gb"] or 0) * 1024,
                gpu_model=data["gpu_model"],
                cpus=data["cpus"],
                memory_mb=data["memory_gb"] * 1024,
                name=data["name"],
                reservation_id=data["reservation"],
                preemptible=data["preemptible"],
                **_dependency_arguments(data.get("run_after")),
            )
        except DomainError as exc:
            form.add_error(None, str(exc.message))
        else:
            messages.success(request, _("Job #%(id)d submitted.") % {"id": job.pk})
            return redirect("job_detail", pk=job.pk)
    return render(
        request, "jobqueue/submit.html", {"form": form}, status=form_page_status(request, form)
    )


@login_required
def job_list(request: HttpRequest) -> HttpResponse:
    jobs = selectors.jobs_filtered(
        Job.objects.filter(owner=request_user(request)).select_related("queue", "node"),
        state=request.GET.get("state") or None,
    )
    page = Paginator(jobs, 50).get_page(request.GET.get("page"))
    return render(
        request,
        "jobqueue/job_list.html",
        {"page": page, "states": Job.State.choices, "state": request.GET.get("state", "")},
    )


@login_required
def queue_overview(request: HttpRequest) -> HttpResponse:
    template = (
        "jobqueue/_queue_tables.html"
        if request.headers.get("HX-Request")
        else "jobqueue/queue.html"
    )
    page = _page_number(request.GET.get("page"))
    context = selectors.queue_overview(
        waiting_offset=(page - 1) * QUEUE_PAGE_SIZE, waiting_limit=QUEUE_PAGE_SIZE, for_page=True
    )
    total = context["waiting_total"]
    context.update(
        page=page,
        first_shown=min(total, context["waiting_offset"] + 1),
        last_shown=context["waiting_offset"] + len(context["waiting"]),
        previous_page=page - 1 if page > 1 else None,
        next_page=page + 1 if page * QUEUE_PAGE_SIZE < total else None,
    )
    return render(request, template, context)


QUEUE_PAGE_SIZE = 100  # waiting jobs per page: a busy lab has thousands


def _page_number(raw: str | None) -> int:
    try:
        return max(1, int(raw or 1))
    except ValueError:
        return 1


@login_required
def job_detail(request: HttpRequest, pk: int) -> HttpResponse:
    job = get_object_or_404(selectors.jobs_visible_to(request.user), pk=pk)
    executor.current().job_output(job, refresh=False)
    context = {
        "job": job,
        "credits_charged": credits_charged_for_job(job.pk) if job.is_final else None,
        "events": job.events.all(),
        "allocations": job.allocations.select_related("gpu"),
        "now": timezone.now(),
        "hard_stop_at": _hard_stop_at(job),
        # The apps above add theirs: the job's alerts, what Slurm says of it.
        **job_page_context(job),
    }
    if request.headers.get("HX-Request"):
        # 286 tells htmx to stop polling once the job has ended.
        return render(
            request, "jobqueue/_job_live.html", context, status=286 if job.is_final else 200
        )
    return render(request, "jobqueue/job_detail.html", context)


def _hard_stop_at(job: Job) -> datetime | None:
    """When the admin's hard limit stops this running job; None where the policy only warns."""
    grace = SchedulingPolicy.current().hard_limit_grace_s
    if job.expected_end is None or grace is None:
        return None
    return job.expected_end + timedelta(seconds=grace)


@login_required
@require_POST
def job_cancel(request: HttpRequest, pk: int) -> HttpResponse:
    user = request_user(request)
    job = get_object_or_404(selectors.jobs_visible_to(user), pk=pk)
    try:
        services.job_cancel(job_id=job.pk, actor=user)
    except DomainError as exc:
        messages.error(request, str(exc.message))
    else:
        messages.success(request, _("Cancel requested for job #%(id)d.") % {"id": job.pk})
    return redirect("job_detail", pk=job.pk)


@login_required
@require_POST
def job_refresh_logs(request: HttpRequest, pk: int) -> HttpResponse:
    job = get_object_or_404(selectors.jobs_visible_to(request.user), pk=pk)
    if job.state in Job.ACTIVE_STATES:
        executor.current().job_output(job, refresh=True)
        messages.info(
            request, _("Asked the node for the latest log lines; they appear in a few seconds.")
        )
    return redirect("job_detail", pk=job.pk)


def _dependency_arguments(run_after: tuple[str, list[int]] | None) -> dict[str, Any]:
    """job_submit's dependency arguments from the form's "Run after" (afterok:12:13)."""
    if run_after is None:
        return {}
    kind, ids = run_after
    return {"dependency": kind, "depends_on": ids}
