"""Input of the booking pages. Validation of shape only; the booking rules live in the services."""

from __future__ import annotations

from decimal import Decimal
from typing import Any, cast

from django import forms
from django.db.models import QuerySet
from django.utils.safestring import SafeString
from django.utils.translation import get_language, ngettext
from django.utils.translation import gettext_lazy as _

from cluster.models import Gpu, Node

DATETIME_INPUT = forms.DateTimeInput(
    attrs={"type": "datetime-local", "step": 60}, format="%Y-%m-%dT%H:%M"
)


class BookingForm(forms.Form):
    gpus = forms.ModelMultipleChoiceField(
        label=_("GPUs"),
        queryset=Gpu.objects.none(),
        required=False,
        widget=forms.CheckboxSelectMultiple,
        help_text=_("Pick whole GPUs, or leave empty and give a node and a number of GPUs."),
    )
    node = forms.ModelChoiceField(label=_("node"), queryset=Node.objects.none(), required=False)
    gpu_count = forms.IntegerField(
        label=_("number of GPUs"), min_value=1, max_value=64, required=False
    )
    start = forms.DateTimeField(label=_("start"), widget=DATETIME_INPUT)
    end = forms.DateTimeField(label=_("end"), widget=DATETIME_INPUT)
    note = forms.CharField(label=_("note"), max_length=200, required=False)
    maintenance = forms.BooleanField(label=_("maintenance (admins only)"), required=False)

    def __init__(self, *args: Any, user: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        gpus = cast(forms.ModelMultipleChoiceField, self.fields["gpus"])
        gpus.queryset = (
            Gpu.objects.filter(kind=Gpu.Kind.WHOLE)
            .select_related("node")
            .order_by("node__name", "index")
        )
        gpus.label_from_instance = lambda gpu: f"{gpu.label} · {gpu.model}"  # type: ignore[method-assign,assignment]
        node = cast(forms.ModelChoiceField, self.fields["node"])
        node.queryset = Node.objects.order_by("name")
        if not user.is_staff:
            del self.fields["maintenance"]

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        gpus, node, count = data.get("gpus"), data.get("node"), data.get("gpu_count")
        if gpus and (node or count):
            raise forms.ValidationError(
                _("Choose either GPUs, or a node and a number of GPUs — not both.")
            )
        if "gpu_count" in self.errors:
            return data  # the number's own error says what is wrong with it
        if not gpus and not (node and count):
            raise forms.ValidationError(_("Choose the GPUs, or a node and a number of GPUs."))
        if node and count:
            whole = node.gpus.filter(kind=Gpu.Kind.WHOLE).count()
            if count > whole:
                self.add_error(
                    "gpu_count",
                    ngettext(
                        "%(node)s has %(whole)d GPU: book at most that, or pick GPUs on "
                        "several nodes above.",
                        "%(node)s has %(whole)d GPUs: book at most that many, or pick GPUs "
                        "on several nodes above.",
                        whole,
                    )
                    % {"node": node.name, "whole": whole},
                )
                return data
        if data.get("start") and data.get("end") and data["end"] <= data["start"]:
            raise forms.ValidationError(_("The end must be after the start."))
        return data


def _nodes_up() -> QuerySet[Node]:
    """The nodes a suggestion may be limited to."""
    return Node.objects.filter(state=Node.State.UP).order_by("name")


class SuggestForm(forms.Form):
    gpu_count = forms.IntegerField(label=_("GPUs"), min_value=1, max_value=64, initial=1)
    hours = forms.DecimalField(
        label=_("hours"),
        min_value=Decimal("0.25"),
        max_value=Decimal("720"),
        decimal_places=2,
        initial=2,
    )
    node = forms.ModelChoiceField(
        label=_("node"), queryset=Node.objects.none(), required=False, empty_label=_("any node")
    )
    after = forms.DateTimeField(label=_("not before"), widget=DATETIME_INPUT, required=False)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        node = cast(forms.ModelChoiceField, self.fields["node"])
        node.queryset = _nodes_up()


# The calendar's empty suggest form, by language and the nodes it offers.
_EMPTY_SUGGEST_FORMS: dict[tuple[str, tuple[tuple[int, str], ...]], SafeString] = {}


def empty_suggest_form_html() -> SafeString:
    """The calendar's unbound suggest form as HTML (``as_p``). Rendering its four fields
    through Django's form templates was a fifth of the calendar page's CPU, and an unbound
    form differs only by the language and by the nodes it offers: one query asks for
    those, and the HTML is rendered once per combination."""
    form = SuggestForm()
    nodes = tuple(_nodes_up().values_list("pk", "name"))
    key = (get_language() or "", nodes)
    html = _EMPTY_SUGGEST_FORMS.get(key)
    if html is None:
        if len(_EMPTY_SUGGEST_FORMS) >= 32:  # nodes come and go: keep only recent ones
            _EMPTY_SUGGEST_FORMS.clear()
        html = _EMPTY_SUGGEST_FORMS[key] = form.as_p()
    return html


class ExtendForm(forms.Form):
    hours = forms.DecimalField(
        label=_("extend by (hours)"),
        min_value=Decimal("0.25"),
        max_value=Decimal("168"),
        decimal_places=2,
        initial=1,
    )
