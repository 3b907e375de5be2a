"""The lab's rules against a real Slurm (``local_slurm``): credits from accounting, the QOS of a
priority grant, a booking as a reservation, and a member at zero credit starting after others."""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import timedelta
from decimal import Decimal
from typing import Any, TypeVar

import pytest
from django.conf import settings
from django.utils import timezone

from accounts.models import LedgerEntry, Project
from accounts.services import ledger_post
from benchmarks.local_slurm import LocalSlurm
from cluster.models import Gpu
from jobqueue.models import EmergencyRequest, Job, PriorityGrant, Queue
from jobqueue.submit import job_submit
from reports.periods import period_of
from reports.selectors import usage_report
from reservations.models import Reservation
from slurm.accounting import accounting_sync
from slurm.admin_commands import PriorityFactors, SlurmAdmin
from slurm.cli import CommandsClient, JobInfo
from slurm.models import QueueMapping, SlurmJob
from slurm.policy import slurm_policy_sync
from slurm.reservations import slurm_reservations_sync
from slurm.services import slurm_inventory_sync, slurm_jobs_sync
from tests.factories import ContainerImageFactory, UserFactory

pytestmark = [pytest.mark.slurm, pytest.mark.django_db]

T = TypeVar("T")


def wait_for(what: str, probe: Callable[[], T | None], timeout_s: float = 90) -> T:
    """Poll a real Slurm until ``probe`` answers (Slurm acts on its own schedule)."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"Slurm did not get there in {timeout_s} s: {what}")
        time.sleep(0.5)


def _accounted(job_id: int) -> JobInfo | None:
    since = timezone.now() - timedelta(hours=1)
    for info in CommandsClient(slurm_conf=settings.LABPORTAL_SLURM_CONF).accounting_jobs(
        since=since
    ):
        if info.job_id == job_id and info.ended_at is not None:
            return info
    return None


def _charged(user: Any, **filters: Any) -> Decimal:
    entries = LedgerEntry.objects.filter(account__user=user, kind="charge", **filters)
    return -sum((e.amount for e in entries), Decimal("0"))


def test_credits_come_from_accounting_for_portal_and_plain_sbatch_jobs(
    local_slurm: LocalSlurm, members: tuple[Any, Any]
) -> None:
    alice, bob = members
    # The Slurm is the session's: what earlier tests ran as daemon (bob's unix user) stays in
    # its accounting. Read it only from this test's start, once nothing of theirs still runs.
    wait_for("earlier tests' jobs to end", lambda: not local_slurm._run("squeue", "-h").strip())
    time.sleep(1)  # sacct's -S has whole seconds: their ends fall before it, this test's
    since = timezone.now().replace(microsecond=0)  # submits after it
    time.sleep(1)
    # One credit per GPU-second, so the charge reads as GPUs × Slurm's elapsed seconds.
    Queue.objects.filter(name="normal").update(credit_rate=Decimal("3600"))
    slurm_inventory_sync()  # the core's inventory: Slurm's node and GPUs in the portal
    image = ContainerImageFactory()
    job = job_submit(
        owner=alice,
        queue="normal",
        image=image.reference,
        command="sleep 2",
        time_limit_s=300,
        cpus=1,
        memory_mb=64,
    )
    plain_id = int(
        local_slurm.run_as(
            "daemon", "sbatch", "--parsable", "--gres=gpu:2", "-o/dev/null", "--wrap=sleep 2"
        ).strip()
    )
    portal_id = job.slurm.slurm_job_id
    portal = wait_for("the portal job in accounting", lambda: _accounted(portal_id))
    plain = wait_for("the sbatch job in accounting", lambda: _accounted(plain_id))
    slurm_jobs_sync()  # the core's state sync: the portal job ends as Slurm ended it

    first = accounting_sync(since=since)

    assert first.settled >= 2
    assert portal.elapsed_s is not None and plain.elapsed_s is not None
    assert _charged(alice, job=job) == Decimal(portal.elapsed_s)
    assert _charged(bob) == Decimal(2 * plain.elapsed_s)  # plain sbatch, found by unix user
    job.refresh_from_db()
    assert job.efficiency.verdict == "unknown"  # judged by the portal's efficiency rule
    entries = LedgerEntry.objects.count()
    accounting_sync(since=since)  # a second pass changes nothing
    assert LedgerEntry.objects.count() == entries

    # The usage report agrees with sacct, the plain sbatch job's GPU time included.
    today = timezone.localdate()
    report = usage_report(
        period=period_of("custom", today - timedelta(days=1), today),
        viewer=UserFactory.create(username="dora", is_staff=True),
    )
    hours = {line.name: line.gpu_hours for line in report.tables["user"]}
    assert hours["alice"] == pytest.approx(portal.elapsed_s / 3600, abs=1.5 / 3600)
    assert hours["bob"] == pytest.approx(2 * plain.elapsed_s / 3600, abs=3 / 3600)
    assert report.totals.gpu_hours == pytest.approx(hours["alice"] + hours["bob"])


def _wckey_kept(local_slurm: LocalSlurm, unix: str, wckey: str) -> bool:
    """Whether slurmctld keeps ``--wckey`` for ``unix`` now (a held probe job, cancelled)."""
    out = local_slurm.run_as(
        unix, "sbatch", "--parsable", "--hold", f"--wckey={wckey}", "-o/dev/null", "--wrap=true"
    ).strip()
    shown = local_slurm._run("scontrol", "show", "job", out)
    local_slurm._run("scancel", out)
    return f"WCKey={wckey}" in shown.split()


def test_a_project_is_the_jobs_wckey_and_plain_sbatch_jobs_naming_it_count_for_it(
    local_slurm: LocalSlurm, members: tuple[Any, Any], admin: SlurmAdmin
) -> None:
    from slurm.rules_models import SlurmCharge

    alice, bob = members
    vision = Project.objects.create(name="vision", title="Vision grant", pi=alice)
    vision.members.add(bob)
    slurm_policy_sync(admin=admin)
    assert {("nobody", "vision"), ("daemon", "vision")} <= admin.wckeys()
    wait_for("slurmctld keeps daemon's wckey", lambda: _wckey_kept(local_slurm, "daemon", "vision"))

    slurm_inventory_sync()
    job = job_submit(
        owner=alice,
        queue="normal",
        image=ContainerImageFactory().reference,
        command="sleep 1",
        time_limit_s=300,
        cpus=1,
        memory_mb=64,
        project="vision",
    )
    plain_id = int(
        local_slurm.run_as(
            "daemon",
            "sbatch",
            "--parsable",
            "--gres=gpu:1",
            "--wckey=vision",
            "-o/dev/null",
            "--wrap=sleep 1",
        ).strip()
    )
    portal = wait_for("the portal job in accounting", lambda: _accounted(job.slurm.slurm_job_id))
    plain = wait_for("the sbatch job in accounting", lambda: _accounted(plain_id))
    assert (portal.wckey, plain.wckey) == ("vision", "vision")  # as sacct has them
    slurm_jobs_sync()
    accounting_sync()
    assert SlurmCharge.objects.get(slurm_job_id=plain_id).project == vision

    today = timezone.localdate()
    report = usage_report(
        period=period_of("custom", today - timedelta(days=1), today),
        viewer=UserFactory.create(username="dora", is_staff=True),
    )
    line = next(line for line in report.tables["project"] if line.name == "vision")
    assert portal.elapsed_s is not None and plain.elapsed_s is not None
    assert line.gpu_hours == pytest.approx(
        (portal.elapsed_s + plain.elapsed_s) / 3600, abs=3 / 3600
    )

    # bob leaves the project, then it ends: the wckeys the portal added go.
    vision.members.remove(bob)
    slurm_policy_sync(admin=admin)
    assert ("daemon", "vision") not in admin.wckeys()
    Project.objects.filter(pk=vision.pk).update(active=False)
    slurm_policy_sync(admin=admin)
    assert ("nobody", "vision") not in admin.wckeys()


def _can_submit_high(local_slurm: LocalSlurm) -> str | None:
    out = local_slurm.run_as(
        "nobody",
        "sbatch",
        "--parsable",
        "--hold",
        "--qos=high",
        "-o/dev/null",
        "--wrap=true",
        check=False,
    ).strip()
    if out.isdigit():
        local_slurm._run("scancel", out)
        return out
    return None


def test_a_priority_grant_opens_the_high_qos_until_it_lapses(
    local_slurm: LocalSlurm, members: tuple[Any, Any], admin: SlurmAdmin
) -> None:
    alice, _bob = members
    high = Queue.objects.get(name="high")
    QueueMapping.objects.update_or_create(queue=high, defaults={"qos": "high"})
    assert _can_submit_high(local_slurm) is None  # nobody has no access to "high" yet
    grant = PriorityGrant.objects.create(
        user=alice,
        queue=high,
        reason="camera-ready",
        deadline=timezone.now() + timedelta(days=2),
        state=PriorityGrant.State.APPROVED,
    )

    slurm_policy_sync(admin=admin)

    nobody = [a for a in admin.associations() if a.user == "nobody"]
    assert nobody and all("high" in a.qos for a in nobody)
    wait_for("sbatch --qos=high accepted", lambda: _can_submit_high(local_slurm))

    slurm_policy_sync(admin=admin, now=grant.deadline + timedelta(minutes=1))

    assert all("high" not in a.qos for a in admin.associations() if a.user == "nobody")
    wait_for("sbatch --qos=high refused", lambda: _can_submit_high(local_slurm) is None or None)
    # root's "high" was the Slurm admin's: the portal never added it, never removes it.
    assert any("high" in a.qos for a in admin.associations() if a.user == "root")


def test_a_booking_becomes_a_slurm_reservation_and_follows_its_changes(
    local_slurm: LocalSlurm, members: tuple[Any, Any], admin: SlurmAdmin
) -> None:
    alice, _bob = members
    slurm_inventory_sync()
    gpus = list(Gpu.objects.filter(node__name=local_slurm.node).order_by("index"))
    assert len(gpus) == local_slurm.gpus
    start = timezone.now() + timedelta(hours=1)
    booking = Reservation.objects.create(user=alice, start=start, end=start + timedelta(hours=2))
    booking.gpus.set(gpus[:2])

    result = slurm_reservations_sync(admin=admin)

    assert result.created == 1, result.errors
    (made,) = [r for r in admin.reservations() if r.name == f"lp-booking-{booking.pk}"]
    assert made.users == {"nobody"} and made.nodes == local_slurm.node
    assert made.core_count == local_slurm.cpus // 2  # two of four GPUs: half the cores
    assert booking.slurm_reservation.granularity == "cores"

    booking.gpus.set(gpus)  # the whole node now, and an hour longer
    Reservation.objects.filter(pk=booking.pk).update(end=start + timedelta(hours=3))
    assert slurm_reservations_sync(admin=admin).updated == 1
    (made,) = [r for r in admin.reservations() if r.name == f"lp-booking-{booking.pk}"]
    assert made.core_count is None or made.core_count == local_slurm.cpus
    assert made.end.startswith((start + timedelta(hours=3)).astimezone().strftime("%Y-%m-%dT%H"))

    Reservation.objects.filter(pk=booking.pk).update(state=Reservation.State.CANCELLED)
    assert slurm_reservations_sync(admin=admin).deleted == 1
    assert not [r for r in admin.reservations() if r.name.startswith("lp-booking-")]


def test_a_member_at_zero_credit_starts_after_a_member_with_credit(
    local_slurm: LocalSlurm, members: tuple[Any, Any], admin: SlurmAdmin
) -> None:
    _alice, bob = members
    ledger_post(user=bob, amount=Decimal("100"), kind="grant", idempotency_key="test:bob")
    gpus = f"--gres=gpu:{local_slurm.gpus}"

    def sbatch(user: str, seconds: int) -> int:
        out = local_slurm.run_as(
            user, "sbatch", "--parsable", gpus, "-o/dev/null", f"--wrap=sleep {seconds}"
        )
        return int(out.strip())

    def squeue(job_id: int) -> str:
        return local_slurm._run("squeue", "-h", "-j", str(job_id), "-o", "%T|%y", check=False)

    # A site's weights give every job some priority; this bare cluster's would all be 0
    # (no age weight, no usage yet), and Slurm floors priorities at 1, so the "normal"
    # QOS gets a little for the duration of the test.
    local_slurm.sacctmgr("modify", "qos", "where", "name=normal", "set", "priority=10")
    try:
        blocker = sbatch("daemon", 300)
        wait_for("the blocker running", lambda: squeue(blocker).startswith("RUNNING"))
        broke = sbatch("nobody", 2)  # alice, no credit: submitted first
        rich = sbatch("daemon", 2)  # bob, with credit

        slurm_policy_sync(admin=admin)

        assert squeue(broke).strip() != "" and not squeue(broke).strip().endswith("|0")
        assert squeue(rich).strip().endswith("|0")

        # The job page's breakdown (sprio) says why: alice's job carries the nice value,
        # and its parts less the nice are the priority squeue reports.
        def both_listed() -> dict[int, PriorityFactors] | None:
            found = admin.priority_factors([broke, rich])
            return found if len(found) == 2 else None

        parts = wait_for("sprio listing both pending jobs", both_listed)
        assert parts[broke].nice > 0 and parts[rich].nice == 0
        assert parts[rich].qos > 0  # the normal QOS's priority, weighted
        for job_id in (broke, rich):
            shown = int(local_slurm._run("squeue", "-h", "-j", str(job_id), "-o", "%Q").strip())
            assert parts[job_id].priority == shown
        local_slurm._run("scancel", str(blocker))
        ran_broke = wait_for("alice's job ran", lambda: _accounted(broke), timeout_s=120)
        ran_rich = wait_for("bob's job ran", lambda: _accounted(rich), timeout_s=60)
    finally:
        local_slurm.sacctmgr("modify", "qos", "where", "name=normal", "set", "priority=0")
    assert ran_rich.started_at is not None and ran_broke.started_at is not None
    assert ran_rich.started_at < ran_broke.started_at  # bob first, though alice queued first
    assert ran_broke.ended_at is not None  # she ran all the same: never blocked


def _emergency_for(member: Any, slurm_id: int, expires: Any) -> EmergencyRequest:
    """An approved emergency naming a portal job that is the member's Slurm job ``slurm_id``."""
    job = Job.objects.create(
        owner=member,
        queue=Queue.objects.get(name="normal"),
        image=ContainerImageFactory.create(),
        command=["true"],
        time_limit_s=60,
    )
    SlurmJob.objects.create(
        slurm_job_id=slurm_id,
        job=job,
        user=member,
        unix_user="nobody",
        qos="normal",
        state="PENDING",
    )
    emergency = EmergencyRequest.objects.create(
        user=member, reason="paper", state=EmergencyRequest.State.APPROVED, expires_at=expires
    )
    emergency.jobs.add(job)
    return emergency


