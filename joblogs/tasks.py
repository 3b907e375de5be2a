"""The control queue's task for the agents' log chunks: thin, safe to run twice."""

from __future__ import annotations

from typing import Any

from celery import shared_task

from cluster.tasks import report_accept
from joblogs.intake import job_log_chunk_accept


@shared_task(
    name="control.job_log_chunk",
    bind=True,
    max_retries=None,  # retried until LABPORTAL_REPORT_RETRY_S (see report_accept)
    time_limit=60,
    soft_time_limit=50,
    ignore_result=True,
)
def job_log_chunk(self: Any, node_name: str, token: str, chunk: dict[str, Any]) -> str:
    return report_accept(
        self,
        "job_log_chunk",
        node_name,
        token,
        lambda name: job_log_chunk_accept(node_name=name, chunk=chunk),
        [chunk],
    )
