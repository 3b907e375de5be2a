"""Posting an admin change form as a browser would: every value as the form shows it, with
the test's changes on top."""

from __future__ import annotations

from html.parser import HTMLParser

from django.test import Client


class FormValues(HTMLParser):
    """The values a browser would post back from an admin change form, unchanged."""

    def __init__(self) -> None:
        super().__init__()
        self.values: dict[str, str] = {}
        self._select: str | None = None
        self._textarea: str | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        name = a.get("name")
        if tag == "input" and name and a.get("type") not in ("submit", "button"):
            if a.get("type") == "checkbox":
                if "checked" in a:
                    self.values[name] = "on"
            else:
                self.values[name] = a.get("value") or ""
        elif tag == "select" and name:
            self._select = name
        elif tag == "option" and self._select and "selected" in a:
            self.values[self._select] = a.get("value") or ""
        elif tag == "textarea" and name:
            self._textarea = name
            self.values[name] = ""

    def handle_endtag(self, tag: str) -> None:
        if tag == "select":
            self._select = None
        if tag == "textarea":
            self._textarea = None

    def handle_data(self, data: str) -> None:
        if self._textarea:
            self.values[self._textarea] += data.strip("\n")


def admin_change(client: Client, url: str, **changes: str) -> None:
    parser = FormValues()
    parser.feed(client.get(url).content.decode())
    data = {**parser.values, **changes}
    response = client.post(url, data)
    assert response.status_code == 302, response.content.decode()[-3000:]
