from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.paginator import Paginator
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.utils import timezone
from django.utils.translation import gettext as _
from django.views.decorators.http import require_POST

from accounts.auth import request_user
from accounts.selectors import credits_charged_for_job
from core.errors import DomainError
from core.form_pages import form_page_status
from core.request_body import form_checks_nul_in
from jobqueue import arrays, executor, job_templates, resubmit, selectors, services, submit
from jobqueue.errors import GrantRequired
from jobqueue.extensions import job_page_context
from jobqueue.forms import JobSubmitForm
from jobqueue.models import Job, JobTemplate, SchedulingPolicy


@form_checks_nul_in("name", "command", "array", "env", "run_after", "save_as_name")
@login_required
def job_submit(request: HttpRequest) -> HttpResponse:
    user = request_user(request)
    # Links (e.g. the first-steps checklist) may prefill a few fields: ?queue=debug&command=...
    prefill: dict[str, Any] = {
        k: v for k, v in request.GET.items() if k in ("queue", "command", "time_limit_hours")
    }
    if request.GET.get("clone"):
        # "Clone and edit": a member's own job (staff: any) fills the form in.
        source = get_object_or_404(
            selectors.jobs_visible_to(user), pk=_page_id(request.GET["clone"])
        )
        prefill = resubmit.job_form_initial(source)
    elif request.GET.get("template"):
        picked = get_object_or_404(
            JobTemplate.objects.usable_by(user), pk=_page_id(request.GET["template"])
        )
        prefill = dict(picked.fields)
    form = JobSubmitForm(request.POST or None, user=user, initial=prefill)
    grant_required = False
    if request.method == "POST" and form.is_valid() and "save_template" in request.POST:
        template = _template_save(request, form)
        if template is not None:
            return redirect(f"{reverse('job_submit')}?template={template.pk}")
    elif request.method == "POST" and form.is_valid():
        spec, indices = form.submit_spec(), form.cleaned_data["array"]
        try:
            if indices:
                jobs = arrays.jobs_submit_array(owner=user, spec=spec, indices=indices)
            else:
                jobs = [submit.job_submit(owner=user, **spec)]
        except DomainError as exc:
            form.add_error(None, str(exc.message))
            grant_required = isinstance(exc, GrantRequired)
        else:
            if len(jobs) == 1:
                messages.success(request, _("Job #%(id)d submitted.") % {"id": jobs[0].pk})
            else:
                messages.success(
                    request,
                    _("%(count)d jobs submitted: #%(first)d–#%(last)d.")
                    % {"count": len(jobs), "first": jobs[0].pk, "last": jobs[-1].pk},
                )
            return redirect("job_detail", pk=jobs[0].pk)
    context = {
        "form": form,
        "grant_required": grant_required,
        "runs_in_containers": executor.current().runs_in_containers,
        "templates": JobTemplate.objects.usable_by(user).select_related("owner"),
    }
    return render(request, "jobqueue/submit.html", context, status=form_page_status(request, form))


def _page_id(raw: str) -> int:
    """A row id from the query string; anything else finds no row (a 404, not a 500)."""
    return int(raw) if raw.isdigit() else 0


def _template_save(request: HttpRequest, form: JobSubmitForm) -> JobTemplate | None:
    """Keep the form as the member's template; None (and the form says why) without a name."""
    name = form.cleaned_data["save_as_name"].strip()
    if not name:
        form.add_error("save_as_name", _("Give the template a name to save it under."))
        return None
    template, created = job_templates.job_template_save(
        owner=request_user(request), name=name, fields=form.template_fields()
    )
    if created:
        messages.success(request, _("Template “%(name)s” saved.") % {"name": template.name})
    else:
        messages.success(request, _("Template “%(name)s” updated.") % {"name": template.name})
    return template


@login_required
@require_POST
def job_template_delete(request: HttpRequest, pk: int) -> HttpResponse:
    # Only the member's own: lab-wide templates are the admins' (in the admin).
    template = get_object_or_404(JobTemplate, pk=pk, owner=request_user(request))
    template.delete()
    messages.success(request, _("Template “%(name)s” deleted.") % {"name": template.name})
    return redirect("job_submit")


@login_required
@require_POST
def job_submit_again(request: HttpRequest, pk: int) -> HttpResponse:
    user = request_user(request)
    job = get_object_or_404(selectors.jobs_visible_to(user), pk=pk)
    try:
        new = resubmit.job_submit_again(job=job, actor=user)
    except DomainError as exc:
        messages.error(request, str(exc.message))
        return redirect("job_detail", pk=job.pk)
    messages.success(
        request, _("Job #%(id)d submitted again as job #%(new)d.") % {"id": job.pk, "new": new.pk}
    )
    return redirect("job_detail", pk=new.pk)


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
        # Slurm mode: the jobs members submitted to Slurm directly hold GPUs and wait too.
        outside=executor.current().live_jobs_outside_portal(),
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
    """When the admin's hard limit stops this running job; None where the policy only warns.
    Where the executor schedules (Slurm), it ends the job at its time limit: no grace."""
    if not executor.portal_schedules():
        return job.expected_end
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
