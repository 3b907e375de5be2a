from __future__ import annotations

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
