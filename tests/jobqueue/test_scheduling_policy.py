"""The admin's scheduling policy: the least-attained-service, short-jobs and preemption settings."""

from __future__ import annotations

from typing import Any

import pytest
from django.core.exceptions import ValidationError
from django.utils import timezone

from core.duration_fields import format_duration
from jobqueue.models import SchedulingPolicy, parse_attained_thresholds
from scheduler import model as sm
from scheduling.passes import build_engine_input

pytestmark = pytest.mark.django_db

URL = "/admin/jobqueue/schedulingpolicy/{pk}/change/"


def _form(policy: SchedulingPolicy, **changes: Any) -> dict[str, Any]:
    fields = [f.name for f in SchedulingPolicy._meta.fields if f.name != "id"]
    data = {name: getattr(policy, name) for name in fields}
    # The admin writes lengths of time in human units (`30m`, `30s`).
    for name in (
        "hard_limit_grace_s",
        "stop_grace_s",
        "preempt_starving_after_s",
        "preempt_share_after_s",
        "preempt_min_run_s",
    ):
        data[name] = format_duration(data[name])
    return {**data, **changes}


def test_a_new_policy_gives_the_engine_the_terms_it_had_before_the_settings_existed() -> None:
    _state, policy, _gpus = build_engine_input(timezone.now())
    engine = sm.Policy()
    assert policy.weight_attained == engine.weight_attained
    assert policy.weight_short == engine.weight_short
    assert policy.attained_thresholds == engine.attained_thresholds


def test_the_pass_uses_the_admins_attained_service_and_short_jobs_settings() -> None:
    SchedulingPolicy.current()
    SchedulingPolicy.objects.update(
        weight_attained=0.0, weight_short=8000.0, attained_thresholds="2, 6"
    )
    _state, policy, _gpus = build_engine_input(timezone.now())
    assert (policy.weight_attained, policy.weight_short) == (0.0, 8000.0)
    assert policy.attained_thresholds == (2.0, 6.0)


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("4; 8", "separated by commas"),
        ("", "separated by commas"),
        ("8, 4", "must rise"),
        ("4, 4", "must rise"),
        ("0, 4", "above 0"),
        ("1, 2, 3, 4, 5, 6, 7", "between 1 and 6"),
    ],
)
def test_bad_thresholds_are_refused_with_a_reason(text: str, words: str) -> None:
    with pytest.raises(ValidationError, match=words):
        parse_attained_thresholds(text)


def test_the_admin_form_shows_the_settings_and_refuses_bad_values_without_a_500(
    admin_client: Any,
) -> None:
    policy = SchedulingPolicy.current()
    url = URL.format(pk=policy.pk)
    page = admin_client.get(url).content.decode()
    assert "least attained service" in page and "short jobs first" in page
    for changes, words in (
        ({"attained_thresholds": "16, 8"}, "must rise"),
        ({"attained_thresholds": "four"}, "separated by commas"),
        ({"weight_short": "-1"}, "greater than or equal to 0"),
    ):
        response = admin_client.post(url, _form(policy, **changes))
        assert response.status_code == 200 and words in response.content.decode()
    assert SchedulingPolicy.current().attained_thresholds == "4, 8, 16"
    response = admin_client.post(
        url, _form(policy, attained_thresholds=" 2,4 , 8", weight_short="2500")
    )
    assert response.status_code == 302
    saved = SchedulingPolicy.current()
    assert saved.attained_thresholds_gpus() == (2.0, 4.0, 8.0) and saved.weight_short == 2500.0


def test_the_pass_uses_the_admins_preemption_settings() -> None:
    _state, policy, _gpus = build_engine_input(timezone.now())
    assert policy.preempt_starving_after_s == 12 * 3600.0
    assert policy.preempt_share_after_s == 600.0
    assert policy.preempt_min_run_s == 900.0
    assert policy.preempt_max_times == 2
    assert policy.preemption_grace_s == 30.0  # the stop grace a victim gets
    SchedulingPolicy.objects.update(
        preempt_starving_after_s=None,
        preempt_share_after_s=None,
        preempt_min_run_s=0,
        preempt_max_times=None,
        stop_grace_s=300,
    )
    _state, policy, _gpus = build_engine_input(timezone.now())
    assert (policy.preempt_starving_after_s, policy.preempt_share_after_s) == (None, None)
    assert policy.preempt_min_run_s == 0.0
    assert policy.preempt_max_times is None
    assert policy.preemption_grace_s == 300.0


def test_the_admin_writes_the_preemption_settings_as_durations_and_empty_turns_them_off(
    admin_client: Any,
) -> None:
    policy = SchedulingPolicy.current()
    url = URL.format(pk=policy.pk)
    page = admin_client.get(url).content.decode()
    assert "preempt for a job waiting longer than" in page
    assert 'value="12h"' in page and 'value="10m"' in page and 'value="15m"' in page
    response = admin_client.post(url, _form(policy, preempt_starving_after_s="12"))
    assert response.status_code == 200 and "Write a duration such as" in response.content.decode()
    response = admin_client.post(
        url,
        _form(
            policy,
            preempt_starving_after_s="1d 6h",
            preempt_share_after_s="",
            preempt_min_run_s="1h",
        ),
    )
    assert response.status_code == 302
    saved = SchedulingPolicy.current()
    assert saved.preempt_starving_after_s == 30 * 3600
    assert saved.preempt_share_after_s is None
    assert saved.preempt_min_run_s == 3600
