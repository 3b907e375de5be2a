from __future__ import annotations

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy

from accounts.auth import request_user
from core.duration_fields import HumanDurationAdminMixin
from core.errors import DomainError
from jobqueue.models import (
    Allocation,
    CategoryQueueAllowance,
    ContainerImage,
    Job,
    JobEvent,
    JobTemplate,
    Queue,
    SchedulingPolicy,
    VolumeMount,
)


class CategoryQueueAllowanceInline(admin.TabularInline[CategoryQueueAllowance, Queue]):
    model = CategoryQueueAllowance
    extra = 0
    verbose_name = gettext_lazy("limits of a category in this queue")
    verbose_name_plural = gettext_lazy(
        "limits of categories in this queue (in place of the queue's, e.g. more debug jobs for newcomers)"
    )


@admin.register(Queue)
class QueueAdmin(HumanDurationAdminMixin, admin.ModelAdmin[Queue]):
    duration_labels = {
        "max_time_limit_s": gettext_lazy("max time limit"),
        "default_time_limit_s": gettext_lazy("default time limit"),
    }
    inlines = [CategoryQueueAllowanceInline]
    list_display = (
        "name",
        "tier",
        "priority_factor",
        "credit_rate",
        "max_gpus_per_job",
        "max_time_limit_s",
        "requires_grant",
        "allows_shared_slots",
        "network_egress",
        "is_active",
    )
    list_editable = ("is_active",)


@admin.register(ContainerImage)
class ContainerImageAdmin(admin.ModelAdmin[ContainerImage]):
    list_display = ("reference", "description", "enabled")
    list_filter = ("enabled",)
    search_fields = ("reference",)


@admin.register(VolumeMount)
class VolumeMountAdmin(admin.ModelAdmin[VolumeMount]):
    list_display = ("name", "source_template", "target", "read_only", "enabled")
    list_filter = ("enabled", "read_only")


class JobEventInline(admin.TabularInline[JobEvent, Job]):
    model = JobEvent
    extra = 0
    readonly_fields = ("created_at", "kind", "message", "actor")
    fields = readonly_fields
    can_delete = False


class AllocationInline(admin.TabularInline[Allocation, Job]):
    model = Allocation
    extra = 0
    readonly_fields = ("gpu", "active", "allocated_at", "released_at")
    can_delete = False


@admin.register(Job)
class JobAdmin(HumanDurationAdminMixin, admin.ModelAdmin[Job]):
    duration_labels = {"time_limit_s": gettext_lazy("time limit")}
    list_display = (
        "id",
        "owner",
        "queue",
        "gpus",
        "state",
        "node",
        "submitted_at",
        "started_at",
        "ended_at",
    )
    list_filter = ("state", "queue", "node")
    search_fields = ("id", "owner__username", "name")
    readonly_fields = (
        "submitted_at",
        "dispatched_at",
        "started_at",
        "ended_at",
        "exit_code",
        "log_tail",
        "queue_position",
        "estimated_start",
        "pending_reason",
        "priority",
    )
    inlines = (AllocationInline, JobEventInline)
    actions = ("cancel_jobs", "hold_jobs", "release_jobs", "force_end")

    # A job changes only through the services (submit, events, credits, the actions
    # below): the admin shows every field and edits none, adds no job, deletes none.
    def get_readonly_fields(self, request: HttpRequest, obj: Job | None = None) -> list[str]:
        return [f.name for f in Job._meta.get_fields() if f.concrete and not f.auto_created]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Job | None = None) -> bool:
        return False

    @admin.action(description=gettext_lazy("Cancel the selected jobs (running ones are stopped)"))
    def cancel_jobs(self, request: HttpRequest, queryset: QuerySet[Job]) -> None:
        from jobqueue.services import job_cancel

        cancelled = 0
        for job_id in queryset.exclude(state__in=Job.FINAL_STATES).values_list("pk", flat=True):
            try:
                job_cancel(job_id=job_id, actor=request_user(request))
            except DomainError as refused:  # Slurm away or refusing: say so, go on
                self.message_user(request, f"#{job_id}: {refused}", messages.ERROR)
                continue
            cancelled += 1
        self.message_user(
            request,
            _("%(n)d job(s) cancelled or asked to stop.") % {"n": cancelled},
            messages.SUCCESS if cancelled else messages.WARNING,
        )

    @admin.action(
        description=gettext_lazy("Hold the selected pending jobs (they keep their place)")
    )
    def hold_jobs(self, request: HttpRequest, queryset: QuerySet[Job]) -> None:
        from jobqueue.services import job_hold

        held = 0
        for job in queryset.filter(state=Job.State.PENDING):
            job_hold(job_id=job.pk, actor=request_user(request), reason=str(HOLD_REASON))
            held += 1
        self.message_user(request, _("%(n)d job(s) held.") % {"n": held}, messages.SUCCESS)

    @admin.action(description=gettext_lazy("Release the selected held jobs"))
    def release_jobs(self, request: HttpRequest, queryset: QuerySet[Job]) -> None:
        from jobqueue.services import job_release

        released = 0
        for job in queryset.filter(state=Job.State.HELD):
            job_release(job_id=job.pk, actor=request_user(request))
            released += 1
        self.message_user(request, _("%(n)d job(s) released.") % {"n": released}, messages.SUCCESS)

    @admin.action(
        description=gettext_lazy("Force end the selected jobs (last resort: frees their GPUs now)")
    )
    def force_end(self, request: HttpRequest, queryset: QuerySet[Job]) -> None:
        from jobqueue.services import job_force_end

        ended = 0
        for job_id in queryset.exclude(state__in=Job.FINAL_STATES).values_list("pk", flat=True):
            job_force_end(job_id=job_id, actor=request_user(request))
            ended += 1
        self.message_user(
            request,
            _("%(n)d job(s) ended; their nodes were told to stop the containers.") % {"n": ended},
            messages.SUCCESS if ended else messages.WARNING,
        )


HOLD_REASON = gettext_lazy("an admin is looking into it; ask the lab admins for details.")


@admin.register(SchedulingPolicy)
class SchedulingPolicyAdmin(HumanDurationAdminMixin, admin.ModelAdmin[SchedulingPolicy]):
    duration_labels = {
        "hard_limit_grace_s": gettext_lazy("hard limit: grace after the time limit"),
        "stop_grace_s": gettext_lazy("time between SIGTERM and SIGKILL"),
        "preempt_starving_after_s": gettext_lazy("preempt for a job waiting longer than"),
        "preempt_share_after_s": gettext_lazy("preempt to restore a member's share after"),
        "preempt_min_run_s": gettext_lazy("a preemptible job runs at least"),
    }

    def has_add_permission(self, request: object) -> bool:
        return not SchedulingPolicy.objects.exists()

    def has_delete_permission(self, request: object, obj: object = None) -> bool:
        return False


@admin.register(JobTemplate)
class JobTemplateAdmin(admin.ModelAdmin[JobTemplate]):
    """Lab-wide templates (no owner) are made here; members keep their own on the submit page."""

    list_display = ("name", "name_zh_hans", "owner", "updated_at")
    list_filter = (("owner", admin.EmptyFieldListFilter),)
    search_fields = ("name", "name_zh_hans")
    raw_id_fields = ("owner",)
