"""The demo lab the README's `make demo` seeds."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command

from accounts.models import Category, CreditAccount, User
from agent.gpu.simulated import simulated_gpu_uuid
from cluster.models import Gpu, Node, NodeToken

pytestmark = pytest.mark.django_db


def test_the_demo_lab_is_seeded_once_however_often_it_runs(settings: Any, tmp_path: Path) -> None:
    settings.VAR_DIR = tmp_path
    call_command("seed_demo")
    call_command("seed_demo")

    assert set(User.objects.values_list("username", flat=True)) == {
        "admin",
        "alice",
        "bob",
        "charlie",
    }
    assert (
        User.objects.get(username="alice").category != User.objects.get(username="charlie").category
    )
    assert sorted(Node.objects.values_list("name", flat=True)) == ["sim-node-1", "sim-node-2"]
    # The simulated agents register the same UUIDs, so the seeded GPUs are theirs.
    assert Gpu.objects.filter(uuid=simulated_gpu_uuid("sim-node-2", 3)).exists()
    assert Gpu.objects.exclude(kind=Gpu.Kind.SLOT).count() == 8
    # The debug queue can run two jobs on one GPU: its two shared slots.
    shared = Gpu.objects.get(uuid=simulated_gpu_uuid("sim-node-2", 3))
    assert shared.shared_slots == 2 and shared.children.filter(kind=Gpu.Kind.SLOT).count() == 2
    assert all(balance > 0 for balance in CreditAccount.objects.values_list("balance", flat=True))
    agents = json.loads((tmp_path / "demo-agents.json").read_text())
    for agent in agents:
        assert NodeToken.matches(node_name=agent["name"], secret=agent["token"])


def test_the_demo_categories_have_chinese_names_also_in_a_lab_seeded_before_them(
    settings: Any, tmp_path: Path
) -> None:
    settings.VAR_DIR = tmp_path
    Category.objects.create(name="Master", name_zh_hans="")  # seeded by an older demo
    Category.objects.create(name="Staff", name_zh_hans="职员")  # named by the admin: kept
    call_command("seed_demo")
    assert dict(Category.objects.values_list("name", "name_zh_hans")) == {
        "PhD, thesis phase": "博士（论文阶段）",
        "Master": "硕士",
        "Staff": "职员",
    }


def test_the_demo_history_comes_with_a_fitted_demand_forecast(
    settings: Any, tmp_path: Path
) -> None:
    from reports.models import DemandForecast

    settings.VAR_DIR = tmp_path
    call_command("seed_demo")
    call_command("seed_demo_history", stdout=io.StringIO())
    forecast = DemandForecast.objects.get().forecast
    assert forecast is not None and len(forecast["mean"]) == 8  # the page needs no fit
    call_command("seed_demo_history", stdout=io.StringIO())
    assert DemandForecast.objects.count() == 1  # the data did not change: no refit
