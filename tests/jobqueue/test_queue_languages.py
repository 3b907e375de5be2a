"""A queue's title and description are kept in English and Chinese: each reader sees their
language's value on the rules and submit pages and in the API, the other one where it is empty."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client

from jobqueue.models import Queue

pytestmark = pytest.mark.django_db


def _bilingual_normal_queue() -> Queue:
    queue = Queue.objects.get(name="normal")
    queue.title, queue.title_zh_hans = "Normal", "普通"
    queue.description = "Everyday training and experiments."
    queue.description_zh_hans = "日常训练和实验。"
    queue.save()
    return queue


def test_a_chinese_reader_sees_the_chinese_title_and_description(
    client: Client, alice: Any, queues: Any
) -> None:
    _bilingual_normal_queue()
    client.force_login(alice)
    rules = client.get("/rules/", HTTP_ACCEPT_LANGUAGE="zh-hans").content.decode()
    assert "日常训练和实验。" in rules and "Everyday training" not in rules
    submit = client.get("/jobs/submit/", HTTP_ACCEPT_LANGUAGE="zh-hans").content.decode()
    assert "normal · 普通" in submit
    api = client.get("/api/queues/", HTTP_ACCEPT_LANGUAGE="zh-hans").json()
    rows = api["results"] if isinstance(api, dict) else api
    normal = next(row for row in rows if row["name"] == "normal")
    assert normal["title"] == "普通" and normal["description"] == "日常训练和实验。"
    assert normal["title_en"] == "Normal" and normal["title_zh_hans"] == "普通"


def test_an_english_reader_sees_english_and_each_falls_back_to_the_other_value(
    client: Client, alice: Any, queues: Any
) -> None:
    _bilingual_normal_queue()
    debug = Queue.objects.get(name="debug")
    debug.title, debug.title_zh_hans = "", "调试"
    debug.description, debug.description_zh_hans = "Short runs.", ""
    debug.save()
    client.force_login(alice)
    en = client.get("/rules/", HTTP_ACCEPT_LANGUAGE="en").content.decode()
    assert "Everyday training and experiments." in en and "日常训练" not in en
    assert "调试" in en  # no English title: the Chinese one
    zh = client.get("/rules/", HTTP_ACCEPT_LANGUAGE="zh-hans").content.decode()
    assert "Short runs." in zh  # no Chinese description: the English one
