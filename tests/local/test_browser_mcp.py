"""`sandbox-tools-runtime browser-mcp`: the web browser as an MCP server on stdio, run
from source as a real process with a real Chromium headless shell, driven by the
official `mcp` SDK's stdio client (as inspect_ai's `mcp_server_sandbox()` and desktop
clients drive it) and by raw pipes for what no SDK sends: malformed lines, a line past
the frame bound, a cancelled call. Pages come from a small site on loopback.

One server serves the SDK tests of this module (each starts by opening its page); the
raw-pipe tests start their own, each without a browser until a tool needs one.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import re
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
import pytest_asyncio

mcp = pytest.importorskip("mcp", reason="the [mcp] extra is not installed")

from mcp import ClientSession, StdioServerParameters  # noqa: E402
from mcp.client.stdio import stdio_client  # noqa: E402
from mcp.types import CallToolResult, ImageContent, TextContent  # noqa: E402

from sandbox_tools.protocol import (  # noqa: E402
    INVALID_REQUEST,
    MAX_FRAME_BYTES,
    METHOD_NOT_FOUND,
    PARSE_ERROR,
)
from sandbox_tools.runtime.limits import DEFAULT_BROWSER  # noqa: E402
from tests.support import SRC, eventually, serve_site, site_handler  # noqa: E402

pytestmark = pytest.mark.skipif(
    not os.access(DEFAULT_BROWSER, os.X_OK),
    reason=f"no browser at {DEFAULT_BROWSER}: run scripts/setup.sh (chromium-headless-shell)",
)
# The SDK tests share one server, and with it one event loop; the raw-pipe tests are plain.
in_the_modules_loop = pytest.mark.asyncio(loop_scope="module")

COMMAND = [sys.executable, "-m", "sandbox_tools.runtime", "browser-mcp"]
LONG_LINES = 300
PAGES: dict[str, str] = {
    "/": """<!doctype html><title>Home</title><main><h1>Welcome</h1>
<a href="/next">Next page</a> <a href="/next" target="_blank">Open in a new tab</a>
<form action="/search"><label for="q">Search</label><input id="q" name="q">
<button>Go</button></form></main>""",
    "/next": "<!doctype html><title>Next</title><main><h1>Second page</h1></main>",
    "/keys": """<!doctype html><title>Keys</title><main><p id="k">no key yet</p>
<label for="f">Field</label><input id="f"><button>After</button></main><script>
document.addEventListener('keydown', e => {
  document.getElementById('k').textContent = 'last key ' + e.key + ' ' + e.code; });
