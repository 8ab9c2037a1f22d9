"""The runtime's limits and bounds under an adversarial caller, on real processes.

The agent may run as the runtime's own uid and call any method (THREAT_MODEL.md, "who is
who"); these tests drive the real controllers (real shells, jobs and MCP server
processes), many calls at once, as the server's per-request tasks do.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import pytest

from sandbox_tools import protocol
from sandbox_tools.protocol import INTERNAL_ERROR, INVALID_PARAMS
from sandbox_tools.runtime import server
from sandbox_tools.runtime.host_messages import HostMessages
from sandbox_tools.runtime.jsonrpc import Method, ToolError, dispatch
from sandbox_tools.runtime.limits import Limits, LimitsError, caller_response_limit
from sandbox_tools.runtime.methods import Controllers
from sandbox_tools.runtime.paths import ServerPaths
from sandbox_tools.runtime.tools.bash_session import json_rpc_methods as bash_methods
from sandbox_tools.runtime.tools.bash_session.controller import BashSessionController
from sandbox_tools.runtime.tools.bash_session.tool_types import NewSessionParams
from sandbox_tools.runtime.tools.exec_remote import json_rpc_methods as exec_methods
from sandbox_tools.runtime.tools.exec_remote.controller import ExecRemoteController
from sandbox_tools.runtime.tools.exec_remote.tool_types import (
    AckParams,
    PollParams,
    StartParams,
    WriteStdinParams,
)
from sandbox_tools.runtime.tools.mcp import json_rpc_methods as mcp_methods
from sandbox_tools.runtime.tools.mcp.controller import McpController
from sandbox_tools.runtime.tools.mcp.tool_types import LaunchParams
from sandbox_tools.runtime.tools.text_editor.controller import TextEditorController
from sandbox_tools.runtime.tools.text_editor.tool_types import TextEditorParams

pytestmark = pytest.mark.timeout(180)

TEN_MB = 10 * 1024 * 1024


def split(results: list[Any]) -> tuple[list[Any], list[BaseException]]:
    """Successes and failures of a gather(return_exceptions=True)."""
    failed = [r for r in results if isinstance(r, BaseException)]
    return [r for r in results if not isinstance(r, BaseException)], failed


def only_limit_errors(failed: list[BaseException], phrase: str) -> bool:
    return all(isinstance(e, ToolError) and phrase in e.message for e in failed)


# -- S3-7: a limit is checked and reserved in one step -------------------------------------


@pytest.mark.security
async def test_exec_remote_job_limit_holds_under_concurrent_starts() -> None:
    """THREAT_MODEL.md, rule 5 ("the runtime wedges": bounded pools): the 32-job limit
    was checked before an await, so 300 concurrent exec_remote_start calls were all
    accepted (300 processes, each allowed an 8 MiB buffer)."""
    limit = 5
    controller = ExecRemoteController(Limits(max_jobs=limit))
    try:
        results = await asyncio.gather(
            *(controller.start(StartParams.parse({"command": "sleep 60"})) for _ in range(100)),
            return_exceptions=True,
        )
        started, refused = split(results)
        assert len(started) == limit
        assert len(refused) == 100 - limit
        assert only_limit_errors(refused, f"too many processes: {limit} are running")
    finally:
        await controller.shutdown()


@pytest.mark.security
async def test_a_failed_start_gives_its_reserved_slot_back() -> None:
    """THREAT_MODEL.md, rule 5: a reserved slot is released when its start fails, or
    failed starts would wedge exec_remote for good."""
    controller = ExecRemoteController(Limits(max_jobs=2))
    try:
        bad = StartParams.parse({"command": "true", "cwd": "/no/such/directory"})
        results = await asyncio.gather(
            *(controller.start(bad) for _ in range(10)), return_exceptions=True
        )
        assert only_limit_errors(split(results)[1], "not an existing directory")
        good = StartParams.parse({"command": "sleep 60"})
        started, refused = split(
            await asyncio.gather(
                *(controller.start(good) for _ in range(5)), return_exceptions=True
            )
        )
        assert len(started) == 2 and only_limit_errors(refused, "too many processes")
    finally:
        await controller.shutdown()


@pytest.mark.security
async def test_bash_session_limit_holds_under_concurrent_starts() -> None:
    """THREAT_MODEL.md, rule 5 (bounded pools): the 16-session limit was checked before
    an await, so 100 concurrent bash_session_new_session calls all started a shell (and
    several got the same name, leaking the shells they replaced)."""
    limit = 4
    controller = BashSessionController(Limits(max_sessions=limit))
    try:
        results = await asyncio.gather(
            *(controller.new_session(NewSessionParams.parse({})) for _ in range(40)),
            return_exceptions=True,
        )
        started, refused = split(results)
        assert len(started) == limit
        assert len({r["session_name"] for r in started}) == limit  # no name given twice
        assert len(refused) == 40 - limit
        assert only_limit_errors(refused, "too many bash sessions")
    finally:
        await controller.shutdown()


@pytest.mark.security
async def test_mcp_server_limit_holds_under_concurrent_launches() -> None:
    """THREAT_MODEL.md, rule 5 (bounded pools): the 16-server limit was checked before
    an await, so 100 concurrent mcp_launch_server calls were all accepted."""
    limit = 4
    controller = McpController(HostMessages(), Limits(max_mcp_sessions=limit))
    params = LaunchParams.parse({"server_params": {"command": "cat"}})
    try:
        results = await asyncio.gather(
            *(controller.launch(params, False) for _ in range(40)), return_exceptions=True
        )
        started, refused = split(results)
        assert len(started) == limit and len(set(started)) == limit
        assert len(refused) == 40 - limit
        assert only_limit_errors(refused, "too many MCP sessions")
        # A launch that fails gives its slot back.
        await controller.kill(started[0])
        missing = LaunchParams.parse({"server_params": {"command": "/no/such/server"}})
        with pytest.raises(ToolError, match="not found"):
            await controller.launch(missing, False)
        assert await controller.launch(params, False)
    finally:
        await controller.shutdown()


# -- S3-9: stdin calls are bounded in time ------------------------------------------------


async def run_to_end(controller: ExecRemoteController, pid: int) -> dict[str, Any]:
    stdout, ack = "", 0
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        result = await controller.poll(PollParams.parse({"pid": pid, "ack_seq": ack}))
        stdout += result["stdout"]
        ack = result["seq"]
        if result["state"] != "running":
            await controller.poll(PollParams.parse({"pid": pid, "ack_seq": ack}))
            return {**result, "stdout": stdout}
    raise AssertionError(f"process {pid} did not finish")


@pytest.mark.security
async def test_stdin_calls_return_while_unread_input_is_pending() -> None:
    """THREAT_MODEL.md, rule 5 ("no single request can starve the others"): given 10 MB
    of `input` it never reads, `sleep 1000` held the stdin lock, and write_stdin and
    close_stdin waited for it forever. Now write_stdin fails within its bound, saying
    the process is not reading and that nothing of it was sent; close_stdin returns
    at once."""
    controller = ExecRemoteController(Limits(stdin_timeout_s=1.0))
    try:
        start = {"command": "sleep 1000", "input": "x" * TEN_MB, "stdin_open": True}
        pid = (await controller.start(StartParams.parse(start)))["pid"]
        began = time.monotonic()
        with pytest.raises(ToolError) as refused:
            write = WriteStdinParams.parse({"pid": pid, "data": "more"})
            await asyncio.wait_for(controller.write_stdin(write), 15)
        assert time.monotonic() - began < 10
        assert "not reading its input" in refused.value.message
        assert "none of these 4 bytes were sent" in refused.value.message
        began = time.monotonic()
        closed = await asyncio.wait_for(controller.close_stdin(AckParams.parse({"pid": pid})), 15)
        assert closed == {"seq": 0, "stdout": "", "stderr": ""}
        assert time.monotonic() - began < 5
        # Closing again is no error; writing after the close is a clear one.
        await asyncio.wait_for(controller.close_stdin(AckParams.parse({"pid": pid})), 5)
        with pytest.raises(ToolError, match="already closed"):
            await asyncio.wait_for(controller.write_stdin(write), 5)
        # Without stdin_open the end of file is queued behind the input: no wait either.
        start = {"command": "sleep 1000", "input": "x" * TEN_MB}
        pid = (await controller.start(StartParams.parse(start)))["pid"]
        await asyncio.wait_for(controller.close_stdin(AckParams.parse({"pid": pid})), 5)
        with pytest.raises(ToolError, match="already closed"):
            await asyncio.wait_for(controller.write_stdin(write), 5)
    finally:
        await controller.shutdown()


@pytest.mark.security
async def test_close_stdin_keeps_queued_input_ahead_of_the_end_of_file() -> None:
    """THREAT_MODEL.md, rule 2 (the host is never misled): close_stdin no longer waits,
    yet input queued before it still reaches a process that reads it late, in order,
    and only then the end of file."""
    controller = ExecRemoteController()
    try:
        start = {"command": "sleep 0.5; wc -c", "input": "x" * TEN_MB, "stdin_open": True}
        pid = (await controller.start(StartParams.parse(start)))["pid"]
        await controller.write_stdin(WriteStdinParams.parse({"pid": pid, "data": "tail"}))
        began = time.monotonic()
        await controller.close_stdin(AckParams.parse({"pid": pid}))
        assert time.monotonic() - began < 0.4  # returned before the process read anything
        final = await run_to_end(controller, pid)
        assert (final["exit_code"], final["stdout"].strip()) == (0, str(TEN_MB + 4))
    finally:
        await controller.shutdown()


# -- S3-13: environments are checked where params are read ---------------------------------


def method_table() -> dict[str, Method]:
    return {
        **exec_methods.methods(ExecRemoteController()),
        **bash_methods.methods(BashSessionController()),
        **mcp_methods.methods(McpController(HostMessages())),
    }


def request(method: str, params: dict[str, Any]) -> bytes:
    return json.dumps({"jsonrpc": "2.0", "id": 1, "method": method, "params": params}).encode()


BAD_ENVS = [
    pytest.param({"A=B": "x"}, "'A=B'", id="equals-in-name"),
    pytest.param({"": "x"}, "''", id="empty-name"),
    pytest.param({"A\u0000B": "x"}, "NUL", id="nul-in-name"),
    # "input" is a stdin field elsewhere, where NUL is allowed: not in an environment.
    pytest.param({"input": "a\u0000b"}, "'input'", id="nul-in-value"),
]


@pytest.mark.security
@pytest.mark.parametrize(("env", "named"), BAD_ENVS)
@pytest.mark.parametrize("method", ["exec_remote_start", "mcp_launch_server"])
async def test_a_bad_environment_is_invalid_params_naming_the_key(
    method: str, env: dict[str, str], named: str
) -> None:
    """THREAT_MODEL.md, "everything read ... is parsed strictly" (and typed errors, never
    a traceback): an env name like `A=B`, or one holding NUL, once reached execve and
    came back as -32098 with the server's traceback in `data`."""
    params: dict[str, Any] = (
        {"command": "true", "env": env}
        if method == "exec_remote_start"
        else {"server_params": {"command": "cat", "env": env}}
    )
    response = await dispatch(method_table(), request(method, params))
    assert response is not None
    error = response["error"]
    assert error["code"] == INVALID_PARAMS, error
    assert "data" not in error
    assert "env" in error["message"]
    assert named in error["message"]


