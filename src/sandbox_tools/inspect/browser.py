"""A headless browser for the model, in the sample's sandbox: inspect's `web_browser()`
tools on our runtime, and the runtime's `browser-mcp` server for `mcp_tools()`.

The browser is the runtime's optional add-on (a headless Chromium, about 100 MB): the
first browser call of a sample sends it into the sandbox, or reuses it when a checked
copy is already there (injector/addon_delivery.py), and the transcript says which and how
long it took. Nothing is downloaded inside the sandbox, so offline sandboxes work, and
the add-on needs no libc of the image's.

Identity as for the other tools (tools.py): the browser acts as the sandbox's default
user unless `user=` says otherwise.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from inspect_ai.tool import ContentImage, ContentText, MCPServer, Tool, ToolError, ToolResult, tool
from inspect_ai.util import store

from sandbox_tools import errors
from sandbox_tools.artifacts import ArtifactKind
from sandbox_tools.injector.addon_delivery import AddonInstall, ensure_browser
from sandbox_tools.injector.web_browser import (
    BROWSER_MCP_COMMAND,
    BrowserPage,
    BrowserSession,
    new_browser_session,
)
from sandbox_tools.inspect.tools import (
    _Bound,
    _bound_for,
    _for_model,
    _mcp_server,
    report_addon,
    tool_state_instance,
    want_addon,
)
from sandbox_tools.protocol import ErrorReason
from sandbox_tools.runtime.tools.web_browser.tool_types import SCROLL_DIRECTIONS, ScrollDirection

_SESSION_KEY = "sandbox_tools:web_browser:"
# Inline images in a tree line (the runtime already shortens them; a page's own text may
# still carry one) are cut there, as inspect's host does: base64 is noise to a model.
# An inline image's data, cut from the end of a tree line: one pass over the text, no
# list of lines (a tree of millions of short lines held over a GiB as one).
_INLINE_IMAGE = re.compile(r"data:image/png;base64[^\n]*")
_NO_TREE = "(no accessibility tree for this page)"

PageAction = Callable[[BrowserSession], Awaitable[BrowserPage]]


def page_result(page: BrowserPage, png: bytes | None = None) -> ToolResult:
    """What the model reads for a page, in the shape of inspect's tools: the main content
    and the accessibility tree as two text items, or the tree alone when the page has no
    main content; the screenshot after them as an image. A page error is a ToolError."""
    if page.error and page.error.strip():
        raise ToolError(page.error)
    tree = _INLINE_IMAGE.sub("", page.tree or _NO_TREE)
    items: list[ContentText | ContentImage]
    if page.main_content:
        items = [
            ContentText(text=f"main content:\n{page.main_content}\n\n"),
            ContentText(text=f"accessibility tree:\n{tree}"),
        ]
    elif png is None:
        return tree
    else:
        items = [ContentText(text=tree)]
    if png is not None:
        encoded = base64.b64encode(png).decode("ascii")
        items.append(ContentImage(image=f"data:image/png;base64,{encoded}"))
    return list(items)


async def _installed(bound: _Bound) -> AddonInstall:
    """The browser add-on in the bound sandbox: installed (or found) on the sample's first
    browser call and reported in its transcript; a failure is raised as an injection
    failure is, on this call and at once on every later one."""
    support = bound.ready()
    async with bound.browser_lock:
        if bound.browser_failure is not None:
            raise RuntimeError(bound.browser_failure)
        first = support.browser is None
        try:
            install = await ensure_browser(support)
        except errors.SandboxToolsError as exc:
            bound.browser_failure = (
                f"sandbox-tools could not install the browser in {support.sandbox.name}: "
                f"{exc.explained()}"
            )
            raise RuntimeError(bound.browser_failure) from None
    if first:
        report_addon(support, "browser_addon", install)
    return install


def _session_gone(exc: errors.ToolError) -> bool:
    """Whether a call failed because the runtime no longer knows the session (its server
    was restarted since, or the session was closed)."""
    return exc.reason is ErrorReason.SESSION_GONE


class _Browser:
    """The browser session of one (sample, instance), opened by its first call."""

    def __init__(self, instance: str | None, user: str | None, sandbox: str | None) -> None:
        self.instance = instance
        self.user = user
        self.sandbox = sandbox

    async def _open(self, bound: _Bound, key: str) -> BrowserSession:
        install = await _installed(bound)
        user = self.user or bound.default_user
        session = await new_browser_session(bound.ready().client, user, install)
        store().set(key, session.name)
        bound.browsers.add(session.name)
        return session

    async def act(self, action: PageAction, screenshots: bool) -> ToolResult:
        """Run `action` in the session (opened first if need be), answered for the model."""
        bound = await _bound_for(self.sandbox)
        support = bound.ready()
        key = f"{_SESSION_KEY}{tool_state_instance(self.instance) or ''}"
        try:
            name = store().get(key)
            if isinstance(name, str):
                session = BrowserSession(support.client, name, support.browser)
                try:
                    page = await action(session)
                except errors.ToolError as exc:
                    if not _session_gone(exc):
                        raise
                    # A restarted runtime server forgot it: the pages are lost, the model
                    # goes on in a new session (web_browser_go works at once).
                    session = await self._open(bound, key)
                    page = await action(session)
            else:
                session = await self._open(bound, key)
                page = await action(session)
            png = await session.screenshot() if screenshots and not page.error else None
        except errors.ToolError as exc:
            raise _for_model(exc) from None
        return page_result(page, png)


class BrowserTool(Protocol):
    """How each of inspect's browser tools is made: the options every one of them takes."""

    def __call__(
        self,
        instance: str | None = None,
        screenshots: bool = False,
        user: str | None = None,
        sandbox: str | None = None,
    ) -> Tool: ...


