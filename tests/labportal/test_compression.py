"""Pages and API answers are gzipped for a client that accepts it; streams, binary files,
small answers and clients that do not ask are sent as they are."""

from __future__ import annotations

import gzip
from typing import Any

import pytest
from django.http import HttpResponse, StreamingHttpResponse
from django.test import Client, RequestFactory

from labportal.middleware import CompressedPagesMiddleware
from tests.factories import GpuFactory, NodeFactory

pytestmark = pytest.mark.django_db


def _through(response: HttpResponse | StreamingHttpResponse, encoding: str = "gzip") -> Any:
    request = RequestFactory().get("/", HTTP_ACCEPT_ENCODING=encoding)
    return CompressedPagesMiddleware(lambda r: response)(request)


def test_a_page_is_compressed_for_a_browser_that_accepts_gzip(client: Client, alice: Any) -> None:
    node = NodeFactory(name="gpu01", state="up")
    for index in range(4):
        GpuFactory(node=node, index=index, uuid=f"GPU-{index}")
    client.force_login(alice)
    plain = client.get("/reservations/")
    packed = client.get("/reservations/", HTTP_ACCEPT_ENCODING="gzip, deflate, br")
    assert "Content-Encoding" not in plain
    assert packed["Content-Encoding"] == "gzip"
    assert "Accept-Encoding" in packed["Vary"]
    page = gzip.decompress(packed.content).decode()
    assert 'data-testid="gpu-row-gpu01/gpu3"' in page
    assert len(packed.content) < len(plain.content) / 4
    # The security headers are still there (the compression runs after they are set).
    assert "Content-Security-Policy" in packed


def test_a_stream_is_not_held_back_by_gzip() -> None:
    stream = StreamingHttpResponse(iter([b"data: line 1\n\n", b"data: line 2\n\n"]))
    stream["Content-Type"] = "text/event-stream"
    response = _through(stream)
    assert not response.has_header("Content-Encoding")
    assert b"".join(response.streaming_content) == b"data: line 1\n\ndata: line 2\n\n"


@pytest.mark.parametrize(
    ("content_type", "size", "compressed"),
    [
        ("text/html; charset=utf-8", 5000, True),
        ("application/json", 5000, True),
        ("image/png", 5000, False),
        ("application/zip", 5000, False),
        ("text/html; charset=utf-8", 500, False),
    ],
)
def test_only_text_worth_compressing_is_compressed(
    content_type: str, size: int, compressed: bool
) -> None:
    body = (b"<tr><td>queued</td></tr>" * size)[:size]
    response = _through(HttpResponse(body, content_type=content_type))
    assert (response.get("Content-Encoding") == "gzip") is compressed
    content = gzip.decompress(response.content) if compressed else response.content
    assert content == body


def test_a_client_that_does_not_ask_gets_it_plain() -> None:
    body = b"x" * 5000
    response = _through(HttpResponse(body, content_type="text/html"), encoding="identity")
    assert not response.has_header("Content-Encoding") and response.content == body
