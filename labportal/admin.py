"""The audit log in the admin: who changed which rule, when, from what to what.

django-auditlog's entries (labportal/audit.py says which models are logged), shown to
every lab admin (staff, as everywhere in the portal, not only superusers), read-only,
and in the reader's language: auditlog ships no Chinese, so the columns, the filters
and the values are ours.
"""

from __future__ import annotations

from typing import Any

from auditlog.admin import LogEntryAdmin
from auditlog.models import LogEntry
from django.contrib import admin
from django.core.exceptions import FieldDoesNotExist
from django.db.models import Field, Model, QuerySet
from django.http import HttpRequest
from django.urls import NoReverseMatch, reverse
from django.utils import formats, timezone
from django.utils.dateformat import format as date_format
from django.utils.dateparse import parse_datetime
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString, mark_safe
from django.utils.text import capfirst
from django.utils.translation import gettext, gettext_noop
from django.utils.translation import gettext_lazy as _

from core.audit_log import AuditedModelFilter
from core.duration_fields import format_duration

# auditlog's own names of its app and model, which the admin shows in headings and
# breadcrumbs: listed here so that our catalogue translates them.
AUDITLOG_NAMES = (
    gettext_noop("Audit log"),
    gettext_noop("log entry"),
    gettext_noop("log entries"),
    # An entry's own page is headed with these.
    gettext_noop("Created {repr:s}"),
    gettext_noop("Updated {repr:s}"),
    gettext_noop("Deleted {repr:s}"),
)

ACTIONS = {
    LogEntry.Action.CREATE: _("added"),
    LogEntry.Action.UPDATE: _("changed"),
    LogEntry.Action.DELETE: _("deleted"),
}
# Rows of old → new values in the list; the entry's own page shows them all.
SUMMARY_ROWS = 4
LONGEST_VALUE = 140


class ActionFilter(admin.SimpleListFilter):
    title = _("kind of change")
    parameter_name = "action"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, Any]]:
        return [(str(action), label) for action, label in ACTIONS.items()]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        if self.value() not in {str(action) for action in ACTIONS}:
            return queryset
        return queryset.filter(action=int(str(self.value())))


def _model_field(model: type[Model] | None, name: str) -> Field[Any, Any] | None:
    """The model's field of that name; None for a field since removed, or a relation's far end."""
    if model is None:
        return None
    try:
        field = model._meta.get_field(name)
    except FieldDoesNotExist:
        return None
    return field if isinstance(field, Field) else None


def _durations(model: type[Model] | None) -> dict[str, Any]:
    """The fields the model's admin form writes as durations (2h, 1d 6h), with their labels."""
    if model is None or not admin.site.is_registered(model):
        return {}
    return dict(getattr(admin.site.get_model_admin(model), "duration_labels", {}))


def _value_text(model: type[Model] | None, name: str, value: Any) -> str:
    """A stored value (auditlog keeps text) as the admin's form shows it."""
    if value is None or value == "None":
        return "—"
    text = str(value)
    field = _model_field(model, name)
    if name in _durations(model) and text.isdigit():
        return format_duration(int(text))
    if field is not None and field.flatchoices:
        return str(dict((str(k), v) for k, v in field.flatchoices).get(text, text))
    if field is not None and field.get_internal_type() == "BooleanField":
        return gettext("yes") if text == "True" else gettext("no")
    if field is not None and field.get_internal_type() == "DateTimeField":
        moment = parse_datetime(text)
        if moment is not None:
            return str(formats.localize(timezone.localtime(moment)))
    return text if len(text) <= LONGEST_VALUE else text[:LONGEST_VALUE] + "…"


def _field_label(model: type[Model] | None, name: str) -> str:
    durations = _durations(model)
    if name in durations:
        return str(capfirst(durations[name]))
    return str(capfirst(getattr(_model_field(model, name), "verbose_name", name)))


