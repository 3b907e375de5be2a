"""Not a test (not collected): a job end's way to the next job's start command, A/B in one process.

Each round ends one job through ``control.job_event`` (the pass runs inline) and notes the
queries, the CPU and the wall time from the event's arrival to the ``agent.start_job`` send.
Rounds alternate between this tree and the old order (the job-end notification written
inside the end's transaction, before the pass), so a loaded machine weighs on both alike.

Run: DATABASE_URL=<PG> .venv/bin/python -m pytest tests/jobqueue/measure_end_to_dispatch.py -s
"""

from __future__ import annotations

import os
import statistics
import time
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from jobqueue import services
from jobqueue.models import Job
from scheduling.passes import scheduling_pass
from tests.jobqueue.measure_job_events import next_job_events
from tests.jobqueue.test_submit import submit

pytestmark = pytest.mark.django_db(transaction=True)

NEW_NOTIFY = services._notify_job_end


def old_notify(job: Job) -> None:
    """The notification as before: written inside the end's transaction."""
    texts = services._NOTIFIED_END_STATES.get(Job.State(job.state))
    if texts is None or not job.owner.notify_job_end:
        return
    title, body = texts
    params = {
        "id": job.pk,
        "name": job.name or services.command_text(job.command)[:60],
        "duration": services.lazy_hours_minutes(job.duration() or timedelta(0)),
        "reason": services.lazy_text(services.gettext_noop("exit code %(code)s"), code=0),
    }
    services.account_services.notify(
        user=job.owner,
        kind=f"job_{job.state}",
        title=services.lazy_text(title, **params),
        body=services.lazy_text(body, **params),
        url=f"/jobs/{job.pk}/",
        dedupe_key=f"job-end:{job.pk}:{job.dispatch_count}",
    )


def test_measure(
    alice: Any, cluster: Any, image: Any, sent_tasks: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from labportal.celery import app
    from scheduling.tasks import job_event

    rounds = int(os.environ.get("ROUNDS", "40"))
    for _ in range(8 + 20):
        submit(alice)
    scheduling_pass()
    mark: dict[str, Any] = {}
    recorded_send = app.send_task

    def send_task(name: str, *args: Any, **kwargs: Any) -> Any:
        if name == "agent.start_job" and "wall" not in mark:
            mark.update(
                wall=time.perf_counter(),
                cpu=time.process_time(),
                q=len(mark["ctx"].captured_queries),
            )
        return recorded_send(name, *args, **kwargs)

    monkeypatch.setattr(app, "send_task", send_task)
    secrets: dict[str, str] = {}
    cost: dict[str, list[tuple[int, float, float, int]]] = {"old": [], "new": []}
    for n in range(rounds):
        variant = "old" if n % 2 else "new"
        monkeypatch.setattr(
            services, "_notify_job_end", old_notify if variant == "old" else NEW_NOTIFY
        )
        if Job.objects.filter(owner=alice).pending().count() < 10:
            for _k in range(10):
                submit(alice)
            scheduling_pass()  # takes the submits' request, which an inline pass would defer to
        _job, node, events = next_job_events(secrets)
        for kind, event, env in events:
            mark.clear()
            with CaptureQueriesContext(connection) as ctx:
                mark["ctx"] = ctx
                w0, c0 = time.perf_counter(), time.process_time()
                assert job_event(node, env, event) == "ok"
            if kind == "exited":
                assert "wall" in mark, "the end started no next job"
                cost[variant].append(
                    (mark["q"], (mark["cpu"] - c0) * 1000, (mark["wall"] - w0) * 1000, len(ctx))
                )
    for variant, rows in cost.items():
        rows = rows[2:]
        print(
            f"\nMEASURE {variant}: queries to the start command {statistics.median(r[0] for r in rows)}"
            f", CPU to it median {statistics.median(r[1] for r in rows):.1f} ms"
            f", wall to it median {statistics.median(r[2] for r in rows):.1f} ms"
            f", queries per end {statistics.median(r[3] for r in rows)} over {len(rows)}"
        )
