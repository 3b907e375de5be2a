"""A lab-wide job template's name, which an admin types, has a Chinese value beside the
English one: the submit page's template picker shows the reader's language, the other value
where it is empty; a member's own template shows the name they typed."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client

from jobqueue.models import JobTemplate

pytestmark = pytest.mark.django_db

FIELDS = {"queue": "normal", "image": "labportal/busybox:test", "command": "python t.py"}


def _picker(client: Client, language: str) -> str:
    html = client.get("/jobs/submit/", HTTP_ACCEPT_LANGUAGE=language).content.decode()
    return html.split('data-testid="template-picker"')[1].split("</select>")[0]


def test_a_chinese_reader_picks_a_lab_wide_template_by_its_chinese_name(
    client: Client, alice: Any, queues: Any, image: Any
) -> None:
    JobTemplate.objects.create(
        name="ResNet baseline", name_zh_hans="ResNet 基线", owner=None, fields=FIELDS
    )
    JobTemplate.objects.create(name="Data prep", owner=None, fields=FIELDS)
    JobTemplate.objects.create(name="my sweep", owner=alice, fields=FIELDS)
    client.force_login(alice)
    zh = _picker(client, "zh-hans")
    assert "ResNet 基线（全实验室）" in zh and "ResNet baseline" not in zh
    assert "Data prep（全实验室）" in zh  # no Chinese name: the English one
    assert "my sweep" in zh
    en = _picker(client, "en")
    assert "ResNet baseline (lab-wide)" in en and "基线" not in en


def test_the_admin_form_of_a_template_has_both_names(
    client: Client, admin_user: Any, queues: Any
) -> None:
    template = JobTemplate.objects.create(name="Data prep", owner=None, fields=FIELDS)
    client.force_login(admin_user)
    form = client.get(f"/admin/jobqueue/jobtemplate/{template.pk}/change/").content.decode()
    assert 'name="name"' in form and 'name="name_zh_hans"' in form