@pytest.mark.parametrize(("env", "named"), BAD_ENVS)
async def test_bash_session_never_answers_an_environment_with_a_traceback(
    env: dict[str, str], named: str
) -> None:
    """A guard, not a regression test: bash_session_new_session takes no environment;
    a hostile one sent anyway is ignored or refused, never an internal error."""
    controller = BashSessionController()
    try:
        methods = bash_methods.methods(controller)
        response = await dispatch(methods, request("bash_session_new_session", {"env": env}))
        assert response is not None
        assert response.get("error", {}).get("code") != INTERNAL_ERROR, response
        assert "data" not in response.get("error", {})
    finally:
        await controller.shutdown()


# -- the limits are read once, at server start, and handed to every controller -------------


def test_an_empty_environment_gives_the_documented_limits() -> None:
    """CONFIGURATION.md, "Runtime limits": each variable's row shows its default."""
    limits = Limits.from_environ({})
    assert limits == Limits()
    text = (Path(__file__).parents[2] / "docs" / "CONFIGURATION.md").read_text()
    rows = text.split("## Runtime limits", 1)[1].split("\n## ", 1)[0].splitlines()
    documented = {
        protocol.EXEC_BUFFER_BYTES_ENV: ("8 MiB", limits.exec_buffer_bytes == 8 << 20),
        protocol.EXEC_RESPONSE_BYTES_ENV: ("2 MiB", limits.exec_response_bytes == 2 << 20),
        protocol.KILL_GRACE_ENV: ("2 s", limits.kill_grace_s == 2.0),
        protocol.STDIN_TIMEOUT_ENV: ("30 s", limits.stdin_timeout_s == 30.0),
        protocol.MAX_JOBS_ENV: ("32", limits.max_jobs == 32),
        protocol.TEXT_EDITOR_MAX_BYTES_ENV: ("48 MiB", limits.text_editor_max_bytes == 48 << 20),
        protocol.MAX_SESSIONS_ENV: ("16", limits.max_sessions == 16),
        protocol.MAX_MCP_SESSIONS_ENV: ("16", limits.max_mcp_sessions == 16),
    }
    for name, (shown, default) in documented.items():
        row = next(line for line in rows if line.endswith(f"| `{name}` |"))
        assert f"| {shown}" in row and default, (name, row)


