"""Run-time prediction at submit: matched by the shape key each job stored when submitted."""

from __future__ import annotations

import importlib
from datetime import timedelta
from typing import Any

import pytest
from django.apps import apps
from django.utils import timezone

import scheduler.predict
from jobqueue.models import ContainerImage, Job, Queue
from jobqueue.prediction import HISTORY
from scheduler.predict import command_shape_key
from tests.jobqueue.test_submit import submit

pytestmark = pytest.mark.django_db

backfill = importlib.import_module("jobqueue.migrations.0014_job_command_shape_key")


def finished_jobs(owner: Any, commands: list[str], runtime_s: int, **fields: Any) -> list[Job]:
    """Completed jobs of ``owner``, written as rows (no submit): one per command."""
    ended = timezone.now() - timedelta(hours=1)
    jobs = [
        Job(
            owner=owner,
            queue=Queue.objects.get(name="normal"),
            image=ContainerImage.objects.get(),
            command=["/bin/sh", "-c", command],
            time_limit_s=4 * 3600,
            state=Job.State.COMPLETED,
            started_at=ended - timedelta(seconds=runtime_s),
            ended_at=ended,
            **fields,
        )
        for command in commands
    ]
    return Job.objects.bulk_create(jobs)


def test_a_job_is_predicted_from_its_owners_finished_runs_of_the_same_script(
    alice: Any, cluster: Any, image: Any
) -> None:
    first = submit(alice, command="python /data/a/train.py --seed 1")
    Job.objects.filter(pk=first.pk).update(
        state=Job.State.COMPLETED,
        started_at=timezone.now() - timedelta(seconds=700),
        ended_at=timezone.now(),
    )
    job = submit(alice, command="python /data/b/train.py --seed 2")
    assert job.command_shape_key == first.command_shape_key != ""
    assert job.predicted_runtime_s == 700


def test_prediction_matches_the_history_by_its_stored_keys_without_reshaping_a_command(
    alice: Any, cluster: Any, image: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The stored key decides, not the command: these rows' commands are of another shape.
    key = command_shape_key("python train.py")
    finished_jobs(alice, ["x" * 8000] * HISTORY, 900, command_shape_key=key)
    shaped: list[str] = []
    real_shape = scheduler.predict.command_shape

    def counting_shape(command: str) -> str:
        shaped.append(command)
        return real_shape(command)

    monkeypatch.setattr(scheduler.predict, "command_shape", counting_shape)
    job = submit(alice, command="python train.py")
    assert job.predicted_runtime_s == 900
    assert shaped == ["python train.py"]  # the new job's command, once; none of the history


def test_the_migration_keys_existing_jobs_as_submit_keys_new_ones(
    alice: Any, cluster: Any, image: Any
) -> None:
    old = finished_jobs(alice, ["python /a/train.py --lr 0.1", "bash run.sh"], 60)
    assert {j.command_shape_key for j in Job.objects.all()} == {""}
    backfill.backfill_command_shape_keys(apps, None)
    keys = dict(Job.objects.values_list("pk", "command_shape_key"))
    assert keys == {j.pk: command_shape_key(j.command_display) for j in old}
    assert keys[old[0].pk] == submit(alice, command="python /b/train.py --lr 3").command_shape_key
