"""Each job's whole output, kept in the database as chunks by their offset in the output.

A table of chunks (not files) because the writer (the control worker) and the readers
(the web processes) may run on different machines with no disk in common, and because
it works the same on SQLite and PostgreSQL: a chunk is a row, a download reads one row
at a time. A job has one log per attempt (``stream``: the container or Slurm job
whose output it is); pages show the newest.
"""

from __future__ import annotations

from django.db import models
from django.utils.translation import gettext_lazy as _


class JobLog(models.Model):
    """One attempt's output: which bytes are stored, which were dropped, whether it ended."""

    job = models.ForeignKey(
        "jobqueue.Job", on_delete=models.CASCADE, related_name="output_logs", verbose_name=_("job")
    )
    stream = models.CharField(_("stream"), max_length=80)
    stored_bytes = models.BigIntegerField(_("stored bytes"), default=0)
    # The end of the furthest byte received: the size of the output so far.
    received_end = models.BigIntegerField(_("output size"), default=0)
    # Past the head, bytes before this offset were dropped to keep the log under its cap.
    rotated_until = models.BigIntegerField(default=0)
    dropped_bytes = models.BigIntegerField(_("dropped bytes"), default=0)
    # The cap's head, fixed when the log began: the first bytes, always kept.
    head_bytes = models.BigIntegerField(default=0)
    complete = models.BooleanField(_("complete"), default=False)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        verbose_name = _("job log")
        constraints = [
            models.UniqueConstraint(fields=["job", "stream"], name="joblog_one_per_stream"),
        ]

    def __str__(self) -> str:
        return f"job {self.job_id} ({self.stream})"


class JobLogChunk(models.Model):
    """Bytes ``[offset, end)`` of a log's output."""

    log = models.ForeignKey(JobLog, on_delete=models.CASCADE, related_name="chunks")
    offset = models.BigIntegerField()
    end = models.BigIntegerField()
    data = models.BinaryField()

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["log", "offset"], name="joblogchunk_one_per_offset"),
            models.CheckConstraint(
                condition=models.Q(end__gt=models.F("offset")), name="joblogchunk_not_empty"
            ),
        ]
        indexes = [models.Index(fields=["log", "end"], name="joblogchunk_log_end")]

    def __str__(self) -> str:
        return f"{self.log_id}: {self.offset}-{self.end}"
