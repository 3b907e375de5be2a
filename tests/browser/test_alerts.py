"""In a real browser: staff see an alert and acknowledge it; the owner sees the idle warning
(with what happens next) on the job page. Set LABPORTAL_SCREENS_DIR to keep screenshots."""

from __future__ import annotations

import os
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.utils import timezone

from alerts.models import Alert, Kind, QueueAlertPolicy
from alerts.services import alerts_evaluate
from cluster.models import Gpu
from jobqueue.models import Queue
from tests.alerts.conftest import proc, run_job, samples
from tests.browser.conftest import log_in
from tests.conftest import PASSWORD

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

MIN = timedelta(minutes=1)


def use_language(page: Any, live_server: Any, language: str) -> None:
    from django.conf import settings

    page.context.add_cookies(
        [{"name": settings.LANGUAGE_COOKIE_NAME, "value": language, "url": live_server.url}]
    )


def shot(page: Any, name: str) -> None:
    folder = os.environ.get("LABPORTAL_SCREENS_DIR")
    if folder:
        Path(folder).mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(Path(folder) / f"{name}.png"), full_page=True)


@pytest.fixture
def alerting_lab(cluster: Any, alice: Any, admin_user: Any) -> dict[str, Any]:
    now = timezone.now().replace(microsecond=0)
    QueueAlertPolicy.objects.update_or_create(
        queue=Queue.objects.get(name="normal"),
        defaults={"idle_action": "stop", "idle_grace_s": 30 * 60},
    )
    gpus = list(Gpu.objects.filter(node=cluster[0]).order_by("index"))
    job = run_job(alice, [gpus[0]], started=now - 45 * MIN)
    samples(gpus[0], start=now - 35 * MIN, end=now, util=1.5)
    samples(gpus[1], start=now - 3 * MIN, end=now, temp_c=93.0)
    samples(gpus[2], start=now - MIN, end=now, processes=[proc(31337, 6144, unix_user="mallory")])
    from telemetry.rollups import rollups_run

    rollups_run(now=now)  # the idle rule reads the minute rollups, as the telemetry beat keeps them
    alerts_evaluate(now=now)
    return {"job": job, "idle": Alert.objects.get(kind=Kind.IDLE_JOB)}


@pytest.mark.parametrize("language", ["en", "zh-hans"])
def test_staff_see_alerts_and_acknowledge_one(
    page: Any, live_server: Any, admin_user: Any, alerting_lab: dict[str, Any], language: str
) -> None:
    use_language(page, live_server, language)
    page.set_viewport_size({"width": 390, "height": 844})
    log_in(page, live_server, "admin", PASSWORD)
    page.wait_for_selector("[data-testid=username]")
    page.goto(f"{live_server.url}/alerts/")
    hot = Alert.objects.get(kind=Kind.GPU_HOT)
    card = page.locator(f"[data-testid=alert-{hot.pk}]")
    expected = "93 °C" if language == "en" else "温度为 93 °C"
    assert expected in card.inner_text()
    assert "mallory" in page.locator("[data-testid=alerts]").inner_text()
    shot(page, f"alerts-staff-{language}-390")
    page.click(f"[data-testid=ack-{hot.pk}]")
    page.wait_for_selector(f"[data-testid=alert-{hot.pk}].alert-acknowledged")
    hot.refresh_from_db()
    assert hot.state == Alert.State.ACKNOWLEDGED and hot.acknowledged_by == admin_user
    assert page.locator(f"[data-testid=ack-{hot.pk}]").count() == 0
    shot(page, f"alerts-staff-acknowledged-{language}-390")
    page.set_viewport_size({"width": 1280, "height": 900})
    shot(page, f"alerts-staff-{language}-desktop")


@pytest.mark.parametrize("language", ["en", "zh-hans"])
def test_the_owner_sees_the_idle_warning_with_its_countdown_on_the_job_page(
    page: Any, live_server: Any, alice: Any, alerting_lab: dict[str, Any], language: str
) -> None:
    use_language(page, live_server, language)
    page.set_viewport_size({"width": 390, "height": 844})
    log_in(page, live_server, "alice", PASSWORD)
    page.wait_for_selector("[data-testid=username]")
    page.goto(f"{live_server.url}/jobs/{alerting_lab['job'].pk}/")
    box = page.locator("[data-testid=job-alerts]")
    text = box.inner_text()
    if language == "en":
        assert "utilisation for 30 minutes" in text and "the job is stopped in 30 minutes" in text
        assert "Next step in" in box.locator("[data-testid=countdown]").inner_text()
    else:
        assert "利用率已连续 30 分钟" in text and "30 分钟后停止作业" in text
    # Staff-only alerts (the hot GPU, the stray process) are not shown to members.
    assert "mallory" not in page.content()
    assert page.locator("[data-testid^=ack-]").count() == 0
    shot(page, f"job-idle-warning-{language}-390")
    page.set_viewport_size({"width": 1280, "height": 900})
    shot(page, f"job-idle-warning-{language}-desktop")
