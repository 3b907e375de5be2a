from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.utils.translation import get_language
from django.utils.translation import gettext as _
from django.views.decorators.http import require_POST

from core.executors import portal_schedules
from core.form_pages import form_page_status
from handbook.forms import RuleSuggestionForm
from handbook.manual import PAGES, PAGES_BY_SLUG, render_page
from handbook.selectors import lab_rules, rules_change_log, tutorial_steps
from handbook.services import onboarding_mark, rule_suggestion_create


def help_index(request: HttpRequest) -> HttpResponse:
    return redirect("help_page", slug=PAGES[0].slug)


def help_page(request: HttpRequest, slug: str) -> HttpResponse:
    """One manual page in the reader's language, with the table of contents beside it."""
    if slug not in PAGES_BY_SLUG:
        raise Http404(_("There is no manual page %(slug)s.") % {"slug": slug})
    language = get_language()
    contents = [render_page(page.slug, language) for page in PAGES]
    return render(
        request,
        "handbook/manual_page.html",
        {
            "page": render_page(slug, language),
            "member_pages": [p for p in contents if not p.page.for_admins],
            "admin_pages": [p for p in contents if p.page.for_admins],
        },
    )


@login_required
def rules(request: HttpRequest) -> HttpResponse:
    """The lab's rules from the live settings, and a form to suggest a change; in Slurm mode,
    how Slurm enforces each (docs/slurm.md, "Every rule on the rules page in Slurm")."""
    form = RuleSuggestionForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        rule_suggestion_create(author=request.user, **form.cleaned_data)  # type: ignore[arg-type]
        messages.success(request, _("Thank you: the admins will read your suggestion."))
        return redirect("rules")
    onboarding_mark(user=request.user, rules_read=True)  # type: ignore[arg-type]
    return render(
        request,
        "handbook/rules.html",
        # In Slurm mode each rule also says how Slurm enforces it, or that it does not.
        {
            "rules": lab_rules(),
            "form": form,
            "slurm_mode": not portal_schedules(),
            # Staff follow each "changed" date to the audit log; members see the dates.
            "change_log": rules_change_log() if request.user.is_staff else None,
        },
        status=form_page_status(request, form),
    )


@login_required
@require_POST
def onboarding_dismiss(request: HttpRequest) -> HttpResponse:
    onboarding_mark(user=request.user, dismissed=True)  # type: ignore[arg-type]
    return redirect("dashboard")


@login_required
def tutorial(request: HttpRequest) -> HttpResponse:
    """The guided first job: submit, watch, logs, booking, credits, each ticked from what the
    member did, with the link that does it."""
    steps = tutorial_steps(request.user)
    return render(
        request,
        "handbook/tutorial.html",
        {
            "steps": steps,
            "done_count": sum(step.done for step in steps),
            "next_step": next((step.key for step in steps if not step.done), None),
        },
    )
