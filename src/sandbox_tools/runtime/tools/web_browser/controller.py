"""web_browser: sessions of one headless Chromium, driven over its DevTools pipe.

- One browser per server, started by the first call that needs it, as the identity that
  call acts as; a session is one browser context (cookies and storage of its own) with
  the tab it currently shows; a tab a page opens (a link with target=_blank,
  window.open) becomes the session's current tab. The session keeps its tabs in the
  order they opened, to list, select, open and close (the `browser-mcp` server's tabs).
- A session outlives its browser: when the browser crashed, hung, or was stopped after
  `Limits.browser_idle_timeout_s` without calls, the session's next call gets a fresh
  context on a blank page (and an error saying so unless it is a `web_go`). inspect's
  host keeps one session name for a whole sample, so a name must never go stale.
- Every DevTools command and every wait for a load is bounded by
  `Limits.browser_call_timeout_s`; the rendered tree by `Limits.browser_tree_max_chars`.
- A page's failure (a bad URL, an element id not on screen) is the answer's `error`; the
  browser's failure is a BrowserFailed tool error, and the browser is killed.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
import json
import os
import secrets
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from sandbox_tools.protocol import ErrorReason
from sandbox_tools.runtime.identity import Identity, UserSpec, resolve_user
from sandbox_tools.runtime.jsonrpc import ToolError
from sandbox_tools.runtime.limits import DEFAULT_LIMITS, Limits
from sandbox_tools.runtime.paths import BROWSER_PROFILES_FILE
from sandbox_tools.runtime.tools.web_browser import browser as chromium
from sandbox_tools.runtime.tools.web_browser.cdp import (
    BrowserFailed,
    CdpCommandError,
    PageTimeout,
)
from sandbox_tools.runtime.tools.web_browser.cdp_framing import CdpMessage
from sandbox_tools.runtime.tools.web_browser.keys import key_event
from sandbox_tools.runtime.tools.web_browser.page_text import PageText, Rect, render_page
from sandbox_tools.runtime.tools.web_browser.png import NotPng, png_size
from sandbox_tools.runtime.tools.web_browser.tool_types import (
    BrowserInfo,
    ClickParams,
    CloseResult,
    CrawlerResult,
    GoParams,
    InfoParams,
    KeyParams,
    NewSessionParams,
    NewSessionResult,
    ScreenshotResult,
    ScrollParams,
    SessionParams,
    TabInfo,
    TabParams,
    TypeParams,
)
from sandbox_tools.runtime.tools.web_browser.urls import normalise_url, reported_url

# After a click or Enter, how long a navigation (or a new tab) has to begin before the
# action is taken to have stayed on the page. Handlers that navigate do so while the
# input event is handled, so this is long only for pages that wait before they go.
NAVIGATION_START_S = 1.0
# How long typing waits after its click for a navigation the click may start: a submit
# starts one within milliseconds, and every typed field would pay this.
TYPE_NAVIGATION_START_S = 0.25
# An empty tree right after a load is usually a page still building itself: look again.
EMPTY_TREE_RETRIES = 2
EMPTY_TREE_PAUSE_S = 0.25
# A screenshot of the 1280x1080 viewport is a few MB at most; past this it is refused.
SCREENSHOT_MAX_BYTES = 16 * 1024 * 1024
IDLE_CHECK_S = 5.0
# A page that did not answer gets this long to stop loading before it is reset.
STOP_LOADING_S = 5.0
# A page between two renderers (an error page commits in a process of its own) answers
# "Not attached to an active page" for a moment: a command is sent again this often, for
# at most this long, before that is its answer.
DETACHED_RETRY_S = 0.1
DETACHED_PATIENCE_S = 3.0
_DETACHED = "Not attached to an active page"  # Chromium's wording for that moment
# After a page missed its deadline, how long the browser itself has to answer before it
# is called hung (Browser.getVersion needs no page: a few ms even for a busy browser).
HEALTH_CHECK_S = 10.0
# How long the server's shutdown waits for the profile's removal.
SHUTDOWN_REMOVAL_S = 10.0
# Commands that start a navigation: one the page does not answer is stopped, not reset.
_NAVIGATIONS = ("Page.navigate", "Page.reload", "Page.navigateToHistoryEntry")
_PROFILE_PREFIX = "sandbox-tools-browser-"


T = TypeVar("T")


async def _addon_checked(params: InfoParams) -> dict[str, object] | None:
    """The add-on check `browser_info` was asked to make first (InfoParams)."""
    from sandbox_tools.runtime import addons  # tarfile and lzma: only where a check is asked

    return await asyncio.to_thread(
        addons.check_as_asked, params.addon_dir, params.addon_digest, params.addon_signature
    )


class PageError(Exception):
    """What went wrong on the page: reported in the answer's `error`."""


@dataclass
class _Tab:
    """One page target the session shows, and what its events have said so far."""

    target_id: str
    cdp_session: str
    started: int = 0  # main frame began loading a document
    stopped: int = 0  # main frame stopped loading (loaded, failed or cancelled)
    committed: int = 0  # main frame now shows a new document
    content_loaded: int = 0  # DOMContentLoaded
    same_document: int = 0  # a fragment or history.pushState navigation
    crashed: str | None = None  # why its renderer died, once it did
    crash_told: bool = False  # an answer already said so
    rendered: PageText | None = None


