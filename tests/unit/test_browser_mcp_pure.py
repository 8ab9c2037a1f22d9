"""The `browser-mcp` server's pure parts: key names to DevTools key events, stdin cut
into bounded lines, the protocol revision chosen, tool arguments checked against the
published schemas, and the answers that need no browser (a controller that never
starts one is enough for those: `initialize`, `ping`, `tools/list`, unknown methods and
tools, bad arguments)."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from sandbox_tools.protocol import INVALID_PARAMS, INVALID_REQUEST, METHOD_NOT_FOUND, PARSE_ERROR
from sandbox_tools.runtime.jsonrpc import InvalidParams
from sandbox_tools.runtime.limits import Limits
from sandbox_tools.runtime.tools.web_browser.controller import WebBrowserController
from sandbox_tools.runtime.tools.web_browser.keys import (
    CONTROL,
    SHIFT,
    KeyEvent,
    UnknownKey,
    key_event,
)
from sandbox_tools.runtime.tools.web_browser.mcp_server import (
    PROTOCOL_VERSIONS,
    BrowserMcpServer,
    LineSplitter,
    TooLong,
    negotiate_version,
)
from sandbox_tools.runtime.tools.web_browser.mcp_tools import (
    TOOLS,
    TOOLS_BY_NAME,
    BrowserTools,
    argument_error,
    page_result,
)
from sandbox_tools.runtime.tools.web_browser.tool_types import KeyParams, TabParams

# -- keys --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "event"),
    [
        ("Enter", KeyEvent("Enter", "Enter", 13, "\r")),
        ("enter", KeyEvent("Enter", "Enter", 13, "\r")),
        ("Return", KeyEvent("Enter", "Enter", 13, "\r")),
        ("Tab", KeyEvent("Tab", "Tab", 9)),
        ("ArrowDown", KeyEvent("ArrowDown", "ArrowDown", 40)),
        ("Down", KeyEvent("ArrowDown", "ArrowDown", 40)),
        ("Escape", KeyEvent("Escape", "Escape", 27)),
        ("Esc", KeyEvent("Escape", "Escape", 27)),
        ("Space", KeyEvent(" ", "Space", 32, " ")),
        ("F5", KeyEvent("F5", "F5", 116)),
        ("a", KeyEvent("a", "KeyA", 65, "a")),
        ("A", KeyEvent("A", "KeyA", 65, "A")),
        ("7", KeyEvent("7", "Digit7", 55, "7")),
        ("/", KeyEvent("/", "Slash", 191, "/")),
        ("+", KeyEvent("+", "", 0, "+")),
        ("é", KeyEvent("é", "", 0, "é")),
        ("Shift+Tab", KeyEvent("Tab", "Tab", 9, None, SHIFT)),
        ("Shift+a", KeyEvent("A", "KeyA", 65, "A", SHIFT)),
        ("Control+a", KeyEvent("a", "KeyA", 65, None, CONTROL)),
        ("ctrl+shift+Z", KeyEvent("Z", "KeyZ", 90, None, CONTROL | SHIFT)),
        ("Control++", KeyEvent("+", "", 0, None, CONTROL)),
        ("Control+Enter", KeyEvent("Enter", "Enter", 13, None, CONTROL)),
    ],
)
def test_keys_are_named_as_a_model_writes_them(name: str, event: KeyEvent) -> None:
    assert key_event(name) == event


@pytest.mark.parametrize(
    ("name", "said"),
    [
        ("", "the key is empty"),
        ("Enterr", "unknown key 'Enterr': use a single character or one of Enter, Tab"),
        ("Hyper+a", "'Hyper' in 'Hyper+a' is not a modifier"),
        ("a+b", "'a' in 'a+b' is not a modifier"),
    ],
)
def test_a_key_no_keyboard_has_is_refused_naming_the_ones_there_are(name: str, said: str) -> None:
    with pytest.raises(UnknownKey, match=f"^{re.escape(said)}"):
        key_event(name)
    with pytest.raises(InvalidParams, match='field "key"'):
        KeyParams.parse({"session_name": "s", "key": name})


def test_a_tab_index_is_optional_and_an_integer() -> None:
    assert TabParams.parse({"session_name": "s"}).index is None
    assert TabParams.parse({"session_name": "s", "index": 2}).index == 2
    with pytest.raises(InvalidParams, match='"index" must be integer'):
        TabParams.parse({"session_name": "s", "index": "2"})


# -- stdin's lines -----------------------------------------------------------------------


def test_lines_are_cut_at_newlines_across_reads() -> None:
    splitter = LineSplitter(100)
    assert splitter.feed(b'{"a"') == []
    assert splitter.feed(b':1}\n{"b":2}\n{"c"') == [b'{"a":1}', b'{"b":2}']
    assert splitter.feed(b":3}\r\n") == [b'{"c":3}\r']
    assert splitter.end() == []


def test_a_last_line_without_its_newline_still_counts() -> None:
    splitter = LineSplitter(100)
    assert splitter.feed(b'{"a":1}') == []
    assert splitter.end() == [b'{"a":1}']


def test_a_line_over_the_bound_is_reported_once_and_never_held_whole() -> None:
    splitter = LineSplitter(10)
    first = splitter.feed(b"x" * 8)
    assert first == []
    too_long = splitter.feed(b"x" * 8)  # 16 bytes and no newline yet: refused now
    assert len(too_long) == 1 and isinstance(too_long[0], TooLong)
    assert splitter.feed(b"y" * 1000) == []  # the rest of that line is skipped, not kept
    assert splitter._buffer == bytearray()
    assert splitter.feed(b"yyy\nok\n") == [b"ok"]
    exact = splitter.feed(b"z" * 10 + b"\n" + b"w" * 11 + b"\n")
    assert exact[0] == b"z" * 10 and isinstance(exact[1], TooLong)
    assert splitter.feed(b"x" * 20) and splitter.end() == []  # a long unfinished last line


# -- the protocol ------------------------------------------------------------------------


def test_the_clients_revision_is_answered_when_we_speak_it_else_our_newest() -> None:
    for version in PROTOCOL_VERSIONS:
        assert negotiate_version(version) == version
    assert negotiate_version("2025-11-25") == "2025-06-18"
    assert negotiate_version(None) == "2025-06-18"


def test_every_tools_schema_is_an_object_whose_required_arguments_it_describes() -> None:
    assert [tool.name for tool in TOOLS] == [
        "browser_navigate",
        "browser_snapshot",
        "browser_click",
        "browser_type",
        "browser_press_key",
        "browser_scroll",
        "browser_back",
        "browser_forward",
        "browser_screenshot",
        "browser_tabs",
    ]
    for tool in TOOLS:
        schema = tool.input_schema
        assert schema["type"] == "object" and schema["additionalProperties"] is False
        assert set(schema.get("required", [])) <= set(schema["properties"])
        assert all(
            rule["type"] in ("string", "integer", "boolean")
            for rule in schema["properties"].values()
        )
        assert len(tool.description) > 40


@pytest.mark.parametrize(
    ("tool", "arguments", "said"),
    [
        ("browser_navigate", {}, "browser_navigate needs the argument 'url' (it takes url)"),
        ("browser_navigate", {"url": 1}, "browser_navigate: 'url' must be a string, got 1"),
        ("browser_click", {"element_id": "3"}, """'element_id' must be an integer, got "3\""""),
        ("browser_click", {"element_id": True}, "'element_id' must be an integer, got true"),
        ("browser_click", {"element_id": 1, "x": 2}, 'has no argument "x" (it takes element_id)'),
        ("browser_type", {"element_id": 1, "text": "a", "submit": "yes"}, "must be true or false"),
        ("browser_scroll", {"direction": "left"}, """must be 'up' or 'down', got "left\""""),
        ("browser_tabs", {"action": "select", "index": -1}, "'index' must be at least 0, got -1"),
        ("browser_snapshot", [], "the arguments of browser_snapshot must be an object, got list"),
        ("browser_snapshot", {"a": "x" * 1000}, "has no argument"),
    ],
)
def test_arguments_are_checked_against_the_published_schema(
    tool: str, arguments: Any, said: str
) -> None:
    problem = argument_error(TOOLS_BY_NAME[tool], arguments)
    assert problem is not None and said in problem
    assert len(problem) < 200  # a megabyte argument is not echoed back


