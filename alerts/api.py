"""The alerts API: staff list and acknowledge every alert; members read those about their jobs."""

from __future__ import annotations

from django.db.models import QuerySet
from django_filters import rest_framework as filters
from drf_spectacular.utils import extend_schema
from rest_framework import mixins, serializers, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import PermissionDenied
from rest_framework.request import Request
from rest_framework.response import Response

from accounts.auth import request_user
from alerts import selectors, services
from alerts.models import Alert, Kind
from core.api_filters import ChoicesFilter


class AlertSerializer(serializers.ModelSerializer[Alert]):
    message = serializers.CharField(read_only=True)
    advice = serializers.CharField(read_only=True)
    acknowledged_by = serializers.CharField(
        source="acknowledged_by.username", read_only=True, default=None, allow_null=True
    )

    class Meta:
        model = Alert
        fields = [
            "id",
            "kind",
            "subject",
            "state",
            "severity",
            "params",
            "message",
            "advice",
            "job",
            "gpu",
            "node",
            "fired_at",
            "last_seen_at",
            "action",
            "action_due_at",
            "action_taken_at",
            "acknowledged_at",
            "acknowledged_by",
            "resolved_at",
        ]
        read_only_fields = fields


class AlertFilter(filters.FilterSet):
    state = ChoicesFilter(choices=Alert.State.choices, help_text="Only alerts in these states.")
    kind = ChoicesFilter(choices=Kind.choices, help_text="Only alerts of these kinds.")

    class Meta:
        model = Alert
        fields = ["state", "kind"]


class AlertViewSet(
    mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet[Alert]
):
    """Alerts, newest first. ?state=firing|acknowledged|resolved and ?kind= filter. Texts follow Accept-Language."""

    serializer_class = AlertSerializer
    queryset = Alert.objects.none()  # the model, for the schema
    filterset_class = AlertFilter

    def get_queryset(self) -> QuerySet[Alert]:
        return selectors.alerts_visible_to(request_user(self.request)).order_by("-fired_at", "-id")

    @extend_schema(request=None, responses=AlertSerializer)
    @action(detail=True, methods=["post"])
    def acknowledge(self, request: Request, pk: str | None = None) -> Response:
        user = request_user(request)
        if not user.is_staff:
            raise PermissionDenied("Only lab admins acknowledge alerts.")
        alert = services.alert_acknowledge(alert_id=self.get_object().pk, actor=user)
        return Response(AlertSerializer(alert).data)
