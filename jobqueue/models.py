"""Work: queues, jobs, their GPU allocations and events, and the admin's allowlists."""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.utils import timezone
from django.utils.translation import gettext
from django.utils.translation import gettext_lazy as _

from core.i18n import in_reader_language
from scheduler.predict import command_shape_key, start_estimate_range

if TYPE_CHECKING:
    from accounts.models import User


class Queue(models.Model):
    """A job queue with a priority tier, a credit rate and limits."""

    name = models.SlugField(_("name"), max_length=32, unique=True)
    title = models.CharField(_("title"), max_length=80)
    description = models.TextField(_("description"), blank=True)
    title_zh_hans = models.CharField(
        _("title in Chinese"),
        max_length=80,
        blank=True,
        help_text=_("Shown to readers of the Chinese pages; empty: they see the English title."),
    )
    description_zh_hans = models.TextField(
        _("description in Chinese"),
        blank=True,
        help_text=_(
            "Shown to readers of the Chinese pages; empty: they see the English description."
        ),
    )
    tier = models.PositiveSmallIntegerField(
        _("priority tier"), default=1, help_text=_("Lower tiers are scheduled first.")
    )
    priority_factor = models.FloatField(
        _("queue factor"),
        default=0.5,
        help_text=_("The queue factor of the multifactor priority, between 0 and 1."),
    )
    credit_rate = models.DecimalField(
        _("credits per GPU-hour"), max_digits=8, decimal_places=3, default=Decimal("1.000")
    )
    usage_factor = models.FloatField(
        _("fair-share usage factor"), default=1.0, validators=[MinValueValidator(0.0)]
    )
    max_gpus_per_job = models.PositiveSmallIntegerField(_("max GPUs per job"), default=8)
    max_time_limit_s = models.PositiveIntegerField(_("max time limit (seconds)"), default=3 * 86400)
    default_time_limit_s = models.PositiveIntegerField(
        _("default time limit (seconds)"), default=4 * 3600
    )
    max_running_jobs_per_user = models.PositiveSmallIntegerField(
        _("max running jobs per user"), null=True, blank=True
    )
    max_running_gpus_per_user = models.PositiveSmallIntegerField(
        _("max running GPUs per user"), null=True, blank=True
    )
    requires_grant = models.BooleanField(_("needs an approved priority grant"), default=False)
    allows_shared_slots = models.BooleanField(_("may use shared slots"), default=False)
    network_egress = models.BooleanField(
        _("jobs may reach the network"),
        default=False,
        help_text=_(
            "Off: job containers have no network at all. On: each job gets a network of its "
            "own with a route out (to download data, say). Before turning it on, firewall the "
            "broker and the database from the GPU servers' container networks."
        ),
    )
    is_active = models.BooleanField(_("open for submissions"), default=True)

    class Meta:
        verbose_name = _("queue")
        verbose_name_plural = _("queues")
        ordering = ["tier", "name"]
        constraints = [
            models.CheckConstraint(
                condition=models.Q(priority_factor__gte=0) & models.Q(priority_factor__lte=1),
                name="queue_priority_factor_0_1",
                violation_error_message=_(
                    "The priority factor is a share from 0 to 1 (e.g. 0.5 halves the queue's "
                    "priority)."
                ),
            ),
            models.CheckConstraint(
                condition=models.Q(default_time_limit_s__lte=models.F("max_time_limit_s")),
                name="queue_default_limit_within_max",
                violation_error_message=_(
                    "The default time limit cannot be longer than the longest time limit: "
                    "shorten the default, or lengthen the longest."
                ),
            ),
        ]

    def __str__(self) -> str:
        return self.name

    @property
    def local_title(self) -> str:
        """The title in the reader's language, falling back to the other one."""
        return in_reader_language(self.title, self.title_zh_hans)

    @property
    def local_description(self) -> str:
        """The description in the reader's language, falling back to the other one."""
        return in_reader_language(self.description, self.description_zh_hans)


