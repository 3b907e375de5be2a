from __future__ import annotations

from django import forms
from django.utils.translation import gettext_lazy as _


class RuleSuggestionForm(forms.Form):
    topic = forms.CharField(
        label=_("Which rule"),
        max_length=120,
        help_text=_("For example: the debug queue's time limit, or booking hours per week."),
    )
    text = forms.CharField(
        label=_("Your suggestion and why"),
        max_length=4000,
        widget=forms.Textarea(attrs={"rows": 5}),
    )
