"""Job dependencies, as Slurm's ``--dependency``: ``afterok:12:13`` (start after jobs 12
and 13 have completed with exit code 0) or ``afterany:12`` (after job 12 has ended,
however). labctl/parsing.py parses the same syntax with the same limit (a test holds the
two together); the scheduling pass passes the engine the dependencies still unmet and
cancels a job whose afterok can never be met (``end_reason`` "dependency_failed")."""

from __future__ import annotations

import re
from collections.abc import Iterable

from django.utils.translation import gettext as _

from accounts.models import User
from jobqueue.errors import JobRefused
from jobqueue.models import (
    AFTERANY,
    AFTEROK,
    Job,
    dependency_never_satisfied,
    dependency_satisfied,
)

KINDS = (AFTEROK, AFTERANY)
__all__ = [
    "AFTERANY",
    "AFTEROK",
    "DEPENDENCY_FAILED",
    "KINDS",
    "MAX_DEPENDENCIES",
    "dependencies_for_submit",
    "dependency_never_satisfied",
    "dependency_satisfied",
    "parse_dependency",
]
MAX_DEPENDENCIES = 64
DEPENDENCY_FAILED = "dependency_failed"

_SYNTAX = re.compile(r"^(afterok|afterany)((?::\d+)+)$")


def parse_dependency(text: str) -> tuple[str, list[int]]:
    """(kind, job ids) from Slurm's syntax ``afterok:12:13`` or ``afterany:12``."""
    value = text.strip().lower()
    match = _SYNTAX.match(value)
    if match is None:
        raise JobRefused(
            _(
                "“%(text)s” is not a dependency: write afterok:12:13 (after jobs 12 and 13 completed) or afterany:12 (after job 12 ended, however)."
            )
            % {"text": text}
        )
    ids = list(dict.fromkeys(int(part) for part in match.group(2).split(":")[1:]))
    return match.group(1), ids


def dependencies_for_submit(owner: User, ids: Iterable[int], kind: str) -> list[Job]:
    """The jobs a new job of ``owner`` may wait for, or a refusal that says why not."""
    wanted = list(dict.fromkeys(int(pk) for pk in ids))
    if not wanted:
        return []
    if kind not in KINDS:
        raise JobRefused(
            _("“%(kind)s” is not a kind of dependency: use afterok or afterany.") % {"kind": kind}
        )
    if len(wanted) > MAX_DEPENDENCIES:
        raise JobRefused(
            _("A job may depend on at most %(max)d jobs; this one names %(n)d.")
            % {"max": MAX_DEPENDENCIES, "n": len(wanted)}
        )
    jobs = Job.objects.filter(pk__in=wanted)
    if not owner.is_staff:
        jobs = jobs.filter(owner=owner)
    found = {job.pk: job for job in jobs.only("pk", "state", "exit_code", "owner")}
    missing = [pk for pk in wanted if pk not in found]
    if missing:
        raise JobRefused(
            _("A job can depend only on your own jobs; there is no job %(ids)s of yours.")
            % {"ids": ", ".join(str(pk) for pk in missing)}
        )
    doomed = [
        pk
        for pk in wanted
        if dependency_never_satisfied(kind, found[pk].state, found[pk].exit_code)
    ]
    if doomed:
        raise JobRefused(
            _(
                "Job %(ids)s has already ended without completing, so afterok can never be met; use afterany to run after it anyway."
            )
            % {"ids": ", ".join(str(pk) for pk in doomed)}
        )
    return [found[pk] for pk in wanted]
