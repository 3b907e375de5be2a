"""Slurm mode against a real Slurm: submit through the portal and with plain sbatch, cancel,
inventory, the error paths; every final state reaches the portal through the sync pass."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from benchmarks.local_slurm import LocalSlurm
from cluster.models import Node
from jobqueue.models import Job
from slurm.models import Partition, QueueMapping, SlurmJob, UnixLogin
from slurm.services import slurm_inventory_sync, slurm_jobs_sync
from tests.conftest import api_as

pytestmark = [pytest.mark.slurm, pytest.mark.django_db(transaction=True)]

BUSYBOX = "labportal/busybox:test"


def body(response: Any) -> Any:
    return json.loads(response.content)


def synced_until(check: Callable[[], bool], what: str, timeout_s: float = 180) -> None:
    """Run the sync pass until ``check()`` holds; Slurm runs the jobs in real time."""
    deadline = time.monotonic() + timeout_s
    while True:
        slurm_jobs_sync()
        if check():
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"Slurm did not get there in {timeout_s} s: {what}")
        time.sleep(0.5)


@pytest.fixture
def slurm_lab(
    slurm_settings: Any, queues: Any, image: Any, alice: Any, local_slurm: LocalSlurm
) -> Iterator[None]:
    """alice runs as unix user nobody; the portal's inventory comes from Slurm.

    Each test leaves Slurm's queue empty, so no test waits behind another's jobs.
    """
    UnixLogin.objects.create(user=alice, username="nobody")
    for queue in queues:
        QueueMapping.objects.update_or_create(queue=queue, defaults={"qos": "normal"})
    slurm_inventory_sync()
    yield
    local_slurm._run("scancel", "--partition", local_slurm.partition, check=False)
    local_slurm.queue_empty(60)


def submit(user: Any, command: Any, **extra: Any) -> Any:
    return api_as(user).post(
        "/api/jobs/",
        {"image": BUSYBOX, "command": command, "gpus": 1, "cpus": 1, "memory_mb": 64, **extra},
        format="json",
    )


def test_inventory_brings_the_node_its_gpus_and_the_partition(
    slurm_lab: Any, local_slurm: LocalSlurm
) -> None:
    node = Node.objects.get(name=local_slurm.node)
    assert node.state == Node.State.UP
    assert node.gpus.count() == local_slurm.gpus
    assert node.labels["slurm_partitions"] == ["lab"]
    partition = Partition.objects.get()
    assert partition.name == "lab" and partition.is_default
    assert list(partition.nodes.all()) == [node]
    slurm_inventory_sync()  # twice: nothing duplicated
    assert node.gpus.count() == local_slurm.gpus and Partition.objects.count() == 1


def test_a_member_submits_through_the_api_and_slurm_runs_it_as_their_unix_user(
    slurm_lab: Any, alice: Any, local_slurm: LocalSlurm
) -> None:
    response = submit(alice, "echo hello from $LABPORTAL_JOB_ID; id -un")
    assert response.status_code == 201, response.content
    job_id = body(response)["id"]
    record = SlurmJob.objects.get(job_id=job_id)
    assert record.unix_user == "nobody" and record.qos == "normal"
    assert body(response)["slurm"]["slurm_job_id"] == record.slurm_job_id
    synced_until(lambda: Job.objects.get(pk=job_id).is_final, "the job ends")
    job = Job.objects.get(pk=job_id)
    assert job.state == Job.State.COMPLETED and job.exit_code == 0
    assert job.started_at is not None and job.node is not None
    logs = body(api_as(alice).get(f"/api/jobs/{job_id}/logs/?refresh=1"))["log_tail"]
    assert logs.split() == ["hello", "from", str(job_id), "nobody"]
    record.refresh_from_db()  # as Slurm reported it
    assert (record.unix_user, record.qos, record.state) == ("nobody", "normal", "COMPLETED")
    accounted = local_slurm._run(
        "sacct", "-n", "-X", "-P", "-j", str(record.slurm_job_id), "-o", "user"
    )
    assert accounted.split() == ["nobody"]
    assert slurm_jobs_sync().changed == 0  # the pass is idempotent


def test_a_failing_job_ends_failed_with_its_exit_code(slurm_lab: Any, alice: Any) -> None:
    job_id = body(submit(alice, "exit 3"))["id"]
    synced_until(lambda: Job.objects.get(pk=job_id).is_final, "the job fails")
    job = Job.objects.get(pk=job_id)
    assert (job.state, job.exit_code) == (Job.State.FAILED, 3)
    assert job.slurm.state == "FAILED"


def test_cancel_from_the_portal_scancels_the_running_job(slurm_lab: Any, alice: Any) -> None:
    job_id = body(submit(alice, "sleep 300"))["id"]
    synced_until(lambda: Job.objects.get(pk=job_id).state == Job.State.RUNNING, "it runs")
    assert api_as(alice).post(f"/api/jobs/{job_id}/cancel/").status_code == 200
    synced_until(lambda: Job.objects.get(pk=job_id).is_final, "Slurm ends it")
    job = Job.objects.get(pk=job_id)
    assert job.state == Job.State.CANCELLED and job.slurm.state == "CANCELLED"


def test_a_waiting_job_shows_slurms_reason_and_estimated_start(
    slurm_lab: Any, alice: Any, local_slurm: LocalSlurm
) -> None:
    big = body(submit(alice, "sleep 300", gpus=local_slurm.gpus, time_limit_s=600))["id"]
    synced_until(lambda: Job.objects.get(pk=big).state == Job.State.RUNNING, "the big job runs")
    waiting = body(submit(alice, "true", time_limit_s=60))["id"]
    # Slurm gives a new job no reason until its scheduler has looked at it.
    synced_until(
        lambda: (
            Job.objects.get(pk=waiting).estimated_start is not None
            and bool(body(api_as(alice).get(f"/api/jobs/{waiting}/"))["slurm"]["reason"])
        ),
        "Slurm estimates a start and gives a reason",
        timeout_s=120,
    )
    shown = body(api_as(alice).get(f"/api/jobs/{waiting}/"))
    # Slurm says Resources, or Priority when its backfill pass got to the job first; the
    # portal shows Slurm's words and the matching portal reason either way.
    reason = shown["slurm"]["reason"]
    assert shown["slurm"]["state"] == "PENDING" and reason in ("Resources", "Priority")
    assert shown["state"] == "pending" and shown["pending_reason"] == reason.lower()
    assert shown["slurm"]["estimated_start"] is not None
    for job_id in (waiting, big):
        api_as(alice).post(f"/api/jobs/{job_id}/cancel/")
    synced_until(
        lambda: all(j.is_final for j in Job.objects.filter(pk__in=[big, waiting])), "both end"
    )


def test_a_job_from_plain_sbatch_is_recorded_for_its_member(
    slurm_lab: Any, alice: Any, local_slurm: LocalSlurm
) -> None:
    slurm_id = int(
        local_slurm.run_as(
            "nobody", "sbatch", "--parsable", "--gres=gpu:1", "-o", "/dev/null", "--wrap=true"
        ).strip()
    )
    synced_until(
        lambda: SlurmJob.objects.filter(slurm_job_id=slurm_id, ended_at__isnull=False).exists(),
        "the outside job is seen ending",
    )
    record = SlurmJob.objects.get(slurm_job_id=slurm_id)
    assert record.user == alice and record.job is None and record.state == "COMPLETED"


def test_a_member_without_a_unix_login_gets_a_clear_refusal(
    slurm_lab: Any, bob: Any, local_slurm: LocalSlurm
) -> None:
    before = local_slurm._run("squeue", "-a", "-h", "-o", "%i")
    response = submit(bob, "true")
    assert response.status_code == 400
    assert body(response)["code"] == "unix_login_missing"
    assert "unix user name" in body(response)["detail"]
    assert not Job.objects.filter(owner=bob).exists()
    assert local_slurm._run("squeue", "-a", "-h", "-o", "%i") == before


def test_slurms_refusal_reaches_the_member_and_nothing_is_queued(
    slurm_lab: Any, alice: Any, queues: Any
) -> None:
    QueueMapping.objects.filter(queue__name="normal").update(qos="no-such-qos")
    response = submit(alice, "true")
    assert response.status_code == 400
    assert body(response)["code"] == "slurm_refused"
    assert "nobody" in body(response)["detail"]
    assert not Job.objects.filter(owner=alice).exists()


def test_an_unreachable_slurm_is_a_503_not_a_500(slurm_lab: Any, alice: Any, settings: Any) -> None:
    settings.LABPORTAL_SLURM_REST_URL = "http://127.0.0.1:9"
    response = submit(alice, "true")
    assert response.status_code == 503
    assert body(response)["code"] == "slurm_unavailable"


def test_without_slurmrestd_the_portal_runs_sbatch_as_the_member(
    slurm_lab: Any, alice: Any, settings: Any
) -> None:
    settings.LABPORTAL_SLURM_REST_URL = ""  # the Slurm commands, through LABPORTAL_SLURM_RUN_AS
    response = submit(alice, "id -un")
    assert response.status_code == 201, response.content
    job_id = body(response)["id"]
    synced_until(lambda: Job.objects.get(pk=job_id).is_final, "the job ends")
    job = Job.objects.get(pk=job_id)
    assert job.state == Job.State.COMPLETED and job.slurm.unix_user == "nobody"
    assert body(api_as(alice).get(f"/api/jobs/{job_id}/logs/"))["log_tail"].strip() == "nobody"


def test_a_gpu_memory_minimum_slurms_gres_cannot_tell_is_left_to_slurm_until_an_agent_says(
    slurm_lab: Any, alice: Any, local_slurm: LocalSlurm
) -> None:
    from cluster.protocol import register_info_parse
    from cluster.services import node_register

    response = submit(alice, "true", min_gpu_memory_mb=40_000)
    assert response.status_code == 201, response.content
    job = Job.objects.get(pk=body(response)["id"])
    (event,) = job.events.filter(kind="gpu_memory_unchecked")
    assert "Slurm places the job" in event.text
    synced_until(lambda: Job.objects.get(pk=job.pk).is_final, "the job ends")
    assert Job.objects.get(pk=job.pk).state == Job.State.COMPLETED

    # The node's monitor-only agent reports its GPUs: Slurm's rows get their memory.
    gpus = [
        {"uuid": f"GPU-real-{i}", "index": i, "model": "NVIDIA L4", "memory_mb": 23034,
         "kind": "gpu", "parent_uuid": None}
        for i in range(local_slurm.gpus)
    ]  # fmt: skip
    info = {"hostname": local_slurm.node, "gpu_backend": "nvml", "runtime": "none", "gpus": gpus}
    node_register(node_name=local_slurm.node, info=register_info_parse(info))
    slurm_inventory_sync()
    node = Node.objects.get(name=local_slurm.node)
    assert sorted(node.gpus.values_list("uuid", "memory_mb")) == [
        (f"GPU-real-{i}", 23034) for i in range(local_slurm.gpus)
    ]
    assert submit(alice, "true", min_gpu_memory_mb=40_000).status_code == 400
