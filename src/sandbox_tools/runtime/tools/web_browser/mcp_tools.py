"""The browser's MCP tools: their names, JSON Schemas and descriptions, and each call
turned into a controller call and its answer into an MCP `CallToolResult`.

A model reads the descriptions and the results, so both say what to do next, and
everything that goes wrong for it (a page that failed, an id not on the page, an unknown
tool, a bad argument) is a result with `isError: true` it can read and act on, never a
JSON-RPC error its client would turn into an exception. The arguments are checked
against the same schemas `tools/list` publishes, so the two cannot disagree.
"""

from __future__ import annotations

import asyncio
import json
import sys
import traceback
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from sandbox_tools.runtime.jsonrpc import RpcError
from sandbox_tools.runtime.tools.web_browser.controller import WebBrowserController
from sandbox_tools.runtime.tools.web_browser.tool_types import (
    ClickParams,
    CrawlerResult,
    GoParams,
    KeyParams,
    NewSessionParams,
    ScrollParams,
    SessionParams,
    TabInfo,
    TabParams,
    TypeParams,
)

ToolResult = dict[str, Any]  # an MCP CallToolResult: {content: [...], isError: bool}
Arguments = dict[str, Any]

_ELEMENT_ID = {
    "type": "integer",
    "description": "The number in brackets before the element in the latest page tree.",
}


def _schema(properties: dict[str, Any] | None = None, required: tuple[str, ...] = ()) -> Any:
    schema: dict[str, Any] = {
        "type": "object",
        "properties": properties or {},
        "additionalProperties": False,
    }
    if required:
        schema["required"] = list(required)
    return schema


@dataclass(frozen=True)
class McpTool:
    name: str
    description: str
    input_schema: dict[str, Any]
    run: Callable[[BrowserTools, Arguments], Awaitable[ToolResult]]

    def listing(self) -> dict[str, Any]:
        """This tool as `tools/list` shows it."""
        return {
            "name": self.name,
            "description": self.description,
            "inputSchema": self.input_schema,
        }


def text_result(text: str, is_error: bool = False) -> ToolResult:
    return {"content": [{"type": "text", "text": text}], "isError": is_error}


def page_result(page: CrawlerResult, before: str = "") -> ToolResult:
    """A page as the model reads it: its URL, then the tree whose ids the click and type
    tools take; a page's failure is an error result naming it."""
    prefix = f"{before}\n\n" if before else ""
    if page["error"] is not None:
        url = f"\nURL: {page['web_url']}" if page["web_url"] else ""
        return text_result(f"{prefix}Error: {page['error']}{url}", is_error=True)
    return text_result(f"{prefix}URL: {page['web_url']}\n\n{page['web_at']}")


def tab_list(tabs: list[TabInfo]) -> str:
    lines = [
        f'[{tab["index"]}] "{tab["title"]}" {tab["url"] or "about:blank"}'
        + (" (current)" if tab["current"] else "")
        for tab in tabs
    ]
    return "Tabs:\n" + "\n".join(lines)


# The schema's type names: how a value is checked, and how the check's message names it.
_TYPES: dict[str, tuple[Callable[[Any], bool], str]] = {
    "string": (lambda v: isinstance(v, str), "a string"),
    "integer": (lambda v: isinstance(v, int) and not isinstance(v, bool), "an integer"),
    "boolean": (lambda v: isinstance(v, bool), "true or false"),
}


