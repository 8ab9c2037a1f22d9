"""`tools mcp`: the gateway as an MCP server on stdio, built on the `mcp` SDK's low-level
server (its tools are a table of our own: schemas made from dataclasses, arguments parsed
by them, failures as results; the SDK's high-level server would derive schemas from
Python signatures instead).

The server lives as long as its client: when stdin closes (the client went away) or a
signal ends it, every container it made is removed, except those made with keep, and
what it started in attached containers is ended. A loop that dies without that cleanup
still removes the containers it made, from outside the loop, before the process exits.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import itertools
import json
import logging
import os
import re
import resource
import signal
import socket
import stat
import sys
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, cast

from docker import DockerClient
from mcp import types
from mcp.server.lowlevel import Server
from mcp.server.stdio import stdio_server

from sandbox_tools import __version__
from sandbox_tools.injector.options import InjectionOptions
from sandbox_tools.mcp_gateway.registry import Sandboxes
from sandbox_tools.mcp_gateway.tools import TOOLS, Answer, Progress, call_tool
from sandbox_tools.sandboxes.containers import ContainerPolicy

log = logging.getLogger(__name__)

SERVER_NAME = "sandbox-tools"
INSTRUCTIONS = (
    "Containers as sandboxes for your work: sandbox_create starts one from a local image "
    "(or sandbox_attach uses a running container the user listed), and its id goes to "
    "every other tool: bash for a persistent shell, text_editor for files, exec_start / "
    "exec_poll / exec_kill for long-running commands, browser_* for a headless browser "
    "inside the sandbox (it reaches what the sandbox reaches). Containers made here are "
    "removed when this session ends unless made with keep."
)
# Signals that end the server the way a closed stdin does, cleanup included.
ENDING_SIGNALS = (signal.SIGTERM, signal.SIGHUP)
# The longest line read from the client: a message past it ends the connection.
MAX_MESSAGE_BYTES = 64 * 1024 * 1024
# The streamable HTTP transport's one endpoint, and what one client of it may hold: its
# connections (past them, a new one is closed at once) and the time a connection may
# take to send a request's head.
HTTP_PATH = "/mcp"
MAX_HTTP_CONNECTIONS = 256
HEAD_TIMEOUT = 10.0


def gateway_server(sandboxes: Sandboxes) -> Server[Any, Any]:
    """The MCP server over `sandboxes`: tools/list and tools/call (ping is the SDK's)."""
    server: Server[Any, Any] = Server(SERVER_NAME, __version__, instructions=INSTRUCTIONS)
    listed = types.ListToolsResult(tools=[types.Tool(**tool.listing()) for tool in TOOLS])

    async def list_tools(request: types.ListToolsRequest) -> types.ServerResult:
        return types.ServerResult(listed)

    async def call(request: types.CallToolRequest) -> types.ServerResult:
        answer = await call_tool(
            sandboxes, request.params.name, request.params.arguments, _progress(server)
        )
        return types.ServerResult(as_result(answer))

    server.request_handlers[types.ListToolsRequest] = list_tools
    server.request_handlers[types.CallToolRequest] = call
    return server


def _progress(server: Server[Any, Any]) -> Progress | None:
    """Progress notifications for the request being served, if its client asked for them
    (a progress token in the request's _meta); None otherwise."""
    context = server.request_context
    token = context.meta.progressToken if context.meta is not None else None
    if token is None:
        return None
    count = itertools.count(1)

    async def notify(message: str) -> None:
        await context.session.send_progress_notification(
            token, next(count), message=message, related_request_id=str(context.request_id)
        )

    return notify


def as_result(answer: Answer) -> types.CallToolResult:
    images = [
        types.ImageContent(type="image", data=png, mimeType="image/png") for png in answer.images
    ]
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=answer.text), *images],
        structuredContent=answer.structured,
        isError=answer.is_error,
    )


async def serve_stdio(sandboxes: Sandboxes) -> None:
    """Serve on stdin/stdout until the client closes stdin or a signal ends the server;
    then close every sandbox (made ones removed unless kept)."""
    server = gateway_server(sandboxes)
    loop = asyncio.get_running_loop()
    main = asyncio.current_task()
    assert main is not None
    for signum in ENDING_SIGNALS:
        loop.add_signal_handler(signum, main.cancel)
    stdin = await _stdin_on_the_loop()
    try:
        async with stdio_server(stdin=cast(Any, stdin)) as (read, write):
            await server.run(read, write, server.create_initialization_options())
        log.info("the client closed the connection")
    except asyncio.CancelledError:
        log.info("ended by a signal")
    finally:
        await _close_all(sandboxes, ENDING_SIGNALS)


