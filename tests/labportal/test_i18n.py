from __future__ import annotations

import re
from typing import Any

import pytest
from django.test import Client
from django.urls import reverse

pytestmark = pytest.mark.django_db


def test_the_dashboard_renders_in_chinese(client: Client, alice: Any) -> None:
    client.force_login(alice)
    client.post(reverse("set_language"), {"language": "zh-hans", "next": "/"})
    html = client.get(reverse("dashboard")).content.decode()
    assert 'lang="zh-hans"' in html
    assert "仪表盘" in html
    assert "我的作业" in html
    assert "GPU 服务器" in client.get(reverse("gpu_live")).content.decode()


def test_the_gpus_page_lists_nodes_and_gpus(client: Client, alice: Any) -> None:
    from tests.factories import GpuFactory, NodeFactory

    node = NodeFactory(name="gpu07")
    GpuFactory(node=node, index=0, model="NVIDIA H200")
    client.force_login(alice)
    html = client.get(reverse("gpu_live")).content.decode()
    assert "gpu07" in html
    assert "NVIDIA H200" in html


def test_htmx_is_served_by_the_portal_itself(client: Client) -> None:
    from django.contrib.staticfiles import finders

    assert finders.find("vendor/htmx/htmx.min.js")
    html = client.get(reverse("account_login")).content.decode()
    assert "/static/vendor/htmx/htmx.min.js" in html
    # Every script and stylesheet comes from the portal's own static files, none from a
    # CDN. (Not a search for "cdn" in the page: a random CSRF token may contain it.)
    assets = re.findall(r'<(?:script|link)\b[^>]*\b(?:src|href)="([^"]+)"', html)
    assert assets and all(a.startswith("/static/") for a in assets), assets
