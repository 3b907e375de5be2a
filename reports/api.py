"""The reports API: the usage report (the same rows as the CSV files) and report tasks."""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet
from django_filters import rest_framework as filters
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from accounts.auth import request_user
from core.api_filters import ChoicesFilter
from reports.models import ReportTask
from reports.periods import period_from_params
from reports.selectors import usage_report
from reports.serializers import (
    ApplyPolicySerializer,
    ReportTaskCreateSerializer,
    ReportTaskSerializer,
    UsageReportSerializer,
)
from reports.services import policy_apply_from_replay, report_task_create
from reports.tables import report_tables

PERIOD_PARAMETERS = [
    OpenApiParameter("period", str, enum=["month", "quarter", "year", "custom"]),
    OpenApiParameter("at", str, description="YYYY-MM-DD: a day in the month, quarter or year"),
    OpenApiParameter("from", str, description="YYYY-MM-DD: first day of a custom period"),
    OpenApiParameter("to", str, description="YYYY-MM-DD: last day of a custom period"),
]


class UsageReportView(APIView):
    """The usage report of a period. Staff see every line; a member sees the lab's
    totals and lab-wide tables, and only their own user and booking lines."""

    @extend_schema(parameters=PERIOD_PARAMETERS, responses={200: UsageReportSerializer})
    def get(self, request: Request) -> Response:
        period = period_from_params(request.query_params)
        report = usage_report(period=period, viewer=request_user(request))
        body: dict[str, Any] = {
            "period": {"start": period.start, "end": period.end, "label": period.label},
            "capacity_gpus": report.capacity_gpus,
            "scoped_to": report.scoped_to,
        }
        for table in report_tables(report):
            body[table.slug] = table.rows
        return Response(body)


class ReportTaskFilter(filters.FilterSet):
    kind = ChoicesFilter(choices=ReportTask.Kind.choices, help_text="Only tasks of these kinds.")
    state = ChoicesFilter(choices=ReportTask.State.choices, help_text="Only tasks in these states.")

    class Meta:
        model = ReportTask
        fields = ["kind", "state"]


class ReportTaskViewSet(
    mixins.ListModelMixin,
    mixins.RetrieveModelMixin,
    mixins.CreateModelMixin,
    viewsets.GenericViewSet,
):
    """Replays (staff) and PDF reports, run by the control worker; poll until `state` is done."""

    serializer_class = ReportTaskSerializer
    queryset = ReportTask.objects.none()  # the model, for the schema
    filterset_class = ReportTaskFilter
    throttle_scopes = {"create": "report"}

    def get_queryset(self) -> QuerySet[ReportTask]:
        user = request_user(self.request)
        tasks = ReportTask.objects.defer("pdf")
        return tasks if user.is_staff else tasks.filter(requested_by=user)

    @extend_schema(request=ReportTaskCreateSerializer, responses={201: ReportTaskSerializer})
    def create(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        data_in = ReportTaskCreateSerializer(data=request.data)
        data_in.is_valid(raise_exception=True)
        data = data_in.validated_data
        params = {k: str(data[k]) for k in ("period", "at", "from", "to") if data.get(k)}
        task = report_task_create(
            kind=data["kind"],
            requester=request_user(request),
            period=period_from_params(params),
            language=data["language"],
            options=[dict(o) for o in data.get("options", [])] or None,
        )
        return Response(ReportTaskSerializer(task).data, status=status.HTTP_201_CREATED)

    @extend_schema(request=ApplyPolicySerializer, responses={200: ReportTaskSerializer})
    @action(detail=True, methods=["post"])
    def apply(self, request: Request, pk: str | None = None) -> Response:
        """Apply one replayed option's policy changes to the live policy (staff; audit-logged)."""
        data_in = ApplyPolicySerializer(data=request.data)
        data_in.is_valid(raise_exception=True)
        task = self.get_object()
        policy_apply_from_replay(
            task=task,
            option_index=data_in.validated_data["option"],
            actor=request_user(request),
        )
        return Response(ReportTaskSerializer(task).data)
