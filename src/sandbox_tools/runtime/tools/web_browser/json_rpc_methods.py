"""JSON-RPC entry points of web_browser: unpack params, forward to the controller."""

from __future__ import annotations

from typing import Any

from sandbox_tools.runtime.jsonrpc import Method, Params
from sandbox_tools.runtime.tools.web_browser.controller import WebBrowserController
from sandbox_tools.runtime.tools.web_browser.tool_types import (
    ClickParams,
    GoParams,
    NewSessionParams,
    ScrollParams,
    SessionParams,
    TypeParams,
)


def methods(controller: WebBrowserController) -> dict[str, Method]:
    async def web_new_session(params: Params) -> Any:
        return await controller.new_session(NewSessionParams.parse(params))

    async def web_go(params: Params) -> Any:
        return await controller.go(GoParams.parse(params))

    async def web_click(params: Params) -> Any:
        return await controller.click(ClickParams.parse(params))

    async def web_type(params: Params) -> Any:
        return await controller.type_text(TypeParams.parse(params), submit=False)

    async def web_type_submit(params: Params) -> Any:
        return await controller.type_text(TypeParams.parse(params), submit=True)

    async def web_scroll(params: Params) -> Any:
        return await controller.scroll(ScrollParams.parse(params))

    async def web_back(params: Params) -> Any:
        return await controller.history(SessionParams.parse(params), step=-1)

    async def web_forward(params: Params) -> Any:
        return await controller.history(SessionParams.parse(params), step=1)

    async def web_refresh(params: Params) -> Any:
        return await controller.refresh(SessionParams.parse(params))

    async def web_screenshot(params: Params) -> Any:
        return await controller.screenshot(SessionParams.parse(params))

    async def web_close_session(params: Params) -> Any:
        return await controller.close_session(SessionParams.parse(params))

    async def browser_info(params: Params) -> Any:
        return await controller.info()

    return {
        "web_new_session": web_new_session,
        "web_go": web_go,
        "web_click": web_click,
        "web_type": web_type,
        "web_type_submit": web_type_submit,
        "web_scroll": web_scroll,
        "web_back": web_back,
        "web_forward": web_forward,
        "web_refresh": web_refresh,
        "web_screenshot": web_screenshot,
        "web_close_session": web_close_session,
        "browser_info": browser_info,
    }
