"""The browser's MCP tools: their names, JSON Schemas and descriptions, and each call
turned into a controller call and its answer into an MCP `CallToolResult`.

A model reads the descriptions and the results, so both say what to do next, and
everything that goes wrong for it (a page that failed, an id not on the page, an unknown
tool, a bad argument) is a result with `isError: true` it can read and act on, never a
JSON-RPC error its client would turn into an exception. The arguments are checked
against the same schemas `tools/list` publishes, so the two cannot disagree; each schema
is made from the params dataclass the JSON-RPC method parses (tool_types.py), and the
arguments are then parsed by it, so a field is declared once for every surface.
"""

from __future__ import annotations

import asyncio
import json
import sys
import traceback
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

from sandbox_tools.runtime.jsonrpc import RpcError, WireParams, wire, wire_fields
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
P = TypeVar("P", bound=WireParams)
_SESSION = "session_name"  # held by the server, one per connection: never an argument
_JSON_TYPES = {str: "string", int: "integer", float: "number", bool: "boolean"}


@dataclass(frozen=True, kw_only=True)
class TypeArguments(TypeParams):
    submit: bool = wire(
        default=False, doc="Replace the field's content and press Enter (default false)."
    )


@dataclass(frozen=True, kw_only=True)
class TabsArguments(TabParams):
    action: Literal["list", "select", "new", "close"]


def input_schema(params: type[WireParams] | None) -> dict[str, Any]:
    """The JSON Schema of a tool's arguments: the fields of the dataclass its call is
    parsed into, but the session."""
    properties: dict[str, Any] = {}
    required = []
    for field in wire_fields(params) if params is not None else []:
        if field.name == _SESSION:
            continue
        rule: dict[str, Any] = {"type": _JSON_TYPES[field.kind]}
        if field.choices:
            rule["enum"] = list(field.choices)
        if field.rules.minimum is not None:
            rule["minimum"] = field.rules.minimum
        if field.rules.doc is not None:
            rule["description"] = field.rules.doc
        properties[field.name] = rule
        if field.required:
            required.append(field.name)
    schema: dict[str, Any] = {
        "type": "object",
        "properties": properties,
        "additionalProperties": False,
    }
    if required:
        schema["required"] = required
    return schema


@dataclass(frozen=True)
class McpTool:
    name: str
    description: str
    params: type[WireParams] | None  # what the arguments are parsed into; None: none
    run: Callable[[BrowserTools, Arguments], Awaitable[ToolResult]]

    @property
    def input_schema(self) -> dict[str, Any]:
        return _SCHEMAS[self.name]

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
    "number": (lambda v: isinstance(v, (int, float)) and not isinstance(v, bool), "a number"),
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

    async def params(self, kind: type[P], arguments: Arguments) -> P:
        """A call's arguments parsed as its method's params, in this connection's session."""
        return kind.parse({**arguments, _SESSION: await self.session()})

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
    return page_result(await tools.controller.go(await tools.params(GoParams, arguments)))


async def _snapshot(tools: BrowserTools, arguments: Arguments) -> ToolResult:
    params = await tools.params(SessionParams, arguments)
    return page_result(await tools.controller.snapshot(params))


async def _click(tools: BrowserTools, arguments: Arguments) -> ToolResult:
    return page_result(await tools.controller.click(await tools.params(ClickParams, arguments)))


async def _type(tools: BrowserTools, arguments: Arguments) -> ToolResult:
    params = await tools.params(TypeArguments, arguments)
    return page_result(await tools.controller.type_text(params, submit=params.submit))


async def _press_key(tools: BrowserTools, arguments: Arguments) -> ToolResult:
    params = await tools.params(KeyParams, arguments)
    return page_result(await tools.controller.press_key(params))


async def _scroll(tools: BrowserTools, arguments: Arguments) -> ToolResult:
    params = await tools.params(ScrollParams, arguments)
    return page_result(await tools.controller.scroll(params))


async def _back(tools: BrowserTools, arguments: Arguments) -> ToolResult:
    params = await tools.params(SessionParams, arguments)
    return page_result(await tools.controller.history(params, step=-1))


async def _forward(tools: BrowserTools, arguments: Arguments) -> ToolResult:
    params = await tools.params(SessionParams, arguments)
    return page_result(await tools.controller.history(params, step=1))


