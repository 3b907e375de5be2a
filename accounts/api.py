"""The credits and notifications API: scoped to the requesting member unless staff."""

from __future__ import annotations

from typing import Any

from django.db.models import Q, QuerySet
from django.shortcuts import get_object_or_404
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy
from django_filters import rest_framework as filters
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import mixins, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import ValidationError
from rest_framework.request import Request
from rest_framework.response import Response

from accounts import selectors, services
from accounts.auth import request_user
from accounts.forms import MONTH_PATTERN
from accounts.models import LedgerEntry, Notification, User
from accounts.serializers import (
    CreditSummarySerializer,
    LedgerEntrySerializer,
    NotificationSerializer,
)
from core.api_filters import ChoiceFilter, FlagFilter, PatternFilter
from core.api_schema import SingleObjectAutoSchema

USER_PARAM = OpenApiParameter("user", str, description="Staff only: another member's username.")
NO_SUCH_MEMBER = OpenApiResponse(
    {"type": "object", "properties": {"detail": {"type": "string"}}},
    description="Staff asked for a member (?user=) who does not exist.",
)


def _subject(request: Request) -> User:
    """The member whose credits are asked for: yourself, or ?user= for staff."""
    user = request_user(request)
    username = request.query_params.get("user")
    if not username or username == user.username:
        return user
    if not user.is_staff:
        raise ValidationError(
            {"user": _("Only staff can see another member's credits; leave out ?user=.")}
        )
    return get_object_or_404(User, username=username)


class CreditViewSet(viewsets.GenericViewSet):
    """Your credit balance, burn rate over the last 7 days and when it runs out at that rate."""

    serializer_class = CreditSummarySerializer
    schema = SingleObjectAutoSchema()

    @extend_schema(
        parameters=[USER_PARAM], responses={200: CreditSummarySerializer, 404: NO_SUCH_MEMBER}
    )
    def list(self, request: Request) -> Response:
        user = _subject(request)
        summary = selectors.credit_summary(user)
        return Response(
            CreditSummarySerializer({"username": user.username, **summary.__dict__}).data
        )


class LedgerEntryFilter(filters.FilterSet):
    kind = ChoiceFilter(choices=LedgerEntry.Kind.choices, help_text="Only entries of this kind.")
    month = PatternFilter(
        regex=MONTH_PATTERN,
        example=gettext_lazy("Give the month as YYYY-MM, e.g. 2025-03."),
        method="filter_month",
        help_text="Only entries of this calendar month, YYYY-MM.",
    )

    class Meta:
        model = LedgerEntry
        fields = ["kind", "month"]

    def filter_month(self, queryset: QuerySet[LedgerEntry], name: str, value: str) -> Any:
        year, month = value.split("-")
        return queryset.filter(created_at__year=int(year), created_at__month=int(month))


class LedgerEntryViewSet(viewsets.ReadOnlyModelViewSet[LedgerEntry]):
    """Ledger entries, newest first. Filter with ?kind=charge&month=2025-03; staff may add ?user=."""

    serializer_class = LedgerEntrySerializer
    queryset = LedgerEntry.objects.none()  # the model, for the schema
    filterset_class = LedgerEntryFilter

    @extend_schema(
        parameters=[USER_PARAM],
        responses={200: LedgerEntrySerializer(many=True), 404: NO_SUCH_MEMBER},
    )
    def list(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        return super().list(request, *args, **kwargs)

    def get_queryset(self) -> QuerySet[LedgerEntry]:
        if self.request.user.is_staff and not self.request.query_params.get("user"):
            return LedgerEntry.objects.select_related("account__user")
        return selectors.ledger_for(_subject(self.request)).select_related("account__user")


class NotificationFilter(filters.FilterSet):
    unread = FlagFilter(only=Q(read_at__isnull=True), help_text="`true`: only the unread ones.")

    class Meta:
        model = Notification
        fields = ["unread"]


class NotificationViewSet(
    mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet[Notification]
):
    """Your notifications, newest first (?unread=true for the unread ones). Staff too see only their own."""

    serializer_class = NotificationSerializer
    queryset = Notification.objects.none()  # the model, for the schema
    filterset_class = NotificationFilter

    def get_queryset(self) -> QuerySet[Notification]:
        return selectors.notifications_for(request_user(self.request))

    @extend_schema(request=None, responses=NotificationSerializer)
    @action(detail=True, methods=["post"])
    def read(self, request: Request, pk: str | None = None) -> Response:
        note = self.get_object()
        services.notifications_mark_read(user=request_user(request), notification_ids=[note.pk])
        note.refresh_from_db()
        return Response(NotificationSerializer(note).data)

    @extend_schema(request=None, responses={200: OpenApiTypes.OBJECT})
    @action(detail=False, methods=["post"], url_path="read-all")
    def read_all(self, request: Request) -> Response:
        count = services.notifications_mark_read(user=request_user(request))
        return Response({"marked_read": count})
