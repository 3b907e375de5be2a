"""Chart series in the REST API: GPUs and nodes over a period, a job's GPUs, the lab per day."""

from __future__ import annotations

from dataclasses import asdict
from datetime import timedelta
from typing import Any

from django.shortcuts import get_object_or_404
from django.utils import timezone
from django.utils.translation import gettext as _
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import NotFound
from rest_framework.request import Request
from rest_framework.response import Response

from cluster.models import Gpu
from core.api_schema import ERROR_BODY
from jobqueue.selectors import jobs_visible_to
from telemetry import selectors
from telemetry.serializers import (
    RANGES,
    GpuSeriesQuerySerializer,
    LabDailyQuerySerializer,
    LabDaySerializer,
    SeriesSerializer,
)


def _series_answer(series: selectors.Series, gpus: list[Gpu]) -> dict[str, Any]:
    answer = asdict(series)
    answer["simulated"] = any(g.node.is_simulated for g in gpus)
    return answer


class TelemetryViewSet(viewsets.ViewSet):
    """GPU history for charts, from the minute and hour rollups, downsampled to `points` bins."""

    @extend_schema(
        parameters=[GpuSeriesQuerySerializer],
        responses={
            200: SeriesSerializer,
            404: OpenApiResponse(ERROR_BODY, description="No such node or GPU (?node= or ?gpu=)."),
        },
    )
    @action(detail=False, methods=["get"], url_path="gpu-series")
    def gpu_series(self, request: Request) -> Response:
        """Utilisation and memory of every GPU (or one node's, or one GPU) and of each node."""
        query = GpuSeriesQuerySerializer(data=request.query_params)
        query.is_valid(raise_exception=True)
        params = query.validated_data
        gpus = Gpu.objects.select_related("node").order_by("node__name", "index", "uuid")
        if "node" in params:
            gpus = gpus.filter(node__name=params["node"])
        if "gpu" in params:
            gpus = gpus.filter(pk=params["gpu"])
        gpu_list = list(gpus)
        if not gpu_list and ("node" in params or "gpu" in params):
            raise NotFound(_("No such node or GPU; GET /api/telemetry/gpu-series/ lists them all."))
        now = timezone.now()
        series = selectors.gpu_series(
            start=now - RANGES[params["range"]],
            end=now,
            gpus=gpu_list,
            points=params["points"],
            now=now,
        )
        return Response(_series_answer(series, gpu_list))

    @extend_schema(parameters=[LabDailyQuerySerializer], responses=LabDaySerializer(many=True))
    @action(detail=False, methods=["get"], url_path="lab-daily")
    def lab_daily(self, request: Request) -> Response:
        """Per day: the share of GPU time jobs held, and how busy the GPUs really were."""
        query = LabDailyQuerySerializer(data=request.query_params)
        query.is_valid(raise_exception=True)
        today = timezone.now().date()
        days = selectors.lab_daily(
            start=today - timedelta(days=query.validated_data["days"] - 1),
            end=today + timedelta(days=1),
        )
        return Response(LabDaySerializer(days, many=True).data)

    @extend_schema(
        parameters=[
            OpenApiParameter("job_id", int, OpenApiParameter.PATH),
            OpenApiParameter("points", int, description="At most this many bins (10 to 2000)."),
        ],
        responses=SeriesSerializer,
    )
    @action(detail=False, methods=["get"], url_path=r"job-series/(?P<job_id>[0-9]+)")
    def job_series(self, request: Request, job_id: str) -> Response:
        """A job's GPUs over its run (yours, or any job for staff)."""
        job = get_object_or_404(jobs_visible_to(request.user), pk=int(job_id))
        query = GpuSeriesQuerySerializer(data={"points": request.query_params.get("points", 400)})
        query.is_valid(raise_exception=True)
        now = timezone.now()
        if job.started_at is None:
            raise NotFound(_("This job has not started, so its GPUs have no history yet."))
        gpus = list(
            Gpu.objects.select_related("node")
            .filter(allocations__job=job)
            .distinct()
            .order_by("node__name", "index")
        )
        end = job.ended_at or now
        series = selectors.gpu_series(
            start=job.started_at,
            end=max(end, job.started_at + timedelta(minutes=1)),
            gpus=gpus,
            points=query.validated_data["points"],
            now=now,
        )
        return Response(_series_answer(series, gpus))
