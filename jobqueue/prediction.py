"""Predicted run times for the estimated starts, learnt from the owner's finished jobs."""

from __future__ import annotations

from jobqueue import submit_sql
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
    history = submit_sql.finished_runtimes(job.owner_id, excluding=job.pk, limit=HISTORY)
    username = job.owner.username
    # Oldest first, so the predictor's window keeps the most recent runs.
    for image, shape, gpus, ran_s, limit in reversed(history):
        features = JobFeatures(user=username, image=image, shape=shape, gpus=gpus)
        predictor.observe(features, ran_s, limit)
    return max(1, round(predictor.predict(features_of(job), float(job.time_limit_s))))
