"""Machines: GPU nodes, their GPUs (whole, MIG instances, shared slots) and node tokens."""

from __future__ import annotations

from datetime import datetime, timedelta

from django.conf import settings
from django.db import connection, models
from django.utils import timezone
from django.utils.translation import gettext_lazy as _

from core.models import HashedToken


class NodeQuerySet(models.QuerySet["Node"]):
    def schedulable(self) -> NodeQuerySet:
        return self.filter(state=Node.State.UP)

    def silent_since(self, cutoff: datetime) -> NodeQuerySet:
        return self.exclude(state=Node.State.DOWN).filter(
            models.Q(last_heartbeat__lt=cutoff) | models.Q(last_heartbeat__isnull=True)
        )

    def down_with_jobs_not_yet_lost(self, cutoff: datetime) -> NodeQuerySet:
        """Down since before `cutoff`, and their running jobs not yet declared lost."""
        return self.filter(state=Node.State.DOWN, down_since__lt=cutoff, jobs_lost_at__isnull=True)


class Node(models.Model):
    """A GPU server running a LabPortal agent, which consumes the queue node.<name>."""

    class State(models.TextChoices):
        UP = "up", _("up")
        DRAINING = "draining", _("draining")
        DOWN = "down", _("down")

    # What the agent reports (protocol.messages' GPU_BACKENDS and RUNTIMES); the labels
    # are how pages name them.
    class GpuBackend(models.TextChoices):
        NVML = "nvml", _("NVIDIA GPUs (NVML)")
        SIMULATED = "simulated", _("simulated GPUs")

    class Runtime(models.TextChoices):
        DOCKER = "docker", _("Docker containers")
        LOCAL = "local", _("local processes")
        NONE = "none", _("monitoring only")

    name = models.SlugField(_("name"), max_length=63, unique=True)
    address = models.CharField(_("address"), max_length=255, blank=True)
    labels = models.JSONField(_("labels"), default=dict, blank=True)
    state = models.CharField(_("state"), max_length=16, choices=State.choices, default=State.DOWN)
    last_heartbeat = models.DateTimeField(_("last heartbeat"), null=True, blank=True)
    down_since = models.DateTimeField(_("down since"), null=True, blank=True)
    drain_requested = models.BooleanField(
        _("drain"),
        default=False,
        help_text=_("Running jobs finish; nothing new starts here."),
    )
    gpu_backend = models.CharField(
        _("GPU backend"), max_length=16, blank=True, choices=GpuBackend.choices
    )
    runtime = models.CharField(
        _("container runtime"), max_length=16, blank=True, choices=Runtime.choices
    )
    agent_version = models.CharField(_("agent version"), max_length=32, blank=True)
    hostname = models.CharField(_("host name"), max_length=255, blank=True)
    gateway_url = models.CharField(
        _("gateway URL"),
        max_length=200,
        blank=True,
        help_text=_(
            "Where the portal reaches the agent's gateway (sessions and terminals), as the "
            "agent reports it at registration; empty: no sessions on this node."
        ),
    )
    registered_at = models.DateTimeField(
        _("registered at"),
        null=True,
        blank=True,
        help_text=_("When the agent last registered; heartbeats count only after a registration."),
    )
    jobs_lost_at = models.DateTimeField(
        _("jobs lost at"),
        null=True,
        blank=True,
        help_text=_(
            "When this node's running jobs were declared lost; cleared when it comes back."
        ),
    )

    # The inventory a usage report lists for a funding panel: what the lab bought, and when.
    purchased_on = models.DateField(
        _("purchased on"),
        null=True,
        blank=True,
        help_text=_("When the lab bought this server; the usage report lists it."),
    )
    funded_by = models.CharField(
        _("funded by"),
        max_length=200,
        blank=True,
        help_text=_("The grant or budget that paid for it, as the usage report names it."),
    )

    objects = NodeQuerySet.as_manager()

    class Meta:
        verbose_name = _("node")
        verbose_name_plural = _("nodes")
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    @property
    def queue_name(self) -> str:
        return f"node.{self.name}"

    @property
    def is_simulated(self) -> bool:
        return self.gpu_backend == self.GpuBackend.SIMULATED or self.runtime == self.Runtime.LOCAL

    @property
    def state_when_alive(self) -> str:
        """The state a node takes when its agent speaks: draining if an admin asked, else up."""
        return self.State.DRAINING if self.drain_requested else self.State.UP

    def heartbeat_age(self) -> timedelta | None:
        if self.last_heartbeat is None:
            return None
        return timezone.now() - self.last_heartbeat


