"""Fixtures for the reservation tests: two nodes of GPUs, a fixed clock, and recorded contracts.

The credits ledger, notifications and job stopping belong to other apps; the tests
record the calls the reservation services make to them.
"""

from __future__ import annotations

import sys
import types
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any
from zoneinfo import ZoneInfo

import pytest
import time_machine

from tests.factories import GpuFactory, NodeFactory

# A Monday morning, so weeks and grids are easy to reason about.
T0 = datetime(2027, 3, 1, 9, 0, tzinfo=ZoneInfo("UTC"))


@dataclass
class Contracts:
    ledger: list[dict[str, Any]] = field(default_factory=list)
    notifications: list[dict[str, Any]] = field(default_factory=list)
    stops: list[dict[str, Any]] = field(default_factory=list)

    def ledger_post(self, **kwargs: Any) -> None:
        if any(e["idempotency_key"] == kwargs["idempotency_key"] for e in self.ledger):
            return
        self.ledger.append(kwargs)

    def notify(self, **kwargs: Any) -> None:
        self.notifications.append(kwargs)

    def job_request_stop(self, **kwargs: Any) -> None:
        self.stops.append(kwargs)

    def balance_change(self, user: Any) -> Decimal:
        return sum((e["amount"] for e in self.ledger if e["user"].pk == user.pk), Decimal(0))

    def kinds_for(self, user: Any) -> list[str]:
        return [n["kind"] for n in self.notifications if n["user"].pk == user.pk]


@pytest.fixture
def contracts(monkeypatch: pytest.MonkeyPatch) -> Iterator[Contracts]:
    recorded = Contracts()
    for module_name, names in (
        ("accounts.services", ("ledger_post", "notify")),
        ("jobqueue.services", ("job_request_stop",)),
    ):
        try:
            module = __import__(module_name, fromlist=["_"])
        except ImportError:
            module = types.ModuleType(module_name)
            monkeypatch.setitem(sys.modules, module_name, module)
        for name in names:
            monkeypatch.setattr(module, name, getattr(recorded, name), raising=False)
    monkeypatch.setattr(
        "reservations.services.credit_policy_reservation_rate", lambda: Decimal("2")
    )
    monkeypatch.setattr("reservations.services.credit_policy_no_show_minutes", lambda: 15)
    yield recorded


@pytest.fixture
def clock() -> Iterator[Any]:
    with time_machine.travel(T0, tick=False) as traveller:
        yield traveller


@pytest.fixture
def gpus(db: Any) -> list[Any]:
    """gpu01 with GPUs 0-3, gpu02 with GPUs 0-3: all up and available."""
    made = []
    for name in ("gpu01", "gpu02"):
        node = NodeFactory(name=name)
        made += [GpuFactory(node=node, index=i) for i in range(4)]
    return made


def at(hours: float) -> datetime:
    return T0 + timedelta(hours=hours)
