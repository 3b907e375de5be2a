from __future__ import annotations

from django.conf import settings
from django.db import models
from django.utils import timezone
from django.utils.translation import gettext_lazy as _


class RuleSuggestion(models.Model):
    """A member's proposal to change one of the lab's rules; staff read and answer it."""

    class State(models.TextChoices):
        OPEN = "open", _("open")
        ADOPTED = "adopted", _("adopted")
        DECLINED = "declined", _("declined")

    author = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        verbose_name=_("author"),
        on_delete=models.CASCADE,
        related_name="rule_suggestions",
    )
    topic = models.CharField(_("rule"), max_length=120)
    text = models.TextField(_("suggestion"))
    state = models.CharField(_("state"), max_length=10, choices=State.choices, default=State.OPEN)
    staff_answer = models.TextField(_("answer"), blank=True)
    created_at = models.DateTimeField(_("created"), default=timezone.now)

    class Meta:
        verbose_name = _("rule suggestion")
        verbose_name_plural = _("rule suggestions")
        ordering = ["-created_at", "-id"]

    def __str__(self) -> str:
        return f"{self.topic} ({self.author})"


class OnboardingProgress(models.Model):
    """What a member's first steps and the tutorial cannot read from their data: reading the
    rules, opening a job's page, its log and My credits, and having put the checklist away."""

    user = models.OneToOneField(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="onboarding"
    )
    rules_read_at = models.DateTimeField(_("read the rules"), null=True, blank=True)
    dismissed_at = models.DateTimeField(_("checklist put away"), null=True, blank=True)
    # The tutorial's steps that leave no data of their own: first time each page was opened.
    job_page_viewed_at = models.DateTimeField(_("opened a job's page"), null=True, blank=True)
    job_log_read_at = models.DateTimeField(_("read a finished job's log"), null=True, blank=True)
    credits_viewed_at = models.DateTimeField(_("opened My credits"), null=True, blank=True)

    class Meta:
        verbose_name = _("onboarding progress")
        verbose_name_plural = _("onboarding progress")

    def __str__(self) -> str:
        return str(self.user)
