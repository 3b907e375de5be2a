"""A rule the database enforces is explained in words where an admin edits it, never by the
constraint's name ("category_priority_factor_0_1 is violated")."""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.core.exceptions import ValidationError
from django.test import Client
from django.utils import translation

from accounts.models import Category, CreditPolicy
from alerts.models import AlertRule
from jobqueue.models import Queue, VolumeMount

pytestmark = pytest.mark.django_db

CONSTRAINT_NAME = re.compile(r"\b[a-z]+(_[a-z0-9]+){2,}\b")


@pytest.mark.parametrize(
    ("instance", "words"),
    [
        (lambda: Category(name="x", priority_factor=1.5), "share from 0 to 1"),
        (lambda: CreditPolicy(id=1, efficiency_reward_share=2), "share from 0 to 1"),
        (lambda: Queue(name="q", priority_factor=-1), "share from 0 to 1"),
        (
            lambda: Queue(name="q", default_time_limit_s=7200, max_time_limit_s=3600),
            "cannot be longer than the longest",
        ),
        (lambda: VolumeMount(name="v", source_template="data", target="/d"), "starting with /"),
        (lambda: VolumeMount(name="v", source_template="/data", target="d"), "starting with /"),
        (lambda: AlertRule(kind="gpu_hot", threshold=-3), "cannot be negative"),
    ],
)
def test_each_rule_is_explained_in_words(instance: Any, words: str) -> None:
    with pytest.raises(ValidationError) as refused:
        instance().validate_constraints()
    text = " ".join(refused.value.messages)
    assert words in text
    assert "violated" not in text and not CONSTRAINT_NAME.search(text), text
    with translation.override("zh-hans"), pytest.raises(ValidationError) as in_chinese:
        instance().validate_constraints()
    assert re.search(r"[\u4e00-\u9fff]", " ".join(in_chinese.value.messages))


def test_the_admin_shows_the_words_when_a_category_factor_is_out_of_range(admin_user: Any) -> None:
    category = Category.objects.create(name="Master", priority_factor=1)
    client = Client()
    client.force_login(admin_user)
    url = f"/admin/accounts/category/{category.pk}/change/"
    form = client.get(url).context["adminform"].form
    data = {name: value for name, value in form.initial.items() if value is not None}
    data |= {"priority_factor": "1.5", "_save": "Save"}
    page = client.post(url, data).content.decode()
    assert "share from 0 to 1" in page
    assert "category_priority_factor_0_1" not in page
    category.refresh_from_db()
    assert category.priority_factor == 1
