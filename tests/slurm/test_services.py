"""Slurm mode's services with a scripted Slurm: state mapping, idempotent sync, inventory, scripts."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from cluster.models import Gpu, Node
from core.errors import DomainError
from jobqueue.models import Job
from jobqueue.services import job_cancel, job_hold
from slurm.cli import JobInfo, NodeInfo, PartitionInfo, SlurmError, SubmitRequest
from slurm.models import Partition, QueueMapping, SlurmJob, UnixLogin
from slurm.services import (
    UnixLoginMissing,
    batch_script,
    portal_reason,
    portal_state,
    slurm_inventory_sync,
    slurm_jobs_sync,
)
from tests.jobqueue.test_submit import submit

pytestmark = pytest.mark.django_db

T0 = datetime(2026, 12, 1, 8, 0, tzinfo=UTC)


class ScriptedSlurm:
    """A Slurm whose answers the test sets; it records what the portal asked of it."""

    def __init__(self) -> None:
        self.live: list[JobInfo] = []
        self.accounting: list[JobInfo] = []
        self.node_list: list[NodeInfo] = []
        self.partition_list: list[PartitionInfo] = []
        self.submitted: list[SubmitRequest] = []
        self.cancelled: list[tuple[int, str]] = []
        self.refuse: str = ""

    def submit(self, request: SubmitRequest) -> int:
        if self.refuse:
            raise SlurmError(self.refuse)
        self.submitted.append(request)
        return 1000 + len(self.submitted)

    def cancel(self, job_id: int, *, unix_user: str) -> None:
        self.cancelled.append((job_id, unix_user))

    def jobs(self) -> list[JobInfo]:
        return list(self.live)

    def accounting_jobs(self, *, since: datetime) -> list[JobInfo]:
        return list(self.accounting)

    def nodes(self) -> list[NodeInfo]:
        return list(self.node_list)

    def partitions(self) -> list[PartitionInfo]:
        return list(self.partition_list)


@pytest.fixture
def scripted(settings: Any, monkeypatch: pytest.MonkeyPatch, cluster: Any, alice: Any) -> Any:
    settings.LABPORTAL_EXECUTOR = "slurm"
    fake = ScriptedSlurm()
    monkeypatch.setattr("slurm.services.client_from_settings", lambda: fake)
    UnixLogin.objects.create(user=alice, username="alice_u")
    return fake


def test_slurm_states_map_onto_portal_states() -> None:
    cases = {
        "PENDING": "pending",
        "CONFIGURING": "running",
        "RUNNING": "running",
        "COMPLETING": "running",
        "COMPLETED": "completed",
        "FAILED": "failed",
        "OUT_OF_MEMORY": "failed",
        "CANCELLED": "cancelled",
        "TIMEOUT": "timed_out",
        "NODE_FAIL": "lost",
        "BOOT_FAIL": "lost",
    }
    assert {s: portal_state(JobInfo(job_id=1, state=s)) for s in cases} == cases
    # The states the accounting refunds as system failures are the ones the sync calls lost.
    from slurm.accounting import SYSTEM_FAILURES

    assert {portal_state(JobInfo(job_id=1, state=s)) for s in SYSTEM_FAILURES} == {"lost"}
    assert portal_reason("Resources") == "resources"
    assert portal_reason("QOSMaxGRESPerUser") == "user_limit"
    assert portal_reason("Dependency") == "Dependency"


def test_the_batch_script_runs_the_image_through_the_configured_plugin(
    alice: Any, cluster: Any, image: Any
) -> None:
    job = submit(alice, command=["python", "train.py", "--lr", "0.1 0.2"])
    plain = batch_script(job, container="none")
    assert plain.startswith("#!/bin/bash\n") and "python train.py --lr '0.1 0.2'" in plain
    pyxis = batch_script(job, container="pyxis")
    assert f"srun --container-image={job.image.reference} python train.py" in pyxis
    apptainer = batch_script(job, container="apptainer")
    assert f"apptainer exec --nv docker://{job.image.reference} python train.py" in apptainer


def test_submit_goes_to_slurm_as_the_members_unix_user_with_the_queue_mapping(
    scripted: ScriptedSlurm, alice: Any, image: Any
) -> None:
    QueueMapping.objects.filter(queue__name="normal").update(partition="gpu", qos="lab-normal")
    job = submit(alice, gpus=2)
    (request,) = scripted.submitted
    assert (request.unix_user, request.gpus, request.partition, request.qos) == (
        "alice_u",
        2,
        "gpu",
        "lab-normal",
    )
    assert request.environment["LABPORTAL_JOB_ID"] == str(job.pk)
    record = SlurmJob.objects.get(job=job)
    assert record.slurm_job_id == 1001 and record.unix_user == "alice_u"
    assert job.events.filter(kind="dispatched").exists()


def test_a_member_without_a_unix_login_is_refused_before_anything_reaches_slurm(
    scripted: ScriptedSlurm, bob: Any, image: Any
) -> None:
    with pytest.raises(UnixLoginMissing, match="admin"):
        submit(bob)
    assert scripted.submitted == []


def _info(job_id: int, state: str, **extra: Any) -> JobInfo:
    return JobInfo(job_id=job_id, user="alice_u", state=state, submitted_at=T0, **extra)


def test_the_sync_walks_a_job_through_pending_running_completed_once(
    scripted: ScriptedSlurm, alice: Any, image: Any
) -> None:
    from accounts.models import CreditAccount

    CreditAccount.objects.update_or_create(user=alice, defaults={"balance": 100})
    job = submit(alice)
    scripted.live = [
        _info(1001, "PENDING", reason="Priority", estimated_start=T0 + timedelta(hours=1))
    ]
    slurm_jobs_sync()
    job.refresh_from_db()
    assert (job.state, job.pending_reason) == ("pending", "priority")
    assert job.estimated_start == T0 + timedelta(hours=1)
    running = _info(1001, "RUNNING", nodes="gpu01", started_at=T0 + timedelta(hours=1))
    scripted.live = [running]
    slurm_jobs_sync()
    job.refresh_from_db()
    assert job.state == "running" and job.node is not None and job.node.name == "gpu01"
    assert job.estimated_start is None
    scripted.live = [
        replace(running, state="COMPLETED", ended_at=T0 + timedelta(hours=2), exit_code=0)
    ]
    assert slurm_jobs_sync().changed == 2  # Slurm's record and the portal job
    assert slurm_jobs_sync().changed == 0
    job.refresh_from_db()
    assert (job.state, job.exit_code, job.ended_at) == ("completed", 0, T0 + timedelta(hours=2))
    kinds = list(job.events.values_list("kind", flat=True))
    assert kinds.count("started") == 1 and kinds.count("ended") == 1


def test_a_job_slurm_forgot_is_settled_from_accounting(
    scripted: ScriptedSlurm, alice: Any, image: Any
) -> None:
    job = submit(alice)
    scripted.accounting = [
        _info(
            1001,
            "TIMEOUT",
            nodes="gpu01",
            started_at=T0,
            ended_at=T0 + timedelta(hours=1),
            exit_code=0,  # sacct's "0:15": ended by Slurm's signal
        ),
        _info(555, "COMPLETED"),  # not ours, not wanted
    ]
    result = slurm_jobs_sync()
    job.refresh_from_db()
    assert job.state == "timed_out" and result.from_accounting == 1
    assert job.exit_code is None  # not a success: "exit code 0" was shown
    assert not SlurmJob.objects.filter(slurm_job_id=555).exists()


def test_a_node_failure_loses_the_job(scripted: ScriptedSlurm, alice: Any, image: Any) -> None:
    job = submit(alice)
    scripted.live = [_info(1001, "NODE_FAIL", nodes="gpu01", started_at=T0, ended_at=T0)]
    slurm_jobs_sync()
    job.refresh_from_db()
    assert job.state == Job.State.LOST


def test_cancel_asks_slurm_as_the_owner_and_the_sync_records_the_end(
    scripted: ScriptedSlurm, alice: Any, image: Any
) -> None:
    job = submit(alice)
    job_cancel(job_id=job.pk, actor=alice)
    assert scripted.cancelled == [(1001, "alice_u")]
    job.refresh_from_db()
    assert job.state == "pending" and job.stop_requested_at is not None
    scripted.live = [_info(1001, "CANCELLED", ended_at=T0)]
    slurm_jobs_sync()
    job.refresh_from_db()
    assert job.state == "cancelled"


def test_holding_in_the_portal_is_refused_in_slurm_mode(
    scripted: ScriptedSlurm, alice: Any, admin_user: Any, image: Any
) -> None:
    job = submit(alice)
    with pytest.raises(DomainError, match="scontrol hold"):
        job_hold(job_id=job.pk, actor=admin_user, reason="maintenance")


def test_a_slurm_refusal_rolls_the_submission_back(
    scripted: ScriptedSlurm, alice: Any, image: Any
) -> None:
    scripted.refuse = "Invalid qos specification"
    with pytest.raises(DomainError, match="Invalid qos"):
        submit(alice)
    assert not Job.objects.filter(owner=alice).exists()


def test_inventory_maps_node_states_and_gpu_counts(scripted: ScriptedSlurm) -> None:
    scripted.node_list = [
        NodeInfo(name="s1", state="idle", gpus=2, gpu_type="a100", partitions=("gpu",)),
        NodeInfo(name="s2", state="mixed", flags=("DRAIN",), gpus=1, partitions=("gpu",)),
        NodeInfo(name="s3", state="down", flags=("NOT_RESPONDING",), gpus=1),
    ]
    scripted.partition_list = [PartitionInfo(name="gpu", is_default=True, max_time_s=3600)]
    slurm_inventory_sync()
    states = dict(Node.objects.filter(name__startswith="s").values_list("name", "state"))
    assert states == {"s1": "up", "s2": "draining", "s3": "down"}
    assert list(Gpu.objects.filter(node__name="s1").values_list("model", flat=True)) == [
        "a100",
        "a100",
    ]
    assert set(Partition.objects.get(name="gpu").nodes.values_list("name", flat=True)) == {
        "s1",
        "s2",
    }
    scripted.node_list = [replace(scripted.node_list[0], gpus=1)]
    slurm_inventory_sync()
    assert Gpu.objects.get(node__name="s1", index=1).state == Gpu.State.MISSING
    assert Node.objects.get(name="s2").state == Node.State.DOWN  # Slurm no longer lists it
    assert Gpu.objects.filter(node__name="s1").count() == 2  # nothing duplicated


def test_telemetry_attributes_a_slurm_jobs_gpu_process_to_its_portal_job(
    scripted: ScriptedSlurm, alice: Any, image: Any
) -> None:
    from django.utils import timezone

    from telemetry.services import sample_parse

    job = submit(alice)
    now = timezone.now()
    sample = {
        "gpu_uuid": "GPU-a",
        "ts": now.timestamp(),
        "processes": [
            {"pid": 5, "used_mb": 100, "slurm_job_id": 1001},
            {"pid": 6, "slurm_job_id": 9},
        ],
    }
    processes = sample_parse(sample, now=now).processes
    assert [(p["job_id"], p["slurm_job_id"]) for p in processes] == [(job.pk, 1001), (None, 9)]


def test_in_slurm_mode_node_silence_and_heartbeats_never_end_slurms_jobs(
    scripted: ScriptedSlurm, alice: Any, image: Any
) -> None:
    from cluster.services import node_heartbeat_record, nodes_check_liveness

    job = submit(alice)
    scripted.live = [_info(1001, "RUNNING", nodes="gpu01", started_at=T0)]
    slurm_jobs_sync()
    Node.objects.filter(name="gpu01").update(
        last_heartbeat=T0 - timedelta(days=1), registered_at=T0 - timedelta(days=2)
    )
    report = nodes_check_liveness()
    assert report.marked_down == [] and report.jobs_lost == {}
    node_heartbeat_record(node_name="gpu01", info={"running_job_ids": [], "starting_job_ids": []})
    job.refresh_from_db()
    assert job.state == Job.State.RUNNING


def test_the_job_page_shows_slurms_state_reason_and_unix_user(
    scripted: ScriptedSlurm, alice: Any, image: Any, client: Any
) -> None:
    job = submit(alice)
    scripted.live = [_info(1001, "PENDING", reason="Priority")]
    slurm_jobs_sync()
    client.force_login(alice)
    page = client.get(f"/jobs/{job.pk}/").content.decode()
    assert 'data-testid="slurm-state"' in page
    assert "1001" in page and "PENDING" in page and "Priority" in page and "alice_u" in page


def test_the_job_page_stops_a_slurm_job_when_slurm_does_at_its_time_limit(
    scripted: ScriptedSlurm, alice: Any, image: Any, settings: Any
) -> None:
    # Agents mode adds the lab's grace after the time limit; Slurm ends the job at it.
    from jobqueue.views import _hard_stop_at

    job = submit(alice)
    job.state, job.started_at, job.time_limit_s = Job.State.RUNNING, T0, 3600
    assert job.expected_end == T0 + timedelta(hours=1)
    assert _hard_stop_at(job) == job.expected_end
    settings.LABPORTAL_EXECUTOR = "agents"
    assert _hard_stop_at(job) == job.expected_end + timedelta(minutes=30)


def test_a_waiting_job_of_a_member_at_zero_credit_is_told_so_unless_its_qos_wins(
    scripted: ScriptedSlurm, alice: Any, image: Any
) -> None:
    from accounts.models import CreditAccount

    CreditAccount.objects.update_or_create(user=alice, defaults={"balance": 0})
    job = submit(alice)
    scripted.live = [_info(1001, "PENDING", reason="Priority")]
    slurm_jobs_sync()
    job.refresh_from_db()
    assert job.pending_reason == "no_credit"
    assert "credit is used up" in job.pending_reason_text
    # Under the emergency QOS the credit penalty is lifted (the policy pass un-nices it).
    scripted.live = [replace(scripted.live[0], qos="lp-emergency")]
    slurm_jobs_sync()
    job.refresh_from_db()
    assert job.pending_reason == "priority"


def test_slurms_reqnodenotavail_is_not_called_draining_or_down_only() -> None:
    assert portal_reason("ReqNodeNotAvail") == "nodes_reserved"
    assert "reserved" in str(Job.PENDING_REASONS["nodes_reserved"])
