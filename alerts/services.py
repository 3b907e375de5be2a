"""Alert workflows: evaluate the rules, raise and resolve alerts, act after warning, acknowledge."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.db import IntegrityError, transaction
from django.utils import timezone
from django.utils.translation import gettext_lazy as _

from accounts.models import User
from accounts.services import notify
from alerts import rules
from alerts.errors import AlertNotOpen
from alerts.models import Alert, AlertEvent, AlertRule, Kind, QueueAlertPolicy
from alerts.texts import alert_advice, alert_message
from cluster.models import Gpu, Node

log = logging.getLogger(__name__)

# Kinds that tell the job's owner (in the app and by email); the rest tell staff.
OWNER_KINDS = {Kind.IDLE_JOB, Kind.MEMORY_HIGH, Kind.IDLE_SESSION}
STAFF_KINDS = {
    Kind.MEMORY_LEAK,
    Kind.STRAY_PROCESS,
    Kind.GPU_HOT,
    Kind.GPU_ERRORS,
    Kind.NODE_SILENT,
}
# The leak rule's clean-up is asked of the agent again at most this often.
CLEANUP_EVERY_S = 60


@dataclass
class EvaluationReport:
    fired: dict[str, int] = field(default_factory=dict)
    resolved: int = 0
    actions: list[str] = field(default_factory=list)
    open: int = 0


def alerts_evaluate(*, now: datetime | None = None) -> EvaluationReport:
    """Run every enabled rule once: raise new alerts, resolve ended ones, act where due.

    Safe to run twice at once: the partial unique index keeps one open alert per
    kind and subject, and actions are claimed with a conditional update.
    """
    now = now or timezone.now()
    cluster = rules.cluster_read(now=now)
    ended = rules.ended_jobs_in(cluster)
    found: dict[str, list[rules.Finding]] = {
        Kind.IDLE_JOB: rules.idle_jobs(cluster),
        Kind.MEMORY_HIGH: rules.memory_high(cluster),
        Kind.MEMORY_LEAK: rules.memory_leaks(cluster, ended),
        Kind.STRAY_PROCESS: rules.stray_processes(cluster),
        Kind.GPU_HOT: rules.hot_gpus(cluster),
        Kind.GPU_ERRORS: rules.gpu_errors(cluster),
        Kind.NODE_SILENT: rules.silent_nodes(cluster),
        Kind.IDLE_SESSION: (
            rules.idle_sessions(cluster, rules.session_statuses(cluster))
            if cluster.rules[Kind.IDLE_SESSION].enabled
            else []
        ),
    }
    report = EvaluationReport()
    open_alerts = {(a.kind, a.subject): a for a in Alert.objects.open()}
    still_seen: list[int] = []
    for kind, findings in found.items():
        rule = cluster.rules[kind]
        if not rule.enabled:
            findings = []
        seen = set()
        for finding in findings:
            seen.add(finding.subject)
            alert = open_alerts.get((kind, finding.subject))
            if alert is None:
                alert = _alert_fire(finding, rule=rule, now=now)
                if alert is None:
                    continue
                report.fired[kind] = report.fired.get(kind, 0) + 1
            else:
                still_seen.append(alert.pk)
                _alert_refresh(alert, finding)
            action = _alert_act_if_due(alert, finding, rule=rule, now=now)
            if action:
                report.actions.append(f"{alert.subject}:{action}")
        for (open_kind, subject), alert in open_alerts.items():
            if (
                open_kind == kind
                and subject not in seen
                and alert_resolve(alert_id=alert.pk, now=now)
            ):
                report.resolved += 1
    # One statement for every alert that still holds, not one per alert.
    Alert.objects.filter(pk__in=still_seen).update(last_seen_at=now)
    report.open = Alert.objects.open().count()
    return report


def _alert_fire(finding: rules.Finding, *, rule: AlertRule, now: datetime) -> Alert | None:
    """Create the alert and send its first warning, in one transaction."""
    try:
        with transaction.atomic():
            alert = Alert.objects.create(
                kind=finding.kind,
                subject=finding.subject,
                severity=finding.severity,
                params=finding.params,
                job_id=finding.job_id,
                user_id=finding.user_id,
                gpu_id=finding.gpu_id,
                node_id=finding.node_id,
                fired_at=now,
                last_seen_at=now,
                warned_at=now,
                action=finding.action,
                action_due_at=_action_due(finding, now),
            )
            AlertEvent.objects.create(
                alert=alert, kind="fired", data=finding.params, created_at=now
            )
            _alert_tell(alert, rule=rule)
    except IntegrityError:  # another evaluation raised it first
        return None
    log.warning("alert %s fired on %s: %s", finding.kind, finding.subject, finding.params)
    return alert


def _action_due(finding: rules.Finding, now: datetime) -> datetime | None:
    if finding.kind == Kind.IDLE_JOB and finding.action != QueueAlertPolicy.Action.WARN:
        return now + timedelta(seconds=finding.grace_s)
    if finding.kind in (Kind.MEMORY_LEAK, Kind.IDLE_SESSION):
        return now + timedelta(seconds=finding.grace_s)
    return None


# Parameters the services add to an alert; a rule's fresh reading keeps them.
SERVICE_PARAMS = ("cleanup_at", "drained")


def _alert_refresh(alert: Alert, finding: rules.Finding) -> None:
    """Keep the alert's figures current (a rising temperature, more memory held)."""
    kept = {key: alert.params[key] for key in SERVICE_PARAMS if key in alert.params}
    params = {**finding.params, **kept}
    if params != alert.params:
        Alert.objects.filter(pk=alert.pk).update(params=params)
        alert.params = params


