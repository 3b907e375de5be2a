"""The Slurm admin commands the lab's rules need: sacctmgr and scontrol, run on the portal host.

slurmrestd 22.05 (v0.0.38) cannot set a job's nice value nor create reservations, so the
rules (policy, reservations) use the commands, as a Slurm operator: the portal's service
user needs ``AdminLevel=Operator`` in sacctmgr (or to be SlurmUser/root). Members' jobs are
never submitted through here (that is ``slurm.cli``, as the member's own unix user).

Every reader parses ``--parsable2 --noheader`` output (``|``-separated), so the parsers
are plain functions with unit tests; the runner is injectable for them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime

from slurm.cli import portal_commands

Runner = Callable[[Sequence[str]], str]

# sacctmgr's columns, in the order the parsers read them.
ACCOUNT_FORMAT = "Account,Organization,Description"
ASSOC_FORMAT = "Account,User,Share,QOS,DefaultQOS,ParentName,GrpTRES"
# The queue limits the portal sets on a queue's QOS (slurm.policy._sync_queue_limits).
QOS_LIMITS_FORMAT = "Name,MaxJobsPU,MaxTRESPU,MaxTRES,MaxWall"
USER_FORMAT = "User,DefaultAccount"
WCKEY_FORMAT = "WCKey,User"


@dataclass(frozen=True)
class SlurmAccount:
    name: str
    organization: str = ""
    description: str = ""


@dataclass(frozen=True)
class SlurmAssociation:
    """One association row: an account's own (user "") or a user's under an account."""

    account: str
    user: str = ""
    shares: int | None = None  # None: "parent" or unset
    qos: frozenset[str] = frozenset()
    default_qos: str = ""
    parent: str = ""
    grp_tres: str = ""  # e.g. "gres/gpu=2": what all of the association's running jobs may hold


@dataclass(frozen=True)
class QosLimits:
    """The limits of one QOS that the portal manages, as sacctmgr prints them ("" for none)."""

    name: str
    max_jobs_per_user: str = ""
    max_tres_per_user: str = ""
    max_tres_per_job: str = ""
    max_wall: str = ""


@dataclass(frozen=True)
class PendingJob:
    job_id: int
    user: str
    nice: int
    qos: str = ""


@dataclass(frozen=True)
class SlurmReservationInfo:
    name: str
    users: frozenset[str]
    nodes: str
    start: str
    end: str
    core_count: int | None = None


def _rows(text: str) -> list[list[str]]:
    return [line.split("|") for line in text.splitlines() if line.strip()]


def parse_accounts(text: str) -> list[SlurmAccount]:
    """``sacctmgr -Pn show account format=Account,Organization,Description``."""
    return [
        SlurmAccount(
            name=r[0],
            organization=r[1] if len(r) > 1 else "",
            description=r[2] if len(r) > 2 else "",
        )
        for r in _rows(text)
    ]


def _shares(value: str) -> int | None:
    value = value.strip()
    return int(value) if value.isdigit() else None


def parse_associations(text: str) -> list[SlurmAssociation]:
    """``sacctmgr -Pn show assoc format=Account,User,Share,QOS,DefaultQOS,ParentName,GrpTRES``."""
    out = []
    for r in _rows(text):
        r = (r + [""] * 7)[:7]
        out.append(
            SlurmAssociation(
                account=r[0],
                user=r[1],
                shares=_shares(r[2]),
                qos=frozenset(q for q in r[3].split(",") if q),
                default_qos=r[4],
                parent=r[5],
                grp_tres=r[6],
            )
        )
    return out


def parse_qos_limits(text: str) -> dict[str, QosLimits]:
    """``sacctmgr -Pn show qos format=Name,MaxJobsPU,MaxTRESPU,MaxTRES,MaxWall``, by name."""
    found = {}
    for r in _rows(text):
        r = (r + [""] * 5)[:5]
        found[r[0]] = QosLimits(*(value.strip() for value in r))
    return found


def tres_gpus(tres: str) -> str:
    """The untyped ``gres/gpu`` count of a TRES list ("cpu=4,gres/gpu=2" → "2"), "" if none."""
    for part in tres.split(","):
        name, _sep, value = part.partition("=")
        if name.strip() == "gres/gpu":
            return value.strip()
    return ""


def wall_minutes(text: str) -> str:
    """A Slurm duration ([days-]hours:minutes:seconds, or minutes) in whole minutes, "" if none."""
    text = text.strip()
    if not text or text.upper() in ("UNLIMITED", "INFINITE"):
        return ""
    days, _sep, clock = text.rpartition("-")
    parts = [int(p) for p in clock.split(":")]
    if len(parts) == 1:
        seconds = parts[0] * 60
    else:
        parts = [0] * (3 - len(parts)) + parts
        seconds = parts[0] * 3600 + parts[1] * 60 + parts[2]
    seconds += int(days or 0) * 86400
    return str(-(-seconds // 60))


def parse_users(text: str) -> dict[str, str]:
    """``sacctmgr -Pn show user format=User,DefaultAccount``: user → default account."""
    return {r[0]: (r[1] if len(r) > 1 else "") for r in _rows(text)}


def parse_wckeys(text: str) -> set[tuple[str, str]]:
    """``sacctmgr -Pn show wckey format=WCKey,User``: the (user, wckey) pairs. Slurm lists a
    user's default wckey a second time with a leading ``*``; that row is the same pair."""
    pairs = set()
    for row in _rows(text):
        if len(row) > 1 and row[1] and row[0].lstrip("*"):
            pairs.add((row[1], row[0].lstrip("*")))
    return pairs


