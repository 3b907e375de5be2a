from __future__ import annotations

from decimal import Decimal
from typing import Any, cast

from django import forms
from django.utils import timezone
from django.utils.translation import gettext_lazy as _
from django_stubs_ext import StrOrPromise

from jobqueue.models import ContainerImage, Job, Queue


class SessionStartForm(forms.Form):
    kind = forms.ChoiceField(
        label=_("Kind"),
        choices=[(Job.Kind.JUPYTER, _("JupyterLab")), (Job.Kind.TERMINAL, _("Terminal"))],
        widget=forms.RadioSelect,
        initial=Job.Kind.JUPYTER,
    )
    image = forms.ModelChoiceField(
        label=_("Image"),
        queryset=ContainerImage.objects.filter(enabled=True),
        to_field_name="reference",
        empty_label=None,
        help_text=_("JupyterLab needs an image with jupyterlab installed."),
    )
    queue = forms.ModelChoiceField(
        label=_("Queue"),
        queryset=Queue.objects.filter(is_active=True),
        to_field_name="name",
        empty_label=None,
        initial="debug",
    )
    gpus = forms.IntegerField(label=_("GPUs"), min_value=1, max_value=64, initial=1)
    shared_slot = forms.BooleanField(
        label=_("Use one shared GPU slot (debug queue)"), required=False
    )
    time_limit_hours = forms.DecimalField(
        label=_("Time limit (hours)"),
        min_value=Decimal("0.05"),
        max_value=Decimal("2000"),
        decimal_places=2,
        required=False,
        help_text=_(
            "Leave empty for the queue's default. An idle session is stopped after a warning."
        ),
    )
    reservation = forms.TypedChoiceField(
        label=_("Run in my reservation"), required=False, coerce=int, empty_value=None
    )

    def __init__(self, *args: Any, user: Any = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        choices: list[tuple[int | str, StrOrPromise]] = [("", _("none"))]
        if user is not None:
            for r in (
                Job.reservation_model().objects.live().filter(user=user, end__gt=timezone.now())
            ):
                start, end = timezone.localtime(r.start), timezone.localtime(r.end)
                choices.append((r.pk, f"#{r.pk} {start:%Y-%m-%d %H:%M}–{end:%H:%M}"))
        cast(forms.TypedChoiceField, self.fields["reservation"]).choices = choices

    def start_arguments(self) -> dict[str, Any]:
        """``sessions.services.session_start``'s arguments, less the owner."""
        data = self.cleaned_data
        hours = data["time_limit_hours"]
        return {
            "kind": data["kind"],
            "image": data["image"].reference,
            "queue": data["queue"].name,
            "gpus": data["gpus"],
            "shared_slot": data["shared_slot"],
            "time_limit_s": int(hours * 3600) if hours else None,
            "reservation_id": data["reservation"],
        }