</script>""",
    "/long": "<!doctype html><title>Long</title><main>"
    + "".join(f"<p>Line {i}</p>" for i in range(1, LONG_LINES + 1))
    + "</main>",
}


_SLOW_REQUESTED = threading.Event()
_Site = site_handler(PAGES, slow_seconds=3, slow_requested=_SLOW_REQUESTED)


@pytest.fixture(scope="module")
def site() -> Iterator[str]:
    with serve_site(_Site) as url:
        yield url


def _server_env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": SRC}


class _SdkClient:
    """The SDK's stdio client and session, owned by one task for the module's life: anyio
    wants its context managers entered and left in the same task, which a fixture's
    setup and teardown are not."""

    def __init__(self) -> None:
        self.session: ClientSession | None = None
        self._ready = asyncio.Event()
        self._done = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def _own(self) -> None:
        server = StdioServerParameters(command=COMMAND[0], args=COMMAND[1:], env=_server_env())
        async with (
            stdio_client(server) as (read, write),
            ClientSession(read, write) as session,
        ):
            self.initialized = await session.initialize()
            self.session = session
            self._ready.set()
            await self._done.wait()

    async def __aenter__(self) -> ClientSession:
        self._task = asyncio.create_task(self._own())
        waiting = asyncio.create_task(self._ready.wait())
        await asyncio.wait({self._task, waiting}, return_when=asyncio.FIRST_COMPLETED)
        if self._task.done():
            self._task.result()  # raises what went wrong
        assert self.session is not None
        return self.session

    async def __aexit__(self, *exc: object) -> None:
        self._done.set()
        assert self._task is not None
        await self._task


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def client() -> AsyncIterator[_SdkClient]:
    owner = _SdkClient()
    async with owner:
        yield owner


@pytest.fixture
def browser(client: _SdkClient) -> ClientSession:
    assert client.session is not None
    return client.session


def text_of(result: CallToolResult) -> str:
    return "\n".join(item.text for item in result.content if isinstance(item, TextContent))


async def call(session: ClientSession, tool: str, **arguments: Any) -> str:
    """A tool call that must succeed: its text."""
    result = await session.call_tool(tool, arguments)
    assert not result.isError, text_of(result)
    return text_of(result)


def element(tree: str, role: str, name: str) -> int:
    """The id of the line `[id] role "name"` in a page tree."""
    match = re.search(rf'^\s*\[(\d+)\] {re.escape(role)} "{re.escape(name)}"', tree, re.M)
    assert match, f'no {role} "{name}" in:\n{tree}'
    return int(match.group(1))


def url_of(text: str) -> str:
    match = re.search(r"^URL: (\S+)$", text, re.M)
    assert match, text
    return match.group(1)


# -- through the SDK ---------------------------------------------------------------------


@in_the_modules_loop
async def test_the_client_is_told_our_revision_and_the_tools_with_their_schemas(
    client: _SdkClient, browser: ClientSession
) -> None:
    # The SDK asks for its newest revision; we answer with the newest we speak.
    assert client.initialized.protocolVersion == "2025-06-18"
    assert client.initialized.serverInfo.name == "sandbox-tools-browser"
    tools = {tool.name: tool for tool in (await browser.list_tools()).tools}
    assert list(tools) == [
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
    assert tools["browser_navigate"].inputSchema["required"] == ["url"]
    assert tools["browser_type"].inputSchema["properties"]["submit"]["type"] == "boolean"
    assert tools["browser_tabs"].inputSchema["properties"]["action"]["enum"] == [
        "list",
        "select",
        "new",
        "close",
    ]
    assert all(tool.description for tool in tools.values())


@in_the_modules_loop
async def test_a_page_is_opened_and_read_again_as_its_url_and_tree(
    browser: ClientSession, site: str
) -> None:
    opened = await call(browser, "browser_navigate", url=f"{site}/?token=secret")
    assert url_of(opened) == f"{site}/"  # the query is cut, as web_go does
    element(opened, "heading", "Welcome")
    element(opened, "link", "Next page")
    again = await call(browser, "browser_snapshot")
    assert element(again, "textbox", "Search") == element(opened, "textbox", "Search")


@in_the_modules_loop
async def test_typing_and_submitting_a_form(browser: ClientSession, site: str) -> None:
    tree = await call(browser, "browser_navigate", url=site)
    field = element(tree, "textbox", "Search")
    typed = await call(browser, "browser_type", element_id=field, text="dogs")
    assert 'Current input: "dogs"' in typed and url_of(typed) == f"{site}/"
    submitted = await call(browser, "browser_type", element_id=field, text="cats", submit=True)
    assert url_of(submitted) == f"{site}/search"
    assert "You searched: q=cats" in submitted


@in_the_modules_loop
async def test_keys_reach_the_page_and_enter_submits(browser: ClientSession, site: str) -> None:
    tree = await call(browser, "browser_navigate", url=f"{site}/keys")
    for key, seen in [
        ("ArrowDown", "last key ArrowDown ArrowDown"),
        ("Escape", "last key Escape Escape"),
    ]:
        assert seen in await call(browser, "browser_press_key", key=key)
    field = element(tree, "textbox", "Field")
    await call(browser, "browser_click", element_id=field)
    await call(browser, "browser_press_key", key="x")
    typed = await call(browser, "browser_press_key", key="Shift+y")
    assert 'Current input: "xY"' in typed and "last key Y KeyY" in typed
    await call(browser, "browser_press_key", key="Control+a")  # a shortcut: selects, types nothing
    assert 'Current input: "z"' in await call(browser, "browser_press_key", key="z")
    tabbed = await call(browser, "browser_press_key", key="Tab")
    assert re.search(r"button \"After\"\s+\[focused: True", tabbed), tabbed
    # Enter in a form's field submits it.
    home = await call(browser, "browser_navigate", url=site)
    await call(browser, "browser_type", element_id=element(home, "textbox", "Search"), text="owls")
    entered = await call(browser, "browser_press_key", key="Enter")
    assert url_of(entered) == f"{site}/search" and "q=owls" in entered
    unknown = await browser.call_tool("browser_press_key", {"key": "Enterr"})
    assert unknown.isError and "unknown key 'Enterr'" in text_of(unknown)


@in_the_modules_loop
async def test_a_link_is_followed_and_history_goes_back_and_forward(
    browser: ClientSession, site: str
) -> None:
    tree = await call(browser, "browser_navigate", url=site)
    followed = await call(browser, "browser_click", element_id=element(tree, "link", "Next page"))
    assert url_of(followed) == f"{site}/next"
    element(followed, "heading", "Second page")
    back = await call(browser, "browser_back")
    assert url_of(back) == f"{site}/"
    element(back, "heading", "Welcome")
    forward = await call(browser, "browser_forward")
    assert url_of(forward) == f"{site}/next"


@in_the_modules_loop
async def test_scrolling_moves_what_the_tree_shows(browser: ClientSession, site: str) -> None:
    top = await call(browser, "browser_navigate", url=f"{site}/long")
    assert '"Line 1"' in top and f'"Line {LONG_LINES}"' not in top
    down = await call(browser, "browser_scroll", direction="down")
    shown = [int(n) for n in re.findall(r'"Line (\d+)"', down)]
    assert shown and min(shown) > 1
    assert '"Line 1"' in await call(browser, "browser_scroll", direction="up")


@in_the_modules_loop
async def test_a_screenshot_is_an_mcp_image_of_the_viewport(
    browser: ClientSession, site: str
) -> None:
    await call(browser, "browser_navigate", url=site)
    result = await browser.call_tool("browser_screenshot", {})
    assert not result.isError
    (image,) = [item for item in result.content if isinstance(item, ImageContent)]
    assert image.mimeType == "image/png"
    png = base64.b64decode(image.data, validate=True)
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and png[12:16] == b"IHDR"
    assert (int.from_bytes(png[16:20], "big"), int.from_bytes(png[20:24], "big")) == (1280, 1080)
    assert len(png) > 1000


@in_the_modules_loop
async def test_a_new_window_is_a_tab_to_list_select_and_close(
    browser: ClientSession, site: str
) -> None:
    tree = await call(browser, "browser_navigate", url=site)
    opened = await call(
        browser, "browser_click", element_id=element(tree, "link", "Open in a new tab")
    )
    assert url_of(opened) == f"{site}/next"  # the new tab is shown
    listed = await call(browser, "browser_tabs", action="list")
    assert listed.splitlines() == [
        "Tabs:",
        f'[0] "Home" {site}/',
        f'[1] "Next" {site}/next (current)',
    ]
    selected = await call(browser, "browser_tabs", action="select", index=0)
    assert f'[0] "Home" {site}/ (current)' in selected
    assert url_of(selected) == f"{site}/"
    element(selected, "heading", "Welcome")
    closed = await call(browser, "browser_tabs", action="close", index=1)
    assert closed.startswith(f'Tabs:\n[0] "Home" {site}/ (current)\n\n')
    only = await browser.call_tool("browser_tabs", {"action": "close"})
    assert only.isError and "only tab" in text_of(only)
    blank = await call(browser, "browser_tabs", action="new")
    assert '[1] "about:blank" about:blank (current)' in blank
    await call(browser, "browser_tabs", action="close")  # the current one: back to Home
    missing = await browser.call_tool("browser_tabs", {"action": "select", "index": 5})
    assert missing.isError and "there is no tab 5: the session has 1 tab" in text_of(missing)
    assert url_of(await call(browser, "browser_snapshot")) == f"{site}/"


@in_the_modules_loop
async def test_failures_are_error_results_and_the_server_goes_on(
    browser: ClientSession, site: str
) -> None:
    await call(browser, "browser_navigate", url=site)
    gone = await browser.call_tool("browser_click", {"element_id": 999999})
    assert gone.isError and "Could not find element with id 999999" in text_of(gone)
    unknown = await browser.call_tool("browser_fly", {})
    assert unknown.isError and "there is no tool" in text_of(unknown)
    bad = await browser.call_tool("browser_scroll", {"direction": "sideways"})
    assert bad.isError and "must be 'up' or 'down'" in text_of(bad)
    assert url_of(await call(browser, "browser_snapshot")) == f"{site}/"


@in_the_modules_loop
async def test_a_slow_page_does_not_hold_up_a_ping(browser: ClientSession, site: str) -> None:
    _SLOW_REQUESTED.clear()
    slow = asyncio.create_task(call(browser, "browser_navigate", url=f"{site}/slow"))
    # The navigation is under way once the site has the request (the page takes 3 s).
    assert await asyncio.to_thread(_SLOW_REQUESTED.wait, 30)
    started = time.monotonic()
    await browser.send_ping()
    assert time.monotonic() - started < 1.0
    assert not slow.done()
    assert url_of(await slow) == f"{site}/slow"


# -- raw pipes ---------------------------------------------------------------------------


class RawServer:
    """The server as a child with pipes: lines written, answers read with a deadline."""

    def __init__(self) -> None:
        self.process = subprocess.Popen(
            COMMAND,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=_server_env(),
        )
        self._buffer = b""

    def send(self, line: bytes) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(line + b"\n")
        self.process.stdin.flush()

    def request(self, id: int, method: str, **params: Any) -> None:
        message = {"jsonrpc": "2.0", "id": id, "method": method, "params": params}
        self.send(json.dumps(message).encode())

    def answer(self, timeout: float = 30.0) -> dict[str, Any]:
        assert self.process.stdout is not None
        fd = self.process.stdout.fileno()
        deadline = time.monotonic() + timeout
        while b"\n" not in self._buffer:
            remaining = deadline - time.monotonic()
            assert remaining > 0, f"no answer within {timeout:g} s"
            if select.select([fd], [], [], remaining)[0]:
                chunk = os.read(fd, 65536)
                assert chunk, "the server closed stdout: " + self.stderr()
                self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        answer: dict[str, Any] = json.loads(line)
        return answer

    def stderr(self) -> str:
        if self.process.poll() is None:
            return ""
        assert self.process.stderr is not None
        return self.process.stderr.read().decode(errors="replace")

    def browser_group(self) -> int:
        """The browser's process group: the child of the server that leads its own."""
        children = [
            pid
            for pid in _live_pids()
            if _stat(pid)[1] == self.process.pid and _stat(pid)[2] == pid
        ]
        assert len(children) == 1, children
        return children[0]

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()
        for stream in (self.process.stdin, self.process.stdout, self.process.stderr):
            if stream is not None:
                stream.close()


