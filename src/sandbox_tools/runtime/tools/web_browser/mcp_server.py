"""`browser-mcp`: the web browser as an MCP server on stdio, for any MCP client
(inspect_ai's `mcp_server_sandbox()`, Claude Desktop, the `mcp` SDK) inside a container
that has no Node for the usual browser servers.

The MCP stdio transport: one JSON-RPC 2.0 message per line on stdin and stdout, logs on
stderr. Why it is built this way:
- stdout carries nothing but our answers: the protocol writes go to a copy of fd 1 and
  fd 1 itself is pointed at stderr, so a stray print (ours or a child's) cannot corrupt
  the stream the client parses;
- stdin is read by a thread with `os.read`, so it may be a pipe, a file or a terminal,
  and a line longer than `MAX_FRAME_BYTES` is refused as it arrives, never held whole;
- `initialize`, `ping` and `tools/list` are answered as they are read; each `tools/call`
  is a task of its own (at most MAX_CALLS_IN_FLIGHT, then reading waits), so a page that
  takes 30 s to load never delays a ping;
- one controller and one browser session for the process, the browser running as
  whoever started the server; stdin's end or SIGTERM kills it (`controller.shutdown()`).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import signal
import sys
import threading
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sandbox_tools._version import __version__
from sandbox_tools.protocol import (
    INVALID_PARAMS,
    INVALID_REQUEST,
    MAX_FRAME_BYTES,
    METHOD_NOT_FOUND,
)
from sandbox_tools.runtime.jsonrpc import (
    RpcError,
    encode,
    error_response,
    loads_document,
    result_response,
    validate_request,
)
from sandbox_tools.runtime.limits import Limits, LimitsError
from sandbox_tools.runtime.tools.web_browser.controller import WebBrowserController
from sandbox_tools.runtime.tools.web_browser.mcp_tools import TOOLS, BrowserTools

# MCP revisions we speak, newest first: a client asking for another gets the newest.
PROTOCOL_VERSIONS = ("2025-06-18", "2025-03-26", "2024-11-05")
SERVER_NAME = "sandbox-tools-browser"
# Tool calls at once; they queue on the one session anyway, so more only cost memory.
MAX_CALLS_IN_FLIGHT = 32
READ_CHUNK_BYTES = 64 * 1024
INSTRUCTIONS = (
    "A headless Chromium browser. Open a page with browser_navigate; every page comes back "
    "as an accessibility tree whose [id]s browser_click and browser_type take. The tree "
    "shows what is on screen: browser_scroll to see more."
)
USAGE = """\
usage: sandbox-tools-runtime browser-mcp

