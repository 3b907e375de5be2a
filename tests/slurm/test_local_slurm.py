"""The private Slurm itself: what every Slurm-mode test stands on."""

from __future__ import annotations

import pytest

from slurm.cli import RestClient
from slurm.local import LocalSlurm

pytestmark = pytest.mark.slurm


def test_it_runs_a_job_with_a_gpu_and_records_it_in_accounting(local_slurm: LocalSlurm) -> None:
    out = local_slurm.output_dir / "smoke-%j.out"
    job_id = local_slurm.run_as(
        "nobody",
        "sbatch",
        "--parsable",
        "--wait",
        f"-o{out}",
        "--gres=gpu:1",
        "--wrap=echo gpus=$CUDA_VISIBLE_DEVICES",
    ).strip()
    text = (local_slurm.output_dir / f"smoke-{job_id}.out").read_text()
    assert text.startswith("gpus=")
    client = RestClient(
        url=local_slurm.rest_url, key=local_slurm.jwt_key.read_bytes(), service_user="root"
    )
    (node,) = client.nodes()
    assert node.gpus == local_slurm.gpus
    assert local_slurm.sacctmgr("show", "qos", "-n", "-P", "format=name").split() == [
        "normal",
        "high",
        "debug",
    ]
