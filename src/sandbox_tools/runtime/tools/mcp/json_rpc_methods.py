"""JSON-RPC entry points of the MCP bridge: unpack params, forward to the controller."""

from __future__ import annotations

from typing import Any

from sandbox_tools.runtime.jsonrpc import InvalidParams, Method, Params, optional
from sandbox_tools.runtime.tools.mcp.controller import McpController
from sandbox_tools.runtime.tools.mcp.tool_types import LaunchParams, SendParams, session_id


def methods(controller: McpController) -> dict[str, Method]:
    async def mcp_launch_server(params: Params) -> Any:
        # ours: host_messages=true forwards what the server says on its own to the host.
        # message_tag: echoed as "tag" in each of those messages, so a host routes them
        # to the session it launched without trusting anything else in them.
        forward = optional(params, "host_messages", bool, False)
        tag = optional(params, "message_tag", str, "")
        if len(tag) > 128:
            raise InvalidParams('Invalid params: "message_tag" is longer than 128 characters')
        return await controller.launch(LaunchParams.parse(params), forward, tag)

    async def mcp_send_request(params: Params) -> Any:
        return await controller.send_request(SendParams.request(params))

    async def mcp_send_notification(params: Params) -> Any:
        return await controller.send_notification(SendParams.notification(params))

    async def mcp_send_response(params: Params) -> Any:
        return await controller.send_response(SendParams.response(params))

    async def mcp_kill_server(params: Params) -> Any:
        return await controller.kill(session_id(params))

    async def mcp_server_stderr(params: Params) -> Any:
        return await controller.stderr(session_id(params))

    return {
        "mcp_launch_server": mcp_launch_server,
        "mcp_send_request": mcp_send_request,
        "mcp_send_notification": mcp_send_notification,
        "mcp_send_response": mcp_send_response,
        "mcp_kill_server": mcp_kill_server,
        "mcp_server_stderr": mcp_server_stderr,
    }
