"""The lab's rules in Slurm mode without a Slurm: the mapping, merge and conflict rules, the
parsers of sacctmgr/scontrol output, and the accounting reconciliation on recorded jobs."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest

from accounts.models import CreditAccount, LedgerEntry, Project
from accounts.services import ledger_post
from credits.services import credits_charge_running_jobs
from jobqueue.models import EmergencyRequest, Job, PriorityGrant, Queue
from slurm.accounting import (
    accounting_reconcile,
    charge_point,
    gpu_cost,
    queue_for,
)
from slurm.admin_commands import (
    SlurmAdmin,
    SlurmAssociation,
    parse_associations,
    parse_pending_jobs,
    parse_reservations,
    parse_wckeys,
    tres_gpus,
    wall_minutes,
)
from slurm.cli import JobInfo, parse_accounting_job
from slurm.models import QueueMapping, SlurmJob, UnixLogin
from slurm.policy import (
    Merge,
    account_name_for,
    member_account,
    nice_changes,
    policy_conflict_resolve,
    qos_changes,
    slurm_policy_sync,
    three_way,
    zero_credit_nice,
)
from slurm.reservations import NodeShape, parse_node_shapes, reservation_spec
from slurm.rules_models import ManagedValue, PolicyConflict, SlurmCharge
from tests.factories import ContainerImageFactory

T0 = datetime(2026, 3, 2, 10, 0, tzinfo=UTC)


# -- the merge and mapping rules -----------------------------------------------------------


@pytest.mark.parametrize(
    ("base", "portal", "slurm", "expected"),
    [
        (None, "30", None, Merge.PUSH),  # new: create it
        (None, "30", "30", Merge.AGREE),  # found as wanted: adopt it
        (None, "30", "50", Merge.CONFLICT),  # Slurm holds a value the portal never set
        ("30", "30", "30", Merge.NONE),
        ("30", "40", "30", Merge.PUSH),  # changed in the portal only
        ("30", "30", "50", Merge.PULL),  # changed by hand in Slurm only
        ("30", "40", "40", Merge.AGREE),
        ("30", "40", "50", Merge.CONFLICT),  # changed on both sides
        ("30", "30", None, Merge.CONFLICT),  # deleted by hand: never recreated silently
    ],
)
def test_the_three_way_merge_takes_one_sided_changes_and_stops_at_two_sided_ones(
    base: str | None, portal: str, slurm: str | None, expected: Merge
) -> None:
    assert three_way(base=base, portal=portal, slurm=slurm) == expected


def test_category_names_become_valid_slurm_account_names() -> None:
    assert account_name_for("PhD, thesis phase") == "lp-phd-thesis-phase"
    assert account_name_for("新生") == "lp-category"
    assert len(account_name_for("x" * 80)) <= 30


def test_a_grant_qos_is_added_while_wanted_and_removed_only_where_the_portal_added_it() -> None:
    assocs = [
        SlurmAssociation(account="lab", user="alice", qos=frozenset({"normal"})),
        SlurmAssociation(account="lab", user="bob", qos=frozenset({"normal", "high"})),
        SlurmAssociation(account="lp-phd", user="bob", qos=frozenset({"normal", "high"})),
        SlurmAssociation(account="lab", user="carol", qos=frozenset({"normal"})),
    ]
    changes = qos_changes(
        associations=assocs,
        wanted={"alice": {"high"}, "bob": set()},  # carol has no unix login: untouched
        managed_qos={"high"},
        added_by_portal={("bob", "lp-phd", "high")},
    )
    assert [(c.user, c.account, c.qos, c.add) for c in changes] == [
        ("alice", "lab", "high", True),
        # bob's "high" in "lab" was the admin's: it stays after his grant lapsed
        ("bob", "lp-phd", "high", False),
    ]


def test_zero_credit_members_get_the_portal_nice_and_lose_it_when_credit_returns() -> None:
    pending = [
        (1, "alice", 0, "normal"),
        (2, "alice", 50, "normal"),
        (3, "bob", 20001, "normal"),
        (4, "bob", 0, "normal"),
        (5, "alice", 0, "lp-emergency"),
        (6, "alice", 20001, "high"),
    ]
    changes = nice_changes(
        pending=pending,
        zero_credit_users={"alice"},
        nice=20001,
        exempt_qos={"lp-emergency", "high"},
    )
    assert changes == [
        (1, 20001),  # alice at zero: after everyone else
        # job 2: alice set nice=50 herself; left alone
        (3, 0),  # bob has credit again: back to normal
        # job 5: her approved emergency is not niced
        (6, 0),  # her job moved to a grant's QOS loses the portal's nice
    ]


def test_the_zero_credit_nice_outweighs_every_priority_factor() -> None:
    config = (
        "PriorityWeightAge       = 1000\nPriorityWeightFairshare = 10000\nPriorityWeightQOS = 0\n"
    )
    assert zero_credit_nice(config) == 11001
    assert zero_credit_nice("") == 2


def test_plain_jobs_are_charged_at_the_queue_their_qos_and_partition_map_to() -> None:
    mappings = [("lab", "", 1), ("", "high", 2), ("lab", "debug", 3)]

    def job(qos: str, partition: str) -> JobInfo:
        return JobInfo(job_id=1, qos=qos, partition=partition)

    assert queue_for(job("debug", "lab"), mappings, 9) == 3  # both match
    assert queue_for(job("high", "other"), mappings, 9) == 2  # the QOS
    assert queue_for(job("normal", "lab"), mappings, 9) == 1  # the partition
    assert queue_for(job("normal", "other"), mappings, 9) == 9  # the default queue


def test_a_running_job_is_charged_to_the_last_window_and_a_finished_one_to_its_elapsed_time() -> (
    None
):
    running = JobInfo(job_id=1, gpus=2, started_at=T0, submitted_at=T0)
    point = charge_point(running, now=T0 + timedelta(minutes=12), interval_minutes=5)
    assert point is not None and not point.final and point.seconds == 600
    ended = JobInfo(
        job_id=1, gpus=2, started_at=T0, ended_at=T0 + timedelta(hours=1), elapsed_s=3000
    )
    done = charge_point(ended, now=T0 + timedelta(hours=2), interval_minutes=5)
    assert done is not None and done.final and done.seconds == 3000
    assert charge_point(JobInfo(job_id=2, gpus=1), now=T0, interval_minutes=5) is None  # pending
    assert gpu_cost(gpus=2, seconds=5400, rate=Decimal("1.5")) == Decimal("4.500")


# -- the parsers ----------------------------------------------------------------------------


def test_sacctmgr_association_rows_are_parsed() -> None:
    text = "lab||1|normal||root\nlab|nobody|1|debug,normal|normal|\nlp-phd||parent|||root\n"
    rows = parse_associations(text)
    assert rows[1] == SlurmAssociation(
        account="lab",
        user="nobody",
        shares=1,
        qos=frozenset({"debug", "normal"}),
        default_qos="normal",
    )
    assert rows[2].shares is None


def test_squeue_pending_rows_skip_array_placeholders() -> None:
    jobs = parse_pending_jobs("12|alice|0|normal\n13_[1-4]|bob|0|normal\n14|bob|11001|high\n")
    assert [(j.job_id, j.user, j.nice, j.qos) for j in jobs] == [
        (12, "alice", 0, "normal"),
        (14, "bob", 11001, "high"),
    ]


def test_scontrol_reservations_and_nodes_are_parsed() -> None:
    # As scontrol 22.05 prints them (recorded from the test cluster).
    line = (
        "ReservationName=lp-booking-7 StartTime=2026-12-01T07:18:19 EndTime=2030-01-01T00:00:00 "
        "Duration=1126-16:41:41 Nodes=vm NodeCnt=1 CoreCnt=1 Features=(null) PartitionName=lab "
        "Flags=IGNORE_JOBS,SPEC_NODES,MAGNETIC   NodeName=vm CoreIDs=0 TRES=cpu=1 Users=nobody "
        "Groups=(null) Accounts=(null) Licenses=(null) State=ACTIVE"
    )
    (res,) = parse_reservations(line)
    assert (res.name, res.users, res.nodes, res.core_count) == (
        "lp-booking-7",
        frozenset({"nobody"}),
        "vm",
        1,
    )
    shapes = parse_node_shapes(
        "NodeName=vm Arch=x86_64 CoresPerSocket=1 CPUTot=16 Gres=gpu:4 ThreadsPerCore=2 State=IDLE"
    )
    assert shapes == {"vm": NodeShape(gpus=4, cores=8)}


def test_a_whole_node_booking_reserves_the_node_and_a_partial_one_its_share_of_cores() -> None:
    shapes = {"vm": NodeShape(gpus=4, cores=16), "gpu2": NodeShape(gpus=8, cores=64)}
    whole = reservation_spec(
        reservation_id=5,
        unix_user="alice",
        booked={"vm": 4},
        shapes=shapes,
        start=T0 + timedelta(hours=1),
        end=T0 + timedelta(hours=3),
        now=T0,
    )
    assert whole.core_counts is None and whole.granularity == "node"
    args = whole.arguments(update=False)
    assert "Users=alice" in args and "Nodes=vm" in args and "Flags=MAGNETIC,IGNORE_JOBS" in args
    partial = reservation_spec(
        reservation_id=6,
        unix_user="alice",
        booked={"gpu2": 3},
        shapes=shapes,
        start=T0 - timedelta(minutes=5),
        end=T0 + timedelta(hours=1),
        now=T0,
    )
    assert partial.core_counts == (24,) and partial.granularity == "cores"
    assert partial.start == "now"
    assert not any(a.startswith("StartTime") for a in partial.arguments(update=True))


# -- accounting, on recorded jobs --------------------------------------------------------------


def _ended(job_id: int, user: str, *, gpus: int, seconds: int, qos: str = "normal") -> JobInfo:
    return JobInfo(
        job_id=job_id,
        user=user,
        state="COMPLETED",
        qos=qos,
        partition="lab",
        gpus=gpus,
        submitted_at=T0,
        started_at=T0,
        ended_at=T0 + timedelta(seconds=seconds),
        elapsed_s=seconds,
    )


def _charges(user: Any) -> Decimal:
    total = sum(
        (e.amount for e in LedgerEntry.objects.filter(account__user=user, kind="charge")),
        Decimal("0"),
    )
    return -total


@pytest.mark.django_db
def test_a_plain_sbatch_job_is_charged_once_however_often_the_pass_runs(alice: Any) -> None:
    UnixLogin.objects.create(user=alice, username="alice")
    Queue.objects.filter(name="normal").update(credit_rate=Decimal("2"))
    record = _ended(41, "alice", gpus=2, seconds=5400)
    first = accounting_reconcile(records=[record], now=T0 + timedelta(hours=2))
    assert (first.charged, first.settled) == (1, 1)
    assert _charges(alice) == Decimal("6.000")  # 2 GPUs × 1.5 h × 2/GPU-h
    again = accounting_reconcile(records=[record], now=T0 + timedelta(hours=3))
    assert again.charged == 0
    assert _charges(alice) == Decimal("6.000")
    assert SlurmCharge.objects.get(slurm_job_id=41).final


@pytest.mark.django_db
def test_a_running_job_is_charged_as_it_goes_then_settled_on_slurms_elapsed_time(
    alice: Any,
) -> None:
    UnixLogin.objects.create(user=alice, username="alice")
    running = JobInfo(
        job_id=42, user="alice", state="RUNNING", gpus=1, submitted_at=T0, started_at=T0
    )
    accounting_reconcile(records=[running], now=T0 + timedelta(minutes=31))
    assert _charges(alice) == Decimal("0.500")  # to the 30-minute window, at rate 1
    accounting_reconcile(records=[running], now=T0 + timedelta(minutes=34))  # same window
    assert _charges(alice) == Decimal("0.500")
    ended = _ended(42, "alice", gpus=1, seconds=2700)
    accounting_reconcile(records=[ended], now=T0 + timedelta(hours=1))
    assert _charges(alice) == Decimal("0.750")
    assert LedgerEntry.objects.filter(account__user=alice).count() == 2


@pytest.mark.django_db
def test_a_job_lost_with_its_node_is_refunded_what_it_was_charged(alice: Any) -> None:
    UnixLogin.objects.create(user=alice, username="alice")
    running = JobInfo(
        job_id=45, user="alice", state="RUNNING", gpus=2, submitted_at=T0, started_at=T0
    )
    accounting_reconcile(records=[running], now=T0 + timedelta(minutes=30))
    assert _charges(alice) == Decimal("1.000")
    lost = replace(_ended(45, "alice", gpus=2, seconds=2400), state="NODE_FAIL")
    accounting_reconcile(records=[lost], now=T0 + timedelta(hours=1))
    assert CreditAccount.objects.get(user=alice).balance == Decimal("0.000")
    assert LedgerEntry.objects.filter(account__user=alice, kind="refund").count() == 1


@pytest.mark.django_db
def test_jobs_of_unix_users_no_member_has_are_reported_not_charged(alice: Any) -> None:
    result = accounting_reconcile(records=[_ended(43, "mallory", gpus=1, seconds=60)], now=T0)
    assert result.unknown_users == {"mallory"} and result.charged == 0
    assert not LedgerEntry.objects.exists()


@pytest.mark.django_db
def test_a_portal_job_shares_its_charge_keys_with_the_portal_charger(alice: Any) -> None:
    UnixLogin.objects.create(user=alice, username="alice")
    job = Job.objects.create(
        owner=alice,
        queue=Queue.objects.get(name="normal"),
        image=ContainerImageFactory.create(),
        command=["true"],
        gpus=1,
        time_limit_s=7200,
        state=Job.State.RUNNING,
        started_at=T0,
    )
    SlurmJob.objects.create(slurm_job_id=44, job=job, user=alice, unix_user="alice")
    running = JobInfo(
        job_id=44, user="alice", state="RUNNING", gpus=1, submitted_at=T0, started_at=T0
    )
    # The agents-mode charger still runs in beat; with the same keys nothing is charged twice.
    credits_charge_running_jobs(now=T0 + timedelta(minutes=31))
    accounting_reconcile(records=[running], now=T0 + timedelta(minutes=31))
    assert _charges(alice) == Decimal("0.500")
    Job.objects.filter(pk=job.pk).update(
        state=Job.State.COMPLETED, ended_at=T0 + timedelta(hours=1)
    )
    accounting_reconcile(
        records=[_ended(44, "alice", gpus=1, seconds=3600)], now=T0 + timedelta(hours=2)
    )
    assert _charges(alice) == Decimal("1.000")
    assert LedgerEntry.objects.filter(job=job, kind="charge").count() == 2
    assert job.efficiency.verdict == "unknown"  # judged by the portal: no telemetry here


# -- the policy pass against a recording Slurm -------------------------------------------------


class FakeSlurm:
    """sacctmgr/scontrol/squeue as a dict of accounts and associations, recording each change."""

    def __init__(self) -> None:
        self.accounts: dict[str, tuple[str, int]] = {"root": ("root", 1), "lab": ("lab", 1)}
        self.assocs: dict[tuple[str, str], set[str]] = {("lab", "nobody"): {"normal"}}
        self.qos = {"normal", "high"}
        self.grp_tres: dict[tuple[str, str], str] = {}  # a member association's GrpTRES
        self.qos_limits: dict[str, dict[str, str]] = {}  # QOS → sacctmgr keyword → value
        self.pending: list[tuple[int, str, int]] = []
        self.wckeys: set[tuple[str, str]] = set()  # (user, wckey)
        self.calls: list[list[str]] = []

    def __call__(self, argv: Sequence[str]) -> str:
        argv = list(argv)
        if argv[:3] == ["sacctmgr", "-Pn", "show"]:
            what = argv[3]
            if what == "account":
                return "".join(f"{n}|{org}|\n" for n, (org, _s) in self.accounts.items())
            if what == "assoc":
                rows = [f"{n}||{s}|normal||root" for n, (_o, s) in self.accounts.items()]
                rows += [
                    f"{a}|{u}|1|{','.join(sorted(q))}|||{self.grp_tres.get((a, u), '')}"
                    for (a, u), q in self.assocs.items()
                ]
                return "\n".join(rows) + "\n"
            if what == "user":
                return "".join(f"{u}|lab\n" for (_a, u) in self.assocs)
            if what == "wckey":  # the first of a user's wckeys is their default, twice
                first = {u: w for u, w in sorted(self.wckeys, reverse=True)}
                rows = [f"{w}|{u}|labportal" for u, w in sorted(self.wckeys)]
                return "\n".join(rows + [f"*{w}|{u}|labportal" for u, w in first.items()])
            if what == "qos" and "MaxJobsPU" in argv[-1]:
                names = ("MaxJobsPerUser", "MaxTRESPerUser", "MaxTRESPerJob", "MaxWall")
                return "".join(
                    "|".join([q, *(self.qos_limits.get(q, {}).get(n, "") for n in names)]) + "\n"
                    for q in self.qos
                )
            if what == "qos":
                return "".join(f"{q}|10\n" for q in self.qos)
        if argv[0] == "squeue":
            return "".join(f"{i}|{u}|{n}|normal\n" for i, u, n in self.pending)
        if argv[:3] == ["scontrol", "show", "config"]:
            return "PriorityWeightQOS = 10000\nPriorityWeightFairshare = 1000\n"
        self.calls.append(argv)
        self._apply(argv)
        return ""

    def _apply(self, argv: list[str]) -> None:
        kv = dict(a.split("=", 1) for a in argv if "=" in a and not a.startswith("qos"))
        if argv[2:4] == ["add", "account"]:
            self.accounts[argv[4]] = (kv["organization"], int(kv["fairshare"]))
        elif argv[2:4] == ["modify", "account"] and "fairshare" in kv:
            org, _s = self.accounts[kv["name"]]
            self.accounts[kv["name"]] = (org, int(kv["fairshare"]))
        elif argv[2:4] == ["modify", "qos"]:
            limits = self.qos_limits.setdefault(kv["name"], {})
            for arg in argv[argv.index("set") + 1 :]:
                name, value = arg.split("=", 1)
                limits[name] = "" if value.endswith("-1") else value
        elif argv[2:4] == ["modify", "user"] and "GrpTRES" in kv:
            value = kv["GrpTRES"]
            self.grp_tres[(kv["account"], kv["name"])] = "" if value.endswith("=-1") else value
        elif argv[2:4] == ["add", "user"] and "wckey" in kv:
            self.wckeys.add((argv[4], kv["wckey"]))
        elif argv[2:4] == ["delete", "user"] and "wckey" in kv:
            self.wckeys.discard((kv["name"], kv["wckey"]))
        elif argv[2:4] == ["add", "user"]:
            self.assocs[(kv["account"], argv[4])] = {"normal"}
        elif argv[2:4] == ["add", "qos"]:
            self.qos.add(argv[4])
        elif argv[2:4] == ["modify", "user"]:
            change = next(a for a in argv if a.startswith("qos"))
            qos = self.assocs[(kv["account"], kv["name"])]
            (qos.add if "+=" in change else qos.discard)(change.split("=")[-1])
        elif argv[:2] == ["scontrol", "update"] and "nice" in kv:
            job_id = int(kv["jobid"])
            self.pending = [
                (i, u, int(kv["nice"]) if i == job_id else n) for i, u, n in self.pending
            ]


@pytest.mark.django_db
def test_categories_become_accounts_and_a_hand_edit_in_slurm_flows_back(
    alice: Any, phd_category: Any
) -> None:
    UnixLogin.objects.create(user=alice, username="nobody")
    slurm = FakeSlurm()
    slurm_policy_sync(admin=SlurmAdmin(slurm), now=T0)
    assert slurm.accounts["lp-phd-thesis-phase"] == ("labportal", 30)
    assert ("lp-phd-thesis-phase", "nobody") in slurm.assocs
    # The Slurm admin changes the shares by hand; the portal takes the value.
    slurm.accounts["lp-phd-thesis-phase"] = ("labportal", 45)
    slurm_policy_sync(admin=SlurmAdmin(slurm), now=T0)
    phd_category.refresh_from_db()
    assert phd_category.fairshare_weight == 45
    # The portal's admin changes the weight: pushed to Slurm.
    phd_category.fairshare_weight = 60
    phd_category.save()
    slurm_policy_sync(admin=SlurmAdmin(slurm), now=T0)
    assert slurm.accounts["lp-phd-thesis-phase"] == ("labportal", 60)


@pytest.mark.django_db
def test_a_value_changed_on_both_sides_is_a_conflict_left_for_the_admin(
    alice: Any, phd_category: Any
) -> None:
    slurm = FakeSlurm()
    slurm_policy_sync(admin=SlurmAdmin(slurm), now=T0)
    slurm.accounts["lp-phd-thesis-phase"] = ("labportal", 5)
    phd_category.fairshare_weight = 60
    phd_category.save()
    result = slurm_policy_sync(admin=SlurmAdmin(slurm), now=T0)
    assert result.conflicts == 1
    assert slurm.accounts["lp-phd-thesis-phase"][1] == 5  # Slurm untouched
    phd_category.refresh_from_db()
    assert phd_category.fairshare_weight == 60  # the portal untouched
    assert slurm_policy_sync(admin=SlurmAdmin(slurm), now=T0).conflicts == 0  # recorded once
    conflict = PolicyConflict.objects.open().get()
    policy_conflict_resolve(conflict_id=conflict.pk, keep="portal")
    slurm_policy_sync(admin=SlurmAdmin(slurm), now=T0)
    assert slurm.accounts["lp-phd-thesis-phase"][1] == 60


@pytest.mark.django_db
def test_an_account_of_the_same_name_made_by_the_admin_is_never_taken_over(
    alice: Any, phd_category: Any
) -> None:
    slurm = FakeSlurm()
    slurm.accounts["lp-phd-thesis-phase"] = ("physics", 7)
    slurm_policy_sync(admin=SlurmAdmin(slurm), now=T0)
    assert slurm.accounts["lp-phd-thesis-phase"] == ("physics", 7)
    assert PolicyConflict.objects.open().filter(key=f"account:category:{phd_category.pk}").exists()


@pytest.mark.django_db
def test_grants_emergencies_and_zero_credit_reach_slurm_and_are_taken_back(
    alice: Any, bob: Any, admin_user: Any
) -> None:
    UnixLogin.objects.create(user=alice, username="nobody")
    UnixLogin.objects.create(user=bob, username="daemon")
    ledger_post(user=bob, amount=Decimal("10"), kind="grant", idempotency_key="t:bob")
    high = Queue.objects.get(name="high")
    QueueMapping.objects.update_or_create(queue=high, defaults={"qos": "high"})
    grant = PriorityGrant.objects.create(
        user=alice, queue=high, reason="deadline", deadline=T0 + timedelta(days=1), state="approved"
    )
    slurm = FakeSlurm()
    slurm.pending = [(7, "nobody", 0), (8, "daemon", 0)]
    slurm_policy_sync(admin=SlurmAdmin(slurm), now=T0)
    assert "high" in slurm.assocs[("lab", "nobody")]
    assert slurm.pending == [(7, "nobody", 11001), (8, "daemon", 0)]  # alice has no credit
    assert "lp-emergency" in slurm.qos
    # The grant lapses, alice gets credit: both go back.
    ledger_post(user=alice, amount=Decimal("5"), kind="grant", idempotency_key="t:alice")
    slurm_policy_sync(admin=SlurmAdmin(slurm), now=grant.deadline + timedelta(minutes=1))
    assert "high" not in slurm.assocs[("lab", "nobody")]
    assert slurm.pending == [(7, "nobody", 0), (8, "daemon", 0)]
    assert not ManagedValue.objects.filter(key__startswith="qos-added:").exists()
    # An approved emergency moves its named job to the top QOS, and back when it expires.
    job = Job.objects.create(
        owner=alice,
        queue=Queue.objects.get(name="normal"),
        image=ContainerImageFactory.create(),
        command=["true"],
        time_limit_s=60,
    )
    SlurmJob.objects.create(
        slurm_job_id=7, job=job, user=alice, unix_user="nobody", qos="normal", state="PENDING"
    )
    emergency = EmergencyRequest.objects.create(
        user=alice, reason="paper", state="approved", expires_at=T0 + timedelta(hours=2)
    )
    emergency.jobs.add(job)
    slurm_policy_sync(admin=SlurmAdmin(slurm), now=T0)
    assert "lp-emergency" in slurm.assocs[("lab", "nobody")]
    assert ["scontrol", "update", "jobid=7", "qos=lp-emergency"] in slurm.calls
    slurm_policy_sync(admin=SlurmAdmin(slurm), now=T0 + timedelta(hours=3))
    assert ["scontrol", "update", "jobid=7", "qos=normal"] in slurm.calls
    assert "lp-emergency" not in slurm.assocs[("lab", "nobody")]
    assert CreditAccount.objects.get(user=alice).balance == Decimal("5.000")


@pytest.mark.django_db
def test_a_batch_posts_each_key_once_and_moves_the_balance_once(alice: Any) -> None:
    from accounts.services import Posting, ledger_post_batch

    postings = [
        Posting(amount=Decimal("-1.5"), kind="charge", idempotency_key="b:1"),
        Posting(amount=Decimal("-2"), kind="charge", idempotency_key="b:2"),
    ]
    assert ledger_post_batch(user=alice, postings=postings) == 2
    assert ledger_post_batch(user=alice, postings=postings) == 0
    account = CreditAccount.objects.get(user=alice)
    assert account.balance == Decimal("-3.500")
    assert not CreditAccount.objects.inconsistent().exists()
    assert list(
        LedgerEntry.objects.filter(account=account)
        .order_by("id")
        .values_list("balance_after", flat=True)
    ) == [Decimal("-1.500"), Decimal("-3.500")]


@pytest.mark.django_db
def test_an_admin_settles_a_conflict_from_the_admin_site_and_others_cannot(
    client: Any, admin_user: Any, charlie: Any
) -> None:
    conflict = PolicyConflict.objects.create(
        key="share:lp-phd", base_value="30", portal_value="60", slurm_value="5"
    )
    url = "/admin/slurm/policyconflict/"
    client.force_login(charlie)
    assert (
        client.post(url, {"action": "keep_slurm", "_selected_action": [conflict.pk]}).status_code
        == 302
    )
    conflict.refresh_from_db()
    assert conflict.resolved_at is None  # charlie is no admin: sent to the login page
    client.force_login(admin_user)
    client.post(url, {"action": "keep_slurm", "_selected_action": [conflict.pk]})
    conflict.refresh_from_db()
    assert conflict.resolution == "slurm"
    assert ManagedValue.objects.get(key="share:lp-phd").value == "60"  # next pass pulls "5"


@pytest.mark.django_db
def test_my_bookings_say_what_slurm_reserved_in_the_members_language(
    client: Any, alice: Any
) -> None:
    from reservations.models import Reservation
    from slurm.rules_models import SlurmReservation

    start = datetime.now(tz=UTC) + timedelta(hours=1)
    booking = Reservation.objects.create(user=alice, start=start, end=start + timedelta(hours=1))
    SlurmReservation.objects.create(
        reservation=booking, name=f"lp-booking-{booking.pk}", granularity="cores"
    )
    client.force_login(alice)
    page = client.get("/reservations/mine/", HTTP_ACCEPT_LANGUAGE="zh-hans").content.decode()
    assert "Slurm：已预约 CPU 核，GPU 未隔离" in page
    # English last: a request leaves its language active in the thread for later tests.
    page = client.get("/reservations/mine/", HTTP_ACCEPT_LANGUAGE="en").content.decode()
    assert "Slurm: cores reserved, GPUs not fenced" in page


def test_the_private_slurm_runs_its_commands_in_a_folder_every_member_may_enter(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """sbatch --wait as `nobody` failed where the caller's folder was private: the job
    could not chdir there. Slurm's commands run in the instance's own 0755 folder."""
    import shutil
    import subprocess

    from benchmarks.local_slurm import LocalSlurm

    seen: dict[str, object] = {}

    def run(argv: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
        seen.update(kwargs)
        return subprocess.CompletedProcess(argv, 0, "", "")

    monkeypatch.setattr("benchmarks.local_slurm._which", lambda name: name)
    monkeypatch.setattr(subprocess, "run", run)
    slurm = LocalSlurm()
    try:
        slurm.run_as("nobody", "sbatch", "--wrap=true")
        assert seen["cwd"] == slurm.dir
        assert slurm.dir.stat().st_mode & 0o777 == 0o755
    finally:
        shutil.rmtree(slurm.dir)


# -- limits: queues' QOS and members' associations -------------------------------------------


@pytest.mark.parametrize(
    ("tres", "gpus"),
    [("gres/gpu=2", "2"), ("cpu=4,gres/gpu=8", "8"), ("gres/gpu:a100=1", ""), ("", "")],
)
def test_only_the_untyped_gpu_count_of_a_tres_list_is_the_portals(tres: str, gpus: str) -> None:
    assert tres_gpus(tres) == gpus


@pytest.mark.parametrize(
    ("text", "minutes"),
    [("01:00:00", "60"), ("3-00:00:00", "4320"), ("00:30", "1"), ("90", "90"), ("", "")],
)
def test_a_slurm_duration_reads_as_whole_minutes(text: str, minutes: str) -> None:
    assert wall_minutes(text) == minutes


@pytest.mark.django_db
def test_queue_limits_go_to_their_qos_and_a_hand_edit_comes_back_to_the_queue(
    queues: Any,
) -> None:
    slurm = FakeSlurm()
    slurm.qos |= {"debug"}
    slurm_policy_sync(admin=SlurmAdmin(slurm), now=T0)
    assert slurm.qos_limits["debug"] == {
        "MaxJobsPerUser": "2",
        "MaxTRESPerJob": "gres/gpu=1",
        "MaxWall": "60",
    }  # no per-user GPU limit in debug: nothing set
    assert slurm.qos_limits["high"]["MaxWall"] == str(3 * 24 * 60)
    calls = len(slurm.calls)
    assert slurm_policy_sync(admin=SlurmAdmin(slurm), now=T0).limits_pushed == 0
    assert len(slurm.calls) == calls  # nothing to do twice

    slurm.qos_limits["debug"]["MaxWall"] = "20"  # the Slurm admin shortens it
    Queue.objects.filter(name="normal").update(max_running_gpus_per_user=6)  # the portal's admin
    result = slurm_policy_sync(admin=SlurmAdmin(slurm), now=T0)
    assert (result.limits_pulled, result.limits_pushed) == (1, 1)
    debug = Queue.objects.get(name="debug")
    assert (debug.max_time_limit_s, debug.default_time_limit_s) == (1200, 1200)
    assert slurm.qos_limits["normal"]["MaxTRESPerUser"] == "gres/gpu=6"

    slurm.qos_limits["normal"]["MaxTRESPerUser"] = "gres/gpu=5"  # both sides change it
    Queue.objects.filter(name="normal").update(max_running_gpus_per_user=7)
    assert slurm_policy_sync(admin=SlurmAdmin(slurm), now=T0).conflicts == 1
    assert slurm.qos_limits["normal"]["MaxTRESPerUser"] == "gres/gpu=5"
    assert PolicyConflict.objects.open().get().key == "qos-limit:normal:MaxTRESPerUser"


@pytest.mark.django_db
def test_queues_sharing_one_qos_leave_it_alone_and_say_why(queues: Any) -> None:
    for queue in queues:
        QueueMapping.objects.update_or_create(queue=queue, defaults={"qos": "normal"})
    slurm = FakeSlurm()
    result = slurm_policy_sync(admin=SlurmAdmin(slurm), now=T0)
    assert "normal" not in slurm.qos_limits
    assert any("QOS normal serves the queues" in error for error in result.errors)


@pytest.mark.django_db
def test_a_categorys_gpus_at_once_is_each_members_grptres_and_a_hand_exception_stays(
    alice: Any, bob: Any, phd_category: Any
) -> None:
    UnixLogin.objects.create(user=alice, username="nobody")
    UnixLogin.objects.create(user=bob, username="daemon")
    phd_category.max_concurrent_gpus = 3
    phd_category.save()
    slurm = FakeSlurm()
    slurm_policy_sync(admin=SlurmAdmin(slurm), now=T0)
    account = "lp-phd-thesis-phase"
    assert slurm.grp_tres[(account, "nobody")] == "gres/gpu=3"
    assert slurm.grp_tres[(account, "daemon")] == "gres/gpu=3"
    assert ("lab", "nobody") not in slurm.grp_tres  # the admin's association: never touched
    assert member_account(category_id=phd_category.pk, unix_user="nobody") == account

    slurm.grp_tres[(account, "daemon")] = "gres/gpu=6"  # the Slurm admin's exception for bob
    slurm_policy_sync(admin=SlurmAdmin(slurm), now=T0)
    assert slurm.grp_tres[(account, "daemon")] == "gres/gpu=6"
    phd_category.max_concurrent_gpus = 4
    phd_category.save()
    result = slurm_policy_sync(admin=SlurmAdmin(slurm), now=T0)
    assert slurm.grp_tres[(account, "nobody")] == "gres/gpu=4"
    assert slurm.grp_tres[(account, "daemon")] == "gres/gpu=6"  # a conflict, not an overwrite
    assert result.conflicts == 1


@pytest.mark.django_db
def test_a_member_without_a_portal_association_submits_under_their_default_account(
    alice: Any, phd_category: Any
) -> None:
    assert member_account(category_id=phd_category.pk, unix_user="nobody") == ""
    assert member_account(category_id=None, unix_user="nobody") == ""


# -- projects as wckeys -------------------------------------------------------------------


def test_sacctmgr_wckeys_are_parsed_with_the_default_marker_read_as_the_same_pair() -> None:
    text = "vision|nobody|labportal\n*vision|nobody|labportal\nnlp|daemon|labportal\n*|root|x\n"
    assert parse_wckeys(text) == {("nobody", "vision"), ("daemon", "nlp")}


def test_a_wckey_slurm_assigned_by_default_is_not_a_project_the_member_named() -> None:
    base = {"job_id": 7, "time": {}, "state": {"current": "COMPLETED"}}
    named = parse_accounting_job({**base, "wckey": {"wckey": "vision", "flags": []}})
    default = parse_accounting_job(
        {**base, "wckey": {"wckey": "vision", "flags": ["ASSIGNED_DEFAULT"]}}
    )
    assert (named.wckey, default.wckey) == ("vision", "")


@pytest.mark.django_db
def test_project_members_get_its_wckey_and_lose_only_what_the_portal_added(
    alice: Any, bob: Any, charlie: Any
) -> None:
    UnixLogin.objects.create(user=alice, username="nobody")
    UnixLogin.objects.create(user=bob, username="daemon")
    vision = Project.objects.create(name="vision", title="Vision grant", pi=alice)
    vision.members.add(bob, charlie)  # charlie has no unix login: nothing to add in Slurm
    slurm = FakeSlurm()
    slurm.wckeys.add(("daemon", "thesis"))  # the Slurm admin's own
    result = slurm_policy_sync(admin=SlurmAdmin(slurm), now=T0)
    assert result.wckeys_added == 2
    assert slurm.wckeys == {("nobody", "vision"), ("daemon", "vision"), ("daemon", "thesis")}
    assert slurm_policy_sync(admin=SlurmAdmin(slurm), now=T0).wckeys_added == 0  # repeatable

    vision.members.remove(bob)  # bob leaves the project
    assert slurm_policy_sync(admin=SlurmAdmin(slurm), now=T0).wckeys_removed == 1
    assert slurm.wckeys == {("nobody", "vision"), ("daemon", "thesis")}
    Project.objects.filter(pk=vision.pk).update(active=False)  # the project ends
    slurm_policy_sync(admin=SlurmAdmin(slurm), now=T0)
    assert slurm.wckeys == {("daemon", "thesis")}  # the admin's wckey stays


@pytest.mark.django_db
def test_a_plain_job_is_charged_to_the_project_its_wckey_names_only_where_its_member_may(
    alice: Any, bob: Any
) -> None:
    UnixLogin.objects.create(user=alice, username="alice")
    vision = Project.objects.create(name="vision", title="Vision grant", pi=bob)
    vision.members.add(alice)
    Project.objects.create(name="other", title="Someone else's grant", pi=bob)
    records = [
        replace(_ended(51, "alice", gpus=1, seconds=600), wckey="vision"),
        replace(_ended(52, "alice", gpus=1, seconds=600), wckey="other"),
        replace(_ended(53, "alice", gpus=1, seconds=600), wckey="no-such-project"),
        _ended(54, "alice", gpus=1, seconds=600),
    ]
    accounting_reconcile(records=records, now=T0 + timedelta(hours=1))
    projects = dict(SlurmCharge.objects.values_list("slurm_job_id", "project__name"))
    assert projects == {51: "vision", 52: None, 53: None, 54: None}
    # Each is charged to alice as before, whatever its wckey.
    assert LedgerEntry.objects.filter(account__user=alice, kind="charge").count() == 4
