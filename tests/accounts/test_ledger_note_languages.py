"""A ledger note's moments are kept as moments: a Chinese reader sees them in the Chinese
date format, an English reader in the English one, whoever's language was active at booking."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import pytest
from django.utils import translation
from django.utils.translation import gettext_noop

from accounts.models import LedgerEntry
from accounts.services import ledger_post
from tests.conftest import PASSWORD

pytestmark = pytest.mark.django_db

START, END = datetime(2026, 12, 2, 16, tzinfo=UTC), datetime(2026, 12, 2, 18, tzinfo=UTC)


def _booking_note(user: Any) -> LedgerEntry:
    with translation.override("en"):
        return ledger_post(
            user=user,
            amount=Decimal("-4"),
            kind="reservation",
            idempotency_key="booking-1",
            note=gettext_noop("Booking of %(count)d GPUs, %(start)s – %(end)s"),
            note_params={"count": 2, "start": START, "end": END},
        )


def test_a_booking_note_reads_in_each_readers_date_format(client: Any, alice: Any) -> None:
    entry = _booking_note(alice)
    assert entry.note == "Booking of 2 GPUs, 2026-12-02 16:00 UTC – 2026-12-02 18:00 UTC"
    with translation.override("zh-hans"):
        zh = entry.note_text
    assert zh.startswith("预约 2 块 GPU，2026年12月2日") and "p.m." not in zh and "12/02" not in zh
    client.login(username="alice", password=PASSWORD)
    page = client.get("/account/credits/", HTTP_ACCEPT_LANGUAGE="zh-hans").content.decode()
    assert "预约 2 块 GPU，2026年12月2日" in page and "12/02/2026" not in page


def test_a_note_stored_with_worded_moments_reads_as_stored(alice: Any) -> None:
    entry = _booking_note(alice)
    LedgerEntry.objects.filter(pk=entry.pk).update(
        note_i18n={
            "msgid": entry.note_i18n["msgid"],
            "params": {"count": 2, "start": "A", "end": "B"},
        }
    )
    entry.refresh_from_db()
    with translation.override("zh-hans"):
        assert entry.note_text == "预约 2 块 GPU，A – B"
