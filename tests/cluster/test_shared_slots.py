"""Shared slots: the admin's `shared_slots` creates and removes slot rows, never while in use;
the scheduler places debug jobs on them, two on one GPU, and a third waits."""

from __future__ import annotations

from typing import Any

import pytest

from cluster.errors import SlotsRefused
from cluster.models import Gpu
from cluster.services import gpu_set_shared_slots
from jobqueue.models import Allocation, Job
from scheduling.passes import scheduling_pass
from tests.conftest import PASSWORD
from tests.jobqueue.test_submit import submit

pytestmark = pytest.mark.django_db


def slots_of(gpu: Gpu) -> list[Gpu]:
    return list(Gpu.objects.filter(parent=gpu, kind=Gpu.Kind.SLOT).order_by("uuid"))


def test_setting_shared_slots_creates_slot_rows_that_share_the_gpus_memory(cluster: Any) -> None:
    gpu = Gpu.objects.get(uuid="GPU-gpu01-0")
    gpu_set_shared_slots(gpu_id=gpu.pk, slots=2)
    made = slots_of(gpu)
    assert [s.uuid for s in made] == ["GPU-gpu01-0::slot0", "GPU-gpu01-0::slot1"]
    assert {(s.node_id, s.index, s.memory_mb, s.state) for s in made} == {
        (gpu.node_id, 0, gpu.memory_mb // 2, Gpu.State.AVAILABLE)
    }
    gpu_set_shared_slots(gpu_id=gpu.pk, slots=2)  # the same setting again changes nothing
    assert [s.pk for s in slots_of(gpu)] == [s.pk for s in made]
    gpu_set_shared_slots(gpu_id=gpu.pk, slots=4)
    assert len(slots_of(gpu)) == 4 and slots_of(gpu)[0].pk == made[0].pk
    assert {s.memory_mb for s in slots_of(gpu)} == {gpu.memory_mb // 4}
    gpu_set_shared_slots(gpu_id=gpu.pk, slots=0)
    assert slots_of(gpu) == []


def test_bad_slot_counts_and_mig_instances_are_refused_with_a_reason(cluster: Any) -> None:
    gpu = Gpu.objects.get(uuid="GPU-gpu01-0")
    with pytest.raises(SlotsRefused, match="0 \\(whole GPU\\) or 2 to 16"):
        gpu_set_shared_slots(gpu_id=gpu.pk, slots=1)
    with pytest.raises(SlotsRefused):
        gpu_set_shared_slots(gpu_id=gpu.pk, slots=17)
    mig = Gpu.objects.create(
        node=gpu.node,
        index=0,
        uuid="MIG-x",
        model="1g.10gb",
        memory_mb=10_000,
        kind=Gpu.Kind.MIG,
        parent=gpu,
    )
    with pytest.raises(SlotsRefused, match="MIG"):
        gpu_set_shared_slots(gpu_id=mig.pk, slots=2)


def test_two_debug_jobs_share_one_gpu_a_third_waits_and_slots_in_use_cannot_be_removed(
    alice: Any,
    bob: Any,
    cluster: Any,
    image: Any,
    django_capture_on_commit_callbacks: Any,
    sent_tasks: Any,
) -> None:
    gpu = Gpu.objects.get(uuid="GPU-gpu01-0")
    gpu_set_shared_slots(gpu_id=gpu.pk, slots=2)
    first = submit(alice, queue="debug", shared_slot=True, time_limit_s=600)
    second = submit(bob, queue="debug", shared_slot=True, time_limit_s=600)
    third = submit(alice, queue="debug", shared_slot=True, time_limit_s=600)
    with django_capture_on_commit_callbacks(execute=True):
        scheduling_pass()

    on_slots = Allocation.objects.filter(active=True, gpu__parent=gpu)
    assert sorted(on_slots.values_list("job_id", flat=True)) == sorted([first.pk, second.pk])
    assert Job.objects.get(pk=third.pk).state == Job.State.PENDING
    specs = {spec["job_id"]: spec for _name, [spec], _q in sent_tasks.named("agent.start_job")}
    assert {u for s in specs.values() for u in s["gpu_uuids"]} == {
        "GPU-gpu01-0::slot0",
        "GPU-gpu01-0::slot1",
    }
    assert {tuple(s["gpu_indices"]) for s in specs.values()} == {(0,)}

    with pytest.raises(SlotsRefused, match="in use by job"):
        gpu_set_shared_slots(gpu_id=gpu.pk, slots=0)
    with pytest.raises(SlotsRefused, match="in use by job"):
        gpu_set_shared_slots(gpu_id=gpu.pk, slots=3)
    assert len(slots_of(gpu)) == 2


def test_a_removed_slot_with_history_is_kept_missing_and_stays_so_after_a_registration(
    alice: Any, cluster: Any, image: Any
) -> None:
    gpu = Gpu.objects.get(uuid="GPU-gpu01-0")
    gpu_set_shared_slots(gpu_id=gpu.pk, slots=2)
    job = submit(alice, queue="debug", shared_slot=True, time_limit_s=600)
    slot = slots_of(gpu)[1]
    Allocation.objects.create(job=job, gpu=slot, active=False)
    gpu_set_shared_slots(gpu_id=gpu.pk, slots=0)
    slot.refresh_from_db()
    assert slot.state == Gpu.State.MISSING  # its job's history still points at it
    assert not Gpu.objects.filter(uuid="GPU-gpu01-0::slot0").exists()

    from cluster.services import _gpus_mark_missing

    _gpus_mark_missing(node=gpu.node, present_ids={gpu.pk})
    slot.refresh_from_db()
    assert slot.state == Gpu.State.MISSING


def test_the_admin_sets_shared_slots_and_is_told_why_when_it_is_refused(
    client: Any, admin_user: Any, alice: Any, cluster: Any, image: Any
) -> None:
    gpu = Gpu.objects.get(uuid="GPU-gpu01-0")
    client.force_login(admin_user)
    form = {
        "index": 0,
        "model": gpu.model,
        "memory_mb": gpu.memory_mb,
        "state": "available",
        "shared_slots": 2,
    }
    response = client.post(f"/admin/cluster/gpu/{gpu.pk}/change/", form)
    assert response.status_code == 302
    assert len(slots_of(gpu)) == 2

    job = submit(alice, queue="debug", shared_slot=True, time_limit_s=600)
    Allocation.objects.create(job=job, gpu=slots_of(gpu)[0])
    refused = client.post(f"/admin/cluster/gpu/{gpu.pk}/change/", {**form, "shared_slots": 0})
    assert refused.status_code == 200
    assert f"in use by job(s) #{job.pk}" in refused.content.decode()
    assert len(slots_of(gpu)) == 2 and Gpu.objects.get(pk=gpu.pk).shared_slots == 2


def test_members_cannot_change_shared_slots(client: Any, alice: Any, cluster: Any) -> None:
    gpu = Gpu.objects.get(uuid="GPU-gpu01-0")
    client.login(username="alice", password=PASSWORD)
    response = client.post(f"/admin/cluster/gpu/{gpu.pk}/change/", {"shared_slots": 2})
    assert response.status_code == 302 and "/admin/login/" in response["Location"]
    assert slots_of(gpu) == []
