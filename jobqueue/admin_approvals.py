"""Django admin for priority grants and emergencies, with approve/reject actions.

Imported by jobqueue/admin.py. Requests are the audit trail: nobody deletes them, and
decisions go through the approval services so members are notified.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils.translation import gettext_lazy as _
from django.utils.translation import ngettext

from accounts.auth import request_user
from jobqueue import approvals
from jobqueue.models import EmergencyRequest, PriorityGrant
from labportal.errors import DomainError


def _decide_each(
    modeladmin: admin.ModelAdmin[Any],
    request: HttpRequest,
    queryset: QuerySet[Any],
    decide: Callable[[int], Any],
) -> None:
    done = 0
    for obj in queryset:
        try:
            decide(obj.pk)
        except DomainError as exc:
            modeladmin.message_user(request, f"{obj}: {exc.message}", messages.WARNING)
        else:
            done += 1
    modeladmin.message_user(
        request,
        ngettext("%d request decided.", "%d requests decided.", done) % done,
        messages.SUCCESS,
    )


class AuditOnly(admin.ModelAdmin[Any]):
    readonly_fields: ClassVar[tuple[str, ...]] = (
        "user",
        "state",
        "decided_by",
        "decided_at",
        "created_at",
    )

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_add_permission(self, request: HttpRequest) -> bool:
        # Members apply in the portal; the admin decides.
        return False


@admin.register(PriorityGrant)
class PriorityGrantAdmin(AuditOnly):
    list_display = (
        "user",
        "queue",
        "deadline",
        "gpus_expected",
        "state",
        "decided_by",
        "decided_at",
    )
    list_filter = ("state", "queue")
    search_fields = ("user__username", "reason")
    readonly_fields = (*AuditOnly.readonly_fields, "queue", "reason", "deadline", "gpus_expected")
    actions = ("approve", "reject")

    @admin.action(description=_("Approve the selected requests"))
    def approve(self, request: HttpRequest, queryset: QuerySet[PriorityGrant]) -> None:
        _decide_each(
            self,
            request,
            queryset,
            lambda pk: approvals.grant_decide(
                grant_id=pk,
                decided_by=request_user(request),
                approve=True,
                comment=str(_("Approved in the admin.")),
            ),
        )

    @admin.action(description=_("Reject the selected requests"))
    def reject(self, request: HttpRequest, queryset: QuerySet[PriorityGrant]) -> None:
        _decide_each(
            self,
            request,
            queryset,
            lambda pk: approvals.grant_decide(
                grant_id=pk,
                decided_by=request_user(request),
                approve=False,
                comment=str(_("Rejected in the admin.")),
            ),
        )


@admin.register(EmergencyRequest)
class EmergencyRequestAdmin(AuditOnly):
    list_display = ("user", "hours", "state", "created_at", "decided_by", "expires_at")
    list_filter = ("state",)
    search_fields = ("user__username", "reason")
    readonly_fields = (*AuditOnly.readonly_fields, "jobs", "reason", "hours", "expires_at")
    actions = ("approve", "reject")

    @admin.action(description=_("Approve the selected requests"))
    def approve(self, request: HttpRequest, queryset: QuerySet[EmergencyRequest]) -> None:
        _decide_each(
            self,
            request,
            queryset,
            lambda pk: approvals.emergency_decide(
                request_id=pk,
                decided_by=request_user(request),
                approve=True,
                comment=str(_("Approved in the admin.")),
            ),
        )

    @admin.action(description=_("Reject the selected requests"))
    def reject(self, request: HttpRequest, queryset: QuerySet[EmergencyRequest]) -> None:
        _decide_each(
            self,
            request,
            queryset,
            lambda pk: approvals.emergency_decide(
                request_id=pk,
                decided_by=request_user(request),
                approve=False,
                comment=str(_("Rejected in the admin.")),
            ),
        )
