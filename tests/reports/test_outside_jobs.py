"""In Slurm mode the usage report counts the GPU time of jobs members submitted to Slurm
directly (plain sbatch), as the cluster's accounting charged it (issue 29 Medium 7): the
totals, the user, queue and node lines, the weeks and the waits. On the week of
tests/reports/conftest.py, whose portal jobs hold 36 GPU-hours."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from reports.selectors import usage_report
from slurm.models import SlurmJob
from slurm.rules_models import SlurmCharge
from tests.factories import default_queue
from tests.reports.conftest import NOW, at

pytestmark = pytest.mark.django_db


@pytest.fixture
def plain_job(week: Any, bob: Any, queues: Any) -> SlurmCharge:
    """bob's sbatch job: 2 GPUs on gpu02 for 3 hours on Wednesday, in the normal QOS."""

    SlurmJob.objects.create(slurm_job_id=99, nodes="gpu02", state="COMPLETED", gpus=2)
    return SlurmCharge.objects.create(
        slurm_job_id=99,
        submitted_at=at(2, 0) - dt.timedelta(minutes=30),
        user=bob,
        queue=default_queue(),
        gpus=2,
        started_at=at(2, 0),
        charged_seconds=3 * 3600,
        final=True,
    )


def _line(report: Any, table: str, name: str) -> Any:
    return next(line for line in report.tables[table] if line.name == name)


def test_slurm_mode_counts_plain_sbatch_gpu_time_everywhere_in_the_report(
    settings: Any, week: Any, plain_job: SlurmCharge, admin_user: Any
) -> None:
    settings.LABPORTAL_EXECUTOR = "slurm"
    report = usage_report(period=week["period"], viewer=admin_user, now=NOW)
    assert report.totals.gpu_hours == pytest.approx(36 + 6)
    assert report.totals.jobs["completed"] == 4  # three portal jobs and the sbatch one
    assert _line(report, "user", "bob").gpu_hours == pytest.approx(4 + 6)
    assert _line(report, "queue", "normal").gpu_hours == pytest.approx(32 + 6)
    assert _line(report, "node", "gpu02").gpu_hours == pytest.approx(8 + 6)
    assert _line(report, "model", "L40S").gpu_hours == pytest.approx(8 + 6)
    assert sum(w.gpu_hours for w in report.weeks) == pytest.approx(42)
    normal = next(w for w in report.waits if w.queue == "normal")
    assert normal.jobs == 4  # its 30-minute wait counts with the portal's jobs
    # No telemetry reached the portal for it: coverage says so, "used" does not guess.
    assert report.totals.coverage_pct == pytest.approx(100 * 24 / 42)


def test_a_plain_job_under_no_portal_queue_has_its_own_line(
    settings: Any, week: Any, plain_job: SlurmCharge, admin_user: Any
) -> None:
    settings.LABPORTAL_EXECUTOR = "slurm"
    SlurmCharge.objects.filter(pk=plain_job.pk).update(queue=None)
    report = usage_report(period=week["period"], viewer=admin_user, now=NOW)
    assert _line(report, "queue", "outside the portal").gpu_hours == pytest.approx(6)
    assert [w.queue for w in report.waits] == ["debug", "normal", "outside the portal"]


def test_a_running_plain_job_counts_up_to_now_and_one_from_long_ago_not_at_all(
    settings: Any, week: Any, plain_job: SlurmCharge, admin_user: Any, bob: Any
) -> None:
    settings.LABPORTAL_EXECUTOR = "slurm"
    SlurmCharge.objects.filter(pk=plain_job.pk).update(
        final=False, started_at=at(6, 20), charged_seconds=60
    )
    SlurmCharge.objects.create(
        slurm_job_id=7,
        submitted_at=at(-20, 0),
        user=bob,
        gpus=4,
        started_at=at(-20, 0),
        charged_seconds=3600,
        final=True,
    )
    report = usage_report(period=week["period"], viewer=admin_user, now=NOW)
    # Sunday 20:00 to the period's end (Monday 00:00, before NOW): 4 h on 2 GPUs.
    assert report.totals.gpu_hours == pytest.approx(36 + 8)


def test_agents_mode_has_no_jobs_outside_the_portal(
    week: Any, plain_job: SlurmCharge, admin_user: Any
) -> None:
    report = usage_report(period=week["period"], viewer=admin_user, now=NOW)
    assert report.totals.gpu_hours == pytest.approx(36)


def test_a_plain_job_that_named_a_project_counts_in_that_projects_line(
    settings: Any, week: Any, plain_job: SlurmCharge, admin_user: Any, bob: Any
) -> None:
    from accounts.models import Project

    settings.LABPORTAL_EXECUTOR = "slurm"
    vision = Project.objects.create(name="vision", title="Vision grant", pi=bob)
    SlurmCharge.objects.filter(pk=plain_job.pk).update(project=vision)
    report = usage_report(period=week["period"], viewer=admin_user, now=NOW)
    assert _line(report, "project", "vision").gpu_hours == pytest.approx(6)
    assert report.totals.gpu_hours == pytest.approx(36 + 6)  # counted once, not twice
