"""The page, the CSV files and the API give the same numbers; members see only their own line."""

from __future__ import annotations

import csv
import io
import re
from typing import Any

import pytest
import time_machine
from django.test import Client
from django.utils import translation

from accounts.models import Category
from reports import charts
from tests.conftest import PASSWORD, api_as
from tests.reports.conftest import NOW

pytestmark = pytest.mark.django_db
QUERY = "period=custom&from=2026-03-02&to=2026-03-08"


def login(user: Any) -> Client:
    client = Client()
    assert client.login(username=user.username, password=PASSWORD)
    return client


def csv_rows(client: Client, slug: str) -> list[dict[str, str]]:
    response = client.get(f"/reports/csv/{slug}.csv?{QUERY}")
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/csv")
    return list(csv.DictReader(io.StringIO(response.content.decode())))


@time_machine.travel(NOW, tick=False)
def test_csv_and_api_carry_the_same_rows_as_the_page(week: Any, admin_user: Any) -> None:
    client = login(admin_user)
    page = client.get(f"/reports/?{QUERY}")
    assert page.status_code == 200
    html = page.content.decode()
    api = api_as(admin_user).get(f"/api/reports/usage/?{QUERY}").json()
    for slug in (
        "totals",
        "user",
        "category",
        "queue",
        "node",
        "model",
        "waits",
        "weeks",
        "bookings",
    ):
        rows = csv_rows(client, slug)
        assert len(rows) == len(api[slug]), slug
        for row, api_row in zip(rows, api[slug], strict=True):
            assert row == {k: "" if v is None else str(v) for k, v in api_row.items()}
            name = api_row[next(iter(api_row))]
            # The lab's totals are "lab" in the CSV and the API, in words on the page.
            assert f"<td>{'whole lab' if name == 'lab' else name}</td>" in html
    alice = next(r for r in csv_rows(client, "user") if r["name"] == "alice")
    assert (alice["gpu_hours"], alice["used_gpu_hours"], alice["mean_util_pct"]) == (
        "28.0",
        "10.0",
        "50.0",
    )
    assert "<td>28.0</td>" in html and "<td>8.3</td>" in html  # alice's hours, normal's p95 wait
    assert api["weeks"][0]["unmet_gpu_hours"] == 36.0


@time_machine.travel(NOW, tick=False)
def test_a_chinese_page_names_categories_and_the_lab_totals_in_chinese_the_csv_and_api_keep_them(
    week: Any, admin_user: Any
) -> None:
    Category.objects.filter(name="PhD, thesis phase").update(name_zh_hans="博士（论文阶段）")
    client = login(admin_user)
    html = client.get(f"/reports/?{QUERY}", HTTP_ACCEPT_LANGUAGE="zh-hans").content.decode()
    categories = html.split('data-testid="table-category"')[1].split("</section>")[0]
    assert "<td>博士（论文阶段）</td>" in categories
    assert "<td>Master</td>" in categories  # no Chinese name: the English one
    assert "PhD, thesis phase" not in html
    totals = html.split('data-testid="table-totals"')[1].split("</section>")[0]
    bookings = html.split('data-testid="table-bookings"')[1].split("</section>")[0]
    assert "<td>全实验室</td>" in totals and "<td>全实验室</td>" in bookings
    assert "<td>lab</td>" not in html
    # The CSV and the API keep the identifiers, in any language.
    assert "PhD, thesis phase" in [r["name"] for r in csv_rows(client, "category")]
    api = api_as(admin_user).get(f"/api/reports/usage/?{QUERY}", HTTP_ACCEPT_LANGUAGE="zh-hans")
    assert {r["name"] for r in api.json()["category"]} == {"PhD, thesis phase", "Master"}
    assert api.json()["totals"][0]["name"] == "lab"
    assert api.json()["bookings"][-1]["user"] == "lab"


@time_machine.travel(NOW, tick=False)
def test_a_member_gets_totals_and_only_their_own_line_everywhere(week: Any, bob: Any) -> None:
    client = login(bob)
    html = client.get(f"/reports/?{QUERY}").content.decode()
    assert "alice" not in html and "charlie" not in html
    assert [r["name"] for r in csv_rows(client, "user")] == ["bob"]
    assert client.get(f"/reports/csv/category.csv?{QUERY}").status_code == 404
    api = api_as(bob).get(f"/api/reports/usage/?{QUERY}").json()
    assert [r["name"] for r in api["user"]] == ["bob"] and "category" not in api
    assert api["totals"][0]["gpu_hours"] == 36.0
    assert [r["user"] for r in api["bookings"]] == ["bob", "lab"]


