"""Report work that writes: queue a replay or a PDF, run it, apply a replayed policy."""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

from django.db import transaction
from django.utils import timezone
from django.utils.translation import gettext as _

from accounts.models import User
from cluster.models import Gpu
from cluster.services import gpu_set_shared_slots
from core.errors import NotAllowed, text_too_long
from jobqueue.models import Queue, SchedulingPolicy
from reports.errors import BadReplay
from reports.models import DemandForecast, PolicyChange, ReportTask
from reports.optional import ReportsExtraMissing
from reports.periods import Period
from reports.replay import (
    ATTAINED_FIRST,
    DEBUG_GPUS,
    DRAIN_RESERVE,
    MAX_GPU_DELTA,
    NULLABLE_QUEUE_LIMITS,
    WEIGHT_FIELDS,
    ReplayOption,
    attained_thresholds_scaled,
    attained_thresholds_text,
    debug_gpu_plan,
    policy_knob_check,
    replay_options,
)

log = logging.getLogger(__name__)
MAX_OPTIONS = 6
MAX_LABEL_CHARS = 80
MAX_GPU_MODEL_CHARS = 120


def _enqueue(task: ReportTask) -> None:
    from reports.tasks import report_task_run

    transaction.on_commit(lambda: report_task_run.delay(task.pk))


def replay_options_parse(raw: object) -> list[ReplayOption]:
    """Validate what-if options given as a list of {label, gpu_delta, gpu_model, policy_changes}."""
    if not isinstance(raw, list) or not 1 <= len(raw) <= MAX_OPTIONS:
        raise BadReplay(_("Give between 1 and %(n)s what-if options.") % {"n": MAX_OPTIONS})
    options = []
    for item in raw:
        if not isinstance(item, dict):
            raise BadReplay(_("Each what-if option must be an object."))
        delta = item.get("gpu_delta", 0)
        if not isinstance(delta, int) or isinstance(delta, bool) or abs(delta) > MAX_GPU_DELTA:
            raise BadReplay(
                _("“gpu_delta” must be a whole number from -%(n)s to %(n)s.") % {"n": MAX_GPU_DELTA}
            )
        changes = item.get("policy_changes") or {}
        if not isinstance(changes, dict) or not all(
            isinstance(v, int | float) and not isinstance(v, bool) for v in changes.values()
        ):
            raise BadReplay(_("“policy_changes” must map setting names to numbers."))
        for name, value in changes.items():
            policy_knob_check(str(name), float(value))
        label, gpu_model = str(item.get("label") or ""), str(item.get("gpu_model") or "")
        for field, value, limit in (
            ("label", label, MAX_LABEL_CHARS),
            ("gpu_model", gpu_model, MAX_GPU_MODEL_CHARS),
        ):
            if len(value) > limit:
                raise BadReplay(text_too_long(field, len(value), limit))
        options.append(
            ReplayOption(
                label=label,
                gpu_delta=delta,
                gpu_model=gpu_model,
                policy_changes={k: float(v) for k, v in changes.items()},
            )
        )
    return options


@transaction.atomic
def report_task_create(
    *, kind: str, requester: User, period: Period, language: str = "en", options: object = None
) -> ReportTask:
    """Queue a replay (staff only) or a PDF for the control worker; returns the task row."""
    params: dict[str, Any] = {}
    total = 1
    if kind == ReportTask.Kind.REPLAY:
        if not requester.is_staff:
            raise NotAllowed(_("Only lab admins can run what-if replays."))
        parsed = replay_options_parse(options)
        params = {"options": [dataclasses.asdict(o) for o in parsed]}
        total = len(parsed)
    elif kind != ReportTask.Kind.PDF:
        raise BadReplay(_("Unknown report task kind “%(kind)s”.") % {"kind": kind[:20]})
    task = ReportTask.objects.create(
        kind=kind,
        requested_by=requester,
        period_start=period.start,
        period_end=period.end,
        language=language,
        params=params,
        progress_total=total,
    )
    _enqueue(task)
    return task


