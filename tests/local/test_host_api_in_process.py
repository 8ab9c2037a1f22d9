"""Host logic of the injector's APIs against the real runtime server, served in the test's
own process (tests/support.py, `serve_runtime_in_process`): what the host makes of real
answers (typed errors, exec_remote's polling and events), on both
transports, with no container and no hand-written answers."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

import pytest

from sandbox_tools.errors import RuntimeRpcError, ToolError
from sandbox_tools.injector.exec_remote import (
    Completed,
    ExecRemoteOptions,
    StderrChunk,
    StdoutChunk,
    exec_remote,
)
from sandbox_tools.injector.jsonrpc_client import RuntimeClient
from sandbox_tools.injector.tool_clients import new_bash_session
from tests.support import InProcessRuntime


@pytest.fixture(params=["stdio", "exec"])
async def client(
    request: pytest.FixtureRequest, runtime_in_process: InProcessRuntime
) -> AsyncIterator[RuntimeClient]:
    """Each transport the injector may choose, to the one server."""
    if request.param == "stdio":
        yield runtime_in_process.client
    else:
        yield runtime_in_process.exec_client()


# -- exec_remote's host client ---------------------------------------------------------------


async def test_result_and_streams(client: RuntimeClient) -> None:
    result = await exec_remote(client, "echo out; echo err >&2; exit 3", stream=False)
    assert (result.success, result.returncode, result.stdout, result.stderr) == (
        False,
        3,
        "out\n",
        "err\n",
    )

    ok = await exec_remote(client, ["printf", "%s", "a b; $(x)"], stream=False)
    assert (ok.success, ok.stdout) == (True, "a b; $(x)")  # argv is quoted, not interpreted


async def test_events_in_order_and_stdin(client: RuntimeClient) -> None:
    process = await exec_remote(
        client,
        "read line; echo got:$line; echo warn >&2",
        ExecRemoteOptions(stdin_open=True, poll_interval=0.5),
    )
    await process.write_stdin("hello\n")
    await process.close_stdin()
    events = [event async for event in process.events()]
    assert StdoutChunk("got:hello\n") in events
    assert StderrChunk("warn\n") in events
    assert events[-1] == Completed(exit_code=0, stdout="got:hello\n", stderr="warn\n")


async def test_long_poll_sees_exit_promptly(runtime_in_process: InProcessRuntime) -> None:
    client = runtime_in_process.client
    process = await exec_remote(client, "sleep 0.3", ExecRemoteOptions(poll_interval=10))
    started = time.monotonic()
    completed = await process.wait()
    assert completed.exit_code == 0
    assert time.monotonic() - started < 5  # not the 10 s poll interval


# -- what the host makes of the runtime's errors ---------------------------------------------


async def test_tool_errors_surface_as_tool_error(client: RuntimeClient) -> None:
    with pytest.raises(ToolError, match="no-such-user"):
        await exec_remote(client, "true", ExecRemoteOptions(user="no-such-user"))
    with pytest.raises(ToolError, match="/no/such"):
        await exec_remote(client, "true", ExecRemoteOptions(cwd="/no/such"))


async def test_a_malformed_identity_is_invalid_params(client: RuntimeClient) -> None:
    with pytest.raises(RuntimeRpcError, match=r'field "user\.uid"') as caught:
        await new_bash_session(client, user={"uid": "0"})
    assert not isinstance(caught.value, ToolError)  # the caller's mistake, not the tool's
