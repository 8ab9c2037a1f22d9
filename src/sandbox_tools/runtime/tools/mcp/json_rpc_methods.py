"""JSON-RPC methods of the MCP bridge, each named by its function and forwarded to the
controller. A launch's `server_params` and a message's envelope are the `mcp` SDK's
shapes, read by their own parsers; the rest by their declared types."""

from __future__ import annotations

from typing import Any

from sandbox_tools.runtime.jsonrpc import Method, MethodTable, Params
from sandbox_tools.runtime.tools.mcp.controller import McpController
from sandbox_tools.runtime.tools.mcp.tool_types import (
    LaunchOptions,
    LaunchParams,
    SendParams,
    SessionParams,
)


def methods(controller: McpController) -> dict[str, Method]:
    rpc = MethodTable()

    @rpc.method
    async def mcp_launch_server(params: Params) -> Any:
        options = LaunchOptions.parse(params)
        launch = LaunchParams.parse(params)
        return await controller.launch(launch, options.host_messages, options.message_tag)

    @rpc.method
    async def mcp_send_request(params: Params) -> Any:
        return await controller.send_request(SendParams.request(params))

    @rpc.method
    async def mcp_send_notification(params: Params) -> Any:
        return await controller.send_notification(SendParams.notification(params))

    @rpc.method
    async def mcp_send_response(params: Params) -> Any:
        return await controller.send_response(SendParams.response(params))

    @rpc.method
    async def mcp_kill_server(params: SessionParams) -> Any:
        return await controller.kill(params.session_id)

    @rpc.method
    async def mcp_server_stderr(params: SessionParams) -> Any:
        return await controller.stderr(params.session_id)

    return rpc.methods