def report_task_run(*, task_id: int) -> None:
    """Do the work of a queued task. Claims it first, so a redelivered message does nothing."""
    claimed = ReportTask.objects.filter(pk=task_id, state=ReportTask.State.QUEUED).update(
        state=ReportTask.State.RUNNING, started_at=timezone.now()
    )
    if not claimed:
        return
    task = ReportTask.objects.select_related("requested_by").get(pk=task_id)
    period = Period("custom", task.period_start, task.period_end)
    try:
        if task.kind == ReportTask.Kind.PDF:
            from reports.pdf import report_pdf

            pdf = report_pdf(period=period, viewer=task.requested_by, language=task.language)
            ReportTask.objects.filter(pk=task_id).update(
                pdf=pdf, state=ReportTask.State.DONE, progress_done=1, finished_at=timezone.now()
            )
            return

        def progress(done: int, total: int) -> None:
            ReportTask.objects.filter(pk=task_id).update(progress_done=done, progress_total=total)

        options = [ReplayOption(**o) for o in task.params.get("options", [])]
        outcomes = replay_options(period=period, options=options, progress=progress)
        ReportTask.objects.filter(pk=task_id).update(
            result={"outcomes": [o.as_dict() for o in outcomes]},
            state=ReportTask.State.DONE,
            finished_at=timezone.now(),
        )
    except BadReplay as exc:
        ReportTask.objects.filter(pk=task_id).update(
            state=ReportTask.State.FAILED, error=str(exc.message), finished_at=timezone.now()
        )
    except ReportsExtraMissing as exc:
        log.error("report task %s: %s", task_id, exc)
        ReportTask.objects.filter(pk=task_id).update(
            state=ReportTask.State.FAILED, error=str(exc), finished_at=timezone.now()
        )
    except Exception:
        log.exception("report task %s failed", task_id)
        ReportTask.objects.filter(pk=task_id).update(
            state=ReportTask.State.FAILED,
            error=_("The task failed on the server; the administrator can see why in the log."),
            finished_at=timezone.now(),
        )
        raise


def _debug_gpus_now() -> int:
    return Gpu.objects.filter(kind=Gpu.Kind.WHOLE, shared_slots__gt=0).count()


def _live_settings(changes: dict[str, Any]) -> dict[str, Any]:
    """Today's value of each setting in `changes`, as the audit log keeps it (the first
    attained-service threshold as the whole list it changes, under "attained_thresholds")."""
    policy = SchedulingPolicy.current()
    values: dict[str, Any] = {}
    for name in changes:
        if name in WEIGHT_FIELDS or name == DRAIN_RESERVE:
            values[name] = getattr(policy, name)
        elif name == ATTAINED_FIRST:
            values["attained_thresholds"] = policy.attained_thresholds
        elif name == DEBUG_GPUS:
            values[name] = _debug_gpus_now()
        else:
            _kind, queue, limit = name.split(":", 2)
            values[name] = getattr(Queue.objects.get(name=queue), limit)
    return values


