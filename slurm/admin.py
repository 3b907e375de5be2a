from django.contrib import admin

from slurm.models import Partition, QueueMapping, SlurmJob, UnixLogin


@admin.register(QueueMapping)
class QueueMappingAdmin(admin.ModelAdmin[QueueMapping]):
    list_display = ("queue", "partition", "qos")
    list_editable = ("partition", "qos")


@admin.register(UnixLogin)
class UnixLoginAdmin(admin.ModelAdmin[UnixLogin]):
    list_display = ("user", "username")
    search_fields = ("user__username", "user__email", "username")
    autocomplete_fields = ("user",)


@admin.register(Partition)
class PartitionAdmin(admin.ModelAdmin[Partition]):
    list_display = ("name", "state", "is_default", "max_time_s", "synced_at")
    readonly_fields = ("name", "state", "is_default", "max_time_s", "nodes", "synced_at")


@admin.register(SlurmJob)
class SlurmJobAdmin(admin.ModelAdmin[SlurmJob]):
    list_display = ("slurm_job_id", "unix_user", "user", "state", "reason", "partition", "qos")
    list_filter = ("state", "partition", "qos")
    search_fields = ("slurm_job_id", "unix_user", "user__username", "name")
    raw_id_fields = ("job", "user")
