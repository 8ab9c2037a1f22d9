"""JSON-RPC entry points of exec_remote: unpack params, forward to the controller."""

from __future__ import annotations

from typing import Any

from sandbox_tools.runtime.jsonrpc import Method, Params
from sandbox_tools.runtime.tools.exec_remote.controller import ExecRemoteController
from sandbox_tools.runtime.tools.exec_remote.tool_types import (
    AckParams,
    PollParams,
    StartParams,
    WriteStdinParams,
)


def methods(controller: ExecRemoteController) -> dict[str, Method]:
    async def exec_remote_start(params: Params) -> Any:
        return await controller.start(StartParams.parse(params))

    async def exec_remote_poll(params: Params) -> Any:
        return await controller.poll(PollParams.parse(params))

    async def exec_remote_kill(params: Params) -> Any:
        return await controller.kill(AckParams.parse(params))

    async def exec_remote_write_stdin(params: Params) -> Any:
        return await controller.write_stdin(WriteStdinParams.parse(params))

    async def exec_remote_close_stdin(params: Params) -> Any:
        return await controller.close_stdin(AckParams.parse(params))

    return {
        "exec_remote_start": exec_remote_start,
        "exec_remote_poll": exec_remote_poll,
        "exec_remote_kill": exec_remote_kill,
        "exec_remote_write_stdin": exec_remote_write_stdin,
        "exec_remote_close_stdin": exec_remote_close_stdin,
    }