def _stat(pid: int) -> tuple[str, int, int]:
    """(state, parent pid, process group) from /proc; a gone process is a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            fields = handle.read().rsplit(")", 1)[1].split()
    except OSError:
        return "Z", 0, 0
    return fields[0], int(fields[1]), int(fields[2])


def _live_pids() -> list[int]:
    return [int(p) for p in os.listdir("/proc") if p.isdigit() and _stat(int(p))[0] != "Z"]


def group_members(pgid: int) -> list[int]:
    return [pid for pid in _live_pids() if _stat(pid)[2] == pgid]


@pytest.fixture
def raw() -> Iterator[RawServer]:
    server = RawServer()
    yield server
    server.close()


def test_malformed_lines_are_json_rpc_errors_and_the_server_keeps_serving(
    raw: RawServer,
) -> None:
    raw.send(b"this is not json")
    assert raw.answer()["error"]["code"] == PARSE_ERROR
    raw.send(b'"a string"')
    assert raw.answer()["error"]["code"] == INVALID_REQUEST
    raw.request(1, "resources/list")
    assert raw.answer() == {
        "jsonrpc": "2.0",
        "id": 1,
        "error": {
            "code": METHOD_NOT_FOUND,
            "message": "Method not found: resources/list",
            "data": "resources/list",
        },
    }
    raw.send(b'{"jsonrpc": "2.0", "method": "notifications/initialized"}')  # no answer
    raw.request(2, "tools/call", name="browser_click", arguments={"element_id": "three"})
    bad = raw.answer()
    assert bad["id"] == 2 and bad["result"]["isError"] is True
    assert "'element_id' must be an integer" in bad["result"]["content"][0]["text"]
    raw.request(3, "ping")
    assert raw.answer() == {"jsonrpc": "2.0", "id": 3, "result": {}}


def test_a_line_past_the_frame_bound_is_refused_and_the_next_one_answered(
    raw: RawServer,
) -> None:
    assert raw.process.stdin is not None
    # Written in pieces while the server reads: it refuses the line before its end.
    raw.process.stdin.write(b'{"jsonrpc": "2.0", "id": 1, "method": "ping", "params": {"x": "')
    piece = b"x" * (1024 * 1024)
    for _ in range(MAX_FRAME_BYTES // len(piece) + 1):
        raw.process.stdin.write(piece)
    raw.send(b'"}}')
    refused = raw.answer()
    assert refused["error"]["code"] == INVALID_REQUEST
    assert f"larger than {MAX_FRAME_BYTES} bytes" in refused["error"]["message"]
    raw.request(2, "ping")
    assert raw.answer() == {"jsonrpc": "2.0", "id": 2, "result": {}}


def test_a_cancelled_call_is_not_answered_and_the_next_is(raw: RawServer, site: str) -> None:
    _SLOW_REQUESTED.clear()
    raw.request(1, "tools/call", name="browser_navigate", arguments={"url": f"{site}/slow"})
    # The cancellation must meet a call under way: one sent before the server took the
    # request would be ignored (the MCP spec's rule) and the call answered.
    assert _SLOW_REQUESTED.wait(30), "the browser never asked for the slow page"
    raw.send(b'{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":1}}')
    raw.request(2, "tools/call", name="browser_navigate", arguments={"url": site})
    answer = raw.answer()
    assert answer["id"] == 2 and not answer["result"]["isError"]
    raw.request(3, "ping")
    assert raw.answer()["id"] == 3  # nothing for id 1 came before it


@pytest.mark.parametrize("ending", ["stdin's end", "SIGTERM"])
def test_the_browser_dies_with_the_server(raw: RawServer, site: str, ending: str) -> None:
    raw.request(1, "tools/call", name="browser_navigate", arguments={"url": site})
    assert raw.answer()["result"]["isError"] is False
    group = raw.browser_group()
    assert group_members(group)
    assert raw.process.stdin is not None
    if ending == "SIGTERM":
        raw.process.send_signal(signal.SIGTERM)
    else:
        raw.process.stdin.close()
    assert raw.process.wait(timeout=15) == 0
    eventually(lambda: not group_members(group), "no process of the browser's group left")