def parse_pending_jobs(text: str) -> list[PendingJob]:
    """``squeue -h -t PD -o '%i|%u|%y|%q'``: id, user, nice, QOS of every pending job."""
    jobs = []
    for r in _rows(text):
        if len(r) < 3 or not r[0].strip().isdigit():
            continue  # array tasks print as 12_[1-3]; their nice is set on the array job
        jobs.append(
            PendingJob(
                job_id=int(r[0]),
                user=r[1].strip(),
                nice=int(r[2]) if r[2].strip().lstrip("-").isdigit() else 0,
                qos=r[3].strip() if len(r) > 3 else "",
            )
        )
    return jobs


def parse_reservations(text: str) -> list[SlurmReservationInfo]:
    """``scontrol show reservation -o``: one ``Key=Value ...`` line per reservation."""
    found = []
    for line in text.splitlines():
        fields = dict(part.split("=", 1) for part in line.split() if "=" in part)
        if "ReservationName" not in fields:
            continue
        users = fields.get("Users", "")
        cores = fields.get("CoreCnt", "")
        found.append(
            SlurmReservationInfo(
                name=fields["ReservationName"],
                users=frozenset(u for u in users.split(",") if u and u != "(null)"),
                nodes=fields.get("Nodes", ""),
                start=fields.get("StartTime", ""),
                end=fields.get("EndTime", ""),
                core_count=int(cores) if cores.isdigit() else None,
            )
        )
    return found


@dataclass(frozen=True)
class PriorityFactors:
    """One pending job's priority as ``sprio`` breaks it down: each part is Slurm's
    ``PriorityWeight*`` setting times that factor; the nice value is subtracted."""

    priority: int
    age: int
    fairshare: int
    jobsize: int
    partition: int
    qos: int
    nice: int


SPRIO_FORMAT = "%i|%Y|%A|%F|%J|%P|%Q|%N"


def parse_priority_factors(text: str) -> dict[int, PriorityFactors]:
    """``sprio -h -o SPRIO_FORMAT``: job id → its factors (lines that do not parse skipped)."""
    found = {}
    for line in text.splitlines():
        parts = [p.strip() for p in line.split("|")]
        if len(parts) != 8:
            continue
        try:
            job_id, *numbers = (int(float(p or 0)) for p in parts)
        except ValueError:
            continue
        found[job_id] = PriorityFactors(*numbers)
    return found


def slurm_time(moment: datetime) -> str:
    """A time as scontrol reads it: the controller's local time, to the second."""
    return moment.astimezone().strftime("%Y-%m-%dT%H:%M:%S")


class SlurmAdmin:
    """sacctmgr / scontrol / squeue through one runner (``argv`` → stdout, SlurmError on failure)."""

    def __init__(self, runner: Runner | None = None, *, cluster: str = "") -> None:
        self.run = runner or command_runner()
        self.cluster = cluster

    def where_cluster(self) -> list[str]:
        return [f"cluster={self.cluster}"] if self.cluster else []

    # -- reading ----------------------------------------------------------------------

    def accounts(self) -> list[SlurmAccount]:
        return parse_accounts(
            self.run(["sacctmgr", "-Pn", "show", "account", f"format={ACCOUNT_FORMAT}"])
        )

    def associations(self) -> list[SlurmAssociation]:
        return parse_associations(
            self.run(
                [
                    "sacctmgr",
                    "-Pn",
                    "show",
                    "assoc",
                    *self.where_cluster(),
                    f"format={ASSOC_FORMAT}",
                ]
            )
        )

    def users(self) -> dict[str, str]:
        return parse_users(self.run(["sacctmgr", "-Pn", "show", "user", f"format={USER_FORMAT}"]))

    def wckeys(self) -> set[tuple[str, str]]:
        """Every (user, wckey) the cluster's accounting has."""
        return parse_wckeys(
            self.run(
                [
                    "sacctmgr",
                    "-Pn",
                    "show",
                    "wckey",
                    *self.where_cluster(),
                    f"format={WCKEY_FORMAT}",
                ]
            )
        )

    def qos_priorities(self) -> dict[str, int]:
        """Every QOS and its priority."""
        rows = _rows(self.run(["sacctmgr", "-Pn", "show", "qos", "format=Name,Priority"]))
        return {r[0]: int(r[1]) if len(r) > 1 and r[1].isdigit() else 0 for r in rows}

    def qos_limits(self) -> dict[str, QosLimits]:
        """Every QOS and the limits the portal may set on it."""
        return parse_qos_limits(
            self.run(["sacctmgr", "-Pn", "show", "qos", f"format={QOS_LIMITS_FORMAT}"])
        )

    def pending_jobs(self) -> list[PendingJob]:
        return parse_pending_jobs(self.run(["squeue", "-a", "-h", "-t", "PD", "-o", "%i|%u|%y|%q"]))

    def priority_factors(self, job_ids: list[int]) -> dict[int, PriorityFactors]:
        """What makes up each pending job's priority (``sprio``); jobs not pending are absent."""
        if not job_ids:
            return {}
        text = self.run(["sprio", "-h", "-j", ",".join(map(str, job_ids)), "-o", SPRIO_FORMAT])
        return parse_priority_factors(text)

    def reservations(self) -> list[SlurmReservationInfo]:
        text = self.run(["scontrol", "show", "reservation", "-o"])
        return [] if "No reservations" in text else parse_reservations(text)

    # -- writing ------------------------------------------------------------------------

    def sacctmgr(self, *argv: str) -> str:
        return self.run(["sacctmgr", "-i", *argv])

    def scontrol(self, *argv: str) -> str:
        return self.run(["scontrol", *argv])


def command_runner() -> Runner:
    """The commands with the portal's slurm.conf (LABPORTAL_SLURM_CONF), as the portal's own user."""
    client = portal_commands()
    return lambda argv: client._run(list(argv), timeout=120)
