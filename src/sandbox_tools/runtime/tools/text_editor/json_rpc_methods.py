"""The JSON-RPC method of text_editor, named by its function and forwarded to the
controller with its params parsed by their declared type."""

from __future__ import annotations

from typing import Any

from sandbox_tools.runtime.jsonrpc import Method, MethodTable
from sandbox_tools.runtime.tools.text_editor.controller import TextEditorController
from sandbox_tools.runtime.tools.text_editor.tool_types import TextEditorParams


def methods(controller: TextEditorController) -> dict[str, Method]:
    rpc = MethodTable()

    @rpc.method
    async def text_editor(params: TextEditorParams) -> Any:
        return await controller.run(params)

    return rpc.methods
