"""The in-app user manual: Markdown files in the repository, rendered by the portal.

The files under docs/ are the one source: the English deployment guide is
docs/deployment.md itself, every other page is docs/manual/<language>/<slug>.md.
A page's title is its first "# " heading, so titles are translated where the text is.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import markdown
from django.conf import settings
from django.urls import reverse

DOCS = Path(settings.BASE_DIR) / "docs"
LANGUAGES = ("en", "zh-hans")


@dataclass(frozen=True)
class ManualPage:
    slug: str
    for_admins: bool = False
    # A page whose English text is a docs/ file of its own, not docs/manual/en/<slug>.md.
    english_source: str = ""

    def source(self, language: str) -> Path:
        if language == "en" and self.english_source:
            return DOCS / self.english_source
        return DOCS / "manual" / language / f"{self.slug}.md"


PAGES: tuple[ManualPage, ...] = (
    ManualPage("getting-started"),
    ManualPage("submitting-jobs"),
    ManualPage("queues-and-priority"),
    ManualPage("booking"),
    ManualPage("credits-grants-emergencies"),
    ManualPage("alerts"),
    ManualPage("sessions", english_source="sessions.md"),
    ManualPage("files"),
    ManualPage("exercises"),
    ManualPage("faq"),
    ManualPage("admin-install", for_admins=True, english_source="deployment.md"),
    ManualPage("admin-gpu-servers", for_admins=True),
    ManualPage("admin-slurm", for_admins=True, english_source="slurm.md"),
    ManualPage("admin-rules", for_admins=True),
    ManualPage("admin-backups", for_admins=True),
    ManualPage("admin-upgrades", for_admins=True),
    ManualPage("admin-training", for_admins=True),
)
PAGES_BY_SLUG = {page.slug: page for page in PAGES}

# Chinese text wrapped over source lines must not get a space where the line broke: a
# browser shows a line break inside a paragraph as a space. The break is dropped from the
# rendered HTML (so Markdown has already told paragraphs, headings and list items apart)
# wherever the visible characters on both sides are Chinese, tags such as **bold** or a
# link between them or not. Code blocks keep their lines.
_CJK = "[\u3000-\u303f\u4e00-\u9fff\uff00-\uffef\u201c\u201d]"
_WRAPPED_CJK = re.compile(rf"(?<={_CJK})((?:<[^>]+>)*)[ \t]*\n\s*((?:<[^>]+>)*)(?={_CJK})")
_PRE = re.compile(r"(<pre\b.*?</pre>)", re.DOTALL)


def _join_wrapped_cjk(html: str) -> str:
    """The HTML with no line break left between two Chinese characters outside <pre>."""
    parts = _PRE.split(html)
    return "".join(
        part if part.startswith("<pre") else _WRAPPED_CJK.sub(r"\1\2", part) for part in parts
    )


# Links between pages are written as relative .md links, so they also work when the
# files are read on a code host; the portal turns them into its own URLs.
_MD_LINK = re.compile(r'href="(?:[\w./-]*/)?([a-z0-9-]+)\.md(#[\w-]*)?"')


@dataclass(frozen=True)
class RenderedPage:
    page: ManualPage
    title: str
    html: str


def manual_language(language: str | None) -> str:
    return "zh-hans" if (language or "").lower().startswith("zh") else "en"


def _link(match: re.Match[str]) -> str:
    slug, anchor = match.group(1), match.group(2) or ""
    if slug == "deployment":
        slug = "admin-install"
    if slug not in PAGES_BY_SLUG:
        return match.group(0)
    return f'href="{reverse("help_page", args=[slug])}{anchor}"'


@lru_cache(maxsize=64)
def render_page(slug: str, language: str) -> RenderedPage:
    """The page in the language (English when the language has no manual); KeyError if unknown."""
    page = PAGES_BY_SLUG[slug]
    text = page.source(manual_language(language)).read_text(encoding="utf-8")
    first, _, rest = text.partition("\n")
    title = first.removeprefix("# ").strip() if first.startswith("# ") else slug
    body = markdown.markdown(
        rest,
        extensions=["tables", "fenced_code", "sane_lists", "toc"],
        output_format="html",
    )
    html = _join_wrapped_cjk(_MD_LINK.sub(_link, body))
    return RenderedPage(page=page, title=title, html=html)


def internal_links(html: str) -> list[str]:
    """The manual pages a rendered page links to, by slug (for the link test)."""
    return re.findall(r'href="/help/([a-z0-9-]+)/', html)
