"""Alert texts: each kind's message and advice, rendered from stored parameters in the reader's language.

Alerts store a code and parameters, never a sentence; these templates turn them
into words at the moment someone reads them (a page, an email, a notification).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from django.utils.functional import lazy
from django.utils.translation import gettext_lazy as _
from django.utils.translation import ngettext_lazy

from alerts.models import Kind, QueueAlertPolicy

MESSAGES = {
    Kind.IDLE_JOB: ngettext_lazy(
        "Job #%(job_id)s has kept its GPUs under %(threshold)s%% utilisation for %(minutes)s minute.",
        "Job #%(job_id)s has kept its GPUs under %(threshold)s%% utilisation for %(minutes)s minutes.",
        "minutes",
    ),
    Kind.MEMORY_HIGH: _(
        "Job #%(job_id)s uses %(used_mb)s MiB of GPU memory on %(gpu)s, %(pct)s%% of its %(limit_mb)s MiB."
    ),
    Kind.MEMORY_LEAK: _(
        "%(gpu)s holds %(used_mb)s MiB of GPU memory while no job runs on it (memory leak)."
    ),
    Kind.STRAY_PROCESS: _(
        "Stray process on %(gpu)s: pid %(pid)s of user %(unix_user)s holds %(used_mb)s MiB and belongs to no job."
    ),
    Kind.GPU_HOT: _("%(gpu)s is at %(temp)s °C, over the limit of %(threshold)s °C."),
    Kind.GPU_ERRORS: _("%(gpu)s reported %(ecc)s new ECC error(s) and %(xid)s new XID error(s)."),
    Kind.NODE_SILENT: _("Node %(node)s has sent no heartbeat since %(since)s."),
    Kind.IDLE_SESSION: ngettext_lazy(
        "Session #%(job_id)s has been idle for %(minutes)s minute.",
        "Session #%(job_id)s has been idle for %(minutes)s minutes.",
        "minutes",
    ),
}

ADVICE = {
    Kind.IDLE_JOB: _(
        "If you are done, cancel the job to release the GPUs; otherwise check that it uses them. "
        "What happens next: %(action)s."
    ),
    Kind.MEMORY_HIGH: _(
        "The job may run out of GPU memory: lower the batch size, or ask for a whole GPU."
    ),
    Kind.MEMORY_LEAK: _(
        "The agent removes leftover processes and containers of ended jobs. If the memory stays "
        "held, the GPU is taken out of service; when it is free, reset it on the node: %(reset)s"
    ),
    Kind.STRAY_PROCESS: _(
        "Someone runs work outside the queue. Ask the user to submit it as a job; the portal "
        "never kills processes that are not its own."
    ),
    Kind.GPU_HOT: _("Check the node's cooling and fans; the GPU may throttle or fail."),
    Kind.GPU_ERRORS: _(
        "Repeated errors mean failing hardware: drain the GPU and check it with nvidia-smi -q."
    ),
    Kind.NODE_SILENT: _(
        "Check that the node is up and its agent running; its jobs are declared lost after the grace period."
    ),
    Kind.IDLE_SESSION: ngettext_lazy(
        "It is stopped in %(grace_min)s minute unless you use it (open it, run a cell, type in its terminal); stop it yourself if you are done.",
        "It is stopped in %(grace_min)s minutes unless you use it (open it, run a cell, type in its terminal); stop it yourself if you are done.",
        "grace_min",
    ),
}

IDLE_ACTION_TEXT: dict[str, Any] = {
    QueueAlertPolicy.Action.WARN: _("nothing more, this queue only warns"),
    QueueAlertPolicy.Action.NOTIFY_STAFF: ngettext_lazy(
        "the lab's admins are told in %(grace_min)s minute",
        "the lab's admins are told in %(grace_min)s minutes",
        "grace_min",
    ),
    QueueAlertPolicy.Action.STOP: ngettext_lazy(
        "the job is stopped in %(grace_min)s minute",
        "the job is stopped in %(grace_min)s minutes",
        "grace_min",
    ),
    QueueAlertPolicy.Action.REQUEUE: ngettext_lazy(
        "the job is stopped and requeued in %(grace_min)s minute",
        "the job is stopped and requeued in %(grace_min)s minutes",
        "grace_min",
    ),
}


def _format(template: Any, values: Mapping[str, Any]) -> str:
    try:
        # A plural text picks its form from the count in the values, so it is formatted
        # as the lazy object, not first made a string.
        return str(template % values)
    except (KeyError, ValueError, TypeError):
        # A parameter missing from an old alert must not break a page: the text unfilled
        # (a plural one, that has no text before its count, in its plural form).
        return str(template) or str(template % 2)


def _render(template: Any, params: Mapping[str, Any]) -> str:
    values = {key: ("?" if value is None else value) for key, value in params.items()}
    if "action" in values and values["action"] in IDLE_ACTION_TEXT:
        values["action"] = _format(
            IDLE_ACTION_TEXT[values["action"]], {"grace_min": values.get("grace_min", "?")}
        )
    return _format(template, values)


def _message(kind: str, params: Mapping[str, Any]) -> str:
    template = MESSAGES.get(kind)  # type: ignore[call-overload]
    return _render(template, params) if template is not None else kind


def _advice(kind: str, params: Mapping[str, Any]) -> str:
    template = ADVICE.get(kind)  # type: ignore[call-overload]
    return _render(template, params) if template is not None else ""


# Lazy: a notification renders them in its reader's language, not the beat's.
alert_message = lazy(_message, str)
alert_advice = lazy(_advice, str)
