"""Predicted run times for the estimated starts, learnt from the owner's finished jobs."""

from __future__ import annotations

from jobqueue.models import Job
from scheduler.predict import JobFeatures, RuntimePredictor, command_shape_key

HISTORY = 200


def features_of(job: Job) -> JobFeatures:
    return JobFeatures(
        user=job.owner.username,
        image=job.image.reference,
        shape=job.command_shape_key or command_shape_key(job.command_display),
        gpus=job.gpus,
    )


def job_predict_runtime(job: Job) -> int:
    """Seconds the job will probably run, from the same user's recent completed jobs; at most its limit.

    Each past job is matched by the shape key stored when it was submitted: the cost
    does not grow with the length of its command.
    """
    predictor = RuntimePredictor()
    finished = Job.objects.filter(
        owner_id=job.owner_id,
        state=Job.State.COMPLETED,
        started_at__isnull=False,
        ended_at__isnull=False,
    )
    if job.pk is not None:
        finished = finished.exclude(pk=job.pk)
    history = finished.order_by("-ended_at").values_list(
        "image__reference", "command_shape_key", "gpus", "started_at", "ended_at", "time_limit_s"
    )[:HISTORY]
    username = job.owner.username
    # Oldest first, so the predictor's window keeps the most recent runs.
    for image, shape, gpus, started, ended, limit in reversed(list(history)):
        assert started is not None and ended is not None  # filtered above
        features = JobFeatures(user=username, image=image, shape=shape, gpus=gpus)
        predictor.observe(features, (ended - started).total_seconds(), limit)
    return max(1, round(predictor.predict(features_of(job), float(job.time_limit_s))))
