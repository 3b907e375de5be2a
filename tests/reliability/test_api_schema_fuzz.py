"""Schemathesis over the live OpenAPI schema: every operation, as a member and as staff.

The issue-17 probe found 28 server errors in 33,182 requests. This is its bounded
replay for CI: a fixed seed, a fixed number of examples per operation (valid and
invalid inputs), each request sent with a member's and with an admin's Bearer
token, against the real WSGI application and the test database (PostgreSQL in the
second pass of .ci/run). The bar is no server error, only documented statuses, and
responses whose Content-Type and body match the schema (a field the API can return as
null must be marked nullable there).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
import schemathesis
from django.utils import timezone
from hypothesis import HealthCheck, seed
from hypothesis import settings as hypothesis_settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from accounts.models import Notification, PersonalAccessToken
from tests.factories import UserFactory

EXAMPLES_PER_OPERATION = 10

schema = schemathesis.pytest.from_fixture("live_schema")


@pytest.fixture
def lab(db: Any, cluster: Any, image: Any, alice: Any, settings: Any) -> dict[str, str]:
    # Every example reaches its operation: the rate limits have tests of their own
    # (tests/accounts/test_throttles.py), and a 429 here would stand in for the answer.
    settings.LABPORTAL_API_RATES = {}
    """A small lab with one of everything, and a Bearer token for a member and for staff."""
    from jobqueue.submit import job_submit
    from reservations.services import reservation_create

    job_submit(owner=alice, queue="normal", image=image.reference, command=["echo", "hi"])
    gpu = cluster[0].gpus.first()
    start = timezone.now().replace(microsecond=0, second=0, minute=0) + timedelta(days=1)
    reservation_create(
        user=alice, gpu_ids=[gpu.pk], start=start, end=start + timedelta(hours=2), note="fuzz"
    )
    Notification.objects.create(user=alice, kind="info", title="hello", body="fuzz")
    staff: Any = UserFactory(username="fuzz-admin", is_staff=True, is_superuser=True)
    return {
        "member": PersonalAccessToken.issue(user=alice, name="fuzz")[1],
        "staff": PersonalAccessToken.issue(user=staff, name="fuzz")[1],
    }


@pytest.fixture
def live_schema(lab: dict[str, str]) -> Any:
    from django.core import signals
    from django.db import close_old_connections

    from labportal.wsgi import application

    # As Django's test client does: the WSGI handler would otherwise close the
    # connection that holds the test's transaction after each request.
    signals.request_started.disconnect(close_old_connections)
    signals.request_finished.disconnect(close_old_connections)
    try:
        yield schemathesis.openapi.from_wsgi("/api/schema/", application)
    finally:
        signals.request_started.connect(close_old_connections)
        signals.request_finished.connect(close_old_connections)


@schema.parametrize()
@seed(17)
@hypothesis_settings(
    max_examples=EXAMPLES_PER_OPERATION,
    deadline=None,
    database=None,
    suppress_health_check=list(HealthCheck),
)
def test_no_operation_answers_with_a_server_error(case: Any, lab: dict[str, str]) -> None:
    for token in (lab["member"], lab["staff"]):
        case.call_and_validate(
            # Schemathesis's WSGI transport does not undo gzip, which the portal sends to
            # a client that accepts it (tests/labportal/test_compression.py).
            headers={"Authorization": f"Bearer {token}", "Accept-Encoding": "identity"},
            checks=[
                not_a_server_error,
                status_code_conformance,
                content_type_conformance,
                response_schema_conformance,
            ],
        )


@pytest.mark.parametrize(
    ("component", "field"),
    [
        ("PriorityGrant", "decided_by"),  # undecided
        ("EmergencyRequest", "decided_by"),
        ("Job", "node"),  # not placed yet
        ("Job", "slurm"),  # agents mode
        ("Alert", "acknowledged_by"),  # not acknowledged
    ],
)
def test_fields_the_api_returns_as_null_are_nullable(component: str, field: str) -> None:
    """The fuzz run above meets only some of these nulls (the lab has no grant or alert)."""
    from drf_spectacular.generators import SchemaGenerator

    spec = SchemaGenerator().get_schema(request=None, public=True)
    assert spec["components"]["schemas"][component]["properties"][field]["nullable"] is True
