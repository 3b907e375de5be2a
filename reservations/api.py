"""The reservations API: a ViewSet scoped to the requesting user (everything for staff)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.db.models import QuerySet
from django.urls import reverse
from django.utils.translation import gettext as _
from django_filters import rest_framework as filters
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response

from core.api_filters import ChoicesFilter
from reservations.errors import ReservationError
from reservations.models import CalendarFeed, Reservation
from reservations.selectors import reservation_suggest
from reservations.serializers import (
    FreeSlotSerializer,
    ReservationCreateSerializer,
    ReservationExtendSerializer,
    ReservationSerializer,
    SuggestQuerySerializer,
)
from reservations.services import (
    reservation_cancel,
    reservation_create,
    reservation_extend,
    reservation_release_early,
)


def _refusal(error: ReservationError) -> Response:
    """Like the project's domain handler, plus the nearest free slot when there is one."""
    body: dict[str, Any] = {"detail": str(error.message), "code": error.code}
    if error.suggestion is not None:
        body["suggestion"] = error.suggestion.as_dict()
    return Response(body, status=error.status_code)


class ReservationFilter(filters.FilterSet):
    state = ChoicesFilter(
        choices=Reservation.State.choices, help_text="Only bookings in these states."
    )

    class Meta:
        model = Reservation
        fields = ["state"]


class ReservationViewSet(
    mixins.ListModelMixin,
    mixins.RetrieveModelMixin,
    mixins.CreateModelMixin,
    viewsets.GenericViewSet,
):
    serializer_class = ReservationSerializer
    queryset = Reservation.objects.none()  # the model, for the schema
    filterset_class = ReservationFilter

    def get_queryset(self) -> QuerySet[Reservation]:
        return (
            Reservation.objects.for_user(self.request.user)
            .select_related("user")
            .prefetch_related("gpus__node")
            .order_by("start", "pk")
        )

    @extend_schema(request=ReservationCreateSerializer, responses={201: ReservationSerializer})
    def create(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        data_in = ReservationCreateSerializer(data=request.data)
        data_in.is_valid(raise_exception=True)
        data = data_in.validated_data
        try:
            reservation = reservation_create(
                user=request.user,
                gpu_ids=data.get("gpus"),
                node=data.get("node"),
                gpu_count=data.get("gpu_count"),
                start=data["start"],
                end=data["end"],
                note=data["note"],
                maintenance=data["maintenance"],
            )
        except ReservationError as error:
            return _refusal(error)
        return Response(ReservationSerializer(reservation).data, status=status.HTTP_201_CREATED)

    @extend_schema(request=None, responses={200: ReservationSerializer})
    @action(detail=True, methods=["post"])
    def cancel(self, request: Request, pk: str | None = None) -> Response:
        reservation = reservation_cancel(reservation_id=self.get_object().pk, actor=request.user)
        return Response(ReservationSerializer(reservation).data)

    @extend_schema(request=None, responses={200: ReservationSerializer})
    @action(detail=True, methods=["post"])
    def release(self, request: Request, pk: str | None = None) -> Response:
        reservation = reservation_release_early(
            reservation_id=self.get_object().pk, actor=request.user
        )
        return Response(ReservationSerializer(reservation).data)

    @extend_schema(request=ReservationExtendSerializer, responses={200: ReservationSerializer})
    @action(detail=True, methods=["post"])
    def extend(self, request: Request, pk: str | None = None) -> Response:
        reservation = self.get_object()
        data_in = ReservationExtendSerializer(data=request.data)
        data_in.is_valid(raise_exception=True)
        try:
            reservation = reservation_extend(
                reservation_id=reservation.pk,
                actor=request.user,
                new_end=data_in.validated_data["end"],
            )
        except ReservationError as error:
            return _refusal(error)
        return Response(ReservationSerializer(reservation).data)

    @extend_schema(
        parameters=[SuggestQuerySerializer],
        responses={
            200: FreeSlotSerializer,
            404: OpenApiResponse(description="Nothing free in the horizon"),
        },
    )
    @action(detail=False, methods=["get"])
    def suggest(self, request: Request) -> Response:
        query = SuggestQuerySerializer(data=request.query_params)
        query.is_valid(raise_exception=True)
        data = query.validated_data
        slot = reservation_suggest(
            user=request.user,
            gpu_count=data["gpu_count"],
            length=timedelta(hours=float(data["hours"])),
            after=data.get("after"),
            node_id=data["node"].pk if data.get("node") else None,
        )
        if slot is None:
            return Response(
                {
                    "detail": _(
                        "No node has that many GPUs free for that long within your booking horizon. "
                        "Try fewer GPUs or fewer hours."
                    ),
                    "code": "no_free_slot",
                },
                status=status.HTTP_404_NOT_FOUND,
            )
        return Response(FreeSlotSerializer(slot.as_dict()).data)

    @extend_schema(
        request=None, responses={200: OpenApiResponse(description="{'url': the iCal feed URL}")}
    )
    @action(detail=False, methods=["get"])
    def feed(self, request: Request) -> Response:
        """The secret iCal subscription URL of the requesting user's bookings."""
        token = CalendarFeed.for_user(request.user).url_token
        return Response(
            {"url": request.build_absolute_uri(reverse("reservation_ical", args=[token]))}
        )
