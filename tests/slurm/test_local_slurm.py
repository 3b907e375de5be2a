"""The private Slurm itself: what every Slurm-mode test stands on."""

from __future__ import annotations

import pytest

from benchmarks.local_slurm import LocalSlurm
from slurm.cli import RestClient

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


def test_the_array_submit_anchor_counts_every_task_of_each_held_array(
    local_slurm: LocalSlurm, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`make bench` compares the portal's batch submit with this rate: it must count the
    tasks Slurm really queued, and leave none behind."""
    real_run = local_slurm._run
    queued: list[str] = []

    def run(*argv: str, check: bool = True) -> str:
        if argv[0] == "scancel":  # what Slurm holds just before the bench cancels it
            queued.extend(real_run("squeue", "-h", "-r", "-o", "%i").split())
        return real_run(*argv, check=check)

    monkeypatch.setattr(local_slurm, "_run", run)
    rate = local_slurm.array_submit_rate(2, 5)
    assert rate > 0
    assert len(queued) == 10 and len({q.partition("_")[0] for q in queued}) == 2
    assert real_run("squeue", "-h", "-o", "%i").strip() == ""
