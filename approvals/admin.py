"""Django admin for priority grants and emergencies, with approve/reject actions.

Imported by jobqueue/admin.py. Requests are the audit trail: nobody deletes them, and
decisions go through the approval services so members are notified.
"""

from __future__ import annotations

from typing import Any, ClassVar

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils.translation import gettext_lazy as _
from django.utils.translation import ngettext

from accounts.auth import request_user
from approvals import services as approvals
from core.errors import DomainError
from jobqueue.models import EmergencyRequest, PriorityGrant


class ApprovalAdmin(admin.ModelAdmin[Any]):
    """Requests are an audit trail: read-only, never deleted; staff approve or reject them."""

    readonly_fields: ClassVar[tuple[str, ...]] = (
        "user",
        "state",
        "decided_by",
        "decided_at",
        "created_at",
    )
    actions = ("approve", "reject")

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_add_permission(self, request: HttpRequest) -> bool:
        # Members apply in the portal; the admin decides.
        return False

    def decide(self, pk: int, *, decided_by: Any, approve: bool, comment: str) -> Any:
        """Apply the decision through the approval service (so the member is notified)."""
        raise NotImplementedError

    @admin.action(description=_("Approve the selected requests"))
    def approve(self, request: HttpRequest, queryset: QuerySet[Any]) -> None:
        self._decide_each(request, queryset, approve=True, comment=str(_("Approved in the admin.")))

    @admin.action(description=_("Reject the selected requests"))
    def reject(self, request: HttpRequest, queryset: QuerySet[Any]) -> None:
        self._decide_each(
            request, queryset, approve=False, comment=str(_("Rejected in the admin."))
        )

    def _decide_each(
        self, request: HttpRequest, queryset: QuerySet[Any], *, approve: bool, comment: str
    ) -> None:
        done = 0
        for obj in queryset:
            try:
                self.decide(
                    obj.pk, decided_by=request_user(request), approve=approve, comment=comment
                )
            except DomainError as exc:
                self.message_user(request, f"{obj}: {exc.message}", messages.WARNING)
            else:
                done += 1
        self.message_user(
            request,
            ngettext("%d request decided.", "%d requests decided.", done) % done,
            messages.SUCCESS,
        )


@admin.register(PriorityGrant)
class PriorityGrantAdmin(ApprovalAdmin):
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
    readonly_fields = (
        *ApprovalAdmin.readonly_fields,
        "queue",
        "reason",
        "deadline",
        "gpus_expected",
    )

    def decide(self, pk: int, *, decided_by: Any, approve: bool, comment: str) -> Any:
        return approvals.grant_decide(
            grant_id=pk, decided_by=decided_by, approve=approve, comment=comment
        )


@admin.register(EmergencyRequest)
class EmergencyRequestAdmin(ApprovalAdmin):
    list_display = ("user", "hours", "state", "created_at", "decided_by", "expires_at")
    list_filter = ("state",)
    search_fields = ("user__username", "reason")
    readonly_fields = (*ApprovalAdmin.readonly_fields, "jobs", "reason", "hours", "expires_at")

    def decide(self, pk: int, *, decided_by: Any, approve: bool, comment: str) -> Any:
        return approvals.emergency_decide(
            request_id=pk, decided_by=decided_by, approve=approve, comment=comment
        )
