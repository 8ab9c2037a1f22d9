"""JSON-RPC entry point of text_editor: unpack params, forward to the controller."""

from __future__ import annotations

from typing import Any

from sandbox_tools.runtime.jsonrpc import Method, Params
from sandbox_tools.runtime.tools.text_editor.controller import TextEditorController
from sandbox_tools.runtime.tools.text_editor.tool_types import TextEditorParams


def methods(controller: TextEditorController) -> dict[str, Method]:
    async def text_editor(params: Params) -> Any:
        return await controller.run(TextEditorParams.parse(params))

    return {"text_editor": text_editor}
