"""The Chinese catalogue uses the glossary's word for each term (see docs/glossary.md).

The completeness test cannot catch a wrong word ("running" as 排空中); this one can. Each
rule is (English pattern, the Chinese word it requires, words it must never be).
"""

from __future__ import annotations

import re

import pytest

from tests.labportal.test_catalogue import LOCALE, po_entries

# (English, as a regex on the msgid) -> (required zh, forbidden zh words)
TERMS: list[tuple[str, str, tuple[str, ...]]] = [
    (r"\bjobs?\b", "作业", ("任务",)),
    # Not "%(queue)s" (a name), "in the queue" (a place) or "jobs still queue" (a verb).
    (r"(?<!\()(?<!in the )(?<!still )\bqueues?\b", "队列", ()),
    (r"\bdebug queue\b", "调试队列", ("debug 队列",)),
    (r"\bnormal queue\b", "普通队列", ("normal 队列",)),
    (r"\bhigh-priority queue\b", "高优先级队列", ()),
    (r"^running$", "运行中", ("排空中",)),
    (r"^pending$", "等待中", ()),
    (r"^completed$", "已完成", ()),
    (r"^failed$", "失败", ()),
    (r"^cancelled$", "已取消", ()),
    (r"^timed out$", "超时", ()),
    (r"^lost$", "丢失", ()),
    (r"\bpreempt(ed|ing|ible)?\b", "抢占", ()),
    (r"\brequeued\b", "重新排队", ()),
    (r"\b(position|place) in the queue\b", "排队位置", ()),
    (r"\bestimated start\b", "预计开始时间", ()),
    (r"\bwhy it waits\b", "等待原因", ()),
    (r"\btime limits?\b", "时间限制", ("时间上限",)),
    # Not "%(node)s" (a name) or 'node' (an API field).
    (r"(?<![('])\bnodes?\b", "节点", ()),
    (r"\bdrain(ing|ed)?\b", "排空", ()),
    (r"\bGPU memory\b", "显存", ("内存",)),
    (r"\bhost memory\b", "内存", ("显存",)),
    (r"^memory \(GiB\)$", "内存", ("显存",)),
    (r"\butilisation\b", "利用率", ()),
    (r"\bMIG instances?\b", "MIG 实例", ()),
    (r"\bshared slots?\b", "共享槽位", ()),
    (r"\b(booking|bookings|reservation|reservations)\b", "预约", ()),
    (r"\bno-show\b", "未使用的预约", ("爽约",)),
    (r"\bcredits?\b", "积分", ()),
    (r"\bledger\b", "积分明细", ("账目",)),
    (r"\bmonthly grant\b", "每月基础积分", ()),
    (r"\befficiency reward\b", "高效使用奖励", ()),
    # The approved right is 高优先级资格; 报备 is only the act of asking in advance.
    (r"\bpriority grants?\b", "高优先级资格", ("优先级因子", "优先级授权", "优先级许可", "报备")),
    (r"\bpriority factor\b", "优先级因子", ()),
    (r"\bfair[- ]share\b", "公平份额", ()),
    (r"\bemergency requests?\b", "紧急申请", ("紧急请求",)),
    (r"\bemergenc(y|ies)\b", "紧急", ()),
    (r"\bapprove\b", "批准", ()),
    (r"\breject(ed)?\b", "驳回", ("拒绝",)),
    (r"\bwithdraw(n)?\b", "撤回", ()),
    (r"^approvals$", "审批", ()),
    (r"\bcategor(y|ies)\b", "用户类别", ()),
    (r"\bcontainer images?\b", "容器镜像", ("容器运行时",)),
    (r"^images?$", "容器镜像", ()),
    (r"\bhost paths?\b", "主机路径", ("主机名",)),
    (r"\bmounts?\b", "挂载", ()),
    (r"\bAPI tokens?\b", "API 令牌", ()),
    (r"\bidle GPUs?\b", "空闲 GPU", ()),
    (r"\bsimulated\b", "模拟", ()),
]

# Messages where an English word is used in another sense than the glossary term.
SENSE_EXCEPTIONS = {
    # "credits" is the subject, "running low" is not the job state.
    "Your credits are running low",
    # Protocol messages the portal refused from an agent, not a staff decision.
    "rejected agent message",
    "rejected agent messages",
}


def test_every_catalogue_entry_uses_the_glossary_word_for_each_term() -> None:
    entries = po_entries(LOCALE / "django.po")
    wrong = []
    for msgid, msgstr in entries.items():
        if msgid in SENSE_EXCEPTIONS:
            continue
        # Placeholders such as %(drain)s are names, not words of the sentence.
        words = re.sub(r"%\(\w+\)[sdf]|\{\w+\}", "", msgid)
        for pattern, required, forbidden in TERMS:
            if not re.search(pattern, words, re.IGNORECASE):
                continue
            if required not in msgstr or any(word in msgstr for word in forbidden):
                wrong.append(f"{msgid!r} -> {msgstr!r}: wants {required}")
    assert wrong == []


@pytest.mark.parametrize(
    ("msgid", "msgstr"),
    [
        ("running", "运行中"),
        ("No output yet.", "还没有输出。"),
        ("Minimum GPU memory (GiB)", "最低显存（GiB）"),
        ("Memory (GiB)", "内存（GiB）"),
        ("priority grant", "高优先级资格"),
        ("Apply for a priority grant", "申请高优先级资格"),
        ("container image", "容器镜像"),
        ("host path", "主机路径"),
        ("Run in my reservation", "在我的预约中运行"),
        ("The queue factor of the multifactor priority, between 0 and 1.", None),
    ],
)
def test_the_entries_members_found_wrong_are_right(msgid: str, msgstr: str | None) -> None:
    entries = po_entries(LOCALE / "django.po")
    if msgstr is None:  # the queue factor's help text is not the category factor's
        assert "队列因子" in entries[msgid] and "类别" not in entries[msgid]
    else:
        assert entries[msgid] == msgstr


def test_the_catalogue_addresses_the_member_one_way() -> None:
    entries = po_entries(LOCALE / "django.po")
    assert [msgid for msgid, msgstr in entries.items() if "您" in msgstr] == []


def test_the_chinese_manual_names_the_approved_grant_as_the_catalogue_does() -> None:
    from pathlib import Path

    manual = Path(__file__).resolve().parents[2] / "docs" / "manual" / "zh-hans"
    text = "\n".join(page.read_text(encoding="utf-8") for page in sorted(manual.glob("*.md")))
    assert "高优先级资格" in text
    # 报备 is the verb (提前报备), never the name of the thing granted.
    assert re.findall(r"\S{0,6}报备\S{0,6}", text.replace("提前报备", "")) == []
