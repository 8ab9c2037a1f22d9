"""The in-process runtime server host-API tests use (tests/support.py,
`serve_runtime_in_process`): the real server, gone with everything it started when the
test ends, however it ends, and a server of its own for each test."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from sandbox_tools.errors import ToolError
from sandbox_tools.injector.jsonrpc_client import StdioRuntimeClient
from sandbox_tools.injector.tool_clients import bash_session, new_bash_session
from sandbox_tools.protocol import ErrorReason
from tests.support import InProcessRuntime, eventually, serve_runtime_in_process


async def test_the_client_is_the_injectors_own_and_reaches_the_real_server(
    runtime_in_process: InProcessRuntime,
) -> None:
    client = runtime_in_process.client
    assert type(client) is StdioRuntimeClient
    info = await client.call("runtime_info")
    assert (info["build_id"], info["server_dir"]) == ("source", runtime_in_process.directory)
    assert info["limits"] == runtime_in_process.server.limits.reported()
    assert await runtime_in_process.exec_client().call("version") == info["version"]


async def test_the_server_and_what_it_started_end_with_the_test_even_when_it_fails() -> None:
    before = (os.getcwd(), {n: signal.getsignal(n) for n in (signal.SIGINT, signal.SIGHUP)})
    with pytest.raises(RuntimeError, match="the test failed"):
        async with serve_runtime_in_process() as runtime:
            directory = Path(runtime.directory)
            session = await new_bash_session(runtime.client)
            shell = int(await bash_session(runtime.client, session, "echo $$\n"))
            assert (directory / "server.sock").is_socket()
            raise RuntimeError("the test failed")
    assert not directory.exists()
    eventually(lambda: not Path(f"/proc/{shell}").exists(), f"the shell {shell} ended")
    # serve() chdirs to / and takes signals, as a process of its own: all put back.
    assert (os.getcwd(), {n: signal.getsignal(n) for n in before[1]}) == before


async def test_two_at_once_have_a_socket_and_state_each() -> None:
    """Tests in parallel (pytest-xdist workers) never meet in one server."""
    async with serve_runtime_in_process() as one, serve_runtime_in_process() as two:
        assert one.directory != two.directory
        session = await new_bash_session(one.client)
        with pytest.raises(ToolError) as unknown:
            await bash_session(two.client, session, "true\n")
        assert unknown.value.reason is ErrorReason.SESSION_GONE
