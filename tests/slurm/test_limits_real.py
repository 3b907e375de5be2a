"""The rules page's limits in a real Slurm (``local_slurm``): a category's GPUs at once as the
member's association GrpTRES, a queue's limits as its QOS's, and a priority grant pushed to
Slurm as soon as it is decided."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from approvals.services import grant_decide, grant_withdraw
from benchmarks.local_slurm import LocalSlurm
from jobqueue.models import Job, PriorityGrant, Queue
from jobqueue.submit import job_submit
from slurm.admin_commands import SlurmAdmin
from slurm.models import QueueMapping
from slurm.policy import slurm_policy_sync
from slurm.rules_tasks import slurm_grants_sync_task
from slurm.services import slurm_inventory_sync, slurm_jobs_sync
from tests.factories import ContainerImageFactory
from tests.slurm.test_rules_real import _can_submit_high, wait_for

pytestmark = [pytest.mark.slurm, pytest.mark.django_db]


def _submit(owner: Any, queue: str, gpus: int) -> Job:
    return job_submit(
        owner=owner,
        queue=queue,
        image=ContainerImageFactory.create().reference,
        command="sleep 120",
        gpus=gpus,
        time_limit_s=600,
        cpus=1,
        memory_mb=64,
    )


def _squeue(local_slurm: LocalSlurm, jobs: list[Job]) -> dict[int, tuple[str, str, str]]:
    """Slurm job id → (state, reason, account), as ``squeue -o '%i|%T|%r|%a'`` prints them."""
    ids = ",".join(str(job.slurm.slurm_job_id) for job in jobs)
    out = local_slurm._run("squeue", "-h", "-j", ids, "-o", "%i|%T|%r|%a")
    rows = [line.split("|") for line in out.splitlines() if line.strip()]
    return {int(r[0]): (r[1], r[2], r[3]) for r in rows}


def _states(local_slurm: LocalSlurm, jobs: list[Job]) -> list[tuple[str, str, str]] | None:
    """The jobs' (state, reason, account) once Slurm has placed each (none is still unseen)."""
    rows = _squeue(local_slurm, jobs)
    states = sorted(rows.values())
    if len(states) != len(jobs) or any(s == "PENDING" and r == "None" for s, r, _a in states):
        return None
    return states


def _scancel(local_slurm: LocalSlurm, jobs: list[Job]) -> None:
    for job in jobs:
        local_slurm._run("scancel", str(job.slurm.slurm_job_id), check=False)


def test_a_member_whose_category_allows_2_gpus_runs_one_2_gpu_job_and_the_other_waits(
    local_slurm: LocalSlurm, members: tuple[Any, Any], admin: SlurmAdmin, master_category: Any
) -> None:
    alice, _bob = members
    master_category.max_concurrent_gpus = 2
    master_category.save()
    alice.category = master_category
    alice.save()
    slurm_inventory_sync()

    result = slurm_policy_sync(admin=admin)

    assert not [e for e in result.errors if "master" in e.lower()], result.errors
    # Read back from Slurm: the limit sits on alice's association in her category's account.
    limit = local_slurm.sacctmgr(
        "-Pn", "show", "assoc", "where", "user=nobody", "account=lp-master", "format=GrpTRES"
    )
    assert limit.strip() == "gres/gpu=2"
    jobs = [_submit(alice, "normal", 2), _submit(alice, "normal", 2)]
    try:
        states = wait_for("both jobs placed", lambda: _states(local_slurm, jobs))
        # The node has 4 free GPUs: only the category's limit keeps the second one waiting.
        assert states == [
            ("PENDING", "AssocGrpGRES", "lp-master"),
            ("RUNNING", "None", "lp-master"),
        ]
        slurm_jobs_sync()
        portal = Job.objects.filter(pk__in=[j.pk for j in jobs]).order_by("state")
        assert [(j.state, j.pending_reason) for j in portal] == [
            (Job.State.PENDING, "user_limit"),
            (Job.State.RUNNING, ""),
        ]
    finally:
        _scancel(local_slurm, jobs)

    # The portal's admin raises the limit: the next pass pushes it.
    master_category.max_concurrent_gpus = 4
    master_category.save()
    assert slurm_policy_sync(admin=admin).limits_pushed == 1
    limit = local_slurm.sacctmgr(
        "-Pn", "show", "assoc", "where", "user=nobody", "account=lp-master", "format=GrpTRES"
    )
    assert limit.strip() == "gres/gpu=4"