def _is_reverse_relation(model: type[Model] | None, name: str) -> bool:
    """Another model's key to this one, which auditlog lists (as nothing) when a row is added."""
    try:
        field = model._meta.get_field(name) if model is not None else None
    except FieldDoesNotExist:
        return False
    return field is not None and field.auto_created and not field.concrete


def change_rows(entry: Any) -> list[tuple[str, str, str]]:
    """(field, old value, new value) of an entry, as the admin's forms name and show them."""
    model = entry.content_type.model_class()
    return [
        (
            _field_label(model, name),
            _value_text(model, name, values[0]),
            _value_text(model, name, values[1]),
        )
        for name, values in sorted(entry.changes_dict.items())
        if isinstance(values, list | tuple)
        and len(values) == 2
        and not _is_reverse_relation(model, name)
    ]


admin.site.unregister(LogEntry)


@admin.register(LogEntry)
class AuditLogEntryAdmin(LogEntryAdmin):
    """Read-only for every lab admin; nobody edits or deletes history (auditlog's own rule)."""

    list_display = ["when", "who", "what", "action_label", "changes_summary"]
    list_display_links = ["when"]
    list_filter = [ActionFilter, AuditedModelFilter]
    readonly_fields = ["when", "who", "what", "action_label", "changes_table"]
    fieldsets = [
        (None, {"fields": ["when", "who", "what", "action_label"]}),
        (_("Old and new values"), {"fields": ["changes_table"]}),
    ]

    def has_module_permission(self, request: HttpRequest) -> bool:
        return bool(request.user.is_active and request.user.is_staff)

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return bool(request.user.is_active and request.user.is_staff)

    @admin.display(description=_("when"), ordering="timestamp")
    def when(self, entry: Any) -> str:
        return date_format(timezone.localtime(entry.timestamp), "Y-m-d H:i:s")

    @admin.display(description=_("who"), ordering="actor")
    def who(self, entry: Any) -> str:
        if entry.actor is not None:
            return str(entry.actor)
        return entry.actor_email or gettext("the portal (no one signed in)")

    @admin.display(description=_("what"))
    def what(self, entry: Any) -> str:
        model = entry.content_type.model_class()
        kind = capfirst(model._meta.verbose_name) if model is not None else entry.content_type
        # A one-row policy is named after its kind: say it once.
        same = str(kind) == entry.object_repr
        label = str(kind) if same else f"{kind}{gettext(': ')}{entry.object_repr}"
        try:
            url = reverse(
                f"admin:{entry.content_type.app_label}_{entry.content_type.model}_change",
                args=[entry.object_pk],
            )
        except NoReverseMatch:
            return label
        return format_html('<a href="{}">{}</a>', url, label)

    @admin.display(description=_("kind of change"), ordering="action")
    def action_label(self, entry: Any) -> str:
        return str(ACTIONS.get(entry.action, entry.get_action_display()))

    @admin.display(description=_("old → new"))
    def changes_summary(self, entry: Any) -> SafeString | str:
        if entry.action == LogEntry.Action.DELETE:
            return ""
        rows = change_rows(entry)
        sep = gettext(": ")  # full-width in Chinese
        lines = [
            (label, sep, new if entry.action == LogEntry.Action.CREATE else f"{old} → {new}")
            for label, old, new in rows[:SUMMARY_ROWS]
        ]
        summary = format_html_join(mark_safe("<br>"), "{}{}{}", lines)
        if len(rows) > SUMMARY_ROWS:
            more = gettext("and %(count)d more") % {"count": len(rows) - SUMMARY_ROWS}
            summary = format_html("{}<br>{}", summary, more)
        return summary

    @admin.display(description=_("old → new"))
    def changes_table(self, entry: Any) -> SafeString | str:
        rows = change_rows(entry)
        if not rows:
            return "—"
        return format_html(
            "<table><thead><tr><th>{}</th><th>{}</th><th>{}</th></tr></thead><tbody>{}</tbody></table>",
            gettext("setting"),
            gettext("before"),
            gettext("after"),
            format_html_join("", "<tr><td>{}</td><td>{}</td><td>{}</td></tr>", rows),
        )
