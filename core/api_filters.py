"""The API's list filters, on django-filter: each one is checked (a value it cannot hold is a
400 that names the values it can) and documented in the OpenAPI schema (drf-spectacular
reads the FilterSets). Each app's FilterSets sit next to its viewsets, in its api.py."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import django_filters
from django import forms
from django.core.exceptions import ValidationError
from django.db.models import Q, QuerySet
from django.utils.translation import gettext_lazy as _
from django_filters import fields as filter_fields


class _ChoiceField(filter_fields.ChoiceField):
    unknown = _("Unknown value “%(value)s”; use one of: %(allowed)s.")

    def validate(self, value: Any) -> None:
        try:
            super().validate(value)
        except ValidationError as error:
            if error.code != "invalid_choice":
                raise
            allowed = ", ".join(str(v) for v, _label in self.choices if v != "")
            raise ValidationError(
                self.unknown, code="invalid_choice", params={"value": value, "allowed": allowed}
            ) from None


class _CSVField(filter_fields.BaseCSVField):
    unknown = _("Unknown value “%(value)s”; use one or more of: %(allowed)s.")

    def clean(self, value: Any) -> Any:
        # "pending, running" and a trailing comma are what people type.
        if isinstance(value, list):
            value = [v.strip() for v in value if v.strip()]
        return super().clean(value)


class ChoiceFilter(django_filters.ChoiceFilter):
    """One of `choices`."""

    field_class = _ChoiceField


class ChoicesFilter(django_filters.BaseInFilter, ChoiceFilter):
    """One or more of `choices`, comma-separated (`?state=pending,running`); empty: no filter."""

    base_field_class = _CSVField

    def __init__(self, *, choices: Iterable[tuple[str, Any]], help_text: str, **kwargs: Any):
        super().__init__(
            choices=list(choices),
            help_text=f"{help_text} One or more, comma-separated.",
            **kwargs,
        )


FLAG_VALUES = [("true", "true"), ("false", "false"), ("1", "1"), ("0", "0")]


class FlagFilter(ChoiceFilter):
    """`true` or `1`: only the rows `only` selects; `false`, `0` or absent: no filter."""

    def __init__(self, *, only: Q, help_text: str, **kwargs: Any):
        self.only = only
        super().__init__(
            choices=FLAG_VALUES,
            method=self.filter_flag,
            help_text=f"{help_text} `false` (the default): no filter.",
            **kwargs,
        )

    def filter_flag(self, queryset: QuerySet[Any], name: str, value: str) -> QuerySet[Any]:
        return queryset.filter(self.only) if value in ("true", "1") else queryset


class _RegexField(forms.RegexField):
    def __init__(self, *, regex: str, example: str, **kwargs: Any):
        kwargs.setdefault("error_messages", {})["invalid"] = example
        super().__init__(regex=rf"^{regex}$", **kwargs)


class PatternFilter(django_filters.CharFilter):
    """Free text of one form (`regex`); `example` is the message when it is not."""

    field_class = _RegexField
