"""Each existing queue goes to the Slurm QOS of its own name, on the default partition."""

from django.db import migrations


def add_mappings(apps, schema_editor):
    Queue = apps.get_model("jobqueue", "Queue")
    QueueMapping = apps.get_model("slurm", "QueueMapping")
    for queue in Queue.objects.all():
        QueueMapping.objects.get_or_create(queue=queue, defaults={"qos": queue.name})


class Migration(migrations.Migration):
    dependencies = [
        ("slurm", "0001_initial"),
        ("jobqueue", "0003_default_queues"),
    ]

    operations = [migrations.RunPython(add_mappings, migrations.RunPython.noop)]
