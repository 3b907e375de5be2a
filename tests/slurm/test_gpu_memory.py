"""GPU memory in Slurm mode: GRES gives none, so it comes from the node's monitor-only agent
(merged into Slurm's rows by index) or from the admin per GRES type; while it is unknown a
minimum is left to Slurm instead of refusing the job."""

from __future__ import annotations

from typing import Any

import pytest

from cluster.models import Gpu, Node
from cluster.protocol import register_info_parse
from cluster.services import node_register
from jobqueue.errors import TooManyGpus
from jobqueue.submit_sql import largest_node_capacity
from slurm.cli import NodeInfo
from slurm.services import slurm_inventory_sync
from tests.jobqueue.test_submit import submit
from tests.slurm.test_services import ScriptedSlurm, scripted  # noqa: F401 (fixture)

pytestmark = pytest.mark.django_db

MIN_MB = 40_000


@pytest.fixture
def slurm_node(scripted: ScriptedSlurm) -> ScriptedSlurm:  # noqa: F811
    """Only Slurm's node s1 (2 × a100 GRES) takes work; the agents-mode nodes are down."""
    Node.objects.update(state=Node.State.DOWN)
    scripted.node_list = [NodeInfo(name="s1", state="idle", gpus=2, gpu_type="a100")]
    slurm_inventory_sync()
    return scripted


def _agent_reports(node: str, memory_mb: int) -> None:
    gpus = [
        {
            "uuid": f"GPU-{node}-{i}",
            "index": i,
            "model": "NVIDIA A100-SXM4-80GB",
            "memory_mb": memory_mb,
            "kind": "gpu",
            "parent_uuid": None,
        }
        for i in range(2)
    ]
    info = {"hostname": node, "gpu_backend": "nvml", "runtime": "none", "gpus": gpus}
    node_register(node_name=node, info=register_info_parse(info))


def test_unknown_memory_is_left_to_slurm_and_the_job_says_so(
    slurm_node: ScriptedSlurm, alice: Any, image: Any
) -> None:
    assert set(Gpu.objects.filter(node__name="s1").values_list("memory_mb", flat=True)) == {0}

    job = submit(alice, gpus=2, min_gpu_memory_mb=MIN_MB)

    assert len(slurm_node.submitted) == 1
    (event,) = job.events.filter(kind="gpu_memory_unchecked")
    assert f"minimum of {MIN_MB} MiB" in event.text and "Slurm places the job" in event.text
    assert event.kind_label == "placed by Slurm"


def test_a_monitor_only_agent_fills_in_slurms_gpus_by_index_without_duplicates(
    slurm_node: ScriptedSlurm, alice: Any, image: Any
) -> None:
    rows = dict(Gpu.objects.filter(node__name="s1").values_list("index", "pk"))

    _agent_reports("s1", 81920)
    slurm_inventory_sync()  # Slurm's next look keeps the agent's numbers
    _agent_reports("s1", 81920)  # and so does the agent's next start

    gpus = Gpu.objects.filter(node__name="s1").order_by("index")
    assert [(g.pk, g.uuid, g.model, g.memory_mb, g.state) for g in gpus] == [
        (rows[i], f"GPU-s1-{i}", "NVIDIA A100-SXM4-80GB", 81920, Gpu.State.AVAILABLE)
        for i in range(2)
    ]
    job = submit(alice, gpus=2, min_gpu_memory_mb=MIN_MB)
    assert not job.events.filter(kind="gpu_memory_unchecked").exists()
    with pytest.raises(TooManyGpus):  # now known to be too small: refused as in agents mode
        submit(alice, gpus=1, min_gpu_memory_mb=100_000)


def test_the_admin_may_give_the_memory_of_a_gres_type(
    slurm_node: ScriptedSlurm, settings: Any, alice: Any, image: Any
) -> None:
    settings.LABPORTAL_SLURM_GPU_MEMORY_MB = {"a100": 40960}
    slurm_inventory_sync()

    assert set(Gpu.objects.filter(node__name="s1").values_list("memory_mb", flat=True)) == {40960}
    job = submit(alice, gpus=2, min_gpu_memory_mb=MIN_MB)
    assert not job.events.filter(kind="gpu_memory_unchecked").exists()
    with pytest.raises(TooManyGpus):
        submit(alice, gpus=1, min_gpu_memory_mb=50_000)


def test_in_agents_mode_a_gpu_of_unknown_memory_still_does_not_count(
    slurm_node: ScriptedSlurm, settings: Any
) -> None:
    settings.LABPORTAL_EXECUTOR = "agents"
    kwargs: dict[str, Any] = {"shared_slot": False, "min_memory_mb": MIN_MB, "gpu_model": ""}
    assert largest_node_capacity(**kwargs) == 0
    assert largest_node_capacity(**kwargs, unknown_memory_fits=True) == 2
