"""A running session on a node with a gateway and an active token."""

from __future__ import annotations

from typing import Any

import pytest
from django.utils import timezone

from cluster.models import Node, NodeToken
from jobqueue.models import Job
from sessions.services import session_start

# Fixtures of other suites these tests use: the alert evaluation after rollups, and the
# local-process runtime that runs jobs as the test's own user.
from tests.agent.test_gateway import runtime  # noqa: F401
from tests.alerts.conftest import evaluate  # noqa: F401


def running_session(owner: Any, image: Any, *, kind: str = "jupyter", gateway: str = "") -> Job:
    node = Node.objects.get(name="gpu01")
    node.gateway_url = gateway
    node.save(update_fields=["gateway_url"])
    if not NodeToken.objects.filter(node_name=node.name).exists():
        NodeToken.issue(node_name=node.name)
    job = session_start(owner=owner, kind=kind, image=image.reference, queue="normal")
    Job.objects.filter(pk=job.pk).update(
        state=Job.State.RUNNING, node=node, started_at=timezone.now(), dispatch_count=1
    )
    job.refresh_from_db()
    return job


@pytest.fixture
def session_job(cluster: Any, alice: Any, image: Any) -> Job:
    return running_session(alice, image, gateway="http://127.0.0.1:9")