class CategoryQueueAllowance(models.Model):
    """A user category's own limits in one queue, in place of the queue's ("newcomers get
    more debug allowance"). An empty limit keeps the queue's."""

    category = models.ForeignKey(
        "accounts.Category",
        verbose_name=_("user category"),
        on_delete=models.CASCADE,
        related_name="queue_allowances",
    )
    queue = models.ForeignKey(
        Queue, verbose_name=_("queue"), on_delete=models.CASCADE, related_name="allowances"
    )
    max_running_jobs_per_user = models.PositiveSmallIntegerField(
        _("max running jobs per user"),
        null=True,
        blank=True,
        help_text=_("Empty: the queue's limit applies."),
    )
    max_running_gpus_per_user = models.PositiveSmallIntegerField(
        _("max running GPUs per user"),
        null=True,
        blank=True,
        help_text=_("Empty: the queue's limit applies."),
    )
    max_gpu_hours_per_week = models.PositiveIntegerField(
        _("max GPU-hours per week per user"),
        null=True,
        blank=True,
        help_text=_(
            "What a member's jobs in this queue may ask for over 7 days: the GPU-hours that "
            "ended jobs ran, plus GPUs times time limit for jobs waiting or running. Empty: no "
            "weekly limit."
        ),
    )

    class Meta:
        verbose_name = _("queue allowance of a category")
        verbose_name_plural = _("queue allowances of categories")
        ordering = ["queue__tier", "queue__name", "category__name"]
        constraints = [
            models.UniqueConstraint(
                fields=["category", "queue"], name="category_queue_allowance_unique"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.category} · {self.queue}"

    def running_jobs_cap(self) -> int | None:
        return (
            self.max_running_jobs_per_user
            if self.max_running_jobs_per_user is not None
            else self.queue.max_running_jobs_per_user
        )

    def running_gpus_cap(self) -> int | None:
        return (
            self.max_running_gpus_per_user
            if self.max_running_gpus_per_user is not None
            else self.queue.max_running_gpus_per_user
        )


class ContainerImage(models.Model):
    """An image members may run. Only allowlisted images are accepted."""

    reference = models.CharField(
        _("image"), max_length=255, unique=True, help_text=_("e.g. pytorch/pytorch:2.4.0-cuda12.1")
    )
    description = models.CharField(_("description"), max_length=200, blank=True)
    enabled = models.BooleanField(_("enabled"), default=True)

    class Meta:
        verbose_name = _("container image")
        verbose_name_plural = _("container images")
        ordering = ["reference"]

    def __str__(self) -> str:
        return self.reference


class VolumeMount(models.Model):
    """A host directory members may mount. `{username}` in the source is the member's name."""

    name = models.SlugField(_("name"), max_length=40, unique=True)
    source_template = models.CharField(
        _("host path"), max_length=255, help_text=_("Absolute path; may contain {username}.")
    )
    target = models.CharField(_("path in the container"), max_length=255)
    read_only = models.BooleanField(_("read-only"), default=True)
    enabled = models.BooleanField(_("enabled"), default=True)

    class Meta:
        verbose_name = _("volume mount")
        verbose_name_plural = _("volume mounts")
        ordering = ["name"]
        constraints = [
            models.CheckConstraint(
                condition=models.Q(source_template__startswith="/"),
                name="volume_source_absolute",
                violation_error_message=_(
                    "The source folder must be an absolute path on the node, starting with / "
                    "(e.g. /data/{user})."
                ),
            ),
            models.CheckConstraint(
                condition=models.Q(target__startswith="/"),
                name="volume_target_absolute",
                violation_error_message=_(
                    "The folder inside the container must be an absolute path, starting with / "
                    "(e.g. /data)."
                ),
            ),
        ]

    def __str__(self) -> str:
        return f"{self.name}: {self.source_template} → {self.target}"

    def source_for(self, username: str) -> str:
        if not re.fullmatch(r"[A-Za-z0-9_.@+-]+", username) or username in {".", ".."}:
            raise ValueError(f"username {username!r} cannot be used in a path")
        return self.source_template.replace("{username}", username)


class StaffDecision(models.Model):
    """What grants and emergency requests share: when they were made, and a staff decision."""

    decided_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    decided_at = models.DateTimeField(null=True, blank=True)
    comment = models.TextField(_("admin comment"), blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        abstract = True


class PriorityGrantQuerySet(models.QuerySet["PriorityGrant"]):
    def in_force(self, at: datetime | None = None) -> PriorityGrantQuerySet:
        """The grants approved and still before their deadline at `at` (default: now)."""
        return self.filter(state=PriorityGrant.State.APPROVED, deadline__gt=at or timezone.now())


class PriorityGrant(StaffDecision):
    """A member's approved right to use a grant-only queue (`high`) until a deadline."""

    class State(models.TextChoices):
        PENDING = "pending", _("pending")
        APPROVED = "approved", _("approved")
        REJECTED = "rejected", _("rejected")
        WITHDRAWN = "withdrawn", _("withdrawn")

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="priority_grants"
    )
    queue = models.ForeignKey(Queue, on_delete=models.PROTECT, related_name="grants")
    reason = models.TextField(_("reason"))
    deadline = models.DateTimeField(_("deadline"))
    gpus_expected = models.PositiveSmallIntegerField(_("GPUs expected"), default=1)
    state = models.CharField(
        _("state"), max_length=16, choices=State.choices, default=State.PENDING
    )

    objects = PriorityGrantQuerySet.as_manager()

    class Meta:
        verbose_name = _("priority grant")
        verbose_name_plural = _("priority grants")
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.user} → {self.queue} until {self.deadline:%Y-%m-%d}"

    def is_in_force(self, at: datetime | None = None) -> bool:
        return self.state == self.State.APPROVED and self.deadline > (at or timezone.now())


# A command typed as one line is stored as this prefix plus the line, and shown as typed.
SHELL_PREFIX = ("/bin/sh", "-c")


def command_text(command: object) -> str:
    """A stored command as the member typed it: shell text as is, an exec vector shell-quoted."""
    if isinstance(command, list):
        if len(command) == 3 and tuple(command[:2]) == SHELL_PREFIX:
            return str(command[2])
        return shlex.join(str(part) for part in command)
    return str(command)


# One limit on a command, however it comes (the web form, the API as a string or a
# list, labctl, which keeps a copy of these numbers): a list is measured as its
# arguments joined by spaces. Longer work belongs in a script in the image or a mount.
MAX_COMMAND_CHARS = 8000
MAX_COMMAND_ARGS = 1000


