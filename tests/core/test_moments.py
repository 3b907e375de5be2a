"""A moment in a message says its time zone, and an English one never ends in "a.m.."."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from django.utils import translation
from django.utils.translation import gettext as _

from core.moments import when_with_zone

MOMENT = datetime(2026, 12, 2, 5, 44, tzinfo=UTC)


def test_a_moment_names_the_labs_time_zone_in_each_language(settings: Any) -> None:
    with translation.override("en"):
        assert when_with_zone(MOMENT) == "2026-12-02 05:44 UTC"
    settings.TIME_ZONE = "Asia/Shanghai"
    with translation.override("zh-hans"):
        assert when_with_zone(MOMENT) == "2026年12月2日 13:44 CST"


def test_a_sentence_ending_in_a_morning_time_has_one_full_stop() -> None:
    with translation.override("en"):
        text = _("The reservation it ran in ended at %(end)s.") % {"end": when_with_zone(MOMENT)}
    assert text.endswith("05:44 UTC.") and ".." not in text
