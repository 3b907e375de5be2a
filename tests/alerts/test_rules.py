"""Each rule fires once, deduplicates, resolves when its condition ends, and acts only after its warning."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.db import IntegrityError

from accounts.models import Notification
from alerts.models import Alert, AlertRule, Kind, QueueAlertPolicy
from cluster.models import Gpu, Node
from jobqueue.models import Job, JobEvent, Queue
from tests.alerts.conftest import proc, run_job, samples

pytestmark = pytest.mark.django_db

MIN = timedelta(minutes=1)


def gpus_of(cluster: Any) -> list[Gpu]:
    return list(Gpu.objects.filter(node=cluster[0]).order_by("index"))


def open_alerts(kind: str) -> list[Alert]:
    return list(Alert.objects.open().filter(kind=kind))


# --- idle jobs ---------------------------------------------------------------------


def test_an_idle_job_is_warned_once_and_nothing_else_happens_by_default(
    cluster: Any, alice: Any, t0: Any, sent_tasks: Any, evaluate: Any
) -> None:
    gpu = gpus_of(cluster)[0]
    job = run_job(alice, [gpu], started=t0 - 40 * MIN)
    samples(gpu, start=t0 - 35 * MIN, end=t0, util=1.0)

    report = evaluate(t0)
    evaluate(t0 + MIN)  # the next beat: same condition, no second alert

    [alert] = open_alerts(Kind.IDLE_JOB)
    assert report.fired == {Kind.IDLE_JOB: 1}
    assert alert.job_id == job.pk and alert.user_id == alice.pk and alert.warned_at == t0
    assert f"Job #{job.pk} has kept its GPUs under 5% utilisation for 30 minutes" in alert.message
    notes = Notification.objects.filter(user=alice, kind="alert_idle_job")
    assert notes.count() == 1
    assert "cancel the job" in notes.get().body and "this queue only warns" in notes.get().body
    # Hours later: the queue's action is "warn", so the job is never stopped.
    samples(gpu, start=t0 + MIN, end=t0 + 180 * MIN, util=1.0)
    evaluate(t0 + 180 * MIN)
    assert not sent_tasks.named("agent.stop_job")
    assert Job.objects.get(pk=job.pk).stop_requested_at is None


def test_an_idle_job_is_stopped_only_after_its_warning_and_grace_where_the_queue_says_stop(
    cluster: Any, alice: Any, t0: Any, sent_tasks: Any, evaluate: Any
) -> None:
    QueueAlertPolicy.objects.create(
        queue=Queue.objects.get(name="normal"), idle_action="stop", idle_grace_s=20 * 60
    )
    gpu = gpus_of(cluster)[0]
    job = run_job(alice, [gpu], started=t0 - 40 * MIN)
    samples(gpu, start=t0 - 35 * MIN, end=t0 + 25 * MIN, util=0.5)

    evaluate(t0)
    [alert] = open_alerts(Kind.IDLE_JOB)
    assert alert.action_due_at == t0 + 20 * MIN
    assert "the job is stopped in 20 minutes" in Notification.objects.get(user=alice).body

    evaluate(t0 + 19 * MIN)
    assert not sent_tasks.named("agent.stop_job")

    report = evaluate(t0 + 20 * MIN)
    evaluate(t0 + 21 * MIN)  # a repeated beat stops nothing twice
    assert report.actions == [f"job:{job.pk}:stop"]
    [stop] = sent_tasks.named("agent.stop_job")
    assert stop[1][0] == job.pk and stop[1][2] == "idle"
    assert JobEvent.objects.filter(job=job, kind="stop_requested").count() == 1


def test_stop_and_requeue_always_leave_the_owner_time_after_the_warning(
    cluster: Any, alice: Any, t0: Any, sent_tasks: Any, evaluate: Any
) -> None:
    QueueAlertPolicy.objects.create(
        queue=Queue.objects.get(name="normal"), idle_action="requeue", idle_grace_s=0
    )
    gpu = gpus_of(cluster)[0]
    job = run_job(alice, [gpu], started=t0 - 40 * MIN)
    samples(gpu, start=t0 - 35 * MIN, end=t0 + 10 * MIN, util=0.0)

    evaluate(t0)
    evaluate(t0 + MIN)
    assert not sent_tasks.named("agent.stop_job")  # grace 0 is raised to the minimum warning
    evaluate(t0 + 5 * MIN)
    [stop] = sent_tasks.named("agent.stop_job")
    assert stop[1][0] == job.pk and stop[1][2] == "preempted"  # requeued when it exits


def test_an_acknowledged_idle_alert_takes_no_automatic_action(
    cluster: Any, alice: Any, admin_user: Any, t0: Any, sent_tasks: Any, evaluate: Any
) -> None:
    from alerts.services import alert_acknowledge

    QueueAlertPolicy.objects.create(
        queue=Queue.objects.get(name="normal"), idle_action="stop", idle_grace_s=600
    )
    gpu = gpus_of(cluster)[0]
    run_job(alice, [gpu], started=t0 - 40 * MIN)
    samples(gpu, start=t0 - 35 * MIN, end=t0 + 20 * MIN, util=0.0)
    evaluate(t0)
    alert_acknowledge(alert_id=open_alerts(Kind.IDLE_JOB)[0].pk, actor=admin_user)
    evaluate(t0 + 20 * MIN)
    assert not sent_tasks.named("agent.stop_job")


def test_the_idle_alert_resolves_when_the_job_uses_its_gpus_again(
    cluster: Any, alice: Any, t0: Any, evaluate: Any
) -> None:
    gpu = gpus_of(cluster)[0]
    run_job(alice, [gpu], started=t0 - 40 * MIN)
    samples(gpu, start=t0 - 35 * MIN, end=t0, util=1.0)
    evaluate(t0)
    samples(gpu, start=t0 + MIN, end=t0 + 2 * MIN, util=90.0)
    report = evaluate(t0 + 2 * MIN)
    assert report.resolved == 1
    alert = Alert.objects.get(kind=Kind.IDLE_JOB)
    assert alert.state == Alert.State.RESOLVED and alert.resolved_at == t0 + 2 * MIN
    assert list(alert.events.values_list("kind", flat=True)) == ["fired", "resolved"]
    # A new idle spell later is a new alert; the old one stays for audit.
    samples(gpu, start=t0 + 3 * MIN, end=t0 + 40 * MIN, util=1.0)
    evaluate(t0 + 40 * MIN)
    assert Alert.objects.filter(kind=Kind.IDLE_JOB).count() == 2


def test_a_job_is_not_called_idle_on_a_gap_in_its_data_or_when_one_of_its_gpus_works(
    cluster: Any, alice: Any, t0: Any, evaluate: Any
) -> None:
    a, b, c = gpus_of(cluster)[:3]
    run_job(alice, [a], started=t0 - 40 * MIN)
    samples(a, start=t0 - 5 * MIN, end=t0, util=0.0)  # only the last 5 minutes known
    run_job(alice, [b, c], started=t0 - 40 * MIN)
    samples(b, start=t0 - 35 * MIN, end=t0, util=0.0)
    samples(c, start=t0 - 35 * MIN, end=t0, util=60.0)
    evaluate(t0)
    assert open_alerts(Kind.IDLE_JOB) == []


def test_the_debug_queue_is_stricter_and_tells_the_admins(
    cluster: Any, alice: Any, admin_user: Any, t0: Any, evaluate: Any
) -> None:
    # The data migration's policy for the debug queue (a transactional flush may drop it).
    QueueAlertPolicy.objects.get_or_create(
        queue=Queue.objects.get(name="debug"),
        defaults={"idle_action": "notify_staff", "idle_window_s": 600, "idle_grace_s": 600},
    )
    gpu = gpus_of(cluster)[0]
    job = run_job(alice, [gpu], started=t0 - 12 * MIN, queue="debug")
    samples(gpu, start=t0 - 11 * MIN, end=t0 + 10 * MIN, util=0.0)
    evaluate(t0)
    assert open_alerts(Kind.IDLE_JOB)[0].job_id == job.pk
    assert not Notification.objects.filter(user=admin_user).exists()
    evaluate(t0 + 10 * MIN)
    assert Notification.objects.filter(user=admin_user, kind="alert_idle_job").count() == 1


# --- memory --------------------------------------------------------------------------


def test_a_job_near_its_gpu_memory_is_warned_and_a_slot_job_is_judged_on_its_share(
    cluster: Any, alice: Any, bob: Any, t0: Any, evaluate: Any
) -> None:
    whole, shared = gpus_of(cluster)[:2]
    big = run_job(alice, [whole], started=t0 - 10 * MIN)
    samples(whole, start=t0 - MIN, end=t0, mem_used_mb=80_000)
    Gpu.objects.filter(pk=shared.pk).update(shared_slots=2)
    slot_a = Gpu.objects.create(
        node=shared.node,
        index=shared.index,
        uuid=f"{shared.uuid}/slot0",
        model=shared.model,
        memory_mb=shared.memory_mb // 2,
        kind=Gpu.Kind.SLOT,
        parent=shared,
    )
    slot_b = Gpu.objects.create(
        node=shared.node,
        index=shared.index,
        uuid=f"{shared.uuid}/slot1",
        model=shared.model,
        memory_mb=shared.memory_mb // 2,
        kind=Gpu.Kind.SLOT,
        parent=shared,
    )
    greedy = run_job(bob, [slot_a], started=t0 - 10 * MIN, queue="debug")
    modest = run_job(alice, [slot_b], started=t0 - 10 * MIN, queue="debug")
    samples(
        shared,
        start=t0 - MIN,
        end=t0,
        mem_used_mb=45_000,
        processes=[proc(11, 40_000, greedy), proc(12, 5_000, modest)],
    )
    evaluate(t0)
    found = {a.job_id: a for a in open_alerts(Kind.MEMORY_HIGH)}
    assert set(found) == {big.pk, greedy.pk}
    assert found[greedy.pk].params["limit_mb"] == 40_960
    assert found[greedy.pk].user_id == bob.pk
    assert Notification.objects.filter(user=bob, kind="alert_memory_high").count() == 1


def test_memory_held_on_a_gpu_with_no_job_is_a_leak_that_drains_the_gpu_after_its_grace(
    cluster: Any, admin_user: Any, t0: Any, evaluate: Any
) -> None:
    gpu = gpus_of(cluster)[0]
    samples(gpu, start=t0 - 5 * MIN, end=t0 + 15 * MIN, mem_used_mb=30_000)
    evaluate(t0)
    [alert] = open_alerts(Kind.MEMORY_LEAK)
    assert alert.gpu_id == gpu.pk and alert.severity == "critical"
    assert "nvidia-smi --gpu-reset -i 0" in alert.advice
    assert Notification.objects.filter(user=admin_user, kind="alert_memory_leak").count() == 1
    evaluate(t0 + 9 * MIN)
    assert Gpu.objects.get(pk=gpu.pk).state == Gpu.State.AVAILABLE
    evaluate(t0 + 10 * MIN)
    assert Gpu.objects.get(pk=gpu.pk).state == Gpu.State.DISABLED
    # Freed (say, after a reset): resolved, and the GPU is back in service.
    samples(gpu, start=t0 + 16 * MIN, end=t0 + 17 * MIN, mem_used_mb=3)
    evaluate(t0 + 17 * MIN)
    assert Alert.objects.get(pk=alert.pk).state == Alert.State.RESOLVED
    assert Gpu.objects.get(pk=gpu.pk).state == Gpu.State.AVAILABLE


def test_a_gpu_just_released_by_a_job_is_not_called_leaking(
    cluster: Any, alice: Any, t0: Any, evaluate: Any
) -> None:
    gpu = gpus_of(cluster)[0]
    job = run_job(alice, [gpu], started=t0 - 30 * MIN)
    job.allocations.update(active=False, released_at=t0 - MIN)
    samples(gpu, start=t0 - 5 * MIN, end=t0, mem_used_mb=30_000)
    evaluate(t0)
    assert open_alerts(Kind.MEMORY_LEAK) == []


def test_processes_of_an_ended_job_are_a_leak_and_the_agent_is_asked_to_clean_them_up(
    cluster: Any, alice: Any, bob: Any, t0: Any, sent_tasks: Any, evaluate: Any
) -> None:
    gpu = gpus_of(cluster)[0]
    ended = run_job(alice, [gpu], started=t0 - 30 * MIN)
    ended.allocations.update(active=False, released_at=t0 - 5 * MIN)
    Job.objects.filter(pk=ended.pk).update(state=Job.State.COMPLETED, ended_at=t0 - 5 * MIN)
    current = run_job(bob, [gpu], started=t0 - 4 * MIN)
    samples(
        gpu,
        start=t0 - MIN,
        end=t0,
        processes=[proc(4242, 9_000, ended), proc(5000, 2_000, current)],
    )
    evaluate(t0)
    [alert] = open_alerts(Kind.MEMORY_LEAK)
    assert alert.params["job_ids"] == [ended.pk] and alert.params["pids"] == [4242]
    [cleanup] = sent_tasks.named("agent.cleanup_ended_jobs")
    assert cleanup[1] == [[ended.pk]] and cleanup[2] == f"node.{gpu.node.name}"
    evaluate(t0 + timedelta(seconds=30))  # asked again at most once a minute
    assert len(sent_tasks.named("agent.cleanup_ended_jobs")) == 1


# --- stray processes, hardware, nodes ----------------------------------------------


def test_a_stray_process_is_reported_to_staff_with_its_pid_user_and_memory(
    cluster: Any, admin_user: Any, t0: Any, evaluate: Any
) -> None:
    gpu = gpus_of(cluster)[0]
    samples(gpu, start=t0 - MIN, end=t0, processes=[proc(777, 5_000, unix_user="mallory")])
    evaluate(t0)
    evaluate(t0 + timedelta(seconds=30))
    [alert] = open_alerts(Kind.STRAY_PROCESS)
    assert alert.subject == f"gpu:{gpu.pk}:pid:777"
    assert "pid 777 of user mallory holds 5000 MiB" in alert.message
    assert Notification.objects.filter(user=admin_user).count() == 1
    samples(gpu, start=t0 + MIN, end=t0 + 2 * MIN, processes=[])
    evaluate(t0 + 2 * MIN)
    assert open_alerts(Kind.STRAY_PROCESS) == []


def test_a_hot_gpu_alerts_staff_and_is_drained_only_where_the_admin_chose_it(
    cluster: Any, admin_user: Any, t0: Any, evaluate: Any
) -> None:
    hot, cool = gpus_of(cluster)[:2]
    samples(hot, start=t0 - 3 * MIN, end=t0, temp_c=91.0)
    samples(cool, start=t0 - 3 * MIN, end=t0, temp_c=70.0)
    evaluate(t0)
    assert [a.gpu_id for a in open_alerts(Kind.GPU_HOT)] == [hot.pk]
    assert Gpu.objects.get(pk=hot.pk).state == Gpu.State.AVAILABLE
    AlertRule.objects.create(kind=Kind.GPU_HOT, threshold=85, window_s=120, drain=True)
    evaluate(t0)
    assert Gpu.objects.get(pk=hot.pk).state == Gpu.State.DISABLED
    samples(hot, start=t0 + MIN, end=t0 + 4 * MIN, temp_c=60.0)
    evaluate(t0 + 4 * MIN)
    assert open_alerts(Kind.GPU_HOT) == []
    assert Gpu.objects.get(pk=hot.pk).state == Gpu.State.AVAILABLE


def test_new_ecc_or_xid_errors_alert_and_old_counts_do_not(
    cluster: Any, t0: Any, evaluate: Any
) -> None:
    steady, failing = gpus_of(cluster)[:2]
    samples(steady, start=t0 - 5 * MIN, end=t0, ecc=12)  # an old count that does not grow
    samples(failing, start=t0 - 5 * MIN, end=t0 - MIN, xid=3)
    samples(failing, start=t0 - MIN + timedelta(seconds=30), end=t0, xid=5)
    evaluate(t0)
    [alert] = open_alerts(Kind.GPU_ERRORS)
    assert alert.gpu_id == failing.pk and alert.params == {
        "gpu": failing.label,
        "ecc": 0,
        "xid": 2,
    }


def test_a_silent_node_alerts_and_resolves_when_it_speaks_again(
    cluster: Any, admin_user: Any, t0: Any, evaluate: Any
) -> None:
    node = cluster[0]
    Node.objects.filter(pk=node.pk).update(
        registered_at=t0 - 60 * MIN, last_heartbeat=t0 - 10 * MIN
    )
    Node.objects.filter(pk=cluster[1].pk).update(registered_at=t0 - 60 * MIN, last_heartbeat=t0)
    evaluate(t0)
    [alert] = open_alerts(Kind.NODE_SILENT)
    assert alert.node_id == node.pk and node.name in alert.message
    Node.objects.filter(pk=node.pk).update(last_heartbeat=t0 + MIN)
    evaluate(t0 + MIN)
    assert open_alerts(Kind.NODE_SILENT) == []


def test_a_disabled_rule_fires_nothing_and_closes_its_open_alerts(
    cluster: Any, t0: Any, evaluate: Any
) -> None:
    gpu = gpus_of(cluster)[0]
    samples(gpu, start=t0 - MIN, end=t0, processes=[proc(777, 5_000)])
    evaluate(t0)
    AlertRule.objects.create(kind=Kind.STRAY_PROCESS, enabled=False, threshold=0, window_s=0)
    evaluate(t0 + timedelta(seconds=5))
    assert open_alerts(Kind.STRAY_PROCESS) == []


def test_the_database_keeps_one_open_alert_per_kind_and_subject(db: Any) -> None:
    Alert.objects.create(kind=Kind.GPU_HOT, subject="gpu:1")
    Alert.objects.create(kind=Kind.GPU_HOT, subject="gpu:1", state=Alert.State.RESOLVED)
    with pytest.raises(IntegrityError):
        Alert.objects.create(kind=Kind.GPU_HOT, subject="gpu:1", state=Alert.State.ACKNOWLEDGED)