_OPTIONS_DOC = """
    Args:
      instance: Each instance has a browser session of its own.
      screenshots: Append a PNG of the visible page to each result.
      user: Browse as this user instead of the sandbox's default user.
      sandbox: The sample's sandbox to browse in (default: the default one).
"""


def _browser_tool(
    name: str, summary: str
) -> Callable[[Callable[[_Browser, bool], Tool]], BrowserTool]:
    """One of inspect's browser tools, registered as `name`: the options they all take
    (declared once, in `BrowserTool` and `_OPTIONS_DOC`) make the session the decorated
    function's `execute` acts in; that `execute` (its parameters and docstring are what
    the model reads) is the tool's own."""

    def register(make_execute: Callable[[_Browser, bool], Tool]) -> BrowserTool:
        def factory(
            instance: str | None = None,
            screenshots: bool = False,
            user: str | None = None,
            sandbox: str | None = None,
        ) -> Tool:
            return make_execute(_Browser(instance, user, sandbox), screenshots)

        factory.__name__ = factory.__qualname__ = name
        factory.__doc__ = f"{summary}\n{_OPTIONS_DOC}"
        registered: BrowserTool = tool(name=name, parallel=False)(factory)
        return registered

    return register


@_browser_tool("web_browser_go", "Open a URL in the sandbox's browser.")
def web_browser_go(browser: _Browser, screenshots: bool) -> Tool:

    async def execute(url: str) -> ToolResult:
        """Load a web page in the browser and show its visible elements.

        The page comes back as an accessibility tree. Each element is on a line of its
        own, starting with its id in brackets, then its role, its name and properties:

        ```
        [3] RootWebArea "Weather" [focused: True, url: http://intranet/weather]
          [8] heading "Today"
          [15] link "Tomorrow" [url: http://intranet/weather?day=2]
          [21] textbox "City" [editable: plaintext]
        ```

        The other browser tools take these ids (here 15 to follow the link, 21 to type
        into the field). Use one browser tool at a time: they act on the same page.

        Args:
          url: The address to open (https:// is assumed when no scheme is given).
        Returns:
          The page as an accessibility tree: one element per line, indented under its
          parent, its id in brackets first. Only what is on screen is listed: scroll to
          see more.
        """
        return await browser.act(lambda session: session.go(url), screenshots)

    return execute


@_browser_tool("web_browser_click", "Click an element of the current page.")
def web_browser_click(browser: _Browser, screenshots: bool) -> Tool:

    async def execute(element_id: int) -> ToolResult:
        """Click an element of the page: a link, a button, a checkbox, a tab.

        With `[15] link "Tomorrow"` in the latest tree, web_browser_click(15) follows
        that link; a page the click opens is waited for.

        Args:
          element_id: The id in brackets before the element in the latest tree.
        Returns:
          The page as an accessibility tree, the ids in brackets (as web_browser_go).
        """
        return await browser.act(lambda session: session.click(element_id), screenshots)

    return execute


@_browser_tool("web_browser_type_submit", "Fill in a field and press Enter.")
def web_browser_type_submit(browser: _Browser, screenshots: bool) -> Tool:

    async def execute(element_id: int, text: str) -> ToolResult:
        """Replace the text of a field with `text` and press Enter, which submits its form.

        The usual way to search or send a one-field form: with `[21] textbox "City"` in
        the latest tree, web_browser_type_submit(21, "Lisbon") searches for Lisbon.

        Args:
          element_id: The id in brackets before the field in the latest tree.
          text: What to type.
        Returns:
          The page as an accessibility tree, the ids in brackets (as web_browser_go).
        """
        return await browser.act(
            lambda session: session.type(element_id, text, submit=True), screenshots
        )

    return execute


@_browser_tool("web_browser_type", "Type into a field without submitting.")
def web_browser_type(browser: _Browser, screenshots: bool) -> Tool:

    async def execute(element_id: int, text: str) -> ToolResult:
        """Type `text` into a field without pressing Enter.

        For forms with several fields: fill each with web_browser_type, then submit with
        web_browser_type_submit on the last one or click the form's button. For a single
        field, web_browser_type_submit does both at once.

        Args:
          element_id: The id in brackets before the field in the latest tree.
          text: What to type.
        Returns:
          The page as an accessibility tree, the ids in brackets (as web_browser_go).
        """
        return await browser.act(lambda session: session.type(element_id, text), screenshots)

    return execute


