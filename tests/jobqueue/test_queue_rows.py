"""The queue page's rows as queue_rows builds them: escaped values, links only where the
reader may open the job, the reader's own rows marked, every cell labelled for phones."""

from __future__ import annotations

import re
from datetime import timedelta

import time_machine
from django.utils import timezone, translation

from accounts.models import User
from cluster.models import Gpu, Node
from jobqueue.models import Allocation, Job, Queue
from jobqueue.templatetags.queue_rows import running_rows, waiting_rows

OWNER = User(pk=7, username="<b>eve</b>")
READER = User(pk=8, username="frank")


def _job(pk: int, owner: User, **fields: object) -> Job:
    fields = {"gpus": 2, "state": Job.State.PENDING, **fields}
    job = Job(pk=pk, owner=owner, queue=Queue(name="normal"), **fields)
    # As the page's selector prefetches them: no query for a job's GPUs.
    job._prefetched_objects_cache = {"allocations": []}  # type: ignore[attr-defined]
    return job


def test_values_are_escaped_and_only_the_owner_or_staff_get_a_link() -> None:
    jobs = [
        _job(11, OWNER, pending_reason="resources"),
        _job(12, READER, pending_reason="no_credit", shared_slot=True, gpus=1),
    ]
    jobs[0].queue_position = 1
    html = str(waiting_rows(jobs, READER))
    assert "<b>eve</b>" not in html and "&lt;b&gt;eve&lt;/b&gt;" in html
    rows = html.split("\n")
    assert len(rows) == 2
    assert 'href="/jobs/11/"' not in rows[0] and '<td data-label="Job">11</td>' in rows[0]
    assert 'class="mine"' not in rows[0]
    assert '<a href="/jobs/12/">12</a>' in rows[1] and 'class="mine"' in rows[1]
    # A position the pass has not set yet, a shared slot, the reason worded for its reader.
    assert '<td data-label="Position">1</td>' in rows[0]
    assert '<td data-label="Position">…</td>' in rows[1]
    assert '<td data-label="GPUs">slot</td>' in rows[1]
    assert "Your credit is used up" in rows[1]
    assert "Waiting for GPUs to free up." in rows[0]
    assert re.findall(r'data-label="([^"]+)"', rows[0]) == [
        "Position",
        "Job",
        "Owner",
        "Queue",
        "GPUs",
        "Estimated start",
        "Why it waits",
    ]
    staff = User(pk=9, username="admin", is_staff=True)
    assert '<a href="/jobs/11/">11</a>' in str(waiting_rows(jobs, staff))


@time_machine.travel("2026-03-02 09:00:00+00:00", tick=False)
def test_estimates_in_the_rows_are_a_range_a_time_or_a_state() -> None:
    now = timezone.now()
    far = _job(1, OWNER, pending_reason="resources", estimated_start=now + timedelta(hours=20))
    unknown = _job(2, OWNER, pending_reason="resources")
    new = _job(3, OWNER)  # no pass has placed it yet
    html = str(waiting_rows([far, unknown, new], READER)).split("\n")
    assert 'data-testid="estimated-start-range"' in html[0] and "likely between" in html[0]
    assert "unknown" in html[1]
    assert "being scheduled" in html[2] and "The scheduler places it within seconds." in html[2]
    with translation.override("zh-hans"):
        zh = str(waiting_rows([far], READER))
    assert "很可能在" in zh and 'data-label="预计开始时间"' in zh


def test_running_rows_list_the_gpus_state_and_times() -> None:
    job = _job(21, READER, state=Job.State.RUNNING, time_limit_s=3600)
    job.started_at = timezone.now()
    node = Node(name="gpu01")
    job._prefetched_objects_cache = {  # type: ignore[attr-defined]
        "allocations": [
            Allocation(gpu=Gpu(node=node, index=i, kind=Gpu.Kind.WHOLE)) for i in (0, 1)
        ]
    }
    html = str(running_rows([job], READER))
    assert '<span class="state state-running">running</span>' in html
    assert '<td data-label="GPUs">gpu01/gpu0, gpu01/gpu1</td>' in html
    assert html.count("—") == 0  # started and time limit end are both known
    waiting_start = _job(22, OWNER, state=Job.State.RUNNING, time_limit_s=3600)
    assert str(running_rows([waiting_start], READER)).count("—") == 2
