"""URLs in and out of the browser tool: pure."""

from __future__ import annotations


def normalise_url(url: str) -> str:
    """What `web_go` navigates to: a bare host or path gets https://, as a person typing
    `example.com` into an address bar means; anything with a scheme is left alone
    (`about:blank`, `data:` and `file:` included: the browser acts as the agent, so it
    reaches only what the agent could reach anyway)."""
    url = url.strip()
    if "://" in url or url.startswith(("about:", "data:", "javascript:")):
        return url
    return f"https://{url}"


def reported_url(url: str) -> str:
    """`web_url` as inspect's host expects it: the page's URL without its query string
    (session tokens and tracking parameters are noise, and may be secrets)."""
    return url.split("?", 1)[0]