@_browser_tool("web_browser_scroll", "Scroll the current page by one screen.")
def web_browser_scroll(browser: _Browser, screenshots: bool) -> Tool:

    async def execute(direction: str) -> ToolResult:
        """Scroll the page one screen down or up.

        The tree lists only what is on screen: on a long page, scroll down to read the
        rest, and up to go back.

        Args:
          direction: "down" or "up".
        Returns:
          The page as an accessibility tree, the ids in brackets (as web_browser_go).
        """
        if direction not in SCROLL_DIRECTIONS:  # the model's words, read before any call
            choices = " or ".join(f'"{d}"' for d in SCROLL_DIRECTIONS)
            raise ToolError(f"direction must be {choices}, not {direction[:40]!r}")
        chosen: ScrollDirection = "up" if direction == "up" else "down"
        return await browser.act(lambda session: session.scroll(chosen), screenshots)

    return execute


@_browser_tool("web_browser_back", "Go back one page in the history.")
def web_browser_back(browser: _Browser, screenshots: bool) -> Tool:

    async def execute() -> ToolResult:
        """Return to the previous page, as a browser's Back button does.

        Returns:
          The page as an accessibility tree, the ids in brackets (as web_browser_go).
        """
        return await browser.act(lambda session: session.back(), screenshots)

    return execute


@_browser_tool("web_browser_forward", "Go forward one page in the history.")
def web_browser_forward(browser: _Browser, screenshots: bool) -> Tool:

    async def execute() -> ToolResult:
        """Go to the page you came back from, as a browser's Forward button does.

        Returns:
          The page as an accessibility tree, the ids in brackets (as web_browser_go).
        """
        return await browser.act(lambda session: session.forward(), screenshots)

    return execute


@_browser_tool("web_browser_refresh", "Load the current page again.")
def web_browser_refresh(browser: _Browser, screenshots: bool) -> Tool:

    async def execute() -> ToolResult:
        """Reload the current page: what changed on the server shows, what was typed
        into its fields is gone.

        Returns:
          The page as an accessibility tree, the ids in brackets (as web_browser_go).
        """
        return await browser.act(lambda session: session.refresh(), screenshots)

    return execute


def web_browser(
    *,
    interactive: bool = True,
    instance: str | None = None,
    screenshots: bool = False,
    user: str | None = None,
    sandbox: str | None = None,
) -> list[Tool]:
    """inspect's web browser tools (same names, parameters and results), on a headless
    Chromium that our runtime runs in the sample's sandbox.

    The first call of a sample installs the browser add-on there (about 10 s; reused when
    a checked copy is there) and opens the session; the transcript records the install.

    Args:
      interactive: With the tools that click and type; False leaves navigation only.
      instance: Each instance has a browser session of its own (cookies, history, page);
        without one, the current `tool_state_scope()` picks it, as in inspect.
      screenshots: Append a PNG of the visible page to each result, for models that
        read images.
      user: Browse as this user instead of the sandbox's default user.
      sandbox: The sample's sandbox to browse in (default: the default one).

    Returns:
      inspect's browser tools in inspect's order (docs/INSPECT.md lists them): going to
      a page first, then (interactive) the ones that click and type, then the others.
    """
    want_addon(ArtifactKind.BROWSER)
    options: dict[str, Any] = {
        "instance": instance,
        "screenshots": screenshots,
        "user": user,
        "sandbox": sandbox,
    }
    acting = [web_browser_click, web_browser_type_submit, web_browser_type] if interactive else []
    making = [
        web_browser_go,
        *acting,
        web_browser_scroll,
        web_browser_back,
        web_browser_forward,
        web_browser_refresh,
    ]
    return [make(**options) for make in making]


def browser_mcp_server(
    *,
    name: str = "browser",
    sandbox: str | None = None,
    user: str | None = None,
    timeout: int | None = None,
) -> MCPServer:
    """The runtime's browser as an MCP server in the sample's sandbox, for `mcp_tools()`.

    Its tools are the runtime's `browser_*` MCP tools (docs/INJECTION.md lists them:
    navigate, click and type by the page tree's ids, keys, tabs, screenshots). The add-on is
    installed first, as for `web_browser()`; the server and its browser run as the
    sandbox's default user unless `user=` says otherwise, one browser per connection.

    Args:
      name: The server's name in inspect (tool names are not prefixed with it).
      sandbox: The sample's sandbox to run it in (default: the default one).
      user: Run the server and its browser as this user.
      timeout: Seconds one request to the server may take (default 600).
    """
    want_addon(ArtifactKind.BROWSER)
    from mcp import StdioServerParameters

    async def launch(bound: _Bound) -> StdioServerParameters:
        await _installed(bound)
        return StdioServerParameters(command=bound.ready().exe, args=[BROWSER_MCP_COMMAND])

    return _mcp_server(name=name, launch=launch, sandbox=sandbox, timeout=timeout, user=user)
