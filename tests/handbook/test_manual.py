"""The in-app manual: every page in both languages, no dead link from the app or within it."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.template import Context, Template, TemplateSyntaxError
from django.test import Client
from django.urls import reverse
from django.utils.html import escape

from handbook.manual import LANGUAGES, PAGES, PAGES_BY_SLUG, internal_links, render_page

TEMPLATES = Path(settings.BASE_DIR) / "templates"


def test_every_page_has_a_source_in_every_language() -> None:
    for page in PAGES:
        for language in LANGUAGES:
            source = page.source(language)
            assert source.is_file(), f"{page.slug} has no {language} text at {source}"
            assert source.read_text().startswith("# "), f"{source} must start with its title"


def test_the_manual_has_no_page_in_one_language_only() -> None:
    for language in LANGUAGES:
        files = {p.stem for p in (Path(settings.BASE_DIR) / "docs/manual" / language).glob("*.md")}
        expected = {p.slug for p in PAGES if language != "en" or not p.english_source}
        assert files == expected, f"docs/manual/{language} has pages the manual does not list"


@pytest.mark.django_db
@pytest.mark.parametrize("language", LANGUAGES)
@pytest.mark.parametrize("slug", [p.slug for p in PAGES])
def test_each_page_renders_in_each_language(client: Client, slug: str, language: str) -> None:
    response = client.get(f"/help/{slug}/", HTTP_ACCEPT_LANGUAGE=language)
    assert response.status_code == 200
    html = response.content.decode()
    title = render_page(slug, language).title
    assert f"<h1>{escape(title)}</h1>" in html
    # The page is in the reader's language: Chinese pages are Chinese, English ones are not.
    article = html.split('data-testid="manual-page"', 1)[1]
    has_chinese = bool(re.search(r"[\u4e00-\u9fff]", article))
    assert has_chinese == (language == "zh-hans")
    # Markdown was rendered, not shown as source: no heading marks or code fences left over.
    assert "<p>" in article
    assert not re.search(r"(^|\n)\s*#{2,} |```|<p><code>(sh|python)\n", article)
    if "```" in render_page(slug, language).page.source(language).read_text():
        assert "<pre><code" in article


@pytest.mark.django_db
def test_links_between_manual_pages_all_resolve(client: Client) -> None:
    for page in PAGES:
        for language in LANGUAGES:
            html = render_page(page.slug, language).html
            assert '.md"' not in html, f"{page.slug} ({language}) links to a file the manual lacks"
            for target in internal_links(html):
                if target == "tutorial":  # the guided first job, a page of its own
                    assert client.get(reverse("tutorial")).status_code == 302  # to log in
                    continue
                assert target in PAGES_BY_SLUG, f"{page.slug} ({language}) links to {target}"


def test_every_help_link_in_the_app_names_a_manual_page() -> None:
    used = set()
    for template in TEMPLATES.rglob("*.html"):
        for slug in re.findall(r'{%\s*help_link\s+"([^"]+)"', template.read_text()):
            assert slug in PAGES_BY_SLUG, f"{template} links to the missing manual page {slug}"
            used.add(slug)
    # The pages where each topic arises link to it.
    assert {
        "submitting-jobs",
        "queues-and-priority",
        "booking",
        "credits-grants-emergencies",
    } <= used


def test_a_help_link_to_a_missing_page_fails_loudly() -> None:
    with pytest.raises(TemplateSyntaxError, match="no manual page 'nope'"):
        Template('{% help_link "nope" %}').render(Context({}))


@pytest.mark.django_db
def test_the_submit_form_links_to_its_help(client: Client, alice: Any, queues: Any) -> None:
    client.force_login(alice)
    html = client.get("/jobs/submit/").content.decode()
    assert 'href="/help/submitting-jobs/"' in html


@pytest.mark.django_db
def test_an_unknown_manual_page_is_a_404(client: Client) -> None:
    assert client.get("/help/no-such-page/").status_code == 404
    assert client.get("/help/")["Location"] == "/help/getting-started/"


@pytest.mark.django_db
def test_the_english_install_guide_is_docs_deployment_md(client: Client) -> None:
    text = (Path(settings.BASE_DIR) / "docs/deployment.md").read_text()
    assert render_page("admin-install", "en").title == text.splitlines()[0].removeprefix("# ")
    html = client.get("/help/admin-install/", HTTP_ACCEPT_LANGUAGE="en").content.decode()
    assert "Docker socket" in html and "REDIS_BIND" in html


def test_wrapped_chinese_lines_join_but_a_heading_keeps_its_paragraph() -> None:
    import markdown

    from handbook.manual import _join_wrapped_cjk

    text = (
        "## 谁可以打开\n只有你和实验室的\n管理员。\n\n- 第一项，\n  **缩进的续行**\n- 第二项\n\n"
        "见\n[使用规则](rules.md)。English\nwrapped\n\n```\n代码\n第二行\n```"
    )
    html = _join_wrapped_cjk(markdown.markdown(text, extensions=["fenced_code"]))
    # The wrapped sentence is one line with no space; the heading stays a heading of its own.
    assert "<h2>谁可以打开</h2>" in html and "<p>只有你和实验室的管理员。</p>" in html
    # An indented continuation and a link at the start of a line join as well.
    assert "<li>第一项，<strong>缩进的续行</strong></li>" in html
    assert '见<a href="rules.md">使用规则</a>。' in html
    # English keeps its space, and code its lines.
    assert "English\nwrapped" in html and "代码\n第二行" in html
