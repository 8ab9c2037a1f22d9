"""Typed parameters and results of the web browser methods (PROTOCOL.md, "Web browser").

The names and shapes are the ones inspect_ai's `web_browser` tools send and read, so its
host drives this runtime unchanged; `user`, `web_screenshot`, `web_close_session` and
`browser_info` are ours, as are key presses and tabs (the `browser-mcp` server's tools).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, TypedDict, get_args

from sandbox_tools.runtime.identity import UserSpec, parse_user
from sandbox_tools.runtime.jsonrpc import InvalidParams, Params, WireParams, required, wire
from sandbox_tools.runtime.tools.web_browser.keys import UnknownKey, key_event

ScrollDirection = Literal["up", "down"]
SCROLL_DIRECTIONS: tuple[ScrollDirection, ...] = get_args(ScrollDirection)
ELEMENT_ID_DOC = "The number in brackets before the element in the latest page tree."


@dataclass(frozen=True, kw_only=True)
class NewSessionParams(WireParams):
    # inspect's host always sends it; a headless shell has no window to show either way.
    headful: bool = False
    user: UserSpec | None = wire(default=None, read=parse_user)


@dataclass(frozen=True, kw_only=True)
class InfoParams(WireParams):
    """browser_info."""

    # False: which browser the next session would start, without starting any process
    # (the host asks so after mounting an add-on, before anything of it runs).
    version: bool = True
    # With `addon_dir` and `addon_digest`: the add-on there is first checked against that
    # tree digest, as the installer's `addon-check` does (by `addon_signature`, the stat
    # signature an earlier check gave, where there is one), and the answer's "addon" is
    # that check's: one round trip on the channel where an exec of its own started an
    # interpreter. The host asks so only of a server running as the installer.
    addon_dir: str | None = None
    addon_digest: str | None = None
    addon_signature: str | None = None


@dataclass(frozen=True, kw_only=True)
class SessionParams(WireParams):
    """web_back, web_forward, web_refresh, web_screenshot, web_close_session."""

    session_name: str


@dataclass(frozen=True, kw_only=True)
class GoParams(WireParams):
    session_name: str
    url: str = wire(doc="The address to open.")


@dataclass(frozen=True, kw_only=True)
class ClickParams(WireParams):
    session_name: str
    element_id: int = wire(doc=ELEMENT_ID_DOC)


@dataclass(frozen=True, kw_only=True)
class TypeParams(WireParams):
    """web_type and web_type_submit."""

    session_name: str
    element_id: int = wire(doc=ELEMENT_ID_DOC)
    text: str = wire(doc="What to type.")


@dataclass(frozen=True, kw_only=True)
class ScrollParams(WireParams):
    session_name: str
    direction: ScrollDirection = wire(doc="One screen up or down.")


def _known_key(params: Params, name: str) -> str:
    key = required(params, name, str)
    try:
        key_event(key)
    except UnknownKey as exc:
        raise InvalidParams(f'Invalid params: field "{name}": {exc}') from None
    return key


@dataclass(frozen=True, kw_only=True)
class KeyParams(WireParams):
    """A key press: `key` as a model names it ("Enter", "Shift+Tab", "a")."""

    session_name: str
    key: str = wire(read=_known_key, doc='The key, e.g. "Enter" or "a".')


@dataclass(frozen=True, kw_only=True)
class TabParams(WireParams):
    """Selecting or closing a tab: `index` as the tab list numbers it (closing without
    one closes the current tab)."""

    session_name: str
    index: int | None = wire(
        default=None, minimum=0, doc="The tab's index in the list (select and close)."
    )


class TabInfo(TypedDict):
    index: int
    title: str
    url: str  # without its query string, as `web_url`
    current: bool


class NewSessionResult(TypedDict):
    session_name: str


class CrawlerResult(TypedDict):
    """What every page action answers; a page's failure is in `error`, not a JSON-RPC
    error, so the host shows it to the model as the tool's result."""

    web_url: str  # without its query string, as inspect's host reads it
    page_url: str  # ours: the whole URL, for host scripts that check what was submitted
    main_content: str | None
    web_at: str
    error: str | None


class ScreenshotResult(TypedDict):
    png_base64: str
    width: int
    height: int


class CloseResult(TypedDict):
    closed: bool


class _AddonChecked(TypedDict, total=False):
    addon: dict[str, object]  # the add-on's check, where one was asked (InfoParams)


class BrowserInfo(_AddonChecked):
    installed: bool
    executable: str
    version: str | None
    running: bool
    pid: int | None
    uid: int | None
    sessions: int
