"""In Slurm mode the portal's views of GPU use agree with Slurm: a GPU Slurm has given a job
(a portal job or a plain sbatch job) is in use on the GPUs page and counted on the dashboard,
by Slurm's own GPU index, and free again when the job ends."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client

from benchmarks.local_slurm import LocalSlurm
from cluster.models import Gpu
from jobqueue.models import Job
from slurm.cli import gres_indices
from slurm.models import SlurmJob
from tests.slurm.test_slurm_mode import body, slurm_lab, submit, synced_until

pytestmark = [pytest.mark.slurm, pytest.mark.django_db(transaction=True)]

__all__ = ["slurm_lab"]


def test_gres_detail_gives_the_gpu_indices() -> None:
    assert gres_indices(["gpu:l40s:1(IDX:2)"]) == (2,)
    assert gres_indices(["gpu:a100:2(IDX:0-1)", "gpu:l40s:1(IDX:3)"]) == (0, 1, 3)
    assert gres_indices(["gpu:3(IDX:0,2-3)"]) == (0, 2, 3)
    assert gres_indices(["gpu(CNT:0)", ""]) == ()
    assert gres_indices(None) == ()


def test_gpus_slurm_allocated_are_in_use_on_the_gpus_page_and_the_dashboard(
    slurm_lab: Any, alice: Any, bob: Any, local_slurm: LocalSlurm
) -> None:
    # A plain sbatch job of alice's unix user on an l40s, and a portal job on an a100.
    plain = int(
        local_slurm.run_as(
            "nobody", "sbatch", "--parsable", "--gres=gpu:l40s:1", "-o/dev/null", "--wrap=sleep 120"
        ).strip()
    )
    response = submit(alice, "sleep 120", gpu_model="a100")
    assert response.status_code == 201, response.content
    job = Job.objects.get(pk=body(response)["id"])
    portal = SlurmJob.objects.get(job=job).slurm_job_id

    def held() -> dict[int, str]:
        return dict(
            Gpu.objects.exclude(held_by="").values_list("index", "held_by").order_by("index")
        )

    synced_until(lambda: len(held()) == 2, "both jobs running and their GPUs held")
    held_now = held()
    assert f"Slurm {plain}" in held_now[2] and "#" not in held_now[2]
    assert held_now[0] == f"#{job.pk} · Slurm {portal} · nobody"
    assert set(Gpu.objects.exclude(held_by="").values_list("held_by_user", flat=True)) == {alice.pk}

    web = Client()
    web.force_login(bob)
    page = web.get("/gpus/").content.decode()
    assert page.count('data-testid="gpu-in-use"') == 2
    assert page.count('data-testid="gpu-held-by"') == 2
    assert f"Slurm {plain}" in page and alice.display_name in page
    home = web.get("/").content.decode()
    assert "2 / 4" in home

    local_slurm._run("scancel", str(plain), str(portal))
    synced_until(lambda: not held(), "the GPUs freed when the jobs end")
    assert 'data-testid="gpu-in-use"' not in web.get("/gpus/").content.decode()
