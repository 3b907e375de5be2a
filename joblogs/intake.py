"""An agent's log chunk, checked (shape, base64, the job is this node's) and stored."""

from __future__ import annotations

import binascii
from base64 import b64decode

from cluster import selectors as cluster_selectors
from cluster.models import RejectedMessage
from cluster.protocol import MessageRefused, decode, malformed
from cluster.services import node_known
from joblogs.services import AppendResult, job_log_append
from protocol.messages import MAX_LOG_CHUNK_BYTES, JobLogChunk


def job_log_chunk_accept(*, node_name: str, chunk: object) -> AppendResult:
    """Store a chunk of a job's output if the job is one this node was given.

    A job that has ended still takes its last chunks (its end event may overtake them).
    """
    message = decode(JobLogChunk, chunk)
    try:
        data = b64decode(message.data, validate=True)
    except (binascii.Error, ValueError):
        raise malformed("data must be base64") from None
    if len(data) > MAX_LOG_CHUNK_BYTES:
        raise malformed(f"data holds {len(data)} bytes, more than {MAX_LOG_CHUNK_BYTES}")
    if not cluster_selectors.job_is_on_named_node(job_id=message.job_id, node_name=node_name):
        node_known(node_name=node_name)
        raise MessageRefused(
            RejectedMessage.Reason.JOB_NOT_ON_NODE, f"job {message.job_id} (log chunk)"
        )
    return job_log_append(
        job_id=message.job_id,
        stream=message.stream,
        offset=message.offset,
        data=data,
        final=message.final,
    )
