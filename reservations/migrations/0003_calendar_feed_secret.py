"""Calendar feeds keep a secret that is never shown instead of the URL's token itself.

Until now ``CalendarFeed.token`` was the secret of the iCal URL in plaintext, so a copy
of the database gave every member's booking feed. The URL's token is now
``<feed id>.<HMAC-SHA256 of SECRET_KEY over the id and the secret>``; the row keeps only
the secret, and the database alone cannot produce a working URL.

An old URL cannot be carried over without keeping its token, so every existing feed
gets a fresh secret here: **old feed URLs stop working** (404, as a wrong token always
did), and members find their new URL on My reservations (``/reservations/mine/``) or
at ``GET /api/reservations/feed/`` and paste it into their calendar app again.

Reversing makes the secrets plaintext tokens again: the old code then shows members a
URL built from them, and neither the original URLs nor the HMAC URLs work.
"""

import secrets

from django.db import migrations, models


def fresh_secrets(apps, schema_editor):
    CalendarFeed = apps.get_model("reservations", "CalendarFeed")
    for feed in CalendarFeed.objects.only("pk").iterator():
        CalendarFeed.objects.filter(pk=feed.pk).update(secret=secrets.token_urlsafe(32))


class Migration(migrations.Migration):
    dependencies = [
        ("reservations", "0002_slots_rules_feed_credits"),
    ]

    operations = [
        migrations.RenameField(model_name="calendarfeed", old_name="token", new_name="secret"),
        migrations.AlterField(
            model_name="calendarfeed",
            name="secret",
            field=models.CharField(max_length=64),
        ),
        # Last, so no ALTER TABLE follows the row updates in PostgreSQL's transaction.
        migrations.RunPython(fresh_secrets, migrations.RunPython.noop, elidable=True),
    ]