def test_every_variable_sets_its_limit() -> None:
    environ = {
        protocol.EXEC_BUFFER_BYTES_ENV: "1000",
        protocol.EXEC_RESPONSE_BYTES_ENV: "1e3",
        protocol.KILL_GRACE_ENV: "0.5",
        protocol.STDIN_TIMEOUT_ENV: "3",
        protocol.MAX_JOBS_ENV: "5.9",
        protocol.TEXT_EDITOR_MAX_BYTES_ENV: "4096",
        protocol.MAX_SESSIONS_ENV: "2",
        protocol.MAX_MCP_SESSIONS_ENV: " 7 ",
    }
    assert Limits.from_environ(environ) == Limits(
        exec_buffer_bytes=1000,
        exec_response_bytes=1000,
        kill_grace_s=0.5,
        stdin_timeout_s=3.0,
        max_jobs=5,
        text_editor_max_bytes=4096,
        max_sessions=2,
        max_mcp_sessions=7,
    )


@pytest.mark.parametrize(
    ("name", "value"),
    [
        (protocol.EXEC_BUFFER_BYTES_ENV, "lots"),
        (protocol.KILL_GRACE_ENV, "soon"),
        (protocol.STDIN_TIMEOUT_ENV, ""),
        (protocol.MAX_JOBS_ENV, "3 jobs"),
        (protocol.TEXT_EDITOR_MAX_BYTES_ENV, "1.5"),
        (protocol.TEXT_EDITOR_MAX_BYTES_ENV, "-1"),
        (protocol.MAX_SESSIONS_ENV, " 4"),
    ],
)
def test_a_bad_value_falls_back_to_the_default_as_it_always_did(name: str, value: str) -> None:
    """These variables never kept the server from starting: a value that is not a number
    of their kind was ignored, and still is."""
    assert Limits.from_environ({name: value}) == Limits()


