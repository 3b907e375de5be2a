"""What the pages with a form answer when the form is refused."""

from __future__ import annotations

from django import forms
from django.http import HttpRequest


def form_page_status(request: HttpRequest, form: forms.Form) -> int:
    """400 once a posted form is refused (the page shows what to change), as the API
    answers; 200 otherwise, and for htmx, which swaps only 2xx answers into the page."""
    if form.is_bound and form.errors and not getattr(request, "htmx", False):
        return 400
    return 200