def test_bad_periods_get_a_400_that_says_how_to_fix_them(week: Any, admin_user: Any) -> None:
    client = login(admin_user)
    api = api_as(admin_user)
    for query, words in (
        ("period=custom&from=2026-03-08&to=2026-03-02", "ends before it starts"),
        ("period=custom&from=2026-03-02", "needs both"),
        ("period=custom&from=03/02/2026&to=2026-03-08", "YYYY-MM-DD"),
        ("period=decade", "month, quarter, year or custom"),
        ("period=custom&from=2020-01-01&to=2026-01-01", "at most three years"),
    ):
        response = api.get(f"/api/reports/usage/?{query}")
        assert response.status_code == 400 and words in response.json()["detail"], query
        assert client.get(f"/reports/csv/user.csv?{query}").status_code == 400
        assert client.get(f"/reports/?{query}").status_code == 400
    assert client.get(f"/reports/csv/nothing.csv?{QUERY}").status_code == 404


def test_reports_need_a_login(week: Any) -> None:
    assert Client().get(f"/reports/?{QUERY}").status_code == 302
    assert Client().get(f"/api/reports/usage/?{QUERY}").status_code in (401, 403)


@time_machine.travel(NOW, tick=False)
def test_the_weekly_chart_is_a_png(week: Any, admin_user: Any) -> None:
    response = login(admin_user).get(f"/reports/charts/weekly.png?{QUERY}")
    assert response.status_code == 200 and response.content[:8] == b"\x89PNG\r\n\x1a\n"


@time_machine.travel(NOW, tick=False)
def test_the_weekly_chart_draws_the_figures_its_page_left_without_a_second_report(
    week: Any, admin_user: Any, monkeypatch: Any
) -> None:
    client = login(admin_user)
    html = client.get(f"/reports/?{QUERY}").content.decode()
    version = re.search(r"weekly\.png\?[^\"]*v=([0-9a-f]+)", html)
    assert version is not None

    def no_second_report(**kwargs: Any) -> None:
        raise AssertionError("the chart built the report again")

    monkeypatch.setattr("reports.views.usage_report", no_second_report)
    chart = client.get(f"/reports/charts/weekly.png?{QUERY}&v={version[1]}")
    assert chart.status_code == 200 and chart.content[:8] == b"\x89PNG\r\n\x1a\n"
    # A name the cache does not know (another link, an emptied cache): the report again.
    with pytest.raises(AssertionError, match="built the report again"):
        client.get(f"/reports/charts/weekly.png?{QUERY}&v=0123abcd")


def test_a_cached_chart_is_named_by_its_data_and_language(db: Any) -> None:
    drawn: list[str] = []

    def draw(label: str) -> bytes:
        drawn.append(label)
        return label.encode()

    points = [("2026-03-02", 50.0, 25.0)]
    assert charts.cached_png("weekly", points, lambda: draw("a")) == b"a"
    assert charts.cached_png("weekly", list(points), lambda: draw("b")) == b"a"
    changed = [("2026-03-02", 50.0, 25.5)]
    assert charts.cached_png("weekly", changed, lambda: draw("c")) == b"c"
    with translation.override("zh-hans"):
        assert charts.cached_png("weekly", points, lambda: draw("d")) == b"d"
    assert drawn == ["a", "c", "d"]


def test_the_schema_documents_the_usage_report(db: Any, admin_user: Any) -> None:
    schema = api_as(admin_user).get("/api/schema/?format=json").json()
    operation = schema["paths"]["/api/v1/reports/usage/"]["get"]
    assert {p["name"] for p in operation["parameters"]} >= {"period", "from", "to"}
    assert "UsageReport" in schema["components"]["schemas"]
    assert "/api/v1/reports/tasks/{id}/apply/" in schema["paths"]


@time_machine.travel(NOW, tick=False)
def test_staff_see_every_replay_setting_labelled_in_their_language(
    week: Any, admin_user: Any
) -> None:
    client = login(admin_user)
    html = client.get(f"/reports/?{QUERY}", HTTP_ACCEPT_LANGUAGE="zh-hans").content.decode()
    assert 'name="queue:normal:max_running_gpus_per_user"' in html
    assert 'name="drain_reserve_nodes"' in html and 'name="debug_gpus"' in html
    assert "排空预留" in html and "权重：公平份额" in html


@time_machine.travel(NOW, tick=False)
def test_the_replay_form_sends_queue_limits_drain_reserve_and_debug_gpus_as_one_option(
    week: Any, admin_user: Any, django_capture_on_commit_callbacks: Any
) -> None:
    from reports.models import ReportTask

    client = login(admin_user)
    form = {
        "kind": "replay",
        "period": "custom",
        "from": "2026-03-02",
        "to": "2026-03-08",
        "gpu_count": "0",
        "queue:normal:max_running_gpus_per_user": "2",
        "drain_reserve_nodes": "0",
        "debug_gpus": "1",
    }
    with django_capture_on_commit_callbacks(execute=False):
        response = client.post("/reports/tasks/", form)
    assert response.status_code == 302
    task = ReportTask.objects.get()
    assert task.params["options"][-1]["policy_changes"] == {
        "queue:normal:max_running_gpus_per_user": 2.0,
        "drain_reserve_nodes": 0.0,
        "debug_gpus": 1.0,
    }
    form["drain_reserve_nodes"] = "0.5"
    response = client.post("/reports/tasks/", form, follow=True)
    assert "must be a whole number" in response.content.decode()
