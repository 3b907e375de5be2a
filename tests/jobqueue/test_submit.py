"""job_submit: what it accepts, and each refusal with the fix it suggests."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from jobqueue import errors
from jobqueue.models import Job, PriorityGrant, Queue, VolumeMount
from jobqueue.submit import job_submit

pytestmark = pytest.mark.django_db


def submit(owner: Any, **overrides: Any) -> Job:
    params: dict[str, Any] = {
        "owner": owner,
        "queue": "normal",
        "image": "labportal/busybox:test",
        "command": "python train.py --epochs 3",
        "gpus": 1,
    }
    params.update(overrides)
    return job_submit(**params)


def test_a_valid_job_is_queued_with_an_event(
    alice: Any, cluster: Any, image: Any, django_capture_on_commit_callbacks: Any, sent_tasks: Any
) -> None:
    with django_capture_on_commit_callbacks(execute=True):
        job = submit(alice, env={"WANDB_MODE": "offline"})
    assert job.state == Job.State.PENDING
    assert job.command == ["/bin/sh", "-c", "python train.py --epochs 3"]
    assert job.time_limit_s == Queue.objects.get(name="normal").default_time_limit_s
    assert [e.kind for e in job.events.all()] == ["submitted"]
    assert sent_tasks.named("control.scheduling_pass")


def test_a_typed_command_runs_through_the_shell_and_is_shown_as_typed(
    alice: Any, cluster: Any, image: Any
) -> None:
    job = submit(alice, command="sleep 20; echo done")
    assert job.command == ["/bin/sh", "-c", "sleep 20; echo done"]
    assert job.command_display == "sleep 20; echo done"


def test_an_argument_list_keeps_the_exec_form(alice: Any, cluster: Any, image: Any) -> None:
    job = submit(alice, command=["python", "train.py", "--note", "a b; c"])
    assert job.command == ["python", "train.py", "--note", "a b; c"]
    assert job.command_display == "python train.py --note 'a b; c'"


@pytest.mark.parametrize(
    ("overrides", "error", "message"),
    [
        (
            {"queue": "gold"},
            errors.QueueNotFound,
            "There is no open queue called “gold”. Choose one of: high, debug, normal.",
        ),
        (
            {"image": "evil/miner:latest"},
            errors.ImageNotAllowed,
            "is not on the lab's allowlist. Use one of: labportal/busybox:test",
        ),
        ({"command": "   "}, errors.JobRefused, "The command is empty"),
        ({"command": "python 'unclosed"}, errors.JobRefused, "Check its quotes"),
        ({"gpus": 9}, errors.TooManyGpus, "allows at most 8 GPUs per job"),
        ({"gpus": 6}, errors.TooManyGpus, "No node has 6 matching GPUs; the largest has 4"),
        ({"gpu_model": "H100"}, errors.TooManyGpus, "No GPU in the lab matches this request"),
        (
            {"queue": "debug", "time_limit_s": 7200},
            errors.TimeLimitTooLong,
            "The debug queue allows a time limit of at most 1 h",
        ),
        ({"queue": "high"}, errors.GrantRequired, "needs an approved priority grant"),
        ({"shared_slot": True}, errors.JobRefused, "does not use shared GPU slots"),
        (
            {"env": {"CUDA_VISIBLE_DEVICES": "0"}},
            errors.JobRefused,
            "CUDA_VISIBLE_DEVICES is set by LabPortal",
        ),
        ({"env": {"1BAD": "x"}}, errors.JobRefused, "is not a valid environment variable name"),
        ({"mounts": ["secrets"]}, errors.MountNotAllowed, "not on the lab's allowlist: secrets"),
        ({"reservation_id": 999}, errors.ReservationNotUsable, "not one of your current bookings"),
    ],
)
def test_each_refusal_says_what_to_change(
    alice: Any, cluster: Any, image: Any, overrides: dict[str, Any], error: type, message: str
) -> None:
    with pytest.raises(error) as excinfo:
        submit(alice, **overrides)
    assert message in str(excinfo.value)
    assert not Job.objects.exists()


def test_the_category_limit_on_gpus_refuses_jobs_that_could_never_run(
    alice: Any, cluster: Any, image: Any
) -> None:
    alice.category.max_concurrent_gpus = 2
    alice.category.save()
    with pytest.raises(errors.TooManyGpus, match="may use at most 2 GPUs at once"):
        submit(alice, gpus=4)


def test_the_category_limit_on_queued_jobs_is_enforced(
    alice: Any, cluster: Any, image: Any
) -> None:
    alice.category.max_queued_jobs = 2
    alice.category.save()
    submit(alice)
    submit(alice)
    with pytest.raises(errors.QuotaExceeded, match="You have 2 jobs waiting"):
        submit(alice)


def test_the_high_queue_accepts_a_member_with_an_approved_grant_until_its_deadline(
    alice: Any, cluster: Any, image: Any
) -> None:
    grant = PriorityGrant.objects.create(
        user=alice,
        queue=Queue.objects.get(name="high"),
        reason="NeurIPS",
        deadline=timezone.now() + timedelta(days=3),
        state=PriorityGrant.State.APPROVED,
    )
    assert submit(alice, queue="high").queue.name == "high"
    grant.deadline = timezone.now() - timedelta(minutes=1)
    grant.save()
    with pytest.raises(errors.GrantRequired):
        submit(alice, queue="high")


def test_allowlisted_mounts_are_templated_per_user(alice: Any, cluster: Any, image: Any) -> None:
    VolumeMount.objects.create(
        name="home", source_template="/data/{username}", target="/data", read_only=False
    )
    job = submit(alice, mounts=["home"])
    assert [m.source_for(alice.username) for m in job.mounts.all()] == ["/data/alice"]


def test_a_shared_slot_job_goes_to_the_debug_queue_on_a_slot(
    alice: Any, cluster: Any, image: Any
) -> None:
    from tests.factories import make_slot

    make_slot()
    job = submit(alice, queue="debug", shared_slot=True, time_limit_s=600)
    assert job.shared_slot and job.gpus == 1
