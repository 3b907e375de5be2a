"""Lengths of time in the admin's forms: typed and shown as 2h, 1d 6h, 30m; stored as seconds."""

from __future__ import annotations

from typing import Any

import pytest
from django.core.exceptions import ValidationError
from django.test import Client
from django.utils import translation

from alerts.models import AlertRule, Kind
from core.duration_fields import HumanDurationField, format_duration, parse_duration
from jobqueue.models import Queue

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("2h", 7200),
        ("1d", 86400),
        ("30m", 1800),
        ("90m", 5400),
        ("1d 6h", 108000),
        (" 1D6H ", 108000),
        ("45s", 45),
        ("1h 30m 15s", 5415),
        ("0", 0),
    ],
)
def test_a_duration_in_human_units_is_read_as_seconds(text: str, seconds: int) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("seconds", [0, 1, 59, 60, 1800, 5400, 7200, 86400, 108000, 3 * 86400 + 5])
def test_every_length_written_out_reads_back_the_same(seconds: int) -> None:
    assert parse_duration(format_duration(seconds)) == seconds


def test_the_written_form_is_the_short_one() -> None:
    assert format_duration(108000) == "1d 6h"
    assert format_duration(5400) == "1h 30m"
    assert format_duration(None) == ""


@pytest.mark.parametrize("text", ["7200", "2 hours", "2x", "h", "-1h", "1.5h", "2h later"])
def test_anything_else_is_refused_with_the_way_to_write_it_in_both_languages(text: str) -> None:
    field = HumanDurationField()
    with pytest.raises(ValidationError) as refused:
        field.clean(text)
    assert "Write a duration such as 90m, 2h or 1d" in " ".join(refused.value.messages)
    with translation.override("zh-hans"), pytest.raises(ValidationError) as in_chinese:
        field.clean(text)
    with translation.override("zh-hans"):
        message = " ".join(in_chinese.value.messages)
    assert "90m" in message and "时长" in message


def _queue_form(client: Client, url: str) -> dict[str, Any]:
    response = client.get(url)
    form = response.context["adminform"].form
    data = {name: form[name].value() for name in form.fields}
    data = {name: "" if value is None else value for name, value in data.items()}
    data |= {
        "allowances-TOTAL_FORMS": "0",
        "allowances-INITIAL_FORMS": "0",
        "allowances-MIN_NUM_FORMS": "0",
        "allowances-MAX_NUM_FORMS": "1000",
        "_save": "Save",
    }
    return {name: value for name, value in data.items() if value is not False}


def test_the_queue_admin_shows_and_takes_human_units_and_keeps_seconds(admin_user: Any) -> None:
    queue = Queue.objects.create(
        name="long", title="Long", max_time_limit_s=3 * 86400, default_time_limit_s=14400
    )
    client = Client()
    client.force_login(admin_user)
    url = f"/admin/jobqueue/queue/{queue.pk}/change/"
    page = client.get(url).content.decode()
    assert 'value="3d"' in page and 'value="4h"' in page
    data = _queue_form(client, url)
    data |= {"max_time_limit_s": "1d 6h", "default_time_limit_s": "90m"}
    response = client.post(url, data)
    assert response.status_code == 302, response.context["adminform"].form.errors
    queue.refresh_from_db()
    assert (queue.max_time_limit_s, queue.default_time_limit_s) == (108000, 5400)

    refused = client.post(url, data | {"max_time_limit_s": "7200"})
    assert refused.status_code == 200
    assert "Write a duration such as 90m, 2h or 1d" in refused.content.decode()
    queue.refresh_from_db()
    assert queue.max_time_limit_s == 108000


def test_the_alert_rules_list_edits_windows_in_human_units(admin_user: Any) -> None:
    rule = AlertRule.objects.create(kind=Kind.IDLE_JOB, threshold=5, window_s=1800)
    client = Client()
    client.force_login(admin_user)
    page = client.get(f"/admin/alerts/alertrule/{rule.pk}/change/").content.decode()
    assert 'value="30m"' in page
    response = client.post(
        f"/admin/alerts/alertrule/{rule.pk}/change/",
        {
            "kind": rule.kind,
            "enabled": "on",
            "threshold": "5",
            "window_s": "2h",
            "grace_s": "0",
            "email_staff": "on",
            "_save": "Save",
        },
    )
    assert response.status_code == 302, response.context["adminform"].form.errors
    rule.refresh_from_db()
    assert (rule.window_s, rule.grace_s) == (7200, 0)