def _qos_limits(local_slurm: LocalSlurm, qos: str) -> str:
    return local_slurm.sacctmgr(
        "-Pn", "show", "qos", "where", f"name={qos}", "format=MaxJobsPU,MaxTRESPU,MaxTRES,MaxWall"
    ).strip()


def test_the_debug_queues_running_jobs_limit_is_its_qos_limit_in_slurm(
    local_slurm: LocalSlurm, members: tuple[Any, Any], admin: SlurmAdmin
) -> None:
    alice, _bob = members
    debug = Queue.objects.get(name="debug")
    assert debug.max_running_jobs_per_user == 2
    QueueMapping.objects.update_or_create(queue=debug, defaults={"qos": "debug"})
    slurm_inventory_sync()

    slurm_policy_sync(admin=admin)

    # MaxJobsPerUser 2, no per-user GPU limit, 1 GPU per job, a 1-hour time limit.
    assert _qos_limits(local_slurm, "debug") == "2||gres/gpu=1|01:00:00"
    jobs = [_submit(alice, "debug", 1) for _ in range(3)]
    try:
        states = wait_for("the three jobs placed", lambda: _states(local_slurm, jobs))
        account = states[0][2]
        assert account == "lp-phd-thesis-phase"  # alice's category's account, with debug
        assert states == [
            ("PENDING", "QOSMaxJobsPerUserLimit", account),
            ("RUNNING", "None", account),
            ("RUNNING", "None", account),
        ]
    finally:
        _scancel(local_slurm, jobs)

    # The Slurm admin raises it by hand: the queue takes Slurm's value.
    local_slurm.sacctmgr("modify", "qos", "where", "name=debug", "set", "MaxJobsPerUser=3")
    assert slurm_policy_sync(admin=admin).limits_pulled == 1
    debug.refresh_from_db()
    assert debug.max_running_jobs_per_user == 3


def test_an_approved_grant_reaches_slurm_at_once_and_so_does_its_withdrawal(
    local_slurm: LocalSlurm,
    members: tuple[Any, Any],
    admin: SlurmAdmin,
    admin_user: Any,
    sent_tasks: Any,
    django_capture_on_commit_callbacks: Any,
) -> None:
    alice, _bob = members
    high = Queue.objects.get(name="high")
    QueueMapping.objects.update_or_create(queue=high, defaults={"qos": "high"})
    slurm_inventory_sync()
    slurm_policy_sync(admin=admin)  # the minutely pass: alice's account, no grant yet
    assert not _can_submit_high(local_slurm)
    grant = PriorityGrant.objects.create(
        user=alice,
        queue=high,
        reason="camera-ready",
        deadline=timezone.now() + timedelta(days=2),
    )

    def worker() -> None:
        """What a worker does with the task the commit sent: run it, now."""
        assert "control.slurm_grants_sync" in [name for name, _a, _q in sent_tasks]
        sent_tasks.clear()
        slurm_grants_sync_task()

    with django_capture_on_commit_callbacks(execute=True):
        grant_decide(grant_id=grant.pk, decided_by=admin_user, approve=True)
    worker()
    # No policy pass ran: the member submits to the high queue at once.
    job = _submit(alice, "high", 1)
    try:
        assert job.slurm.qos == "high"
    finally:
        _scancel(local_slurm, [job])

    with django_capture_on_commit_callbacks(execute=True):
        grant_withdraw(grant_id=grant.pk, user=alice)
    worker()
    assert not _can_submit_high(local_slurm)
