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

from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone
from django.utils.translation import gettext as _

from slurm.cli import slurm_host_problem_take
from slurm.rules_models import SetupProblem

log = logging.getLogger(__name__)

PERMISSION_WORDS = ("permission denied", "access/permission", "not authorized", "insufficient")


def portal_slurm_user() -> str:
    """The Slurm user the portal's own commands act as (whose admin level counts): its
    unix user with munge, the service user whose token they carry with JWT."""
    if getattr(settings, "LABPORTAL_SLURM_COMMANDS_AUTH", "munge") == "jwt":
        return str(settings.LABPORTAL_SLURM_SERVICE_USER)
    return getpass.getuser()


# Problems of the portal host itself (sudo, the Slurm commands), as opposed to the
# sacctmgr changes of the policy pass, which that pass closes when it no longer meets them.
HOST_KEY_PREFIX = "portal host: "


def problem_key(argv: Sequence[str]) -> str:
    return shlex.join(["sacctmgr", *argv])[:300]


def host_fix_for(message: str) -> str:
    """What the portal host's administrator does about a command the portal could not run."""
    user = portal_slurm_user()
    if message.startswith("sudo:") or "sudo is not installed" in message:
        return _(
            "The portal runs sbatch and scancel as each member's unix user through sudo. "
            "Install sudo and give the portal's user %(user)s this rule (visudo -f "
            "/etc/sudoers.d/labportal), with your members' group in place of labmembers:\n"
            "%(user)s ALL=(%%labmembers) NOPASSWD: /usr/bin/sbatch, /usr/bin/scancel\n"
            "Or set LABPORTAL_SLURM_REST_URL to use slurmrestd, which needs no sudo."
        ) % {"user": user}
    return _(
        "Install Slurm's client commands and munge on the portal host (Debian: apt-get "
        "install slurm-client munge), with the cluster's slurm.conf and munge key, or set "
        "LABPORTAL_SLURM_REST_URL to use slurmrestd."
    )


def record_host_problem(message: str) -> SetupProblem:
    """Keep a command the portal host could not run as an open problem, one per kind."""
    head = message.split(":", 1)[0] if message.startswith("sudo:") else message
    return _record(f"{HOST_KEY_PREFIX}{head}"[:300], message, host_fix_for(message))


def close_host_problems() -> int:
    """A member's command went through: the portal host's problems are solved."""
    return (
        SetupProblem.objects.open()
        .filter(key__startswith=HOST_KEY_PREFIX)
        .update(resolved_at=timezone.now())
    )


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
    return _record(problem_key(argv), message, fix_for(argv, message.strip()))


def _record(key: str, message: str, fix: str) -> SetupProblem:
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
                key=key, message=message, fix=fix, first_seen=now, last_seen=now
            )
    except IntegrityError:  # a concurrent pass recorded it first
        return SetupProblem.objects.open().get(key=key)
    log.warning("Slurm: %s failed: %s (see the admin's Slurm setup check)", key, message)
    return problem


def close_unseen(failed_keys: Iterable[str]) -> int:
    """After a full pass: close every open problem the pass did not meet again."""
    return (
        SetupProblem.objects.open()
        .exclude(key__startswith=HOST_KEY_PREFIX)
        .exclude(key__in=list(failed_keys))
        .update(resolved_at=timezone.now())
    )


def record_host_problem_seen() -> None:
    """Keep the command the portal host last could not run (noted in the cache by the
    Slurm client, since the member's request that met it was rolled back)."""
    message = slurm_host_problem_take()
    if message:
        record_host_problem(message)


def open_problem_count() -> int:
    record_host_problem_seen()
    return SetupProblem.objects.open().count()
