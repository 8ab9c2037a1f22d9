"""The web browser from the host: one session in a sandbox's headless Chromium.

    async with open_tool_support(sandbox) as support:
        async with await open_browser(support) as browser:
            page = await browser.go("http://127.0.0.1:8000/")
            print(page.tree)

The first session in a sandbox installs the browser add-on (browser_addon.py); each
session is a browser context of its own (cookies and storage apart from the others').
Page failures (a refused connection, an unknown element id) come back in
`BrowserPage.error`, for the model to read; a browser or transport failure raises.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from sandbox_tools.errors import RuntimeTransportError
from sandbox_tools.injector.addon_delivery import AddonInstall, ensure_browser
from sandbox_tools.injector.inject import ToolSupport
from sandbox_tools.injector.jsonrpc_client import (
    RuntimeClient,
    bounded_text,
    checked_png,
    result_fields,
)
from sandbox_tools.protocol import User
from sandbox_tools.runtime.jsonrpc import WireParams
from sandbox_tools.runtime.tools.web_browser.tool_types import (
    ClickParams,
    GoParams,
    NewSessionParams,
    ScrollDirection,
    ScrollParams,
    SessionParams,
    TypeParams,
)

# A browser's first start and a page's load each have the runtime's 30 s deadline;
# the host waits for both and the transport.
CALL_TIMEOUT = 180.0
# What the host keeps of a page's text fields, whatever answers in the sandbox says: the
# runtime cuts the tree at 100,000 characters by default; an image may raise that, and an
# agent at the runtime's uid may answer in its place (THREAT_MODEL.md, rule 3), so
# whatever goes on to a model or a transcript is cut here too.
MAX_TREE_CHARS = 2_000_000
MAX_MAIN_CHARS = 1_000_000
MAX_ERROR_CHARS = 10_000


def _bounded(text: str | None, limit: int, what: str) -> str | None:
    return None if text is None else bounded_text(text, limit, what)


# A session name the runtime makes (`WebBrowser_<random>_<n>`); whatever answers in the
# sandbox could name one of 100 MB, which the host keeps and sends with every call.
SESSION_NAME = re.compile(r"[A-Za-z0-9_.-]{1,128}")
# The viewport's PNG is a few MB; the runtime refuses one over 16 MiB.
# The runtime's subcommand that serves its browser as MCP tools on stdio.
BROWSER_MCP_COMMAND = "browser-mcp"


@dataclass(frozen=True)
class BrowserPage:
    """What a page action answers, as inspect's web_browser reads it."""

    url: str  # the page's whole URL, its query string included (inspect's `web_url` drops it)
    main_content: str | None  # the page's main text, when it has one
    tree: str  # the visible accessibility tree, `[id] role "name" [props]` per line
    error: str | None  # why the action failed (for the model); None when it did not

    @classmethod
    def parse(cls, result: Any, method: str) -> BrowserPage:
        fields = result_fields(
            result,
            method,
            page_url=str,
            web_at=str,
            main_content=(str, type(None)),
            error=(str, type(None)),
        )
        said = fields.get("error")
        error = None if not said or said.isspace() else said  # blank is no error (inspect)
        return cls(
            _bounded(fields["page_url"], MAX_ERROR_CHARS, "URL") or "",
            _bounded(fields.get("main_content"), MAX_MAIN_CHARS, "main content"),
            _bounded(fields["web_at"], MAX_TREE_CHARS, "accessibility tree") or "",
            _bounded(error, MAX_ERROR_CHARS, "error"),
        )


class BrowserSession:
    """One browser session (a context and its tabs) in the sandbox's browser."""

    def __init__(self, client: RuntimeClient, name: str, install: AddonInstall | None) -> None:
        self.client = client
        self.name = name
        self.install = install  # None when the browser came from elsewhere (the image)

    async def _page(self, method: str, params: WireParams | None = None) -> BrowserPage:
        """A page action: its params written by the dataclass the runtime parses them with
        (this session's alone when None), so host and runtime spell each key once."""
        sent = (params or SessionParams(session_name=self.name)).to_params()
        result = await self.client.call(method, sent, timeout=CALL_TIMEOUT)
        return BrowserPage.parse(result, method)

    async def go(self, url: str) -> BrowserPage:
        """Load `url` (without a scheme: https://) and wait for it."""
        return await self._page("web_go", GoParams(session_name=self.name, url=url))

    async def click(self, element_id: int) -> BrowserPage:
        return await self._page(
            "web_click", ClickParams(session_name=self.name, element_id=element_id)
        )

    async def type(self, element_id: int, text: str, *, submit: bool = False) -> BrowserPage:
        """Type into a field; `submit` presses Enter after it."""
        params = TypeParams(session_name=self.name, element_id=element_id, text=text)
        return await self._page("web_type_submit" if submit else "web_type", params)

    async def scroll(self, direction: ScrollDirection) -> BrowserPage:
        """ "up" or "down" by a page."""
        return await self._page(
            "web_scroll", ScrollParams(session_name=self.name, direction=direction)
        )

    async def back(self) -> BrowserPage:
        return await self._page("web_back")

    async def forward(self) -> BrowserPage:
        return await self._page("web_forward")

    async def refresh(self) -> BrowserPage:
        return await self._page("web_refresh")

    async def screenshot(self) -> bytes:
        """The visible part of the page as PNG bytes."""
        session = SessionParams(session_name=self.name).to_params()
        result = await self.client.call("web_screenshot", session, timeout=CALL_TIMEOUT)
        encoded = result_fields(result, "web_screenshot", png_base64=str)["png_base64"]
        return checked_png(encoded, "web_screenshot")

    async def close(self) -> bool:
        """End the session (its context and tabs); False if it was gone already."""
        session = SessionParams(session_name=self.name).to_params()
        result = await self.client.call("web_close_session", session, timeout=CALL_TIMEOUT)
        return bool(result_fields(result, "web_close_session", closed=bool)["closed"])

    async def __aenter__(self) -> BrowserSession:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


async def new_browser_session(
    client: RuntimeClient, user: User | None = None, install: AddonInstall | None = None
) -> BrowserSession:
    """A new session in the runtime behind `client` (the browser must be there already:
    the add-on, or SANDBOX_TOOLS_BROWSER); acting as `user` when given."""
    params = NewSessionParams(headful=False, user=None).to_params(user=user)
    result = await client.call("web_new_session", params, timeout=CALL_TIMEOUT)
    name = result_fields(result, "web_new_session", session_name=str)["session_name"]
    if not SESSION_NAME.fullmatch(name):
        raise RuntimeTransportError(
            f"web_new_session: the runtime named the session {name[:100]!r}"
            f"{'...' if len(name) > 100 else ''} ({len(name):,} characters), which is not "
            "a session name"
        )
    return BrowserSession(client, name, install)


async def open_browser(
    support: ToolSupport, user: User | None = None, *, install: bool = True
) -> BrowserSession:
    """A new browser session in `support`'s sandbox: the add-on installed first (once
    per handle; `install=False` uses whatever browser the runtime finds)."""
    installed = await ensure_browser(support) if install else None
    return await new_browser_session(support.client, user, installed)
