"""Job arrays: one request, one check, the tasks written in bulk; each task a job like any other."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from credits.services import credits_charge_running_jobs
from jobqueue.arrays import ARRAY_INDEX_ENV, MAX_ARRAY, array_indices
from jobqueue.models import Job, JobEvent, Queue, VolumeMount
from tests.conftest import api_as
from tests.slurm.test_services import ScriptedSlurm, scripted  # noqa: F401 (fixture)

pytestmark = pytest.mark.django_db

IMAGE = "labportal/busybox:test"


def body(response: Any) -> Any:
    return json.loads(response.content)


def post_array(user: Any, array: str, **fields: Any) -> Any:
    payload = {"image": IMAGE, "command": ["python", "sweep.py"], "array": array, **fields}
    return api_as(user).post("/api/jobs/array/", payload, format="json")


def test_one_request_queues_one_job_per_index_told_its_index(
    alice: Any, cluster: Any, image: Any, django_capture_on_commit_callbacks: Any, sent_tasks: Any
) -> None:
    with django_capture_on_commit_callbacks(execute=True):
        response = post_array(alice, "0-2,7", name="sweep", env={"LR": "0.1"})
    assert response.status_code == 201, response.content
    answer = body(response)
    jobs = list(Job.objects.order_by("pk"))
    assert answer["ids"] == [j.pk for j in jobs]
    assert answer["count"] == 4 and answer["indices"] == [0, 1, 2, 7]
    assert answer["array_id"] == jobs[0].pk
    assert [j.env for j in jobs] == [{"LR": "0.1", ARRAY_INDEX_ENV: i} for i in "0127"]
    assert [j.name for j in jobs] == ["sweep[0]", "sweep[1]", "sweep[2]", "sweep[7]"]
    assert {j.array_id for j in jobs} == {jobs[0].pk}
    assert [j.array_index for j in jobs] == [0, 1, 2, 7]
    assert {j.state for j in jobs} == {Job.State.PENDING}
    assert {j.predicted_runtime_s for j in jobs} == {jobs[0].predicted_runtime_s}
    assert [e.kind for e in JobEvent.objects.filter(job=jobs[3])] == ["submitted"]
    # One pass request for the whole array.
    assert len(sent_tasks.named("control.scheduling_pass")) == 1
    # Every task is visible in the API, alone and as its array.
    listed = body(api_as(alice).get(f"/api/jobs/?array={jobs[0].pk}"))["results"]
    assert sorted(j["id"] for j in listed) == answer["ids"]
    assert {j["array_id"] for j in listed} == {jobs[0].pk}
    assert body(api_as(alice).get(f"/api/jobs/{jobs[2].pk}/"))["array_index"] == 2


def test_a_task_spec_the_rules_refuse_refuses_the_whole_array_and_writes_nothing(
    alice: Any, cluster: Any, image: Any
) -> None:
    response = post_array(alice, "0-9", gpus=6)
    assert response.status_code == 400
    assert "No node has 6 matching GPUs" in response.content.decode()
    assert not Job.objects.exists() and not JobEvent.objects.exists()


@pytest.mark.parametrize(
    ("array", "says"),
    [
        ("0-1001", "at most 1000 jobs"),
        ("5-2", "counts down; write it as 2-5"),
        ("a-b", "is not an array range"),
        # Past what a job stores, which PostgreSQL refused with a 500.
        ("99999999999", "An array index is at most 4000000"),
        ("3999999-4000001", "An array index is at most 4000000"),
    ],
)
def test_a_bad_array_is_a_clear_400(
    alice: Any, cluster: Any, image: Any, array: str, says: str
) -> None:
    response = post_array(alice, array)
    assert response.status_code == 400
    assert says in body(response)["array"][0]
    assert not Job.objects.exists()


def test_an_array_counts_every_task_against_the_waiting_jobs_limit(
    alice: Any, cluster: Any, image: Any
) -> None:
    category = alice.category
    category.max_queued_jobs = 5
    category.save()
    response = post_array(alice, "0-5")
    assert response.status_code == 429  # as a single submit over the limit
    assert (
        "This array of 6 jobs would take you past the 5 waiting jobs" in response.content.decode()
    )
    assert not Job.objects.exists()
    assert post_array(alice, "0-4").status_code == 201


def test_the_statements_of_an_array_submit_do_not_grow_with_its_size(
    alice: Any, cluster: Any, image: Any
) -> None:
    alice.category.max_queued_jobs = 2 * MAX_ARRAY
    alice.category.save()
    VolumeMount.objects.create(name="data", source_template="/srv/data/{username}", target="/data")

    def statements(array: str) -> tuple[int, int, int]:
        """(statements other than INSERTs, INSERTs, characters of SQL sent)."""
        with CaptureQueriesContext(connection) as queries:
            assert post_array(alice, array, mounts=["data"]).status_code == 201
        sql = [q["sql"] for q in queries.captured_queries]
        inserts = sum(s.startswith("INSERT") for s in sql)
        return len(queries) - inserts, inserts, sum(map(len, sql))

    statements("0")  # warm: the first request loads what later ones find cached
    small, large = statements("0-1"), statements(f"0-{MAX_ARRAY - 1}")
    assert large[0] == small[0]
    assert Job.objects.count() == 1 + 2 + MAX_ARRAY
    assert JobEvent.objects.count() == Job.mounts.through.objects.count() == Job.objects.count()
    last = Job.objects.order_by("-pk").first()
    assert last is not None and [m.name for m in last.mounts.all()] == ["data"]
    if connection.vendor == "postgresql":
        # One statement writes the tasks, their events and mounts, and each task costs
        # it its index ("999,"), not a row of values converted in Python.
        assert large[1] == small[1]
        assert large[2] - small[2] < 5 * MAX_ARRAY
        return
    # One INSERT per table (jobs, events, mounts), or per batch where the database
    # caps a statement's parameters (SQLite's 999: the bound the backend states).
    fields = [f for f in Job._meta.concrete_fields if not f.primary_key]
    tables = [
        (fields, [Job()] * MAX_ARRAY),
        (JobEvent._meta.concrete_fields, [JobEvent()] * MAX_ARRAY),
        (Job.mounts.through._meta.concrete_fields, [Job.mounts.through()] * MAX_ARRAY),
    ]
    batches = sum(
        -(-MAX_ARRAY // connection.ops.bulk_batch_size(list(f), objs)) for f, objs in tables
    )
    assert large[1] <= batches + 1  # and the token's


def test_cancel_one_task_or_the_whole_array(alice: Any, bob: Any, cluster: Any, image: Any) -> None:
    ids = body(post_array(alice, "0-3"))["ids"]
    api = api_as(alice)
    assert body(api.post(f"/api/jobs/{ids[1]}/cancel/"))["state"] == "cancelled"
    assert Job.objects.filter(state=Job.State.PENDING).count() == 3
    # Someone else cannot cancel the array.
    assert api_as(bob).post(f"/api/jobs/{ids[0]}/cancel-array/").status_code in (403, 404)
    cancelled = body(api.post(f"/api/jobs/{ids[2]}/cancel-array/"))
    assert sorted(j["id"] for j in cancelled) == [ids[0], ids[2], ids[3]]
    assert set(Job.objects.values_list("state", flat=True)) == {Job.State.CANCELLED}


def test_cancel_array_of_a_job_outside_an_array_says_so(
    alice: Any, cluster: Any, image: Any
) -> None:
    from tests.jobqueue.test_submit import submit

    job = submit(alice)
    response = api_as(alice).post(f"/api/jobs/{job.pk}/cancel-array/")
    assert response.status_code == 400
    assert "is not part of an array" in response.content.decode()


def test_each_running_task_is_charged_as_a_job_is(alice: Any, cluster: Any, image: Any) -> None:
    queue = Queue.objects.get(name="normal")
    queue.credit_rate = Decimal("1.000")
    queue.save()
    ids = body(post_array(alice, "0-2", gpus=2, time_limit_s=86400))["ids"]
    started = datetime(2025, 3, 10, 12, 0, tzinfo=UTC)
    Job.objects.filter(pk__in=ids[:2]).update(state=Job.State.RUNNING, started_at=started)
    assert credits_charge_running_jobs(now=started + timedelta(hours=1, minutes=2)) == 2
    from accounts.models import LedgerEntry

    charged = {
        pk: sum(e.amount for e in LedgerEntry.objects.filter(job_id=pk, kind="charge"))
        for pk in ids
    }
    assert charged == {ids[0]: Decimal("-2.000"), ids[1]: Decimal("-2.000"), ids[2]: 0}


def test_array_indices_keep_the_documented_maximum() -> None:
    assert len(array_indices(f"0-{MAX_ARRAY - 1}")) == MAX_ARRAY
    with pytest.raises(ValueError, match="at most 1000"):
        array_indices(f"0-{MAX_ARRAY}")


def test_every_task_of_an_array_waits_for_the_arrays_dependency(
    alice: Any, cluster: Any, image: Any
) -> None:
    from tests.jobqueue.test_submit import submit

    first = submit(alice)
    ids = body(post_array(alice, "0-2", dependency=f"afterok:{first.pk}"))["ids"]
    for task in Job.objects.filter(pk__in=ids):
        assert task.dependency_kind == "afterok"
        assert [j.pk for j in task.depends_on.all()] == [first.pk]
    listed = body(api_as(alice).get(f"/api/jobs/{ids[1]}/"))
    assert listed["dependency"] == f"afterok:{first.pk}"


# What a task's row may differ in from a job submitted alone with the same spec.
PER_TASK = {"id", "env", "name", "array_id", "array_index", "submitted_at"}


def _row(job: Job) -> dict[str, Any]:
    values = Job.objects.filter(pk=job.pk).values().get()
    return {k: v for k, v in values.items() if k not in PER_TASK}


def test_every_task_is_the_job_a_single_submit_of_its_spec_makes(
    alice: Any, cluster: Any, image: Any
) -> None:
    from accounts.models import Project
    from jobqueue.arrays import jobs_submit_array
    from jobqueue.submit import job_submit

    Project.objects.create(name="vision", title="Vision grant", pi=alice)
    VolumeMount.objects.create(name="data", source_template="/srv/data/{username}", target="/data")
    first = job_submit(owner=alice, queue="normal", image=IMAGE, command="true")
    spec: dict[str, Any] = {
        "queue": "normal",
        "image": IMAGE,
        "command": "python sweep.py --lr 'a b'",
        "gpus": 2,
        "env": {"LR": "0.1", "NOTE": "ünïcode"},
        "mounts": ["data"],
        "time_limit_s": 5400,
        "min_gpu_memory_mb": 1024,
        "gpu_model": "A100",
        "cpus": Decimal("0.5"),
        "memory_mb": 2048,
        "name": "n" * 118,
        "preemptible": True,
        "depends_on": [first.pk],
        "dependency": "afterany",
        "project": "vision",
    }
    alone = job_submit(owner=alice, **spec)
    tasks = jobs_submit_array(owner=alice, spec=spec, indices=[3, 12])

    for task, index in zip(tasks, (3, 12), strict=True):
        stored = Job.objects.get(pk=task.pk)
        assert _row(stored) == _row(alone)
        assert stored.env == {**alone.env, ARRAY_INDEX_ENV: str(index)}
        assert stored.name == f"{'n' * 118}[{index}]"[:120]
        assert (stored.array_id, stored.array_index) == (tasks[0].pk, index)
        assert [m.name for m in stored.mounts.all()] == ["data"]
        assert [d.pk for d in stored.depends_on.all()] == [first.pk]
        events = [(e.kind, e.message, e.data, e.actor_id, e.step) for e in stored.events.all()]
        assert events == [
            (e.kind, e.message, e.data, e.actor_id, e.step) for e in alone.events.all()
        ]
    # What the service hands back is what was stored (the API and the form read it).
    assert [t.pk for t in tasks] == sorted(t.pk for t in tasks)
    assert [t.array_id for t in tasks] == [tasks[0].pk] * 2
    assert not tasks[1]._state.adding


def test_an_unnamed_arrays_tasks_stay_unnamed(alice: Any, cluster: Any, image: Any) -> None:
    ids = body(post_array(alice, "0-1"))["ids"]
    assert list(Job.objects.filter(pk__in=ids).values_list("name", flat=True)) == ["", ""]


def test_an_array_is_sent_to_slurm_as_one_sbatch_array(
    scripted: ScriptedSlurm,  # noqa: F811
    alice: Any,
    image: Any,
) -> None:
    from cluster.models import Gpu

    Gpu.objects.update(memory_mb=0)  # Slurm's GRES: the minimum is left to Slurm, and said
    ids = body(post_array(alice, "0-2", min_gpu_memory_mb=1024))["ids"]
    (request,) = scripted.submitted
    assert request.array == "0-2"
    for pk in ids:
        task = Job.objects.get(pk=pk)
        assert [e.kind for e in task.events.all()] == [
            "submitted",
            "gpu_memory_unchecked",
            "dispatched",
        ]


def test_cancelling_a_whole_array_takes_the_same_statements_at_any_size(
    alice: Any, cluster: Any, image: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Cancelling an array of 1,000 waiting tasks is one UPDATE and one INSERT of their
    events (in batches where the database caps a statement), not 1,000 cancels."""
    alice.category.max_queued_jobs = 2 * MAX_ARRAY
    alice.category.save()
    warm = body(post_array(alice, "0"))["ids"]
    small = body(post_array(alice, "0-1"))["ids"]
    large = body(post_array(alice, f"0-{MAX_ARRAY - 1}"))["ids"]
    api = api_as(alice)
    assert api.post(f"/api/jobs/{warm[0]}/cancel-array/").status_code == 200  # caches filled

    def statements(first: int) -> tuple[int, list[Any]]:
        with CaptureQueriesContext(connection) as queries:
            response = api.post(f"/api/jobs/{first}/cancel-array/")
        assert response.status_code == 200, response.content
        inserts = sum(q["sql"].startswith("INSERT") for q in queries.captured_queries)
        return len(queries) - inserts, body(response)

    from jobqueue import services

    wakes: list[None] = []
    monkeypatch.setattr(services, "request_scheduling_pass", lambda: wakes.append(None))
    small_count, _ = statements(small[0])
    large_count, cancelled = statements(large[0])
    assert large_count == small_count
    assert [j["id"] for j in cancelled] == large
    assert {j["state"] for j in cancelled} == {"cancelled"}
    assert {j["end_reason"] for j in cancelled} == {"cancelled"}
    assert not Job.objects.filter(pk__in=large).exclude(state=Job.State.CANCELLED).exists()
    assert not Job.objects.filter(pk__in=large, ended_at=None).exists()
    # Each task has its own "cancelled" event after its submit, by the member who cancelled.
    events = JobEvent.objects.filter(job_id__in=large, kind="cancelled")
    assert events.count() == MAX_ARRAY
    assert set(events.values_list("actor_id", flat=True)) == {alice.pk}
    # One pass request per cancel, not one per task.
    assert len(wakes) == 2