def _alert_tell(alert: Alert, *, rule: AlertRule) -> None:
    """The warning: to the job's owner for job alerts, to every admin for the rest."""
    title = alert_message(alert.kind, alert.params)
    body = alert_advice(alert.kind, alert.params)
    if alert.kind in OWNER_KINDS and alert.user is not None:
        notify(
            user=alert.user,
            kind=f"alert_{alert.kind}",
            title=title,
            body=body,
            url=f"/jobs/{alert.job_id}/",
            dedupe_key=f"alert:{alert.pk}",
        )
    if alert.kind in STAFF_KINDS:
        _tell_staff(alert, email=rule.email_staff, key=f"alert:{alert.pk}")


def _tell_staff(alert: Alert, *, email: bool, key: str, title: Any = None) -> None:
    for admin in User.objects.filter(is_staff=True, is_active=True):
        notify(
            user=admin,
            kind=f"alert_{alert.kind}",
            title=title or alert_message(alert.kind, alert.params),
            body=alert_advice(alert.kind, alert.params),
            url="/alerts/",
            email=email,
            dedupe_key=key,
        )


def _alert_act_if_due(
    alert: Alert, finding: rules.Finding, *, rule: AlertRule, now: datetime
) -> str:
    """Take the rule's action once its warning went out and the grace ran out; return it."""
    if alert.kind == Kind.MEMORY_LEAK:
        _leak_cleanup_request(alert, now=now)
    if alert.kind in (Kind.GPU_HOT, Kind.GPU_ERRORS):
        # Hardware: staff were told when it fired; drain only where the admin chose it.
        if rule.drain and _claim(alert, now=now, action="drain_gpu"):
            return _gpu_drain(alert)
        return ""
    if alert.action_due_at is None or alert.warned_at is None or now < alert.action_due_at:
        return ""
    if alert.state == Alert.State.ACKNOWLEDGED:
        return ""  # an admin took it over: no automatic action
    if alert.kind == Kind.MEMORY_LEAK and _claim(alert, now=now, action="drain_gpu"):
        # The clean-up did not free the memory: nothing new may start on the GPU.
        return _gpu_drain(alert)
    # An idle session's action is always a stop (end reason "idle").
    idle = alert.kind in (Kind.IDLE_JOB, Kind.IDLE_SESSION)
    if idle and _claim(alert, now=now, action=alert.action):
        return _idle_action(alert)
    return ""


def _claim(alert: Alert, *, now: datetime, action: str) -> bool:
    claimed = Alert.objects.filter(pk=alert.pk, action_taken_at__isnull=True).update(
        action_taken_at=now, action=action
    )
    if claimed:
        alert.action_taken_at, alert.action = now, action
        AlertEvent.objects.create(
            alert=alert, kind="action", data={"action": action}, created_at=now
        )
    return bool(claimed)


