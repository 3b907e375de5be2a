"""Starting an interactive session: a job of kind jupyter or terminal, queued like any job."""

from __future__ import annotations

from collections.abc import Iterable
from decimal import Decimal

from django.db import transaction
from django.utils.translation import gettext as _

from accounts.models import User
from jobqueue.errors import JobRefused
from jobqueue.models import Job
from jobqueue.submit import job_submit
from sessions.launch import SESSION_KINDS, session_command


@transaction.atomic
def session_start(
    *,
    owner: User,
    kind: str,
    image: str,
    queue: str = "debug",
    gpus: int = 1,
    shared_slot: bool = False,
    time_limit_s: int | None = None,
    reservation_id: int | None = None,
    mounts: Iterable[str] = (),
    name: str = "",
    cpus: Decimal | float | int = Decimal("4"),
    memory_mb: int = 16384,
) -> Job:
    """Queue a session: same queues, limits, credits, approvals and bookings as any job;
    its command is the server of its kind (``sessions.launch``)."""
    if kind not in SESSION_KINDS:
        raise JobRefused(_("A session is one of: %(kinds)s.") % {"kinds": ", ".join(SESSION_KINDS)})
    return job_submit(
        owner=owner,
        queue=queue,
        image=image,
        command=session_command(kind),
        gpus=gpus,
        shared_slot=shared_slot,
        time_limit_s=time_limit_s,
        reservation_id=reservation_id,
        mounts=mounts,
        cpus=cpus,
        memory_mb=memory_mb,
        name=name or (_("JupyterLab") if kind == "jupyter" else _("Terminal")),
        kind=kind,
    )
