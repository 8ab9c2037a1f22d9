"""The MCP bridge with a real FastMCP server, the official `mcp` SDK's ClientSession on
the host, and the runtime from source as real processes: over the persistent stdio
channel and over one exec per call."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

mcp = pytest.importorskip("mcp", reason="the [mcp] extra is not installed")

from mcp import ClientSession, StdioServerParameters  # noqa: E402
from mcp.shared.exceptions import McpError  # noqa: E402
from mcp.types import (  # noqa: E402
    CreateMessageRequestParams,
    CreateMessageResult,
    LoggingMessageNotificationParams,
    TextContent,
)

from sandbox_tools.injector.jsonrpc_client import (  # noqa: E402
    ExecRuntimeClient,
    RuntimeClient,
    StdioRuntimeClient,
)
from sandbox_tools.injector.mcp_client import sandbox_mcp_client  # noqa: E402
from sandbox_tools.injector.source_runtime import local_source_runtime  # noqa: E402
from sandbox_tools.sandboxes.local import LocalSandbox  # noqa: E402
from tests.support import RuntimeDir  # noqa: E402

DEMO = str(Path(__file__).parents[1] / "mcp_servers" / "demo_server.py")
SERVER = StdioServerParameters(command=sys.executable, args=[DEMO])


@pytest.fixture(params=["stdio", "exec"])
async def runtime(request: pytest.FixtureRequest, runtime_dir: RuntimeDir) -> AsyncIterator[Any]:
    launch = local_source_runtime(runtime_dir.path)
    kind = StdioRuntimeClient if request.param == "stdio" else ExecRuntimeClient
    client = kind(LocalSandbox(), launch.command, env=launch.env)
    yield client
    await client.aclose()


def text(result: Any) -> str:
    (content,) = result.content
    assert isinstance(content, TextContent)
    return content.text


async def test_tools_resources_and_concurrent_calls(runtime: RuntimeClient) -> None:
    async with (
        sandbox_mcp_client(runtime, SERVER) as (read, write),
        ClientSession(read, write) as session,
    ):
        info = await session.initialize()
        assert info.serverInfo.name == "demo"
        names = {tool.name for tool in (await session.list_tools()).tools}
        assert {"add", "slow", "progress", "log", "ask_client"} <= names
        assert text(await session.call_tool("add", {"a": 2, "b": 40})) == "42"
        # Three slow calls in flight at once: answered by id, not one after another.
        started = asyncio.get_running_loop().time()
        results = await asyncio.gather(
            *(session.call_tool("slow", {"seconds": 2.0, "label": n}) for n in "abc")
        )
        assert [text(r) for r in results] == ["a", "b", "c"]
        assert asyncio.get_running_loop().time() - started < 5  # one after another: 6 s


async def test_server_initiated_messages_reach_the_sdk_callbacks(runtime: RuntimeClient) -> None:
    """PROTOCOL.md sandbox -> host messages: logging and progress notifications, and a
    sampling request answered by the host, all through the SDK's own callbacks."""
    logs: list[str] = []
    progress: list[float] = []

    async def on_log(params: LoggingMessageNotificationParams) -> None:
        logs.append(str(params.data))

    async def on_sampling(context: Any, params: CreateMessageRequestParams) -> CreateMessageResult:
        (message,) = params.messages
        assert isinstance(message.content, TextContent)
        answer = TextContent(type="text", text=f"forty-two ({message.content.text})")
        return CreateMessageResult(role="assistant", content=answer, model="host-model")

    async def on_progress(done: float, total: float | None, message: str | None) -> None:
        progress.append(done)

    async with (
        sandbox_mcp_client(runtime, SERVER) as (read, write),
        ClientSession(
            read, write, logging_callback=on_log, sampling_callback=on_sampling
        ) as session,
    ):
        await session.initialize()
        assert text(await session.call_tool("log", {"text": "hello host"})) == "logged"
        result = await session.call_tool("progress", {"steps": 3}, progress_callback=on_progress)
        assert text(result) == "done"
        asked = await session.call_tool("ask_client", {"question": "6*7?"})
        assert text(asked) == "the client said: forty-two (6*7?)"
    assert logs == ["hello host"]
    assert progress == [1, 2, 3]


async def test_a_crashing_server_is_a_clear_error_not_a_hang(runtime: RuntimeClient) -> None:
    async with (
        sandbox_mcp_client(runtime, SERVER) as (read, write),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        with pytest.raises(McpError, match=r"(?s)exited with code 3.*about to crash"):
            await asyncio.wait_for(session.call_tool("crash", {}), 30)
        with pytest.raises(McpError, match="MCP session"):
            await asyncio.wait_for(session.call_tool("add", {"a": 1, "b": 1}), 30)


async def test_garbage_on_stdout_fails_the_waiting_call_clearly(runtime: RuntimeClient) -> None:
    async with (
        sandbox_mcp_client(runtime, SERVER) as (read, write),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        with pytest.raises(McpError, match="not a JSON-RPC message: 'this is not JSON"):
            await asyncio.wait_for(session.call_tool("garbage", {}), 30)
        # The server itself is fine: later calls work.
        assert text(await session.call_tool("add", {"a": 1, "b": 2})) == "3"


async def test_a_command_that_does_not_exist_is_a_tool_error(runtime: RuntimeClient) -> None:
    from sandbox_tools.errors import ToolError

    missing = StdioServerParameters(command="no-such-mcp-server")
    with pytest.raises(ToolError, match="'no-such-mcp-server' not found"):
        async with sandbox_mcp_client(runtime, missing):
            pass


def test_inspects_notification_shape_and_kill(runtime_dir: RuntimeDir) -> None:
    """inspect_ai's mcp_server_sandbox sends mcp_send_notification as a JSON-RPC
    notification (no id, nothing printed) and ends with mcp_kill_server; its sessions
    get no sandbox -> host messages, and a server request is refused at once."""
    launch = {"server_params": {"command": sys.executable, "args": [DEMO]}}
    session = runtime_dir.result("mcp_launch_server", launch)
    initialize = {
        "jsonrpc": "2.0",
        "id": 0,
        "method": "initialize",
        "params": {
            "protocolVersion": "2025-06-18",
            "capabilities": {},
            "clientInfo": {"name": "t", "version": "1"},
        },
    }
    answer = runtime_dir.result("mcp_send_request", {"session_id": session, "request": initialize})
    assert answer["id"] == 0 and answer["result"]["serverInfo"]["name"] == "demo"
    note = {"jsonrpc": "2.0", "method": "notifications/initialized"}
    done = runtime_dir.cli(
        "exec",
        input=(
            '{"jsonrpc":"2.0","method":"mcp_send_notification","params":'
            f'{{"session_id":{session},"notification":{__import__("json").dumps(note)}}}}}'
        ),
    )
    assert (done.returncode, done.stdout) == (0, "")
    ask = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "tools/call",
        "params": {"name": "ask_client", "arguments": {"question": "?"}},
    }
    refused = runtime_dir.result("mcp_send_request", {"session_id": session, "request": ask})
    assert refused["result"]["isError"] is True  # the sampling request was refused at once
    assert runtime_dir.result("mcp_kill_server", {"session_id": session}) is None
    gone = runtime_dir.call("mcp_send_request", {"session_id": session, "request": ask})
    assert (
        gone["error"]["code"] == -32099 and f"no MCP session {session}" in gone["error"]["message"]
    )
