"""The member's home, the GPUs page's history, a job's charts and the lab overview, rendered."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from accounts.models import CreditAccount, LedgerEntry
from cluster.models import Gpu
from jobqueue.models import Allocation, Job
from reservations.models import Reservation
from telemetry.models import GpuHourRollup
from tests.cluster.conftest import job_on

pytestmark = pytest.mark.django_db


def page(client: Client, user: Any, url: str) -> str:
    client.force_login(user)
    response = client.get(url)
    assert response.status_code == 200
    return response.content.decode()


def test_a_new_member_is_told_what_to_do_first(client: Client, charlie: Any) -> None:
    html = page(client, charlie, reverse("dashboard"))

    assert 'data-testid="onboarding-checklist"' in html
    assert reverse("job_submit") in html
    assert reverse("token_list") in html
    assert "Nothing running or waiting." in html


def test_the_home_shows_my_jobs_booking_credits_and_the_lab_today(
    client: Client, registered_node: Any, alice: Any, bob: Any
) -> None:
    node, _secret = registered_node
    running = job_on(node, alice, name="resnet-sweep")
    aaa = Gpu.objects.get(uuid="GPU-aaa")
    Allocation.objects.create(job=running, gpu=aaa)
    waiting = job_on(None, alice, name="bert-large", state="pending")
    Job.objects.filter(pk=waiting.pk).update(
        estimated_start=timezone.now() + timedelta(hours=3), queue_position=2
    )
    job_on(None, bob, name="bobs-job", state="pending")
    booking = Reservation.objects.create(
        user=alice,
        start=timezone.now() + timedelta(days=1),
        end=timezone.now() + timedelta(days=1, hours=2),
    )
    booking.gpus.add(aaa)
    account, _ = CreditAccount.objects.get_or_create(user=alice)
    LedgerEntry.objects.create(
        account=account, kind="charge", amount=Decimal("-70"), balance_after=0, idempotency_key="c1"
    )
    GpuHourRollup.objects.create(
        gpu=aaa,
        bucket=timezone.now().replace(minute=0, second=0, microsecond=0),
        samples=10,
        util_mean=64.0,
        minutes=10,
        busy_minutes=10,
        held_minutes=10,
    )

    html = page(client, alice, reverse("dashboard"))

    assert "resnet-sweep" in html and "bert-large" in html
    assert "bobs-job" not in html
    assert "estimated start" in html and "position 2" in html
    assert "gpu01/gpu0" in html  # the booking's GPU
    assert "10.0 credits per day" in html
    assert "1 / 2" in html  # GPUs in use now
    assert "Real utilisation today" in html and "64%" in html


def test_the_gpus_page_offers_24_hours_and_7_days_of_history(
    client: Client, registered_node: Any, alice: Any
) -> None:
    html = page(client, alice, reverse("gpu_live") + "?range=7d")

    assert 'data-chart-url="/api/v1/telemetry/gpu-series/?range=7d"' in html
    assert html.count('data-chart="') == 4
    assert "/static/vendor/uplot/uPlot.iife.min.js" in html
    assert "cdn" not in html.lower()
    # An unknown range falls back to 24 hours rather than failing.
    assert "?range=24h" in page(client, alice, reverse("gpu_live") + "?range=forever")


def test_a_started_jobs_page_charts_its_gpus(
    client: Client, registered_node: Any, alice: Any
) -> None:
    job = job_on(registered_node[0], alice, state="completed")
    assert "data-chart=" not in page(client, alice, reverse("job_detail", args=[job.pk]))
    Job.objects.filter(pk=job.pk).update(started_at=timezone.now() - timedelta(hours=1))

    html = page(client, alice, reverse("job_detail", args=[job.pk]))

    assert f'data-chart-url="/api/v1/telemetry/job-series/{job.pk}/"' in html


def test_the_lab_overview_lists_days_with_allocation_and_utilisation(
    client: Client, registered_node: Any, alice: Any
) -> None:
    aaa, bbb = Gpu.objects.order_by("index")
    yesterday = (timezone.now() - timedelta(days=1)).replace(
        hour=5, minute=0, second=0, microsecond=0
    )
    for gpu, busy, util in ((aaa, 60, 70.0), (bbb, 18, 20.0)):
        GpuHourRollup.objects.create(
            gpu=gpu,
            bucket=yesterday,
            samples=60,
            util_mean=util,
            minutes=60,
            busy_minutes=busy,
            held_minutes=busy,
        )

    html = page(client, alice, reverse("lab_overview") + "?days=90")

    assert 'data-testid="lab-days"' in html
    assert "65%" in html  # (60 + 18) / 120 of GPU time held
    assert "45%" in html  # mean of 70 and 20
    assert 'data-chart-url="/api/v1/telemetry/lab-daily/?days=90"' in html
