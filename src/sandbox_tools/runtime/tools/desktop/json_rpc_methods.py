"""JSON-RPC methods of the desktop, each named by its function and forwarded to the
controller with its params parsed by their declared type."""

from __future__ import annotations

from typing import Any

from sandbox_tools.runtime.jsonrpc import Method, MethodTable
from sandbox_tools.runtime.tools.desktop.controller import DesktopController
from sandbox_tools.runtime.tools.desktop.tool_types import ComputerParams, DesktopInfoParams


def methods(controller: DesktopController) -> dict[str, Method]:
    rpc = MethodTable()

    @rpc.method
    async def computer_action(params: ComputerParams) -> Any:
        return await controller.action(params)

    @rpc.method
    async def computer_info(params: DesktopInfoParams) -> Any:
        return await controller.info(params)

    return rpc.methods