def test_good_arguments_pass_and_null_is_an_argument_not_sent() -> None:
    assert argument_error(TOOLS_BY_NAME["browser_type"], {"element_id": 1, "text": "a"}) is None
    assert argument_error(TOOLS_BY_NAME["browser_tabs"], {"action": "close", "index": None}) is None
    assert argument_error(TOOLS_BY_NAME["browser_snapshot"], {}) is None


def test_a_page_is_its_url_and_tree_and_a_pages_failure_is_an_error_result() -> None:
    page = page_result(
        {"web_url": "http://a/", "main_content": None, "web_at": '[1] heading "A"', "error": None}
    )
    assert page == {
        "content": [{"type": "text", "text": 'URL: http://a/\n\n[1] heading "A"'}],
        "isError": False,
    }
    failed = page_result(
        {"web_url": "http://a/", "main_content": None, "web_at": "", "error": "no such id"}
    )
    assert failed["isError"] is True
    assert failed["content"][0]["text"] == "Error: no such id\nURL: http://a/"


class _Answers:
    """A server over a controller that never starts its browser: what it sends."""

    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []
        self.controller = WebBrowserController(Limits(browser="/nonexistent/chromium"))
        self.server = BrowserMcpServer(BrowserTools(self.controller), self._send)

    def _send(self, payload: bytes) -> None:
        assert payload.endswith(b"\n") and payload.count(b"\n") == 1
        self.sent.append(json.loads(payload))

    async def exchange(self, line: bytes | TooLong) -> list[dict[str, Any]]:
        before = len(self.sent)
        await self.server.receive(line)
        await self.server.finish()
        return self.sent[before:]