class _Lines:
    """stdin's lines, read on the event loop. The SDK reads stdin in a worker thread,
    which no cancellation reaches: a signal then waited for the client's next line, or
    its end, before the server could close its sandboxes."""

    def __init__(self, reader: asyncio.StreamReader) -> None:
        self._reader = reader

    def __aiter__(self) -> AsyncIterator[str]:
        return self

    async def __anext__(self) -> str:
        try:
            line = await self._reader.readline()
        except ValueError:  # asyncio's way of saying the line overran the limit
            log.error("the client sent a line of more than %d bytes: ending", MAX_MESSAGE_BYTES)
            raise StopAsyncIteration from None
        if not line:
            raise StopAsyncIteration
        return without_lone_surrogates(line.decode("utf-8", errors="replace"))


_SURROGATE = re.compile("[\ud800-\udfff]")


def without_lone_surrogates(line: str) -> str:
    """A message whose strings hold a lone surrogate (JSON can escape one; no text can
    hold it) with each replaced by U+FFFD. The SDK answered such a request with an error
    that carries no id, so its client waited for an answer until its own timeout."""
    if "\\ud" not in line.lower():
        return line
    try:
        message = json.loads(line)
    except (ValueError, RecursionError):
        return line  # not JSON: the SDK says so
    try:
        return json.dumps(_replaced(message))
    except RecursionError:
        return line


def _replaced(value: Any) -> Any:
    if isinstance(value, str):
        return _SURROGATE.sub("\ufffd", value)
    if isinstance(value, list):
        return [_replaced(item) for item in value]
    if isinstance(value, dict):
        return {_replaced(key): _replaced(item) for key, item in value.items()}
    return value


async def _stdin_on_the_loop() -> _Lines | None:
    """stdin as `_Lines` where it is a pipe or a socket (as MCP clients start servers);
    None (the SDK's own reader) for a terminal, whose mode non-blocking reads would
    change for the shell too, or a file."""
    mode = os.fstat(sys.stdin.fileno()).st_mode
    if not (stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode)):
        return None
    reader = asyncio.StreamReader(limit=MAX_MESSAGE_BYTES)
    pipe = os.fdopen(os.dup(sys.stdin.fileno()), "rb", buffering=0)
    loop = asyncio.get_running_loop()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), pipe)
    return _Lines(reader)


@dataclass(frozen=True)
class HttpListener:
    """Where `tools mcp --http` listens (loopback only) and the secret a client must
    send as `Authorization: Bearer <token>`."""

    port: int
    token: str


async def serve_http(sandboxes: Sandboxes, listener: HttpListener) -> None:
    """Serve MCP's streamable HTTP on 127.0.0.1 until SIGINT or SIGTERM; then close every
    sandbox. Every client with the token shares the server's sandboxes: they live until
    the server ends (or sandbox_close), not per HTTP session. A request without the
    token, or with another Host or Origin than this loopback address (DNS rebinding: a web
    page the user opens must not reach the server), is refused before the SDK sees it."""
    import uvicorn
    from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
    from mcp.server.transport_security import TransportSecuritySettings

    hosts = [f"127.0.0.1:{listener.port}", f"localhost:{listener.port}"]
    security = TransportSecuritySettings(
        enable_dns_rebinding_protection=True,
        allowed_hosts=hosts,
        allowed_origins=[f"http://{host}" for host in hosts],
    )
    manager = StreamableHTTPSessionManager(
        app=gateway_server(sandboxes), security_settings=security
    )
    expected = f"Bearer {listener.token}".encode()

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        headers = dict(scope.get("headers") or [])
        given = headers.get(b"authorization", b"")
        if scope.get("path") not in (HTTP_PATH, HTTP_PATH + "/"):
            await _plain(send, 404, f"not found: the MCP endpoint is {HTTP_PATH}")
        elif not hmac.compare_digest(given, expected):
            await _plain(send, 401, "send Authorization: Bearer <the token file's content>")
        else:
            await manager.handle_request(scope, receive, send)

    class Web(uvicorn.Server):
        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            # uvicorn's own handlers raise the signal again once it stopped, which would
            # end the process before the sandboxes are closed: the gateway's end it.
            yield

        async def startup(self, sockets: list[socket.socket] | None = None) -> None:
            await super().startup(sockets)
            if self.started:  # the port is bound: a client reading this line can connect
                log.info("serving MCP on http://127.0.0.1:%d%s", listener.port, HTTP_PATH)

    config = uvicorn.Config(
        app,
        host="127.0.0.1",
        port=listener.port,
        log_level="warning",
        lifespan="off",
        http=_guarded_protocol(),
        limit_concurrency=MAX_HTTP_CONNECTIONS,
    )
    _more_descriptors()
    web = Web(config)
    loop = asyncio.get_running_loop()
    for signum in (*ENDING_SIGNALS, signal.SIGINT):
        loop.add_signal_handler(signum, setattr, web, "should_exit", True)
    try:
        async with manager.run():
            await web.serve()
        log.info("ended by a signal")
    finally:
        await _close_all(sandboxes, (*ENDING_SIGNALS, signal.SIGINT))


