from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils.translation import gettext_lazy as _

from cluster.errors import SlotsRefused
from cluster.models import Gpu, Node, NodeToken, NodeTokenQuerySet, RejectedMessage


class GpuSlotsForm(forms.ModelForm[Gpu]):
    """Refuses a shared-slot change the service would refuse (in use, MIG, bad count)."""

    class Meta:
        model = Gpu
        fields = ("index", "model", "memory_mb", "shared_slots", "state")

    def clean_shared_slots(self) -> int:
        from cluster.services import gpu_shared_slots_check

        slots = int(self.cleaned_data["shared_slots"] or 0)
        if self.instance.pk is not None:
            current = Gpu.objects.get(pk=self.instance.pk)
            try:
                gpu_shared_slots_check(gpu=current, slots=slots)
            except SlotsRefused as exc:
                raise forms.ValidationError(str(exc.message)) from exc
        return slots


def _apply_shared_slots(gpu: Gpu) -> None:
    """Create or remove the GPU's slot rows to match its `shared_slots`."""
    from cluster.services import gpu_set_shared_slots

    if gpu.kind == Gpu.Kind.WHOLE:
        gpu_set_shared_slots(gpu_id=gpu.pk, slots=gpu.shared_slots)


class GpuInline(admin.TabularInline[Gpu, Node]):
    model = Gpu
    form = GpuSlotsForm
    fk_name = "node"
    extra = 0
    fields = ("index", "uuid", "model", "memory_mb", "kind", "shared_slots", "state")
    readonly_fields = ("uuid", "model", "memory_mb", "kind")
    show_change_link = True


@admin.register(Node)
class NodeAdmin(admin.ModelAdmin[Node]):
    list_display = (
        "name",
        "state",
        "drain_requested",
        "gpu_backend",
        "runtime",
        "agent_version",
        "last_heartbeat",
        "registered_at",
    )
    list_filter = ("state", "drain_requested", "gpu_backend", "runtime")
    search_fields = ("name", "address", "hostname")
    # The agent reports these; the admin sets name, address, labels and drain.
    readonly_fields = (
        "state",
        "last_heartbeat",
        "down_since",
        "jobs_lost_at",
        "registered_at",
        "gpu_backend",
        "runtime",
        "agent_version",
        "hostname",
    )
    inlines = (GpuInline,)
    actions = ("drain", "undrain")

    def save_formset(self, request: HttpRequest, form: Any, formset: Any, change: bool) -> None:
        super().save_formset(request, form, formset, change)
        for gpu_form in formset.forms:
            if isinstance(gpu_form.instance, Gpu) and "shared_slots" in gpu_form.changed_data:
                _apply_shared_slots(gpu_form.instance)

    @admin.action(description=_("Drain: let running jobs finish, start nothing new"))
    def drain(self, request: HttpRequest, queryset: QuerySet[Node]) -> None:
        from cluster.services import node_set_drain

        for node in queryset:
            node_set_drain(node_id=node.pk, drain=True)
        self.message_user(request, _("Draining started."), messages.SUCCESS)

    @admin.action(description=_("Return to service (undrain)"))
    def undrain(self, request: HttpRequest, queryset: QuerySet[Node]) -> None:
        from cluster.services import node_set_drain

        for node in queryset:
            node_set_drain(node_id=node.pk, drain=False)
        self.message_user(request, _("Nodes returned to service."), messages.SUCCESS)


@admin.register(Gpu)
class GpuAdmin(admin.ModelAdmin[Gpu]):
    list_display = (
        "uuid",
        "node",
        "index",
        "model",
        "memory_mb",
        "kind",
        "state",
        "util_pct",
        "sampled_at",
    )
    list_filter = ("state", "kind", "model", "node")
    search_fields = ("uuid", "model", "node__name")
    form = GpuSlotsForm
    readonly_fields = ("uuid", "node", "kind", "parent")

    def save_model(self, request: HttpRequest, obj: Gpu, form: Any, change: bool) -> None:
        super().save_model(request, obj, form, change)
        if "shared_slots" in form.changed_data:
            _apply_shared_slots(obj)


@admin.register(NodeToken)
class NodeTokenAdmin(admin.ModelAdmin[NodeToken]):
    list_display = ("node_name", "name", "token_prefix", "created_at", "revoked_at")
    list_filter = ("revoked_at",)
    readonly_fields = ("token_prefix", "token_hash", "created_at")
    actions = ("revoke",)

    def save_model(self, request: HttpRequest, obj: NodeToken, form: object, change: bool) -> None:
        if change:
            super().save_model(request, obj, form, change)
            return
        token, secret = NodeToken.issue(node_name=obj.node_name, name=obj.name)
        obj.pk = token.pk
        obj.token_hash, obj.token_prefix, obj.created_at = (
            token.token_hash,
            token.token_prefix,
            token.created_at,
        )
        self.message_user(
            request,
            _(
                "Node token for %(node)s: %(secret)s — copy it now, it is not shown again. "
                "Start the agent with: labportal-agent --name %(node)s --token %(secret)s --broker <broker URL>"
            )
            % {"node": obj.node_name, "secret": secret},
            messages.WARNING,
        )

    @admin.action(description=_("Revoke the selected node tokens"))
    def revoke(self, request: HttpRequest, queryset: NodeTokenQuerySet) -> None:
        revoked = queryset.revoke()
        self.message_user(
            request,
            _("%(count)d token(s) revoked: agents using them are refused from now on.")
            % {"count": revoked},
            messages.SUCCESS,
        )


@admin.register(RejectedMessage)
class RejectedMessageAdmin(admin.ModelAdmin[RejectedMessage]):
    """Agent messages the portal refused: a wrong token, a GPU or job of another node, bad data."""

    list_display = ("node_name", "message", "reason", "count", "last_at", "first_at")
    list_filter = ("reason", "message", "node_name")
    search_fields = ("node_name", "last_detail")
    readonly_fields = (
        "node_name",
        "message",
        "reason",
        "count",
        "first_at",
        "last_at",
        "last_detail",
    )

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False
