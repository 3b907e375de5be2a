from __future__ import annotations

from django.db import transaction
from django.urls import reverse
from django.utils.translation import gettext_lazy as _

from accounts.models import User
from accounts.services import notify
from handbook.models import RuleSuggestion


@transaction.atomic
def rule_suggestion_create(*, author: User, topic: str, text: str) -> RuleSuggestion:
    """Record a member's proposal to change a rule and tell every active staff member."""
    suggestion = RuleSuggestion.objects.create(
        author=author, topic=topic.strip(), text=text.strip()
    )
    url = reverse("admin:handbook_rulesuggestion_change", args=[suggestion.pk])
    for staff in User.objects.filter(is_staff=True, is_active=True):
        notify(
            user=staff,
            kind="rule_suggestion",
            title=_("A member suggests a change to the lab's rules"),
            body=f"{author.display_name}: {suggestion.topic}\n\n{suggestion.text}",
            url=url,
        )
    return suggestion


def onboarding_mark(*, user: User, rules_read: bool = False, dismissed: bool = False) -> None:
    """Record that `user` read the rules or put the checklist away (the first time only)."""
    from django.utils import timezone

    from handbook.models import OnboardingProgress

    progress, _created = OnboardingProgress.objects.get_or_create(user=user)
    now = timezone.now()
    if rules_read and progress.rules_read_at is None:
        progress.rules_read_at = now
    if dismissed and progress.dismissed_at is None:
        progress.dismissed_at = now
    progress.save()


# The tutorial's steps recorded when a member opens a page (handbook.middleware).
TUTORIAL_VIEW_FIELDS = {
    "job_page": "job_page_viewed_at",
    "job_log": "job_log_read_at",
    "credits": "credits_viewed_at",
}


def tutorial_view_record(*, user: User, step: str) -> bool:
    """Record the first time `user` did the tutorial's view step `step`; True if it is new."""
    from django.utils import timezone

    from handbook.models import OnboardingProgress

    field = TUTORIAL_VIEW_FIELDS[step]
    OnboardingProgress.objects.get_or_create(user=user)
    return bool(
        OnboardingProgress.objects.filter(user=user, **{f"{field}__isnull": True}).update(
            **{field: timezone.now()}
        )
    )