@pytest.mark.parametrize(
    ("name", "value"),
    [
        (protocol.MAX_MCP_SESSIONS_ENV, "many"),
        (protocol.MAX_MCP_SESSIONS_ENV, ""),
        (protocol.EXEC_BUFFER_BYTES_ENV, "inf"),
        (protocol.MAX_JOBS_ENV, "nan"),
        (protocol.MAX_SESSIONS_ENV, "\u00b2"),  # a digit to str.isdigit, not to int()
    ],
)
def test_a_value_no_limit_can_be_made_of_is_a_clear_error(name: str, value: str) -> None:
    """These values ended the server with a traceback; now a LimitsError names the variable."""
    with pytest.raises(LimitsError, match=f"^{name}={value!r} is not a usable limit"):
        Limits.from_environ({name: value})


@pytest.mark.parametrize(
    ("value", "limit"),
    [
        ("1000", 1000),
        ("007", 7),
        ("0", 0),
        ("", None),
        ("12a", None),
        ("-5", None),
        ("9" * 18, int("9" * 18)),
        ("9" * 19, None),
        ("\u00b2", None),
    ],
)
def test_an_exec_callers_response_limit(value: str, limit: int | None) -> None:
    """Read by each `exec` from its own caller's environment, not by the server."""
    assert caller_response_limit({protocol.RESPONSE_MAX_BYTES_ENV: value}) == limit


