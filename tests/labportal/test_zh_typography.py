"""Chinese text reads as written by a native: full-width punctuation, no stray spaces.

Checked over every zh-hans msgstr of the compiled catalogue and every page of the rendered
Chinese manual (where a line break inside a paragraph would become a space). The rules are
those of the glossary's "Writing Chinese text".
"""

from __future__ import annotations

import gettext
import html
import re
from typing import Any

import pytest

from handbook.manual import PAGES, render_page
from tests.labportal.test_catalogue import LOCALE

# ASCII .,:;() and " touching Chinese are the English marks, not the full-width ones.
# Han characters and CJK/full-width punctuation (，。：；（）、 are in these blocks; the
# quotes “” are not: they may open or close a Latin word, which may have a space before).
CJK = r"[\u3000-\u303f\u4e00-\u9fff\uff00-\uffef]"
# What is not prose is replaced by a neutral mark before checking: code, URLs, format
# placeholders, HTML tags (their attributes are not text).
NEUTRAL = "\u2063"
NOT_PROSE = re.compile(
    r"<(pre|code)\b.*?</\1>"  # code (the manual)
    r"|https?://\S+"  # URLs
    r"|%\(\w+\)[sdfi]|%[sdfi]|%%"  # %(name)s, %d, %%
    r"|\{\w*\}"  # {x}
    r"|[A-Za-z_][\w.]*\([^()]*\)"  # a call written out, Decimal('12.5')
    r"|<[^>]+>",  # tags
    re.DOTALL,
)
RULES: list[tuple[str, re.Pattern[str]]] = [
    # (Not in a date's 2026年12月2日 星期三, where the glossary puts one.)
    ("space between two Chinese characters", re.compile(rf"(?!日 星期){CJK}[ \t\u00a0]+{CJK}")),
    (
        "ASCII punctuation next to a Chinese character",
        re.compile(rf"{CJK}[.,:;()\"]|[.,:;()\"]{CJK}"),
    ),
    # (“..” quoted, the parent folder, is a name, not two full stops.)
    ("doubled full stop", re.compile(r"。\s*[。.]|\.\s*。|(?<![.“])\.\.(?![.”])")),
]


def typography_faults(text: str) -> list[str]:
    """Each fault in a piece of Chinese text, with a few characters around it."""
    prose = NOT_PROSE.sub(NEUTRAL, text)
    faults = []
    for name, rule in RULES:
        for match in rule.finditer(prose):
            start, end = max(match.start() - 8, 0), match.end() + 8
            faults.append(f"{name}: …{prose[start:end].replace(NEUTRAL, '·')}…")
    return faults


# Placeholders whose value ends in Chinese (a duration, a date), so that a space after
# them in a msgstr is a space between two Chinese characters once filled in.
CHINESE_VALUES = {
    "duration": "2 秒",
    "now": "3 小时",
    "left": "3 小时 20 分钟",
    "date": "2026年12月2日",
    "day": "2026年12月2日",
    "week": "2026年11月30日",
}


def with_chinese_values(msgstr: str) -> str:
    return re.sub(r"%\((\w+)\)s", lambda m: CHINESE_VALUES.get(m.group(1), m.group(0)), msgstr)


def catalogue_msgstrs() -> list[str]:
    with (LOCALE / "django.mo").open("rb") as handle:
        compiled = gettext.GNUTranslations(handle)
    catalog: dict[object, str] = compiled._catalog  # type: ignore[attr-defined]
    return [msgstr for msgid, msgstr in catalog.items() if msgid and msgstr]


def manual_text(slug: str) -> str:
    page = render_page(slug, "zh-hans")
    # Code goes before tags are dropped; block ends become line breaks, not joins.
    body = re.sub(r"<pre\b.*?</pre>|<code\b.*?</code>", NEUTRAL, page.html, flags=re.DOTALL)
    # A browser shows a line break inside a paragraph as a space.
    body = body.replace("\n", " ")
    body = re.sub(
        r"</?(p|li|ul|ol|h\d|tr|td|th|table|thead|tbody|blockquote|br)\b[^>]*>", "\n", body
    )
    return html.unescape(re.sub(r"<[^>]+>", "", page.title + "\n" + body))


