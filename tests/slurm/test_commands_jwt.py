"""LABPORTAL_SLURM_COMMANDS_AUTH=jwt: the Slurm commands the portal runs as itself carry a
token for the service user (SLURM_JWT), so a portal in a container needs no munge; a
command run as a member never carries it."""

from __future__ import annotations

from pathlib import Path

import pytest

from slurm.cli import CommandsClient, SlurmError, portal_commands
from slurm.setup_check import fix_for, portal_slurm_user
from tests.labportal.test_settings import load_settings

PROBE_QOS = "lp-jwt-probe"


def test_only_the_portals_own_commands_carry_the_token() -> None:
    client = CommandsClient(run_as="", service_token=lambda: "token-of-the-service-user")
    assert "SLURM_JWT=token-of-the-service-user" in client._run(["env"])
    assert "SLURM_JWT" not in client._run(["env"], as_member=True)
    assert "SLURM_JWT" not in CommandsClient(run_as="")._run(["env"])


def test_jwt_commands_without_the_key_are_refused_at_start(tmp_path: Path) -> None:
    result = load_settings(
        tmp_path, LABPORTAL_EXECUTOR="slurm", LABPORTAL_SLURM_COMMANDS_AUTH="jwt"
    )
    assert result.returncode != 0
    assert "ImproperlyConfigured" in result.stderr
    assert "LABPORTAL_SLURM_JWT_KEY_FILE" in result.stderr
    assert "LABPORTAL_SLURM_COMMANDS_AUTH=munge" in result.stderr


@pytest.mark.slurm
@pytest.mark.django_db
def test_the_portals_commands_act_as_the_service_user_of_their_token(
    slurm_settings: object,
) -> None:
    settings = slurm_settings
    settings.LABPORTAL_SLURM_COMMANDS_AUTH = "jwt"  # type: ignore[attr-defined]
    # The test runs as root, whose munge credential could do anything: a token for a user
    # without Slurm's admin level is refused, so the command went as the token's user.
    settings.LABPORTAL_SLURM_SERVICE_USER = "nobody"  # type: ignore[attr-defined]
    with pytest.raises(SlurmError, match="(?i)permission denied"):
        portal_commands()._run(["sacctmgr", "-i", "add", "qos", PROBE_QOS])
    assert portal_slurm_user() == "nobody"
    assert "name=nobody set adminlevel=Administrator" in fix_for(
        ["add", "qos", PROBE_QOS], "Access/permission denied"
    )
    settings.LABPORTAL_SLURM_SERVICE_USER = "root"  # type: ignore[attr-defined]
    commands = portal_commands()
    try:
        commands._run(["sacctmgr", "-i", "add", "qos", PROBE_QOS])
        assert PROBE_QOS in commands._run(["sacctmgr", "-Pn", "show", "qos", "format=Name"])
        assert "RUNNING" not in commands._run(["squeue", "-h", "-o", "%T"])  # slurmctld too
    finally:
        commands._run(["sacctmgr", "-i", "delete", "qos", PROBE_QOS])
