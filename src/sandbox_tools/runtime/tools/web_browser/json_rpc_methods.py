"""JSON-RPC methods of web_browser, each named by its function and forwarded to the
controller with its params parsed by their declared type."""

from __future__ import annotations

from typing import Any

from sandbox_tools.runtime.jsonrpc import Method, MethodTable
from sandbox_tools.runtime.tools.web_browser.controller import WebBrowserController
from sandbox_tools.runtime.tools.web_browser.tool_types import (
    ClickParams,
    GoParams,
    InfoParams,
    NewSessionParams,
    ScrollParams,
    SessionParams,
    TypeParams,
)


def methods(controller: WebBrowserController) -> dict[str, Method]:
    rpc = MethodTable()

    @rpc.method
    async def web_new_session(params: NewSessionParams) -> Any:
        return await controller.new_session(params)

    @rpc.method
    async def web_go(params: GoParams) -> Any:
        return await controller.go(params)

    @rpc.method
    async def web_click(params: ClickParams) -> Any:
        return await controller.click(params)

    @rpc.method
    async def web_type(params: TypeParams) -> Any:
        return await controller.type_text(params, submit=False)

    @rpc.method
    async def web_type_submit(params: TypeParams) -> Any:
        return await controller.type_text(params, submit=True)

    @rpc.method
    async def web_scroll(params: ScrollParams) -> Any:
        return await controller.scroll(params)

    @rpc.method
    async def web_back(params: SessionParams) -> Any:
        return await controller.history(params, step=-1)

    @rpc.method
    async def web_forward(params: SessionParams) -> Any:
        return await controller.history(params, step=1)

    @rpc.method
    async def web_refresh(params: SessionParams) -> Any:
        return await controller.refresh(params)

    @rpc.method
    async def web_screenshot(params: SessionParams) -> Any:
        return await controller.screenshot(params)

    @rpc.method
    async def web_close_session(params: SessionParams) -> Any:
        return await controller.close_session(params)

    @rpc.method
    async def browser_info(params: InfoParams) -> Any:
        return await controller.info(params)

    return rpc.methods
