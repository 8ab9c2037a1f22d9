"""An MCP transport for the official `mcp` SDK: a stdio MCP server inside the sandbox.

`sandbox_mcp_client` gives the same (read, write) streams as the SDK's `stdio_client`,
so `ClientSession` works unchanged: initialize, tools, resources, prompts. Messages the
server sends on its own (logging, progress, sampling/roots/elicitation requests) reach
the session as sandbox -> host messages: pushed on the persistent channel, long-polled
on exec-per-call transports. The host's answers to server requests go back with
`mcp_send_response`.

What a server sends on its own is untrusted (THREAT_MODEL.md, rule 3) and checked before
the SDK sees it: at most MAX_SERVER_MESSAGE_VALUES JSON values (a request over it is
answered with an error, a notification dropped), and valid as the SDK's ServerRequest or
ServerNotification (else the same). Drops are counted and told in the log once, then in
a summary at most every DROP_SUMMARY_SECONDS; past MAX_DROPPED_MESSAGES the session is
ended and its server killed. Answers to the host's own requests keep the transport's
bound (MAX_JSON_VALUES).

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
import time
from collections.abc import AsyncIterator
from typing import Any

import anyio
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from mcp.client.stdio import StdioServerParameters
from mcp.shared.message import SessionMessage
from mcp.types import (
    INTERNAL_ERROR,
    INVALID_PARAMS,
    INVALID_REQUEST,
    ErrorData,
    JSONRPCError,
    JSONRPCMessage,
    JSONRPCNotification,
    JSONRPCRequest,
    ServerNotification,
    ServerRequest,
)
from pydantic import ValidationError

from sandbox_tools.errors import SandboxToolsError
from sandbox_tools.injector.inject import ToolSupport
from sandbox_tools.injector.jsonrpc_client import RuntimeClient
from sandbox_tools.injector.log_bounds import said
from sandbox_tools.protocol import HOST_MESSAGE_MCP, MAX_SERVER_MESSAGE_VALUES, User
from sandbox_tools.runtime.tools.mcp.tool_types import SendParams, SessionParams

log = logging.getLogger(__name__)

# Bounds one request to the MCP server (a tool call may legitimately take long).
DEFAULT_REQUEST_TIMEOUT = 600.0
KILL_TIMEOUT = 30.0
# The longest an answer waits for the messages the server sent before it to reach the
# session (they are on the host already; a stuck handler must not hold the answer).
ORDER_WAIT = 10.0

# Messages of one session the host refused or dropped (too big, or not valid for the
# SDK): past this many the server is broken or hostile, and the session is ended.
MAX_DROPPED_MESSAGES = 1000
# Drops are told in the log at the first, then in a summary at most this often (seconds):
# a server cannot turn them into a flood of the host's log.
DROP_SUMMARY_SECONDS = 60.0
# A request id the host echoes in a refusal, at most (characters).
MAX_REQUEST_ID_CHARS = 200

ReadStream = MemoryObjectReceiveStream[SessionMessage | Exception]
WriteStream = MemoryObjectSendStream[SessionMessage]


def _as_dict(message: JSONRPCMessage) -> dict[str, Any]:
    dumped: dict[str, Any] = message.model_dump(by_alias=True, mode="json", exclude_none=True)
    return dumped


def more_values_than(value: Any, limit: int) -> bool:
    """Whether parsed JSON holds more than `limit` values (every container and scalar, as
    `protocol.json_values` counts them in the text); it stops past `limit`, so it costs at
    most that many steps whatever the message's size."""
    count = 1
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, (dict, list)):
            count += len(item) or 1  # `{}` counts 2 in the text too, as `{` and the value
            if count > limit:
                return True
            stack.extend(item.values() if isinstance(item, dict) else item)
    return count > limit


def _server_message(message: dict[str, Any]) -> SessionMessage:
    """A message the server sent on its own, validated as the SDK will (ValidationError
    if it is not a ServerRequest or ServerNotification the SDK knows)."""
    parsed = JSONRPCMessage.model_validate(message)
    root = parsed.root
    if isinstance(root, JSONRPCRequest | JSONRPCNotification):
        body = root.model_dump(by_alias=True, mode="json", exclude_none=True)
        kind = ServerRequest if isinstance(root, JSONRPCRequest) else ServerNotification
        kind.model_validate(body)
    return SessionMessage(parsed)


