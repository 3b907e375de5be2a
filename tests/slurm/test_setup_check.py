"""The admin's Slurm setup check against the real private Slurm: a portal whose unix user has
only Slurm's Operator level cannot create the emergency QOS; the admin is told what failed and
the command that fixes it, once, instead of a warning in the worker's log every minute."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import pytest

from benchmarks.local_slurm import LocalSlurm
from slurm.admin_commands import SlurmAdmin
from slurm.cli import CommandsClient
from slurm.policy import slurm_policy_sync
from slurm.rules_models import SetupProblem
from tests.factories import UserFactory

pytestmark = [pytest.mark.slurm, pytest.mark.django_db]

OPERATOR = "daemon"  # one of the fixture's Slurm users (tests/slurm/conftest.py)


@pytest.fixture
def operator_admin(local_slurm: LocalSlurm, admin: SlurmAdmin) -> Iterator[SlurmAdmin]:
    """The portal's admin commands run as a unix user with Slurm's Operator level only."""
    local_slurm.sacctmgr("modify", "user", f"name={OPERATOR}", "set", "adminlevel=Operator")
    client = CommandsClient(slurm_conf=local_slurm.env["SLURM_CONF"], run_as="")
    yield SlurmAdmin(
        lambda argv: client._run(["runuser", "-u", OPERATOR, "--", *argv], timeout=60),
        cluster="labportal",
    )
    local_slurm.sacctmgr("modify", "user", f"name={OPERATOR}", "set", "adminlevel=None")


def test_a_qos_the_portal_may_not_create_is_on_the_setup_check_with_its_fix(
    slurm_settings: Any,
    operator_admin: SlurmAdmin,
    admin: SlurmAdmin,
    client: Any,
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING, logger="slurm.setup_check"):
        first = slurm_policy_sync(admin=operator_admin)
        slurm_policy_sync(admin=operator_admin)

    refused = [e for e in first.errors if "add qos lp-emergency" in e]
    assert refused, first.errors
    problem = SetupProblem.objects.open().get(key__contains="add qos lp-emergency")
    assert problem.times == 2
    assert "permission" in problem.message.lower()
    assert "adminlevel=Administrator" in problem.fix
    assert "sacctmgr -i add qos lp-emergency" in problem.fix
    # Logged once, when first met, not at every pass.
    warnings = [r for r in caplog.records if "add qos lp-emergency" in r.getMessage()]
    assert len(warnings) == 1

    # Staff see how many changes were refused on every page, and the check lists the fix.
    staff = UserFactory(username="root-admin", is_staff=True, is_superuser=True)
    client.force_login(staff)
    page = client.get("/").content.decode()
    assert 'data-testid="slurm-setup"' in page
    check = client.get("/admin/slurm/setupproblem/?state=open").content.decode()
    assert "adminlevel=Administrator" in check
    member = UserFactory(username="member-x")
    client.force_login(member)
    assert 'data-testid="slurm-setup"' not in client.get("/").content.decode()

    # Run with enough rights, the pass creates the QOS and the problem is closed.
    slurm_policy_sync(admin=admin)
    assert "lp-emergency" in admin.qos_priorities()
    problem.refresh_from_db()
    assert problem.resolved_at is not None
    assert not SetupProblem.objects.open().exists()
