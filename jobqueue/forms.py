from __future__ import annotations

from decimal import Decimal
from typing import Any, cast

from django import forms
from django.utils import timezone
from django.utils.translation import gettext_lazy as _
from django_stubs_ext import StrOrPromise

from cluster.models import Gpu
from jobqueue.dependencies import parse_dependency
from jobqueue.errors import JobRefused
from jobqueue.models import (
    ContainerImage,
    Job,
    Queue,
    VolumeMount,
    command_limit_refusal,
    env_limit_refusal,
)


class JobSubmitForm(forms.Form):
    name = forms.CharField(label=_("Name"), max_length=120, required=False)
    queue = forms.ModelChoiceField(
        label=_("Queue"),
        queryset=Queue.objects.filter(is_active=True),
        to_field_name="name",
        empty_label=None,
    )
    image = forms.ModelChoiceField(
        label=_("Image"),
        queryset=ContainerImage.objects.filter(enabled=True),
        to_field_name="reference",
        empty_label=None,
    )
    # No max_length: it would become the input's maxlength, and a browser cuts a longer
    # paste short without a word. clean_command refuses it with the limit instead.
    command = forms.CharField(
        label=_("Command"),
        widget=forms.TextInput(attrs={"placeholder": "python train.py --epochs 10"}),
        help_text=_(
            "Runs as typed through /bin/sh -c, so ; && | and $VARIABLES work: "
            "cd /data && python train.py"
        ),
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
            "Leave empty for the queue's default. You are warned at the limit before anything happens."
        ),
    )
    gpu_model = forms.ChoiceField(label=_("GPU model"), required=False)
    min_gpu_memory_gb = forms.IntegerField(
        label=_("Minimum GPU memory (GiB)"), min_value=0, max_value=1024, required=False
    )
    cpus = forms.DecimalField(
        label=_("CPUs"),
        min_value=Decimal("0.1"),
        max_value=Decimal("256"),
        decimal_places=2,
        initial=4,
    )
    memory_gb = forms.IntegerField(label=_("Memory (GiB)"), min_value=1, max_value=4096, initial=16)
    env = forms.CharField(
        label=_("Environment"),
        required=False,
        widget=forms.Textarea(attrs={"rows": 3, "placeholder": "WANDB_MODE=offline"}),
        help_text=_("One NAME=value per line."),
    )
    mounts = forms.ModelMultipleChoiceField(
        label=_("Mounts"),
        queryset=VolumeMount.objects.filter(enabled=True),
        to_field_name="name",
        required=False,
        widget=forms.CheckboxSelectMultiple,
    )
    reservation = forms.TypedChoiceField(
        label=_("Run in my reservation"), required=False, coerce=int, empty_value=None
    )
    preemptible = forms.BooleanField(
        label=_("Preemptible"),
        required=False,
        help_text=_(
            "May be requeued for an emergency or a reservation; fine for jobs that checkpoint."
        ),
    )

    run_after = forms.CharField(
        label=_("Run after"),
        required=False,
        max_length=1000,
        help_text=_(
            "Optional: afterok:12:13 starts it after jobs 12 and 13 have completed; afterany:12 after job 12 has ended, however."
        ),
    )

    def clean_run_after(self) -> tuple[str, list[int]] | None:
        text = self.cleaned_data.get("run_after", "")
        if not text.strip():
            return None
        try:
            return parse_dependency(text)
        except JobRefused as refusal:
            raise forms.ValidationError(str(refusal.message)) from None

    def __init__(self, *args: Any, user: Any = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # Everyday work goes to `normal`; `high` needs a grant and `debug` is short.
        self.fields["queue"].initial = "normal"
        if not VolumeMount.objects.filter(enabled=True).exists():
            del self.fields["mounts"]
        models = sorted(
            set(Gpu.objects.exclude(state=Gpu.State.MISSING).values_list("model", flat=True))
        )
        gpu_model = cast(forms.ChoiceField, self.fields["gpu_model"])
        gpu_model.choices = [("", _("any"))] + [(m, m) for m in models]
        choices: list[tuple[int | str, StrOrPromise]] = [("", _("none"))]
        if user is not None:
            for r in (
                Job.reservation_model().objects.live().filter(user=user, end__gt=timezone.now())
            ):
                choices.append(
                    (
                        r.pk,
                        f"#{r.pk} {timezone.localtime(r.start):%Y-%m-%d %H:%M}–{timezone.localtime(r.end):%H:%M}",
                    )
                )
        cast(forms.TypedChoiceField, self.fields["reservation"]).choices = choices

    def clean_command(self) -> str:
        command: str = self.cleaned_data["command"]
        refusal = command_limit_refusal(command)
        if refusal is not None:
            raise forms.ValidationError(refusal)
        return command

    def clean_env(self) -> dict[str, str]:
        env: dict[str, str] = {}
        for number, line in enumerate(self.cleaned_data["env"].splitlines(), start=1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            if "=" not in line:
                raise forms.ValidationError(
                    _("Line %(n)d is not NAME=value: “%(line)s”.") % {"n": number, "line": line}
                )
            name, value = line.split("=", 1)
            env[name.strip()] = value
        refusal = env_limit_refusal(dict(env))
        if refusal is not None:
            raise forms.ValidationError(refusal)
        return env