def command_limit_refusal(command: str | Sequence[object]) -> str | None:
    """Why the command is over the limit, in the reader's language; None when it is not."""
    if isinstance(command, str):
        length = len(command)
    else:
        if len(command) > MAX_COMMAND_ARGS:
            return gettext(
                "The command has %(count)d arguments; at most %(max)d are allowed. "
                "Put the work in a script and run the script."
            ) % {"count": len(command), "max": MAX_COMMAND_ARGS}
        length = sum(len(str(part)) for part in command) + max(0, len(command) - 1)
    if length > MAX_COMMAND_CHARS:
        return gettext(
            "The command is %(length)d characters long; at most %(max)d are allowed. "
            "Put the work in a script and run the script."
        ) % {"length": length, "max": MAX_COMMAND_CHARS}
    return None


MAX_ENV_VARS = 64
MAX_ENV_NAME_CHARS = 128
MAX_ENV_VALUE_CHARS = 4000


def env_limit_refusal(env: Mapping[str, object]) -> str | None:
    """Why a job's environment is over its limits (count, name or value length), or None."""
    if len(env) > MAX_ENV_VARS:
        return gettext("At most %(n)d environment variables are allowed.") % {"n": MAX_ENV_VARS}
    for name, value in env.items():
        if len(str(name)) > MAX_ENV_NAME_CHARS:
            return gettext(
                "An environment variable name is %(length)d characters long; "
                "at most %(max)d are allowed."
            ) % {"length": len(str(name)), "max": MAX_ENV_NAME_CHARS}
        if len(str(value)) > MAX_ENV_VALUE_CHARS:
            return gettext(
                "The value of %(name)s is %(length)d characters long; at most %(max)d are "
                "allowed. Put longer data in a file in a mount."
            ) % {"name": name, "length": len(str(value)), "max": MAX_ENV_VALUE_CHARS}
    return None


class JobQuerySet(models.QuerySet["Job"]):
    def gpu_hours_asked(self, *, now: datetime) -> float:
        """GPU-hours these jobs take against a weekly allowance: what ended jobs ran, and
        GPUs times time limit for jobs still waiting or running (a job cancelled before it
        started takes none)."""
        total_s = 0.0
        for state, gpus, limit_s, started, ended in self.values_list(
            "state", "gpus", "time_limit_s", "started_at", "ended_at"
        ):
            if state in Job.FINAL_STATES:
                if started is not None and ended is not None:
                    total_s += gpus * max(0.0, (ended - started).total_seconds())
            else:
                total_s += gpus * limit_s
        return total_s / 3600

    def pending(self) -> JobQuerySet:
        return self.filter(state__in=Job.WAITING_STATES)

    def active(self) -> JobQuerySet:
        return self.filter(state__in=Job.ACTIVE_STATES)

    def for_user(self, user: User) -> JobQuerySet:
        return self.filter(owner=user)


# Slurm's dependency kinds (jobqueue/dependencies.py): afterok waits for each job to
# complete with exit code 0, afterany for each to end, however.
AFTEROK = "afterok"
AFTERANY = "afterany"
FINAL_JOB_STATES = ("completed", "failed", "cancelled", "timed_out", "lost")


def dependency_satisfied(kind: str, state: str, exit_code: int | None) -> bool:
    """Whether a dependency in ``state`` lets the job start."""
    if kind == AFTERANY:
        return state in FINAL_JOB_STATES
    return state == "completed" and exit_code in (0, None)


def dependency_never_satisfied(kind: str, state: str, exit_code: int | None) -> bool:
    """Whether an afterok dependency ended in a way that can never let the job start."""
    return (
        kind == AFTEROK
        and state in FINAL_JOB_STATES
        and not dependency_satisfied(kind, state, exit_code)
    )