class Gpu(models.Model):
    """A schedulable GPU unit: a whole GPU, a MIG instance, or a shared slot of a GPU."""

    class Kind(models.TextChoices):
        WHOLE = "gpu", _("whole GPU")
        MIG = "mig", _("MIG instance")
        SLOT = "slot", _("shared slot")

    class State(models.TextChoices):
        AVAILABLE = "available", _("available")
        DISABLED = "disabled", _("disabled by an admin")
        MISSING = "missing", _("missing")

    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="gpus")
    index = models.PositiveIntegerField(_("index"))
    uuid = models.CharField(_("UUID"), max_length=96, unique=True)
    model = models.CharField(_("model"), max_length=120)
    memory_mb = models.PositiveIntegerField(_("memory (MiB)"))
    kind = models.CharField(_("kind"), max_length=8, choices=Kind.choices, default=Kind.WHOLE)
    parent = models.ForeignKey(
        "self",
        verbose_name=_("parent GPU"),
        null=True,
        blank=True,
        on_delete=models.CASCADE,
        related_name="children",
    )
    shared_slots = models.PositiveIntegerField(
        _("shared slots"),
        default=0,
        help_text=_("Expose this GPU as N shared slots for debug work (0 = whole GPU)."),
    )
    state = models.CharField(
        _("state"), max_length=16, choices=State.choices, default=State.AVAILABLE
    )
    # The latest telemetry, kept here so the live page reads one row per GPU.
    util_pct = models.FloatField(_("utilisation %"), null=True, blank=True)
    mem_used_mb = models.PositiveIntegerField(_("memory used (MiB)"), null=True, blank=True)
    temp_c = models.FloatField(_("temperature °C"), null=True, blank=True)
    power_w = models.FloatField(_("power W"), null=True, blank=True)
    sampled_at = models.DateTimeField(_("sampled at"), null=True, blank=True)
    # In use outside the portal's own allocations: in Slurm mode, the Slurm job that holds
    # the GPU (plain sbatch jobs too) and its member where the unix login is known.
    held_by = models.CharField(_("held by"), max_length=120, blank=True)
    held_by_user = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
        verbose_name=_("held by member"),
    )

    class Meta:
        verbose_name = _("GPU")
        verbose_name_plural = _("GPUs")
        ordering = ["node__name", "index", "uuid"]
        constraints = [
            models.CheckConstraint(
                condition=~models.Q(kind="gpu") | models.Q(parent__isnull=True),
                name="gpu_whole_has_no_parent",
            ),
            models.CheckConstraint(
                condition=models.Q(kind="gpu") | models.Q(parent__isnull=False),
                name="gpu_partition_has_parent",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.node.name}:{self.index} {self.model}"

    def sample_age(self) -> timedelta | None:
        if self.sampled_at is None:
            return None
        return timezone.now() - self.sampled_at

    @property
    def label(self) -> str:
        if self.kind == self.Kind.WHOLE:
            return f"{self.node.name}/gpu{self.index}"
        return f"{self.node.name}/gpu{self.index}/{self.kind}-{self.uuid[-4:]}"


class NodeTokenQuerySet(models.QuerySet["NodeToken"]):
    def revoke(self) -> int:
        """Revoke these tokens; agents signing with them are refused from their next report on."""
        from cluster.signing import node_tokens_changed

        revoked = self.filter(revoked_at__isnull=True).update(revoked_at=timezone.now())
        node_tokens_changed()  # update() sends no post_save
        return revoked


class NodeToken(HashedToken):
    """The secret an agent presents on every message. Only its SHA-256 is stored."""

    PREFIX = "lpn_"

    name = models.CharField(_("name"), max_length=80)
    node_name = models.SlugField(
        _("node name"),
        max_length=63,
        help_text=_("The node this token may register as."),
    )

    objects = NodeTokenQuerySet.as_manager()

    class Meta:
        verbose_name = _("node token")
        verbose_name_plural = _("node tokens")
        ordering = ["node_name", "-created_at"]

    def __str__(self) -> str:
        return f"{self.node_name} ({self.token_prefix}…)"

    @classmethod
    def issue(cls, *, node_name: str, name: str = "") -> tuple[NodeToken, str]:
        secret, stored = cls.new_secret()
        token = cls.objects.create(node_name=node_name, name=name or node_name, **stored)
        return token, secret

    @classmethod
    def matches(cls, *, node_name: str, secret: str) -> bool:
        return cls.objects.filter(
            node_name=node_name, token_hash=cls.hash_secret(secret or ""), revoked_at__isnull=True
        ).exists()


class RejectedMessage(models.Model):
    """Agent messages the portal refused, counted per node, message and reason.

    One row per (node name, message, reason) keeps the table bounded even when a
    misconfigured agent is refused every few seconds; `count` and `last_at` tell
    the admin how often and how recently.
    """

    class Reason(models.TextChoices):
        BAD_TOKEN = "bad_token", _("wrong or revoked node token")
        SIMULATION_REFUSED = "simulation_refused", _("simulation is not allowed here")
        NOT_REGISTERED = "not_registered", _("node not registered")
        MALFORMED = "malformed", _("malformed message")
        GPU_NOT_ON_NODE = "gpu_not_on_node", _("GPU not on this node")
        GPU_ON_OTHER_NODE = "gpu_on_other_node", _("GPU belongs to another node")
        JOB_NOT_ON_NODE = "job_not_on_node", _("job not on this node")
        FORGED_COMMAND = "forged_command", _("command refused by the agent (unsigned or forged)")
        BAD_TIME = "bad_time", _("time outside the job's run (check the node's clock)")
        APPLY_FAILED = "apply_failed", _("valid, but failed to apply")
        MONITOR_ONLY = "monitor_only", _("command refused: the agent is monitor-only")

    node_name = models.CharField(_("node name"), max_length=63)
    message = models.CharField(_("message"), max_length=40)
    reason = models.CharField(_("reason"), max_length=32, choices=Reason.choices)
    count = models.PositiveBigIntegerField(_("count"), default=1)
    first_at = models.DateTimeField(_("first seen"), default=timezone.now)
    last_at = models.DateTimeField(_("last seen"), default=timezone.now)
    last_detail = models.TextField(_("last detail"), blank=True)

    class Meta:
        verbose_name = _("rejected agent message")
        verbose_name_plural = _("rejected agent messages")
        ordering = ["-last_at"]
        constraints = [
            models.UniqueConstraint(
                fields=["node_name", "message", "reason"], name="rejected_message_unique_kind"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.node_name} {self.message}: {self.reason} ×{self.count}"


class ReportNonce(models.Model):
    """A report's nonce, recorded in the transaction of the report's effect.

    The database, not the broker's Redis, remembers them: whoever can write to the
    broker can neither delete one nor replay its report. A report whose effect
    rolls back (the database went away) leaves no nonce, so its retry is accepted.
    Kept until the report could no longer be accepted anyway, then pruned.
    """

    nonce = models.CharField(_("nonce"), max_length=64, primary_key=True)
    node_name = models.CharField(_("node name"), max_length=63)
    expires_at = models.DateTimeField(_("expires at"), db_index=True)

    class Meta:
        verbose_name = _("report nonce")
        verbose_name_plural = _("report nonces")

    def __str__(self) -> str:
        return f"{self.node_name} {self.nonce[:8]}…"

    @classmethod
    def claim(cls, *, nonce: str, node_name: str, expires_at: datetime) -> bool:
        """True the first time `nonce` is recorded; False if it already is (a replay).

        One statement that never raises on a duplicate, so the caller's transaction
        stays usable; a concurrent copy waits for the first one's transaction to end.
        """
        table = connection.ops.quote_name(cls._meta.db_table)
        with connection.cursor() as cursor:
            cursor.execute(
                f"INSERT INTO {table} (nonce, node_name, expires_at) VALUES (%s, %s, %s)"
                " ON CONFLICT (nonce) DO NOTHING",
                [nonce, node_name, expires_at],
            )
            return bool(cursor.rowcount == 1)


class ControlClock(models.Model):
    """When the control worker last checked node liveness, and since when without a gap.

    A gap (the database or the broker away, the worker stopped) means the control
    side heard nothing, whatever the nodes sent: node silence is counted only since
    it listens again (`listening_since`). One row.
    """

    last_check_at = models.DateTimeField(_("last liveness check"))
    listening_since = models.DateTimeField(_("listening since"))

    class Meta:
        verbose_name = _("control clock")
        verbose_name_plural = _("control clock")

    def __str__(self) -> str:
        return f"listening since {self.listening_since:%Y-%m-%d %H:%M:%S}"

    @classmethod
    def tick(cls, *, now: datetime, gap: timedelta) -> datetime:
        """Record a liveness check at `now`; return since when the control side has listened.

        A check more than `gap` after the previous one follows a time the control side
        could not hear (or did not run): it listens again from `now`.
        """
        clock, created = cls.objects.select_for_update().get_or_create(
            pk=1, defaults={"last_check_at": now, "listening_since": now}
        )
        if not created:
            if now - clock.last_check_at > gap:
                clock.listening_since = now
            clock.last_check_at = max(clock.last_check_at, now)
            clock.save(update_fields=["last_check_at", "listening_since"])
        return clock.listening_since