@dataclass
class _Session:
    name: str
    user: UserSpec | None
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    generation: int = -1  # the browser (by its number) this session's context lives in
    context_id: str | None = None
    tab: _Tab | None = None
    tabs: list[_Tab] = field(default_factory=list)  # every tab of the context, oldest first
    tabs_opened: int = 0  # tabs a page of this session opened
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    # Why the session's pages were lost since its last call, to tell the model once.
    lost_pages: str | None = None


@dataclass(frozen=True)
class _Before:
    """A tab's counters before an action, to tell what the action started."""

    started: int
    committed: int
    content_loaded: int
    stopped: int
    same_document: int
    tabs_opened: int


class WebBrowserController:
    def __init__(self, limits: Limits = DEFAULT_LIMITS, state_directory: str | None = None) -> None:
        self.limits = limits  # read once by the server (Limits.from_environ)
        self._profiles_file = (
            os.path.join(state_directory, BROWSER_PROFILES_FILE) if state_directory else None
        )
        self._profiles: dict[str, Identity] = {}  # not yet removed
        self._browser: chromium.BrowserProcess | None = None
        self._generation = 0
        self._stopped_because: str | None = None
        self._start_lock = asyncio.Lock()
        self._sessions: dict[str, _Session] = {}
        self._by_context: dict[str, _Session] = {}
        self._by_cdp_session: dict[str, tuple[_Session, _Tab]] = {}
        self._names = itertools.count()
        self._life = secrets.token_hex(4)
        self._last_used = time.monotonic()
        self._busy = 0
        self._idle_task: asyncio.Task[None] | None = None
        self._background: set[asyncio.Task[Any]] = set()
        self._removals: set[asyncio.Task[None]] = set()
        self._sweep_leftovers()

    # -- methods -------------------------------------------------------------------------

    async def new_session(self, params: NewSessionParams) -> NewSessionResult:
        if len(self._sessions) >= self.limits.max_browser_sessions:
            raise ToolError(
                f"too many browser sessions ({self.limits.max_browser_sessions}); close one "
                "with web_close_session first",
                ErrorReason.TOO_MANY,
            )
        name = f"WebBrowser_{self._life}_{next(self._names)}"
        session = _Session(name, params.user)
        self._sessions[name] = session
        try:
            async with session.lock:
                await self._using(lambda: self._open(session))
        except BaseException:
            self._sessions.pop(name, None)
            raise
        return {"session_name": name}

    async def go(self, params: GoParams) -> CrawlerResult:
        url = normalise_url(params.url)

        async def navigate(session: _Session, tab: _Tab) -> None:
            before = self._before(session, tab)
            reply = await self._call("Page.navigate", {"url": url}, tab)
            if reply.get("errorText"):
                # The browser shows its error page, an entry of the history like any page:
                # wait for it, so that the next command meets a page, not the switch.
                await self._wait_for_load(session, before, required=False)
                raise PageError(
                    f"cannot open {url}: {reply['errorText']}. Check the address (the "
                    "browser also refuses some ports, such as 6000); going back returns to "
                    "the page before, or open another address"
                )
            await self._wait_for_load(session, before, required=True)

        return await self._page_action(params.session_name, navigate, fresh_is_fine=True)

    async def click(self, params: ClickParams) -> CrawlerResult:
        async def click(session: _Session, tab: _Tab) -> None:
            before = self._before(session, tab)
            await self._click(tab, params.element_id)
            await self._wait_for_navigation(session, before)

        return await self._page_action(params.session_name, click)

    async def type_text(self, params: TypeParams, submit: bool) -> CrawlerResult:
        async def type_text(session: _Session, tab: _Tab) -> None:
            clicked = self._before(session, tab)
            await self._click(tab, params.element_id)
            # A click that navigates (a link, a submit button) replaces the page: the text
            # goes to the page it leads to, once loaded (typing into the page being
            # replaced hung until the call's timeout), as inspect's browser does.
            await self._wait_for_navigation(session, clicked, TYPE_NAVIGATION_START_S)
            tab = session.tab or tab
            if submit:
                # Replace what the field held, as a person selecting all and typing does.
                await self._key(tab, "a", "KeyA", 65, modifiers=2, commands=["selectAll"])
                await self._key(tab, "Backspace", "Backspace", 8)
            await self._call("Input.insertText", {"text": params.text}, tab)
            if submit:
                before = self._before(session, tab)
                await self._key(tab, "Enter", "Enter", 13, text="\r")
                await self._wait_for_navigation(session, before)

        return await self._page_action(params.session_name, type_text)

    async def scroll(self, params: ScrollParams) -> CrawlerResult:
        sign = "-" if params.direction == "up" else "+"
        expression = (
            "(() => { const e = document.scrollingElement || document.body;"
            f" e.scrollTop = e.scrollTop {sign} window.innerHeight; }})()"
        )

        async def scroll(session: _Session, tab: _Tab) -> None:
            await self._call("Runtime.evaluate", {"expression": expression}, tab)

        return await self._page_action(params.session_name, scroll)

    async def history(self, params: SessionParams, step: int) -> CrawlerResult:
        async def move(session: _Session, tab: _Tab) -> None:
            history = await self._call("Page.getNavigationHistory", {}, tab)
            entries = history.get("entries")
            index = history.get("currentIndex")
            if not isinstance(entries, list) or not isinstance(index, int):
                raise PageError("the browser gave no history for this page")
            if not 0 <= index + step < len(entries):
                return  # nothing further that way: the page stays, as in a browser
            entry = entries[index + step]
            entry_id = entry.get("id") if isinstance(entry, dict) else None
            before = self._before(session, tab)
            await self._call("Page.navigateToHistoryEntry", {"entryId": entry_id}, tab)
            await self._wait_for_load(session, before, required=False)

        return await self._page_action(params.session_name, move)

    async def refresh(self, params: SessionParams) -> CrawlerResult:
        async def reload(session: _Session, tab: _Tab) -> None:
            before = self._before(session, tab)
            await self._call("Page.reload", {}, tab)
            await self._wait_for_load(session, before, required=True)

        return await self._page_action(params.session_name, reload)

    async def snapshot(self, params: SessionParams) -> CrawlerResult:
        """The current page as it is now, without acting on it: what a page that changed
        on its own (a timer, a late script) shows, and ids for the next click."""

        async def look(session: _Session, tab: _Tab) -> None:
            return None

        return await self._page_action(params.session_name, look)

    async def press_key(self, params: KeyParams) -> CrawlerResult:
        """Press one key (with modifiers) on the focused element, as a keyboard does: the
        page's key handlers see it, Tab moves focus, Enter submits."""
        event = key_event(params.key)

        async def press(session: _Session, tab: _Tab) -> None:
            before = self._before(session, tab)
            await self._key(
                tab,
                event.key,
                event.code,
                event.key_code,
                modifiers=event.modifiers,
                text=event.text,
            )
            await self._wait_for_navigation(session, before)

        return await self._page_action(params.session_name, press)

    async def list_tabs(self, params: SessionParams) -> list[TabInfo]:
        """The session's tabs, oldest first, as the browser knows them now (a tab its
        page closed is gone from the list)."""
        session = self._session(params.session_name)
        async with session.lock:

            async def listing() -> list[TabInfo]:
                await self._ready(session)
                targets = await self._prune_tabs(session)
                return [
                    {
                        "index": index,
                        "title": str(targets[tab.target_id].get("title") or ""),
                        "url": reported_url(str(targets[tab.target_id].get("url") or "")),
                        "current": tab is session.tab,
                    }
                    for index, tab in enumerate(session.tabs)
                ]

            return await self._using(listing)

    async def select_tab(self, params: TabParams) -> CrawlerResult:
        """Show another of the session's tabs; the answer is that tab's page."""

        async def select(session: _Session, tab: _Tab) -> None:
            await self._prune_tabs(session)
            if params.index is None:
                raise PageError("say which tab to select (its index in the tab list)")
            chosen = self._tab_at(session, params.index)
            if chosen.crashed is not None:
                raise PageError(f"tab {params.index} cannot be shown: {chosen.crashed}")
            session.tab = chosen

        return await self._page_action(params.session_name, select)

    async def new_tab(self, params: SessionParams) -> CrawlerResult:
        """Open a blank tab in the session's context (its cookies) and show it."""

        async def open_tab(session: _Session, tab: _Tab) -> None:
            if session.context_id is None:
                raise PageError("the session has no browser context to open a tab in")
            opened = await self._create_tab(session, session.context_id)
            session.tabs.append(opened)
            session.tab = opened

        return await self._page_action(params.session_name, open_tab)

    async def close_tab(self, params: TabParams) -> CrawlerResult:
        """Close a tab (the current one without an index); the one before it is shown
        if it was current. The last tab stays: a session always shows a page."""

        async def close(session: _Session, tab: _Tab) -> None:
            await self._prune_tabs(session)
            if params.index is not None:
                victim = self._tab_at(session, params.index)
            elif session.tab in session.tabs:
                victim = tab
            else:
                raise PageError("the current tab is gone already; say which tab to close")
            if len(session.tabs) == 1:
                raise PageError(
                    "this is the session's only tab, so it stays open (navigate it elsewhere "
                    "instead)"
                )
            await self._browser_call("Target.closeTarget", {"targetId": victim.target_id})
            self._remove_tab(session, victim)

        return await self._page_action(params.session_name, close)

    async def screenshot(self, params: SessionParams) -> ScreenshotResult:
        session = self._session(params.session_name)
        async with session.lock:

            async def capture() -> ScreenshotResult:
                tab = await self._ready(session)
                reply = await self._call("Page.captureScreenshot", {"format": "png"}, tab)
                data = reply.get("data")
                if not isinstance(data, str) or len(data) > SCREENSHOT_MAX_BYTES * 4 // 3 + 4:
                    raise ToolError(
                        f"the screenshot is missing or larger than {SCREENSHOT_MAX_BYTES} bytes"
                    )
                try:
                    width, height = png_size(base64.b64decode(data[:64], validate=True))
                except (NotPng, ValueError) as exc:
                    raise ToolError(f"the browser's screenshot is unusable: {exc}") from None
                return {"png_base64": data, "width": width, "height": height}

            return await self._using(capture)

    async def close_session(self, params: SessionParams) -> CloseResult:
        session = self._sessions.pop(params.session_name, None)
        if session is None:
            return {"closed": False}
        async with session.lock:
            await self._forget_context(session, dispose=True)
        return {"closed": True}

    async def info(self, params: InfoParams | None = None) -> BrowserInfo:
        checked = await _addon_checked(params) if params is not None else None
        browser = self._browser
        executable = self.limits.browser_executable()
        if browser is not None:
            version: str | None = browser.version
        elif params is None or params.version:
            version = await chromium.browser_version(executable, self.limits.browser_call_timeout_s)
        else:
            version = None
        info: BrowserInfo = {
            "installed": version is not None,
            "executable": executable,
            "version": version,
            "running": browser is not None,
            "pid": browser.pid if browser else None,
            "uid": browser.identity.uid if browser else None,
            "sessions": len(self._sessions),
        }
        if checked is not None:
            info["addon"] = checked
        return info

    async def shutdown(self) -> None:
        """Kill the browser's process group; the server is going away."""
        if self._idle_task is not None:
            self._idle_task.cancel()
        for task in self._background:
            task.cancel()
        await self._stop_browser("the runtime server stopped")
        if self._removals:
            await asyncio.wait(set(self._removals), timeout=SHUTDOWN_REMOVAL_S)

    # -- sessions and the browser --------------------------------------------------------

    def _session(self, name: str) -> _Session:
        session = self._sessions.get(name)
        if session is None:
            raise ToolError(
                f"no browser session named {name!r}: start one with web_new_session"
                + (f" (open: {', '.join(sorted(self._sessions))})" if self._sessions else ""),
                ErrorReason.SESSION_GONE,
            )
        return session

    async def _using(self, work: Callable[[], Awaitable[T]]) -> T:
        """Run `work`, counting it as use (the idle timer waits for it), and stop the
        browser when it failed (crashed, hung, or broke the protocol)."""
        self._busy += 1
        try:
            return await work()
        except BrowserFailed:
            # Only a browser whose connection failed is stopped: by the time a call
            # that failed on an old browser gets here, another call may have started a
            # healthy new one.
            browser = self._browser
            if browser is not None and browser.connection.failure is not None:
                await self._stop_browser(f"the browser failed ({browser.connection.failure})")
            raise
        except (PageError, CdpCommandError) as exc:
            # Outside a page action's answer (opening a session, a screenshot), what the
            # page or the browser refused is still an expected failure, said plainly.
            raise ToolError(str(exc)) from None
        finally:
            self._busy -= 1
            self._last_used = time.monotonic()

    async def _page_action(
        self,
        name: str,
        action: Callable[[_Session, _Tab], Awaitable[None]],
        fresh_is_fine: bool = False,
    ) -> CrawlerResult:
        session = self._session(name)
        async with session.lock:

            async def run() -> CrawlerResult:
                tab = await self._ready(session)
                lost, session.lost_pages = session.lost_pages, None
                if lost and not fresh_is_fine:
                    return self._answer("about:blank", None, "encountered error", lost)
                try:
                    await action(session, tab)
                    tab = session.tab or tab  # the action may have opened a tab
                    text = await self._render(tab)
                    url = await self._url(tab)
                except (PageError, CdpCommandError) as exc:
                    error = str(exc)
                    if session.tab is not None and session.tab.crashed is not None:
                        session.tab.crash_told = True
                        error = (
                            f"{session.tab.crashed}; the session starts again on a blank page "
                            "at its next call"
                        )
                    url = await self._url_or_blank(session)
                    return self._answer(url, None, "encountered error", error)
                return self._answer(url, text.main_content, text.tree, None)

            return await self._using(run)

    @staticmethod
    def _answer(url: str, main: str | None, tree: str, error: str | None) -> CrawlerResult:
        return {
            "web_url": reported_url(url),
            "page_url": url,
            "main_content": main,
            "web_at": tree,
            "error": error,
        }

    async def _ready(self, session: _Session) -> _Tab:
        """The session's tab in a running browser, opening both again if they were lost."""
        if (
            self._browser is None
            or self._browser.connection.failure is not None
            or session.generation != self._generation
            or session.tab is None
            or session.tab.crashed is not None
        ):
            if session.tab is not None and session.tab.crashed is not None:
                if not session.tab.crash_told:
                    session.lost_pages = (
                        f"{session.tab.crashed}; the session starts again on a blank page: "
                        "open a URL with web_go"
                    )
                await self._forget_context(session, dispose=True)
            if session.generation >= 0 and session.lost_pages is None:
                session.lost_pages = (
                    "this session's pages were lost: "
                    f"{self._stopped_because or 'the browser stopped'}; the session starts "
                    "again on a blank page: open a URL with web_go"
                )
            await self._open(session)
        assert session.tab is not None
        return session.tab

    async def _open(self, session: _Session) -> None:
        """A browser context and a blank tab for `session` in the current browser."""
        identity = resolve_user(session.user)
        await self._ensure_browser(identity)
        context = await self._browser_call("Target.createBrowserContext", {})
        context_id = context.get("browserContextId")
        if not isinstance(context_id, str):
            raise self._broken("it created a browser context without an id")
        session.context_id = context_id
        session.generation = self._generation
        self._by_context[context_id] = session
        session.tab = await self._create_tab(session, context_id)
        session.tabs = [session.tab]

    async def _create_tab(self, session: _Session, context_id: str) -> _Tab:
        """A blank tab in a browser context, attached to and ready for commands."""
        target = await self._browser_call(
            "Target.createTarget",
            {
                "url": "about:blank",
                "browserContextId": context_id,
                "width": chromium.VIEWPORT_WIDTH,
                "height": chromium.VIEWPORT_HEIGHT,
            },
        )
        target_id = target.get("targetId")
        if not isinstance(target_id, str):
            raise self._broken("it created a tab without an id")
        return await self._attach(session, target_id)

    async def _prune_tabs(self, session: _Session) -> dict[str, dict[str, Any]]:
        """Forget the session's tabs the browser no longer has (a page closed itself);
        the targets it has, by id, for their titles and URLs."""
        reply = await self._browser_call("Target.getTargets", {})
        infos = reply.get("targetInfos")
        targets = {
            info["targetId"]: info
            for info in (infos if isinstance(infos, list) else [])
            if isinstance(info, dict) and isinstance(info.get("targetId"), str)
        }
        for tab in [t for t in session.tabs if t.target_id not in targets]:
            self._drop_tab(session, tab)
        return targets

    def _remove_tab(self, session: _Session, tab: _Tab) -> None:
        """`tab` is gone (closed by the model or by its own page): the session shows the
        tab before it when it was shown, or when the one shown is gone too."""
        position = session.tabs.index(tab) if tab in session.tabs else 0
        self._drop_tab(session, tab)
        if session.tab is tab or session.tab not in session.tabs:
            session.tab = session.tabs[max(position - 1, 0)] if session.tabs else None

    def _drop_tab(self, session: _Session, tab: _Tab) -> None:
        if tab in session.tabs:
            session.tabs.remove(tab)
        self._by_cdp_session.pop(tab.cdp_session, None)

    @staticmethod
    def _tab_at(session: _Session, index: int) -> _Tab:
        if not 0 <= index < len(session.tabs):
            count = len(session.tabs)
            raise PageError(
                f"there is no tab {index}: the session has "
                + ("1 tab (index 0)" if count == 1 else f"{count} tabs (indexes 0 to {count - 1})")
            )
        return session.tabs[index]

    async def _attach(self, session: _Session, target_id: str) -> _Tab:
        attached = await self._browser_call(
            "Target.attachToTarget", {"targetId": target_id, "flatten": True}
        )
        cdp_session = attached.get("sessionId")
        if not isinstance(cdp_session, str):
            raise self._broken("it attached to a tab without a session id")
        tab = _Tab(target_id, cdp_session)
        self._by_cdp_session[cdp_session] = (session, tab)
        await self._call("Page.enable", {}, tab)
        await self._call("Inspector.enable", {}, tab)  # for Inspector.targetCrashed
        # Node ids in the accessibility tree stay the same between two calls only while
        # the domain is enabled: a click names an id from the previous answer.
        await self._call("Accessibility.enable", {}, tab)
        await self._call(
            "Emulation.setDeviceMetricsOverride",
            {
                "width": chromium.VIEWPORT_WIDTH,
                "height": chromium.VIEWPORT_HEIGHT,
                "deviceScaleFactor": 1,
                "mobile": False,
            },
            tab,
        )
        return tab

    async def _ensure_browser(self, identity: Identity) -> None:
        async with self._start_lock:
            browser = self._browser
            if browser is not None and browser.connection.failure is not None:
                await self._stop_browser(f"the browser failed ({browser.connection.failure})")
                browser = None
            if browser is not None and _identity_key(browser.identity) != _identity_key(identity):
                if any(s.generation == self._generation for s in self._sessions.values()):
                    raise ToolError(
                        f"the browser runs as {browser.identity.describe()} for other "
                        f"sessions; it cannot also act as {identity.describe()} (close those "
                        "sessions first)"
                    )
                await self._stop_browser("the browser was started again for another user")
                browser = None
            if browser is None:
                self._browser = await chromium.launch(
                    self.limits.browser_executable(),
                    identity,
                    self._on_event,
                    self.limits.browser_call_timeout_s,
                )
                self._generation += 1
                self._stopped_because = None
                self._profiles[self._browser.profile_dir] = identity
                self._record_profiles()
                self._in_background(self._wake_when_lost(self._browser))
                if self._idle_task is None or self._idle_task.done():
                    self._idle_task = asyncio.create_task(self._stop_when_idle())

    async def _stop_browser(self, reason: str) -> None:
        browser, self._browser = self._browser, None
        if browser is None:
            return
        self._stopped_because = reason
        self._by_context.clear()
        self._by_cdp_session.clear()
        for session in self._sessions.values():
            session.tab = None
            session.tabs = []
            session.context_id = None
        removal = await chromium.stop(browser)
        self._track_removal(removal, browser.profile_dir)

    def _track_removal(self, removal: asyncio.Task[None], profile: str) -> None:
        def removed(task: asyncio.Task[None]) -> None:
            self._removals.discard(task)
            if not task.cancelled() and not os.path.lexists(profile):
                self._profiles.pop(profile, None)
                self._record_profiles()

        self._removals.add(removal)
        removal.add_done_callback(removed)

    def _record_profiles(self) -> None:
        """Write the profiles not yet removed into the server's directory (replaced
        whole, so a server killed mid-write leaves the old list or the new one)."""
        if self._profiles_file is None:
            return
        entries = [
            {"path": path, "uid": who.uid, "gid": who.gid, "groups": who.groups}
            for path, who in self._profiles.items()
        ]
        partial = self._profiles_file + ".new"
        with contextlib.suppress(OSError):
            with open(partial, "w", encoding="utf-8") as handle:
                json.dump(entries, handle)
            os.replace(partial, self._profiles_file)

    def _sweep_leftovers(self) -> None:
        """Remove the profiles a server killed before it could (SIGKILL, a crash) left,
        each as the identity its browser ran as, never following a link."""
        if self._profiles_file is None:
            return
        try:
            with open(self._profiles_file, encoding="utf-8") as handle:
                entries = json.load(handle)
            loop = asyncio.get_running_loop()
        except (OSError, ValueError, RuntimeError):
            return
        base = os.path.join(tempfile.gettempdir(), _PROFILE_PREFIX)
        for entry in entries if isinstance(entries, list) else []:
            path = entry.get("path") if isinstance(entry, dict) else None
            uid, gid, groups = (entry.get(k) for k in ("uid", "gid", "groups"))
            if (
                not isinstance(path, str)
                or not path.startswith(base)
                or "/" in path[len(base) :]
                or not all(isinstance(i, int) or i is None for i in (uid, gid))
                or not (groups is None or all(isinstance(g, int) for g in groups))
            ):
                continue
            identity = Identity(uid, gid, groups, None, None)
            self._profiles[path] = identity
            removal = loop.create_task(chromium.remove_profile(path, identity))
            self._track_removal(removal, path)

    async def _wake_when_lost(self, browser: chromium.BrowserProcess) -> None:
        """When the browser's pipe closes (or it is found broken), every session waiting
        for a page hears it at once, not at the end of its load wait."""
        await browser.connection.lost.wait()
        for session in self._sessions.values():
            session.changed.set()

    async def _forget_context(self, session: _Session, dispose: bool) -> None:
        context_id, session.context_id, session.tab = session.context_id, None, None
        session.tabs = []
        if context_id is None:
            return
        self._by_context.pop(context_id, None)
        for key, (owner, _) in list(self._by_cdp_session.items()):
            if owner is session:
                del self._by_cdp_session[key]
        if dispose and self._browser is not None and session.generation == self._generation:
            with contextlib.suppress(BrowserFailed, CdpCommandError):
                await self._browser_call(
                    "Target.disposeBrowserContext", {"browserContextId": context_id}
                )

    async def _stop_when_idle(self) -> None:
        while self._browser is not None:
            await asyncio.sleep(min(IDLE_CHECK_S, max(self.limits.browser_idle_timeout_s, 0.1)))
            idle = time.monotonic() - self._last_used
            if self._busy == 0 and idle >= self.limits.browser_idle_timeout_s:
                await self._stop_browser(
                    f"the browser was stopped after {self.limits.browser_idle_timeout_s:g} s "
                    "without a call"
                )

    # -- DevTools plumbing ---------------------------------------------------------------

    def _broken(self, reason: str) -> BrowserFailed:
        """The browser answered something it never should: it is not to be trusted with
        more calls (the caller raises what this returns)."""
        if self._browser is None:
            return BrowserFailed(reason)
        return self._browser.connection.fail(reason)

    async def _browser_call(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        if self._browser is None:
            raise BrowserFailed(self._stopped_because or "it is not running")
        return await self._browser.connection.call(
            method, params, timeout=self.limits.browser_call_timeout_s
        )

    async def _call(self, method: str, params: dict[str, Any], tab: _Tab) -> dict[str, Any]:
        if self._browser is None:
            raise BrowserFailed(self._stopped_because or "it is not running")
        if tab.crashed is not None:
            raise PageError(tab.crashed)
        connection = self._browser.connection
        patience = time.monotonic() + DETACHED_PATIENCE_S
        while True:
            try:
                return await connection.call(
                    method,
                    params,
                    session_id=tab.cdp_session,
                    timeout=self.limits.browser_call_timeout_s,
                )
            except PageTimeout as exc:
                await self._page_timed_out(tab, exc)
                raise
            except CdpCommandError as exc:
                if _DETACHED not in str(exc) or time.monotonic() > patience:
                    raise
            await asyncio.sleep(DETACHED_RETRY_S)

    @property
    def _stop_loading_s(self) -> float:
        return min(self.limits.browser_call_timeout_s, STOP_LOADING_S)

    async def _page_timed_out(self, tab: _Tab, exc: PageTimeout) -> None:
        """A page did not answer: a navigation is stopped and the page kept; otherwise (or
        if it does not stop) the page is reset, its session starting again on a blank
        page. Only when the browser itself does not answer either is it called hung."""
        if exc.method in _NAVIGATIONS and self._browser is not None:
            with contextlib.suppress(CdpCommandError):
                await self._browser.connection.call(
                    "Page.stopLoading", {}, session_id=tab.cdp_session, timeout=self._stop_loading_s
                )
                return
        # Raises BrowserFailed (and marks the connection failed) if the browser is hung.
        if self._browser is None:
            raise BrowserFailed(self._stopped_because or "it is not running")
        await self._browser.connection.call(
            "Browser.getVersion",
            {},
            timeout=min(self.limits.browser_call_timeout_s, HEALTH_CHECK_S),
        )
        if tab.crashed is None:
            tab.crashed = str(exc)
            for session, known in self._by_cdp_session.values():
                if known is tab:
                    session.changed.set()
            if self._browser is not None:
                self._browser.connection.fail_page(tab.cdp_session, tab.crashed)

    def _on_event(self, message: CdpMessage) -> None:
        method, params = message.method, message.params
        if method == "Target.targetCreated":
            self._maybe_follow(params.get("targetInfo"))
            return
        if method == "Target.targetCrashed":
            self._crashed(params)
            return
        if method == "Target.targetDestroyed":
            self._closed(params.get("targetId"))
            return
        found = self._by_cdp_session.get(message.session_id or "")
        if found is None:
            return
        session, tab = found
        if method == "Inspector.targetCrashed":
            self._crashed({"targetId": tab.target_id, "status": "crashed"})
            return
        frame = params.get("frameId")
        main = frame == tab.target_id
        if method == "Page.frameStartedLoading" and main:
            tab.started += 1
        elif method == "Page.frameStoppedLoading" and main:
            tab.stopped += 1
        elif method == "Page.frameNavigated":
            navigated = params.get("frame")
            if isinstance(navigated, dict) and navigated.get("id") == tab.target_id:
                tab.committed += 1
        elif method == "Page.domContentEventFired":
            tab.content_loaded += 1
        elif method == "Page.navigatedWithinDocument" and main:
            tab.same_document += 1
        elif method == "Page.javascriptDialogOpening":
            # A dialog blocks the page's scripts, and with them every later command: it
            # is dismissed at once, as headless browsers driven by tools usually do. A
            # beforeunload dialog is accepted: refusing it would keep the page from ever
            # being left.
            leave = params.get("type") == "beforeunload"
            self._in_background(self._call("Page.handleJavaScriptDialog", {"accept": leave}, tab))
        else:
            return
        session.changed.set()

    def _closed(self, target_id: Any) -> None:
        """A tab is gone from the browser (its page closed itself, or a tab was closed):
        calls still waiting on it fail now, and its session shows the tab before it. A
        renderer may also report itself killed as its page closes; that ends this tab
        only, never the session's others."""
        for session, tab in list(self._by_cdp_session.values()):
            if tab.target_id != target_id:
                continue
            self._remove_tab(session, tab)
            if self._browser is not None:
                self._browser.connection.fail_page(tab.cdp_session, "the page was closed")
            session.changed.set()

    def _crashed(self, params: dict[str, Any]) -> None:
        """A tab's renderer died (out of memory, a crash): its session hears it at once
        instead of waiting for calls that cannot be answered."""
        status = params.get("status")
        for session, tab in self._by_cdp_session.values():
            if tab.target_id == params.get("targetId") and tab.crashed is None:
                tab.crashed = "the page crashed" + (
                    f" ({status})" if isinstance(status, str) and status != "crashed" else ""
                )
                session.changed.set()
                if self._browser is not None:
                    self._browser.connection.fail_page(tab.cdp_session, tab.crashed)

    def _maybe_follow(self, info: Any) -> None:
        """A tab a session's page opened becomes that session's current tab."""
        if not isinstance(info, dict) or info.get("type") != "page" or not info.get("openerId"):
            return
        session = self._by_context.get(str(info.get("browserContextId")))
        target_id = info.get("targetId")
        if session is None or not isinstance(target_id, str):
            return

        async def follow() -> None:
            tab = await self._attach(session, target_id)
            # The new tab may have loaded before we were attached to hear it do so.
            check = "location.href !== 'about:blank' && document.readyState !== 'loading'"
            loaded = await self._call("Runtime.evaluate", {"expression": check}, tab)
            result = loaded.get("result")
            if isinstance(result, dict) and result.get("value") is True:
                tab.content_loaded += 1
            session.tab = tab
            session.tabs.append(tab)
            session.tabs_opened += 1
            session.changed.set()

        self._in_background(follow())

    def _in_background(self, work: Awaitable[Any]) -> None:
        async def run() -> None:
            with contextlib.suppress(BrowserFailed, CdpCommandError):
                await work

        task = asyncio.create_task(run())
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    # -- page work -----------------------------------------------------------------------

    @staticmethod
    def _before(session: _Session, tab: _Tab) -> _Before:
        return _Before(
            tab.started,
            tab.committed,
            tab.content_loaded,
            tab.stopped,
            tab.same_document,
            session.tabs_opened,
        )

    async def _wait(self, session: _Session, done: Callable[[], bool], timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while not done():
            if session.tab is not None and session.tab.crashed is not None:
                raise PageError(session.tab.crashed)
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            session.changed.clear()
            if done():
                return True
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(session.changed.wait(), remaining)
            if self._browser is None or self._browser.connection.failure is not None:
                raise BrowserFailed(
                    (self._browser.connection.failure if self._browser else None)
                    or "it stopped while a page loaded"
                )
        return True

    async def _wait_for_navigation(
        self, session: _Session, before: _Before, start_within: float = NAVIGATION_START_S
    ) -> None:
        """After an input event: if it started a navigation or opened a tab within
        `start_within` seconds, wait for that page to load; else the page stayed."""

        def started() -> bool:
            tab = session.tab
            return session.tabs_opened > before.tabs_opened or (
                tab is not None
                and (
                    tab.started > before.started
                    or tab.committed > before.committed
                    or tab.same_document > before.same_document
                )
            )

        if await self._wait(session, started, start_within):
            await self._wait_for_load(session, before, required=False)

    async def _wait_for_load(self, session: _Session, before: _Before, required: bool) -> None:
        """Until the session's page reached DOMContentLoaded (or stopped loading, or only
        moved within its document). A new tab is judged by its own counters."""

        def loaded() -> bool:
            tab = session.tab
            if tab is None:
                return False
            if session.tabs_opened > before.tabs_opened:
                return tab.content_loaded > 0 or tab.stopped > 0
            return (
                tab.content_loaded > before.content_loaded
                or tab.stopped > before.stopped
                or (tab.same_document > before.same_document and tab.started == before.started)
            )

        timeout = self.limits.browser_call_timeout_s
        if not await self._wait(session, loaded, timeout):
            # The load is stopped at its deadline: what arrived is shown, and a page that
            # never finishes keeps no renderer busy after the answer.
            tab = session.tab
            if tab is not None and tab.crashed is None and self._browser is not None:
                with contextlib.suppress(CdpCommandError, BrowserFailed):
                    await self._browser.connection.call(
                        "Page.stopLoading",
                        {},
                        session_id=tab.cdp_session,
                        timeout=self._stop_loading_s,
                    )
            if required:
                raise PageError(f"the page did not finish loading within {timeout:g} s")

    async def _click(self, tab: _Tab, element_id: int) -> None:
        rendered = tab.rendered
        target = rendered.targets.get(str(element_id)) if rendered else None
        if target is None:
            raise PageError(
                f"Could not find element with id {element_id} on the page shown last "
                "(use an id from the latest accessibility tree)"
            )
        x, y = await self._point_of(tab, target.backend_node_id, target.bounds)
        for kind in ("mouseMoved", "mousePressed", "mouseReleased"):
            event: dict[str, Any] = {"type": kind, "x": x, "y": y}
            if kind != "mouseMoved":
                event.update(button="left", clickCount=1)
            await self._call("Input.dispatchMouseEvent", event, tab)

    async def _point_of(
        self, tab: _Tab, backend_id: int | None, bounds: Rect
    ) -> tuple[float, float]:
        """The element's centre in viewport coordinates, scrolled into view first; the
        box from the last tree (made relative to the scroll position) if that fails."""
        if backend_id is not None:
            with contextlib.suppress(CdpCommandError):
                await self._call("DOM.scrollIntoViewIfNeeded", {"backendNodeId": backend_id}, tab)
                quads = (
                    await self._call("DOM.getContentQuads", {"backendNodeId": backend_id}, tab)
                ).get("quads")
                if isinstance(quads, list) and quads and isinstance(quads[0], list):
                    quad = [float(v) for v in quads[0] if isinstance(v, (int, float))]
                    if len(quad) == 8:
                        return sum(quad[0::2]) / 4, sum(quad[1::2]) / 4
        viewport = await self._viewport(tab)
        return (
            bounds.left + bounds.width / 2 - viewport.left,
            bounds.top + bounds.height / 2 - viewport.top,
        )

    async def _key(
        self,
        tab: _Tab,
        key: str,
        code: str,
        key_code: int,
        *,
        modifiers: int = 0,
        text: str | None = None,
        commands: list[str] | None = None,
    ) -> None:
        down: dict[str, Any] = {
            "type": "keyDown" if text else "rawKeyDown",
            "key": key,
            "code": code,
            "windowsVirtualKeyCode": key_code,
            "modifiers": modifiers,
        }
        if text:
            down.update(text=text, unmodifiedText=text)
        if commands:
            down["commands"] = commands
        await self._call("Input.dispatchKeyEvent", down, tab)
        up = {"type": "keyUp", "key": key, "code": code, "windowsVirtualKeyCode": key_code}
        await self._call("Input.dispatchKeyEvent", {**up, "modifiers": modifiers}, tab)

    async def _viewport(self, tab: _Tab) -> Rect:
        metrics = await self._call("Page.getLayoutMetrics", {}, tab)
        view = metrics.get("cssVisualViewport")
        if not isinstance(view, dict):
            return Rect(0, 0, chromium.VIEWPORT_WIDTH, chromium.VIEWPORT_HEIGHT)

        def number(key: str, default: float) -> float:
            value = view.get(key)
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                return float(value)
            return default

        return Rect(
            number("pageX", 0),
            number("pageY", 0),
            number("clientWidth", chromium.VIEWPORT_WIDTH),
            number("clientHeight", chromium.VIEWPORT_HEIGHT),
        )

    async def _render(self, tab: _Tab) -> PageText:
        text = PageText("", None, {}, False)
        for attempt in range(EMPTY_TREE_RETRIES + 1):
            if attempt:
                await asyncio.sleep(EMPTY_TREE_PAUSE_S)
            viewport = await self._viewport(tab)
            tree = await self._call("Accessibility.getFullAXTree", {}, tab)
            snapshot = await self._call(
                "DOMSnapshot.captureSnapshot", {"computedStyles": [], "includeDOMRects": True}, tab
            )
            nodes = tree.get("nodes")
            # A big page takes a while to walk: off the event loop, so other calls go on.
            text = await asyncio.to_thread(
                render_page,
                nodes if isinstance(nodes, list) else [],
                snapshot,
                viewport,
                max_chars=self.limits.browser_tree_max_chars,
            )
            if text.tree:
                break
        tab.rendered = text
        return text

    async def _url(self, tab: _Tab) -> str:
        history = await self._call("Page.getNavigationHistory", {}, tab)
        entries, index = history.get("entries"), history.get("currentIndex")
        if isinstance(entries, list) and isinstance(index, int) and 0 <= index < len(entries):
            entry = entries[index]
            url = entry.get("url") if isinstance(entry, dict) else None
            if isinstance(url, str):
                return url
        return ""

    async def _url_or_blank(self, session: _Session) -> str:
        if session.tab is None or session.tab.crashed is not None:
            return ""
        with contextlib.suppress(CdpCommandError):
            return await self._url(session.tab)
        return ""


def _identity_key(identity: Identity) -> tuple[int | None, int | None, list[int]]:
    """What makes two identities the same to the browser: uid, gid and the supplementary
    groups (a browser with group `docker` must not serve a session without it)."""
    return identity.uid, identity.gid, sorted(identity.groups or [])