class Job(models.Model):
    """A containerised job: what to run, on how many GPUs, for how long, and what happened."""

    class Kind(models.TextChoices):
        BATCH = "batch", _("batch job")
        # Interactive sessions (sessions/): the portal proxies the member's browser to them.
        JUPYTER = "jupyter", _("JupyterLab session")
        TERMINAL = "terminal", _("terminal session")

    class State(models.TextChoices):
        HELD = "held", _("held")
        PENDING = "pending", _("pending")
        DISPATCHED = "dispatched", _("dispatched")
        RUNNING = "running", _("running")
        COMPLETED = "completed", _("completed")
        FAILED = "failed", _("failed")
        CANCELLED = "cancelled", _("cancelled")
        TIMED_OUT = "timed_out", _("timed out")
        LOST = "lost", _("lost")

    WAITING_STATES = (State.PENDING, State.HELD)
    ACTIVE_STATES = (State.DISPATCHED, State.RUNNING)
    FINAL_STATES = (State.COMPLETED, State.FAILED, State.CANCELLED, State.TIMED_OUT, State.LOST)
    assert tuple(FINAL_STATES) == FINAL_JOB_STATES
    # The job's life (docs/jobs.md): the only moves of `state` there are. Every service
    # changes the state with move_to(), which refuses any other; a final state is final.
    # Waiting → running directly is Slurm's (it reports a start the portal did not send).
    TRANSITIONS: dict[str, frozenset[str]] = {
        State.PENDING: frozenset({State.HELD, State.DISPATCHED, State.RUNNING, *FINAL_STATES}),
        State.HELD: frozenset({State.PENDING, State.RUNNING, *FINAL_STATES}),
        State.DISPATCHED: frozenset({State.RUNNING, State.PENDING, *FINAL_STATES}),
        State.RUNNING: frozenset({State.PENDING, *FINAL_STATES}),
        **{final: frozenset() for final in FINAL_STATES},
    }

    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="jobs"
    )
    queue = models.ForeignKey(Queue, on_delete=models.PROTECT, related_name="jobs")
    name = models.CharField(_("name"), max_length=120, blank=True)
    kind = models.CharField(_("kind"), max_length=16, choices=Kind.choices, default=Kind.BATCH)
    image = models.ForeignKey(ContainerImage, on_delete=models.PROTECT, related_name="jobs")
    command = models.JSONField(
        _("command"),
        help_text=_("The argument vector; a typed line is stored as /bin/sh -c and the line."),
    )
    # command_shape_key of the command, computed once at submit: predicting a job's run
    # time compares it with the owner's recent jobs' keys instead of reshaping each command.
    command_shape_key = models.CharField(max_length=32, blank=True, editable=False)
    env = models.JSONField(_("environment"), default=dict, blank=True)
    mounts = models.ManyToManyField(VolumeMount, blank=True, related_name="jobs")
    gpus = models.PositiveSmallIntegerField(_("GPUs"), default=1)
    shared_slot = models.BooleanField(_("one shared slot"), default=False)
    min_gpu_memory_mb = models.PositiveIntegerField(_("minimum GPU memory (MiB)"), default=0)
    gpu_model = models.CharField(_("GPU model"), max_length=120, blank=True)
    cpus = models.DecimalField(_("CPUs"), max_digits=5, decimal_places=2, default=Decimal("4"))
    memory_mb = models.PositiveIntegerField(_("host memory (MiB)"), default=16384)
    time_limit_s = models.PositiveIntegerField(_("time limit (seconds)"))
    preemptible = models.BooleanField(
        _("preemptible"),
        default=False,
        help_text=_(
            "May be stopped and requeued to make room for an emergency, a booking, a job that "
            "has waited past the lab's limit, or a member under their fair share (see the rules)."
        ),
    )
    reservation = models.ForeignKey(
        "reservations.Reservation",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="jobs",
    )
    # What the GPU time was for (a grant, a shared project): the usage report's per-project
    # table. A project with jobs is ended (active=False), never deleted.
    project = models.ForeignKey(
        "accounts.Project",
        verbose_name=_("project"),
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="jobs",
    )
    state = models.CharField(
        _("state"), max_length=16, choices=State.choices, default=State.PENDING, db_index=True
    )
    hold_reason = models.CharField(_("hold reason"), max_length=200, blank=True)
    node = models.ForeignKey(
        "cluster.Node", null=True, blank=True, on_delete=models.SET_NULL, related_name="jobs"
    )
    submitted_at = models.DateTimeField(_("submitted"), default=timezone.now, db_index=True)
    dispatched_at = models.DateTimeField(null=True, blank=True)
    # Each dispatch is an attempt; a requeued job runs again under a higher number.
    dispatch_count = models.PositiveIntegerField(default=0)
    # How many times it was preempted and requeued (any reason): after the policy's
    # preempt_max_times, a waiting job or a member's share no longer stops it.
    preemption_count = models.PositiveIntegerField(_("times preempted"), default=0)
    started_at = models.DateTimeField(_("started"), null=True, blank=True)
    ended_at = models.DateTimeField(_("ended"), null=True, blank=True)
    exit_code = models.IntegerField(_("exit code"), null=True, blank=True)
    end_reason = models.CharField(_("end reason"), max_length=200, blank=True)
    container_id = models.CharField(max_length=80, blank=True)
    log_tail = models.TextField(_("log tail"), blank=True)
    predicted_runtime_s = models.PositiveIntegerField(null=True, blank=True)
    # Written by each scheduling pass for the pages and the API.
    queue_position = models.PositiveIntegerField(null=True, blank=True)
    estimated_start = models.DateTimeField(null=True, blank=True)
    pending_reason = models.CharField(max_length=32, blank=True)
    priority = models.FloatField(null=True, blank=True)
    emergency_until = models.DateTimeField(null=True, blank=True)
    soft_warned_at = models.DateTimeField(null=True, blank=True)
    stop_requested_at = models.DateTimeField(null=True, blank=True)
    # The control messages of this run that the node has not confirmed yet: a start is
    # confirmed by the node's heartbeat or its "started" event, a stop by "exited".
    start_sent_at = models.DateTimeField(null=True, blank=True)
    start_resends = models.PositiveSmallIntegerField(default=0)
    stop_sent_at = models.DateTimeField(null=True, blank=True)
    stop_resends = models.PositiveSmallIntegerField(default=0)
    # Since when the node's heartbeats contradict this job's state (it is not reported
    # though it should run there, or reported though it ended); None while they agree.
    unreported_since = models.DateTimeField(null=True, blank=True)
    # Slurm's afterok / afterany: the earlier jobs this one waits for, and how they must
    # have ended (jobqueue/dependencies.py); the pass cancels an afterok that cannot be met.
    depends_on = models.ManyToManyField(
        "self", symmetrical=False, blank=True, related_name="dependents"
    )
    dependency_kind = models.CharField(
        _("dependency"),
        max_length=8,
        blank=True,
        choices=[(AFTEROK, AFTEROK), (AFTERANY, AFTERANY)],
    )
    # A job array's task (jobqueue/arrays.py): the array's id is its first task's id, as
    # Slurm's ArrayJobId; the index is the task's LABPORTAL_ARRAY_INDEX. None: not an array.
    array_id = models.PositiveBigIntegerField(null=True, blank=True, db_index=True, editable=False)
    array_index = models.PositiveIntegerField(null=True, blank=True, editable=False)

    objects = JobQuerySet.as_manager()

    class Meta:
        verbose_name = _("job")
        verbose_name_plural = _("jobs")
        ordering = ["-submitted_at", "-id"]
        indexes = [
            models.Index(fields=["owner", "state"]),
            models.Index(fields=["state", "queue"]),
            # Recently ended jobs: beat's settle sweep every minute, and reports by period.
            models.Index(fields=["ended_at"], name="job_ended_at_idx"),
        ]
        constraints = [
            models.CheckConstraint(
                condition=models.Q(time_limit_s__gt=0), name="job_time_limit_positive"
            ),
            models.CheckConstraint(
                condition=models.Q(shared_slot=False) | models.Q(gpus=1),
                name="job_shared_slot_is_one_unit",
            ),
        ]

    def __str__(self) -> str:
        return f"#{self.pk} {self.name or self.command_display[:40]}"

    @property
    def command_display(self) -> str:
        return command_text(self.command)

    def shape_command(self) -> None:
        """Store the key that runtime prediction matches this job's command by."""
        self.command_shape_key = command_shape_key(self.command_display)

    PENDING_REASONS = {
        "resources": _("Waiting for GPUs to free up."),
        "priority": _("Waiting behind jobs with higher priority."),
        "reservation": _("Waiting for its reservation's slot to begin."),
        # The same engine reason for a job without a booking: others booked the free GPUs.
        "booked_by_others": _("The free GPUs are booked by others; it starts when they are not."),
        "no_credit": _(
            "Your credit is used up: jobs of members who still have credit go first. It still runs; credits arrive on the 1st."
        ),
        "user_limit": _("You are at your limit of running jobs or GPUs in this queue."),
        "queue_limit": _("The queue is at its limit of running GPUs."),
        "category_limit": _("Your category is at its limit of GPUs in use."),
        "held": _("Held by a lab admin; it waits until an admin releases it."),
        "constraints": _("No GPU in the lab can satisfy the request (model, memory or size)."),
        "node_unavailable": _("Only nodes that are draining or down could run it."),
        # Slurm's ReqNodeNotAvail: its nodes are up but not usable by this job now.
        "nodes_reserved": _(
            "The nodes it needs are not available to it now: reserved (a booking or maintenance), drained or down. It starts when one is free for it."
        ),
        "preempting": _("Preemptible jobs are being requeued to make room for it."),
        "dependency": _("Waiting for job %(ids)s."),
    }

    # The same reasons as another member reads them: never "you" about someone else's job.
    PENDING_REASONS_FOR_OTHERS = {
        **PENDING_REASONS,
        "user_limit": _("Its owner is at their limit of running jobs or GPUs in this queue."),
        "category_limit": _("Its owner's category is at its limit of GPUs in use."),
        "no_credit": _("Its owner's credit is used up: jobs of members with credit go first."),
    }

    @property
    def estimated_start_range(self) -> tuple[datetime, datetime] | None:
        """Where the estimated start is far enough ahead to be uncertain: the likely
        (earliest, latest) start, for pages to show instead of one time."""
        if self.estimated_start is None or self.state != self.State.PENDING:
            return None
        now = timezone.now()
        span = start_estimate_range(now.timestamp(), self.estimated_start.timestamp())
        if span is None:
            return None
        earliest, latest = span
        if self.reservation_id is not None:
            # A booking's job starts in its slot: never "likely" before the slot opens.
            slot_start = self.reservation.start.timestamp()  # type: ignore[union-attr]
            earliest = max(earliest, min(slot_start, self.estimated_start.timestamp()))
        return (
            datetime.fromtimestamp(earliest, tz=now.tzinfo),
            datetime.fromtimestamp(latest, tz=now.tzinfo),
        )

    @property
    def is_awaiting_first_pass(self) -> bool:
        """Just submitted: no scheduling pass has placed it yet (it is being scheduled)."""
        return self.state == self.State.PENDING and not self.pending_reason

    @property
    def pending_reason_text(self) -> str:
        return self.pending_reason_text_for(self.owner_id)

    def pending_reason_text_for(self, reader_id: int | None) -> str:
        """Why it waits, worded for the reader: its owner, or another member."""
        if self.is_awaiting_first_pass:
            return str(_("The scheduler places it within seconds."))
        if self.state == self.State.HELD and self.hold_reason:
            return str(_("Held by a lab admin: %(reason)s") % {"reason": self.hold_reason})
        reasons = (
            self.PENDING_REASONS if reader_id == self.owner_id else self.PENDING_REASONS_FOR_OTHERS
        )
        reason = self.pending_reason
        if reason == "reservation" and self.reservation_id is None:
            reason = "booked_by_others"
        text = str(reasons.get(reason, reason))
        if self.pending_reason == "dependency":
            return text % {"ids": ", ".join(str(pk) for pk in self.waiting_for_ids())}
        return text

    def waiting_for_ids(self) -> list[int]:
        """The jobs it depends on that have not yet ended as its dependency kind asks
        (all of them prefetched: ``depends_on``)."""
        return sorted(
            dep.pk
            for dep in self.depends_on.all()
            if not dependency_satisfied(self.dependency_kind, dep.state, dep.exit_code)
        )

    def duration(self) -> timedelta | None:
        """How long a finished job ran; None if it never started."""
        if self.started_at is None or self.ended_at is None:
            return None
        return self.ended_at - self.started_at

    @property
    def is_session(self) -> bool:
        return self.kind != self.Kind.BATCH

    @property
    def is_final(self) -> bool:
        return self.state in self.FINAL_STATES

    def move_to(self, state: str) -> None:
        """Give the job its next state, if its life allows that move (``TRANSITIONS``).

        The caller holds the job's row lock and saves it. Staying in the same state is no
        move. Any other move raises InvalidTransition: a bug, never a member's mistake.
        """
        if state == self.state:
            return
        if state not in self.TRANSITIONS.get(self.state, frozenset()):
            from jobqueue.errors import InvalidTransition

            raise InvalidTransition(
                gettext("Job %(id)s cannot go from %(old)s to %(new)s.")
                % {"id": self.pk, "old": self.state, "new": state}
            )
        self.state = state

    @classmethod
    def reservation_model(cls) -> Any:
        """The booking a job may run in, through the ``reservation`` foreign key: the job
        queue names reservations/ only there, by string, and never imports it."""
        return cls._meta.get_field("reservation").related_model

    @property
    def expected_end(self) -> datetime | None:
        if self.started_at is None:
            return None
        return self.started_at + timedelta(seconds=self.time_limit_s)

    def runtime(self, now: datetime | None = None) -> timedelta | None:
        if self.started_at is None:
            return None
        return (self.ended_at or now or timezone.now()) - self.started_at