def _line(message: dict[str, Any]) -> bytes:
    return json.dumps({"jsonrpc": "2.0", **message}).encode()


async def test_requests_that_need_no_browser_are_answered_and_notifications_are_not() -> None:
    answers = _Answers()
    (initialized,) = await answers.exchange(
        _line({"id": 1, "method": "initialize", "params": {"protocolVersion": "2024-11-05"}})
    )
    assert initialized["result"]["protocolVersion"] == "2024-11-05"
    assert initialized["result"]["capabilities"] == {"tools": {"listChanged": False}}
    assert await answers.exchange(_line({"method": "notifications/initialized"})) == []
    assert await answers.exchange(_line({"method": "notifications/whatever"})) == []
    assert await answers.exchange(_line({"id": "p", "method": "ping"})) == [
        {"jsonrpc": "2.0", "id": "p", "result": {}}
    ]
    (listed,) = await answers.exchange(_line({"id": 2, "method": "tools/list"}))
    assert [tool["name"] for tool in listed["result"]["tools"]] == [tool.name for tool in TOOLS]
    assert all("inputSchema" in tool for tool in listed["result"]["tools"])
    # A response from the client answers nothing of ours: no reply to it either.
    assert await answers.exchange(_line({"id": 9, "result": {}})) == []


@pytest.mark.parametrize(
    ("line", "code"),
    [
        (b"not json", PARSE_ERROR),
        (b"[1, 2]", INVALID_REQUEST),
        (b'{"jsonrpc": "1.0", "id": 1, "method": "ping"}', INVALID_REQUEST),
        (_line({"id": 3, "method": "resources/list"}), METHOD_NOT_FOUND),
        (_line({"id": 3, "method": "tools/call", "params": {"arguments": {}}}), INVALID_PARAMS),
        (TooLong(), INVALID_REQUEST),
    ],
)
async def test_malformed_messages_are_json_rpc_errors(line: bytes | TooLong, code: int) -> None:
    (error,) = await _Answers().exchange(line)
    assert error["error"]["code"] == code


async def test_an_unknown_tool_and_bad_arguments_are_error_results_the_model_reads() -> None:
    answers = _Answers()
    call = {"id": 4, "method": "tools/call"}
    (unknown,) = await answers.exchange(_line({**call, "params": {"name": "browser_fly"}}))
    assert unknown["result"]["isError"] is True
    assert (
        'there is no tool "browser_fly"; the tools are browser_navigate'
        in (unknown["result"]["content"][0]["text"])
    )
    (bad,) = await answers.exchange(
        _line({**call, "params": {"name": "browser_scroll", "arguments": {"direction": 1}}})
    )
    assert bad["result"]["isError"] is True and "'direction' must be a string" in str(bad)
    # A browser that cannot start is said plainly too, and the server goes on.
    (missing,) = await answers.exchange(
        _line({**call, "params": {"name": "browser_snapshot", "arguments": {}}})
    )
    assert "no browser at /nonexistent/chromium" in missing["result"]["content"][0]["text"]
    assert missing["result"]["isError"] is True
    await answers.controller.shutdown()