def test_cancelling_an_array_stops_its_running_tasks_and_ends_its_waiting_ones(
    alice: Any, cluster: Any, image: Any, sent_tasks: Any, django_capture_on_commit_callbacks: Any
) -> None:
    from cluster.models import Node

    ids = body(post_array(alice, "0-3"))["ids"]
    node = Node.objects.first()
    started = datetime.now(UTC) - timedelta(minutes=5)
    Job.objects.filter(pk=ids[0]).update(state=Job.State.RUNNING, node=node, started_at=started)
    Job.objects.filter(pk=ids[1]).update(state=Job.State.COMPLETED, ended_at=started)
    Job.objects.filter(pk=ids[2]).update(state=Job.State.HELD, hold_reason="disk full")
    # An event of the waiting task dated ahead of the portal's clock (an agent's, say).
    ahead = datetime.now(UTC) + timedelta(minutes=3)
    JobEvent.objects.create(job_id=ids[3], kind="queued", step=20, created_at=ahead)
    with django_capture_on_commit_callbacks(execute=True):
        cancelled = body(api_as(alice).post(f"/api/jobs/{ids[0]}/cancel-array/"))
    assert [j["id"] for j in cancelled] == [ids[0], ids[2], ids[3]]
    states = dict(Job.objects.filter(pk__in=ids).values_list("pk", "state"))
    # The running task is asked to stop (SIGTERM, grace, SIGKILL) and ends when it exits;
    # the completed one keeps its end; the held and the pending ones end now.
    assert states == {
        ids[0]: Job.State.RUNNING,
        ids[1]: Job.State.COMPLETED,
        ids[2]: Job.State.CANCELLED,
        ids[3]: Job.State.CANCELLED,
    }
    running = Job.objects.get(pk=ids[0])
    assert running.stop_requested_at is not None and running.end_reason == "cancelled"
    assert JobEvent.objects.filter(job_id=ids[0], kind="stop_requested").exists()
    assert [args[0] for _, args, _ in sent_tasks.named("agent.stop_job")] == [ids[0]]
    # An event is never dated before an event of an earlier step.
    event = JobEvent.objects.get(job_id=ids[3], kind="cancelled")
    assert event.created_at >= ahead
