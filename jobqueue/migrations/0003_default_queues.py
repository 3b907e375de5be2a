from decimal import Decimal

from django.db import migrations

DEFAULT_QUEUES = [
    {
        "name": "high",
        "title": "High priority (deadlines)",
        "description": "For deadlines. Needs a priority grant approved by an admin.",
        "tier": 0,
        "priority_factor": 1.0,
        "credit_rate": Decimal("2.000"),
        "max_gpus_per_job": 8,
        "max_time_limit_s": 3 * 86400,
        "default_time_limit_s": 12 * 3600,
        "requires_grant": True,
    },
    {
        "name": "debug",
        "title": "Debug",
        "description": "Short, small runs with fast turnaround; may share a GPU.",
        "tier": 1,
        "priority_factor": 0.8,
        "credit_rate": Decimal("0.500"),
        "max_gpus_per_job": 1,
        "max_time_limit_s": 3600,
        "default_time_limit_s": 1800,
        "max_running_jobs_per_user": 2,
        "allows_shared_slots": True,
    },
    {
        "name": "normal",
        "title": "Normal",
        "description": "Everyday training and experiments.",
        "tier": 2,
        "priority_factor": 0.5,
        "credit_rate": Decimal("1.000"),
        "max_gpus_per_job": 8,
        "max_time_limit_s": 3 * 86400,
        "default_time_limit_s": 4 * 3600,
    },
]


def create_queues(apps, schema_editor):
    Queue = apps.get_model("jobqueue", "Queue")
    for spec in DEFAULT_QUEUES:
        Queue.objects.get_or_create(name=spec["name"], defaults=spec)


def remove_queues(apps, schema_editor):
    Queue = apps.get_model("jobqueue", "Queue")
    Queue.objects.filter(name__in=[q["name"] for q in DEFAULT_QUEUES], jobs__isnull=True).delete()


class Migration(migrations.Migration):
    dependencies = [("jobqueue", "0002_initial")]
    operations = [migrations.RunPython(create_queues, remove_queues)]
