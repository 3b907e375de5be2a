"""The reports pages: the usage report, its CSV tables and charts, replays and PDFs."""

from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.utils import translation
from django.utils.translation import gettext as _
from django.views.decorators.http import require_POST

from accounts.auth import request_user
from cluster.models import Gpu
from core.errors import DomainError
from reports import charts, services
from reports.errors import BadPeriod, BadReplay
from reports.forecast import Forecast, latest_forecast
from reports.models import DemandForecast, ReportTask
from reports.pdf import forecast_context, report_context
from reports.periods import Period, period_from_params
from reports.replay import lab_cluster, policy_knobs
from reports.selectors import usage_report
from reports.services import MAX_LABEL_CHARS
from reports.tables import table_by_slug


def _period_or_error(request: HttpRequest) -> tuple[Period, str | None]:
    try:
        return period_from_params(request.GET), None
    except BadPeriod as exc:
        return period_from_params({}), str(exc.message)


@login_required
def report_page(request: HttpRequest) -> HttpResponse:
    period, error = _period_or_error(request)
    if error:
        messages.error(request, error)
    user = request_user(request)
    context: dict[str, Any] = report_context(period=period, viewer=user)
    if not context["forecast_state"].current:
        # The page shows the last forecast (or says one is being computed); the control
        # worker fits the new one.
        services.forecast_refresh_enqueue(version=context["forecast_state"].version)
    context.update(
        weekly_chart_version=charts.remember_weekly_points(charts.weekly_points(context["report"])),
        params={
            "from": period.first_day.isoformat(),
            "to": period.last_day.isoformat(),
            **request.GET.dict(),
        },
        models=sorted(set(Gpu.objects.filter(kind=Gpu.Kind.WHOLE).values_list("model", flat=True))),
        policy_fields=policy_knobs() if user.is_staff else [],
        period_kind=request.GET.get("period") or "custom",
        period_choices=[
            ("month", _("Month")),
            ("quarter", _("Quarter")),
            ("year", _("Year")),
            ("custom", _("Custom (from … to)")),
        ],
        tasks=ReportTask.objects.filter(requested_by=user).defer("pdf")[:10],
    )
    return render(request, "reports/report.html", context, status=400 if error else 200)


@login_required
def report_forecast(request: HttpRequest) -> HttpResponse:
    """The forecast section alone: the page polls it while no forecast was ever fitted."""
    return render(
        request,
        "reports/_forecast.html",
        {
            **forecast_context(latest_forecast()),
            "forecast_image": reverse("report_chart", args=["forecast"]),
            "on_page": True,
        },
    )


@login_required
def report_csv(request: HttpRequest, slug: str) -> HttpResponse:
    try:
        period = period_from_params(request.GET)
    except BadPeriod as exc:
        return HttpResponse(str(exc.message), status=400, content_type="text/plain; charset=utf-8")
    table = table_by_slug(usage_report(period=period, viewer=request_user(request)), slug)
    if table is None:
        raise Http404(_("There is no report table named “%(slug)s”.") % {"slug": slug})
    response = HttpResponse(table.csv_text(), content_type="text/csv; charset=utf-8")
    name = f"labportal-{slug}-{period.first_day}-{period.last_day}.csv"
    response["Content-Disposition"] = f'attachment; filename="{name}"'
    return response


@login_required
def report_chart(request: HttpRequest, name: str) -> HttpResponse:
    try:
        period = period_from_params(request.GET)
    except BadPeriod as exc:
        return HttpResponse(str(exc.message), status=400, content_type="text/plain; charset=utf-8")
    user = request_user(request)
    if name == "weekly":
        # The page left its weekly figures under the name its image URL carries (`v`);
        # without them (another link, an emptied cache) the report is built again.
        points = charts.remembered_weekly_points(request.GET.get("v", ""))
        if points is None:
            points = charts.weekly_points(usage_report(period=period, viewer=user))
        png = charts.cached_png("weekly", points, lambda: charts.weekly_chart_of(points))
    elif name == "forecast":
        # The newest stored fit (the page asks the worker for a newer one); never fits here.
        stored = DemandForecast.objects.order_by("-id").values_list("forecast", flat=True).first()
        forecast = Forecast.from_json(stored) if stored else None
        if forecast is None:
            raise Http404(_("Not enough history for a forecast yet."))
        plotted = [
            forecast.history_weeks,
            forecast.history,
            forecast.weeks,
            forecast.mean,
            forecast.lower,
            forecast.upper,
        ]
        png = charts.cached_png("forecast", plotted, lambda: charts.forecast_chart(forecast))
    else:
        raise Http404(_("There is no chart named “%(name)s”.") % {"name": name})
    response = HttpResponse(png, content_type="image/png")
    response["Cache-Control"] = "private, max-age=60"
    return response


