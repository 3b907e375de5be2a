from __future__ import annotations

from decimal import Decimal
from typing import Any, cast

from django import forms
from django.utils import timezone
from django.utils.translation import gettext_lazy as _
from django_stubs_ext import StrOrPromise

from accounts.models import CreditPolicy, Project
from cluster.models import Gpu
from core.durations import hours_minutes
from jobqueue import executor
from jobqueue.arrays import array_indices
from jobqueue.dependencies import parse_dependency
from jobqueue.errors import JobRefused
from jobqueue.job_templates import TEMPLATE_FIELDS
from jobqueue.models import (
    ContainerImage,
    Job,
    Queue,
    SchedulingPolicy,
    VolumeMount,
    command_limit_refusal,
    env_limit_refusal,
)


class QueueChoiceField(forms.ModelChoiceField[Queue]):
    """A queue shown by its name and its title in the reader's language."""

    def label_from_instance(self, obj: Queue) -> str:
        return f"{obj.name} · {obj.local_title}" if obj.local_title else obj.name


class JobSubmitForm(forms.Form):
    name = forms.CharField(label=_("Name"), max_length=120, required=False)
    queue = QueueChoiceField(
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
    # No max_length: it would become the textarea's maxlength, and a browser cuts a longer
    # paste short without a word. clean_command refuses it with the limit instead.
    command = forms.CharField(
        label=_("Script"),
        widget=forms.Textarea(
            attrs={
                "rows": 6,
                "class": "script",
                "spellcheck": "false",
                "autocapitalize": "off",
                "placeholder": "cd /data\npython train.py --epochs 10",
            }
        ),
        help_text=_(
            "One command or a whole script, run as typed through /bin/sh -c, so ; && | "
            "and $VARIABLES work, one command per line."
        ),
    )
    array = forms.CharField(
        label=_("Array"),
        required=False,
        max_length=200,
        widget=forms.TextInput(attrs={"placeholder": "0-9"}),
        help_text=_(
            "Optional: 0-9 or 1,4,7 submits one job per index, all at once or none; "
            "each job finds its index in $LABPORTAL_ARRAY_INDEX."
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
    project = forms.ChoiceField(
        label=_("Charge to project"),
        required=False,
        help_text=_("The grant or project this work is for: the usage report counts it there."),
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
        if not Gpu.objects.filter(kind=Gpu.Kind.SLOT).exclude(state=Gpu.State.MISSING).exists():
            # No node offers shared slots (none set up, or Slurm mode: whole GPUs only).
            del self.fields["shared_slot"]
        if not executor.portal_schedules():
            # Slurm has no preemption set up for the portal: the box would promise nothing.
            del self.fields["preemptible"]
        else:
            self.fields["preemptible"].help_text = _(
                "May be stopped (SIGTERM, then %(grace)s to checkpoint) and requeued for an "
                "emergency or a booking; it pays %(pct)s%% of the queue's rate."
            ) % {
                "grace": hours_minutes(SchedulingPolicy.current().stop_grace_s),
                "pct": CreditPolicy.current().preemptible_rate_pct,
            }
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
        projects = list(Project.objects.open_to(user)) if user is not None else []
        if projects:
            cast(forms.ChoiceField, self.fields["project"]).choices = [("", _("none"))] + [
                (p.name, f"{p.name} · {p.display_title}") for p in projects
            ]
        else:
            del self.fields["project"]  # a member of no project has nothing to choose

    save_as_name = forms.CharField(label=_("Template name"), max_length=80, required=False)

    def clean_command(self) -> str:
        # A browser sends a textarea's line breaks as CRLF; the shell would see each \r.
        command: str = self.cleaned_data["command"].replace("\r\n", "\n").replace("\r", "\n")
        refusal = command_limit_refusal(command)
        if refusal is not None:
            raise forms.ValidationError(refusal)
        return command

    def clean_array(self) -> list[int]:
        text: str = self.cleaned_data["array"]
        if not text:
            return []
        try:
            return array_indices(text)
        except ValueError as exc:
            raise forms.ValidationError(str(exc)) from None

    def submit_spec(self) -> dict[str, Any]:
        """The submit service's arguments (less the owner); an array's indices are
        ``cleaned_data["array"]``."""
        data = self.cleaned_data
        hours = data["time_limit_hours"]
        spec = {
            "queue": data["queue"],
            "image": data["image"].reference,
            "command": data["command"],
            "gpus": data["gpus"],
            "shared_slot": data.get("shared_slot", False),
            "env": data["env"],
            "mounts": [m.name for m in data.get("mounts", [])],
            "time_limit_s": int(hours * 3600) if hours else None,
            "min_gpu_memory_mb": (data["min_gpu_memory_gb"] or 0) * 1024,
            "gpu_model": data["gpu_model"],
            "cpus": data["cpus"],
            "memory_mb": data["memory_gb"] * 1024,
            "name": data["name"],
            "reservation_id": data["reservation"],
            "preemptible": data.get("preemptible", False),
            "project": data.get("project", ""),
        }
        if data.get("run_after") is not None:  # "Run after": afterok:12:13
            spec["dependency"], spec["depends_on"] = data["run_after"]
        return spec

    def template_fields(self) -> dict[str, Any]:
        """The form's fields as typed, for a saved template (checked again when submitted)."""
        fields = {name: self[name].value() for name in TEMPLATE_FIELDS if name in self.fields}
        fields["command"] = self.cleaned_data["command"]
        fields["env"] = "\n".join(str(fields.get("env") or "").splitlines())
        return fields

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
