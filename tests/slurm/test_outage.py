"""A Slurm whose controller cannot be reached: the member is told 503 "unreachable since …,
try again" (never 400 "refused"), /healthz says so, and both recover once Slurm answers.

The outage is real: slurmrestd and the commands run with a copy of the private Slurm's
slurm.conf whose controller port nothing listens on."""

from __future__ import annotations

import json
import os
import pwd
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.test import Client

from benchmarks.local_slurm import LocalSlurm
from jobqueue.models import Job
from labportal.devstack import free_port, wait_for_port
from slurm import cli
from slurm.services import slurm_inventory_sync
from tests.conftest import api_as

pytestmark = [pytest.mark.slurm, pytest.mark.django_db]


@pytest.fixture
def controller_away(local_slurm: LocalSlurm) -> Iterator[tuple[Path, str]]:
    """(a slurm.conf whose slurmctld is unreachable, a slurmrestd that uses it)."""
    conf_text = Path(local_slurm.env["SLURM_CONF"]).read_text()
    away = f"SlurmctldPort={free_port()}"
    conf = local_slurm.dir / f"slurm-away-{os.getpid()}.conf"
    conf.write_text(
        "\n".join(
            away if line.startswith("SlurmctldPort=") else line for line in conf_text.splitlines()
        )
        + "\n"
    )
    conf.chmod(0o644)  # slurmrestd runs as nobody
    port = free_port()
    nobody = pwd.getpwnam("nobody")
    rest = subprocess.Popen(
        [
            "slurmrestd",
            "-f",
            str(conf),
            "-a",
            "rest_auth/jwt",
            "-s",
            "openapi/v0.0.38",
            "-u",
            str(nobody.pw_uid),
            "-g",
            str(nobody.pw_gid),
            f"127.0.0.1:{port}",
        ],
        env={**local_slurm.env, "SLURM_CONF": str(conf), "SLURM_JWT": "daemon"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_for_port(port, timeout_s=30)
        yield conf, f"http://127.0.0.1:{port}"
    finally:
        rest.terminate()
        rest.wait(timeout=30)
        conf.unlink()


def _submit(user: Any) -> Any:
    return api_as(user).post(
        "/api/jobs/",
        {
            "image": "labportal/busybox:test",
            "command": "true",
            "gpus": 1,
            "cpus": 1,
            "memory_mb": 64,
        },
        format="json",
    )


def test_a_submit_while_slurmctld_is_unreachable_is_a_503_saying_since_when(
    members: tuple[Any, Any],
    queues: Any,
    image: Any,
    settings: Any,
    controller_away: tuple[Path, str],
    client: Client,
) -> None:
    alice, _bob = members
    slurm_inventory_sync()  # while Slurm answers: the portal knows its GPUs
    reachable = settings.LABPORTAL_SLURM_REST_URL
    _conf, away_url = controller_away
    settings.LABPORTAL_SLURM_REST_URL = away_url

    response = _submit(alice)

    assert response.status_code == 503, response.content
    answer = json.loads(response.content)
    assert answer["code"] == "slurm_unavailable"
    assert "Slurm is unreachable (since " in answer["detail"]
    assert "Unable to contact slurm controller" in answer["detail"]
    assert "try again" in answer["detail"]
    assert not Job.objects.filter(owner=alice).exists()
    health = client.get("/healthz")
    assert health.status_code == 503
    assert health.json()["checks"]["slurm"] == "down: SlurmUnavailable"
    client.force_login(alice)
    assert "Slurm has been unreachable since" in client.get("/rules/").content.decode()

    settings.LABPORTAL_SLURM_REST_URL = reachable  # slurmctld is back: nothing to reset
    health = client.get("/healthz")
    assert health.status_code == 200, health.json()
    assert health.json()["periodic"]["slurm_answered"]["state"] == "ok"
    assert "Slurm has been unreachable" not in client.get("/rules/").content.decode()


def test_without_slurmrestd_an_unreachable_controller_is_a_503_too(
    members: tuple[Any, Any],
    queues: Any,
    image: Any,
    settings: Any,
    controller_away: tuple[Path, str],
) -> None:
    alice, _bob = members
    slurm_inventory_sync()
    conf, _url = controller_away
    settings.LABPORTAL_SLURM_REST_URL = ""  # the commands, with the unreachable controller
    settings.LABPORTAL_SLURM_CONF = str(conf)

    response = _submit(alice)

    assert response.status_code == 503, response.content
    assert "Unable to contact slurm controller" in json.loads(response.content)["detail"]
    assert not Job.objects.filter(owner=alice).exists()


def test_during_an_outage_the_next_members_are_answered_at_once_and_it_retries_after_the_window(
    members: tuple[Any, Any],
    queues: Any,
    image: Any,
    settings: Any,
    controller_away: tuple[Path, str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """slurmrestd retries an unreachable controller for about 9 s per call: the second member
    within the window is not made to wait that out again, and is told the same reason."""
    alice, bob = members
    slurm_inventory_sync()
    reachable = settings.LABPORTAL_SLURM_REST_URL
    settings.LABPORTAL_SLURM_REST_URL = controller_away[1]
    monkeypatch.setattr(cli, "RETRY_AFTER_S", 1.0)
    calls: list[str] = []
    real_call = cli.RestClient._call

    def counted(self: Any, method: str, path: str, **kwargs: Any) -> Any:
        calls.append(f"{method} {path}")
        return real_call(self, method, path, **kwargs)

    monkeypatch.setattr(cli.RestClient, "_call", counted)

    first = _submit(alice)
    tried = len(calls)
    second = _submit(bob)

    assert first.status_code == second.status_code == 503
    assert tried >= 1 and len(calls) == tried  # the second never reached slurmrestd
    detail = json.loads(second.content)["detail"]
    assert "Unable to contact slurm controller" in detail
    assert "the portal tries Slurm again at most every 1 s" in detail
    assert not Job.objects.exists()

    time.sleep(1.2)  # the window is over: the next member's call tries Slurm, which is back
    settings.LABPORTAL_SLURM_REST_URL = reachable
    third = _submit(alice)

    assert third.status_code == 201, third.content
    assert len(calls) > tried
    assert cli.slurm_unreachable_since() is None
