"""A real, private Slurm for the Slurm-mode tests: one per test session.

``local_slurm`` starts munged, MariaDB, slurmdbd, slurmctld, slurmd (one node, four fake
GPUs as typed GRES: 2 × a100 and 2 × l40s) and slurmrestd (JWT) in a temporary directory, on ports from
LABPORTAL_TEST_SLURM_PORT_BASE (4 in a row, default 8811) and LABPORTAL_TEST_MARIADB_PORT
(default 3311). It skips with a reason where Slurm is missing, and fails under CI=true.
``slurm_settings`` points the portal at it (Slurm mode, slurmrestd and the JWT key).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from benchmarks.local_slurm import LocalSlurm, Ports
from slurm.admin_commands import SlurmAdmin
from slurm.models import UnixLogin
from tests.conftest import require_in_ci

# Members' unix users in the tests: system users every Debian machine has, so the tests
# create no accounts on the host. Each gets an association in account "lab".
MEMBER_UNIX_USERS = ("nobody", "daemon")
# The node's GPUs: two GRES types, so a test of the GPU model a member picks means something.
GPU_TYPES = (("a100", 2), ("l40s", 2))


@pytest.fixture(scope="session")
def local_slurm() -> Iterator[LocalSlurm]:
    missing = LocalSlurm.missing(accounting=True, rest=True)
    if missing:
        require_in_ci(f"Slurm ({missing})")
    slurm = LocalSlurm(
        gpu_types=GPU_TYPES,
        ports=Ports.from_env(),
        accounting=True,
        rest=True,
        partition="lab",
        cluster_name="labportal",
    )
    try:
        slurm.start()
        for name in MEMBER_UNIX_USERS:
            slurm.add_user(name)
        yield slurm
    finally:
        slurm.stop()


@pytest.fixture
def slurm_settings(settings: Any, local_slurm: LocalSlurm) -> Any:
    """The portal in Slurm mode against ``local_slurm``, through slurmrestd."""
    settings.LABPORTAL_EXECUTOR = "slurm"
    settings.LABPORTAL_SLURM_REST_URL = local_slurm.rest_url
    settings.LABPORTAL_SLURM_JWT_KEY_FILE = str(local_slurm.jwt_key)
    settings.LABPORTAL_SLURM_SERVICE_USER = "root"
    settings.LABPORTAL_SLURM_CONF = local_slurm.env["SLURM_CONF"]
    settings.LABPORTAL_SLURM_RUN_AS = "runuser -u {user} --"
    settings.LABPORTAL_SLURM_OUTPUT_DIR = str(local_slurm.output_dir)
    settings.LABPORTAL_SLURM_CONTAINER = "none"
    return settings


@pytest.fixture
def members(slurm_settings: Any, alice: Any, bob: Any) -> tuple[Any, Any]:
    """alice runs as unix user nobody, bob as daemon (the fixture's Slurm users)."""
    UnixLogin.objects.create(user=alice, username="nobody")
    UnixLogin.objects.create(user=bob, username="daemon")
    return alice, bob


# The queues' QOS in ``local_slurm`` and the limits the policy pass may set on them.
QUEUE_QOS = ("normal", "high", "debug")
QOS_LIMITS_CLEARED = (
    "MaxJobsPerUser=-1",
    "MaxTRESPerUser=gres/gpu=-1",
    "MaxTRESPerJob=gres/gpu=-1",
    "MaxWall=-1",
)


@pytest.fixture
def admin(local_slurm: LocalSlurm) -> Iterator[SlurmAdmin]:
    """The portal's admin commands; afterwards, what the portal made in the shared Slurm goes
    (its accounts, reservations, the top QOS, and the limits it set on the queues' QOS)."""
    admin = SlurmAdmin(cluster="labportal")
    yield admin
    for reservation in admin.reservations():
        if reservation.name.startswith("lp-booking-"):
            admin.scontrol("delete", f"ReservationName={reservation.name}")
    for account in admin.accounts():
        if account.organization == "labportal":
            local_slurm.sacctmgr("delete", "user", "where", f"account={account.name}", check=False)
            local_slurm.sacctmgr("delete", "account", "where", f"name={account.name}", check=False)
    local_slurm.sacctmgr("delete", "qos", "where", "name=lp-emergency", check=False)
    local_slurm.sacctmgr(
        "modify", "qos", "where", f"name={','.join(QUEUE_QOS)}", "set", *QOS_LIMITS_CLEARED
    )
