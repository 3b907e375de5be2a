"""A portal host that cannot run Slurm's commands as the member (sudo missing, or no
sudoers rule): the member is told it is the portal's setup (503, nothing saved), not that
Slurm refused the job or is down; the admins find it on the setup check with the sudoers
rule to add, and it closes once a submit goes through."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from jobqueue.models import Job
from slurm.cli import CommandsClient, slurm_unreachable_since
from slurm.models import UnixLogin
from slurm.rules_models import SetupProblem
from slurm.setup_check import open_problem_count
from tests.conftest import api_as
from tests.factories import UserFactory
from tests.slurm.test_services import ScriptedSlurm

pytestmark = pytest.mark.django_db


def _fake_sudo(tmp_path: Path, answer: str) -> str:
    """A sudo that answers as sudo -n does without a rule (a real process, exit 1)."""
    sudo = tmp_path / "sudo"
    sudo.write_text(f"#!/bin/sh\necho '{answer}' >&2\nexit 1\n")
    sudo.chmod(0o755)
    return f"{sudo} -n -u {{user}} --"


def _submit(user: Any) -> Any:
    return api_as(user).post(
        "/api/v1/jobs/",
        {"image": "labportal/busybox:test", "command": "true", "gpus": 1, "cpus": 1},
        format="json",
    )


@pytest.fixture
def slurm_mode(settings: Any, cluster: Any, image: Any, alice: Any) -> Any:
    settings.LABPORTAL_EXECUTOR = "slurm"
    UnixLogin.objects.create(user=alice, username="alice_u")
    return settings


@pytest.mark.parametrize(
    "run_as",
    [
        pytest.param(
            lambda tmp: _fake_sudo(tmp, "sudo: a password is required"), id="no-sudoers-rule"
        ),
        pytest.param(lambda tmp: f"{tmp}/not-installed/sudo -n -u {{user}} --", id="no-sudo"),
    ],
)
def test_a_host_without_sudo_for_the_member_is_the_portals_setup_not_slurms_refusal(
    slurm_mode: Any,
    alice: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    run_as: Any,
) -> None:
    commands = CommandsClient(run_as=run_as(tmp_path))
    monkeypatch.setattr("slurm.services.client_from_settings", lambda: commands)

    response = _submit(alice)

    assert response.status_code == 503, response.content
    answer = json.loads(response.content)
    assert answer["code"] == "slurm_setup"
    assert "could not run Slurm's commands as your unix user" in answer["detail"]
    assert "the portal's setup, not your job" in answer["detail"]
    assert "Slurm refused" not in answer["detail"] and "unreachable" not in answer["detail"]
    assert not Job.objects.exists()  # rolled back
    assert slurm_unreachable_since() is None  # not an outage

    # The admins see it (the staff banner counts it) with the rule that fixes it.
    assert open_problem_count() == 1
    problem = SetupProblem.objects.open().get()
    assert "NOPASSWD: /usr/bin/sbatch, /usr/bin/scancel" in problem.fix
    assert "LABPORTAL_SLURM_REST_URL" in problem.fix

    # Fixed (here: a Slurm that takes the job): the next submit closes the problem.
    monkeypatch.setattr("slurm.services.client_from_settings", ScriptedSlurm)
    assert _submit(alice).status_code == 201
    assert open_problem_count() == 0


def test_the_setup_check_page_lists_a_host_problem_met_since(
    slurm_mode: Any, alice: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, client: Any
) -> None:
    commands = CommandsClient(run_as=_fake_sudo(tmp_path, "sudo: a password is required"))
    monkeypatch.setattr("slurm.services.client_from_settings", lambda: commands)
    assert _submit(alice).status_code == 503

    client.force_login(UserFactory(username="root-admin", is_staff=True, is_superuser=True))
    page = client.get("/admin/slurm/setupproblem/").content.decode()
    assert "sudo: a password is required" in page
    assert "NOPASSWD" in page
    # The policy pass's own bookkeeping does not close a problem of the host.
    from slurm.setup_check import close_unseen

    close_unseen([])
    assert SetupProblem.objects.open().count() == 1
