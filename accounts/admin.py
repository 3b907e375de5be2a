from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.contrib.auth.admin import UserAdmin as DjangoUserAdmin
from django.contrib.auth.forms import PasswordResetForm
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils.translation import gettext_lazy as _
from django.utils.translation import ngettext

from accounts.models import Category, PersonalAccessToken, User


@admin.register(Category)
class CategoryAdmin(admin.ModelAdmin[Category]):
    list_display = (
        "name",
        "fairshare_weight",
        "credit_multiplier",
        "max_concurrent_gpus",
        "max_queued_jobs",
        "max_booked_hours_per_week",
    )
    search_fields = ("name",)


@admin.register(User)
class UserAdmin(DjangoUserAdmin):
    list_display = ("username", "email", "category", "approval", "is_staff", "is_active")
    list_filter = ("approval", "category", "is_staff", "is_active")
    fieldsets = (
        *DjangoUserAdmin.fieldsets,
        (_("Lab"), {"fields": ("category", "approval", "unix_uid", "unix_gid", "preferred_language")}),
    )
    add_fieldsets = (
        *DjangoUserAdmin.add_fieldsets,
        (_("Lab"), {"fields": ("email", "category")}),
    )
    actions = ("approve_signups", "reject_signups", "send_invitations")

    @admin.action(description=_("Approve the selected sign-ups"))
    def approve_signups(self, request: HttpRequest, queryset: QuerySet[User]) -> None:
        count = queryset.exclude(approval=User.Approval.APPROVED).update(
            approval=User.Approval.APPROVED, is_active=True
        )
        self.message_user(
            request,
            ngettext("%d sign-up approved.", "%d sign-ups approved.", count) % count,
            messages.SUCCESS,
        )

    @admin.action(description=_("Reject the selected sign-ups"))
    def reject_signups(self, request: HttpRequest, queryset: QuerySet[User]) -> None:
        count = queryset.filter(approval=User.Approval.PENDING).update(
            approval=User.Approval.REJECTED
        )
        self.message_user(
            request,
            ngettext("%d sign-up rejected.", "%d sign-ups rejected.", count) % count,
            messages.SUCCESS,
        )

    @admin.action(description=_("Send an invitation (a link to set the password)"))
    def send_invitations(self, request: HttpRequest, queryset: QuerySet[User]) -> None:
        sent = 0
        for user in queryset.exclude(email=""):
            form = PasswordResetForm({"email": user.email})
            if form.is_valid():
                form.save(
                    request=request,
                    use_https=request.is_secure(),
                    subject_template_name="accounts/invitation_subject.txt",
                    email_template_name="accounts/invitation_email.txt",
                )
                sent += 1
        self.message_user(
            request,
            ngettext("%d invitation sent.", "%d invitations sent.", sent) % sent,
            messages.SUCCESS,
        )


@admin.register(PersonalAccessToken)
class PersonalAccessTokenAdmin(admin.ModelAdmin[PersonalAccessToken]):
    list_display = ("name", "user", "token_prefix", "created_at", "last_used_at", "expires_at", "revoked_at")
    list_filter = ("revoked_at",)
    readonly_fields = ("token_prefix", "token_hash", "created_at", "last_used_at")
    actions = ("revoke_tokens",)

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        # The secret is shown once, on the member's own token page.
        return False

    @admin.action(description=_("Revoke the selected tokens"))
    def revoke_tokens(self, request: HttpRequest, queryset: QuerySet[PersonalAccessToken]) -> None:
        for token in queryset:
            token.revoke()
