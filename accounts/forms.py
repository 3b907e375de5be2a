from __future__ import annotations

from datetime import date
from typing import Any, cast

from django import forms
from django.utils.translation import gettext_lazy as _


class TokenCreateForm(forms.Form):
    name = forms.CharField(
        label=_("Name"),
        max_length=80,
        help_text=_("What the token is for, e.g. 'laptop labctl'."),
    )
    lifetime_days = forms.IntegerField(
        label=_("Valid for (days)"),
        min_value=1,
        max_value=366,
        required=False,
        help_text=_("Leave empty for a token that does not expire."),
    )


# A month as YYYY-MM, from year 1000 on: "0000-01" matched \d{4} and then failed to
# become a date (a 500).
MONTH_PATTERN = r"[1-9]\d{3}-(0[1-9]|1[0-2])"


class LedgerFilterForm(forms.Form):
    """Filters of the My credits ledger: one kind and/or one month (YYYY-MM)."""

    kind = forms.ChoiceField(label=_("Kind"), required=False)
    month = forms.RegexField(
        label=_("Month"),
        required=False,
        regex=rf"^{MONTH_PATTERN}$",
        error_messages={"invalid": _("Give the month as YYYY-MM, e.g. 2025-03.")},
    )

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        from accounts.models import LedgerEntry

        super().__init__(*args, **kwargs)
        kind = cast(forms.ChoiceField, self.fields["kind"])
        kind.choices = [("", _("All kinds")), *LedgerEntry.Kind.choices]

    def month_start(self) -> date | None:
        value = self.cleaned_data.get("month") if self.is_valid() else None
        if not value:
            return None
        year, month = value.split("-")
        return date(int(year), int(month), 1)
