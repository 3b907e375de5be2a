"""Who may open a path to a job: its owner and staff; another member gets 403, anonymous signs in."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import AnonymousUser

from cluster.models import NodeToken
from jobqueue.models import Job
from protocol import tickets
from protocol.signing import key_from_hash
from sessions.errors import NoSuchSession, NotReachable, NotSignedIn, NotYours
from sessions.launch import session_token
from sessions.selectors import gateway_target, job_reachable_by

pytestmark = pytest.mark.django_db


def test_the_owner_and_staff_reach_the_job(session_job: Job, alice: Any, admin_user: Any) -> None:
    assert job_reachable_by(alice, session_job.pk) == session_job
    assert job_reachable_by(admin_user, session_job.pk) == session_job


def test_another_member_is_refused(session_job: Job, bob: Any, charlie: Any) -> None:
    for other in (bob, charlie):
        with pytest.raises(NotYours):
            job_reachable_by(other, session_job.pk)


def test_anonymous_must_sign_in(session_job: Job) -> None:
    with pytest.raises(NotSignedIn):
        job_reachable_by(AnonymousUser(), session_job.pk)


def test_an_unknown_job_is_not_found(session_job: Job, alice: Any) -> None:
    with pytest.raises(NoSuchSession):
        job_reachable_by(alice, session_job.pk + 1000)


def test_the_ticket_is_the_nodes_for_that_job_and_purpose(session_job: Job, alice: Any) -> None:
    target = gateway_target(
        session_job, purpose="http", username=alice.username, rest="sessions/1/lab"
    )
    assert target.url == f"http://127.0.0.1:9/jobs/{session_job.pk}/proxy/sessions/1/lab"
    token = NodeToken.objects.get(node_name="gpu01")
    payload = tickets.verify(
        key_from_hash(token.token_hash),
        token.token_prefix,
        target.headers[tickets.HEADER],
        node="gpu01",
        job_id=session_job.pk,
        purpose="http",
    )
    assert payload["user"] == alice.username and payload["attempt"] == 1
    assert (
        target.headers["Authorization"]
        == f"token {session_token(job_id=session_job.pk, attempt=1)}"
    )
    with pytest.raises(tickets.TicketRefused):
        tickets.verify(
            key_from_hash(token.token_hash),
            token.token_prefix,
            target.headers[tickets.HEADER],
            node="gpu01",
            job_id=session_job.pk,
            purpose="exec",
        )


def test_an_exec_or_probe_ticket_carries_no_session_token(session_job: Job, alice: Any) -> None:
    for purpose in ("exec", "probe"):
        target = gateway_target(session_job, purpose=purpose, username=alice.username)
        assert "Authorization" not in target.headers


def test_nothing_is_reachable_before_it_runs_or_without_a_gateway(
    session_job: Job, alice: Any
) -> None:
    Job.objects.filter(pk=session_job.pk).update(state=Job.State.PENDING)
    session_job.refresh_from_db()
    with pytest.raises(NotReachable):
        gateway_target(session_job, purpose="http", username=alice.username)
    Job.objects.filter(pk=session_job.pk).update(state=Job.State.RUNNING)
    session_job.refresh_from_db()
    session_job.node.gateway_url = ""  # type: ignore[union-attr]
    with pytest.raises(NotReachable):
        gateway_target(session_job, purpose="http", username=alice.username)