class Allocation(models.Model):
    """One GPU held by one job. The partial unique index makes double allocation impossible."""

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="allocations")
    gpu = models.ForeignKey("cluster.Gpu", on_delete=models.PROTECT, related_name="allocations")
    active = models.BooleanField(default=True)
    allocated_at = models.DateTimeField(default=timezone.now)
    released_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        verbose_name = _("allocation")
        verbose_name_plural = _("allocations")
        constraints = [
            models.UniqueConstraint(
                fields=["gpu"],
                condition=models.Q(active=True),
                name="allocation_one_active_job_per_gpu",
            ),
            models.UniqueConstraint(fields=["job", "gpu"], name="allocation_job_gpu_once"),
        ]

    def __str__(self) -> str:
        return f"{self.job_id} on {self.gpu_id}"


class JobEvent(models.Model):
    """The audit trail of a job, shown to its owner. `event_id` makes agent events idempotent."""

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="events")
    kind = models.CharField(_("event"), max_length=32)
    # The English text, for the API and the admin; pages render `msgid` % `params` from
    # `data` in the reader's language (see `text`).
    message = models.TextField(_("message"), blank=True)
    # Orders events that share a timestamp by cause: dispatched before started before exited.
    step = models.PositiveSmallIntegerField(default=30)
    data = models.JSONField(default=dict, blank=True)
    event_id = models.CharField(max_length=160, null=True, blank=True, unique=True)
    actor = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(default=timezone.now, db_index=True)

    class Meta:
        verbose_name = _("job event")
        verbose_name_plural = _("job events")
        ordering = ["created_at", "step", "id"]

    # The causal step of each kind; an event is never recorded before one of a lower step.
    STEPS = {
        "submitted": 0,
        "held": 5,
        "released": 5,
        "dispatched": 10,
        "started": 20,
        "soft_limit": 30,
        "preempting": 30,
        "stop_requested": 30,
        "exited": 40,
        "start_failed": 40,
        "lost": 40,
        "cancelled": 40,
        "start_resent": 15,
        "stop_resent": 35,
        "ended": 40,
        "force_ended": 40,
        "requeued": 50,
        "gpu_memory_unchecked": 0,
    }
    KIND_LABELS = {
        "submitted": _("submitted"),
        "held": _("held"),
        "released": _("released"),
        "dispatched": _("dispatched"),
        "started": _("started"),
        "soft_limit": _("time limit reached"),
        "preempting": _("preempting"),
        "stop_requested": _("stop requested"),
        "exited": _("exited"),
        "start_failed": _("could not start"),
        "lost": _("lost"),
        "cancelled": _("cancelled"),
        "start_resent": _("start sent again"),
        "stop_resent": _("stop sent again"),
        "ended": _("ended"),
        "force_ended": _("force ended"),
        "requeued": _("requeued"),
        "gpu_memory_unchecked": _("placed by Slurm"),
    }

    def __str__(self) -> str:
        return f"{self.job_id} {self.kind}"

    @property
    def kind_label(self) -> str:
        return str(self.KIND_LABELS.get(self.kind, self.kind))

    @property
    def text(self) -> str:
        """The message in the reader's language, from the stored msgid and parameters."""
        msgid = self.data.get("msgid") if isinstance(self.data, dict) else None
        if not isinstance(msgid, str):
            return self.message
        params = self.data.get("params") or {}
        try:
            return gettext(msgid) % params if params else gettext(msgid)
        except (KeyError, TypeError, ValueError):
            return self.message


