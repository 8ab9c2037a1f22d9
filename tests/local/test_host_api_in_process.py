"""Host logic of the injector's APIs against the real runtime server, served in the test's
own process (tests/support.py, `serve_runtime_in_process`): what the host makes of real
answers (typed errors and their reasons, `RuntimeInfo`, exec_remote's polling), on both
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
from sandbox_tools.injector.jsonrpc_client import RuntimeClient, RuntimeInfo
from sandbox_tools.injector.tool_clients import (
    bash_session,
    close_bash_session,
    new_bash_session,
    session_gone,
)
from sandbox_tools.injector.web_browser import BrowserSession
from sandbox_tools.protocol import MAX_JOBS_ENV, MAX_SESSIONS_ENV, ErrorReason
from tests.support import InProcessRuntime, serve_runtime_in_process


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


async def test_a_gone_session_or_process_reaches_the_host_as_its_reason(
    client: RuntimeClient,
) -> None:
    """The host goes on in a new session on `ToolError.reason` alone, never on the words:
    each real answer of a gone session or process reads as its reason, and an error the
    host cannot act on as none."""
    closed = await new_bash_session(client)
    assert await close_bash_session(client, closed)
    for name in (closed, "BashSession_never_0"):
        with pytest.raises(ToolError) as gone:
            await bash_session(client, name, "true\n")
        assert gone.value.reason is ErrorReason.SESSION_GONE and session_gone(gone.value)
    with pytest.raises(ToolError) as browser_gone:
        await BrowserSession(client, "WebBrowser_never_0", None).go("about:blank")
    assert browser_gone.value.reason is ErrorReason.SESSION_GONE
    with pytest.raises(ToolError) as process_gone:
        await client.call("exec_remote_poll", {"pid": 999_999, "ack_seq": 0})
    assert process_gone.value.reason is ErrorReason.PROCESS_GONE
    assert not session_gone(process_gone.value)
    with pytest.raises(ToolError) as no_reason:
        await exec_remote(client, "true", ExecRemoteOptions(cwd="/no/such"))
    assert no_reason.value.reason is None


# -- what the server says it is --------------------------------------------------------------


async def test_runtime_info_becomes_a_record_with_the_limits_the_server_holds() -> None:
    """`RuntimeInfo.limits` read from a real `runtime_info`: the values the server
    started with, by name, as numbers; and the limits it holds are the ones the host
    meets, each as its reason."""
    environ = {MAX_JOBS_ENV: "1", MAX_SESSIONS_ENV: "1"}
    async with serve_runtime_in_process(environ) as runtime:
        client = runtime.client
        info = RuntimeInfo.parse(await client.call("runtime_info"))
        assert (info.build_id, info.server_dir) == ("source", runtime.directory)
        assert info.limits == runtime.server.limits.reported()
        assert (info.limits["max_jobs"], info.limits["max_sessions"]) == (1, 1)
        async with await exec_remote(client, "sleep 30"):
            with pytest.raises(ToolError) as too_many:
                await exec_remote(client, "true")
            assert too_many.value.reason is ErrorReason.TOO_MANY
        first = await new_bash_session(client)
        await new_bash_session(client)  # the idle one makes room
        with pytest.raises(ToolError) as reclaimed:
            await bash_session(client, first, "true\n")
        assert session_gone(reclaimed.value)
