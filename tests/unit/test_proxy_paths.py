"""The path a sandbox sends through the model proxy, as `forward_to` turns it into the
upstream URL that receives the host's credentials (THREAT_MODEL.md rule 4): every trick
that could leave the base URL is refused, ordinary API paths pass unchanged."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

pytest.importorskip("httpx", reason="the [proxy] extra is not installed")

from sandbox_tools.injector.model_proxy import (
    ProxyRequestRefused,
    forward_to,
    origin_form_path,
)

BASE = "https://api.example.com/openai/v1"


@pytest.fixture
async def upstream() -> AsyncIterator[forward_to]:
    handler = forward_to(BASE, headers={"Authorization": "Bearer host"})
    yield handler
    await handler.aclose()


@pytest.mark.security
@pytest.mark.parametrize(
    "path",
    [
        "@evil.example:443/x",  # the base's authority becomes user info
        ".evil.example/x",  # another host
        ":8443/x",  # another port
        "0:9999/x",
        "/../../admin/keys",  # above the base path
        "/%2e%2e/admin",
        "/.%2e/admin",
        "/a/%2e/b",
        "/a%2fb",  # an encoded separator
        "/a%5cb",
        "/a%00b",
        "/..;/..;/admin/keys",  # path parameters: `..;` is `..` to Tomcat, Jetty, Spring
        "/%2e%2e;/admin",
        "/..%3b/admin",
        "/%252e%252e/admin",  # a second level of encoding
        "/..%09/admin",
        "/a b",
        "/a\\b",
        "/é",
        "/%ff",
        "/x#frag",
        "/%zz",
        "/" + "a" * 9000,
        # Segments some upstream stacks trim or normalise into `..`, or that smuggle a
        # query or fragment into the path (an outside attack's list):
        "/..%20/admin",
        "/.../admin",
        "/%EF%BC%8E%EF%BC%8E/admin",  # full-width dots
        "/..%E2%80%8B/admin",  # a zero-width space
        "/..%3F/admin",
        "/..%23/admin",
    ],
)
def test_paths_that_could_leave_the_base_are_refused(path: str, upstream: forward_to) -> None:
    with pytest.raises(ProxyRequestRefused):
        upstream.upstream_url(path)


@pytest.mark.parametrize(
    ("path", "url"),
    [
        ("/chat/completions", f"{BASE}/chat/completions"),
        ("/chat/completions?stream=true", f"{BASE}/chat/completions?stream=true"),
        ("//chat//completions", f"{BASE}/chat/completions"),
        ("/models/gemini-2.0:generateContent", f"{BASE}/models/gemini-2.0:generateContent"),
        ("/files/a%20b", f"{BASE}/files/a%20b"),
        ("/messages?beta=true&x=/../y", f"{BASE}/messages?beta=true&x=/../y"),
    ],
)
def test_ordinary_api_paths_pass_unchanged(path: str, url: str, upstream: forward_to) -> None:
    assert str(upstream.upstream_url(path)) == url


def test_the_base_url_itself_is_checked() -> None:
    for bad in ("ftp://example.com", "https://user:pw@example.com", "https://example.com?q=1"):
        with pytest.raises(ValueError):
            forward_to(bad)
    assert origin_form_path("/a/b/") == "/a/b/"
