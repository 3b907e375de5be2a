"""The GPU model a member picks reaches Slurm as a typed GRES (``--gres=gpu:<type>:N``), against
the private Slurm's node of 2 × a100 and 2 × l40s; a model Slurm has no GPU of is refused."""

from __future__ import annotations

import re
from typing import Any

import pytest

from benchmarks.local_slurm import LocalSlurm
from cluster.models import Gpu, Node
from jobqueue.models import Job
from slurm.cli import gpu_types
from slurm.models import SlurmJob
from slurm.services import SlurmRefused, slurm_gpu_type
from tests.slurm.test_slurm_mode import body, slurm_lab, submit, synced_until

pytestmark = [pytest.mark.slurm, pytest.mark.django_db(transaction=True)]

__all__ = ["slurm_lab"]  # the fixture, used by name below


def _requested(local_slurm: LocalSlurm, response: Any) -> tuple[SlurmJob, str]:
    """The portal job's Slurm record and the GRES Slurm holds for it (squeue's ``%b``)."""
    assert response.status_code == 201, response.content
    record = SlurmJob.objects.get(job_id=body(response)["id"])
    tres = local_slurm._run("squeue", "-h", "-j", str(record.slurm_job_id), "-o", "%b").strip()
    return record, tres


def _allocated(local_slurm: LocalSlurm, slurm_job_id: int) -> tuple[str, list[int]]:
    """The GRES Slurm gave a running job: its type and device indices (scontrol show job -d)."""
    text = local_slurm._run("scontrol", "show", "job", "-d", str(slurm_job_id))
    match = re.search(r"GRES=gpu:(\w+):\d+\(IDX:([\d,-]+)\)", text)
    assert match, text
    indices: list[int] = []
    for part in match.group(2).split(","):
        low, _sep, high = part.partition("-")
        indices += list(range(int(low), int(high or low) + 1))
    return match.group(1), indices


def test_the_inventory_gives_each_gpu_its_gres_type(
    slurm_lab: Any, local_slurm: LocalSlurm
) -> None:
    node = Node.objects.get(name=local_slurm.node)
    models = list(node.gpus.order_by("index").values_list("model", flat=True))
    assert models == ["a100", "a100", "l40s", "l40s"]


@pytest.mark.parametrize(("model", "indices"), [("a100", {0, 1}), ("L40S", {2, 3})])
def test_a_job_asking_a_model_runs_on_that_gres_type(
    slurm_lab: Any, alice: Any, local_slurm: LocalSlurm, model: str, indices: set[int]
) -> None:
    record, tres = _requested(local_slurm, submit(alice, "sleep 120", gpus=2, gpu_model=model))
    assert tres.endswith(f"gpu:{model.lower()}:2"), tres  # what the portal asked Slurm for
    job = record.job
    assert job is not None
    synced_until(lambda: Job.objects.get(pk=job.pk).state == Job.State.RUNNING, "it runs")
    kind, devices = _allocated(local_slurm, record.slurm_job_id)
    assert kind == model.lower() and set(devices) == indices


def test_a_job_asking_any_model_still_gets_a_gpu(
    slurm_lab: Any, alice: Any, local_slurm: LocalSlurm
) -> None:
    _record, tres = _requested(local_slurm, submit(alice, "sleep 120", gpus=1))
    assert tres.endswith("gpu:1") and "a100" not in tres and "l40s" not in tres, tres


def test_a_model_slurm_has_no_gpu_of_is_refused_with_the_types_it_has(
    slurm_lab: Any, alice: Any, local_slurm: LocalSlurm
) -> None:
    # The portal knows an h100 (a node outside Slurm, an agent's report), Slurm does not.
    other = Node.objects.create(name="outside-slurm", state=Node.State.UP)
    Gpu.objects.create(node=other, index=0, uuid="GPU-h100-0", model="h100", memory_mb=81920)
    before = local_slurm._run("squeue", "-h", "-o", "%i").split()

    response = submit(alice, "true", gpu_model="h100")

    assert response.status_code == 400, response.content
    text = response.content.decode()
    assert "no GPU of model “h100”" in text and "a100, l40s" in text
    assert not Job.objects.filter(gpu_model="h100").exists()  # rolled back
    assert local_slurm._run("squeue", "-h", "-o", "%i").split() == before  # nothing queued


def test_the_admins_mapping_turns_a_portal_model_name_into_its_gres_type(settings: Any) -> None:
    settings.LABPORTAL_SLURM_GPU_TYPES = {"nvidia a100-sxm4-80gb": "a100"}
    types = {kind for kind, _count in gpu_types("gpu:a100:2(S:0),gpu:l40s:2(S:0)")}
    assert types == {"a100", "l40s"}
    assert slurm_gpu_type("NVIDIA A100-SXM4-80GB", types) == "a100"
    assert slurm_gpu_type("L40s", types) == "l40s"
    assert slurm_gpu_type("", types) == ""
    with pytest.raises(SlurmRefused, match="no GPU of model “NVIDIA L4”"):
        slurm_gpu_type("NVIDIA L4", types)
