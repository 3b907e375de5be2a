"""A user category's name and description are kept in English and Chinese: the rules page,
the admin and a refusal that names the category show the reader's language, the other value
where it is empty. The English name stays the category's identifier."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client
from django.utils import translation

from accounts.models import Category
from jobqueue.errors import TooManyGpus
from jobqueue.models import CategoryQueueAllowance, Queue
from tests.jobqueue.test_submit import submit

pytestmark = pytest.mark.django_db


def _bilingual(alice: Any, charlie: Any) -> tuple[Category, Category]:
    phd, master = alice.category, charlie.category
    phd.name_zh_hans = "博士（论文阶段）"
    phd.description = "Writing up the thesis."
    phd.description_zh_hans = "撰写毕业论文。"
    phd.save()
    master.name_zh_hans = "硕士"
    master.save()
    return phd, master


def _section(html: str, testid: str) -> str:
    return html.split(f'data-testid="{testid}"')[1].split("</section>")[0]


def test_a_chinese_reader_sees_the_categories_chinese_names_on_the_rules_page(
    client: Client, alice: Any, charlie: Any, queues: Any
) -> None:
    phd, _master = _bilingual(alice, charlie)
    CategoryQueueAllowance.objects.create(
        category=phd, queue=Queue.objects.get(name="debug"), max_running_jobs_per_user=4
    )
    client.force_login(alice)
    zh = client.get("/rules/", HTTP_ACCEPT_LANGUAGE="zh-hans").content.decode()
    categories = _section(zh, "rules-categories")
    assert "博士（论文阶段）" in categories and "硕士" in categories
    assert "撰写毕业论文。" in categories
    allowances = zh.split('data-testid="rules-allowances-debug"')[1].split("</table>")[0]
    assert "博士（论文阶段）" in allowances
    for english in ("PhD, thesis phase", "Master", "Writing up the thesis."):
        assert english not in zh, english
    en = client.get("/rules/", HTTP_ACCEPT_LANGUAGE="en").content.decode()
    assert "PhD, thesis phase" in en and "Writing up the thesis." in en and "Master" in en
    assert "博士" not in en and "硕士" not in en


def test_each_reader_falls_back_to_the_other_value_where_theirs_is_empty(
    client: Client, alice: Any, charlie: Any, queues: Any
) -> None:
    phd, master = alice.category, charlie.category
    phd.description, phd.description_zh_hans = "", "只有中文说明。"
    phd.save()
    master.description = "Only in English."
    master.save()
    client.force_login(alice)
    zh = _section(
        client.get("/rules/", HTTP_ACCEPT_LANGUAGE="zh-hans").content.decode(), "rules-categories"
    )
    assert "Master" in zh and "PhD, thesis phase" in zh  # no Chinese names: the English ones
    assert "Only in English." in zh
    en = _section(
        client.get("/rules/", HTTP_ACCEPT_LANGUAGE="en").content.decode(), "rules-categories"
    )
    assert "只有中文说明。" in en  # no English description: the Chinese one


def test_a_refusal_names_the_category_in_the_readers_language(
    alice: Any, charlie: Any, cluster: Any, image: Any
) -> None:
    phd, _master = _bilingual(alice, charlie)
    phd.max_concurrent_gpus = 1
    phd.save()
    for language, shown, hidden in (
        ("zh-hans", "博士（论文阶段）", "PhD, thesis phase"),
        ("en", "PhD, thesis phase", "博士"),
    ):
        with translation.override(language), pytest.raises(TooManyGpus) as refused:
            submit(alice, gpus=2)
        assert shown in str(refused.value.message) and hidden not in str(refused.value.message)


def test_the_admin_keeps_both_names_and_shows_members_categories_in_the_readers_language(
    client: Client, admin_user: Any, alice: Any, charlie: Any
) -> None:
    phd, _master = _bilingual(alice, charlie)
    client.force_login(admin_user)
    form = client.get(f"/admin/accounts/category/{phd.pk}/change/").content.decode()
    assert 'name="name_zh_hans"' in form and 'name="description_zh_hans"' in form
    added = client.post(
        "/admin/accounts/category/add/",
        {
            "name": "Postdoc",
            "name_zh_hans": "博士后",
            "description": "",
            "description_zh_hans": "",
            "fairshare_weight": 20,
            "credit_multiplier": "1.00",
            "priority_factor": 0.5,
            "max_concurrent_gpus": 8,
            "max_queued_jobs": 50,
            "max_booked_hours_per_week": 48,
            "max_booking_days_ahead": 14,
        },
    )
    assert added.status_code == 302, added.content.decode()[-2000:]
    assert Category.objects.get(name="Postdoc").name_zh_hans == "博士后"
    listed = client.get("/admin/accounts/category/", HTTP_ACCEPT_LANGUAGE="zh-hans")
    assert "博士后" in listed.content.decode() and "Postdoc" in listed.content.decode()
    users = client.get("/admin/accounts/user/", HTTP_ACCEPT_LANGUAGE="zh-hans").content.decode()
    assert "博士（论文阶段）" in users and "硕士" in users
    assert "PhD, thesis phase" not in users and "Master" not in users