@transaction.atomic
def policy_apply_from_replay(*, task: ReportTask, option_index: int, actor: User) -> PolicyChange:
    """Apply the policy changes of one replayed option to the live scheduling policy, queues
    and shared-slot GPUs, all or nothing, and log the change with its predicted effect."""
    if not actor.is_staff:
        raise NotAllowed(_("Only lab admins can change the scheduling policy."))
    options = task.params.get("options", [])
    if task.state != ReportTask.State.DONE or not 0 <= option_index < len(options):
        raise BadReplay(_("Apply a policy from a finished replay, choosing one of its options."))
    changes = options[option_index].get("policy_changes") or {}
    if not changes:
        raise BadReplay(_("This option changes no policy setting: there is nothing to apply."))
    for name, value in changes.items():
        policy_knob_check(name, float(value))  # a queue may have gone since the replay
    before = _live_settings(changes)
    policy = SchedulingPolicy.objects.select_for_update().get(pk=SchedulingPolicy.current().pk)
    policy_fields = [n for n in changes if n in WEIGHT_FIELDS or n == DRAIN_RESERVE]
    for name in policy_fields:
        setattr(policy, name, int(changes[name]) if name == DRAIN_RESERVE else float(changes[name]))
    if ATTAINED_FIRST in changes:
        scaled = attained_thresholds_scaled(
            policy.attained_thresholds_gpus(), float(changes[ATTAINED_FIRST])
        )
        policy.attained_thresholds = attained_thresholds_text(scaled)
        policy_fields.append("attained_thresholds")
    if policy_fields:
        policy.save(update_fields=policy_fields)
    for name, value in changes.items():
        if not name.startswith("queue:"):
            continue
        _kind, queue_name, limit = name.split(":", 2)
        queue = Queue.objects.select_for_update().get(name=queue_name)
        number = int(value)
        setattr(queue, limit, None if limit in NULLABLE_QUEUE_LIMITS and number == 0 else number)
        queue.save(update_fields=[limit])
    if DEBUG_GPUS in changes:
        rows = list(
            Gpu.objects.select_related("node", "parent")
            .exclude(state=Gpu.State.MISSING)
            .order_by("node__name", "index", "id")
        )
        for gpu_id, slots in debug_gpu_plan(rows, int(changes[DEBUG_GPUS])).items():
            gpu_set_shared_slots(gpu_id=gpu_id, slots=slots)  # SlotsRefused undoes it all
    outcomes = task.result.get("outcomes", [])
    return PolicyChange.objects.create(
        changed_by=actor,
        replay=task,
        before=before,
        after=_live_settings(changes),
        # outcomes[0] is the recorded history; option i is outcomes[i + 1].
        predicted=outcomes[option_index + 1] if option_index + 1 < len(outcomes) else {},
    )


# A fit takes seconds; one queued fit per data version is enough. The lock lapses after
# this long, so a fit lost with a crashed worker is asked for again by a later page view.
FORECAST_FIT_LOCK_S = 600


def forecast_refresh() -> DemandForecast:
    """Fit the demand forecast on the current data and store it, unless the newest stored
    one was fitted on this very data version (then it is returned as it is): safe to run
    twice. Seconds of statsmodels: the control worker's work, never a web request's."""
    from reports.forecast import demand_forecast, forecast_version, weekly_demand

    version = forecast_version()  # read before the data, so a change during the fit shows
    latest = DemandForecast.objects.order_by("-id").first()
    if latest is not None and latest.version == version:
        return latest
    weeks, history = weekly_demand()
    forecast = demand_forecast(weeks=weeks, history=history)
    row = DemandForecast.objects.create(
        version=version,
        fitted_at=timezone.now(),
        forecast=forecast.to_json() if forecast is not None else None,
    )
    # Only the newest is read; two fits at once each drop only the older rows.
    DemandForecast.objects.filter(id__lt=row.id).delete()
    log.info("demand forecast fitted on data version %s", version)
    return row


def forecast_refresh_enqueue(*, version: str) -> bool:
    """Ask the control worker for a fit on `version`, at most once per version however many
    pages ask (a cache lock); True when this call queued it. A broker that cannot be reached
    is logged and does not fail the page: a later view asks again."""
    from django.core.cache import cache

    from reports.tasks import forecast_refresh as task

    lock = f"reports:forecast:fitting:{version}"
    if not cache.add(lock, 1, FORECAST_FIT_LOCK_S):
        return False

    def send() -> None:
        try:
            task.delay()
        except Exception:
            log.exception("could not queue the demand forecast fit")
            cache.delete(lock)

    transaction.on_commit(send)
    return True
