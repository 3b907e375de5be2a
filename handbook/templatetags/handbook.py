"""{% help_link "slug" %}: a link to a manual page, checked when the template compiles.

{{ value|as_count }}: a number as `{% blocktranslate count %}` needs it.

{% label_sep %}: what follows a label before its value, ": " in English and a full-width
"：" with no space in Chinese (a half-width colon and a space would touch Chinese text).
"""

from __future__ import annotations

from decimal import Decimal, InvalidOperation

from django import template
from django.urls import reverse
from django.utils.html import format_html
from django.utils.translation import gettext as _
from django.utils.translation import gettext_noop

from handbook.manual import PAGES_BY_SLUG

register = template.Library()


@register.simple_tag
def help_link(slug: str, text: str = "") -> str:
    if slug not in PAGES_BY_SLUG:
        # Fails the page's tests at once instead of shipping a dead link.
        raise template.TemplateSyntaxError(f"help_link: no manual page {slug!r}")
    return format_html(
        '<a class="helplink" href="{}" data-help="{}">{}</a>',
        reverse("help_page", args=[slug]),
        slug,
        text or _("Help"),
    )


@register.filter
def as_count(value: object) -> int:
    """The count that picks a plural form for a number: a whole one is itself, any other
    (1.5 credits, 0.7 a day) is plural in English, so it counts as 2."""
    try:
        number = Decimal(str(value))
    except InvalidOperation:
        return 2
    return int(number) if number == number.to_integral_value() else 2


# Django's form label suffix (label_tag) is its msgid ":", which Django's own zh-hans
# catalogue leaves half-width; ours translates it, and this keeps it in our catalogue.
FORM_LABEL_SUFFIX = gettext_noop(":")


@register.simple_tag
def label_sep() -> str:
    return _(": ")


@register.inclusion_tag("handbook/_checklist.html", takes_context=True)
def onboarding_checklist(context: template.Context) -> dict[str, object]:
    """A new member's first steps, ticked off as they do them, until done or put away."""
    from handbook.selectors import onboarding_checklist as checklist_for

    user = context.get("user")
    items = checklist_for(user) if user is not None and user.is_authenticated else None
    return {
        "items": {item.key: item.done for item in items} if items else None,
        "csrf_token": context.get("csrf_token"),
    }