def _shown(value: Any, limit: int = 80) -> str:
    """A value as JSON in a message, cut short: a model may send megabytes."""
    text = json.dumps(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def argument_error(tool: McpTool, arguments: Any) -> str | None:
    """What is wrong with `arguments` for `tool` by its schema (the few JSON Schema words
    the schemas here use), in a sentence for the model; None if nothing."""
    if not isinstance(arguments, dict):
        return f"the arguments of {tool.name} must be an object, got {type(arguments).__name__}"
    properties: dict[str, Any] = tool.input_schema["properties"]
    takes = ", ".join(properties) or "no arguments"
    for name in arguments:
        if name not in properties:
            return f"{tool.name} has no argument {_shown(name)} (it takes {takes})"
    for name in tool.input_schema.get("required", []):
        if arguments.get(name) is None:
            return f"{tool.name} needs the argument {name!r} (it takes {takes})"
    for name, value in arguments.items():
        rule = properties[name]
        if value is None:
            continue  # an optional argument sent as null is an argument not sent
        fits, kind = _TYPES[rule["type"]]
        if not fits(value):
            return f"{tool.name}: {name!r} must be {kind}, got {_shown(value)}"
        if "enum" in rule and value not in rule["enum"]:
            allowed = " or ".join(repr(v) for v in rule["enum"])
            return f"{tool.name}: {name!r} must be {allowed}, got {_shown(value)}"
        if "minimum" in rule and value < rule["minimum"]:
            return f"{tool.name}: {name!r} must be at least {rule['minimum']}, got {value}"
    return None


class BrowserTools:
    """The MCP tools over one controller and the one browser session they share,
    opened by the first call (so `initialize` and `tools/list` start no browser)."""

    def __init__(self, controller: WebBrowserController) -> None:
        self.controller = controller
        self._session_name: str | None = None
        self._opening = asyncio.Lock()

    async def session(self) -> str:
        async with self._opening:
            if self._session_name is None:
                opened = await self.controller.new_session(
                    NewSessionParams(headful=False, user=None)
                )
                self._session_name = opened["session_name"]
            return self._session_name

    async def call(self, name: str, arguments: Any) -> ToolResult:
        """One `tools/call`: every failure a model can act on is an error result."""
        tool = TOOLS_BY_NAME.get(name)
        if tool is None:
            return text_result(
                f"there is no tool {_shown(name)}; the tools are {', '.join(TOOLS_BY_NAME)}",
                is_error=True,
            )
        arguments = {} if arguments is None else arguments
        problem = argument_error(tool, arguments)
        if problem is not None:
            return text_result(problem, is_error=True)
        try:
            return await tool.run(self, arguments)
        except RpcError as exc:  # a ToolError (the browser failed, none installed), bad params
            return text_result(exc.message, is_error=True)
        except Exception as exc:
            # A bug of ours: the model learns the call failed, the log gets the traceback,
            # and the server keeps serving.
            traceback.print_exc(file=sys.stderr)
            return text_result(f"internal error in {name}: {exc}", is_error=True)


async def _navigate(tools: BrowserTools, arguments: Arguments) -> ToolResult:
    params = GoParams(session_name=await tools.session(), url=arguments["url"])
    return page_result(await tools.controller.go(params))


async def _snapshot(tools: BrowserTools, arguments: Arguments) -> ToolResult:
    params = SessionParams(session_name=await tools.session())
    return page_result(await tools.controller.snapshot(params))


async def _click(tools: BrowserTools, arguments: Arguments) -> ToolResult:
    params = ClickParams(session_name=await tools.session(), element_id=arguments["element_id"])
    return page_result(await tools.controller.click(params))


async def _type(tools: BrowserTools, arguments: Arguments) -> ToolResult:
    params = TypeParams(
        session_name=await tools.session(),
        element_id=arguments["element_id"],
        text=arguments["text"],
    )
    submit = bool(arguments.get("submit"))
    return page_result(await tools.controller.type_text(params, submit=submit))


async def _press_key(tools: BrowserTools, arguments: Arguments) -> ToolResult:
    params = KeyParams.parse({"session_name": await tools.session(), "key": arguments["key"]})
    return page_result(await tools.controller.press_key(params))


async def _scroll(tools: BrowserTools, arguments: Arguments) -> ToolResult:
    params = ScrollParams.parse(
        {"session_name": await tools.session(), "direction": arguments["direction"]}
    )
    return page_result(await tools.controller.scroll(params))


async def _back(tools: BrowserTools, arguments: Arguments) -> ToolResult:
    params = SessionParams(session_name=await tools.session())
    return page_result(await tools.controller.history(params, step=-1))


async def _forward(tools: BrowserTools, arguments: Arguments) -> ToolResult:
    params = SessionParams(session_name=await tools.session())
    return page_result(await tools.controller.history(params, step=1))


async def _screenshot(tools: BrowserTools, arguments: Arguments) -> ToolResult:
    shot = await tools.controller.screenshot(SessionParams(session_name=await tools.session()))
    return {
        "content": [
            {"type": "image", "data": shot["png_base64"], "mimeType": "image/png"},
            {"type": "text", "text": f"The browser's viewport, {shot['width']}x{shot['height']}."},
        ],
        "isError": False,
    }


async def _tabs(tools: BrowserTools, arguments: Arguments) -> ToolResult:
    name = await tools.session()
    action, index = arguments["action"], arguments.get("index")
    controller = tools.controller
    if action == "list":
        return text_result(tab_list(await controller.list_tabs(SessionParams(session_name=name))))
    if action == "select" and index is None:
        return text_result("browser_tabs: select needs the tab's 'index'", is_error=True)
    if action == "select":
        page = await controller.select_tab(TabParams(session_name=name, index=index))
    elif action == "new":
        page = await controller.new_tab(SessionParams(session_name=name))
    else:
        page = await controller.close_tab(TabParams(session_name=name, index=index))
    # The list after the change, then the page now shown (and the ids to act on it).
    tabs = await controller.list_tabs(SessionParams(session_name=name))
    return page_result(page, before=tab_list(tabs))


_PAGE = (
    "Answers with the page: its URL and its accessibility tree, one element on screen per "
    'line as `[id] role "name"`; pass an id to browser_click or browser_type.'
)

TOOLS = [
    McpTool(
        "browser_navigate",
        "Open a URL in the current tab (a URL without a scheme gets https://) and wait "
        f"until it has loaded. {_PAGE}",
        _schema({"url": {"type": "string", "description": "The address to open."}}, ("url",)),
        _navigate,
    ),
    McpTool(
        "browser_snapshot",
        "Read the current page again without acting on it, to see what changed on its own "
        f"or to get fresh element ids. {_PAGE}",
        _schema(),
        _snapshot,
    ),
    McpTool(
        "browser_click",
        "Click an element (scrolled into view first) by its id from the latest page tree. "
        f"A page or tab the click opens is waited for and answered. {_PAGE}",
        _schema({"element_id": _ELEMENT_ID}, ("element_id",)),
        _click,
    ),
    McpTool(
        "browser_type",
        "Click a text field by its id and type text into it. With submit true, the field's "
        "content is replaced by the text and Enter is pressed (submitting its form); "
        f"without, the text is inserted where the click put the cursor. {_PAGE}",
        _schema(
            {
                "element_id": _ELEMENT_ID,
                "text": {"type": "string", "description": "What to type."},
                "submit": {
                    "type": "boolean",
                    "description": "Replace the field's content and press Enter (default false).",
                },
            },
            ("element_id", "text"),
        ),
        _type,
    ),
    McpTool(
        "browser_press_key",
        "Press one key on the element that has focus, as a keyboard does: Enter, Tab, "
        "Escape, Backspace, Delete, ArrowUp, ArrowDown, ArrowLeft, ArrowRight, Home, End, "
        "PageUp, PageDown, Space, F1-F12, or a single character; modifiers go before it "
        f'with "+" (Shift+Tab, Control+a). {_PAGE}',
        _schema(
            {"key": {"type": "string", "description": 'The key, e.g. "Enter" or "a".'}},
            ("key",),
        ),
        _press_key,
    ),
    McpTool(
        "browser_scroll",
        "Scroll the page one screen up or down: the tree shows only what is on screen, so "
        f"scroll to read further. {_PAGE}",
        _schema({"direction": {"type": "string", "enum": ["up", "down"]}}, ("direction",)),
        _scroll,
    ),
    McpTool(
        "browser_back",
        f"Go back one page in the current tab's history (it stays put at the start). {_PAGE}",
        _schema(),
        _back,
    ),
    McpTool(
        "browser_forward",
        f"Go forward one page in the current tab's history (it stays put at the end). {_PAGE}",
        _schema(),
        _forward,
    ),
    McpTool(
        "browser_screenshot",
        "Take a PNG picture of what the browser shows (its 1280x1080 viewport). The page "
        "tree is cheaper to read and has the ids to act on; use this for layout, images "
        "and drawings.",
        _schema(),
        _screenshot,
    ),
    McpTool(
        "browser_tabs",
        "Manage tabs. list: every tab with its index, title and URL, the current one "
        "marked; select: show tab `index`; new: open a blank tab and show it; close: close "
        "tab `index` (the current one without an index). A link that opens a new window "
        "opens a new tab and shows it. Select, new and close answer with the tab list and "
        "the page now shown.",
        _schema(
            {
                "action": {"type": "string", "enum": ["list", "select", "new", "close"]},
                "index": {
                    "type": "integer",
                    "minimum": 0,
                    "description": "The tab's index in the list (select and close).",
                },
            },
            ("action",),
        ),
        _tabs,
    ),
]
TOOLS_BY_NAME = {tool.name: tool for tool in TOOLS}