def _idle_action(alert: Alert) -> str:
    from jobqueue.services import job_request_stop

    action = alert.action
    if action == QueueAlertPolicy.Action.NOTIFY_STAFF:
        _tell_staff(alert, email=True, key=f"alert:{alert.pk}:staff")
    elif action == QueueAlertPolicy.Action.STOP and alert.job_id:
        job_request_stop(job_id=alert.job_id, reason="idle")
    elif action == QueueAlertPolicy.Action.REQUEUE and alert.job_id:
        # "preempted" is the stop reason the job queue requeues on exit.
        job_request_stop(job_id=alert.job_id, reason="preempted")
    log.warning("idle job alert %s: action %s taken", alert.subject, action)
    return action


def _gpu_drain(alert: Alert) -> str:
    if alert.gpu_id is None:
        return ""
    disabled = Gpu.objects.filter(pk=alert.gpu_id, state=Gpu.State.AVAILABLE).update(
        state=Gpu.State.DISABLED
    )
    # Its shared slots go with it.
    Gpu.objects.filter(parent_id=alert.gpu_id, state=Gpu.State.AVAILABLE).update(
        state=Gpu.State.DISABLED
    )
    if disabled:
        Alert.objects.filter(pk=alert.pk).update(params={**alert.params, "drained": True})
        alert.params = {**alert.params, "drained": True}
    return "drain_gpu"


def _leak_cleanup_request(alert: Alert, *, now: datetime) -> None:
    """Ask the node's agent to remove what provably belongs to this portal's ended jobs."""
    job_ids = [int(j) for j in alert.params.get("job_ids", [])]
    if not job_ids or alert.node_id is None:
        return
    last = alert.params.get("cleanup_at")
    if last is not None and now.timestamp() - float(last) < CLEANUP_EVERY_S:
        return
    node = Node.objects.filter(pk=alert.node_id).first()
    if node is None:
        return
    params = {**alert.params, "cleanup_at": now.timestamp()}
    Alert.objects.filter(pk=alert.pk).update(params=params)
    alert.params = params
    AlertEvent.objects.create(alert=alert, kind="cleanup_requested", data={"job_ids": job_ids})
    from scheduling.dispatch import send_cleanup

    send_cleanup(node=node, job_ids=job_ids)  # signed, after commit; the next evaluation retries


@transaction.atomic
def alert_resolve(*, alert_id: int, now: datetime | None = None) -> bool:
    """Close an open alert whose condition ended; a GPU it took out of service returns."""
    now = now or timezone.now()
    alert = Alert.objects.select_for_update().filter(pk=alert_id).first()
    if alert is None or not alert.is_open:
        return False
    alert.state = Alert.State.RESOLVED
    alert.resolved_at = now
    alert.save(update_fields=["state", "resolved_at"])
    AlertEvent.objects.create(alert=alert, kind="resolved", created_at=now)
    if alert.params.get("drained") and alert.gpu_id is not None:
        Gpu.objects.filter(pk=alert.gpu_id, state=Gpu.State.DISABLED).update(
            state=Gpu.State.AVAILABLE
        )
        Gpu.objects.filter(parent_id=alert.gpu_id, state=Gpu.State.DISABLED).update(
            state=Gpu.State.AVAILABLE
        )
    return True


@transaction.atomic
def alert_acknowledge(*, alert_id: int, actor: User) -> Alert:
    """An admin says they have seen the alert and take it over (no automatic action follows)."""
    alert = Alert.objects.select_for_update().get(pk=alert_id)
    if alert.state == Alert.State.RESOLVED:
        raise AlertNotOpen(_("This alert is already resolved; there is nothing to acknowledge."))
    if alert.state == Alert.State.FIRING:
        alert.state = Alert.State.ACKNOWLEDGED
        alert.acknowledged_at = timezone.now()
        alert.acknowledged_by = actor
        alert.save(update_fields=["state", "acknowledged_at", "acknowledged_by"])
        AlertEvent.objects.create(alert=alert, kind="acknowledged", actor=actor)
    return alert
