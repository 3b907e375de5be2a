"""Links into the admin's audit log (django-auditlog's entries) filtered to some models, and
the admin's filter that reads them: one definition of the filter's parameter.

Which models are logged, and which of their fields, is labportal/audit.py's.
"""

from __future__ import annotations

from typing import Any

from auditlog.registry import auditlog
from django.contrib import admin
from django.contrib.admin.options import IncorrectLookupParameters
from django.contrib.contenttypes.models import ContentType
from django.db.models import Model, QuerySet
from django.http import HttpRequest
from django.urls import reverse
from django.utils.text import capfirst
from django.utils.translation import gettext_lazy as _

# django-auditlog's own name for it, so that its links and ours read the same.
MODELS_PARAMETER = "resource_type"


def audit_log_url(*models: type[Model]) -> str:
    """The admin's audit log of changes to these models, newest first; every change without."""
    url = reverse("admin:auditlog_logentry_changelist")
    if not models:
        return url
    types = ContentType.objects.get_for_models(*models)
    return f"{url}?{MODELS_PARAMETER}={','.join(str(types[m].pk) for m in models)}"


def content_type_ids(value: str) -> list[int]:
    """The content type ids of a ``MODELS_PARAMETER`` value ("12,14"); ValueError if not."""
    ids = [int(part) for part in value.split(",")]
    if not ids or any(i <= 0 for i in ids):
        raise ValueError(value)
    return ids


class AuditedModelFilter(admin.SimpleListFilter):
    """The log's entries about one kind of record, or about several (a rules page section)."""

    title = _("kind of record")
    parameter_name = MODELS_PARAMETER

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        types = ContentType.objects.get_for_models(*auditlog.get_models())
        return sorted(
            ((str(ct.pk), str(capfirst(m._meta.verbose_name_plural))) for m, ct in types.items()),
            key=lambda choice: choice[1],
        )

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        value = self.value()
        if value is None:
            return queryset
        try:
            return queryset.filter(content_type_id__in=content_type_ids(value))
        except ValueError as bad:
            raise IncorrectLookupParameters(bad) from bad