def _replay_options_from_form(data: Any) -> list[dict[str, Any]]:
    """The replay form's fields as options: today's lab, ±N GPUs of a model, a policy change."""
    model = str(data.get("gpu_model") or "")
    try:
        count = int(data.get("gpu_count") or 0)
    except ValueError:
        raise BadReplay(_("“GPUs” must be a whole number.")) from None
    options: list[dict[str, Any]] = [{"label": str(_("The lab's GPUs and policy"))}]
    if count:
        count = abs(count)
        # The labels are the portal's own, cut to fit; the model is the admin's, refused if long.
        options.append(
            {"label": f"+{count} {model}"[:MAX_LABEL_CHARS], "gpu_delta": count, "gpu_model": model}
        )
        try:
            lab_cluster(gpu_delta=-count, gpu_model=model)
        except BadReplay:
            pass  # the lab has too few of them to take away; offer only the addition
        else:
            options.append(
                {
                    "label": f"−{count} {model}"[:MAX_LABEL_CHARS],
                    "gpu_delta": -count,
                    "gpu_model": model,
                }
            )
    changes = {}
    for name, _label, _today in policy_knobs():
        raw = data.get(name)
        if raw not in (None, ""):
            try:
                changes[name] = float(raw)
            except ValueError:
                raise BadReplay(_("“%(name)s” must be a number.") % {"name": name}) from None
    if changes:
        options.append({"label": str(_("Changed policy")), "policy_changes": changes})
    return options


@login_required
@require_POST
def report_task_new(request: HttpRequest) -> HttpResponse:
    user = request_user(request)
    try:
        period = period_from_params(request.POST)
        kind = request.POST.get("kind", "")
        options = (
            _replay_options_from_form(request.POST) if kind == ReportTask.Kind.REPLAY else None
        )
        task = services.report_task_create(
            kind=kind,
            requester=user,
            period=period,
            language=translation.get_language() or "en",
            options=options,
        )
    except DomainError as exc:
        messages.error(request, str(exc.message))
        return redirect("report_page")
    return redirect("report_task", pk=task.pk)


def _own_task(request: HttpRequest, pk: int) -> ReportTask:
    user = request_user(request)
    tasks = (
        ReportTask.objects.all() if user.is_staff else ReportTask.objects.filter(requested_by=user)
    )
    return get_object_or_404(tasks.defer("pdf"), pk=pk)


@login_required
def report_task(request: HttpRequest, pk: int) -> HttpResponse:
    task = _own_task(request, pk)
    template = "reports/_task.html" if request.htmx else "reports/task.html"  # type: ignore[attr-defined]
    options = task.params.get("options", [])
    outcomes = task.result.get("outcomes", [])
    return render(
        request,
        template,
        {
            "task": task,
            "outcomes": outcomes,
            "applicable": [i for i, o in enumerate(options) if o.get("policy_changes")],
            "options": options,
        },
    )


@login_required
def report_task_pdf(request: HttpRequest, pk: int) -> HttpResponse:
    task = _own_task(request, pk)
    pdf = ReportTask.objects.filter(pk=task.pk).values_list("pdf", flat=True).first()
    if task.kind != ReportTask.Kind.PDF or task.state != ReportTask.State.DONE or not pdf:
        raise Http404(_("This PDF is not ready."))
    response = HttpResponse(bytes(pdf), content_type="application/pdf")
    name = f"labportal-report-{task.period_start:%Y-%m-%d}.pdf"
    response["Content-Disposition"] = f'attachment; filename="{name}"'
    return response


@login_required
@require_POST
def report_policy_apply(request: HttpRequest, pk: int, option: int) -> HttpResponse:
    task = _own_task(request, pk)
    try:
        services.policy_apply_from_replay(
            task=task, option_index=option, actor=request_user(request)
        )
    except DomainError as exc:
        messages.error(request, str(exc.message))
    else:
        messages.success(
            request, _("The scheduling policy was changed; the change is in the audit log.")
        )
    return redirect("report_task", pk=task.pk)
