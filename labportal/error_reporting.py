"""Where the portal's errors go besides the log: the admins' mailboxes (ADMINS) and,
when SENTRY_DSN is set, Sentry (with its Django and Celery integrations).

Started with the apps (labportal/apps.py), so the web tier, the control worker and beat all report alike.
"""

from __future__ import annotations

# The settings read ADMINS and the sample rate with these (core/envvars.py).
from core.envvars import admins_from, sample_rate_from

__all__ = ["admins_from", "sample_rate_from", "sentry_init"]


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