class SchedulerLock(models.Model):
    """One row, locked with SELECT … FOR UPDATE so scheduling passes never overlap."""

    name = models.CharField(max_length=32, unique=True)
    pass_requested = models.BooleanField(default=False)
    last_pass_at = models.DateTimeField(null=True, blank=True)
    last_pass_ms = models.FloatField(null=True, blank=True)

    class Meta:
        verbose_name = _("scheduler lock")

    def __str__(self) -> str:
        return self.name


class EmergencyRequest(StaffDecision):
    """A member's request for temporary top priority for named jobs; an admin approves it."""

    class State(models.TextChoices):
        PENDING = "pending", _("pending")
        APPROVED = "approved", _("approved")
        REJECTED = "rejected", _("rejected")
        EXPIRED = "expired", _("expired")

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="emergency_requests"
    )
    jobs = models.ManyToManyField(Job, related_name="emergency_requests")
    reason = models.TextField(_("reason"))
    hours = models.PositiveSmallIntegerField(_("hours of top priority"), default=24)
    state = models.CharField(
        _("state"), max_length=16, choices=State.choices, default=State.PENDING
    )
    expires_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        verbose_name = _("emergency request")
        verbose_name_plural = _("emergency requests")
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.user} emergency ({self.get_state_display()})"

    def is_in_force(self, at: datetime | None = None) -> bool:
        return (
            self.state == self.State.APPROVED
            and self.expires_at is not None
            and self.expires_at > (at or timezone.now())
        )


