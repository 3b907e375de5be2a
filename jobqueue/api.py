from __future__ import annotations

from typing import Any

from django.db.models import Q
from django.utils.translation import gettext as _
from django_filters import rest_framework as filters
from drf_spectacular.utils import extend_schema
from rest_framework import mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import ValidationError
from rest_framework.request import Request
from rest_framework.response import Response

from accounts.auth import request_user
from core.api_filters import ChoicesFilter, FlagFilter
from jobqueue import arrays, executor, selectors, services, submit
from jobqueue.models import Job, Queue
from jobqueue.serializers import (
    JobArrayCreatedSerializer,
    JobArraySerializer,
    JobBatchSerializer,
    JobEventSerializer,
    JobSerializer,
    JobSubmitSerializer,
    QueueEntrySerializer,
    QueueSerializer,
)


class JobFilter(filters.FilterSet):
    state = ChoicesFilter(choices=Job.State.choices, help_text="Only jobs in these states.")
    queue = filters.CharFilter(
        field_name="queue__name", help_text="Only jobs in this queue (its name)."
    )
    active = FlagFilter(
        only=Q(state__in=Job.WAITING_STATES) | Q(state__in=Job.ACTIVE_STATES),
        help_text="`true`: only waiting and running jobs.",
    )
    array = filters.NumberFilter(
        field_name="array_id", help_text="Only the jobs of this job array."
    )

    class Meta:
        model = Job
        fields = ["state", "queue", "active", "array"]


class JobViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet[Job]):
    """Your jobs (every job for staff). Filter with ?state=pending,running&queue=normal&active=true."""

    serializer_class = JobSerializer
    queryset = Job.objects.none()  # the model, for the schema; get_queryset picks the rows
    filterset_class = JobFilter
    throttle_scopes = {"create": "submit", "batch": "submit", "array": "submit"}

    def get_queryset(self) -> Any:
        return (
            selectors.jobs_visible_to(self.request.user)
            .select_related("slurm", "project")
            .prefetch_related("allocations__gpu", "mounts", "depends_on")
        )

    @extend_schema(request=JobSubmitSerializer, responses={201: JobSerializer})
    def create(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        payload = JobSubmitSerializer(data=request.data)
        payload.is_valid(raise_exception=True)
        data = _submit_arguments(payload.validated_data)
        job = submit.job_submit(owner=request_user(request), **data)
        return Response(JobSerializer(job).data, status=status.HTTP_201_CREATED)

    @extend_schema(request=JobBatchSerializer, responses={201: JobSerializer(many=True)})
    @action(detail=False, methods=["post"])
    def batch(self, request: Request) -> Response:
        """Submit up to 500 jobs in one request, like a job array: all are queued or none is."""
        payload = JobBatchSerializer(data=request.data)
        payload.is_valid(raise_exception=True)
        specs = []
        for item in payload.validated_data["jobs"]:
            specs.append(_submit_arguments(item))
        jobs = submit.jobs_submit_batch(owner=request_user(request), specs=specs)
        created = (
            Job.objects.filter(pk__in=[j.pk for j in jobs])
            .select_related("owner", "queue", "image", "node", "project")
            .prefetch_related("allocations__gpu", "mounts", "depends_on")
            .order_by("pk")
        )
        return Response(JobSerializer(created, many=True).data, status=status.HTTP_201_CREATED)

    @extend_schema(request=JobArraySerializer, responses={201: JobArrayCreatedSerializer})
    @action(detail=False, methods=["post"])
    def array(self, request: Request) -> Response:
        """A job array: one job per index of ``array``, checked once and queued together (all
        or none). The answer is lean (ids, not jobs): read the jobs with ?array=ID."""
        payload = JobArraySerializer(data=request.data)
        payload.is_valid(raise_exception=True)
        data = _submit_arguments(payload.validated_data)
        indices = data.pop("array")
        jobs = arrays.jobs_submit_array(owner=request_user(request), spec=data, indices=indices)
        answer = {
            "array_id": jobs[0].array_id,
            "queue": jobs[0].queue.name,
            "count": len(jobs),
            "ids": [job.pk for job in jobs],
            "indices": indices,
        }
        return Response(answer, status=status.HTTP_201_CREATED)

    @extend_schema(request=None, responses=JobSerializer(many=True))
    @action(detail=True, methods=["post"], url_path="cancel-array")
    def cancel_array(self, request: Request, pk: str | None = None) -> Response:
        """Cancel every job of the array this job belongs to that has not ended."""
        job = self.get_object()
        cancelled = arrays.array_cancel(job=job, actor=request_user(request))
        jobs = self.get_queryset().filter(pk__in=cancelled).order_by("pk")
        return Response(JobSerializer(jobs, many=True).data)

    @extend_schema(request=None, responses=JobSerializer)
    @action(detail=True, methods=["post"])
    def cancel(self, request: Request, pk: str | None = None) -> Response:
        job = self.get_object()
        job = services.job_cancel(job_id=job.pk, actor=request_user(request))
        return Response(JobSerializer(job).data)

    @extend_schema(request=None, responses=JobSerializer)
    @action(detail=True, methods=["post"], url_path="force-end")
    def force_end(self, request: Request, pk: str | None = None) -> Response:
        """Staff only, a last resort: end the job in the portal now and free its GPUs."""
        job = self.get_object()
        job = services.job_force_end(job_id=job.pk, actor=request_user(request))
        return Response(JobSerializer(job).data)

    @extend_schema(
        responses={200: {"type": "object", "properties": {"log_tail": {"type": "string"}}}}
    )
    @action(detail=True, methods=["get"])
    def logs(self, request: Request, pk: str | None = None) -> Response:
        """The latest output lines; ?refresh=1 asks the node (or reads Slurm's output file) again."""
        job = self.get_object()
        refresh = request.query_params.get("refresh") in ("1", "true")
        log_tail = executor.current().job_output(job, refresh=refresh)
        return Response({"job": job.pk, "state": job.state, "log_tail": log_tail})

    @extend_schema(responses=JobEventSerializer(many=True))
    @action(detail=True, methods=["get"])
    def events(self, request: Request, pk: str | None = None) -> Response:
        return Response(JobEventSerializer(self.get_object().events.all(), many=True).data)


class QueueViewSet(viewsets.ReadOnlyModelViewSet[Queue]):
    """The lab's queues and their limits."""

    serializer_class = QueueSerializer
    queryset = Queue.objects.filter(is_active=True)
    lookup_field = "name"

    @extend_schema(
        responses={
            200: {
                "type": "object",
                "properties": {
                    "waiting": {"type": "array", "items": {"type": "object"}},
                    "waiting_total": {"type": "integer"},
                    "running": {"type": "array", "items": {"type": "object"}},
                },
            }
        }
    )
    @action(detail=False, methods=["get"])
    def overview(self, request: Request) -> Response:
        """Waiting jobs with position, estimated start and reason (``limit``, default 200, from
        ``offset``; ``waiting_total`` says how many wait); every running job."""
        limit = _bounded_int(request.query_params.get("limit"), "limit", 200, 1, 5000)
        offset = _bounded_int(request.query_params.get("offset"), "offset", 0, 0, 10**9)
        data = selectors.queue_overview(waiting_offset=offset, waiting_limit=limit)
        return Response(
            {
                "waiting": QueueEntrySerializer(data["waiting"], many=True).data,
                "waiting_total": data["waiting_total"],
                "running": QueueEntrySerializer(data["running"], many=True).data,
            }
        )


def _bounded_int(raw: str | None, name: str, default: int, low: int, high: int) -> int:
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        value = low - 1
    if not low <= value <= high:
        raise ValidationError(
            {name: _("Give a whole number from %(low)d to %(high)d.") % {"low": low, "high": high}}
        )
    return value


def _submit_arguments(validated: Any) -> dict[str, Any]:
    """job_submit's arguments from a validated JobSubmitSerializer."""
    data = dict(validated)
    data["reservation_id"] = data.pop("reservation", None)
    dependency = data.pop("dependency", None)
    if dependency is not None:
        data["dependency"], data["depends_on"] = dependency
    return data