async def _screenshot(tools: BrowserTools, arguments: Arguments) -> ToolResult:
    shot = await tools.controller.screenshot(await tools.params(SessionParams, arguments))
    return {
        "content": [
            {"type": "image", "data": shot["png_base64"], "mimeType": "image/png"},
            {"type": "text", "text": f"The browser's viewport, {shot['width']}x{shot['height']}."},
        ],
        "isError": False,
    }


async def _tabs(tools: BrowserTools, arguments: Arguments) -> ToolResult:
    params = await tools.params(TabsArguments, arguments)
    session = SessionParams(session_name=params.session_name)
    controller = tools.controller
    if params.action == "list":
        return text_result(tab_list(await controller.list_tabs(session)))
    if params.action == "select" and params.index is None:
        return text_result("browser_tabs: select needs the tab's 'index'", is_error=True)
    if params.action == "select":
        page = await controller.select_tab(params)
    elif params.action == "new":
        page = await controller.new_tab(session)
    else:
        page = await controller.close_tab(params)
    # The list after the change, then the page now shown (and the ids to act on it).
    return page_result(page, before=tab_list(await controller.list_tabs(session)))


_PAGE = (
    "Answers with the page: its URL and its accessibility tree, one element on screen per "
    'line as `[id] role "name"`; pass an id to browser_click or browser_type.'
)

TOOLS = [
    McpTool(
        "browser_navigate",
        "Open a URL in the current tab (a URL without a scheme gets https://) and wait "
        f"until it has loaded. {_PAGE}",
        GoParams,
        _navigate,
    ),
    McpTool(
        "browser_snapshot",
        "Read the current page again without acting on it, to see what changed on its own "
        f"or to get fresh element ids. {_PAGE}",
        None,
        _snapshot,
    ),
    McpTool(
        "browser_click",
        "Click an element (scrolled into view first) by its id from the latest page tree. "
        f"A page or tab the click opens is waited for and answered. {_PAGE}",
        ClickParams,
        _click,
    ),
    McpTool(
        "browser_type",
        "Click a text field by its id and type text into it. With submit true, the field's "
        "content is replaced by the text and Enter is pressed (submitting its form); "
        f"without, the text is inserted where the click put the cursor. {_PAGE}",
        TypeArguments,
        _type,
    ),
    McpTool(
        "browser_press_key",
        "Press one key on the element that has focus, as a keyboard does: Enter, Tab, "
        "Escape, Backspace, Delete, ArrowUp, ArrowDown, ArrowLeft, ArrowRight, Home, End, "
        "PageUp, PageDown, Space, F1-F12, or a single character; modifiers go before it "
        f'with "+" (Shift+Tab, Control+a). {_PAGE}',
        KeyParams,
        _press_key,
    ),
    McpTool(
        "browser_scroll",
        "Scroll the page one screen up or down: the tree shows only what is on screen, so "
        f"scroll to read further. {_PAGE}",
        ScrollParams,
        _scroll,
    ),
    McpTool(
        "browser_back",
        f"Go back one page in the current tab's history (it stays put at the start). {_PAGE}",
        None,
        _back,
    ),
    McpTool(
        "browser_forward",
        f"Go forward one page in the current tab's history (it stays put at the end). {_PAGE}",
        None,
        _forward,
    ),
    McpTool(
        "browser_screenshot",
        "Take a PNG picture of what the browser shows (its 1280x1080 viewport). The page "
        "tree is cheaper to read and has the ids to act on; use this for layout, images "
        "and drawings.",
        None,
        _screenshot,
    ),
    McpTool(
        "browser_tabs",
        "Manage tabs. list: every tab with its index, title and URL, the current one "
        "marked; select: show tab `index`; new: open a blank tab and show it; close: close "
        "tab `index` (the current one without an index). A link that opens a new window "
        "opens a new tab and shows it. Select, new and close answer with the tab list and "
        "the page now shown.",
        TabsArguments,
        _tabs,
    ),
]
TOOLS_BY_NAME = {tool.name: tool for tool in TOOLS}
_SCHEMAS = {tool.name: input_schema(tool.params) for tool in TOOLS}  # made once, at import
