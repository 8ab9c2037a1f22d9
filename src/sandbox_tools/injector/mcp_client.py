"""An MCP transport for the official `mcp` SDK: a stdio MCP server inside the sandbox.

`sandbox_mcp_client` gives the same (read, write) streams as the SDK's `stdio_client`,
so `ClientSession` works unchanged: initialize, tools, resources, prompts. Messages the
server sends on its own (logging, progress, sampling/roots/elicitation requests) reach
the session as sandbox -> host messages: pushed on the persistent channel, long-polled
on exec-per-call transports. The host's answers to server requests go back with
`mcp_send_response`.

    async with sandbox_mcp_client(support, StdioServerParameters(command="my-server")) as (
        read,
        write,
    ):
        async with ClientSession(read, write) as session:
            await session.initialize()
            print(await session.call_tool("add", {"a": 1, "b": 2}))
"""

from __future__ import annotations

import contextlib
import logging
import secrets
from collections.abc import AsyncIterator
from typing import Any

import anyio
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from mcp.client.stdio import StdioServerParameters
from mcp.shared.message import SessionMessage
from mcp.types import (
    INTERNAL_ERROR,
    ErrorData,
    JSONRPCError,
    JSONRPCMessage,
    JSONRPCNotification,
    JSONRPCRequest,
)
from pydantic import ValidationError

from sandbox_tools.errors import SandboxToolsError
from sandbox_tools.injector.inject import ToolSupport
from sandbox_tools.injector.jsonrpc_client import RuntimeClient
from sandbox_tools.protocol import HOST_MESSAGE_MCP, User
from sandbox_tools.runtime.tools.mcp.tool_types import SendParams, session_params

log = logging.getLogger(__name__)

# Bounds one request to the MCP server (a tool call may legitimately take long).
DEFAULT_REQUEST_TIMEOUT = 600.0
KILL_TIMEOUT = 30.0

ReadStream = MemoryObjectReceiveStream[SessionMessage | Exception]
WriteStream = MemoryObjectSendStream[SessionMessage]


def _as_dict(message: JSONRPCMessage) -> dict[str, Any]:
    dumped: dict[str, Any] = message.model_dump(by_alias=True, mode="json", exclude_none=True)
    return dumped


@contextlib.asynccontextmanager
async def sandbox_mcp_client(
    runtime: ToolSupport | RuntimeClient,
    server: StdioServerParameters,
    *,
    user: User | None = None,
    request_timeout: float = DEFAULT_REQUEST_TIMEOUT,
) -> AsyncIterator[tuple[ReadStream, WriteStream]]:
    """Launch `server` in the sandbox (as `user`) and connect the SDK's streams to it."""
    client = runtime.client if isinstance(runtime, ToolSupport) else runtime
    read_writer, read_stream = anyio.create_memory_object_stream[SessionMessage | Exception](0)
    write_stream, write_reader = anyio.create_memory_object_stream[SessionMessage](0)
    session_id: int | None = None
    # Chosen here and echoed by the runtime in each of this session's messages: the
    # listener keeps only those, so no other session's traffic is ever queued for us.
    tag = secrets.token_hex(16)
    launched = anyio.Event()

    async def to_session(message: dict[str, Any] | Exception) -> None:
        item: SessionMessage | Exception
        if isinstance(message, Exception):
            item = message
        else:
            try:
                item = SessionMessage(JSONRPCMessage.model_validate(message))
            except ValidationError as exc:
                # Untrusted bytes from the sandbox: the session hears of it, nothing else.
                item = ValueError(f"the MCP server sent an invalid message: {exc}")
        with contextlib.suppress(anyio.ClosedResourceError, anyio.BrokenResourceError):
            await read_writer.send(item)

    async def from_sandbox(params: dict[str, Any]) -> None:
        await launched.wait()  # messages sent before the launch returned wait, in order
        dropped = params.get("dropped")
        if isinstance(dropped, dict):
            reason = str(dropped.get("reason"))[:500]
            log.warning("MCP server in the sandbox: %s", reason)
            await to_session(ValueError(reason))
            return
        message = params.get("message")
        if isinstance(message, dict) and params.get("session_id") == session_id:
            await to_session(message)

    async def transport_failed(reason: str) -> None:
        # Messages were lost: the session cannot be trusted to be whole any more, so the
        # server is stopped (a flooding server stops flooding) and the session told.
        log.warning("MCP session in the sandbox ended: %s", reason)
        if session_id is not None:
            with anyio.move_on_after(KILL_TIMEOUT), contextlib.suppress(Exception):
                await client.call(
                    "mcp_kill_server", session_params(session_id), timeout=KILL_TIMEOUT
                )
        await to_session(ConnectionError(f"MCP server messages stopped: {reason}"))

    listener = await client.listen(
        HOST_MESSAGE_MCP,
        from_sandbox,
        transport_failed,
        accepts=lambda params: params.get("tag") == tag,
        per_server=True,
    )
    try:
        launch: dict[str, Any] = {
            "server_params": server.model_dump(),
            "host_messages": True,
            "message_tag": tag,
        }
        if user is not None:
            launch["user"] = user
        result = await client.call("mcp_launch_server", launch)
        if type(result) is not int:
            raise SandboxToolsError(f"mcp_launch_server answered {result!r:.100}, not a session id")
        session_id = result
        launched.set()

        async def request(root: JSONRPCRequest) -> None:
            try:
                response = await client.call(
                    "mcp_send_request",
                    SendParams(session_id, _as_dict(JSONRPCMessage(root))).to_params("request"),
                    timeout=request_timeout,
                )
            except SandboxToolsError as exc:
                # An error for the same id: the SDK raises McpError instead of waiting.
                error = ErrorData(code=INTERNAL_ERROR, message=str(exc))
                response = _as_dict(
                    JSONRPCMessage(JSONRPCError(jsonrpc="2.0", id=root.id, error=error))
                )
            if isinstance(response, dict):
                await to_session(response)

        async def forward(message: SessionMessage) -> None:
            root = message.message.root
            body = _as_dict(message.message)
            if isinstance(root, JSONRPCRequest):
                task_group.start_soon(request, root)  # many in flight: matched by id
            elif isinstance(root, JSONRPCNotification):
                await client.call(
                    "mcp_send_notification", SendParams(session_id, body).to_params("notification")
                )
            else:  # the answer to a request the server sent us (sampling, roots, ...)
                await client.call(
                    "mcp_send_response", SendParams(session_id, body).to_params("response")
                )

        async def writer() -> None:
            async with write_reader:
                async for message in write_reader:
                    try:
                        await forward(message)
                    except SandboxToolsError as exc:
                        await to_session(ConnectionError(f"MCP server messages stopped: {exc}"))

        async with anyio.create_task_group() as task_group:
            task_group.start_soon(writer)
            try:
                yield read_stream, write_stream
            finally:
                task_group.cancel_scope.cancel()
    finally:
        await listener.aclose()
        if session_id is not None:
            with anyio.move_on_after(KILL_TIMEOUT, shield=True), contextlib.suppress(Exception):
                await client.call(
                    "mcp_kill_server", session_params(session_id), timeout=KILL_TIMEOUT
                )
        await read_writer.aclose()
        await write_stream.aclose()
