"""The chart endpoints: values from the rollups, downsampling, scoping and clear 4xx answers."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import time_machine

from cluster.models import Gpu
from jobqueue.models import Allocation, Job
from telemetry.models import GpuHourRollup, GpuMinuteRollup
from tests.cluster.conftest import job_on
from tests.conftest import api_as

pytestmark = pytest.mark.django_db

NOW = datetime(2026, 3, 10, 12, 0, tzinfo=UTC)


def minute(gpu: Gpu, when: datetime, util: float, mem: int, **extra: Any) -> GpuMinuteRollup:
    return GpuMinuteRollup.objects.create(
        gpu=gpu,
        bucket=when,
        samples=12,
        util_mean=util,
        util_max=util,
        mem_used_max_mb=mem,
        **extra,
    )


@pytest.fixture
def gpus(registered_node: Any) -> list[Gpu]:
    return list(Gpu.objects.order_by("index"))


def test_gpu_series_bins_minutes_and_averages_nodes(gpus: list[Gpu], alice: Any) -> None:
    aaa, bbb = gpus
    with time_machine.travel(NOW, tick=False):
        minute(aaa, NOW - timedelta(minutes=30), 80.0, 1000)
        minute(aaa, NOW - timedelta(minutes=29), 40.0, 3000)
        minute(bbb, NOW - timedelta(minutes=30), 10.0, 500)
        answer = api_as(alice).get("/api/telemetry/gpu-series/?range=24h&points=720")

    assert answer.status_code == 200, answer.content
    body = answer.json()
    assert (body["resolution"], body["step_s"], len(body["timestamps"])) == ("minute", 120, 720)
    assert body["simulated"] is False
    lines = {line["label"]: line for line in body["gpus"]}
    index = body["timestamps"].index(int((NOW - timedelta(minutes=30)).timestamp()))
    assert lines["gpu01/gpu0"]["util"][index] == 60.0  # two minutes in one 2-minute bin
    assert lines["gpu01/gpu0"]["mem_used_mb"][index] == 3000
    assert lines["gpu01/gpu0"]["util"][0] is None
    node = body["nodes"][0]
    assert node["node"] == "gpu01"
    assert node["util"][index] == pytest.approx((80 + 40 + 10) / 3, abs=0.01)
    assert node["mem_used_mb"][index] == 3500


def test_seven_days_read_the_hourly_rollup(gpus: list[Gpu], alice: Any) -> None:
    aaa, _bbb = gpus
    GpuHourRollup.objects.create(
        gpu=aaa,
        bucket=NOW - timedelta(days=3),
        samples=720,
        util_mean=55.0,
        minutes=60,
        busy_minutes=60,
        held_minutes=60,
    )
    with time_machine.travel(NOW, tick=False):
        body = api_as(alice).get("/api/telemetry/gpu-series/?range=7d&node=gpu01").json()
        year = api_as(alice).get("/api/telemetry/gpu-series/?range=365d").json()

    assert (body["resolution"], body["step_s"], len(body["timestamps"])) == ("hour", 3600, 168)
    assert 55.0 in body["gpus"][0]["util"]
    # A year in at most 400 bins: 22 hours each.
    assert (year["step_s"], len(year["timestamps"])) == (22 * 3600, 399)
    assert 55.0 in year["gpus"][0]["util"]


def test_bad_parameters_get_a_clear_400_and_unknown_nodes_a_404(
    gpus: list[Gpu], alice: Any
) -> None:
    client = api_as(alice)
    bad = client.get("/api/telemetry/gpu-series/?range=2w")
    assert bad.status_code == 400
    assert "range" in bad.json()
    assert client.get("/api/telemetry/gpu-series/?points=5").status_code == 400
    assert client.get("/api/telemetry/gpu-series/?node=nope").status_code == 404
    assert client.get("/api/telemetry/lab-daily/?days=0").status_code == 400


def test_a_jobs_series_covers_its_gpus_over_its_run_and_only_for_its_owner(
    gpus: list[Gpu], alice: Any, charlie: Any, registered_node: Any
) -> None:
    aaa, bbb = gpus
    job = job_on(registered_node[0], alice, state="completed")
    Job.objects.filter(pk=job.pk).update(
        started_at=NOW - timedelta(hours=2), ended_at=NOW - timedelta(hours=1)
    )
    Allocation.objects.create(job=job, gpu=aaa, active=False, released_at=NOW)
    minute(aaa, NOW - timedelta(minutes=90), 90.0, 2000, job=job, user=alice)
    minute(bbb, NOW - timedelta(minutes=90), 5.0, 10)  # not the job's GPU

    with time_machine.travel(NOW, tick=False):
        mine = api_as(alice).get(f"/api/telemetry/job-series/{job.pk}/")
        theirs = api_as(charlie).get(f"/api/telemetry/job-series/{job.pk}/")

    assert mine.status_code == 200
    body = mine.json()
    assert [line["label"] for line in body["gpus"]] == ["gpu01/gpu0"]
    assert body["timestamps"][0] == int((NOW - timedelta(hours=2)).timestamp())
    assert 90.0 in body["gpus"][0]["util"]
    assert theirs.status_code == 404


def test_lab_daily_gives_allocated_share_and_real_utilisation(gpus: list[Gpu], alice: Any) -> None:
    aaa, bbb = gpus
    day = NOW.replace(hour=0)
    for gpu, busy, util in ((aaa, 60, 90.0), (bbb, 0, 10.0)):
        GpuHourRollup.objects.create(
            gpu=gpu,
            bucket=day + timedelta(hours=3),
            samples=720,
            util_mean=util,
            minutes=60,
            busy_minutes=busy,
            held_minutes=busy,
        )
    with time_machine.travel(NOW, tick=False):
        body = api_as(alice).get("/api/telemetry/lab-daily/?days=2").json()

    assert [d["day"] for d in body] == ["2026-03-09", "2026-03-10"]
    assert body[0] == {
        "day": "2026-03-09",
        "allocated_share": None,
        "util_mean": None,
        "gpu_hours": 0.0,
    }
    assert body[1] == {
        "day": "2026-03-10",
        "allocated_share": 0.5,
        "util_mean": 50.0,
        "gpu_hours": 1.0,
    }


def test_the_schema_documents_the_chart_endpoints(alice: Any) -> None:
    schema = api_as(alice).get("/api/schema/?format=json").json()
    for path in (
        "/api/v1/telemetry/gpu-series/",
        "/api/v1/telemetry/lab-daily/",
        "/api/v1/telemetry/job-series/{job_id}/",
    ):
        assert path in schema["paths"], sorted(schema["paths"])
    parameters = {
        p["name"] for p in schema["paths"]["/api/v1/telemetry/gpu-series/"]["get"]["parameters"]
    }
    assert {"range", "node", "gpu", "points"} <= parameters
