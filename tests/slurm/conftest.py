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