def test_the_environment_reaches_the_server_through_limits_from_environ(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """run_server reads the limits once, before it serves, and hands them to the server;
    a value it cannot use is a sentence in the log and exit status 1, not a traceback."""
    handed: list[Limits] = []

    class Recording:
        def __init__(self, paths: ServerPaths, limits: Limits) -> None:
            handed.append(limits)

        async def serve(self) -> None:
            return None

    monkeypatch.setattr(server, "RuntimeServer", Recording)
    monkeypatch.setattr(server, "protect_from_oom", lambda: None)
    paths = ServerPaths("/nonexistent")
    monkeypatch.setenv(protocol.MAX_JOBS_ENV, "3")
    monkeypatch.setenv(protocol.MAX_SESSIONS_ENV, "2")
    assert server.run_server(paths) == 0
    assert handed == [Limits(max_jobs=3, max_sessions=2)]
    monkeypatch.setenv(protocol.MAX_MCP_SESSIONS_ENV, "many")
    assert server.run_server(paths) == 1
    assert len(handed) == 1
    logged = capsys.readouterr().err
    assert f"cannot start: {protocol.MAX_MCP_SESSIONS_ENV}='many' is not a usable" in logged
    assert "Traceback" not in logged


async def test_the_server_hands_one_limits_object_to_every_controller() -> None:
    limits = Limits(max_jobs=1, max_sessions=1, max_mcp_sessions=1)
    controllers = Controllers(limits)
    try:
        assert controllers.exec_remote.limits is limits
        assert controllers.bash_session.limits is limits
        assert controllers.text_editor.limits is limits
        assert controllers.mcp.limits is limits
    finally:
        await controllers.shutdown()


async def test_text_editor_refuses_a_file_past_its_limit(tmp_path: Path) -> None:
    controller = TextEditorController(Limits(text_editor_max_bytes=10))
    small, large = tmp_path / "small", tmp_path / "large"
    small.write_text("0123456789")
    large.write_text("0123456789a")
    shown = await controller.run(TextEditorParams.parse({"command": "view", "path": str(small)}))
    assert "0123456789" in shown
    with pytest.raises(ToolError, match=r"11 bytes, more than text_editor handles \(10\)"):
        await controller.run(TextEditorParams.parse({"command": "view", "path": str(large)}))