Serve a headless Chromium as an MCP server on stdin/stdout (newline-delimited JSON-RPC);
logs go to stderr. The browser is SANDBOX_TOOLS_BROWSER (or the default path) and runs as
the user that started this command; it is killed when stdin ends or on SIGTERM.
"""


class TooLong:
    """A line past MAX_FRAME_BYTES: dropped as it arrived, answered with an error."""


@dataclass
class LineSplitter:
    """stdin's bytes cut into lines of at most `max_bytes` (the newline not counted); a
    longer line is reported once, as TooLong, and skipped to its end."""

    max_bytes: int
    _buffer: bytearray | None = None
    _skipping: bool = False

    def feed(self, data: bytes) -> list[bytes | TooLong]:
        if self._buffer is None:
            self._buffer = bytearray()
        lines: list[bytes | TooLong] = []
        start = 0
        while True:
            end = data.find(b"\n", start)
            if end < 0:
                break
            if self._skipping:
                self._skipping = False
            elif len(self._buffer) + end - start > self.max_bytes:
                lines.append(TooLong())
            else:
                lines.append(bytes(self._buffer) + data[start:end])
            self._buffer.clear()
            start = end + 1
        if not self._skipping:
            self._buffer += data[start:]
            if len(self._buffer) > self.max_bytes:
                lines.append(TooLong())
                self._buffer.clear()
                self._skipping = True
        return lines

    def end(self) -> list[bytes | TooLong]:
        """stdin ended: a last line without its newline still counts."""
        rest = bytes(self._buffer or b"")
        self._buffer = None
        return [rest] if rest and not self._skipping else []


def negotiate_version(requested: Any) -> str:
    """The client's revision when we speak it, else our newest (the client then decides
    whether it can go on, as the MCP lifecycle says)."""
    return requested if requested in PROTOCOL_VERSIONS else PROTOCOL_VERSIONS[0]


class BrowserMcpServer:
    """Answers MCP messages, one at a time as read; tool calls run as tasks."""

    def __init__(self, tools: BrowserTools, send: Callable[[bytes], None]) -> None:
        self.tools = tools
        self._send = send
        self._calls: dict[Any, asyncio.Task[None]] = {}
        self._slots = asyncio.Semaphore(MAX_CALLS_IN_FLIGHT)

    async def receive(self, line: bytes | TooLong) -> None:
        """One line of stdin: answered now, or its tool call started."""
        if isinstance(line, TooLong):
            _log(f"a message longer than {MAX_FRAME_BYTES} bytes was dropped")
            too_long = f"Invalid Request: larger than {MAX_FRAME_BYTES} bytes"
            self._reply(error_response(None, RpcError(INVALID_REQUEST, too_long)))
            return
        if not line.strip():
            return
        try:
            document = loads_document(line)
        except RpcError as exc:
            _log(exc.message)
            self._reply(error_response(None, exc))
            return
        if (
            isinstance(document, dict)
            and "method" not in document
            and ("result" in document or "error" in document)
        ):
            return  # a response: we send no requests, so it answers nothing of ours
        try:
            request = validate_request(document)
        except RpcError as exc:
            self._reply(error_response(_id_of(document), exc))
            return
        if request.is_notification:
            self._notified(request.method, request.params)
            return
        if request.method == "tools/call":
            await self._slots.acquire()
            task = asyncio.create_task(self._call_tool(request.id, request.params))
            self._calls[request.id] = task
            task.add_done_callback(lambda done: self._finished(request.id, done))
            return
        try:
            self._reply(result_response(request.id, self.answer(request.method, request.params)))
        except RpcError as exc:
            self._reply(error_response(request.id, exc))

    def answer(self, method: str, params: dict[str, Any]) -> Any:
        """The result of a request that needs no browser, or RpcError."""
        if method == "initialize":
            return {
                "protocolVersion": negotiate_version(params.get("protocolVersion")),
                "capabilities": {"tools": {"listChanged": False}},
                "serverInfo": {"name": SERVER_NAME, "version": __version__},
                "instructions": INSTRUCTIONS,
            }
        if method == "ping":
            return {}
        if method == "tools/list":
            return {"tools": [tool.listing() for tool in TOOLS]}
        raise RpcError(METHOD_NOT_FOUND, f"Method not found: {method}", data=method)

    async def finish(self) -> None:
        """Until every tool call already read has been answered (stdin ended)."""
        while self._calls:
            await asyncio.wait(set(self._calls.values()))

    def cancel_all(self) -> None:
        for task in self._calls.values():
            task.cancel()

    async def _call_tool(self, request_id: Any, params: dict[str, Any]) -> None:
        name = params.get("name")
        if not isinstance(name, str):
            error = RpcError(INVALID_PARAMS, 'Invalid params: "name" must be the tool\'s name')
            self._reply(error_response(request_id, error))
            return
        result = await self.tools.call(name, params.get("arguments"))
        self._reply(result_response(request_id, result))

    def _finished(self, request_id: Any, task: asyncio.Task[None]) -> None:
        self._slots.release()
        if self._calls.get(request_id) is task:
            del self._calls[request_id]

    def _notified(self, method: str, params: dict[str, Any]) -> None:
        """Notifications get no answer; a cancelled call is stopped and not answered
        either (MCP's cancellation says so). `notifications/initialized` needs nothing."""
        if method == "notifications/cancelled":
            task = self._calls.get(params.get("requestId"))
            if task is not None:
                task.cancel()

    def _reply(self, response: dict[str, Any]) -> None:
        self._send(encode(response))


def _id_of(document: Any) -> Any:
    candidate = document.get("id") if isinstance(document, dict) else None
    ok = isinstance(candidate, (str, int)) and not isinstance(candidate, bool)
    return candidate if ok else None


def _log(message: str) -> None:
    print(f"sandbox-tools browser-mcp: {message}", file=sys.stderr, flush=True)


class _Output:
    """The protocol's own copy of stdout; fd 1 then points at stderr (see above)."""

    def __init__(self) -> None:
        self.fd = os.dup(1)
        os.dup2(2, 1)
        self.closed = asyncio.Event()

    def send(self, payload: bytes) -> None:
        view = memoryview(payload)
        try:
            while view:
                view = view[os.write(self.fd, view) :]
        except OSError:  # the client stopped reading (EPIPE): nobody is left to serve
            self.closed.set()


def _read_stdin(
    loop: asyncio.AbstractEventLoop, server: BrowserMcpServer, ended: asyncio.Event
) -> None:
    """In a daemon thread (a read cannot be interrupted, and the process must be able
    to exit on SIGTERM while one waits): hand each line to the server in order, waiting
    while it is busy (MAX_CALLS_IN_FLIGHT), until stdin ends."""
    splitter = LineSplitter(MAX_FRAME_BYTES)
    try:
        while True:
            try:
                chunk = os.read(0, READ_CHUNK_BYTES)
            except InterruptedError:
                continue
            except OSError:
                chunk = b""
            lines = splitter.feed(chunk) if chunk else splitter.end()
            for line in lines:
                try:
                    asyncio.run_coroutine_threadsafe(server.receive(line), loop).result()
                except (RuntimeError, concurrent.futures.CancelledError):
                    raise
                except Exception:  # a bug of ours: logged, and the next line still read
                    traceback.print_exc(file=sys.stderr)
            if not chunk:
                break
        loop.call_soon_threadsafe(ended.set)
    except (RuntimeError, concurrent.futures.CancelledError):
        return  # the loop is closed or closing: the server is already going away


async def serve(limits: Limits) -> int:
    loop = asyncio.get_running_loop()
    output = _Output()
    controller = WebBrowserController(limits)
    server = BrowserMcpServer(BrowserTools(controller), output.send)
    stop = asyncio.Event()
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        loop.add_signal_handler(signum, stop.set)
    ended = asyncio.Event()
    threading.Thread(
        target=_read_stdin, args=(loop, server, ended), name="stdin", daemon=True
    ).start()
    reader = asyncio.ensure_future(ended.wait())
    stopped = asyncio.ensure_future(stop.wait())
    lost = asyncio.ensure_future(output.closed.wait())
    try:
        await asyncio.wait({reader, stopped, lost}, return_when=asyncio.FIRST_COMPLETED)
        if reader.done():
            # stdin ended: what was asked before is still answered, unless a signal says
            # to stop now.
            finishing = asyncio.ensure_future(server.finish())
            await asyncio.wait({finishing, stopped, lost}, return_when=asyncio.FIRST_COMPLETED)
            finishing.cancel()
    finally:
        server.cancel_all()
        for waiting in (reader, stopped, lost):
            waiting.cancel()
        await controller.shutdown()
    return 0


def run(argv: list[str]) -> int:
    if argv[:1] in (["-h"], ["--help"]):
        print(USAGE, end="")
        return 0
    if argv:
        print(f"unexpected arguments {argv!r}\n\n{USAGE}", file=sys.stderr, end="")
        return 2
    try:
        limits = Limits.from_environ(os.environ)
    except LimitsError as exc:
        _log(f"cannot start: {exc}")
        return 1
    return asyncio.run(serve(limits))