@pytest.mark.parametrize(
    ("text", "fault"),
    [
        ("或 打开预约表单.", "space between two Chinese characters"),
        ("运行 2 秒 后已完成。", "space between two Chinese characters"),
        ("你的用户类别、 每月基础积分", "space between two Chinese characters"),
        ("或打开预约表单.", "ASCII punctuation next to a Chinese character"),
        ("内存(GiB)", "ASCII punctuation next to a Chinese character"),
        ("星期三, 2026年12月2日", "ASCII punctuation next to a Chinese character"),
        ("状态: 运行中", "ASCII punctuation next to a Chinese character"),
        ('打开"提交"页面', "ASCII punctuation next to a Chinese character"),
        ("已完成。。", "doubled full stop"),
        ("已完成。.", "doubled full stop"),
        (
            with_chinese_values("运行 %(duration)s 后已完成。"),
            "space between two Chinese characters",
        ),
    ],
)
def test_the_check_finds_each_kind_of_fault(text: str, fault: str) -> None:
    assert any(found.startswith(fault) for found in typography_faults(text))


@pytest.mark.parametrize(
    "text",
    [
        "每个作业最多 4 块 GPU，每 GPU 小时 2.5 积分。",
        "%(queue)s 队列需要已批准的高优先级资格。",
        "在 %(date)s 之前（%(days)d 天）",
        "运行 <code>labctl submit --gpus 2</code> 命令。",
        "见 https://example.org/a.b,c 页面",
        '<a href="%(url)s" data-x="a:b">申请</a>。',
        "例如 2025-06-30 18:00。",
    ],
)
def test_the_check_leaves_numbers_code_urls_and_placeholders_alone(text: str) -> None:
    assert typography_faults(text) == []


def test_no_catalogue_entry_breaks_the_rules_of_chinese_text() -> None:
    faults = [
        f"{fault} in {msgstr!r}"
        for msgstr in catalogue_msgstrs()
        for fault in typography_faults(with_chinese_values(msgstr))
    ]
    assert faults == []


@pytest.mark.parametrize("slug", [page.slug for page in PAGES])
def test_no_rendered_chinese_manual_page_breaks_the_rules_of_chinese_text(slug: str) -> None:
    assert typography_faults(manual_text(slug)) == []


@pytest.mark.parametrize(
    ("language", "shown"), [("en", "State: running"), ("zh-hans", "状态：运行中")]
)
def test_a_label_and_its_value_are_joined_as_the_language_writes_it(
    language: str, shown: str
) -> None:
    from django.template import Context, Template
    from django.utils import translation

    template = Template(
        '{% load i18n %}{% translate "State" %}{% label_sep %}{% translate "running" %}'
    )
    with translation.override(language):
        assert template.render(Context({})) == shown


def test_a_chinese_date_and_time_puts_the_weekday_after_the_date() -> None:
    from datetime import datetime

    from django.utils import formats, translation

    moment = datetime(2026, 12, 2, 14, 0)
    with translation.override("zh-hans"):
        assert formats.date_format(moment, "DATETIME_FORMAT") == "2026年12月2日 星期三 14:00"
        assert formats.date_format(moment, "DATE_FORMAT") == "2026年12月2日"


def page_text(html_page: str) -> str:
    """The visible text of a page's main part: scripts, styles and code dropped."""
    main = html_page.split("<main", 1)[-1].split("</main>", 1)[0]
    main = re.sub(r"<(script|style)\b.*?</\1>", "", main, flags=re.DOTALL)
    main = re.sub(r"<pre\b.*?</pre>|<code\b.*?</code>", NEUTRAL, main, flags=re.DOTALL)
    # The help link beside a heading is a control of its own, not a word of the heading.
    main = re.sub(r'<a class="helplink".*?</a>', "\n", main, flags=re.DOTALL)
    main = re.sub(
        r"</?(p|li|ul|ol|h\d|tr|td|th|table|thead|tbody|div|section|dl|dt|dd|form|label|"
        r"select|option|button|nav|header|footer|br)\b[^>]*>",
        "\n",
        main,
    )
    return html.unescape(re.sub(r"<[^>]+>", "", main))


@pytest.mark.django_db
@pytest.mark.parametrize(
    "url", ["/", "/rules/", "/account/credits/", "/reservations/", "/jobs/", "/jobs/submit/"]
)
def test_the_pages_a_new_member_reads_first_break_no_rule_in_chinese(
    client: Any, alice: Any, cluster: Any, url: str
) -> None:
    client.force_login(alice)
    client.cookies["django_language"] = "zh-hans"
    response = client.get(url)
    assert response.status_code == 200
    faults = typography_faults(page_text(response.content.decode()))
    assert faults == [], "\n".join(faults)
