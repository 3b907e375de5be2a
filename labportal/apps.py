"""The portal's own start-up: the local folders its embedded defaults use, error reporting,
the check that the beat schedule can be collected, and the audit log's models."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from django.apps import AppConfig
from django.conf import settings
from django.core import checks
from django.core.exceptions import ImproperlyConfigured


def local_dirs() -> list[Path]:
    """The folders the settings point at that must exist before first use: the var folder
    (the embedded SQLite file's), the filesystem broker's, static files' (WhiteNoise) and
    beat's schedule file's. A database the operator named elsewhere is never created: a
    missing folder there is an outage the portal reports (503), not a new empty database."""
    var = Path(settings.VAR_DIR)
    dirs = [var, Path(settings.STATIC_ROOT), Path(settings.CELERY_BEAT_SCHEDULE_FILENAME).parent]
    db = settings.DATABASES["default"]
    if db["ENGINE"].endswith("sqlite3") and str(db["NAME"]) not in ("", ":memory:"):
        folder = Path(db["NAME"]).parent
        if folder == var or var in folder.parents:
            dirs.append(folder)
    options = settings.CELERY_BROKER_TRANSPORT_OPTIONS
    for key in ("data_folder_in", "data_folder_out", "processed_folder", "control_folder"):
        if options.get(key):
            dirs.append(Path(str(options[key])))
    return dirs


def beat_schedule_check(**_: Any) -> list[checks.CheckMessage]:
    try:
        len(settings.CELERY_BEAT_SCHEDULE)
    except ImproperlyConfigured as error:
        return [checks.Error(str(error), id="labportal.E001")]
    return []


class LabPortalConfig(AppConfig):
    name = "labportal"

    def ready(self) -> None:
        for folder in local_dirs():
            folder.mkdir(parents=True, exist_ok=True)
        checks.register(beat_schedule_check)
        from labportal.audit import audited_models_register

        audited_models_register()
        if settings.SENTRY_DSN:
            from labportal.error_reporting import sentry_init

            sentry_init(
                dsn=settings.SENTRY_DSN,
                environment=settings.SENTRY_ENVIRONMENT,
                release=settings.SENTRY_RELEASE,
                traces_sample_rate=settings.SENTRY_TRACES_SAMPLE_RATE,
            )
