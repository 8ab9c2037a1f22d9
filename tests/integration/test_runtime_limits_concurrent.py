"""The runtime's start limits under concurrent calls, over the real runtime server.

The runtime runs from source as a real process (its server and the `stdio` channel),
driven by the host's own client with many calls in flight at once, as an agent with the
runtime's uid could do (THREAT_MODEL.md, "who is who").
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from sandbox_tools.errors import ToolError
from sandbox_tools.injector.jsonrpc_client import StdioRuntimeClient
from sandbox_tools.injector.source_runtime import local_source_runtime
from sandbox_tools.protocol import ErrorReason
from sandbox_tools.sandboxes.local import LocalSandbox
from tests.support import RuntimeDir

pytestmark = pytest.mark.timeout(300)


@pytest.fixture
async def client(runtime_dir: RuntimeDir) -> AsyncIterator[StdioRuntimeClient]:
    launch = local_source_runtime(runtime_dir.path)
    runtime = StdioRuntimeClient(LocalSandbox(), launch.command, env=launch.env)
    yield runtime
    await runtime.aclose()


async def concurrently(
    client: StdioRuntimeClient, count: int, method: str, params: dict[str, Any]
) -> tuple[list[Any], list[BaseException]]:
    results = await asyncio.gather(
        *(client.call(method, params, timeout=120) for _ in range(count)),
        return_exceptions=True,
    )
    failed = [r for r in results if isinstance(r, BaseException)]
    return [r for r in results if not isinstance(r, BaseException)], failed


def limit_errors(failed: list[BaseException], phrase: str) -> bool:
    """Each refusal is the limit's tool error, in words for the model and by its reason."""
    return all(
        isinstance(e, ToolError) and phrase in e.message and e.reason is ErrorReason.TOO_MANY
        for e in failed
    )


@pytest.mark.security
async def test_each_start_limit_holds_against_concurrent_calls(client: StdioRuntimeClient) -> None:
    """THREAT_MODEL.md, rule 5 ("the runtime wedges": bounded pools): each limit was
    checked before an await, so 300 concurrent exec_remote starts (limit 32), 100 bash
    sessions (limit 16) and 100 MCP servers (limit 16) were all accepted. Exactly the
    limit starts now; every other call gets the limit's tool error."""
    started, refused = await concurrently(
        client, 300, "exec_remote_start", {"command": "sleep 120"}
    )
    assert len(started) == 32 and len(refused) == 268
    assert limit_errors(refused, "too many processes")

    started, refused = await concurrently(client, 100, "bash_session_new_session", {})
    assert len(started) == 16 and len(refused) == 84
    assert len({s["session_name"] for s in started}) == 16
    assert limit_errors(refused, "too many bash sessions")

    started, refused = await concurrently(
        client, 100, "mcp_launch_server", {"server_params": {"command": "cat"}}
    )
    assert len(started) == 16 and len(refused) == 84
    assert limit_errors(refused, "too many MCP sessions")
    # The server is still there for everyone else.
    assert await client.call("version")
