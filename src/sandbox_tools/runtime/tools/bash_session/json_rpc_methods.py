"""JSON-RPC entry points of bash_session: unpack params, forward to the controller."""

from __future__ import annotations

from typing import Any

from sandbox_tools.runtime.jsonrpc import Method, Params
from sandbox_tools.runtime.tools.bash_session.controller import BashSessionController
from sandbox_tools.runtime.tools.bash_session.tool_types import (
    CloseSessionParams,
    InteractParams,
    NewSessionParams,
)


def methods(controller: BashSessionController) -> dict[str, Method]:
    async def bash_session_new_session(params: Params) -> Any:
        return await controller.new_session(NewSessionParams.parse(params))

    async def bash_session(params: Params) -> Any:
        return await controller.interact(InteractParams.parse(params))

    async def bash_session_close_session(params: Params) -> Any:
        return controller.close(CloseSessionParams.parse(params))

    return {
        "bash_session_new_session": bash_session_new_session,
        "bash_session": bash_session,
        "bash_session_close_session": bash_session_close_session,
    }
