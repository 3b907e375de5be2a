"""The Chinese catalogue is complete and compiled: no string falls back to English."""

from __future__ import annotations

import ast
import gettext
from pathlib import Path

LOCALE = Path(__file__).resolve().parents[2] / "locale" / "zh_Hans" / "LC_MESSAGES"


def po_entries(path: Path) -> dict[str, str]:
    entries: dict[str, str] = {}
    for block in path.read_text(encoding="utf-8").split("\n\n"):
        lines = [line for line in block.splitlines() if not line.startswith("#~")]
        if any(line.startswith("#,") and "fuzzy" in line for line in lines):
            msgid = "".join(
                ast.literal_eval(line.split(" ", 1)[1]) if line.startswith("msgid ") else ""
                for line in lines
            )
            if msgid:
                raise AssertionError(f"fuzzy translation left in the catalogue: {msgid!r}")
        field, parts = None, {"msgid": [], "msgstr": []}  # type: ignore[var-annotated]
        for line in lines:
            if line.startswith("msgid "):
                field = "msgid"
                parts[field].append(ast.literal_eval(line[6:]))
            elif line.startswith(("msgstr ", "msgstr[0] ")):
                field = "msgstr"
                parts[field].append(ast.literal_eval(line.split(" ", 1)[1]))
            elif line.startswith(("msgid_plural", "msgstr[")):
                field = None
            elif line.startswith('"') and field:
                parts[field].append(ast.literal_eval(line))
        msgid = "".join(parts["msgid"])
        if msgid:
            entries[msgid] = "".join(parts["msgstr"])
    return entries


def test_every_string_has_a_chinese_translation() -> None:
    entries = po_entries(LOCALE / "django.po")
    assert len(entries) > 100
    untranslated = [msgid for msgid, msgstr in entries.items() if not msgstr]
    assert untranslated == []


def test_the_compiled_catalogue_matches_the_source() -> None:
    entries = po_entries(LOCALE / "django.po")
    with (LOCALE / "django.mo").open("rb") as handle:
        compiled = gettext.GNUTranslations(handle)
    for msgid, msgstr in entries.items():
        assert compiled.gettext(msgid) == msgstr or compiled.ngettext(msgid, msgid, 1) == msgstr, (
            msgid
        )
