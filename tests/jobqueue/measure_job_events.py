"""Not a test (not collected): the control worker's queries and CPU per job event.

Run: DATABASE_URL=<PG> .venv/bin/python -m pytest tests/jobqueue/measure_job_events.py -s
"""

from __future__ import annotations

import os
import statistics
import time
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from jobqueue.models import Job
from protocol.signing import key_from_token, sign, token_kid
from scheduling.passes import scheduling_pass
from tests.jobqueue.test_submit import submit

pytestmark = pytest.mark.django_db(transaction=True)


def next_job_events(secrets: dict[str, str]) -> tuple[Job, str, list[tuple[str, Any, Any]]]:
    """The first dispatched job, its node, and its started and exited events as that node
    signs them (a node token is issued once per node into ``secrets``)."""
    from cluster.models import NodeToken

    job = Job.objects.select_related("node").filter(state=Job.State.DISPATCHED).first()
    assert job is not None and job.node is not None
    node = job.node.name
    if node not in secrets:
        secrets[node] = NodeToken.issue(node_name=node)[1]
    events = []
    for kind in ("started", "exited"):
        event = {
            "event_id": f"{job.pk}:{kind}:c1",
            "job_id": job.pk,
            "kind": kind,
            "container_id": "c1",
            "ts": timezone.now().timestamp(),
            "exit_code": 0 if kind == "exited" else None,
        }
        env = sign(
            key_from_token(secrets[node]),
            kid=token_kid(secrets[node]),
            task="control.job_event",
            node=node,
            args=[event],
            ttl_s=60,
        )
        events.append((kind, event, env))
    return job, node, events


def test_measure(alice: Any, cluster: Any, image: Any, sent_tasks: Any) -> None:
    from scheduling.tasks import job_event

    rounds = int(os.environ.get("ROUNDS", "30"))
    for _ in range(8 + min(rounds, 40)):
        submit(alice)
    scheduling_pass()
    secrets: dict[str, str] = {}
    cost: dict[str, list[tuple[int, float]]] = {"started": [], "exited": []}
    for _ in range(rounds):
        if len(secrets) == 2 and Job.objects.filter(owner=alice).pending().count() < 20:
            for _k in range(10):
                submit(alice)
        job, node, events = next_job_events(secrets)
        for kind, event, env in events:
            t0 = time.process_time()
            with CaptureQueriesContext(connection) as ctx:
                assert job_event(node, env, event) == "ok"
            cost[kind].append((len(ctx.captured_queries), time.process_time() - t0))
            if os.environ.get("DUMP") and _ == 5:
                for q in ctx.captured_queries:
                    print("Q", kind, q["sql"][:230])
        assert Job.objects.get(pk=job.pk).state == Job.State.COMPLETED
    for kind, rows in cost.items():
        qs = [q for q, _ in rows[3:]]
        cpu = [c * 1000 for _, c in rows[3:]]
        print(
            f"\nMEASURE {kind}: queries median {statistics.median(qs)} "
            f"(min {min(qs)} max {max(qs)}), CPU median {statistics.median(cpu):.2f} ms "
            f"mean {statistics.mean(cpu):.2f} ms over {len(qs)}"
        )
