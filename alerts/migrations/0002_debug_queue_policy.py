"""The debug queue is stricter about idle GPUs than normal: shorter window and grace, admins told.

It never stops or requeues: that is for an admin to choose per queue.
"""

from django.db import migrations


def forwards(apps, schema_editor):
    Queue = apps.get_model("jobqueue", "Queue")
    QueueAlertPolicy = apps.get_model("alerts", "QueueAlertPolicy")
    for queue in Queue.objects.filter(name="debug"):
        QueueAlertPolicy.objects.get_or_create(
            queue=queue,
            defaults={
                "idle_action": "notify_staff",
                "idle_window_s": 10 * 60,
                "idle_grace_s": 10 * 60,
            },
        )


class Migration(migrations.Migration):
    dependencies = [
        ("alerts", "0001_initial"),
        ("jobqueue", "0003_default_queues"),
    ]

    operations = [migrations.RunPython(forwards, migrations.RunPython.noop)]