async def _close_all(sandboxes: Sandboxes, signals: tuple[int, ...]) -> None:
    """Close every sandbox as the server ends. Ending already: a signal now (the SDK's
    stdio client sends SIGTERM 2 s after closing stdin) is logged and cuts nothing short."""
    loop = asyncio.get_running_loop()
    for signum in signals:
        loop.add_signal_handler(signum, log.info, "ending already: cleaning up")
    try:
        count, started = len(sandboxes.held()), loop.time()
        await sandboxes.aclose()
        log.info("closed %d sandbox(es) in %.1f s", count, loop.time() - started)
    finally:
        for signum in signals:
            loop.remove_signal_handler(signum)


def _guarded_protocol() -> type[asyncio.Protocol]:
    """uvicorn's HTTP/1.1 protocol with two bounds it lacks: a connection that has not
    sent a whole request head within HEAD_TIMEOUT is closed, and one past
    MAX_HTTP_CONNECTIONS is closed at once. Any local user can open connections to a
    loopback port; without these, a few thousand idle ones used up the server's file
    descriptors (and every accept that failed logged a traceback)."""
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class Guarded(H11Protocol):
        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            if len(self.connections) > MAX_HTTP_CONNECTIONS:
                transport.close()
                return
            self._head_timer = self.loop.call_later(HEAD_TIMEOUT, self._head_overdue)

        def _head_overdue(self) -> None:
            if self.cycle is None and not self.transport.is_closing():
                self.transport.close()

        def connection_lost(self, exc: Exception | None) -> None:
            timer = getattr(self, "_head_timer", None)
            if timer is not None:
                timer.cancel()
            super().connection_lost(exc)

    return Guarded


def _more_descriptors() -> None:
    """Raise the soft limit of open files to the hard one: the connection bound, not
    the process's default of 1,024, is what limits the HTTP transport."""
    with contextlib.suppress(ValueError, OSError):
        _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


async def _plain(send: Any, status: int, text: str) -> None:
    body = text.encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", b"text/plain"), (b"content-length", b"%d" % len(body))],
        }
    )
    await send({"type": "http.response.body", "body": body})


def run_gateway(
    engine: Callable[[], DockerClient],
    injection: InjectionOptions,
    policy: ContainerPolicy,
    *,
    attachable: Iterable[str] = (),
    mounts_trusted: Iterable[str] = (),
    http: HttpListener | None = None,
    log_level: int = logging.INFO,
) -> None:
    """The `tools mcp` command's body: log to stderr (stdout carries the protocol alone),
    serve, and make sure no container this server made outlives it unkept."""
    _log_to_stderr(log_level)
    ends_with = "this client's disconnection" if http is None else "the server's end"
    sandboxes = Sandboxes(
        engine,
        injection,
        policy,
        attachable=attachable,
        mounts_trusted=mounts_trusted,
        ends_with=ends_with,
    )
    try:
        asyncio.run(serve_stdio(sandboxes) if http is None else serve_http(sandboxes, http))
    except KeyboardInterrupt:
        log.info("interrupted")
    finally:
        removed = sandboxes.remove_left_behind()
        if removed:
            log.warning("removed %d container(s) the server made, after its loop ended", removed)


def _log_to_stderr(level: int) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger("sandbox_tools")
    root.addHandler(handler)
    root.setLevel(level)
    root.propagate = False  # the SDK configures the root logger too: each line once
    logging.getLogger("mcp.server.streamable_http").addFilter(_client_went_away)


def _client_went_away(record: logging.LogRecord) -> bool:
    """Drop the SDK's error for a client that closed its event stream (it disconnected,
    as clients do), which it logs with a traceback; keep every other record."""
    closed = record.exc_info is not None and type(record.exc_info[1]).__name__ == (
        "ClosedResourceError"
    )
    return not (closed and record.getMessage().startswith("Error in standalone SSE writer"))
