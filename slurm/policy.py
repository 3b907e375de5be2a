"""The lab's rules as Slurm configuration: accounts and shares, grant and emergency QOS, and a
lower priority for members at zero credit. One pass (``slurm_policy_sync``) reconciles it all.

What the portal manages, and the conflict rule (docs/slurm.md, "What LabPortal changes"):

- It manages only what it created or added, each recorded as a ``ManagedValue`` with the
  value both sides last agreed on. Every other account, association, QOS and limit in
  Slurm belongs to the Slurm admin and is never changed.
- For a managed value the pass is a three-way merge against that base: a change made
  only in the portal is pushed to Slurm; a change made only in Slurm (by hand) is taken
  into the portal (a category's fair-share weight follows ``sacctmgr``); a change on both
  sides to different values is a *conflict*: neither side is touched and an open
  ``PolicyConflict`` waits for an admin, who keeps one side or the other.
- Categories become accounts ``lp-<name>`` (Organization "labportal") under
  ``LABPORTAL_SLURM_ACCOUNT_PARENT``, with the category's fair-share weight as shares;
  each member with a unix login gets an association in their category's account.
- Limits (docs/slurm.md, "Every rule on the rules page in Slurm"): a queue's limits are
  its QOS's (MaxJobsPerUser, MaxTRESPerUser and MaxTRESPerJob in gres/gpu, MaxWall); a
  category's "GPUs at once" is GrpTRES=gres/gpu=N on each member's association in the
  category's account, which the member's portal jobs run in (``member_account``). Each
  is a managed value: a hand edit of a queue's QOS limit is taken into the queue, a hand
  edit on one member's association is that member's exception and is left alone.
- An approved priority grant, while in force, adds the grant queue's QOS to each of the
  member's associations; when it lapses, the portal removes what it added (a QOS the
  admin had given by hand stays).
- An approved emergency, while in force, adds the top QOS to the member's associations
  and moves the named jobs to it; afterwards pending jobs go back to their QOS. How many
  emergencies a member may have is the portal's rule (EmergencyRequest limits).
- A member at zero credit or below keeps running: their pending jobs get a nice value
  larger than any priority the weights can give, so they start after every job of a
  member with credit; when credit returns the nice goes back to 0. Only jobs at exactly
  the portal's nice value are reset, so a nice set by hand is left alone. A job under the
  emergency QOS or a grant queue's QOS is never niced (and loses the portal's nice): an
  approved emergency or grant wins over the credit penalty.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models.functions import Least
from django.utils import timezone

from accounts.models import Category, CreditAccount, Project
from jobqueue.models import EmergencyRequest, PriorityGrant, Queue
from slurm.admin_commands import QosLimits, SlurmAdmin, SlurmAssociation, tres_gpus, wall_minutes
from slurm.cli import SlurmError
from slurm.models import QueueMapping, SlurmJob, UnixLogin
from slurm.rules_models import ManagedValue, PolicyConflict
from slurm.setup_check import close_unseen, record_failure, record_host_problem_seen

log = logging.getLogger(__name__)

PORTAL_ORGANIZATION = "labportal"
NICE_MAX = 2147483645  # Slurm's largest nice (NICE_OFFSET - 3)


# -- the pure rules ----------------------------------------------------------------------


class Merge(StrEnum):
    NONE = "none"  # both sides agree with the base
    PUSH = "push"  # the portal changed it: write the portal's value to Slurm
    PULL = "pull"  # Slurm's admin changed it: take Slurm's value into the portal
    AGREE = "agree"  # both changed to the same value, or first sight of an equal value
    CONFLICT = "conflict"  # both changed differently, or Slurm holds a value the portal never set


def three_way(*, base: str | None, portal: str, slurm: str | None) -> Merge:
    """What to do with one managed value; ``None`` means never agreed / absent in Slurm."""
    if base is None:
        if slurm is None:
            return Merge.PUSH
        return Merge.AGREE if slurm == portal else Merge.CONFLICT
    portal_changed = portal != base
    slurm_changed = slurm != base
    if not portal_changed and not slurm_changed:
        return Merge.NONE
    if portal_changed and not slurm_changed:
        return Merge.PUSH
    if slurm_changed and not portal_changed:
        return Merge.PULL if slurm is not None else Merge.CONFLICT
    return Merge.AGREE if slurm == portal else Merge.CONFLICT


def account_name_for(category_name: str, prefix: str = "lp-") -> str:
    """A Slurm account name for a category: lower case, [a-z0-9_-], at most 30 characters."""
    slug = re.sub(r"[^a-z0-9]+", "-", category_name.lower()).strip("-") or "category"
    return (prefix + slug)[:30].rstrip("-")


@dataclass(frozen=True)
class QosChange:
    user: str
    account: str
    qos: str
    add: bool


def qos_changes(
    *,
    associations: Iterable[SlurmAssociation],
    wanted: dict[str, set[str]],
    managed_qos: set[str],
    added_by_portal: set[tuple[str, str, str]],
) -> list[QosChange]:
    """The QOS to add to or remove from each member's associations.

    ``wanted`` maps unix user → the managed QOS they should have now. A QOS is removed
    only where the portal added it (``added_by_portal`` holds (user, account, qos)).
    """
    changes = []
    for assoc in associations:
        if not assoc.user or assoc.user not in wanted:
            continue
        for qos in sorted(managed_qos):
            has = qos in assoc.qos
            want = qos in wanted[assoc.user]
            if want and not has:
                changes.append(QosChange(assoc.user, assoc.account, qos, add=True))
            elif not want and has and (assoc.user, assoc.account, qos) in added_by_portal:
                changes.append(QosChange(assoc.user, assoc.account, qos, add=False))
    return changes


def nice_changes(
    *,
    pending: Iterable[tuple[int, str, int, str]],
    zero_credit_users: set[str],
    nice: int,
    exempt_qos: Iterable[str] = (),
) -> list[tuple[int, int]]:
    """(job id, new nice) for pending (job id, user, nice, QOS) jobs: ``nice`` for members at
    zero credit whose jobs are at 0, back to 0 for the others' jobs still at the portal's value.

    A job under an ``exempt_qos`` (the emergency QOS, a grant queue's QOS) is never niced:
    an approved emergency or priority grant wins over the credit penalty, as in agents mode."""
    exempt = set(exempt_qos)
    out = []
    for job_id, user, current, qos in pending:
        penalised = user in zero_credit_users and qos not in exempt
        if penalised and current == 0:
            out.append((job_id, nice))
        elif not penalised and current == nice:
            out.append((job_id, 0))
    return out


def zero_credit_nice(config_text: str) -> int:
    """One more than the largest priority the multifactor weights can give (scontrol show config)."""
    total = 0
    for match in re.finditer(r"^PriorityWeight\w+\s*=\s*(\d+)", config_text, re.MULTILINE):
        total += int(match.group(1))
    return min(NICE_MAX, max(total, 1) + 1)


# -- the pass ----------------------------------------------------------------------------


@dataclass
class PolicyResult:
    accounts_created: int = 0
    shares_pushed: int = 0
    shares_pulled: int = 0
    associations_added: int = 0
    associations_removed: int = 0
    wckeys_added: int = 0
    wckeys_removed: int = 0
    qos_added: int = 0
    qos_removed: int = 0
    jobs_moved: int = 0
    nice_changed: int = 0
    limits_pushed: int = 0
    limits_pulled: int = 0
    conflicts: int = 0
    errors: list[str] = field(default_factory=list)
    failed_keys: list[str] = field(default_factory=list)


def _managed() -> dict[str, str]:
    return dict(ManagedValue.objects.values_list("key", "value"))


def _remember(key: str, value: str) -> None:
    ManagedValue.objects.update_or_create(key=key, defaults={"value": value})


def _forget(key: str) -> None:
    ManagedValue.objects.filter(key=key).delete()


def _conflict(key: str, *, base: str | None, portal: str, slurm: str | None) -> bool:
    """Record an open conflict (once per key); True when it is new."""
    try:
        with transaction.atomic():
            _obj, created = PolicyConflict.objects.open().get_or_create(
                key=key,
                defaults={
                    "base_value": base or "",
                    "portal_value": portal,
                    "slurm_value": "(absent)" if slurm is None else slurm,
                },
            )
    except IntegrityError:
        return False
    if created:
        log.warning("Slurm policy conflict on %s: portal %s, Slurm %s", key, portal, slurm)
    return created


def policy_conflict_resolve(*, conflict_id: int, keep: str) -> PolicyConflict:
    """An admin's decision: ``keep="portal"`` writes the portal's value to Slurm on the next
    pass, ``keep="slurm"`` takes Slurm's value into the portal."""
    if keep not in ("portal", "slurm"):
        raise ValueError("keep is 'portal' or 'slurm'")
    with transaction.atomic():
        conflict = PolicyConflict.objects.select_for_update().get(pk=conflict_id)
        if conflict.resolved_at is None:
            # The next pass's merge does the work: with the base at the other side's
            # value, the kept side is the only one that "changed".
            slurm_value = "" if conflict.slurm_value == "(absent)" else conflict.slurm_value
            base = slurm_value if keep == "portal" else conflict.portal_value
            if keep == "portal" and conflict.slurm_value == "(absent)":
                _forget(conflict.key)
            else:
                _remember(conflict.key, base)
            conflict.resolved_at = timezone.now()
            conflict.resolution = keep
            conflict.save(update_fields=["resolved_at", "resolution"])
    return conflict


def _run(admin: SlurmAdmin, result: PolicyResult, *argv: str) -> bool:
    try:
        admin.sacctmgr(*argv)
    except SlurmError as exc:
        message = str(exc)
        if "Nothing" in message and ("modified" in message or "new" in message):
            return True  # already as wanted
        result.errors.append(f"sacctmgr {' '.join(argv)}: {message}")
        result.failed_keys.append(record_failure(argv, message).key)
        return False
    return True


def _sync_accounts(
    admin: SlurmAdmin, result: PolicyResult, managed: dict[str, str]
) -> dict[int, str]:
    """Categories → accounts and shares; returns category id → its account."""
    prefix = getattr(settings, "LABPORTAL_SLURM_ACCOUNT_PREFIX", "lp-")
    parent = getattr(settings, "LABPORTAL_SLURM_ACCOUNT_PARENT", "root")
    accounts = {a.name: a for a in admin.accounts()}
    shares = {a.account: a.shares for a in admin.associations() if not a.user}
    by_category: dict[int, str] = {}
    for category in Category.objects.order_by("pk"):
        name_key = f"account:category:{category.pk}"
        name = managed.get(name_key) or account_name_for(category.name, prefix)
        existing = accounts.get(name)
        if existing is None:
            if _run(
                admin,
                result,
                "add",
                "account",
                name,
                f"parent={parent}",
                f"organization={PORTAL_ORGANIZATION}",
                f"description={category.name[:60]}",
                f"fairshare={category.fairshare_weight}",
                *admin.where_cluster(),
            ):
                result.accounts_created += 1
                _remember(name_key, name)
                _remember(f"share:{name}", str(category.fairshare_weight))
                by_category[category.pk] = name
            continue
        if existing.organization != PORTAL_ORGANIZATION:
            # The admin's own account of that name: never taken over.
            if _conflict(name_key, base=None, portal=name, slurm=f"account {name} not LabPortal's"):
                result.conflicts += 1
            continue
        if name_key not in managed:
            _remember(name_key, name)
        by_category[category.pk] = name
        share_key = f"share:{name}"
        slurm_value = shares.get(name)
        slurm_text = None if slurm_value is None else str(slurm_value)
        portal_text = str(category.fairshare_weight)
        base = managed.get(share_key)
        merge = three_way(base=base, portal=portal_text, slurm=slurm_text)
        if merge == Merge.PUSH:
            if _run(
                admin,
                result,
                "modify",
                "account",
                "where",
                f"name={name}",
                *admin.where_cluster(),
                "set",
                f"fairshare={portal_text}",
            ):
                _remember(share_key, portal_text)
                result.shares_pushed += 1
        elif merge == Merge.PULL and slurm_value is not None:
            Category.objects.filter(pk=category.pk).update(fairshare_weight=max(1, slurm_value))
            _remember(share_key, str(max(1, slurm_value)))
            result.shares_pulled += 1
        elif merge == Merge.AGREE:
            _remember(share_key, portal_text)
        elif merge == Merge.CONFLICT and _conflict(
            share_key, base=base, portal=portal_text, slurm=slurm_text
        ):
            result.conflicts += 1
    return by_category


def _delete_user_row(admin: SlurmAdmin, result: PolicyResult, unix: str, which: str) -> bool:
    """``sacctmgr delete user where name=<unix> <which>``: one association or wckey."""
    return _run(
        admin, result, "delete", "user", "where", f"name={unix}", which, *admin.where_cluster()
    )


def _sync_memberships(
    admin: SlurmAdmin, result: PolicyResult, managed: dict[str, str], by_category: dict[int, str]
) -> None:
    """Each member with a unix login gets an association in their category's account."""
    associations = admin.associations()
    have = {(a.user, a.account) for a in associations if a.user}
    defaults = admin.users()
    ours = set(by_category.values())
    for login in UnixLogin.objects.select_related("user").order_by("pk"):
        unix = login.username
        wanted = by_category.get(login.user.category_id) if login.user.category_id else None
        if wanted and (unix, wanted) not in have:
            args = ["add", "user", unix, f"account={wanted}", *admin.where_cluster()]
            if unix not in defaults:
                args.append(f"defaultaccount={wanted}")
            if _run(admin, result, *args):
                result.associations_added += 1
                _remember(f"assoc:{unix}:{wanted}", "1")
        elif wanted:
            _remember(f"assoc:{unix}:{wanted}", "1")
        # A category change: leave the old portal account (only what the portal added).
        for user, account in sorted(have):
            if user != unix or account == wanted or account not in ours:
                continue
            if f"assoc:{unix}:{account}" not in managed:
                continue
            if wanted and defaults.get(unix) == account:
                _run(
                    admin,
                    result,
                    "modify",
                    "user",
                    "where",
                    f"name={unix}",
                    "set",
                    f"defaultaccount={wanted}",
                )
            if _delete_user_row(admin, result, unix, f"account={account}"):
                result.associations_removed += 1
                _forget(f"assoc:{unix}:{account}")


def _sync_wckeys(admin: SlurmAdmin, result: PolicyResult, managed: dict[str, str]) -> None:
    """Each active project is a wckey of every member who may charge it (its PI and members
    with a unix login), so Slurm keeps their ``--wckey=<project>`` and sacct and sreport
    report the GPU time per project. A wckey the portal added goes when the member leaves
    the project or the project ends; the admin's own wckeys are never touched."""
    logins = dict(UnixLogin.objects.values_list("user_id", "username"))
    wanted: set[tuple[str, str]] = set()
    for project in Project.objects.filter(active=True).prefetch_related("members"):
        who = {m.pk for m in project.members.all()} | ({project.pi_id} if project.pi_id else set())
        wanted.update((logins[pk], project.name) for pk in who if pk in logins)
    have = admin.wckeys()
    for unix, wckey in sorted(wanted):
        key = f"wckey:{unix}:{wckey}"
        if (unix, wckey) in have:
            continue  # the portal's from an earlier pass, or one Slurm had: left as it is
        if _run(admin, result, "add", "user", unix, f"wckey={wckey}", *admin.where_cluster()):
            result.wckeys_added += 1
            _remember(key, "1")
    for key in sorted(k for k in managed if k.startswith("wckey:")):
        _prefix, unix, wckey = key.split(":", 2)
        if (unix, wckey) in wanted:
            continue
        if (unix, wckey) not in have:
            _forget(key)
            continue
        if _delete_user_row(admin, result, unix, f"wckey={wckey}"):
            result.wckeys_removed += 1
            _forget(key)


def grant_qos_names() -> dict[int, str]:
    """Queue id → QOS of every queue that needs a grant (its mapping's QOS, else its name)."""
    mapped = dict(QueueMapping.objects.values_list("queue_id", "qos"))
    return {
        queue.pk: mapped.get(queue.pk) or queue.name
        for queue in Queue.objects.filter(requires_grant=True)
    }


def top_qos_name() -> str:
    return str(getattr(settings, "LABPORTAL_SLURM_TOP_QOS", "lp-emergency"))


def _ensure_top_qos(admin: SlurmAdmin, result: PolicyResult) -> bool:
    """The emergency channel's QOS, created if missing.

    Slurm divides each QOS priority by the highest one, so a huge top priority would
    squash every other QOS factor to nothing; by default it is one above the highest.
    """
    name = top_qos_name()
    priorities = admin.qos_priorities()
    if name in priorities:
        return True
    configured = int(getattr(settings, "LABPORTAL_SLURM_TOP_QOS_PRIORITY", 0))
    priority = configured or max(priorities.values(), default=0) + 1
    ok = _run(
        admin,
        result,
        "add",
        "qos",
        name,
        f"priority={priority}",
        "description=labportal emergency channel",
    )
    if ok:
        _remember(f"qos:{name}", "created")
    return ok


def _sync_qos(admin: SlurmAdmin, result: PolicyResult, now: datetime) -> None:
    """Grant QOS while a grant is in force, the top QOS while an emergency is; then take them back."""
    logins = dict(UnixLogin.objects.values_list("user_id", "username"))
    grant_qos = grant_qos_names()
    top = top_qos_name()
    has_top = _ensure_top_qos(admin, result)
    wanted: dict[str, set[str]] = {unix: set() for unix in logins.values()}
    for grant in PriorityGrant.objects.in_force(now):
        unix = logins.get(grant.user_id)
        if unix and grant.queue_id in grant_qos:
            wanted[unix].add(grant_qos[grant.queue_id])
    emergencies = list(
        EmergencyRequest.objects.filter(
            state=EmergencyRequest.State.APPROVED, expires_at__gt=now
        ).prefetch_related("jobs")
    )
    if has_top:
        for request in emergencies:
            unix = logins.get(request.user_id)
            if unix:
                wanted[unix].add(top)
    managed_qos = set(grant_qos.values()) | ({top} if has_top else set())
    added = {
        tuple(key.split(":", 1)[1].split("|"))
        for key in ManagedValue.objects.filter(key__startswith="qos-added:").values_list(
            "key", flat=True
        )
    }
    for change in qos_changes(
        associations=admin.associations(),
        wanted=wanted,
        managed_qos=managed_qos,
        added_by_portal=added,  # type: ignore[arg-type]
    ):
        op = "+=" if change.add else "-="
        key = f"qos-added:{change.user}|{change.account}|{change.qos}"
        if _run(
            admin,
            result,
            "modify",
            "user",
            "where",
            f"name={change.user}",
            f"account={change.account}",
            *admin.where_cluster(),
            "set",
            f"qos{op}{change.qos}",
        ):
            if change.add:
                _remember(key, "1")
                result.qos_added += 1
            else:
                _forget(key)
                result.qos_removed += 1
    if has_top:
        _sync_emergency_jobs(admin, result, emergencies, top)


def _sync_emergency_jobs(
    admin: SlurmAdmin, result: PolicyResult, emergencies: list[EmergencyRequest], top: str
) -> None:
    """Named jobs of emergencies in force run under the top QOS; afterwards they go back."""
    in_force = {job.pk for request in emergencies for job in request.jobs.all()}
    slurm_jobs = SlurmJob.objects.filter(job_id__in=in_force, ended_at__isnull=True)
    for record in slurm_jobs:
        key = f"emergency-job:{record.slurm_job_id}"
        if record.qos == top or ManagedValue.objects.filter(key=key).exists():
            continue
        try:
            admin.scontrol("update", f"jobid={record.slurm_job_id}", f"qos={top}")
        except SlurmError as exc:
            result.errors.append(f"job {record.slurm_job_id} → QOS {top}: {exc}")
            continue
        _remember(key, record.qos)
        result.jobs_moved += 1
    for value in ManagedValue.objects.filter(key__startswith="emergency-job:"):
        slurm_job_id = int(value.key.split(":", 1)[1])
        moved = SlurmJob.objects.filter(slurm_job_id=slurm_job_id).first()
        if moved is not None and moved.job_id in in_force and moved.ended_at is None:
            continue
        if (
            moved is not None
            and moved.ended_at is None
            and moved.state == "PENDING"
            and value.value
        ):
            try:
                admin.scontrol("update", f"jobid={slurm_job_id}", f"qos={value.value}")
                result.jobs_moved += 1
            except SlurmError as exc:
                result.errors.append(f"job {slurm_job_id} back to QOS {value.value}: {exc}")
                continue
        value.delete()


def _sync_nice(admin: SlurmAdmin, result: PolicyResult) -> None:
    """Members at zero credit or below: their pending jobs start after everyone else's."""
    configured = int(getattr(settings, "LABPORTAL_SLURM_ZERO_CREDIT_NICE", 0))
    nice = configured or zero_credit_nice(admin.scontrol("show", "config"))
    logins = dict(UnixLogin.objects.values_list("user_id", "username"))
    # As the portal's own scheduler: no credit account counts as zero.
    with_credit = set(CreditAccount.objects.filter(balance__gt=0).values_list("user_id", flat=True))
    zero_users = {unix for user_id, unix in logins.items() if user_id not in with_credit}
    pending = [(j.job_id, j.user, j.nice, j.qos) for j in admin.pending_jobs()]
    exempt = {top_qos_name(), *grant_qos_names().values()}
    for job_id, value in nice_changes(
        pending=pending, zero_credit_users=zero_users, nice=nice, exempt_qos=exempt
    ):
        try:
            admin.scontrol("update", f"jobid={job_id}", f"nice={value}")
        except SlurmError as exc:  # the job may have started meanwhile
            result.errors.append(f"job {job_id} nice={value}: {exc}")
            continue
        result.nice_changed += 1


# -- limits ------------------------------------------------------------------------------

# A queue's limits as its QOS's: (sacctmgr's keyword, the Queue field). Values are kept in
# the portal's form: a number as text, "" for no limit; MaxWall in minutes.
QUEUE_QOS_LIMITS = (
    ("MaxJobsPerUser", "max_running_jobs_per_user"),
    ("MaxTRESPerUser", "max_running_gpus_per_user"),
    ("MaxTRESPerJob", "max_gpus_per_job"),
    ("MaxWall", "max_time_limit_s"),
)


def queue_limit_values(queue: Queue) -> dict[str, str]:
    """The queue's limits in the form they are compared with its QOS's."""
    running_jobs = queue.max_running_jobs_per_user
    running_gpus = queue.max_running_gpus_per_user
    return {
        "MaxJobsPerUser": "" if running_jobs is None else str(running_jobs),
        "MaxTRESPerUser": "" if running_gpus is None else str(running_gpus),
        "MaxTRESPerJob": str(queue.max_gpus_per_job),
        # sbatch gets --time in whole minutes, rounded up: so is the QOS's ceiling.
        "MaxWall": str(-(-queue.max_time_limit_s // 60)),
    }


def qos_limit_values(limits: QosLimits) -> dict[str, str]:
    """The same limits as Slurm holds them on the QOS (only the gres/gpu part of a TRES)."""
    return {
        "MaxJobsPerUser": limits.max_jobs_per_user,
        "MaxTRESPerUser": tres_gpus(limits.max_tres_per_user),
        "MaxTRESPerJob": tres_gpus(limits.max_tres_per_job),
        "MaxWall": wall_minutes(limits.max_wall),
    }


def limit_argument(name: str, value: str) -> str:
    """``sacctmgr … set`` for one limit; -1 clears it (only the gres/gpu part of a TRES)."""
    value = value or "-1"
    return (
        f"{name}=gres/gpu={value}" if name.startswith(("MaxTRES", "GrpTRES")) else f"{name}={value}"
    )


def _slurm_side(base: str | None, slurm: str) -> str | None:
    # A limit Slurm does not have, seen for the first time, is simply absent: the
    # portal's is pushed. Once agreed, "no limit" in Slurm is a value (an admin cleared it).
    return None if base is None and slurm == "" else slurm


def queue_qos_names() -> dict[str, list[Queue]]:
    """QOS → the open queues whose jobs run under it (the mapping's QOS, else the queue's name)."""
    mapped = dict(QueueMapping.objects.values_list("queue_id", "qos"))
    has_mapping = set(mapped)
    by_qos: dict[str, list[Queue]] = {}
    for queue in Queue.objects.filter(is_active=True).order_by("pk"):
        qos = mapped.get(queue.pk) or ("" if queue.pk in has_mapping else queue.name)
        if qos:
            by_qos.setdefault(qos, []).append(queue)
    return by_qos


def _pull_queue_limit(queue: Queue, name: str, field_name: str, value: str) -> bool:
    """Take a hand edit of the queue's QOS into the queue; False where the queue cannot hold it."""
    if value == "":
        if field_name in ("max_gpus_per_job", "max_time_limit_s"):
            return False  # the portal always has these limits
        Queue.objects.filter(pk=queue.pk).update(**{field_name: None})
        return True
    number = int(value)
    if name == "MaxWall":
        seconds = number * 60
        Queue.objects.filter(pk=queue.pk).update(
            max_time_limit_s=seconds,
            default_time_limit_s=Least("default_time_limit_s", seconds),
        )
        return True
    Queue.objects.filter(pk=queue.pk).update(**{field_name: number})
    return True


def _sync_queue_limits(admin: SlurmAdmin, result: PolicyResult, managed: dict[str, str]) -> None:
    """Each open queue's limits on its QOS, merged three ways like the shares."""
    slurm_limits = admin.qos_limits()
    for qos, queues in sorted(queue_qos_names().items()):
        if len(queues) > 1:
            names = ", ".join(q.name for q in queues)
            result.errors.append(
                f"QOS {qos} serves the queues {names}: their limits are not set in Slurm"
            )
            continue
        if qos not in slurm_limits:
            result.errors.append(f"QOS {qos} of queue {queues[0].name} does not exist in Slurm")
            continue
        queue = queues[0]
        portal = queue_limit_values(queue)
        slurm = qos_limit_values(slurm_limits[qos])
        pushes: dict[str, str] = {}
        for name, field_name in QUEUE_QOS_LIMITS:
            key = f"qos-limit:{qos}:{name}"
            base = managed.get(key)
            merge = three_way(base=base, portal=portal[name], slurm=_slurm_side(base, slurm[name]))
            if merge == Merge.PUSH:
                pushes[name] = portal[name]
            elif merge == Merge.AGREE:
                _remember(key, portal[name])
            elif merge == Merge.PULL and _pull_queue_limit(queue, name, field_name, slurm[name]):
                _remember(key, slurm[name])
                result.limits_pulled += 1
            elif merge in (Merge.PULL, Merge.CONFLICT) and _conflict(
                key, base=base, portal=portal[name], slurm=slurm[name]
            ):
                result.conflicts += 1
        changed = {name: value for name, value in pushes.items() if value != slurm[name]}
        if changed and not _run(
            admin,
            result,
            "modify",
            "qos",
            "where",
            f"name={qos}",
            "set",
            *(limit_argument(name, value) for name, value in changed.items()),
        ):
            continue
        for name, value in pushes.items():
            _remember(f"qos-limit:{qos}:{name}", value)
        result.limits_pushed += len(changed)


def _sync_member_limits(
    admin: SlurmAdmin, result: PolicyResult, managed: dict[str, str], by_category: dict[int, str]
) -> None:
    """A category's GPUs at once as GrpTRES=gres/gpu=N on each member's association in its account."""
    held = {(a.user, a.account): tres_gpus(a.grp_tres) for a in admin.associations() if a.user}
    for login in UnixLogin.objects.select_related("user__category").order_by("pk"):
        category = login.user.category
        account = by_category.get(category.pk) if category else None
        if category is None or account is None or (login.username, account) not in held:
            continue
        key = f"assoc-limit:{login.username}|{account}|GrpTRES"
        base = managed.get(key)
        portal = str(category.max_concurrent_gpus)
        slurm = held[(login.username, account)]
        merge = three_way(base=base, portal=portal, slurm=_slurm_side(base, slurm))
        if merge == Merge.PUSH:
            if slurm == portal or _run(
                admin,
                result,
                "modify",
                "user",
                "where",
                f"name={login.username}",
                f"account={account}",
                *admin.where_cluster(),
                "set",
                limit_argument("GrpTRES", portal),
            ):
                _remember(key, portal)
                result.limits_pushed += int(slurm != portal)
        elif merge == Merge.AGREE:
            _remember(key, portal)
        elif merge == Merge.CONFLICT and _conflict(key, base=base, portal=portal, slurm=slurm):
            result.conflicts += 1
        # Merge.PULL: the Slurm admin gave this one member another limit by hand: their
        # exception stays (the base stays, so a later change of the category's limit is a
        # conflict for an admin, not a silent overwrite).


def _sync_account_qos(admin: SlurmAdmin, result: PolicyResult, by_category: dict[int, str]) -> None:
    """The category accounts may use every open queue's QOS that needs no grant.

    The member's portal jobs run in their category's account (``member_account``), so its
    QOS list must name the queues' QOS. A QOS the portal added and an admin then removed
    by hand is not added again."""
    grant_queues = set(grant_qos_names())
    existing = set(admin.qos_priorities())
    wanted = {
        qos
        for qos, queues in queue_qos_names().items()
        if qos in existing and any(q.pk not in grant_queues for q in queues)
    }
    has = {a.account: a.qos for a in admin.associations() if not a.user}
    added = {
        key.split(":", 1)[1]
        for key in ManagedValue.objects.filter(key__startswith="account-qos:").values_list(
            "key", flat=True
        )
    }
    for account in sorted(set(by_category.values())):
        missing = sorted(
            qos for qos in wanted - has.get(account, frozenset()) if f"{account}|{qos}" not in added
        )
        if missing and _run(
            admin,
            result,
            "modify",
            "account",
            "where",
            f"name={account}",
            *admin.where_cluster(),
            "set",
            f"qos+={','.join(missing)}",
        ):
            for qos in missing:
                _remember(f"account-qos:{account}|{qos}", "1")
            result.qos_added += len(missing)


def member_account(*, category_id: int | None, unix_user: str) -> str:
    """The account a member's portal jobs run in: their category's, once the portal has made
    their association there (so its limits apply); "" for the member's default account."""
    if category_id is None:
        return ""
    account = (
        ManagedValue.objects.filter(key=f"account:category:{category_id}")
        .values_list("value", flat=True)
        .first()
    )
    if account and ManagedValue.objects.filter(key=f"assoc:{unix_user}:{account}").exists():
        return account
    return ""


def slurm_grants_sync(
    *, admin: SlurmAdmin | None = None, now: datetime | None = None
) -> PolicyResult:
    """Only the grant and emergency QOS (and the emergency's jobs): what a decision changes,
    pushed right after it; the full pass does the same every minute."""
    admin = admin or SlurmAdmin(cluster=getattr(settings, "LABPORTAL_SLURM_CLUSTER", ""))
    result = PolicyResult()
    _sync_qos(admin, result, now or timezone.now())
    return result


def slurm_policy_sync(
    *, admin: SlurmAdmin | None = None, now: datetime | None = None
) -> PolicyResult:
    """One reconciliation of the lab's rules into Slurm; safe to run twice, or concurrently."""
    admin = admin or SlurmAdmin(cluster=getattr(settings, "LABPORTAL_SLURM_CLUSTER", ""))
    now = now or timezone.now()
    result = PolicyResult()
    managed = _managed()
    by_category = _sync_accounts(admin, result, managed)
    _sync_account_qos(admin, result, by_category)
    _sync_memberships(admin, result, _managed(), by_category)
    _sync_wckeys(admin, result, _managed())
    _sync_member_limits(admin, result, _managed(), by_category)
    _sync_queue_limits(admin, result, _managed())
    _sync_qos(admin, result, now)
    _sync_nice(admin, result)
    close_unseen(result.failed_keys)
    record_host_problem_seen()
    return result
