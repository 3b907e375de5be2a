"""The admin's Slurm setup check: what the portal could not do in Slurm, and how to fix it.

Every refused ``sacctmgr`` change of the policy pass is kept as an open ``SetupProblem``
(logged once, when first seen, instead of every minute), with the command a Slurm
administrator runs to fix it. A full pass closes the problems it no longer met: the
change went through, or is no longer wanted.
"""

from __future__ import annotations

import getpass
import logging
import shlex
from collections.abc import Iterable, Sequence

from django.db import IntegrityError, transaction
from django.utils import timezone
from django.utils.translation import gettext as _

from slurm.rules_models import SetupProblem

log = logging.getLogger(__name__)

PERMISSION_WORDS = ("permission denied", "access/permission", "not authorized", "insufficient")


def portal_slurm_user() -> str:
    """The unix user the portal's Slurm commands run as (whose admin level counts)."""
    return getpass.getuser()


def problem_key(argv: Sequence[str]) -> str:
    return shlex.join(["sacctmgr", *argv])[:300]


def fix_for(argv: Sequence[str], message: str) -> str:
    """What a Slurm administrator runs: the refused change itself, and, where Slurm refused
    it for want of rights, the admin level that lets the portal do it from then on."""
    by_hand = shlex.join(["sacctmgr", "-i", *argv])
    lowered = message.lower()
    if any(word in lowered for word in PERMISSION_WORDS):
        user = portal_slurm_user()
        level = shlex.join(
            ["sacctmgr", "-i", "modify", "user", f"name={user}", "set", "adminlevel=Administrator"]
        )
        return _(
            "Slurm refused the change for want of rights: the portal's user %(user)s needs "
            "Slurm's Administrator level (Operator may not create or change QOS). As root, run\n"
            "%(level)s\n"
            "or make the change by hand once:\n%(by_hand)s"
        ) % {"user": user, "level": level, "by_hand": by_hand}
    return _(
        "Check the message, then make the change by hand as a Slurm administrator:\n%(cmd)s"
    ) % {"cmd": by_hand}


def record_failure(argv: Sequence[str], message: str) -> SetupProblem:
    """Keep a refused change as an open problem (one per change); log it only when it is new."""
    key = problem_key(argv)
    now = timezone.now()
    message = message.strip()[:500]
    problem = SetupProblem.objects.open().filter(key=key).first()
    if problem is not None:
        SetupProblem.objects.filter(pk=problem.pk).update(
            last_seen=now, message=message, times=problem.times + 1
        )
        log.debug("%s still refused: %s", key, message)
        return problem
    try:
        with transaction.atomic():
            problem = SetupProblem.objects.create(
                key=key, message=message, fix=fix_for(argv, message), first_seen=now, last_seen=now
            )
    except IntegrityError:  # a concurrent pass recorded it first
        return SetupProblem.objects.open().get(key=key)
    log.warning("Slurm refused %s: %s (see the admin's Slurm setup check)", key, message)
    return problem


def close_unseen(failed_keys: Iterable[str]) -> int:
    """After a full pass: close every open problem the pass did not meet again."""
    return (
        SetupProblem.objects.open()
        .exclude(key__in=list(failed_keys))
        .update(resolved_at=timezone.now())
    )


def open_problem_count() -> int:
    return SetupProblem.objects.open().count()
