"""JSON-RPC methods of exec_remote, each named by its function and forwarded to the
controller with its params parsed by their declared type."""

from __future__ import annotations

from typing import Any

from sandbox_tools.runtime.jsonrpc import Method, MethodTable
from sandbox_tools.runtime.tools.exec_remote.controller import ExecRemoteController
from sandbox_tools.runtime.tools.exec_remote.tool_types import (
    AckParams,
    PollParams,
    StartParams,
    WriteStdinParams,
)


def methods(controller: ExecRemoteController) -> dict[str, Method]:
    rpc = MethodTable()

    @rpc.method
    async def exec_remote_start(params: StartParams) -> Any:
        return await controller.start(params)

    @rpc.method
    async def exec_remote_poll(params: PollParams) -> Any:
        return await controller.poll(params)

    @rpc.method
    async def exec_remote_kill(params: AckParams) -> Any:
        return await controller.kill(params)

    @rpc.method
    async def exec_remote_write_stdin(params: WriteStdinParams) -> Any:
        return await controller.write_stdin(params)

    @rpc.method
    async def exec_remote_close_stdin(params: AckParams) -> Any:
        return await controller.close_stdin(params)

    return rpc.methods
