"""The portal side of the outage tests, run in its own process against the private database.

The test process keeps its own (test) database; what it does to the private one goes
through this command, with DATABASE_URL naming it:

    python -m tests.reliability.outage_lab setup NODE      # prints the node token
    python -m tests.reliability.outage_lab submit SHELL    # prints the job's id
    python -m tests.reliability.outage_lab report JOB_ID   # prints what became of it (JSON)
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

IMAGE = "labportal/busybox:test"  # the local runtime ignores it; the allowlist does not


def setup(node_name: str) -> str:
    from cluster.models import NodeToken
    from jobqueue.models import ContainerImage
    from tests.factories import UserFactory

    UserFactory(username="alice")
    ContainerImage.objects.get_or_create(reference=IMAGE)
    _token, secret = NodeToken.issue(node_name=node_name)
    return secret


def submit(shell: str) -> int:
    from accounts.models import User
    from jobqueue.submit import job_submit

    job = job_submit(
        owner=User.objects.get(username="alice"),
        queue="normal",
        image=IMAGE,
        command=["sh", "-c", shell],
        cpus=1,
        memory_mb=256,
        time_limit_s=600,
    )
    return int(job.pk)


def report(job_id: int) -> dict[str, Any]:
    from accounts.models import LedgerEntry
    from cluster.models import RejectedMessage
    from jobqueue.models import Job

    job = Job.objects.get(pk=job_id)
    return {
        "state": job.state,
        "exit_code": job.exit_code,
        "end_reason": job.end_reason,
        "events": list(job.events.order_by("pk").values_list("kind", flat=True)),
        "refunds": LedgerEntry.objects.filter(job=job, kind=LedgerEntry.Kind.REFUND).count(),
        "rejected": [
            {"message": r.message, "reason": r.reason, "count": r.count, "detail": r.last_detail}
            for r in RejectedMessage.objects.all()
        ],
    }


def main(argv: list[str]) -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "labportal.settings")
    import django

    django.setup()
    command, argument = argv
    if command == "setup":
        print(setup(argument))
    elif command == "submit":
        print(submit(argument))
    elif command == "report":
        print(json.dumps(report(int(argument))))
    else:
        raise SystemExit(f"unknown command {command!r}")


if __name__ == "__main__":
    main(sys.argv[1:])