MAX_ATTAINED_THRESHOLDS = 6


def parse_attained_thresholds(text: str) -> tuple[float, ...]:
    """GPUs held, as "4, 8, 16": positive, rising, at most MAX_ATTAINED_THRESHOLDS values.
    Raises ValidationError with a message that says how to write them."""
    parts = [p.strip() for p in str(text).split(",")]
    try:
        values = tuple(float(p) for p in parts)
    except ValueError:
        raise ValidationError(
            _("Write the thresholds as GPU counts separated by commas, such as “4, 8, 16”."),
            code="invalid",
        ) from None
    if not 1 <= len(values) <= MAX_ATTAINED_THRESHOLDS:
        raise ValidationError(
            _("Give between 1 and %(n)s thresholds."),
            code="count",
            params={"n": MAX_ATTAINED_THRESHOLDS},
        )
    if any(not (0 < v <= 100_000) for v in values):
        raise ValidationError(
            _("Each threshold is a number of GPUs above 0 (and at most 100000)."), code="range"
        )
    if any(b <= a for a, b in zip(values, values[1:], strict=False)):
        raise ValidationError(
            _("The thresholds must rise from left to right, such as “4, 8, 16”."), code="order"
        )
    return values


def validate_attained_thresholds(text: str) -> None:
    parse_attained_thresholds(text)


