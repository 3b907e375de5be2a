"""The sessions API: start, list, read (with whether it is ready and where it opens), stop."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from django_filters import rest_framework as filters
from drf_spectacular.utils import extend_schema
from rest_framework import mixins, serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response

from accounts.auth import request_user
from core.api_filters import ChoicesFilter
from jobqueue import selectors
from jobqueue import services as job_services
from jobqueue.models import Job
from jobqueue.serializers import JobSerializer
from sessions import services
from sessions.launch import SESSION_KINDS
from sessions.status import session_status

MAX_INT32 = 2**31 - 1


class SessionStartSerializer(serializers.Serializer[Any]):
    kind = serializers.ChoiceField(choices=list(SESSION_KINDS))
    image = serializers.CharField(max_length=255)
    queue = serializers.CharField(default="debug", max_length=32)
    gpus = serializers.IntegerField(default=1, min_value=1, max_value=64)
    shared_slot = serializers.BooleanField(default=False)
    time_limit_s = serializers.IntegerField(required=False, min_value=1, max_value=MAX_INT32)
    reservation = serializers.IntegerField(required=False, min_value=1, max_value=MAX_INT32)
    mounts = serializers.ListField(
        child=serializers.CharField(max_length=40), default=list, max_length=100
    )
    cpus = serializers.DecimalField(
        max_digits=5, decimal_places=2, default=Decimal("4"), min_value=Decimal("0.1")
    )
    memory_mb = serializers.IntegerField(default=16384, min_value=64, max_value=MAX_INT32)


class SessionSerializer(serializers.Serializer[Any]):
    job = JobSerializer()
    ready = serializers.BooleanField(help_text="The session's server accepts connections.")
    url = serializers.CharField(help_text="Where it opens in the browser (the portal's path).")
    terminal_url = serializers.CharField(help_text="The job's terminal page.")


def _row(job: Job, *, ready: bool) -> dict[str, Any]:
    terminal = f"/jobs/{job.pk}/terminal/"
    opens = f"/sessions/{job.pk}/lab" if job.kind == Job.Kind.JUPYTER else terminal
    return {"job": job, "ready": ready, "url": opens, "terminal_url": terminal}


class SessionFilter(filters.FilterSet):
    state = ChoicesFilter(choices=Job.State.choices, help_text="Only sessions in these states.")
    kind = ChoicesFilter(
        choices=[(k, k) for k in SESSION_KINDS], help_text="Only sessions of these kinds."
    )

    class Meta:
        model = Job
        fields = ["state", "kind"]


class SessionViewSet(
    mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet[Job]
):
    """Your interactive sessions (every one for staff): jobs of kind jupyter or terminal."""

    serializer_class = SessionSerializer
    queryset = Job.objects.none()  # the model, for the schema
    filterset_class = SessionFilter

    def get_queryset(self) -> Any:
        return (
            selectors.jobs_visible_to(self.request.user)
            .exclude(kind=Job.Kind.BATCH)
            .select_related("slurm", "node")
            .prefetch_related("allocations__gpu", "mounts", "depends_on")
        )

    def list(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        # The list does not ask the gateways: `ready` is known in a session's own answer.
        queryset = self.filter_queryset(self.get_queryset())
        page = self.paginate_queryset(queryset)
        jobs = page if page is not None else list(queryset)
        data = SessionSerializer([_row(job, ready=False) for job in jobs], many=True).data
        return self.get_paginated_response(data) if page is not None else Response(data)

    def retrieve(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        job = self.get_object()
        username = request_user(request).username
        ready = (
            job.state == Job.State.RUNNING
            and session_status(job, username=username, activity=False).ready
        )
        return Response(SessionSerializer(_row(job, ready=ready)).data)

    @extend_schema(request=SessionStartSerializer, responses={201: SessionSerializer})
    def create(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        payload = SessionStartSerializer(data=request.data)
        payload.is_valid(raise_exception=True)
        data = dict(payload.validated_data)
        data["reservation_id"] = data.pop("reservation", None)
        job = services.session_start(owner=request_user(request), **data)
        return Response(
            SessionSerializer(_row(job, ready=False)).data, status=status.HTTP_201_CREATED
        )

    @extend_schema(request=None, responses={202: SessionSerializer})
    @action(detail=True, methods=["post"])
    def stop(self, request: Request, pk: str | None = None) -> Response:
        """Stop the session (a waiting one is cancelled)."""
        job = self.get_object()
        job_services.job_cancel(job_id=job.pk, actor=request_user(request))
        job = self.get_queryset().get(pk=job.pk)
        return Response(
            SessionSerializer(_row(job, ready=False)).data, status=status.HTTP_202_ACCEPTED
        )