class _Drops:
    """What the host dropped of one session's messages, told without flooding the log:
    a warning at the first, then a summary at most every DROP_SUMMARY_SECONDS (and one
    at the end for what is left)."""

    def __init__(self) -> None:
        self.total = 0
        self._untold = 0
        self._told_at: float | None = None
        self._latest = ""

    def note(self, what: str) -> None:
        """One more drop, `what` saying which and why (a short text)."""
        self.total += 1
        self._latest = what
        now = time.monotonic()
        if self._told_at is None:
            self._told_at = now
            log.warning(
                "MCP server in the sandbox: %s (further drops are counted and told at most "
                "every %g s)",
                what,
                DROP_SUMMARY_SECONDS,
            )
            return
        self._untold += 1
        if now - self._told_at >= DROP_SUMMARY_SECONDS:
            self.flush()

    def flush(self) -> None:
        """Tell what was dropped since the last warning, if anything."""
        if self._untold:
            log.warning(
                "MCP server in the sandbox: %d more messages dropped (%d in all); the latest: %s",
                self._untold,
                self.total,
                self._latest,
            )
            self._untold = 0
            self._told_at = time.monotonic()


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

    drops = _Drops()

    async def to_session(message: dict[str, Any] | SessionMessage | Exception) -> None:
        item: SessionMessage | Exception
        if isinstance(message, SessionMessage | Exception):
            item = message
        else:
            try:
                item = SessionMessage(JSONRPCMessage.model_validate(message))
            except ValidationError as exc:
                # Untrusted bytes from the sandbox: the session hears of it, nothing else.
                item = ValueError(f"the MCP server sent an invalid message: {exc}")
        with contextlib.suppress(anyio.ClosedResourceError, anyio.BrokenResourceError):
            await read_writer.send(item)

    async def drop(message: dict[str, Any], why: str, code: int) -> None:
        """Refuse a request (an error answer for its id) or drop a notification; counted,
        and past MAX_DROPPED_MESSAGES the session ends."""
        method = message.get("method")
        name = repr(said(method, 80)) if isinstance(method, str) else type(method).__name__
        kind = "request" if "id" in message else "notification"
        drops.note(f"a {kind} {name} was refused: {why}")
        request_id = message.get("id")
        answer_to: str | int | None = None  # an id that can be echoed, if any
        if type(request_id) is int or (
            isinstance(request_id, str) and len(request_id) <= MAX_REQUEST_ID_CHARS
        ):
            answer_to = request_id
        # Emptied now, not when this function returns: the answer below may wait behind
        # other sessions' messages on the channel, each one such message would keep.
        message.clear()
        if answer_to is not None and session_id is not None:
            error = JSONRPCError(
                jsonrpc="2.0", id=answer_to, error=ErrorData(code=code, message=why[:500])
            )
            with contextlib.suppress(SandboxToolsError):
                await client.call(
                    "mcp_send_response",
                    SendParams(session_id, _as_dict(JSONRPCMessage(error))).to_params("response"),
                )
        if drops.total > MAX_DROPPED_MESSAGES:
            listener.fail(
                f"the server sent more than {MAX_DROPPED_MESSAGES} messages the host refused "
                f"(too big or not valid MCP); the latest: {why}"
            )

    async def from_server(message: dict[str, Any]) -> None:
        if "method" not in message:  # the answer to one of the host's requests
            await to_session(message)
            return
        if more_values_than(message, MAX_SERVER_MESSAGE_VALUES):
            await drop(
                message,
                f"it holds more than {MAX_SERVER_MESSAGE_VALUES} JSON values, the most the "
                "host takes in a message the server sends on its own",
                INVALID_REQUEST,
            )
            return
        try:
            item = _server_message(message)
        except ValidationError as exc:
            why = f"it is not valid MCP ({exc.error_count()} validation errors for {exc.title})"
            await drop(message, why, INVALID_PARAMS)
            return
        except (ValueError, RecursionError) as exc:  # e.g. nested past pydantic's depth
            await drop(message, f"it cannot be read as MCP: {said(exc, 120)}", INVALID_PARAMS)
            return
        await to_session(item)

    async def from_sandbox(params: dict[str, Any]) -> None:
        await launched.wait()  # messages sent before the launch returned wait, in order
        dropped = params.get("dropped")
        if isinstance(dropped, dict):
            # The runtime dropped a message of the server's (too large): counted with the
            # host's own drops, told as they are, and past the bound the session ends.
            reason = said(dropped.get("reason"), 500)
            drops.note(f"the runtime dropped a message: {reason}")
            await to_session(ValueError(reason))
            if drops.total > MAX_DROPPED_MESSAGES:
                listener.fail(
                    f"the server sent more than {MAX_DROPPED_MESSAGES} messages that were "
                    f"dropped; the latest: {reason}"
                )
            return
        message = params.get("message")
        if isinstance(message, dict) and params.get("session_id") == session_id:
            await from_server(message)

    ended: list[str] = []  # why the host ended the session, once it did

    async def transport_failed(reason: str) -> None:
        # Messages were lost: the session cannot be trusted to be whole any more, so the
        # server is stopped (a flooding server stops flooding) and the session told.
        ended.append(reason)
        log.warning("MCP session in the sandbox ended: %s", said(reason, 1000))
        if session_id is not None:
            with anyio.move_on_after(KILL_TIMEOUT), contextlib.suppress(Exception):
                await client.call(
                    "mcp_kill_server",
                    SessionParams(session_id=session_id).to_params(),
                    timeout=KILL_TIMEOUT,
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
            if ended:  # answered at once: the server was stopped, nothing would answer
                error = ErrorData(
                    code=INTERNAL_ERROR, message=f"the MCP session was ended: {ended[0]}"
                )
                await to_session(
                    _as_dict(JSONRPCMessage(JSONRPCError(jsonrpc="2.0", id=root.id, error=error)))
                )
                return
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
                # What the server said before answering (progress, logs) first, as the
                # SDK's own stdio transport delivers it: the SDK drops progress for a
                # request it has seen answered.
                await listener.drained(ORDER_WAIT)
                await to_session(response)

        async def forward(message: SessionMessage) -> None:
            root = message.message.root
            body = _as_dict(message.message)
            if isinstance(root, JSONRPCRequest):
                task_group.start_soon(request, root)  # many in flight: matched by id
            elif ended:
                return  # a notification or an answer for a server that was stopped
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
        drops.flush()
        await listener.aclose()
        if session_id is not None:
            with anyio.move_on_after(KILL_TIMEOUT, shield=True), contextlib.suppress(Exception):
                await client.call(
                    "mcp_kill_server",
                    SessionParams(session_id=session_id).to_params(),
                    timeout=KILL_TIMEOUT,
                )
        await read_writer.aclose()
        await write_stream.aclose()