class SchedulingPolicy(models.Model):
    """The lab's scheduler settings (one row): multifactor weights and the time-limit policy."""

    weight_age = models.FloatField(_("weight: age"), default=2000.0)
    weight_fairshare = models.FloatField(_("weight: fair share"), default=10000.0)
    weight_queue = models.FloatField(_("weight: queue"), default=1000.0)
    weight_category = models.FloatField(_("weight: category"), default=1000.0)
    weight_size = models.FloatField(_("weight: job size"), default=100.0)
    max_age_days = models.FloatField(_("age factor saturates after (days)"), default=2.0)
    usage_half_life_days = models.FloatField(_("usage half-life (days)"), default=7.0)
    drain_reserve_nodes = models.PositiveSmallIntegerField(
        _("drain reserve (nodes)"),
        default=1,
        help_text=_(
            "Wide nodes kept draining for wide jobs while long jobs wait; 0 turns the reserve off."
        ),
    )
    hard_limit_grace_s = models.PositiveIntegerField(
        _("hard limit: grace after the time limit (seconds)"),
        null=True,
        blank=True,
        default=1800,
        help_text=_("Empty means warn only: jobs past their time limit are never stopped."),
    )
    stop_grace_s = models.PositiveIntegerField(_("seconds between SIGTERM and SIGKILL"), default=30)
    # Issue 31: preemption beyond emergencies and bookings. Only jobs their owners marked
    # preemptible (at the lower rate) are ever stopped; the defaults are the lab's.
    preempt_starving_after_s = models.PositiveIntegerField(
        _("preempt for a job waiting longer than (seconds)"),
        null=True,
        blank=True,
        default=12 * 3600,
        help_text=_(
            "A job that has waited this long may requeue other members' preemptible jobs to "
            "start (a wide job that backfill keeps passing over). Empty turns this off."
        ),
    )
    preempt_share_after_s = models.PositiveIntegerField(
        _("preempt to restore a member's share after (seconds)"),
        null=True,
        blank=True,
        default=10 * 60,
        help_text=_(
            "A job of a member at or under their fair share that has waited this long may "
            "requeue preemptible jobs of members over their share. Empty turns this off."
        ),
    )
    preempt_min_run_s = models.PositiveIntegerField(
        _("a preemptible job runs at least (seconds)"),
        default=15 * 60,
        help_text=_(
            "Before a waiting job or a member's share may preempt it (emergencies and "
            "bookings do not wait)."
        ),
    )
    preempt_max_times = models.PositiveIntegerField(
        _("a job is preempted at most (times)"),
        null=True,
        blank=True,
        default=2,
        help_text=_(
            "After this many preemptions a job is no longer stopped for a waiting job or a "
            "member's share (emergencies and bookings still may): each stop costs it a "
            "restart. Empty: no limit."
        ),
    )
    # Issue 15's terms; the defaults are the engine's (scheduler.model.Policy).
    weight_attained = models.FloatField(
        _("weight: least attained service"),
        default=3000.0,
        validators=[MinValueValidator(0.0), MaxValueValidator(1e6)],
        help_text=_(
            "Favours users whose running jobs hold few GPUs: the full weight below the first "
            "threshold, less at each threshold reached; 0 turns it off."
        ),
    )
    attained_thresholds = models.CharField(
        _("least attained service: thresholds (GPUs held)"),
        max_length=80,
        default="4, 8, 16",
        validators=[validate_attained_thresholds],
        help_text=_(
            "GPUs a user's running jobs hold, separated by commas and rising, such as "
            "“4, 8, 16”; at each one reached, the user's waiting jobs lose an equal part "
            "of the weight."
        ),
    )
    weight_short = models.FloatField(
        _("weight: short jobs first"),
        default=5000.0,
        validators=[MinValueValidator(0.0), MaxValueValidator(1e6)],
        help_text=_(
            "Favours jobs with a short time limit: the full weight at 10 minutes or less, "
            "nothing at 7 days or more, in 8 steps between; 0 turns it off."
        ),
    )

    class Meta:
        verbose_name = _("scheduling policy")
        verbose_name_plural = _("scheduling policy")

    def __str__(self) -> str:
        return str(_("Scheduling policy"))

    @classmethod
    def current(cls) -> SchedulingPolicy:
        policy, _created = cls.objects.get_or_create(pk=1)
        return policy

    @property
    def preempt_starving_after_hours(self) -> float | None:
        value = self.preempt_starving_after_s
        return value / 3600 if value is not None else None

    @property
    def preempt_share_after_minutes(self) -> float | None:
        value = self.preempt_share_after_s
        return value / 60 if value is not None else None

    @property
    def preempt_min_run_minutes(self) -> float:
        return self.preempt_min_run_s / 60

    def attained_thresholds_gpus(self) -> tuple[float, ...]:
        """The attained-service thresholds as numbers; the engine's default if the row's
        text is somehow invalid (the admin form refuses such text)."""
        try:
            return parse_attained_thresholds(self.attained_thresholds)
        except ValidationError:
            return (4.0, 8.0, 16.0)


class JobTemplateQuerySet(models.QuerySet["JobTemplate"]):
    def usable_by(self, user: Any) -> JobTemplateQuerySet:
        """The templates a member may pick: their own and the lab-wide ones."""
        return self.filter(models.Q(owner=user) | models.Q(owner__isnull=True))


class JobTemplate(models.Model):
    """A saved submit form: its fields as the member typed them, checked again at submit."""

    name = models.CharField(_("name"), max_length=80)
    name_zh_hans = models.CharField(
        _("name in Chinese"),
        max_length=80,
        blank=True,
        help_text=_(
            "For a lab-wide template: shown to readers of the Chinese pages; empty: they see "
            "the English name."
        ),
    )
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.CASCADE,
        related_name="job_templates",
        verbose_name=_("owner"),
        help_text=_("Empty for a lab-wide template that every member can pick."),
    )
    fields = models.JSONField(_("form fields"), default=dict, blank=True)
    created_at = models.DateTimeField(_("created"), auto_now_add=True)
    updated_at = models.DateTimeField(_("updated"), auto_now=True)

    objects = JobTemplateQuerySet.as_manager()

    class Meta:
        verbose_name = _("job template")
        verbose_name_plural = _("job templates")
        ordering = ["name"]
        constraints = [
            models.UniqueConstraint(fields=["owner", "name"], name="job_template_name_per_owner"),
            models.UniqueConstraint(
                fields=["name"],
                condition=models.Q(owner__isnull=True),
                name="job_template_lab_wide_name",
            ),
        ]

    def __str__(self) -> str:
        return self.name

    @property
    def is_lab_wide(self) -> bool:
        return self.owner_id is None

    @property
    def local_name(self) -> str:
        """The name in the reader's language, falling back to the other one (a member's own
        template has only the name they typed)."""
        return in_reader_language(self.name, self.name_zh_hans)
