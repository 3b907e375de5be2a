"""Slurm mode: a portal job array is one ``sbatch --array``, as a Slurm user submits one.

Slurm keeps one pending record for the tasks it has not started; a task gets its own job
id when it starts. The portal follows each task: waiting (with the pending record's
reason), running and ended under its own id, cancelled alone (``scancel 41_3``), waited
for by a dependency, and charged as any job."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from accounts.models import CreditAccount
from jobqueue.arrays import ARRAY_INDEX_ENV
from jobqueue.models import Job
from slurm.cli import JobInfo, array_task_indices, parse_jobs_json, parse_sacct_json
from slurm.models import SlurmArray, SlurmJob
from slurm.services import array_script, array_spec, slurm_jobs_sync
from tests.conftest import api_as
from tests.slurm.test_services import ScriptedSlurm, scripted  # noqa: F401 (fixture)

pytestmark = pytest.mark.django_db


def post_array(user: Any, array: str, **fields: Any) -> Any:
    payload = {"image": "labportal/busybox:test", "command": ["python", "sweep.py"], **fields}
    return api_as(user).post("/api/jobs/array/", {**payload, "array": array}, format="json")


def test_slurms_task_lists_are_read_as_indices() -> None:
    assert array_task_indices("1-3,7") == {1, 2, 3, 7}
    assert array_task_indices("[0-9:4]") == {0, 4, 8}
    assert array_task_indices("2-4%2") == {2, 3, 4}  # squeue's throttle suffix
    assert array_task_indices("0x8") == {3}  # sacct's bitmap
    assert array_task_indices("0x3fe") == set(range(1, 10))
    assert array_task_indices("N/A") == set()
    assert array_spec([5, 0, 1, 2, 9, 10]) == "0-2,5,9-10"


def test_squeue_and_sacct_records_carry_the_array_fields() -> None:
    live = parse_jobs_json(
        {
            "jobs": [
                {"job_id": 7, "array_job_id": 6, "array_task_id": 0, "job_state": "RUNNING"},
                {"job_id": 6, "array_job_id": 6, "array_task_id": None, "array_task_string": "1-2"},
                {"job_id": 9, "array_job_id": 0, "array_task_id": 4294967294},
            ]
        }
    )
    assert [(j.array_job_id, j.array_task_id, j.array_pending) for j in live] == [
        (6, 0, ""),
        (6, None, "1-2"),
        (None, None, ""),
    ]
    (accounted,) = parse_sacct_json(
        {"jobs": [{"job_id": 6, "array": {"job_id": 6, "task_id": None, "task": "0x8"}}]}
    )
    assert (accounted.array_job_id, accounted.array_task_id, accounted.array_pending) == (
        6,
        None,
        "0x8",
    )


def test_each_task_is_told_its_job_id_and_index(alice: Any, cluster: Any, image: Any) -> None:
    class Task:
        def __init__(self, pk: int, index: int) -> None:
            self.pk, self.array_index = pk, index

    script = "#!/bin/bash\n# LabPortal job 40 (img)\npython sweep.py\n"
    following = array_script(script, [Task(40, 0), Task(41, 1)])  # type: ignore[list-item]
    assert "LABPORTAL_JOB_ID=$((SLURM_ARRAY_TASK_ID + 40))" in following
    assert following.startswith("#!/bin/bash\n# LabPortal job 40 (img)\n")
    assert following.endswith("python sweep.py\n")
    assert f'export LABPORTAL_JOB_ID {ARRAY_INDEX_ENV}="$SLURM_ARRAY_TASK_ID"' in following
    apart = array_script(script, [Task(40, 0), Task(57, 3)])  # type: ignore[list-item]
    assert "  0) LABPORTAL_JOB_ID=40 ;;\n  3) LABPORTAL_JOB_ID=57 ;;\n" in apart


def test_an_array_is_one_sbatch_and_each_task_is_followed_in_slurm(
    scripted: ScriptedSlurm,  # noqa: F811
    alice: Any,
    image: Any,
) -> None:
    CreditAccount.objects.update_or_create(user=alice, defaults={"balance": 100})
    response = post_array(alice, "0-3", name="sweep", env={"LR": "0.1"})
    assert response.status_code == 201, response.content
    ids = json.loads(response.content)["ids"]
    (request,) = scripted.submitted
    assert request.array == "0-3" and request.name == "sweep"
    assert request.environment["LR"] == "0.1"
    assert ARRAY_INDEX_ENV not in request.environment  # each task's comes from Slurm
    assert request.output_path.endswith(f"labportal-{ids[0]}-%A_%a.out")
    array = SlurmArray.objects.get()
    assert (array.array_job_id, array.portal_array_id, array.unix_user) == (1001, ids[0], "alice_u")
    first = Job.objects.get(pk=ids[0])
    assert "task 1001_0 of array 1001" in first.events.get(kind="dispatched").text

    # Slurm started task 0 (its own job id 1500) and keeps 1-3 in the array's record.
    scripted.live = [
        JobInfo(
            job_id=1500, user="alice_u", state="RUNNING", nodes="gpu01",
            array_job_id=1001, array_task_id=0,
        ),
        JobInfo(
            job_id=1001, user="alice_u", state="PENDING", reason="Resources",
            array_job_id=1001, array_pending="1-3",
        ),
    ]  # fmt: skip
    slurm_jobs_sync()
    tasks = {j.array_index: j for j in Job.objects.filter(array_id=ids[0])}
    assert tasks[0].state == Job.State.RUNNING
    assert tasks[0].slurm.slurm_job_id == 1500
    assert tasks[0].slurm.output_path.endswith(f"labportal-{ids[0]}-1001_0.out")
    assert {tasks[i].state for i in (1, 2, 3)} == {Job.State.PENDING}
    assert {tasks[i].pending_reason for i in (1, 2, 3)} == {"resources"}
    # The array's pending record is no plain-sbatch job of anybody's.
    assert not SlurmJob.objects.filter(slurm_job_id=1001).exists()
    assert slurm_jobs_sync().changed == 0  # a second pass changes nothing

    # A waiting task is cancelled alone, as its task id.
    cancel = api_as(alice).post(f"/api/jobs/{tasks[1].pk}/cancel/")
    assert cancel.status_code == 200, cancel.content
    assert scripted.cancelled == [("1001_1", "alice_u")]
    assert Job.objects.get(pk=tasks[1].pk).state == Job.State.CANCELLED

    # A job may wait for a task that has not started.
    after = api_as(alice).post(
        "/api/jobs/",
        {
            "image": "labportal/busybox:test",
            "command": "true",
            "dependency": f"afterok:{tasks[3].pk}",
        },
        format="json",
    )
    assert after.status_code == 201, after.content
    assert scripted.submitted[-1].dependency == "afterok:1001_3"

    # Task 0 ended; the last task took the array's id; task 2 was cancelled with scancel
    # outside the portal (Slurm forgets a task cancelled before it started).
    scripted.live = [
        JobInfo(
            job_id=1500, user="alice_u", state="COMPLETED", exit_code=0,
            array_job_id=1001, array_task_id=0,
        ),
        JobInfo(
            job_id=1001, user="alice_u", state="RUNNING", nodes="gpu02",
            array_job_id=1001, array_task_id=3,
        ),
    ]  # fmt: skip
    slurm_jobs_sync()
    tasks = {j.array_index: j for j in Job.objects.filter(array_id=ids[0])}
    assert tasks[0].state == Job.State.COMPLETED
    assert tasks[3].state == Job.State.RUNNING and tasks[3].slurm.slurm_job_id == 1001
    assert tasks[2].state == Job.State.CANCELLED
    assert tasks[2].end_reason == "cancelled"
    assert "before it started" in tasks[2].events.get(kind="cancelled").text


def test_cancelling_the_whole_array_scancels_each_task_that_has_not_ended(
    scripted: ScriptedSlurm,  # noqa: F811
    alice: Any,
    image: Any,
) -> None:
    CreditAccount.objects.update_or_create(user=alice, defaults={"balance": 100})
    ids = json.loads(post_array(alice, "0-2").content)["ids"]
    Job.objects.filter(pk=ids[0]).update(state=Job.State.COMPLETED)
    response = api_as(alice).post(f"/api/jobs/{ids[1]}/cancel-array/")
    assert response.status_code == 200, response.content
    assert [j["id"] for j in json.loads(response.content)] == ids[1:]
    assert scripted.cancelled == [("1001_1", "alice_u"), ("1001_2", "alice_u")]
    states = dict(Job.objects.filter(pk__in=ids).values_list("pk", "state"))
    assert states == {
        ids[0]: Job.State.COMPLETED,
        ids[1]: Job.State.CANCELLED,
        ids[2]: Job.State.CANCELLED,
    }


@pytest.mark.slurm
def test_an_array_runs_in_the_real_slurm_each_task_as_itself(
    members: tuple[Any, Any], queues: Any, image: Any, local_slurm: Any
) -> None:
    from slurm.services import slurm_inventory_sync

    alice, _bob = members
    slurm_inventory_sync()
    response = post_array(
        alice,
        "0-2",
        command=["sh", "-c", f'echo "task $LABPORTAL_JOB_ID ${ARRAY_INDEX_ENV}"'],
        gpus=1,
        cpus=1,
        memory_mb=64,
    )
    assert response.status_code == 201, response.content
    ids = json.loads(response.content)["ids"]
    array = SlurmArray.objects.get()
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        slurm_jobs_sync()
        if all(j.is_final for j in Job.objects.filter(pk__in=ids)):
            break
        time.sleep(1)
    tasks = list(Job.objects.filter(pk__in=ids).select_related("slurm").order_by("array_index"))
    assert [t.state for t in tasks] == [Job.State.COMPLETED] * 3
    # One array in Slurm's accounting, its tasks the portal's.
    expected = [f"{array.array_job_id}_{i}" for i in range(3)]
    for _ in range(30):  # slurmdbd records the ends a moment later
        listed = local_slurm.run_as(
            "nobody", "sacct", "-X", "-n", "-j", str(array.array_job_id), "-o", "jobid%20"
        )
        if sorted(listed.split()) == expected:
            break
        time.sleep(1)
    assert sorted(listed.split()) == expected
    for task in tasks:
        assert task.slurm.unix_user == "nobody"
        with open(task.slurm.output_path) as handle:
            output = handle.read()
        assert output.strip() == f"task {task.pk} {task.array_index}"
