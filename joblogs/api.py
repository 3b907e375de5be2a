"""The API of a job's whole output: read from an offset (to follow it), and download it."""

from __future__ import annotations

from typing import Any

from django.http import StreamingHttpResponse
from django.shortcuts import get_object_or_404
from django.utils.translation import gettext as _
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import serializers
from rest_framework.exceptions import ValidationError
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from joblogs import selectors
from jobqueue.models import Job
from jobqueue.selectors import jobs_visible_to

MAX_TAIL_LINES = 100_000


class JobLogReadSerializer(serializers.Serializer[Any]):
    job = serializers.IntegerField()
    state = serializers.CharField()
    offset = serializers.IntegerField(help_text="Where `text` begins in the job's output (bytes).")
    next_offset = serializers.IntegerField(
        help_text="Ask again from here to follow the output (`?offset=`)."
    )
    text = serializers.CharField(help_text="The output from `offset`, UTF-8; gaps are marked.")
    size = serializers.IntegerField(help_text="The output's size so far, in bytes.")
    dropped_bytes = serializers.IntegerField(
        help_text="Bytes dropped to keep the log under the lab's cap (the middle of the output)."
    )
    complete = serializers.BooleanField(help_text="The job has ended and all its output is here.")
    full = serializers.BooleanField(
        help_text="False: no full log for this job (an agent of an earlier release); `text` is "
        "the tail its end event carried."
    )


def _whole_number(request: Request, name: str, maximum: int) -> int | None:
    raw = request.query_params.get(name)
    if raw is None or raw == "":
        return None
    if not raw.isdigit() or int(raw) > maximum:
        raise ValidationError(
            {name: [_("Give a whole number from 0 to %(max)d.") % {"max": maximum}]}
        )
    return int(raw)


class JobLogView(APIView):
    """A job's output from a byte offset; poll with `?offset=<next_offset>` to follow it."""

    @extend_schema(
        operation_id="jobs_log_read",
        parameters=[
            OpenApiParameter(
                "offset", int, description="Bytes into the output to read from (default 0)."
            ),
            OpenApiParameter(
                "limit",
                int,
                description=f"At most this many bytes (default {selectors.READ_LIMIT_BYTES}, "
                f"at most {selectors.MAX_READ_LIMIT_BYTES}).",
            ),
            OpenApiParameter(
                "tail", int, description="Instead of `offset`: begin at the last N lines."
            ),
        ],
        responses={200: JobLogReadSerializer},
    )
    def get(self, request: Request, pk: int) -> Response:
        job = get_object_or_404(jobs_visible_to(request.user), pk=pk)
        offset = _whole_number(request, "offset", 2**62)
        limit = _whole_number(request, "limit", selectors.MAX_READ_LIMIT_BYTES)
        tail = _whole_number(request, "tail", MAX_TAIL_LINES)
        if offset is not None and tail is not None:
            raise ValidationError({"tail": [_("Give either offset or tail, not both.")]})
        log = selectors.latest_log(job)
        if log is None:
            text = job.log_tail
            body = {"offset": 0, "next_offset": 0, "text": text, "size": len(text.encode())}
            body |= {"dropped_bytes": 0, "complete": job.is_final, "full": False}
            return Response({"job": job.pk, "state": job.state, **body})
        start = selectors.tail_offset(log, tail) if tail is not None else offset or 0
        read = selectors.log_read(log, start, limit or selectors.READ_LIMIT_BYTES)
        return Response(
            {
                "job": job.pk,
                "state": job.state,
                "offset": read.offset,
                "next_offset": read.next_offset,
                "text": read.data.decode("utf-8", "replace"),
                "size": read.size,
                "dropped_bytes": read.dropped_bytes,
                "complete": read.complete,
                "full": True,
            }
        )


class JobLogDownloadView(APIView):
    """The job's whole output as a file (streamed; gaps the cap made are marked)."""

    @extend_schema(
        operation_id="jobs_log_download",
        responses={
            (200, "text/plain"): OpenApiResponse(
                OpenApiTypes.BINARY, description="The output, as the job wrote it."
            )
        },
    )
    def get(self, request: Request, pk: int) -> StreamingHttpResponse:
        job: Job = get_object_or_404(jobs_visible_to(request.user), pk=pk)
        log = selectors.latest_log(job)
        body = selectors.log_bytes(log) if log is not None else iter([job.log_tail.encode()])
        response = StreamingHttpResponse(body, content_type="text/plain; charset=utf-8")
        response["Content-Disposition"] = f'attachment; filename="job-{job.pk}.log"'
        response["X-Content-Type-Options"] = "nosniff"
        return response
