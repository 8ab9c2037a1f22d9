"""The runtime's limits and bounds under an adversarial caller, on real processes."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from sandbox_tools.protocol import INTERNAL_ERROR
from sandbox_tools.runtime.host_messages import HostMessages
from sandbox_tools.runtime.jsonrpc import ToolError, dispatch
from sandbox_tools.runtime.limits import Limits
from sandbox_tools.runtime.tools.bash_session import json_rpc_methods as bash_methods
from sandbox_tools.runtime.tools.bash_session.controller import BashSessionController
from sandbox_tools.runtime.tools.bash_session.tool_types import NewSessionParams
from sandbox_tools.runtime.tools.exec_remote.controller import ExecRemoteController
from sandbox_tools.runtime.tools.exec_remote.tool_types import (
    AckParams,
    PollParams,
    StartParams,
    WriteStdinParams,
)
from sandbox_tools.runtime.tools.mcp.controller import McpController
from sandbox_tools.runtime.tools.mcp.tool_types import LaunchParams
from tests.support import BAD_ENVS, request

TEN_MB = 10 * 1024 * 1024


def split(results: list[Any]) -> tuple[list[Any], list[BaseException]]:
    """Successes and failures of a gather(return_exceptions=True)."""
    failed = [r for r in results if isinstance(r, BaseException)]
    return [r for r in results if not isinstance(r, BaseException)], failed


def only_limit_errors(failed: list[BaseException], phrase: str) -> bool:
    """Each failure is the same tool error, in words for the model and, for a limit, by its
    reason for the host (other failures carry none)."""
    data = {"reason": "too_many"} if phrase.startswith("too many") else None
    return all(isinstance(e, ToolError) and phrase in e.message and e.data == data for e in failed)


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
