from __future__ import annotations

import uuid
from typing import Any
from urllib.parse import urlsplit

from django import forms
from django.conf import settings
from django.contrib import admin, messages
from django.contrib.auth.admin import UserAdmin as DjangoUserAdmin
from django.contrib.auth.forms import PasswordResetForm
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils.translation import gettext_lazy as _
from django.utils.translation import ngettext

from accounts.auth import request_user
from accounts.models import (
    Category,
    CreditAccount,
    CreditPolicy,
    JobEfficiency,
    LedgerEntry,
    Notification,
    PersonalAccessToken,
    Project,
    User,
)
from accounts.services import grant_when_committed


@admin.register(Category)
class CategoryAdmin(admin.ModelAdmin[Category]):
    list_display = (
        "name",
        "name_zh_hans",
        "fairshare_weight",
        "credit_multiplier",
        "max_concurrent_gpus",
        "max_queued_jobs",
        "max_booked_hours_per_week",
    )
    search_fields = ("name", "name_zh_hans")


@admin.register(User)
class UserAdmin(DjangoUserAdmin):
    list_display = ("username", "email", "category", "approval", "is_staff", "is_active")
    list_filter = ("approval", "category", "is_staff", "is_active")
    fieldsets = (
        *(DjangoUserAdmin.fieldsets or ()),
        (
            _("Lab"),
            {"fields": ("category", "approval", "unix_uid", "unix_gid", "preferred_language")},
        ),
    )
    add_fieldsets = (
        *DjangoUserAdmin.add_fieldsets,
        (_("Lab"), {"fields": ("email", "category")}),
    )
    actions = ("approve_signups", "reject_signups", "send_invitations")

    def save_model(self, request: HttpRequest, obj: User, form: Any, change: bool) -> None:
        super().save_model(request, obj, form, change)
        if change and {"approval", "is_active"} & set(form.changed_data):
            grant_when_committed([obj.pk])  # approved here: this month's credits now

    @admin.action(description=_("Approve the selected sign-ups"))
    def approve_signups(self, request: HttpRequest, queryset: QuerySet[User]) -> None:
        approved = list(
            queryset.exclude(approval=User.Approval.APPROVED).values_list("pk", flat=True)
        )
        count = User.objects.filter(pk__in=approved).update(
            approval=User.Approval.APPROVED, is_active=True
        )
        grant_when_committed(approved)  # their first credits now, not at the hourly pass
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
                # The link is built on SITE_URL, not on whatever host the admin used.
                site = urlsplit(settings.LABPORTAL_SITE_URL)
                form.save(
                    request=request,
                    domain_override=site.netloc,
                    use_https=site.scheme == "https",
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
    list_display = (
        "name",
        "user",
        "token_prefix",
        "created_at",
        "last_used_at",
        "expires_at",
        "revoked_at",
    )
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


@admin.register(CreditPolicy)
class CreditPolicyAdmin(admin.ModelAdmin[CreditPolicy]):
    fieldsets = (
        (_("Monthly grant"), {"fields": ("base_grant", "carry_over", "carry_over_cap")}),
        (_("Charging"), {"fields": ("charge_interval_minutes", "low_credit_threshold")}),
        (
            _("Efficiency reward"),
            {
                "fields": (
                    "efficiency_threshold_pct",
                    "efficiency_reward_share",
                    "idle_threshold_pct",
                )
            },
        ),
        (_("Reservations"), {"fields": ("reservation_rate", "no_show_window_minutes")}),
        (
            _("Emergencies"),
            {
                "fields": (
                    "emergency_max_uses",
                    "emergency_period_days",
                    "emergency_default_hours",
                    "emergency_max_hours",
                )
            },
        ),
    )

    def has_add_permission(self, request: HttpRequest) -> bool:
        return not CreditPolicy.objects.exists()

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(CreditAccount)
class CreditAccountAdmin(admin.ModelAdmin[CreditAccount]):
    list_display = ("user", "balance")
    search_fields = ("user__username",)
    readonly_fields = ("user", "balance", "created_at")

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


class AdjustmentForm(forms.ModelForm):
    user = forms.ModelChoiceField(queryset=User.objects.all(), label=_("Member"))

    class Meta:
        model = LedgerEntry
        fields = ("amount", "note")


@admin.register(LedgerEntry)
class LedgerEntryAdmin(admin.ModelAdmin[LedgerEntry]):
    """Read-only ledger; "add" posts an adjustment through the ledger service."""

    list_display = ("created_at", "account", "kind", "amount", "balance_after", "job", "note")
    list_filter = ("kind",)
    search_fields = ("account__user__username", "note", "idempotency_key")
    date_hierarchy = "created_at"

    def get_form(
        self, request: HttpRequest, obj: Any = None, change: bool = False, **kwargs: Any
    ) -> Any:
        if obj is None:
            kwargs["form"] = AdjustmentForm
            kwargs["fields"] = ("amount", "note")
        return super().get_form(request, obj, change=change, **kwargs)

    def get_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        if obj is None:
            return ("user", "amount", "note")
        return super().get_fields(request, obj)

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        if obj is None:
            return ()
        return [f.name for f in LedgerEntry._meta.fields]

    def save_model(self, request: HttpRequest, obj: LedgerEntry, form: Any, change: bool) -> None:
        from accounts.services import ledger_post

        entry = ledger_post(
            user=form.cleaned_data["user"],
            amount=form.cleaned_data["amount"],
            kind=LedgerEntry.Kind.ADJUSTMENT,
            idempotency_key=f"adjustment:{uuid.uuid4()}",
            note=form.cleaned_data["note"],
            created_by=request_user(request),
        )
        obj.pk, obj._state.adding = entry.pk, False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(Notification)
class NotificationAdmin(admin.ModelAdmin[Notification]):
    list_display = ("created_at", "user", "kind", "title", "read_at", "emailed_at")
    list_filter = ("kind",)
    search_fields = ("user__username", "title")
    readonly_fields = (
        "user",
        "kind",
        "title",
        "body",
        "url",
        "dedupe_key",
        "created_at",
        "read_at",
        "emailed_at",
    )

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False


@admin.register(JobEfficiency)
class JobEfficiencyAdmin(admin.ModelAdmin[JobEfficiency]):
    list_display = ("job", "verdict", "mean_util_pct", "sample_count", "created_at")
    list_filter = ("verdict",)
    readonly_fields = ("job", "verdict", "mean_util_pct", "sample_count", "created_at")

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False


@admin.register(Project)
class ProjectAdmin(admin.ModelAdmin[Project]):
    list_display = ("name", "title", "pi", "grant_reference", "active")
    list_filter = ("active",)
    search_fields = ("name", "title", "title_zh_hans", "grant_reference")
    filter_horizontal = ("members",)
    autocomplete_fields = ("pi",)
