"""Every Celery task's soft time limit comes before its hard one.

Celery refuses to run a task whose soft limit is past its hard limit ("soft_time_limit
must be less than or equal to time_limit"): a task that sets only ``time_limit`` below
the lab-wide soft default (``CELERY_TASK_SOFT_TIME_LIMIT``) was never run, and a
notification email enqueued that way was lost with only an ERROR in the log.
"""

from __future__ import annotations

from django.conf import settings

from labportal.celery import app


def _portal_tasks() -> dict[str, object]:
    app.loader.import_default_modules()
    return {name: task for name, task in app.tasks.items() if not name.startswith("celery.")}


def test_the_portal_registers_its_tasks() -> None:
    assert "control.notification_email" in _portal_tasks()
    assert len(_portal_tasks()) > 20


def test_every_task_has_its_soft_limit_before_its_hard_limit() -> None:
    wrong = {}
    for name, task in _portal_tasks().items():
        hard = getattr(task, "time_limit", None) or settings.CELERY_TASK_TIME_LIMIT
        soft = getattr(task, "soft_time_limit", None) or settings.CELERY_TASK_SOFT_TIME_LIMIT
        if soft >= hard:
            wrong[name] = (soft, hard)
    assert wrong == {}, f"soft >= hard time limit (soft, hard): {wrong}"
