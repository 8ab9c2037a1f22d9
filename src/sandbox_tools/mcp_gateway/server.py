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
import logging
import os
import signal
import stat
import sys
from collections.abc import AsyncIterator, Callable, Iterable
from typing import Any, cast

from docker import DockerClient
from mcp import types
from mcp.server.lowlevel import Server
from mcp.server.stdio import stdio_server

from sandbox_tools import __version__
from sandbox_tools.injector.options import InjectionOptions
from sandbox_tools.mcp_gateway.registry import Sandboxes
from sandbox_tools.mcp_gateway.tools import TOOLS, Answer, call_tool
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


def gateway_server(sandboxes: Sandboxes) -> Server[Any, Any]:
    """The MCP server over `sandboxes`: tools/list and tools/call (ping is the SDK's)."""
    server: Server[Any, Any] = Server(SERVER_NAME, __version__, instructions=INSTRUCTIONS)
    listed = types.ListToolsResult(tools=[types.Tool(**tool.listing()) for tool in TOOLS])

    async def list_tools(request: types.ListToolsRequest) -> types.ServerResult:
        return types.ServerResult(listed)

    async def call(request: types.CallToolRequest) -> types.ServerResult:
        answer = await call_tool(sandboxes, request.params.name, request.params.arguments)
        return types.ServerResult(as_result(answer))

    server.request_handlers[types.ListToolsRequest] = list_tools
    server.request_handlers[types.CallToolRequest] = call
    return server


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
        # Ending already: a client that signals the server after closing stdin (the SDK's
        # stdio client does, 2 s later) must not cut the cleanup short.
        for signum in ENDING_SIGNALS:
            loop.add_signal_handler(signum, log.info, "ending already: cleaning up")
        try:
            count, started = len(sandboxes.held()), loop.time()
            await sandboxes.aclose()
            log.info("closed %d sandbox(es) in %.1f s", count, loop.time() - started)
        finally:
            for signum in ENDING_SIGNALS:
                loop.remove_signal_handler(signum)


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
        return line.decode("utf-8", errors="replace")


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


def run_gateway(
    engine: Callable[[], DockerClient],
    injection: InjectionOptions,
    policy: ContainerPolicy,
    *,
    attachable: Iterable[str] = (),
    log_level: int = logging.INFO,
) -> None:
    """The `tools mcp` command's body: log to stderr (stdout carries the protocol alone),
    serve, and make sure no container this server made outlives it unkept."""
    _log_to_stderr(log_level)
    sandboxes = Sandboxes(engine, injection, policy, attachable=attachable)
    try:
        asyncio.run(serve_stdio(sandboxes))
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