def test_an_approved_emergency_runs_its_job_under_the_top_qos_until_it_expires(
    local_slurm: LocalSlurm, members: tuple[Any, Any], admin: SlurmAdmin
) -> None:
    alice, _bob = members
    slurm_id = int(
        local_slurm.run_as(
            "nobody", "sbatch", "--parsable", "--hold", "-o/dev/null", "--wrap=true"
        ).strip()
    )
    expires = timezone.now() + timedelta(hours=2)
    _emergency_for(alice, slurm_id, expires)

    def qos() -> str:
        return local_slurm._run("squeue", "-h", "-j", str(slurm_id), "-o", "%q").strip()

    try:
        slurm_policy_sync(admin=admin)
        assert qos() == "lp-emergency"
        slurm_policy_sync(admin=admin, now=expires + timedelta(minutes=1))
        assert qos() == "normal"
        assert all("lp-emergency" not in a.qos for a in admin.associations() if a.user == "nobody")
    finally:
        local_slurm._run("scancel", str(slurm_id), check=False)


def test_an_emergency_or_grant_job_of_a_member_at_zero_credit_keeps_its_priority(
    local_slurm: LocalSlurm, members: tuple[Any, Any], admin: SlurmAdmin
) -> None:
    alice, _bob = members  # alice (nobody) has no credit
    high = Queue.objects.get(name="high")
    QueueMapping.objects.update_or_create(queue=high, defaults={"qos": "high"})
    ends = timezone.now() + timedelta(hours=2)
    PriorityGrant.objects.create(
        user=alice, queue=high, reason="deadline", deadline=ends, state=PriorityGrant.State.APPROVED
    )
    gpus = f"--gres=gpu:{local_slurm.gpus}"  # none starts while the blocker holds the node

    def sbatch(user: str, *flags: str, seconds: int = 1) -> int:
        out = local_slurm.run_as(
            user, "sbatch", "--parsable", gpus, *flags, "-o/dev/null", f"--wrap=sleep {seconds}"
        )
        return int(out.strip())

    def squeue(job_id: int) -> tuple[str, int, int]:
        """QOS, nice and the priority Slurm reports (``%Q``) of a pending job."""
        out = local_slurm._run("squeue", "-h", "-j", str(job_id), "-o", "%q|%y|%Q").strip()
        qos, nice, priority = out.split("|")
        return qos, int(nice), int(priority)

    blocker = sbatch("daemon", seconds=300)
    jobs: list[int] = [blocker]
    try:
        wait_for(
            "the blocker running",
            lambda: "RUNNING" in local_slurm._run("squeue", "-h", "-j", str(blocker), "-o", "%T"),
        )
        slurm_policy_sync(admin=admin)  # the grant opens "high" to nobody
        plain = sbatch("nobody")
        granted = sbatch("nobody", "--qos=high")
        urgent = sbatch("nobody")
        jobs += [plain, granted, urgent]
        _emergency_for(alice, urgent, ends)

        slurm_policy_sync(admin=admin)

        assert "RUNNING" in local_slurm._run("squeue", "-h", "-j", str(blocker), "-o", "%T")
        plain_qos, plain_nice, plain_priority = squeue(plain)
        assert plain_qos == "normal" and plain_nice > 0  # zero credit: niced
        for job_id, qos in ((granted, "high"), (urgent, "lp-emergency")):
            got_qos, nice, priority = squeue(job_id)
            assert (got_qos, nice) == (qos, 0)
            assert priority > plain_priority, (qos, priority, plain_priority)
    finally:
        for job_id in jobs:
            local_slurm._run("scancel", str(job_id), check=False)
        slurm_policy_sync(admin=admin, now=ends + timedelta(minutes=1))  # grant and QOS go
