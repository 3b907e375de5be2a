"""A job's end settles its credits right after its commit: a charge for the work done, a
full refund for a job lost with its node.

A preempted run that goes back to the queue is charged for the time it ran, up to the
moment it was asked to stop (the checkpoint grace is the lab's), at its preemptible rate.

A settle lost here (the worker died after the commit, or it failed) is made up by beat's
``credits_settle_ended_jobs``; both are idempotent.
"""

from __future__ import annotations

from typing import Any

from django.db import transaction
from django.dispatch import receiver
from django.utils.translation import gettext_noop

from credits import services
from jobqueue.models import Job
from jobqueue.signals import job_ended, run_requeued


@receiver(job_ended, dispatch_uid="credits.settle_after_end")
def settle_after_end(sender: Any, job: Job, **kwargs: Any) -> None:
    job_id, state, started = job.pk, job.state, job.started_at is not None

    def settle() -> None:
        if state == Job.State.LOST:
            services.credits_refund_job(
                job_id=job_id, reason=gettext_noop("The node running it was lost.")
            )
        elif started:
            services.credits_settle_job(job_id=job_id)

    transaction.on_commit(settle, robust=True)


@receiver(run_requeued, dispatch_uid="credits.charge_preempted_run")
def charge_preempted_run(
    sender: Any,
    job: Job,
    started_at: Any,
    stop_requested_at: Any,
    preempted: bool,
    **kwargs: Any,
) -> None:
    if not preempted or stop_requested_at is None:
        return
    job_id = job.pk

    def charge() -> None:
        services.credits_settle_preempted_run(
            job_id=job_id, started_at=started_at, until=stop_requested_at
        )

    transaction.on_commit(charge, robust=True)
