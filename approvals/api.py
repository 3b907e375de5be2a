"""The approvals API: priority grants and emergencies. Members see their own; staff see and decide all."""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet
from django_filters import rest_framework as filters
from drf_spectacular.utils import extend_schema
from rest_framework import mixins, serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response

from accounts.auth import request_user
from approvals import services as approvals
from core.api_filters import ChoicesFilter
from jobqueue.models import EmergencyRequest, Job, PriorityGrant, Queue


class PriorityGrantSerializer(serializers.ModelSerializer[PriorityGrant]):
    username = serializers.CharField(source="user.username", read_only=True)
    queue: serializers.SlugRelatedField[Queue] = serializers.SlugRelatedField(
        slug_field="name", read_only=True
    )
    decided_by = serializers.CharField(
        source="decided_by.username", read_only=True, default=None, allow_null=True
    )
    in_force = serializers.SerializerMethodField()

    class Meta:
        model = PriorityGrant
        fields = [
            "id",
            "username",
            "queue",
            "reason",
            "deadline",
            "gpus_expected",
            "state",
            "in_force",
            "decided_by",
            "decided_at",
            "comment",
            "created_at",
        ]
        read_only_fields = fields

    def get_in_force(self, grant: PriorityGrant) -> bool:
        return grant.is_in_force()


class GrantApplySerializer(serializers.Serializer):
    reason = serializers.CharField(max_length=2000)
    deadline = serializers.DateTimeField()
    gpus_expected = serializers.IntegerField(min_value=1, max_value=512, default=1)
    queue = serializers.SlugRelatedField(
        slug_field="name",
        queryset=Queue.objects.filter(requires_grant=True, is_active=True),
        required=False,
    )


class DecisionSerializer(serializers.Serializer):
    comment = serializers.CharField(max_length=2000, required=False, allow_blank=True, default="")


class EmergencyRequestSerializer(serializers.ModelSerializer[EmergencyRequest]):
    username = serializers.CharField(source="user.username", read_only=True)
    jobs: serializers.PrimaryKeyRelatedField[Job] = serializers.PrimaryKeyRelatedField(
        many=True, read_only=True
    )
    decided_by = serializers.CharField(
        source="decided_by.username", read_only=True, default=None, allow_null=True
    )
    in_force = serializers.SerializerMethodField()

    class Meta:
        model = EmergencyRequest
        fields = [
            "id",
            "username",
            "jobs",
            "reason",
            "hours",
            "state",
            "in_force",
            "decided_by",
            "decided_at",
            "expires_at",
            "comment",
            "created_at",
        ]
        read_only_fields = fields

    def get_in_force(self, request: EmergencyRequest) -> bool:
        return request.is_in_force()


class EmergencyCreateSerializer(serializers.Serializer):
    jobs = serializers.ListField(
        child=serializers.IntegerField(min_value=1, max_value=2**63 - 1),
        min_length=1,
        max_length=100,
    )
    reason = serializers.CharField(max_length=2000)
    # The lab's policy caps the hours further; this bound is the column's.
    hours = serializers.IntegerField(min_value=1, max_value=32767, required=False)


class GrantFilter(filters.FilterSet):
    state = ChoicesFilter(
        choices=PriorityGrant.State.choices, help_text="Only grants in these states."
    )

    class Meta:
        model = PriorityGrant
        fields = ["state"]


