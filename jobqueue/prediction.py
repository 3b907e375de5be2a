"""Predicted run times for the estimated starts, learnt from the owner's finished jobs."""

from __future__ import annotations

from jobqueue.models import Job
from scheduler.predict import JobFeatures, RuntimePredictor

HISTORY = 200


def features_of(job: Job) -> JobFeatures:
    return JobFeatures(
        user=job.owner.username,
        image=job.image.reference,
        command=job.command_display,
        gpus=job.gpus,
    )


def job_predict_runtime(job: Job) -> int:
    """Seconds the job will probably run, from the same user's recent completed jobs; at most its limit."""
    predictor = RuntimePredictor()
    finished = (
        Job.objects.filter(
            owner_id=job.owner_id,
            state=Job.State.COMPLETED,
            started_at__isnull=False,
            ended_at__isnull=False,
        )
        .select_related("owner", "image")
        .order_by("-ended_at")[:HISTORY]
    )
    if job.pk is not None:
        finished = finished.exclude(pk=job.pk)
    # Oldest first, so the predictor's window keeps the most recent runs.
    for past in reversed(list(finished)):
        assert past.started_at is not None and past.ended_at is not None
        predictor.observe(
            features_of(past), (past.ended_at - past.started_at).total_seconds(), past.time_limit_s
        )
    return max(1, round(predictor.predict(features_of(job), float(job.time_limit_s))))
