"""JSON-RPC methods of bash_session, each named by its function and forwarded to the
controller with its params parsed by their declared type."""

from __future__ import annotations

from typing import Any

from sandbox_tools.runtime.jsonrpc import Method, MethodTable
from sandbox_tools.runtime.tools.bash_session.controller import BashSessionController
from sandbox_tools.runtime.tools.bash_session.tool_types import (
    CloseSessionParams,
    InteractParams,
    NewSessionParams,
)


def methods(controller: BashSessionController) -> dict[str, Method]:
    rpc = MethodTable()

    @rpc.method
    async def bash_session_new_session(params: NewSessionParams) -> Any:
        return await controller.new_session(params)

    @rpc.method
    async def bash_session(params: InteractParams) -> Any:
        return await controller.interact(params)

    @rpc.method
    async def bash_session_close_session(params: CloseSessionParams) -> Any:
        return controller.close(params)

    return rpc.methods