class GrantViewSet(
    mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet[PriorityGrant]
):
    """Priority grants for the `high` queue. ?state=pending filters; staff approve or reject."""

    serializer_class = PriorityGrantSerializer
    queryset = PriorityGrant.objects.none()  # the model, for the schema
    filterset_class = GrantFilter

    def get_queryset(self) -> QuerySet[PriorityGrant]:
        return approvals.grants_visible_to(request_user(self.request))

    @extend_schema(request=GrantApplySerializer, responses={201: PriorityGrantSerializer})
    def create(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        payload = GrantApplySerializer(data=request.data)
        payload.is_valid(raise_exception=True)
        grant = approvals.grant_apply(user=request_user(request), **payload.validated_data)
        return Response(PriorityGrantSerializer(grant).data, status=status.HTTP_201_CREATED)

    def _decide(self, request: Request, approve: bool) -> Response:
        grant = self.get_object()
        payload = DecisionSerializer(data=request.data)
        payload.is_valid(raise_exception=True)
        grant = approvals.grant_decide(
            grant_id=grant.pk,
            decided_by=request_user(request),
            approve=approve,
            comment=payload.validated_data["comment"],
        )
        return Response(PriorityGrantSerializer(grant).data)

    @extend_schema(request=DecisionSerializer, responses=PriorityGrantSerializer)
    @action(detail=True, methods=["post"])
    def approve(self, request: Request, pk: str | None = None) -> Response:
        return self._decide(request, approve=True)

    @extend_schema(request=DecisionSerializer, responses=PriorityGrantSerializer)
    @action(detail=True, methods=["post"])
    def reject(self, request: Request, pk: str | None = None) -> Response:
        return self._decide(request, approve=False)

    @extend_schema(request=None, responses=PriorityGrantSerializer)
    @action(detail=True, methods=["post"])
    def withdraw(self, request: Request, pk: str | None = None) -> Response:
        grant = approvals.grant_withdraw(grant_id=self.get_object().pk, user=request_user(request))
        return Response(PriorityGrantSerializer(grant).data)


class EmergencyFilter(filters.FilterSet):
    state = ChoicesFilter(
        choices=EmergencyRequest.State.choices, help_text="Only requests in these states."
    )

    class Meta:
        model = EmergencyRequest
        fields = ["state"]


class EmergencyViewSet(
    mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet[EmergencyRequest]
):
    """Emergency requests: top priority for named waiting jobs, a limited number of times per period."""

    serializer_class = EmergencyRequestSerializer
    queryset = EmergencyRequest.objects.none()  # the model, for the schema
    filterset_class = EmergencyFilter

    def get_queryset(self) -> QuerySet[EmergencyRequest]:
        return approvals.emergencies_visible_to(request_user(self.request))

    @extend_schema(request=EmergencyCreateSerializer, responses={201: EmergencyRequestSerializer})
    def create(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        payload = EmergencyCreateSerializer(data=request.data)
        payload.is_valid(raise_exception=True)
        data = payload.validated_data
        emergency = approvals.emergency_request_create(
            user=request_user(request),
            job_ids=data["jobs"],
            reason=data["reason"],
            hours=data.get("hours"),
        )
        return Response(EmergencyRequestSerializer(emergency).data, status=status.HTTP_201_CREATED)

    @extend_schema(
        responses={
            200: {
                "type": "object",
                "properties": {
                    "uses_left": {"type": "integer"},
                    "max_uses": {"type": "integer"},
                    "period_days": {"type": "integer"},
                },
            }
        }
    )
    @action(detail=False, methods=["get"], url_path="uses-left")
    def uses_left(self, request: Request) -> Response:
        from accounts.models import CreditPolicy

        policy = CreditPolicy.current()
        return Response(
            {
                "uses_left": approvals.emergency_uses_left(request_user(request)),
                "max_uses": policy.emergency_max_uses,
                "period_days": policy.emergency_period_days,
            }
        )

    def _decide(self, request: Request, approve: bool) -> Response:
        emergency = self.get_object()
        payload = DecisionSerializer(data=request.data)
        payload.is_valid(raise_exception=True)
        emergency = approvals.emergency_decide(
            request_id=emergency.pk,
            decided_by=request_user(request),
            approve=approve,
            comment=payload.validated_data["comment"],
        )
        return Response(EmergencyRequestSerializer(emergency).data)

    @extend_schema(request=DecisionSerializer, responses=EmergencyRequestSerializer)
    @action(detail=True, methods=["post"])
    def approve(self, request: Request, pk: str | None = None) -> Response:
        return self._decide(request, approve=True)

    @extend_schema(request=DecisionSerializer, responses=EmergencyRequestSerializer)
    @action(detail=True, methods=["post"])
    def reject(self, request: Request, pk: str | None = None) -> Response:
        return self._decide(request, approve=False)
