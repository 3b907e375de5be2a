"""Celery beat's schedule, collected from each app's <app>/beat.py at its first use.

The settings name the apps; the modules are imported only when beat (or a check, or a test)
reads the schedule, so reading the settings imports no app. An entry name two apps both
use is a mistake, refused with both names.
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Iterator, Mapping
from functools import cached_property
from typing import Any

from django.core.exceptions import ImproperlyConfigured


class AppsBeatSchedule(Mapping[str, dict[str, object]]):
    def __init__(self, apps: list[str]) -> None:
        self.apps = list(apps)

    @cached_property
    def entries(self) -> dict[str, dict[str, object]]:
        from django.conf import settings

        values = {name: getattr(settings, name) for name in dir(settings) if name.isupper()}
        schedule: dict[str, dict[str, object]] = {}
        for app in self.apps:
            if importlib.util.find_spec(f"{app}.beat") is None:
                continue
            beat: Any = importlib.import_module(f"{app}.beat")
            entries = (
                beat.beat_schedule(values) if hasattr(beat, "beat_schedule") else beat.BEAT_SCHEDULE
            )
            twice = schedule.keys() & entries.keys()
            if twice:
                raise ImproperlyConfigured(
                    f"beat entries named by two apps: {sorted(twice)} ({app})"
                )
            schedule.update(entries)
        return schedule

    def __getitem__(self, name: str) -> dict[str, object]:
        return self.entries[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self.entries)

    def __len__(self) -> int:
        return len(self.entries)
