"""Where the portal's errors go besides the log: the admins' mailboxes (ADMINS) and,
when SENTRY_DSN is set, Sentry (with its Django and Celery integrations).

Read by the settings, so the web tier, the control worker and beat all report alike.
"""

from __future__ import annotations

from email.utils import getaddresses

from django.core.exceptions import ImproperlyConfigured


def admins_from(value: str | None) -> list[tuple[str, str]]:
    """ADMINS="Ann Lee <ann@lab.example.org>, ops@lab.example.org" as Django's (name, email)
    pairs; an entry without an @ is refused with the form to use."""
    if not value or not value.strip():
        return []
    admins = []
    for name, email in getaddresses([value]):
        if "@" not in email:
            raise ImproperlyConfigured(
                f"ADMINS has an entry without an email address ({name or email!r}); write it "
                'as ADMINS="Ann Lee <ann@lab.example.org>, ops@lab.example.org"'
            )
        admins.append((name or email, email))
    return admins


def sample_rate_from(value: str | None) -> float:
    """SENTRY_TRACES_SAMPLE_RATE: the share of requests traced, 0 (the default) to 1."""
    if not value:
        return 0.0
    try:
        rate = float(value)
    except ValueError:
        rate = -1.0
    if not 0.0 <= rate <= 1.0:
        raise ImproperlyConfigured(
            f"SENTRY_TRACES_SAMPLE_RATE must be a number from 0 to 1 (got {value!r}), "
            "e.g. SENTRY_TRACES_SAMPLE_RATE=0.05 to trace one request in twenty"
        )
    return rate


def sentry_init(*, dsn: str, environment: str, release: str, traces_sample_rate: float) -> None:
    """Send unhandled errors of requests and Celery tasks, and ERROR log records, to Sentry.
    No personal data (user names, addresses) unless SENTRY_SEND_PII says so."""
    # Imported here, not at the top: a portal without SENTRY_DSN never loads the SDK.
    import sentry_sdk
    from sentry_sdk.integrations.celery import CeleryIntegration
    from sentry_sdk.integrations.django import DjangoIntegration

    sentry_sdk.init(
        dsn=dsn,
        environment=environment,
        release=release,
        traces_sample_rate=traces_sample_rate,
        integrations=[DjangoIntegration(), CeleryIntegration(monitor_beat_tasks=False)],
        send_default_pii=False,
    )
